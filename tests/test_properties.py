"""Property-based tests (hypothesis) over the public API.

Inputs: random batch sizes, sequence lengths (1 to long), padding patterns, heads,
layers, directions, ``include_self``, dtypes and every graph layout. Invariants: finite
outputs; every (head, target) column sums to 1 or is empty; causality (a unit changes no
graph column, and no output, of an earlier unit going forward, of a later one going
backward); sequences of a batch do not see each other; layouts give the same graphs;
exports round-trip.

Budget: the default run (CI) draws a small, fixed set of examples (``derandomize``: the
same cases every run, so a failure replays). ``GLOMO_PROPERTY_EXAMPLES=N`` draws ``N``
random examples per property, with hypothesis's example database in ``.hypothesis/``
so a failure found there replays on the next run.
"""
import functools
import json
import os

import networkx as nx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from reference import batch_vector

from glomo_pyg import (
    GlomoConv,
    GlomoTransfer,
    GraphPredictor,
    LatentGraphs,
    PretrainedGraphPredictor,
)
from glomo_pyg.analysis import edge_list, to_graphml_graph
from glomo_pyg.nn.pixel import PixelGraphPredictor
from glomo_pyg.pixels import image_units

LARGE = int(os.environ.get("GLOMO_PROPERTY_EXAMPLES", "0"))
settings.register_profile(
    "glomo-properties", max_examples=LARGE or 12, derandomize=not LARGE, deadline=None,
    database=DirectoryBasedExampleDatabase(".hypothesis/glomo") if LARGE else None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], print_blob=True)
PROFILE = settings.get_profile("glomo-properties")

# Sequence lengths: mostly short, sometimes 1, sometimes long.
length = st.one_of(st.integers(1, 12), st.just(1), st.integers(30, 70))
lengths_st = st.lists(length, min_size=1, max_size=4)
TOKENS = 23


@functools.lru_cache(maxsize=None)
def predictor(direction, heads, layers, include_self, position, dtype):
    torch.manual_seed(heads * 7 + layers)
    model = GraphPredictor(num_tokens=TOKENS, hidden_channels=4 * heads, num_layers=layers,
                           heads=heads, cnn_layers=1, direction=direction,
                           include_self=include_self, position=position).eval()
    return model.to(dtype)


def column_sums(graphs, layer):
    (src, tgt), w, h = graphs.layer(layer)
    out = torch.zeros(graphs.num_heads, graphs.num_nodes, dtype=torch.float64)
    return out.index_put_((h, tgt), w.double(), accumulate=True)


def check_graph_invariants(graphs, lengths, include_self):
    ptr = graphs.ptr
    batch = graphs.batch
    for l in range(graphs.num_layers):
        (src, tgt), w, h = graphs.layer(l)
        assert torch.isfinite(w).all() and (w > 0).all()
        assert (batch[src] == batch[tgt]).all(), "an edge crosses sequences"
        pos_s, pos_t = src - ptr[batch[src]], tgt - ptr[batch[tgt]]
        if graphs.direction == "forward":
            ok = pos_s <= pos_t if include_self else pos_s < pos_t
        else:
            ok = pos_s >= pos_t if include_self else pos_s > pos_t
        assert ok.all(), "an edge breaks the direction"
        sums = column_sums(graphs, l)
        assert ((sums - 1).abs() < 1e-4).logical_or(sums == 0).all()


@PROFILE
@given(lengths=lengths_st, heads=st.sampled_from([1, 2, 4]), layers=st.integers(1, 2),
       direction=st.sampled_from(["forward", "backward"]), include_self=st.booleans(),
       position=st.sampled_from([None, "relative"]),
       dtype=st.sampled_from([torch.float32, torch.float64]), data=st.data())
