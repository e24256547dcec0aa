"""LatentGraphs validate what they are given, so no public call can hand the sparse
kernels an out-of-range id (which would abort or corrupt the process)."""
import pytest
import torch

from glomo_pyg import GlomoConv, GlomoTransfer, GraphMixer, LatentGraphs
from glomo_pyg.kernels import head_propagate, weighted_spmm
from glomo_pyg.nn import GraphPredictor
from glomo_pyg.nn.pretrained import PretrainedGraphPredictor

PTR = torch.tensor([0, 3, 7])


def graphs_with(src, tgt, weight=None, head=None, ptr=PTR, **kw):
    ei = torch.tensor([src, tgt])
    w = torch.full((len(src),), 0.5) if weight is None else torch.tensor(weight)
    h = torch.zeros(len(src), dtype=torch.long) if head is None else torch.tensor(head)
    return LatentGraphs([ei], [w], [h], num_heads=2, direction="forward", ptr=ptr, **kw)


@pytest.mark.parametrize("edges, match", [
    (dict(src=[0, 7], tgt=[1, 2]), r"node ids outside \[0, 7\)"),
    (dict(src=[-1, 0], tgt=[1, 2]), "node ids outside"),
    (dict(src=[0, 1], tgt=[1, 9]), "node ids outside"),
    (dict(src=[0, 1], tgt=[1, 2], head=[0, 2]), r"heads outside \[0, 2\)"),
    (dict(src=[0, 2], tgt=[1, 4]), "two different sequences"),
    (dict(src=[0, 1], tgt=[1, 2], weight=[0.5, float("nan")]), "finite and non-negative"),
    (dict(src=[0, 1], tgt=[1, 2], weight=[0.5, -0.1]), "finite and non-negative"),
])
def test_out_of_range_or_inconsistent_edges_are_refused_at_construction(edges, match):
    with pytest.raises(ValueError, match=match):
        graphs_with(**edges)


def test_bad_dtypes_shapes_ptr_and_devices_are_refused():
    ei, w, h = torch.tensor([[0], [1]]), torch.ones(1), torch.zeros(1, dtype=torch.long)
    with pytest.raises(ValueError, match="int64"):
        LatentGraphs([ei.int()], [w], [h], num_heads=1, direction="forward", ptr=PTR)
    with pytest.raises(ValueError, match="floating point"):
        LatentGraphs([ei], [w.long()], [h], num_heads=1, direction="forward", ptr=PTR)
    with pytest.raises(ValueError, match=r"\[2, E\]"):
        LatentGraphs([ei.t()], [w], [h], num_heads=1, direction="forward", ptr=PTR)
    with pytest.raises(ValueError, match="start at 0"):
        LatentGraphs([ei], [w], [h], num_heads=1, direction="forward", ptr=torch.tensor([1, 3]))
    with pytest.raises(ValueError, match="never decrease"):
        LatentGraphs([ei], [w], [h], num_heads=1, direction="forward",
                     ptr=torch.tensor([0, 3, 2]))
    with pytest.raises(ValueError, match="ptr must be an int64"):
        LatentGraphs([ei], [w], [h], num_heads=1, direction="forward", ptr=[0, 3])
    with pytest.raises(ValueError, match="num_heads"):
        LatentGraphs([ei], [w], [h], num_heads=0, direction="forward", ptr=PTR)
    with pytest.raises(ValueError, match="one entry per layer"):
        LatentGraphs([ei], [], [h], num_heads=1, direction="forward", ptr=PTR)


def test_hostile_graphs_never_reach_mixer_or_transfer():
    """The scenario of the architecture review: out-of-range ids used to abort the
    process inside the CSR product; now they are a named error before any kernel."""
    with pytest.raises(ValueError, match="outside"):
        graphs_with([0, 100], [1, 2])
    good = graphs_with([0, 3], [1, 5])
    mixer = GraphMixer(4, num_layers=1, heads=2, directions=["forward"])
    assert mixer(torch.randn(7, 4), good)[0].shape == (7, 4)
    with pytest.raises(ValueError, match="cover 7 units, x has 8"):
        mixer(torch.randn(8, 4), good)
    with pytest.raises(TypeError, match="LatentGraphs"):
        mixer(torch.randn(7, 4), [{"edge_index": None}])
    fw = GraphPredictor(num_tokens=10, hidden_channels=8, num_layers=1, heads=2)
    transfer = GlomoTransfer(PretrainedGraphPredictor(fw), in_channels=4)
    out = transfer(torch.randn(7, 4), graphs=(good, None))
    assert out.shape == (7, 8) and torch.isfinite(out).all()


