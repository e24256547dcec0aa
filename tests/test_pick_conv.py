"""PickConv (PICK's graph convolution) against a dense loop over edges and nodes (values
and gradients, every input form), and relative_positions by hand."""
import pytest
import torch
from torch_geometric import EdgeIndex

from glomo_pyg.nn import PickConv, relative_positions

N, F_IN, F_OUT, D = 5, 4, 6, 3
# duplicate edge 0 -> 1, self loops 2 -> 2 and 3 -> 3, node 4 without incoming edges
EDGES = torch.tensor([[0, 0, 1, 2, 3, 4, 0, 2, 4],
                      [1, 1, 0, 2, 3, 3, 2, 1, 0]])


def _relu(t):
    return torch.clamp(t, min=0)


def _reference(conv, x, edge_index, edge_weight=None, edge_attr=None):
    """``(v', alpha')`` from the layer's parameters by plain matmuls, edge by edge."""
    w1, b = conv.lin_target.weight, conv.lin_target.bias
    w2, w, w_alpha = conv.lin_source.weight, conv.lin.weight, conv.lin_alpha.weight
    n = x.size(0)
    sums = [x.new_zeros(conv.out_channels) for _ in range(n)]
    alphas = []
    for e, (j, i) in enumerate(edge_index.t().tolist()):   # edge j -> i
        if edge_attr is None:
            alpha = x.new_zeros(conv.out_channels)
        elif conv.lin_edge is None:
            alpha = edge_attr[e]
        else:
            alpha = conv.lin_edge.weight @ edge_attr[e]
        h = _relu(w1 @ x[i] + b + w2 @ x[j] + alpha)
        a = 1.0 if edge_weight is None else edge_weight[e]
        sums[i] = sums[i] + a * h
        alphas.append(_relu(w_alpha @ h))
    out = torch.stack([_relu(w @ s) for s in sums])
    alpha_out = torch.stack(alphas) if alphas else x.new_zeros(0, conv.out_channels)
    return out, alpha_out


def _inputs(edge_dim):
    e = EDGES.size(1)
    x = torch.randn(N, F_IN, dtype=torch.float64, requires_grad=True)
    weight = torch.rand(e, dtype=torch.float64).add_(0.1).requires_grad_()
    attr = torch.randn(e, edge_dim or F_OUT, dtype=torch.float64, requires_grad=True)
    return x, weight, attr


def _assert_same_values_and_grads(outs, refs, inputs):
    """Same outputs, and the same gradients of a random mix of them in ``inputs``."""
    total, ref_total = 0, 0
    for out, ref in zip(outs, refs):
        torch.testing.assert_close(out, ref)
        coef = torch.randn_like(ref)
        total = total + (out * coef).sum()
        ref_total = ref_total + (ref * coef).sum()
    # retain: module and reference may share a part of the graph (permuted inputs)
    grads = torch.autograd.grad(total, inputs, allow_unused=True, retain_graph=True)
    ref_grads = torch.autograd.grad(ref_total, inputs, allow_unused=True)
    for g, r in zip(grads, ref_grads):
        assert (g is None) == (r is None)
        if r is not None:
            torch.testing.assert_close(g, r)


def _leaves(conv, *tensors):
    return tuple(t for t in tensors if t is not None) + tuple(conv.parameters())


@pytest.mark.parametrize("attr", ["none", "alpha", "embedded"])
@pytest.mark.parametrize("weighted", [True, False])
def test_matches_dense_loop_values_and_gradients(attr, weighted):
    edge_dim = D if attr == "embedded" else None
    conv = PickConv(F_IN, F_OUT, edge_dim=edge_dim).double()
    x, weight, edge_attr = _inputs(edge_dim)
    weight = weight if weighted else None
    edge_attr = None if attr == "none" else edge_attr
    outs = conv(x, EDGES, weight, edge_attr)
    assert outs[0].shape == (N, F_OUT) and outs[1].shape == (EDGES.size(1), F_OUT)
    refs = _reference(conv, x, EDGES, weight, edge_attr)
    _assert_same_values_and_grads(outs, refs, _leaves(conv, x, weight, edge_attr))
    # node 4 has no incoming edge: relu(W 0) = 0
    assert torch.equal(outs[0][4], torch.zeros(F_OUT, dtype=torch.float64))
    assert outs[0][:4].abs().sum() > 0


def test_weights_omitted_are_ones():
    conv = PickConv(F_IN, F_OUT).double()
    x, _, _ = _inputs(None)
    ones = torch.ones(EDGES.size(1), dtype=torch.float64)
    for a, b in zip(conv(x, EDGES), conv(x, EDGES, ones)):
        torch.testing.assert_close(a, b)