def test_graph_predictor(lengths, heads, layers, direction, include_self, position, dtype,
                         data):
    model = predictor(direction, heads, layers, include_self, position, dtype)
    n = sum(lengths)
    x = torch.tensor(data.draw(st.lists(st.integers(0, TOKENS - 1), min_size=n, max_size=n)))
    batch = batch_vector(lengths)
    with torch.no_grad():
        sparse = model.set_layout("sparse")(x, batch)
        dense = model.set_layout("dense")(x, batch)
        fused = model.set_layout("fused")(x, batch) if dtype == torch.float32 else None
    model.set_layout("sparse")
    check_graph_invariants(sparse, lengths, include_self)
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    for l in range(layers):
        ref = sparse.to_dense(layer=l)
        assert torch.allclose(dense.to_dense(layer=l), ref, atol=tol)
        if fused is not None:
            assert torch.allclose(fused.to_dense(layer=l), ref, atol=1e-4)
    # causality and batch independence: change one unit, compare every other column
    b = data.draw(st.integers(0, len(lengths) - 1))
    p = data.draw(st.integers(0, lengths[b] - 1))
    start = int(sparse.ptr[b])
    y = x.clone()
    y[start + p] = (y[start + p] + 1) % TOKENS
    with torch.no_grad():
        changed = model(y, batch)
    for l in range(layers):
        before, after = sparse.to_dense(layer=l), changed.to_dense(layer=l)  # [B, H, T, T]
        keep = torch.ones_like(before, dtype=torch.bool)
        # columns that may change: targets in sequence b at or after p (forward), at or
        # before p (backward)
        t = before.size(-1)
        j = torch.arange(t)
        may = (j >= p) if direction == "forward" else (j <= p)
        keep[b, :, :, may] = False
        assert torch.equal(before[keep], after[keep]), "a unit changed an earlier column"


@functools.lru_cache(maxsize=None)
def pixel_predictor(h, w, heads, direction):
    torch.manual_seed(h * 10 + w)
    return PixelGraphPredictor(h, w, hidden_channels=4 * heads, num_layers=2, heads=heads,
                               cnn_layers=1, direction=direction).eval()


@PROFILE
@given(h=st.integers(1, 5), w=st.integers(2, 5), b=st.integers(1, 3),  # >= 2 pixels
       heads=st.sampled_from([1, 2]), direction=st.sampled_from(["forward", "backward"]),
       data=st.data())
def test_pixel_graph_predictor(h, w, b, heads, direction, data):
    model = pixel_predictor(h, w, heads, direction)
    seed = data.draw(st.integers(0, 2 ** 16))
    images = torch.randint(0, 256, (b, 3, h, w), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(seed))
    x, batch = image_units(images)
    with torch.no_grad():
        graphs = model(x, batch)
        dense_layout = model.set_layout("dense")(x, batch)
    model.set_layout("sparse")
    check_graph_invariants(graphs, [h * w] * b, False)
    for l in range(2):
        assert torch.allclose(dense_layout.to_dense(layer=l), graphs.to_dense(layer=l),
                              atol=1e-5)
    # raster causality: change one pixel of one image
    k, p = data.draw(st.integers(0, b - 1)), data.draw(st.integers(0, h * w - 1))
    y = x.clone()
    y[k * h * w + p] = 255 - y[k * h * w + p]
    with torch.no_grad():
        changed = model(y, batch)
    for l in range(2):
        before, after = graphs.to_dense(layer=l), changed.to_dense(layer=l)
        keep = torch.ones_like(before, dtype=torch.bool)
        j = torch.arange(h * w)
        keep[k, :, :, (j >= p) if direction == "forward" else (j <= p)] = False
        assert torch.equal(before[keep], after[keep])