def test_public_kernels_check_their_indices():
    x = torch.randn(3, 2)
    with pytest.raises(ValueError, match="col holds ids outside"):
        weighted_spmm(torch.tensor([0, 1]), torch.tensor([0, 3]), torch.ones(2), x, 2)
    with pytest.raises(ValueError, match="row holds ids outside"):
        weighted_spmm(torch.tensor([0, 5]), torch.tensor([0, 1]), torch.ones(2), x, 2)
    with pytest.raises(ValueError, match="sorted"):
        weighted_spmm(torch.tensor([1, 0]), torch.tensor([0, 1]), torch.ones(2), x, 2)
    with pytest.raises(ValueError, match="one entry per edge"):
        weighted_spmm(torch.tensor([0, 1]), torch.tensor([0, 1]), torch.ones(3), x, 2)
    ei, eh = torch.tensor([[0, 1], [1, 2]]), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="edge_head values"):
        head_propagate(x, ei, torch.ones(2), eh, num_heads=1)
    with pytest.raises(ValueError, match="refers to nodes outside"):
        head_propagate(x, ei + 5, torch.ones(2), eh, num_heads=2)
    out = head_propagate(x, ei, torch.ones(2), eh, num_heads=2)
    assert out.shape == (2, 3, 2)


def test_propagation_is_owned_by_the_graphs_and_caches_the_sparse_index():
    torch.manual_seed(0)
    predictor = GraphPredictor(num_tokens=10, hidden_channels=8, num_layers=2, heads=2,
                               cnn_layers=1)
    x, batch = torch.randint(0, 10, (9,)), torch.tensor([0] * 4 + [1] * 5)
    graphs = predictor(x, batch)
    h = torch.randn(9, 6)
    first = graphs.propagate(h, 1)
    key = ("blocked", id(graphs.storages[1]), True)
    cached = graphs.frame.cache[key]
    torch.testing.assert_close(first, head_propagate(h, *graphs.layer(1), num_heads=2))
    assert graphs.propagate(h, 1) is not first and graphs.frame.cache[key] is cached
    dense = graphs.to_dense_layout().propagate(h, 1)
    torch.testing.assert_close(dense, first)
    # hand-built edges in any order: sorted once, same numbers
    ei, w, eh = graphs.layer(1)
    perm = torch.randperm(w.numel(), generator=torch.Generator().manual_seed(3))
    shuffled = LatentGraphs([ei[:, perm]], [w[perm]], [eh[perm]], num_heads=2,
                            direction="forward", ptr=graphs.ptr)
    torch.testing.assert_close(shuffled.propagate(h, 0), first)
    conv = GlomoConv(6, heads=2)
    torch.testing.assert_close(conv.propagate_graphs(h, shuffled, 0), conv(h, *graphs.layer(1)))
    with pytest.raises(ValueError, match="this layer needs 2 heads over 8"):
        conv.propagate_graphs(torch.randn(8, 6), shuffled, 0)


def test_layer_and_head_counts_are_bounded():
    from glomo_pyg.graphs import MAX_HEADS

    ptr = torch.tensor([0, 4])
    with pytest.raises(ValueError, match="at least one layer"):
        LatentGraphs([], [], [], num_heads=1, direction="forward", ptr=ptr)
    with pytest.raises(ValueError, match="num_heads must be an integer in"):
        LatentGraphs([], [], [], num_heads=MAX_HEADS + 1, direction="forward", ptr=ptr)
    for kwargs in (dict(num_layers=2.5, num_heads=1), dict(num_layers="3", num_heads=1),
                   dict(num_layers=10 ** 7, num_heads=1), dict(num_layers=1, num_heads=1.5)):
        with pytest.raises(ValueError, match="must be an integer in"):
            LatentGraphs.uniform(ptr, direction="forward", **kwargs)


def test_edges_against_the_direction_are_refused():
    ptr = torch.tensor([0, 3, 6])
    for direction, edge, message in [("forward", (2, 1), "against the forward order"),
                                     ("forward", (4, 4), "against the forward order"),
                                     ("backward", (3, 5), "against the backward order")]:
        with pytest.raises(ValueError, match=message):
            LatentGraphs([torch.tensor([[edge[0]], [edge[1]]])], [torch.ones(1)],
                         [torch.zeros(1, dtype=torch.long)], num_heads=1, direction=direction,
                         ptr=ptr)
    LatentGraphs([torch.tensor([[4], [4]])], [torch.ones(1)], [torch.zeros(1, dtype=torch.long)],
                 num_heads=1, direction="forward", ptr=ptr, include_self=True)
    LatentGraphs([torch.tensor([[5], [3]])], [torch.ones(1)], [torch.zeros(1, dtype=torch.long)],
                 num_heads=1, direction="backward", ptr=ptr)


def test_propagate_checks_the_rows_of_x_and_to_refuses_dtypes():
    """A wrong row count reached the sparse kernel and corrupted the heap (SIGABRT)."""
    predictor = GraphPredictor(num_tokens=20, hidden_channels=16, num_layers=1, heads=2).eval()
    n = 300
    graphs = predictor(torch.randint(0, 20, (n,)), torch.arange(n) // 100)
    for layout in ("sparse", "dense"):
        g = graphs if layout == "sparse" else LatentGraphs.from_dense(
            graphs.to_dense(), direction="forward", ptr=graphs.ptr)
        for bad in (torch.randn(1, 6), torch.randn(n - 1, 6), torch.randn(3, n, 6),
                    torch.ones(n, 6, dtype=torch.long), torch.randn(n)):
            with pytest.raises(ValueError, match="x must be floating-point"):
                g.propagate(bad, 0)
        assert g.propagate(torch.randn(n, 6), 0).shape == (2, n, 6)
    with pytest.raises(TypeError, match="not a dtype"):
        graphs.to(torch.float16)
