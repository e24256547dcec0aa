"""GraphLearning (PICK's learned graph) against a plain dense per-sample reference: edges,
weights, loss and gradients, chunking, every order, top_k, and bad input."""
import pytest
import torch

from glomo_pyg import RasterOrder, SequenceOrder
from glomo_pyg.nn import GraphLearning, LearnedGraph

LENGTHS = [5, 1, 7, 3]
C = 3


def _batch(lengths):
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))


def _features(lengths, requires_grad=True):
    # bounded features: the loss's exp(eta * distance) stays small
    x = 0.6 * torch.randn(sum(lengths), C, dtype=torch.float64)
    return x.requires_grad_(requires_grad)


def _may_feed(order, i, j):
    """May source ``j`` feed target ``i`` (positions in one sample)?"""
    if order is None:
        return True
    if order.include_self and i == j:
        return True
    return j < i if order.direction == "forward" else j > i


def _reference(x, batch, w, order=None, top_k=None, eta=1.0, gamma=1.0, slope=0.01):
    """``(edge_index, edge_weight, loss)``: full N x N matrices per sample, in a loop."""
    sources, targets, weights, losses = [], [], [], []
    start = 0
    if batch is None:  # one sample
        batch = torch.zeros(x.size(0), dtype=torch.long)
    for b in range(int(batch.max()) + 1):
        n = int((batch == b).sum())
        v = x[start:start + n]
        dense = [[None] * n for _ in range(n)]   # dense[i][j] = A_ij, None: not allowed
        for i in range(n):
            allowed = [j for j in range(n) if _may_feed(order, i, j)]
            if not allowed:
                continue
            e = torch.stack([(v[i] - v[j]).abs() @ w for j in allowed])
            e = torch.where(e >= 0, e, slope * e)
            a = torch.exp(e - e.max())
            a = a / a.sum()
            for j, value in zip(allowed, a):
                dense[i][j] = value
        exp_sum = x.new_zeros(())
        square_sum = x.new_zeros(())
        for i in range(n):
            row = [(j, dense[i][j]) for j in range(n) if dense[i][j] is not None]
            if top_k is not None:
                # heaviest first, ties to the lower source; zero weights are never edges
                row = sorted(row, key=lambda item: (-float(item[1].detach()), item[0]))[:top_k]
                row = sorted(((j, a) for j, a in row if float(a.detach()) > 0),
                             key=lambda item: item[0])
            for j, a in row:
                sources.append(start + j)
                targets.append(start + i)
                weights.append(a)
                exp_sum = exp_sum + torch.exp(a + eta * ((v[i] - v[j]) ** 2).sum())
                square_sum = square_sum + a * a
        losses.append(exp_sum / n ** 2 + gamma * square_sum)
        start += n
    edge_index = torch.tensor([sources, targets], dtype=torch.long).view(2, -1)
    weight = torch.stack(weights) if weights else x.new_zeros(0)
    return edge_index, weight, torch.stack(losses).mean()


def _objective(weight, loss, coef):
    return (weight * coef).sum() + loss


def _check_against_reference(gl, x, batch, **settings):
    """Module and reference: same edges, weights, loss, and gradients in x and weight."""
    out = gl(x, batch)
    assert isinstance(out, LearnedGraph)
    ref_ei, ref_w, ref_loss = _reference(x, batch, gl.weight, gl.order, gl.top_k, gl.eta,
                                         gl.gamma, gl.negative_slope)
    assert out.edge_index.dtype == torch.long
    assert torch.equal(out.edge_index, ref_ei)
    torch.testing.assert_close(out.edge_weight, ref_w)
    torch.testing.assert_close(out.loss, ref_loss)
    assert out.loss.dim() == 0
    coef = torch.randn(ref_w.numel(), dtype=torch.float64)
    grads = torch.autograd.grad(_objective(out.edge_weight, out.loss, coef), (x, gl.weight))
    ref_grads = torch.autograd.grad(_objective(ref_w, ref_loss, coef), (x, gl.weight))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)
    assert grads[0].abs().sum() > 0 and grads[1].abs().sum() > 0
    return out


