"""The four graph storages (glomo_pyg.graphs.storage) answer the same questions with the
same numbers: each against a dense reference written from paper Eq. 1 (tests/reference.py),
values and gradients, with padding and variable lengths; and the rules of building graphs
from storages."""
import pytest
import torch
from reference import allowed_pairs, batch_vector, dense_from_edges, dense_graph, pad

from glomo_pyg import LatentGraphs, flex
from glomo_pyg.graphs import (
    DenseStorage,
    EdgeStorage,
    FusedStorage,
    GraphFrame,
    GraphStorage,
    UniformStorage,
)
from glomo_pyg.kernels import latent_graph_dense, latent_graph_edges
from glomo_pyg.sequences import SequenceBatch

LENGTHS = [5, 1, 7, 3]
HEADS = 2
EVERY_RULE = pytest.mark.parametrize("direction,include_self", [
    ("forward", False), ("forward", True), ("backward", False), ("backward", True)])


def batch():
    return SequenceBatch.from_ptr(torch.tensor([0] + LENGTHS).cumsum(0))


def keys_queries(seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    b, t = len(LENGTHS), max(LENGTHS)
    k = torch.randn(b, HEADS, t, 4, generator=g)
    q = torch.randn(b, HEADS, t, 4, generator=g)
    return k.requires_grad_(requires_grad), q.requires_grad_(requires_grad)


def reference(k, q, direction, include_self, normalization="relu2"):
    """``[B, H, T(i), T(j)]`` graphs of Eq. 1 from the scores k_i . q_j."""
    scores = k @ q.transpose(-1, -2)  # [b, h, i, j]
    allowed = allowed_pairs(LENGTHS, max(LENGTHS), direction, include_self)
    return dense_graph(scores, allowed, normalization)


def reference_propagate(graph, x):
    """``[H, N, C]``: out[h, j] = sum_i G[b, h, i, j] x[i], sequence by sequence."""
    padded = pad(x, LENGTHS)  # [B, T, C]
    out = torch.einsum("bhij,bic->bhjc", graph, padded)
    return torch.cat([out[b, :, :n] for b, n in enumerate(LENGTHS)], dim=1)


def storages(k, q, frame, normalization="relu2"):
    s = frame.sequences
    emitted = dict(direction=frame.direction, include_self=frame.include_self,
                   normalization=normalization)
    out = [EdgeStorage(*latent_graph_edges(k, q, s.lengths, s.ptr, **emitted)),
           DenseStorage(latent_graph_dense(k, q, s.lengths, **emitted))]
    if flex.available():
        out.append(FusedStorage(k, q, normalization))
    return out


@EVERY_RULE
@pytest.mark.parametrize("normalization", ["relu2", "softmax"])
def test_every_storage_matches_the_dense_reference(direction, include_self, normalization):
    k, q = keys_queries()
    frame = GraphFrame(batch(), HEADS, direction, include_self)
    want = reference(k, q, direction, include_self, normalization)
    x = torch.randn(sum(LENGTHS), 3)
    for storage in storages(k, q, frame, normalization):
        name = type(storage).__name__
        torch.testing.assert_close(storage.dense(frame), want, msg=name)
        torch.testing.assert_close(dense_from_edges(*storage.edges(frame), LENGTHS, HEADS), want,
                                   msg=name)
        assert storage.num_edges(frame) == int(torch.count_nonzero(want)), name
        with torch.no_grad():  # (FlexAttention runs its CPU forward without gradients)
            torch.testing.assert_close(storage.propagate(frame, x),
                                       reference_propagate(want, x), msg=name)
        per_head = torch.randn(HEADS, sum(LENGTHS), 3)
        with torch.no_grad():
            torch.testing.assert_close(
                storage.propagate(frame, per_head),
                torch.stack([reference_propagate(want, per_head[h])[h] for h in range(HEADS)]),
                msg=name)
        moved = storage.to("cpu")
        assert type(moved) is type(storage)
        torch.testing.assert_close(moved.dense(frame), want, msg=name)


@EVERY_RULE
def test_every_storage_cuts_the_window_like_the_reference(direction, include_self):
    k, q = keys_queries(1)
    frame = GraphFrame(batch(), HEADS, direction, include_self)
    i = torch.arange(max(LENGTHS))
    near = (i.view(-1, 1) - i.view(1, -1)).abs() <= 2
    scores = (k @ q.transpose(-1, -2))
    allowed = allowed_pairs(LENGTHS, max(LENGTHS), direction, include_self) & near
    want = dense_graph(scores, allowed)  # Eq. 1 with the far pairs masked before normalising
    x = torch.randn(sum(LENGTHS), 3)
    for storage in storages(k, q, frame):
        cut = storage.within(frame, 2)
        torch.testing.assert_close(cut.dense(frame), want, msg=type(storage).__name__)
        with torch.no_grad():
            torch.testing.assert_close(cut.propagate(frame, x), reference_propagate(want, x))


def test_storages_pass_the_same_gradients():
    k, q = keys_queries(2, requires_grad=True)
    frame = GraphFrame(batch(), HEADS, "forward")
    x = torch.randn(sum(LENGTHS), 3, requires_grad=True)
    want = reference_propagate(reference(k, q, "forward", False), x)
    probe = torch.randn_like(want)
    grads_want = torch.autograd.grad((want * probe).sum(), (k, q, x))
    for storage in storages(k, q, frame)[:2]:  # (fused: FlexAttention has no CPU backward;
        got = storage.propagate(frame, x)       # the fallback is the edge storage's product)
        for a, b in zip(torch.autograd.grad((got * probe).sum(), (k, q, x)), grads_want):
            torch.testing.assert_close(a, b, msg=type(storage).__name__)


@EVERY_RULE
def test_the_uniform_storage_is_the_uniform_reference(direction, include_self):
    frame = GraphFrame(batch(), HEADS, direction, include_self)
    allowed = allowed_pairs(LENGTHS, max(LENGTHS), direction, include_self).float()
    allowed = allowed.expand(-1, HEADS, -1, -1)
    want = allowed / allowed.sum(2, keepdim=True).clamp(min=1)
    x = torch.randn(sum(LENGTHS), 3, dtype=torch.float64)
    storage = UniformStorage()
    assert not frame.cache  # lazy: nothing built before it is asked
    torch.testing.assert_close(storage.propagate(frame, x), reference_propagate(want.double(), x))
    assert not frame.cache  # propagation needs no edges
    assert storage.num_edges(frame) == int(torch.count_nonzero(want))
    torch.testing.assert_close(storage.dense(frame), want)
    assert storage.to("cpu") is storage and storage.within(frame, 2).window == 2


def test_graphs_from_storages():
    seqs = batch()
    k, q = keys_queries()
    edges = latent_graph_edges(k, q, seqs.lengths, seqs.ptr)
    meta = dict(num_heads=HEADS, direction="forward", sequences=seqs)
    graphs = LatentGraphs.from_storage([EdgeStorage(*edges), EdgeStorage(*edges)], **meta)
    assert graphs.num_layers == 2 and graphs.layout == "sparse"
    assert all(isinstance(s, GraphStorage) for s in graphs.storages)


def test_shared_storages_stay_shared_and_caches_stay_with_their_graphs():
    ptr = batch().ptr
    uniform = LatentGraphs.uniform(ptr, num_layers=3, num_heads=HEADS, direction="forward")
    assert uniform.storages[0] is uniform.storages[2]
    for derived in (uniform.within(2), uniform.to("cpu"), uniform.detach()):
        assert derived.storages[0] is derived.storages[1] is derived.storages[2]
    assert uniform.within(2).window == 2 and uniform.window is None
    uniform.layer(0)  # the edges are built once, for all three layers
    assert sum(key[0] == "uniform-edges" for key in uniform.frame.cache) == 1
    assert uniform.layer(2)[1] is uniform.layer(0)[1]
    # a conversion starts with an empty cache: nothing derived for other graphs leaks in
    assert not uniform.to("cpu").frame.cache and uniform.to("cpu").frame is not uniform.frame
    adjacent = LatentGraphs.adjacent(ptr, num_layers=2, num_heads=HEADS, direction="backward")
    x = torch.randn(sum(LENGTHS), 3)
    adjacent.propagate(x, 0), adjacent.propagate(x, 1)
    assert sum(key[0] == "blocked" for key in adjacent.frame.cache) == 1  # one index, shared


def test_a_layer_of_edges_converts_to_a_pyg_edge_index():
    """docs/design.md says users get a PyG EdgeIndex per head from a layer in one line."""
    EdgeIndex = pytest.importorskip("torch_geometric").EdgeIndex
    k, q = keys_queries(3)
    seqs = batch()
    graphs = LatentGraphs.from_trusted_edges(*map(list, zip(latent_graph_edges(
        k, q, seqs.lengths, seqs.ptr))), num_heads=HEADS, direction="forward", sequences=seqs)
    (ei, w, h) = graphs.layer(0)
    n = graphs.num_nodes
    x = torch.randn(n, 3)
    for head in range(HEADS):
        index = EdgeIndex(ei[:, h == head], sparse_size=(n, n), sort_order="col").validate()
        out = index.matmul(x, w[h == head], transpose=True)  # sum over sources i of G_ij x_i
        torch.testing.assert_close(out, graphs.propagate(x, 0)[head])
    assert torch.equal(graphs.batch, batch_vector(LENGTHS))


@EVERY_RULE
@pytest.mark.parametrize("normalization", ["relu2", "softmax"])
def test_head_mean_graphs_are_the_averaged_reference_in_every_layout(direction, include_self,
                                                                     normalization):
    k, q = keys_queries(3)
    frame = GraphFrame(batch(), HEADS, direction, include_self)
    want = reference(k, q, direction, include_self, normalization).mean(1, keepdim=True)
    x = torch.randn(sum(LENGTHS), 3)
    for storage in storages(k, q, frame, normalization) + [UniformStorage()]:
        graphs = LatentGraphs.from_storage([storage, storage], num_heads=HEADS,
                                           direction=direction, sequences=batch(),
                                           include_self=include_self)
        merged = graphs.mean_heads()
        name = type(storage).__name__
        assert (merged.num_heads, merged.num_layers, merged.layout) == (1, 2, graphs.layout)
        assert merged.storages[0] is merged.storages[1]  # a shared storage stays shared
        full = graphs.to_dense(0).mean(1, keepdim=True)  # [B, 1, T, T]
        if not isinstance(storage, UniformStorage):
            torch.testing.assert_close(full, want, msg=name)
        torch.testing.assert_close(merged.to_dense(0), full, msg=name)
        torch.testing.assert_close(dense_from_edges(*merged.layer(0), LENGTHS, 1), full,
                                   msg=name)
        with torch.no_grad():
            torch.testing.assert_close(merged.propagate(x, 0), reference_propagate(full, x),
                                       msg=name)
            cut = merged.within(2)
            near = graphs.within(2).to_dense(0).mean(1, keepdim=True)
            torch.testing.assert_close(cut.propagate(x, 0), reference_propagate(near, x),
                                       msg=name)
        assert merged.fused_layers is None  # (no keys and queries of one head)
    one = LatentGraphs.from_storage([storages(k[:, :1], q[:, :1], frame)[0]], num_heads=1,
                                    direction=direction, sequences=batch(),
                                    include_self=include_self)
    assert one.mean_heads() is one
