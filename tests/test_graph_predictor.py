"""GraphPredictor: Eq. 1 from its own parameters, invariants, causality, bad input."""
import math

import pytest
import torch
from reference import allowed_pairs, batch_vector, dense_graph, pad

from glomo_pyg import GraphPredictor, LatentGraphs

LENGTHS = [7, 1, 4, 10]


def _predictor(**kw):
    base = dict(num_tokens=30, hidden_channels=16, num_layers=2, heads=4, cnn_layers=2)
    layout = kw.pop("layout", "sparse")
    base.update(kw)
    return GraphPredictor(**base).set_layout(layout).double().eval()


def _tokens(lengths=LENGTHS):
    batch = batch_vector(lengths)
    return torch.randint(0, 30, (batch.numel(),)), batch


def _reference_graphs(model, x, lengths):
    """Eq. 1 written out from the module's parameters, dense."""
    h = pad(model.encoder(x), lengths)
    mask = torch.arange(h.size(1)).view(1, -1) < torch.tensor(lengths).view(-1, 1)
    keys, queries = model.key_cnn(h, mask), model.query_cnn(h, mask)
    sc = model.scorer
    out = []
    for l in range(sc.num_layers):
        b, t, _ = keys.shape
        k = sc.key[l](keys).view(b, t, sc.heads, -1).transpose(1, 2)
        q = sc.query[l](queries).view(b, t, sc.heads, -1).transpose(1, 2)
        s = k @ q.transpose(-1, -2)  # [B, H, i, j]
        if sc.bias is not None:
            s = s + sc.bias[l]
        else:  # per-target threshold b_j = -(w . q_j + c)
            s = s - sc.threshold[l](q).transpose(-1, -2)
        if sc.position_coef is not None:  # s += sum_m a_m cos(w_m (j - i)) + c_m sin(w_m (j - i))
            m = sc.position_coef.size(-1)
            period = model.config()["position_period"]
            w = torch.tensor([math.pi * (2.0 / period) ** (n / (m - 1)) if m > 1 else math.pi
                              for n in range(m)], dtype=s.dtype)
            d = (torch.arange(t).view(1, -1) - torch.arange(t).view(-1, 1)).to(s.dtype)  # [i, j]
            a, c = sc.position_coef[l, :, 0], sc.position_coef[l, :, 1]  # [H, M]
            angle = d[None, :, :, None] * w
            s = s + (a[:, None, None] * angle.cos() + c[:, None, None] * angle.sin()).sum(-1)
        allowed = allowed_pairs(lengths, t, model.direction, sc.include_self)
        out.append(dense_graph(s, allowed, "relu2" if sc.sparse else "softmax"))
    return torch.stack(out)


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("kw", [dict(), dict(bias="threshold"), dict(include_self=True),
                                dict(sparse=False), dict(norm="batch"), dict(norm=None),
                                dict(position="relative"),
                                dict(position="relative", bias="threshold", layout="dense",
                                     position_frequencies=3, position_period=20.0),
                                dict(position="relative", position_frequencies=1)])
def test_graphs_equal_eq1_from_parameters(direction, kw):
    model = _predictor(direction=direction, **kw)
    with torch.no_grad():  # make some scores positive and some negative
        model.scorer.key[0].bias.normal_()
        if model.scorer.position_coef is not None:
            model.scorer.position_coef.normal_()
    x, batch = _tokens()
    graphs = model(x, batch)
    assert isinstance(graphs, LatentGraphs)
    assert graphs.num_layers == 2 and graphs.num_heads == 4 and graphs.direction == direction
    torch.testing.assert_close(graphs.to_dense(), _reference_graphs(model, x, LENGTHS))


def test_feature_input_and_gradients_reach_all_parameters():
    model = GraphPredictor(in_channels=5, hidden_channels=16, num_layers=2, heads=2).double()
    batch = batch_vector(LENGTHS)
    x = torch.randn(batch.numel(), 5, dtype=torch.float64)
    graphs = model(x, batch)
    sum(w.pow(2).sum() for w in graphs.edge_weight).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing


def test_softmax_ablation_is_dense_and_sparse_default_prunes():
    x, batch = _tokens()
    dense = _predictor(sparse=False)(x, batch)
    sparse = _predictor()(x, batch)
    assert all(d == pytest.approx(1.0) for d in dense.density())
    assert all(d < 1.0 for d in sparse.density())