ORDERS = {
    "none": None,
    "forward": SequenceOrder("forward"),
    "backward": SequenceOrder("backward"),
    "forward_self": SequenceOrder("forward", include_self=True),
    "backward_self": SequenceOrder("backward", include_self=True),
}


@pytest.mark.parametrize("chunk_elements", [7, 1 << 22])
@pytest.mark.parametrize("top_k", [None, 1, 2, 10])
@pytest.mark.parametrize("order", list(ORDERS))
def test_matches_dense_reference_values_loss_and_gradients(order, top_k, chunk_elements):
    gl = GraphLearning(C, order=ORDERS[order], top_k=top_k, eta=0.5, gamma=0.7,
                       chunk_elements=chunk_elements).double()
    x = _features(LENGTHS)
    out = _check_against_reference(gl, x, _batch(LENGTHS))
    if order == "none" and top_k is None:
        # every pair of every sample, the self loops included; rows sum to one
        assert out.edge_index.size(1) == sum(n * n for n in LENGTHS)
        sums = torch.zeros(sum(LENGTHS), dtype=torch.float64).index_add(
            0, out.edge_index[1], out.edge_weight.detach())
        torch.testing.assert_close(sums, torch.ones_like(sums))


def test_orders_allow_the_sources_they_say():
    """Edge sets by hand: forward j < i, backward j > i, include_self adds j == i."""
    x = _features([3], requires_grad=False)
    expected = {
        "none": {(j, i) for i in range(3) for j in range(3)},
        "forward": {(0, 1), (0, 2), (1, 2)},
        "backward": {(1, 0), (2, 0), (2, 1)},
        "forward_self": {(0, 1), (0, 2), (1, 2), (0, 0), (1, 1), (2, 2)},
        "backward_self": {(1, 0), (2, 0), (2, 1), (0, 0), (1, 1), (2, 2)},
    }
    for name, pairs in expected.items():
        out = GraphLearning(C, order=ORDERS[name]).double()(x)
        assert set(map(tuple, out.edge_index.t().tolist())) == pairs, name
        # sorted by (target, source)
        keys = (out.edge_index[1] * 10 + out.edge_index[0]).tolist()
        assert keys == sorted(keys)


def test_target_without_sources_has_no_edges_and_zero_loss():
    gl = GraphLearning(C, order=SequenceOrder("forward")).double()
    out = gl(_features([1, 1], requires_grad=False), torch.tensor([0, 1]))
    assert out.edge_index.shape == (2, 0) and out.edge_weight.shape == (0,)
    assert float(out.loss.detach()) == 0.0


def test_underflowed_weights_stay_edges_without_top_k_only():
    """A weight that underflows to exactly 0 is an edge of the allowed-pairs graph (the
    loss sums over every pair, as the paper's), and is not kept by top_k."""
    gl = GraphLearning(1, eta=0.0, gamma=0.5).double()
    with torch.no_grad():
        gl.weight.fill_(1.0)
    x = torch.tensor([[0.0], [1000.0]], dtype=torch.float64)   # e_01 = e_10 = 1000
    out = gl(x)
    assert out.edge_index.tolist() == [[0, 1, 0, 1], [0, 0, 1, 1]]
    assert out.edge_weight.tolist() == [0.0, 1.0, 1.0, 0.0]
    e = torch.e
    torch.testing.assert_close(out.loss, torch.tensor((2 + 2 * e) / 4 + 0.5 * 2,
                                                      dtype=torch.float64))
    ref = _reference(x, None, gl.weight.detach(), eta=0.0, gamma=0.5)
    assert torch.equal(ref[0], out.edge_index) and torch.equal(ref[1], out.edge_weight)
    kept = GraphLearning(1, top_k=2, eta=0.0, gamma=0.5).double()
    kept.load_state_dict(gl.state_dict())
    pruned = kept(x)
    assert pruned.edge_index.tolist() == [[1, 0], [0, 1]]
    torch.testing.assert_close(pruned.loss, torch.tensor(2 * e / 4 + 0.5 * 2,
                                                         dtype=torch.float64))