def test_duplicate_edges_count_twice():
    conv = PickConv(F_IN, F_OUT).double()
    x, _, _ = _inputs(None)
    once = torch.tensor([[0], [1]])
    twice = torch.tensor([[0, 0], [1, 1]])
    half = torch.tensor([0.5, 0.5], dtype=torch.float64)
    ref = conv(x, once, torch.tensor([1.0], dtype=torch.float64))[0]
    torch.testing.assert_close(conv(x, twice, half)[0], ref)
    out, alpha = conv(x, twice)
    torch.testing.assert_close(alpha[0], alpha[1])
    torch.testing.assert_close(out, _reference(conv, x, twice)[0])


@pytest.mark.parametrize("sort", [None, "col", "row"])
def test_edge_index_input(sort):
    conv = PickConv(F_IN, F_OUT, edge_dim=D).double()
    x, weight, edge_attr = _inputs(D)
    ei = EdgeIndex(EDGES, sparse_size=(N, N))
    perm = torch.arange(EDGES.size(1))
    if sort is not None:
        ei, perm = ei.sort_by(sort)
        assert ei.sort_order == sort
    w, attr = weight[perm], edge_attr[perm]
    outs = conv(x, ei, w, attr)
    assert not isinstance(outs[0], EdgeIndex) and not isinstance(outs[1], EdgeIndex)
    refs = _reference(conv, x, EDGES[:, perm], w, attr)
    _assert_same_values_and_grads(outs, refs, _leaves(conv, x, weight, edge_attr))
    # and the plain tensor gives the same
    for a, b in zip(outs, conv(x, EDGES[:, perm], w, attr)):
        torch.testing.assert_close(a, b)


def test_no_edges():
    conv = PickConv(F_IN, F_OUT).double()
    x, _, _ = _inputs(None)
    out, alpha = conv(x, torch.zeros(2, 0, dtype=torch.long))
    assert torch.equal(out, torch.zeros(N, F_OUT, dtype=torch.float64))
    assert alpha.shape == (0, F_OUT)


def test_two_layers_stack_on_the_edge_embeddings():
    first = PickConv(F_IN, F_OUT, edge_dim=D).double()
    second = PickConv(F_OUT, F_OUT).double()
    x, weight, edge_attr = _inputs(D)
    v1, a1 = first(x, EDGES, weight, edge_attr)
    outs = second(v1, EDGES, weight, a1)
    r1, ra1 = _reference(first, x, EDGES, weight, edge_attr)
    refs = _reference(second, r1, EDGES, weight, ra1)
    leaves = (x, weight, edge_attr) + tuple(first.parameters()) + tuple(second.parameters())
    _assert_same_values_and_grads(outs, refs, leaves)


def test_float32_and_repr():
    conv = PickConv(F_IN, F_OUT, edge_dim=D)
    x = torch.randn(N, F_IN)
    attr = torch.randn(EDGES.size(1), D)
    weight = torch.rand(EDGES.size(1))
    with torch.no_grad():
        for a, b in zip(conv(x, EDGES, weight, attr), _reference(conv, x, EDGES, weight, attr)):
            torch.testing.assert_close(a, b)
    assert repr(conv) == f"PickConv({F_IN}, {F_OUT}, edge_dim={D})"


def test_dtype_at_the_door_and_autocast():
    """Features or edge features of another dtype than the parameters are refused by
    name; under CPU autocast float32 inputs pass and agree with the float32 layer's."""
    conv = PickConv(F_IN, F_OUT).double()
    embed = PickConv(F_IN, F_OUT, edge_dim=D).double()
    e = EDGES.size(1)
    x = torch.randn(N, F_IN, dtype=torch.float64)
    with pytest.raises(TypeError, match="x is torch.float32"):
        conv(x.float(), EDGES)
    with pytest.raises(TypeError, match="edge_attr is torch.float32"):
        conv(x, EDGES, None, torch.randn(e, F_OUT))
    with pytest.raises(TypeError, match="edge_attr is torch.float32"):
        embed(x, EDGES, None, torch.randn(e, D))
    single = PickConv(F_IN, F_OUT, edge_dim=D)
    xf, attr = torch.randn(N, F_IN), torch.randn(e, D)
    with torch.no_grad():
        full = single(xf, EDGES, None, attr)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = single(xf, EDGES, None, attr)
    assert all(m.dtype == torch.bfloat16 for m in mixed)   # (autocast ran the products)
    for a, b in zip(mixed, full):
        torch.testing.assert_close(a.float(), b, atol=0.05, rtol=0.05)


