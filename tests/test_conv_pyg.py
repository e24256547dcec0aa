"""GlomoConv as a PyG layer: ``aggr`` equals PyG's per head (against ``SimpleConv``,
values and gradients), hooks, ``Explainer``, ``EdgeIndex``, sparse inputs, compilation,
and no host-device synchronisation in a steady-state forward."""
import pytest
import torch
from host_syncs import count_host_syncs, total
from torch_geometric import EdgeIndex
from torch_geometric.explain import Explainer, GNNExplainer
from torch_geometric.explain.algorithm.utils import clear_masks, set_masks
from torch_geometric.nn import SimpleConv
from torch_geometric.nn.aggr import MaxAggregation, MultiAggregation

from glomo_pyg import GlomoConv

N, C, HEADS, E = 11, 12, 3, 50


def random_graph(seed=0, heads=HEADS, n=N, edges=E):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, edges), generator=g)
    head = torch.randint(0, heads, (edges,), generator=g)
    w = torch.rand(edges, generator=g, dtype=torch.float64) + 0.1
    x = torch.randn(n, C, generator=g, dtype=torch.float64)
    return x, ei, w, head


def per_head_simple_conv(aggr, x, ei, w, head, heads):
    """Head h: PyG's SimpleConv on head h's edges and channel chunk h."""
    chunks = x.chunk(heads, dim=1)
    outs = []
    for h in range(heads):
        keep = head == h
        outs.append(SimpleConv(aggr=aggr)(chunks[h], ei[:, keep], w[keep]))
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("aggr", ["sum", "mean", "max"])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_aggr_equals_simple_conv_per_head_values_and_gradients(aggr, fused, seed):
    x, ei, w, head = random_graph(seed)
    x1, w1 = x.clone().requires_grad_(), w.clone().requires_grad_()
    x2, w2 = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = GlomoConv(C, heads=HEADS, aggr=aggr, fused=fused)(x1, ei, w1, head)
    want = per_head_simple_conv(aggr, x2, ei, w2, head, HEADS)
    torch.testing.assert_close(out, want)
    probe = torch.randn_like(out)
    grads = torch.autograd.grad((out * probe).sum(), (x1, w1))
    wants = torch.autograd.grad((want * probe).sum(), (x2, w2))
    for got, expected in zip(grads, wants):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("aggr", ["sum", "mean", "max"])
def test_one_graph_for_all_channels_equals_simple_conv(aggr):
    x, ei, w, _ = random_graph(3)
    torch.testing.assert_close(GlomoConv(C, heads=HEADS, aggr=aggr)(x, ei, w),
                               SimpleConv(aggr=aggr)(x, ei, w))


def test_an_aggregation_module_is_honoured_and_a_width_changing_one_refused():
    x, ei, w, head = random_graph(4)
    torch.testing.assert_close(GlomoConv(C, heads=HEADS, aggr=MaxAggregation())(x, ei, w, head),
                               per_head_simple_conv("max", x, ei, w, head, HEADS))
    for bad in (["sum", "max"], MultiAggregation(["sum", "max"])):
        with pytest.raises(ValueError, match="changes the width"):
            GlomoConv(C, heads=HEADS, aggr=bad)
    with pytest.raises(ValueError):
        GlomoConv(C, heads=HEADS, aggr="no-such-aggregation")


def test_the_fast_path_is_message_and_aggregate_and_hooks_fire():
    x, ei, w, head = random_graph(5)
    calls = []
    conv = GlomoConv(C, heads=HEADS)
    conv.register_propagate_forward_hook(lambda *a: calls.append("propagate"))
    conv.register_message_and_aggregate_forward_hook(lambda *a: calls.append("fused"))
    conv.register_message_forward_hook(lambda *a: calls.append("message"))
    conv(x.float(), ei, w.float(), head)
    assert calls == ["fused", "propagate"]
    calls.clear()
    mean = GlomoConv(C, heads=HEADS, aggr="mean")
    mean.register_message_forward_hook(lambda *a: calls.append("message"))
    mean.register_aggregate_forward_hook(lambda *a: calls.append("aggregate"))
    mean(x.float(), ei, w.float(), head)
    assert calls == ["message", "aggregate"]


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = GlomoConv(C, heads=HEADS)
        self.out = torch.nn.Linear(C, 2)

    def forward(self, x, edge_index, edge_weight=None, edge_head=None):
        return self.out(self.conv(x, edge_index, edge_weight, edge_head))


def test_explainer_masks_the_users_edges_in_their_order():
    x, ei, w, head = random_graph(6)
    x, w = x.float(), w.float()
    model = _Model().eval()
    explainer = Explainer(model, GNNExplainer(epochs=3), explanation_type="model",
                          node_mask_type="attributes", edge_mask_type="object",
                          model_config=dict(mode="multiclass_classification",
                                            task_level="node", return_type="raw"))
    explanation = explainer(x, ei, edge_weight=w, edge_head=head, index=0)
    assert explanation.edge_mask.shape == (E,)
    # only edges that reach node 0 (directly: one layer) can matter
    assert torch.all(explanation.edge_mask[ei[1] != 0] == 0)
    # the mask of edge e scales edge e's message: all-zero masks leave no message
    conv = GlomoConv(C, heads=HEADS)
    set_masks(conv, torch.zeros(E), ei, apply_sigmoid=False)
    assert torch.equal(conv(x, ei, w, head), torch.zeros(N, C))
    set_masks(conv, (head == 1).float(), ei, apply_sigmoid=False)
    masked = conv(x, ei, w, head)
    clear_masks(conv)
    keep = head == 1
    torch.testing.assert_close(masked, GlomoConv(C, heads=HEADS)(x, ei[:, keep], w[keep],
                                                                 head[keep]))