def test_top_k_ties_go_to_the_lower_source():
    # units 1, 2 and 3 are identical: target 0 scores them the same
    v = torch.tensor([[0.0, 0.0, 0.0], [0.5, -0.2, 0.3], [0.5, -0.2, 0.3], [0.5, -0.2, 0.3]],
                     dtype=torch.float64)
    gl = GraphLearning(C, top_k=2).double()
    with torch.no_grad():
        gl.weight.copy_(torch.tensor([1.0, 1.0, 1.0]))
    x = v.clone().requires_grad_()
    out = _check_against_reference(gl, x, torch.zeros(4, dtype=torch.long))
    row0 = out.edge_index[0][out.edge_index[1] == 0].tolist()
    assert row0 == [1, 2]
    # weights are the dense softmax's, not renormalised over the kept sources
    assert float(out.edge_weight.detach()[out.edge_index[1] == 0].sum()) < 1.0


def _record_chunks(monkeypatch):
    calls = []
    original = GraphLearning._chunk

    def recording(self, padded, lengths, j0, j1):
        calls.append((j0, j1, tuple(padded.shape)))
        return original(self, padded, lengths, j0, j1)

    monkeypatch.setattr(GraphLearning, "_chunk", recording)
    return calls


@pytest.mark.parametrize("top_k", [None, 2])
def test_chunks_bound_memory_and_equal_one_chunk(monkeypatch, top_k):
    batch = _batch(LENGTHS)
    x = _features(LENGTHS)
    b, t = len(LENGTHS), max(LENGTHS)
    whole = GraphLearning(C, order=SequenceOrder("forward", include_self=True),
                          top_k=top_k).double()
    calls = _record_chunks(monkeypatch)
    one = whole(x, batch)
    assert [c[:2] for c in calls] == [(0, t)]
    g_one = torch.autograd.grad(one.loss + one.edge_weight.sum(), (x, whole.weight))
    for chunk_elements, rows in [(7, 1), (2 * b * t * C, 2)]:
        chunked = GraphLearning(C, order=whole.order, top_k=top_k,
                                chunk_elements=chunk_elements).double()
        chunked.load_state_dict(whole.state_dict())
        calls.clear()
        out = chunked(x, batch)
        spans = [c[:2] for c in calls]
        assert spans == [(j, min(j + rows, t)) for j in range(0, t, rows)]
        # each chunk's differences are [B, j1 - j0, T, C]: at most `rows` targets
        assert all(shape == (b, t, C) for _, _, shape in calls)
        assert all(j1 - j0 <= rows for j0, j1 in spans)
        assert torch.equal(out.edge_index, one.edge_index)
        torch.testing.assert_close(out.edge_weight, one.edge_weight)
        torch.testing.assert_close(out.loss, one.loss)
        calls.clear()
        g = torch.autograd.grad(out.loss + out.edge_weight.sum(), (x, chunked.weight))
        # the backward pass recomputed every chunk (checkpointing; autograd's order)
        assert sorted(c[:2] for c in calls) == spans
        for a, r in zip(g, g_one):
            torch.testing.assert_close(a, r)