def test_bad_input():
    conv = PickConv(F_IN, F_OUT).double()
    embed = PickConv(F_IN, F_OUT, edge_dim=D).double()
    x, weight, attr = (t.detach() for t in _inputs(None))
    e = EDGES.size(1)
    with pytest.raises(ValueError, match="outside"):
        conv(x, EDGES.clone().index_fill_(1, torch.tensor([2]), N))
    with pytest.raises(ValueError, match="outside"):
        conv(x, EDGES.clone().index_fill_(1, torch.tensor([0]), -1))
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="NaN"):
            conv(x, EDGES, weight.clone().index_fill_(0, torch.tensor([3]), bad))
    with pytest.raises(ValueError, match="edge_weight"):
        conv(x, EDGES, weight[:-1])
    with pytest.raises(ValueError, match="edge_weight"):
        conv(x, EDGES, torch.ones(e, dtype=torch.long))
    with pytest.raises(ValueError, match="edge_attr"):
        conv(x, EDGES, weight, attr[:, :-1])        # width: out_channels without edge_dim
    with pytest.raises(ValueError, match="edge_attr"):
        conv(x, EDGES, weight, attr[:-1])           # length
    with pytest.raises(ValueError, match="edge_attr"):
        embed(x, EDGES, weight, attr)               # width: edge_dim
    with pytest.raises(ValueError, match="edge_attr"):
        embed(x, EDGES, weight)                     # edge_dim needs edge_attr
    with pytest.raises(ValueError, match=rf"\[N, {F_IN}\]"):
        conv(torch.randn(N, F_IN + 1, dtype=torch.float64), EDGES)
    with pytest.raises(ValueError, match="edge_index"):
        conv(x, EDGES.int())
    with pytest.raises(ValueError, match="edge_index"):
        conv(x, EDGES.double())
    with pytest.raises(ValueError, match="edge_index"):
        conv(x, EDGES[0])
    with pytest.raises(ValueError, match="edge_index"):
        conv(x, torch.cat([EDGES, EDGES[:1]]))
    with pytest.raises(ValueError, match="edge_index"):
        conv(x, EDGES.tolist())
    with pytest.raises(TypeError):
        conv(torch.ones(N, F_IN, dtype=torch.long), EDGES)
    with pytest.raises(TypeError, match="act"):
        PickConv(F_IN, F_OUT, act="relu")
    with pytest.raises(ValueError, match="edge_dim"):
        PickConv(F_IN, F_OUT, edge_dim=0)


def test_relative_positions_1d():
    pos = torch.tensor([0, 3, 7, 2])
    ei = torch.tensor([[0, 2, 3, 1], [1, 1, 0, 1]])   # j -> i
    out = relative_positions(ei, pos, scale=10)
    # (p_i - p_j) / s: 3 - 0, 3 - 7, 0 - 2, 3 - 3
    expected = torch.tensor([[0.3, 0.3], [-0.4, 0.4], [-0.2, 0.2], [0.0, 0.0]])
    torch.testing.assert_close(out, expected)
    assert out.dtype == torch.get_default_dtype()
    # default scale: the largest position, 7
    torch.testing.assert_close(relative_positions(ei, pos), expected * 10 / 7)
    torch.testing.assert_close(relative_positions(EdgeIndex(ei, sparse_size=(4, 4)), pos,
                                                  scale=10), expected)
    # default scale is at least 1
    small = torch.tensor([0.0, 0.5])
    torch.testing.assert_close(relative_positions(torch.tensor([[0], [1]]), small),
                               torch.tensor([[0.5, 0.5]]))
    assert relative_positions(torch.zeros(2, 0, dtype=torch.long), pos).shape == (0, 2)


def test_relative_positions_2d():
    pos = torch.tensor([[0, 0], [0, 1], [1, 0], [2, 3]])   # (row, col)
    ei = torch.tensor([[0, 3, 1], [3, 2, 1]])
    out = relative_positions(ei, pos, scale=2.0)
    expected = torch.tensor([[1.0, 1.5, (1.0 + 2.25) ** 0.5],     # (2, 3) - (0, 0)
                             [-0.5, -1.5, (0.25 + 2.25) ** 0.5],  # (1, 0) - (2, 3)
                             [0.0, 0.0, 0.0]])
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(relative_positions(ei, pos), expected * 2 / 3)


def test_relative_positions_bad_input():
    pos = torch.tensor([0.0, 1.0, 2.0])
    ei = torch.tensor([[0, 1], [1, 2]])
    for scale in (0, 0.0, -1, -2.5, float("inf"), float("nan"), "2"):
        with pytest.raises(ValueError, match="scale"):
            relative_positions(ei, pos, scale=scale)
    for bad in (torch.zeros(3, 2, 2), [0.0, 1.0, 2.0], torch.zeros(3, dtype=torch.complex64),
                torch.tensor(1.0)):
        with pytest.raises(ValueError, match="pos"):
            relative_positions(ei, bad)
    with pytest.raises(ValueError, match="outside"):
        relative_positions(torch.tensor([[0, 3], [1, 2]]), pos)
    with pytest.raises(ValueError, match="edge_index"):
        relative_positions(ei.int(), pos)
    with pytest.raises(ValueError, match="edge_index"):
        relative_positions(ei[0], pos)