def test_edge_index_and_sparse_inputs_give_the_same_numbers():
    x, ei, w, _ = random_graph(7)
    conv = GlomoConv(C, heads=HEADS, aggr="mean")
    want = conv(x, ei, w)
    torch.testing.assert_close(conv(x, EdgeIndex(ei, sparse_size=(N, N)), w), want)
    adj_t = torch.sparse_coo_tensor(ei.flip(0), w, (N, N)).coalesce()
    coalesced = adj_t.indices().flip(0)  # duplicate edges summed, as in the adjacency
    torch.testing.assert_close(conv(x, adj_t), conv(x, coalesced, adj_t.values()))
    torch.testing.assert_close(conv(x, adj_t.to_sparse_csr()), conv(x, adj_t))


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("heads", [1, HEADS])
@pytest.mark.parametrize("form", ["plain", "sized", "sorted_by_target", "sorted_by_source"])
def test_every_edge_index_form_equals_the_plain_tensor_on_every_path(fused, heads, form):
    """Values and gradients of an ``EdgeIndex`` input equal those of the same edges as a
    plain tensor, fused or not, with one or several heads, with ``edge_head`` or without."""
    x, ei, w, head = random_graph(10, heads=heads)
    if form == "sorted_by_target":
        order = torch.argsort(ei[1] * N + ei[0])
    elif form == "sorted_by_source":
        order = torch.argsort(ei[0] * N + ei[1])
    else:
        order = torch.arange(E)
    ei, w, head = ei[:, order], w[order], head[order]
    index = EdgeIndex(ei, sparse_size=(N, N) if form != "plain" else None,
                      sort_order={"sorted_by_target": "col",
                                  "sorted_by_source": "row"}.get(form))
    conv = GlomoConv(C, heads=heads, update="gru", fused=fused).double()
    for given_head in (head, None):
        grads = []
        for edges in (ei, index):
            xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
            out = conv(xs, edges, ws, given_head)
            out.square().sum().backward()
            grads.append((out.detach(), xs.grad, ws.grad))
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("aggr", ["sum", "mean"])
def test_compiles_without_graph_breaks_for_every_aggr(aggr):
    dynamo = pytest.importorskip("torch._dynamo")
    x, ei, w, head = random_graph(8)
    conv = GlomoConv(C, heads=HEADS, aggr=aggr, update="residual").double()
    explanation = dynamo.explain(conv)(x, ei, w, head)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    dynamo.reset()
    compiled = torch.compile(conv, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, ei, w, head), conv(x, ei, w, head))


@pytest.mark.parametrize("kind", ["sum", "mean", "gru", "shared", "sparse", "dense",
                                  "edge_index"])
def test_a_steady_state_forward_does_not_sync_with_the_host(kind):
    """A graph given again costs no sync: with ``cached=True``, or as an ``EdgeIndex``."""
    x, ei, w, head = random_graph(9)
    x, w = x.float(), w.float()
    conv = GlomoConv(C, heads=HEADS, aggr="mean" if kind == "mean" else "sum",
                     update="gru" if kind == "gru" else None, cached=kind != "edge_index")
    if kind == "dense":
        lengths = [4, 7]
        batch = torch.repeat_interleave(torch.arange(2), torch.tensor(lengths))
        adj = torch.rand(2, HEADS, 7, 7)
        call = lambda: conv.forward_dense(x, adj, batch)  # noqa: E731
    elif kind == "sparse":
        adj_t = torch.sparse_coo_tensor(torch.stack([head, ei[1], ei[0]]), w,
                                        (HEADS, N, N)).coalesce()
        call = lambda: conv(x, adj_t)  # noqa: E731
    elif kind == "shared":
        call = lambda: conv(x, ei, w)  # noqa: E731
    elif kind == "edge_index":
        index = EdgeIndex(ei, sparse_size=(N, N))
        call = lambda: conv(x, index, w, head)  # noqa: E731
    else:
        call = lambda: conv(x, ei, w, head)  # noqa: E731
    first = call()
    with count_host_syncs() as counts:
        out = call()
    assert total(counts) == 0, counts
    torch.testing.assert_close(out, first)


def test_a_new_graph_is_checked_once_with_one_sync():
    x, ei, w, head = random_graph(10)
    conv = GlomoConv(C, heads=HEADS)
    with count_host_syncs() as counts:
        conv(x.float(), ei, w.float(), head)
    assert 1 <= total(counts) <= 2, counts  # the value check (and the sortedness test)