@st.composite
def edge_graphs(draw):
    """Random valid graph edges over a batch of sequences (any order, any weights > 0)."""
    lengths = draw(st.lists(st.integers(1, 10), min_size=1, max_size=3))
    heads = draw(st.sampled_from([1, 2, 3]))
    ptr = [0]
    for n in lengths:
        ptr.append(ptr[-1] + n)
    edges = []
    for s, n in enumerate(lengths):
        for _ in range(draw(st.integers(0, 2 * n))):
            i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
            edges.append((ptr[s] + i, ptr[s] + j, draw(st.integers(0, heads - 1)),
                          draw(st.floats(0.01, 1.0))))
    edges = list({(i, j, h): w for i, j, h, w in edges}.items())
    if edges:
        ei = torch.tensor([[e[0][0] for e in edges], [e[0][1] for e in edges]])
        eh = torch.tensor([e[0][2] for e in edges])
        ew = torch.tensor([e[1] for e in edges], dtype=torch.float64)
    else:
        ei, eh = torch.zeros(2, 0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
        ew = torch.zeros(0, dtype=torch.float64)
    return lengths, heads, ei, ew, eh


def check_conv_equals_the_dense_sum(graph, width, data, wrap=lambda conv: conv):
    """A GlomoConv without update (``wrap``: e.g. compiled) against the sum over edges."""
    lengths, heads, ei, ew, eh = graph
    n, channels = sum(lengths), heads * width
    x = torch.randn(n, channels, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(data.draw(st.integers(0, 999))))
    out = wrap(GlomoConv(channels, heads=heads).double())(x, ei, ew, eh)
    assert out.shape == (n, channels) and torch.isfinite(out).all()
    ref = torch.zeros_like(x)
    for (i, j), w, h in zip(ei.t().tolist(), ew.tolist(), eh.tolist()):
        ref[j, h * width:(h + 1) * width] += w * x[i, h * width:(h + 1) * width]
    assert torch.allclose(out, ref, atol=1e-10)


@PROFILE
@given(graph=edge_graphs(), width=st.integers(1, 3), data=st.data())
def test_glomo_conv_equals_the_dense_sum(graph, width, data):
    check_conv_equals_the_dense_sum(graph, width, data)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compiled_glomo_conv_equals_the_dense_sum(backend):
    """The layer users compile: compiled with each backend, the same dense sum on the same
    random graphs (empty ones, unsorted edges, several heads). A small example count:
    every example compiles anew. (Hostile ids under compile: tests/test_compile.py, in a
    child process, so that a regression aborts the child, not the test run.)"""
    import torch._dynamo as dynamo

    @settings(PROFILE, max_examples=min(LARGE or 6, 3 if backend == "inductor" else 6))
    @given(graph=edge_graphs(), width=st.integers(1, 3), data=st.data())
    def check(graph, width, data):
        dynamo.reset()
        check_conv_equals_the_dense_sum(graph, width, data, lambda conv: torch.compile(
            conv, backend=backend, fullgraph=True))

    try:
        check()
    except Exception as err:  # inductor needs a working C++ toolchain
        if backend == "inductor" and "CppCompileError" in type(err).__name__ + str(err)[:300]:
            pytest.skip(f"inductor unavailable here: {err}")
        raise


@functools.lru_cache(maxsize=None)
def pretrained(heads, layers):
    parts = [predictor(d, heads, layers, False, None, torch.float32)
             for d in ("forward", "backward")]
    return PretrainedGraphPredictor(*parts)


@PROFILE
@given(lengths=lengths_st, heads=st.sampled_from([1, 2]), layers=st.integers(1, 2),
       mixing=st.sampled_from(["free", "conditioned"]),
       propagation=st.sampled_from(["graph", "hierarchical", "both"]),
       graph=st.sampled_from(["learned", "uniform", "adjacent", "none"]),
       max_distance=st.sampled_from([None, 1, 3]), data=st.data())
def test_mixer_and_transfer(lengths, heads, layers, mixing, propagation, graph, max_distance,
                            data):
    torch.manual_seed(0)
    n = sum(lengths)
    x = torch.randint(0, TOKENS, (n,), generator=torch.Generator().manual_seed(
        data.draw(st.integers(0, 999))))
    batch = batch_vector(lengths)
    h = torch.randn(n, 6)
    transfer = GlomoTransfer(pretrained(heads, layers), 6, graph=graph, mixing=mixing,
                             propagation=propagation, max_distance=max_distance).eval()
    with torch.no_grad():
        out = transfer(h, x, batch)
        graphs = transfer.graphs(x, batch)
        mixed = transfer.mixer(h, graphs) if graph != "none" else None
    assert out.shape == (n, transfer.out_channels) and torch.isfinite(out).all()
    if graphs is not None and max_distance is not None:  # no edge beyond the window
        assert all(bool(((tgt - src).abs() <= max_distance).all())
                   for g in graphs for (src, tgt), _, _ in g)
    if mixed is not None:
        assert all(m.shape == (n, 6) and torch.isfinite(m).all() for m in mixed)
    # sequences do not see each other: the first sequence alone gives the same rows
    first = lengths[0]
    with torch.no_grad():
        alone = transfer(h[:first], x[:first], batch[:first])
    assert torch.allclose(alone, out[:first], atol=1e-5)


@PROFILE
@given(lengths=lengths_st, heads=st.sampled_from([1, 2, 4]), layers=st.integers(1, 2),
       direction=st.sampled_from(["forward", "backward"]), data=st.data())
def test_conversions_and_exports_round_trip(lengths, heads, layers, direction, data,
                                            tmp_path_factory):
    model = predictor(direction, heads, layers, False, None, torch.float32)
    n = sum(lengths)
    x = torch.randint(0, TOKENS, (n,), generator=torch.Generator().manual_seed(
        data.draw(st.integers(0, 999))))
    with torch.no_grad():
        graphs = model(x, batch_vector(lengths))
    dense_layout = graphs.to_dense_layout()
    back = dense_layout.to_sparse()
    for l in range(layers):
        ref = graphs.to_dense(layer=l)
        assert torch.equal(dense_layout.to_dense(layer=l), ref)
        assert torch.equal(back.to_dense(layer=l), ref)
    sample = data.draw(st.integers(0, len(lengths) - 1))
    t = lengths[sample]
    exported = json.loads(json.dumps(edge_list(graphs, sample)))
    path = tmp_path_factory.mktemp("graphml") / "g.graphml"
    nx.write_graphml(to_graphml_graph(graphs, sample), path)
    read = nx.read_graphml(path, node_type=int, force_multigraph=True)
    assert read.number_of_nodes() == t
    for l in range(layers):
        ref = graphs.to_dense(layer=l)[sample, :, :t, :t]
        from_json = torch.zeros_like(ref)
        for part in exported["graphs"]:
            if part["layer"] == l:
                from_json[part["head"], part["source"], part["target"]] = torch.tensor(
                    part["weight"], dtype=ref.dtype)
        from_graphml = torch.zeros_like(ref)
        for i, j, d in read.edges(data=True):
            if d["layer"] == l:
                from_graphml[d["head"], i, j] = d["weight"]
        assert torch.equal(from_json, ref) and torch.equal(from_graphml, ref)


@PROFILE
@given(lengths=lengths_st, heads=st.integers(1, 3), layers=st.integers(1, 2),
       direction=st.sampled_from(["forward", "backward"]), include_self=st.booleans(),
       data=st.data())
def test_uniform_graphs(lengths, heads, layers, direction, include_self, data):
    ptr = torch.tensor([0] + [sum(lengths[:k + 1]) for k in range(len(lengths))])
    graphs = LatentGraphs.uniform(ptr, num_layers=layers, num_heads=heads, direction=direction,
                                  include_self=include_self)
    check_graph_invariants(graphs, lengths, include_self)
    x = torch.randn(int(ptr[-1]), 3, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(data.draw(st.integers(0, 999))))
    fast = graphs.propagate(x, 0)  # [H, N, C]: O(N) prefix means
    (src, tgt), w, h = graphs.layer(0)
    slow = torch.zeros(heads, *x.shape, dtype=torch.float64)
    slow.index_put_((h, tgt), w.double().unsqueeze(1) * x[src], accumulate=True)
    assert torch.isfinite(fast).all() and torch.allclose(fast, slow, atol=1e-10)
