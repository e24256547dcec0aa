"""GlomoConv against dense per-head A @ X (values and gradients), every input form."""
import pytest
import torch
from reference import assert_same_values_and_grads, dense_aggregate, pad

from glomo_pyg import GlomoConv, GraphPredictor, LatentGraphs

LENGTHS = [6, 1, 9, 4]


def _graphs(heads=4, dtype=torch.float64):
    predictor = GraphPredictor(num_tokens=20, hidden_channels=16, num_layers=2, heads=heads,
                               cnn_layers=1).to(dtype)
    batch = torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS))
    x = torch.randint(0, 20, (batch.numel(),))
    return predictor(x, batch)


def _dense_reference(x, graphs, layer, heads):
    dense = graphs.to_dense(layer)  # [B, H, T, T], differentiable in the edge weights
    out = dense_aggregate(dense, pad(x, LENGTHS), heads)
    mask = torch.arange(out.size(1)).view(1, -1) < torch.tensor(LENGTHS).view(-1, 1)
    return out[mask]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("heads", [1, 4])
def test_matches_dense_per_head_values_and_gradients(fused, heads):
    graphs = _graphs(heads)
    x = torch.randn(graphs.num_nodes, 8, dtype=torch.float64, requires_grad=True)
    conv = GlomoConv(8, heads=heads, fused=fused).double()
    for layer in range(graphs.num_layers):
        ei, w, h = graphs.layer(layer)
        w = w.detach().requires_grad_()
        weights = [w if l == layer else graphs.edge_weight[l] for l in range(graphs.num_layers)]
        graphs = LatentGraphs(graphs.edge_index, weights, graphs.edge_head, num_heads=heads,
                              direction=graphs.direction, ptr=graphs.ptr)
        out = conv(x, ei, w, h)
        ref = _dense_reference(x, graphs, layer, heads)
        assert_same_values_and_grads(out, ref, (x, w))


def test_torch_sparse_adjacency_gives_same_output_and_weight_gradients():
    heads = 4
    graphs = _graphs(heads)
    ei, w, h = graphs.layer(0)
    w = w.detach().requires_grad_()
    x = torch.randn(graphs.num_nodes, 8, dtype=torch.float64)
    conv = GlomoConv(8, heads=heads).double()
    n = graphs.num_nodes
    adj_t = torch.sparse_coo_tensor(torch.stack([h, ei[1], ei[0]]), w, (heads, n, n))
    out_sparse = conv(x, adj_t)
    out_edges = conv(x, ei, w, h)
    torch.testing.assert_close(out_sparse, out_edges)
    g_sparse, = torch.autograd.grad(out_sparse.sum(), w)
    g_edges, = torch.autograd.grad(out_edges.sum(), w)
    torch.testing.assert_close(g_sparse, g_edges)
    # A 2-D adjacency is shared by all channels; CSR works as well.
    adj2 = torch.sparse_coo_tensor(torch.stack([ei[1], ei[0]]), w.detach(), (n, n)).coalesce()
    ref = adj2.to_dense() @ x
    torch.testing.assert_close(GlomoConv(8).double()(x, adj2), ref)
    torch.testing.assert_close(GlomoConv(8).double()(x, adj2.to_sparse_csr()), ref)


def test_unsorted_edges_and_shared_graph():
    x = torch.randn(5, 4, dtype=torch.float64)
    ei = torch.tensor([[3, 0, 1, 2], [4, 1, 4, 3]])
    w = torch.tensor([0.25, 1.0, 0.75, 1.0], dtype=torch.float64)
    out = GlomoConv(4).double()(x, ei, w)
    ref = torch.zeros(5, 4, dtype=torch.float64)
    ref[4] = 0.25 * x[3] + 0.75 * x[1]
    ref[1] = x[0]
    ref[3] = x[2]
    torch.testing.assert_close(out, ref)
    # Without weights every edge counts 1.
    torch.testing.assert_close(GlomoConv(4).double()(x, ei)[4], x[3] + x[1])


@pytest.mark.parametrize("update", ["gru", "residual"])
def test_update_functions(update):
    graphs = _graphs(heads=2)
    ei, w, h = graphs.layer(0)
    x = torch.randn(graphs.num_nodes, 8, dtype=torch.float64)
    conv = GlomoConv(8, heads=2, update=update).double()
    c = GlomoConv(8, heads=2).double()(x, ei, w, h)
    if update == "gru":
        ref = conv.gru(torch.cat([c * x, c], -1), x)
    else:
        ref = x + conv.lin(c)
    torch.testing.assert_close(conv(x, ei, w, h), ref)
    assert "update='%s'" % update in repr(conv)


def test_no_edges_gives_zero_aggregation():
    x = torch.randn(3, 4)
    out = GlomoConv(4, heads=2)(x, torch.empty(2, 0, dtype=torch.long), torch.empty(0),
                                torch.empty(0, dtype=torch.long))
    assert torch.equal(out, torch.zeros(3, 4))


def test_bad_input_is_rejected_with_clear_errors():
    conv = GlomoConv(8, heads=2)
    x = torch.randn(4, 8)
    ei = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="multiple of heads"):
        GlomoConv(7, heads=2)
    with pytest.raises(ValueError, match="update"):
        GlomoConv(8, update="lstm")
    with pytest.raises(TypeError, match="floating-point"):
        conv(x.long(), ei)
    with pytest.raises(ValueError, match=r"\[N, 8\]"):
        conv(torch.randn(4, 6), ei)
    with pytest.raises(TypeError, match="int64"):
        conv(x, ei.float())
    with pytest.raises(ValueError, match=r"\[2, E\]"):
        conv(x, ei[:1])
    with pytest.raises(ValueError, match="outside"):
        conv(x, torch.tensor([[0], [9]]))
    with pytest.raises(ValueError, match="edge_weight"):
        conv(x, ei, torch.ones(3))
    with pytest.raises(ValueError, match="edge_head"):
        conv(x, ei, torch.ones(2), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="sparse adjacency"):
        conv(x, torch.eye(5).to_sparse())
    with pytest.raises(ValueError, match="H = heads"):
        conv(x, torch.zeros(3, 4, 4).to_sparse())
    with pytest.raises(ValueError, match="do not pass"):
        conv(x, torch.eye(4).to_sparse(), torch.ones(4))