def test_sequences_do_not_influence_each_other():
    model = _predictor()
    x, batch = _tokens()
    together = model(x, batch).to_dense()
    start = 0
    for b, n in enumerate(LENGTHS):
        alone = model(x[start:start + n]).to_dense()
        torch.testing.assert_close(together[:, b:b + 1, :, :n, :n], alone)
        start += n


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_causality_by_gradients(direction):
    """Column j of a forward graph depends on units <= j only (backward: >= j)."""
    model = GraphPredictor(in_channels=3, hidden_channels=16, num_layers=2, heads=2,
                           direction=direction, include_self=True).double()
    model.train()  # LayerNorm: causal in training mode too
    t = 8
    x = torch.randn(t, 3, dtype=torch.float64, requires_grad=True)
    dense = model(x).to_dense()[:, 0]  # [L, H, T, T]
    for j in range(t):
        grad, = torch.autograd.grad(dense[..., j].sum() + 0 * x.sum(), x, retain_graph=True)
        later = grad[j + 1:] if direction == "forward" else grad[:j]
        assert torch.count_nonzero(later) == 0, f"column {j} sees the other direction"


def test_length_one_sequences_have_no_edges():
    model = _predictor()
    graphs = model(torch.tensor([3, 4, 5]), torch.tensor([0, 1, 2]))
    assert graphs.num_edges == [0, 0]
    assert graphs.to_dense().shape == (2, 3, 4, 1, 1)


def test_to_device_detach_and_repr():
    graphs = _predictor()(*_tokens())
    moved = graphs.to("cpu").detach()
    assert moved.num_edges == graphs.num_edges
    assert not any(w.requires_grad for w in moved.edge_weight)
    assert "LatentGraphs(layers=2, heads=4" in repr(graphs)
    assert "GraphPredictor" in repr(_predictor())


def test_bad_input_is_rejected_with_clear_errors():
    model = _predictor()
    x, batch = _tokens()
    with pytest.raises(ValueError, match="exactly one"):
        GraphPredictor(num_tokens=3, in_channels=4)
    with pytest.raises(ValueError, match="direction"):
        GraphPredictor(num_tokens=3, direction="up")
    with pytest.raises(ValueError, match="bias"):
        GraphPredictor(num_tokens=3, bias="vector")
    with pytest.raises(ValueError, match="divisible"):
        GraphPredictor(num_tokens=3, hidden_channels=10, heads=4)
    with pytest.raises(TypeError, match="integer"):
        model(x.double(), batch)
    with pytest.raises(ValueError, match=r"\[N\]"):
        model(x.view(1, -1), batch)
    with pytest.raises(ValueError, match=r"\[0, 30\)"):
        model(x + 30, batch)
    with pytest.raises(ValueError, match=r"\[0, 30\)"):
        model(x - 40, batch)
    with pytest.raises(ValueError, match="sorted"):
        model(x, batch.flip(0))
    with pytest.raises(ValueError, match="empty"):
        model(x[:0], batch[:0])
    with pytest.raises(ValueError, match="shape"):
        model(x, batch[1:])
    with pytest.raises(TypeError, match="int64"):
        model(x, batch.int())
    features = GraphPredictor(in_channels=3, hidden_channels=8, heads=2)
    with pytest.raises(ValueError, match=r"\[N, 3\]"):
        features(torch.randn(4, 2))
    with pytest.raises(TypeError, match="floating"):
        features(torch.ones(4, 3, dtype=torch.long))


@pytest.mark.parametrize("layout", ["sparse", "dense"])
def test_relative_position_gradients_match_the_reference(layout):
    torch.manual_seed(1)
    model = _predictor(position="relative", position_frequencies=4).set_layout(layout)
    with torch.no_grad():
        model.scorer.position_coef.normal_()
    x, batch = _tokens()
    weights = torch.randn(2, len(LENGTHS), 4, 10, 10, dtype=torch.float64)
    (model(x, batch).to_dense() * weights).sum().backward()
    got = model.scorer.position_coef.grad.clone()
    model.zero_grad()
    (_reference_graphs(model, x, LENGTHS) * weights).sum().backward()
    torch.testing.assert_close(got, model.scorer.position_coef.grad)
    assert got.abs().sum() > 0


def test_relative_position_starts_as_the_paper_model_and_rejects_bad_settings():
    torch.manual_seed(0)
    plain = _predictor()
    torch.manual_seed(0)
    relative = _predictor(position="relative")
    x, batch = _tokens()
    torch.testing.assert_close(plain(x, batch).to_dense(), relative(x, batch).to_dense())
    assert "position='relative'" in repr(relative.scorer)
    for bad in (dict(position="absolute"), dict(position="relative", position_frequencies=0),
                dict(position="relative", position_frequencies=2.5),
                dict(position="relative", position_period=1.0),
                dict(position="relative", position_period=float("inf"))):
        with pytest.raises(ValueError, match="position"):
            _predictor(**bad)
