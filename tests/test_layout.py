"""The dense graph layout: conversions, and identical results (values and gradients)
across the public layers in both layouts; 'auto' picks each layout where it should."""
import pytest
import torch
from reference import assert_same_values_and_grads, batch_vector, dense_from_edges

import glomo_pyg.nn.layout as layout_module
from glomo_pyg import Glomo, GlomoConv, GraphMixer, GraphPredictor, LatentGraphs
from glomo_pyg.kernels import check_dense_graph_values
from glomo_pyg.sequences import sequence_batch

LENGTHS = [5, 1, 9, 3]
N = sum(LENGTHS)


def predictor(direction="forward", layout="sparse", **kw):
    torch.manual_seed(7)
    return GraphPredictor(num_tokens=30, hidden_channels=16, num_layers=2, heads=4,
                          direction=direction, cnn_layers=1, **kw).set_layout(layout)


def tokens():
    torch.manual_seed(8)
    return torch.randint(0, 30, (N,)), batch_vector(LENGTHS)


def same_edges(a, b):
    assert a.num_layers == b.num_layers
    for l in range(a.num_layers):
        assert torch.equal(a.edge_index[l], b.edge_index[l])
        assert torch.equal(a.edge_head[l], b.edge_head[l])
        torch.testing.assert_close(a.edge_weight[l], b.edge_weight[l])


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("include_self", [False, True])
def test_conversions_round_trip(direction, include_self):
    x, batch = tokens()
    sparse = predictor(direction, include_self=include_self)(x, batch)
    dense = sparse.to_dense_layout()
    assert sparse.layout == "sparse" and dense.layout == "dense"
    assert dense.to_dense_layout() is dense and sparse.to_sparse() is sparse
    for l in range(2):
        torch.testing.assert_close(dense.dense_layer(l),
                                   dense_from_edges(*sparse.layer(l), LENGTHS, 4))
    back = dense.to_sparse()
    same_edges(back, sparse)
    same_edges(dense, sparse)  # export and analysis see sparse edges in either layout
    assert dense.num_edges == sparse.num_edges and dense.density() == sparse.density()
    nx_dense = dense.to_networkx(2, layer=1, head=3)
    nx_sparse = sparse.to_networkx(2, layer=1, head=3)
    a = {(i, j): w for i, j, w in nx_dense.edges(data="weight")}
    b = {(i, j): w for i, j, w in nx_sparse.edges(data="weight")}
    assert a.keys() == b.keys() and len(a) > 0
    assert all(abs(a[k] - b[k]) < 1e-6 for k in a)
    assert "layout='dense'" in repr(dense)


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("sparse_norm", [True, False])
def test_dense_emission_equals_sparse_emission_values_and_grads(direction, sparse_norm):
    x, batch = tokens()
    p_sparse = predictor(direction, sparse=sparse_norm)
    p_dense = predictor(direction, layout="dense", sparse=sparse_norm)
    p_dense.load_state_dict(p_sparse.state_dict())
    g_sparse, g_dense = p_sparse(x, batch), p_dense(x, batch)
    assert g_dense.layout == "dense"
    probe = torch.randn(2, len(LENGTHS), 4, 9, 9)
    a = (g_sparse.to_dense() * probe).sum()
    b = (g_dense.to_dense() * probe).sum()
    torch.testing.assert_close(a, b)
    params_s, params_d = list(p_sparse.parameters()), list(p_dense.parameters())
    for gs, gd in zip(torch.autograd.grad(a, params_s, allow_unused=True),
                      torch.autograd.grad(b, params_d, allow_unused=True)):
        if gs is None:
            assert gd is None or gd.abs().max() == 0
        else:
            torch.testing.assert_close(gs, gd, atol=1e-5, rtol=1e-4)
    same_edges(g_dense, g_sparse)