def test_no_grad_call_gives_the_same_graph(monkeypatch):
    gl = GraphLearning(C, top_k=3, chunk_elements=7).double()
    x = _features(LENGTHS)
    batch = _batch(LENGTHS)
    with_grad = gl(x, batch)
    calls = _record_chunks(monkeypatch)
    with torch.no_grad():
        plain = gl(x, batch)
    assert not plain.edge_weight.requires_grad and not plain.loss.requires_grad
    assert len(calls) == max(LENGTHS)
    assert torch.equal(plain.edge_index, with_grad.edge_index)
    torch.testing.assert_close(plain.edge_weight, with_grad.edge_weight.detach())
    torch.testing.assert_close(plain.loss, with_grad.loss.detach())
    # input without grad, module frozen: no checkpointing either, same graph
    gl.weight.requires_grad_(False)
    frozen = gl(x.detach(), batch)
    assert torch.equal(frozen.edge_index, with_grad.edge_index)
    torch.testing.assert_close(frozen.edge_weight, with_grad.edge_weight.detach())


def test_float32_default_module():
    gl = GraphLearning(C, order=SequenceOrder("backward"), top_k=2)
    x = torch.randn(sum(LENGTHS), C)
    out = gl(x, _batch(LENGTHS))
    ref_ei, ref_w, ref_loss = _reference(x, _batch(LENGTHS), gl.weight, gl.order, 2)
    assert torch.equal(out.edge_index, ref_ei)
    torch.testing.assert_close(out.edge_weight, ref_w)
    torch.testing.assert_close(out.loss, ref_loss)
    assert out.edge_weight.dtype == torch.float32


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("include_self", [False, True])
def test_raster_order(direction, include_self):
    order = RasterOrder(direction, 2, 3, include_self=include_self)
    gl = GraphLearning(C, order=order, top_k=3, chunk_elements=7).double()
    _check_against_reference(gl, _features([6, 6]), _batch([6, 6]))
    gl = GraphLearning(C, order=order).double()
    _check_against_reference(gl, _features([6]), None)
    with pytest.raises(ValueError, match="6 units"):
        gl(_features([6, 5]), _batch([6, 5]))
    with pytest.raises(ValueError, match="6 units"):
        gl(_features([4]))


def test_bad_input():
    gl = GraphLearning(C).double()
    x = _features([3, 2], requires_grad=False)
    batch = _batch([3, 2])
    for bad in (float("nan"), float("inf"), -float("inf")):
        y = x.clone()
        y[3, 1] = bad
        with pytest.raises(ValueError, match="NaN"):
            gl(y, batch)
    with pytest.raises(ValueError, match=r"\[N, 3\]"):
        gl(torch.randn(5, 4, dtype=torch.float64), batch)
    with pytest.raises(ValueError, match=r"\[N, 3\]"):
        gl(torch.randn(5, dtype=torch.float64), batch)
    with pytest.raises(TypeError):
        gl(torch.ones(5, C, dtype=torch.long), batch)
    with pytest.raises(TypeError):
        gl(x.float(), batch)   # float32 input, float64 module
    with pytest.raises(ValueError, match="sample 1 has no units"):
        gl(x[:4], torch.tensor([0, 0, 2, 2]))
    with pytest.raises(ValueError, match="sorted"):
        gl(x, torch.tensor([0, 1, 0, 1, 1]))
    with pytest.raises(ValueError):
        gl(x, torch.tensor([0, 0, 1]))   # wrong length
    with pytest.raises(TypeError):
        gl(x, batch.float())


@pytest.mark.parametrize("key, value", [("top_k", 0), ("top_k", -1), ("top_k", 1.5),
                                        ("eta", -0.1), ("gamma", -1.0),
                                        ("eta", float("nan")), ("gamma", float("inf"))])
def test_bad_settings_name_themselves(key, value):
    with pytest.raises(ValueError, match=key):
        GraphLearning(C, **{key: value})


def test_bad_order_type():
    for order in ("forward", 1, object()):
        with pytest.raises(TypeError, match="order"):
            GraphLearning(C, order=order)


def test_zero_loss_weights_and_repr():
    gl = GraphLearning(C, order=SequenceOrder("forward"), top_k=2, eta=0.0, gamma=0.0)
    assert "top_k=2" in repr(gl) and "forward" in repr(gl)
    gl = gl.double()
    _check_against_reference(gl, _features(LENGTHS), _batch(LENGTHS))