@pytest.mark.parametrize("heads,update", [(4, None), (4, "gru"), (1, "residual")])
def test_glomo_conv_dense_blocks_equal_edges(heads, update):
    x, batch = tokens()
    graphs = predictor()(x, batch).detach()
    conv = GlomoConv(8, heads=heads, update=update)
    h = torch.randn(N, 8, requires_grad=True)
    ei, w, eh = graphs.layer(1)
    w = w.clone().requires_grad_()
    if heads == 1:  # one graph for all channels: head 0's edges
        keep = eh == 0
        ei, w_in, eh = ei[:, keep], w[keep], None
        block = dense_from_edges(ei, w_in, torch.zeros_like(w_in, dtype=torch.long), LENGTHS, 1)
        block = block.requires_grad_()
        sparse_out, dense_out = conv(h, ei, w_in, eh), conv.forward_dense(h, block[:, 0], batch)
        assert_same_values_and_grads(dense_out, sparse_out, [h])
        return
    block = LatentGraphs([ei], [w], [eh], num_heads=4, direction="forward",
                         ptr=graphs.ptr).to_dense_layout().dense_layer(0)
    sparse_out, dense_out = conv(h, ei, w, eh), conv.forward_dense(h, block, batch)
    assert_same_values_and_grads(dense_out, sparse_out, [h, w, *conv.parameters()])


@pytest.mark.parametrize("propagation", ["both", "graph", "hierarchical"])
def test_graph_mixer_gives_the_same_in_both_layouts(propagation):
    x, batch = tokens()
    fw, bw = predictor("forward")(x, batch), predictor("backward")(x, batch)
    mixer = GraphMixer(6, 2, 4, mixing="conditioned", propagation=propagation)
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(0.3 * torch.randn_like(p))
    h = torch.randn(N, 6, requires_grad=True)
    sparse_out = mixer(h, [fw, bw])
    dense_out = mixer(h, [fw.to_dense_layout(), bw.to_dense_layout()])
    for s, d in zip(sparse_out, dense_out):
        assert_same_values_and_grads(d, s, [h, *mixer.parameters()])


@pytest.mark.parametrize("decouple", [True, False])
def test_pretraining_model_same_loss_and_gradients_in_every_layout(decouple):
    x, batch = tokens()
    models = {}
    for layout in ("sparse", "dense", "auto"):
        torch.manual_seed(3)
        models[layout] = Glomo.text(num_tokens=30, hidden_channels=16, num_layers=2, heads=4,
                                    cnn_layers=1, num_positions=4,
                                    decouple=decouple).set_layout(layout)
    results = {}
    for layout, model in models.items():
        torch.manual_seed(5)  # same sampled positions
        out = model(x, batch)
        grads = torch.autograd.grad(out.loss, list(model.parameters()), allow_unused=True)
        results[layout] = (out.loss, grads, out.metrics)
    loss, grads, metrics = results["sparse"]
    for layout in ("dense", "auto"):
        other_loss, other_grads, other_metrics = results[layout]
        torch.testing.assert_close(other_loss, loss)
        torch.testing.assert_close(other_metrics["forward/density"], metrics["forward/density"])
        for a, b in zip(grads, other_grads):
            if a is None or b is None:
                assert (a is None or a.abs().max() == 0) and (b is None or b.abs().max() == 0)
            else:
                torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)


def test_auto_picks_each_layout_where_it_should(monkeypatch):
    x, batch = tokens()
    auto = predictor(layout="auto", sparse=False)  # softmax: density 1, short sequences
    monkeypatch.setattr(layout_module, "CROSSOVER", ((10**9, 0.5),))
    assert auto(x, batch).layout == "dense"
    # blocks over the memory limit: sparse edges, without ever forming the blocks
    monkeypatch.setattr(layout_module, "DENSE_MAX_WEIGHTS", 4 * 4 * 9 * 9 - 1)
    assert auto(x, batch).layout == "sparse"
    monkeypatch.setattr(layout_module, "DENSE_MAX_WEIGHTS", 1 << 26)
    # graphs sparser than the crossover: sparse edges
    sparse_graphs = predictor(layout="auto")
    with torch.no_grad():
        sparse_graphs.scorer.bias.fill_(-0.5)  # most scores below zero: about 11% density
    graphs = sparse_graphs(x, batch)
    assert 0 < sum(graphs.density()) / 2 < 0.5 and graphs.layout == "sparse"
    same_edges(graphs, graphs.to_dense_layout())
    # the rule itself: crossover by the next longer table row, the size limit first
    monkeypatch.setattr(layout_module, "CROSSOVER", ((64, 0.2), (256, 0.6)))
    assert layout_module.choose_layout(4, 8, 64, 0.2) == "dense"
    assert layout_module.choose_layout(4, 8, 64, 0.19) == "sparse"
    assert layout_module.choose_layout(4, 8, 65, 0.5) == "sparse"  # T=65 uses the 256 row
    assert layout_module.choose_layout(4, 8, 1000, 0.6) == "dense"  # beyond: the last row
    assert layout_module.choose_layout(1 << 20, 8, 64, 1.0) == "sparse"  # blocks too large


def test_dense_layout_rejects_bad_input():
    ptr = torch.tensor([0, 3, 7])
    with pytest.raises(ValueError, match=r"B = 2, T = 4"):
        LatentGraphs.from_dense([torch.zeros(2, 2, 3, 3)], direction="forward", ptr=ptr)
    with pytest.raises(ValueError, match="float"):
        LatentGraphs.from_dense([torch.zeros(2, 2, 4, 4, dtype=torch.long)], direction="forward",
                                ptr=ptr)
    with pytest.raises(ValueError, match="at least one layer"):
        LatentGraphs.from_dense([], direction="forward", ptr=ptr)
    conv = GlomoConv(4, heads=2)
    x = torch.randn(7, 4)
    batch = sequence_batch(7, torch.tensor([0, 0, 0, 1, 1, 1, 1]), x.device).batch
    with pytest.raises(ValueError, match=r"\[B, H, T, T\] = \[2, 2, 4, 4\]"):
        conv.forward_dense(x, torch.zeros(2, 3, 4, 4), batch)
    with pytest.raises(ValueError, match="dense graph blocks must have shape"):
        conv.forward_dense(x, torch.zeros(2, 2, 4), batch)
    with pytest.raises(ValueError, match="dense graph blocks"):
        conv.forward_dense(x, torch.zeros(2, 4), batch)
    with pytest.raises(TypeError, match="forward_dense"):
        conv(x, torch.zeros(2, 2, 4, 4), torch.ones(3))
    # graph weights are checked in the dense layout as in the edge layout; features are not
    for bad in (float("nan"), float("inf"), -float("inf")):
        adj = torch.rand(2, 2, 4, 4)
        adj[1, 0, 2, 1] = bad
        with pytest.raises(ValueError, match="adj contains NaN or Inf"):
            conv.forward_dense(x, adj, batch)
        with pytest.raises(ValueError, match="adj contains NaN or Inf"):
            conv.forward_dense(x, adj[:, 0], batch)
    huge = torch.full((2, 2, 4, 4), 6e4, dtype=torch.float16)  # finite, its sum is not
    assert not torch.isfinite(huge.sum())
    check_dense_graph_values(huge)  # (the exact pass decides)
    nan_features = x.clone()
    nan_features[0] = float("nan")
    assert conv.forward_dense(nan_features, torch.rand(2, 2, 4, 4), batch).isnan().any()
    with pytest.raises(ValueError, match="layout must be"):
        GraphPredictor(num_tokens=5, hidden_channels=8, heads=2).set_layout("csr")
    with pytest.raises(TypeError):  # a run-time choice, not a constructor argument
        GraphPredictor(num_tokens=5, hidden_channels=8, heads=2, layout="dense")


def test_equal_length_sequences_take_the_unpadded_dense_path():
    """All sequences at full length: the dense path skips padding; same results."""
    torch.manual_seed(4)
    x, batch = torch.randint(0, 30, (18,)), batch_vector([6, 6, 6])
    graphs = predictor()(x, batch).detach()
    conv = GlomoConv(8, heads=4)
    h = torch.randn(18, 8, requires_grad=True)
    sparse_out = conv(h, *graphs.layer(0))
    dense_out = conv.forward_dense(h, graphs.to_dense_layout().dense_layer(0), batch)
    assert_same_values_and_grads(dense_out, sparse_out, [h])
    mixer = GraphMixer(8, 2, 4, directions=["forward"])
    assert_same_values_and_grads(mixer(h, graphs.to_dense_layout())[0], mixer(h, graphs)[0], [h])
