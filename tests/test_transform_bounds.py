"""The graph transforms' bounds and refusals: stale edge attributes of the input are
dropped, a sample too large for memory is refused before anything is allocated (edges:
``MAX_SAMPLE_EDGES``; a predictor's keys and queries: ``MAX_EMISSION_BYTES``), the fixed
graphs' cache of built lengths is bounded, numpy / torch scalar options become Python
numbers, and devices or inputs the transforms cannot use get named errors."""
import time

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch, Data, HeteroData

from glomo_pyg import GraphPredictor, PretrainedGraphPredictor
from glomo_pyg.nn.pixel import PixelGraphPredictor
from glomo_pyg.transforms import ChainGraphs, GlomoGraphs, GridGraphs, UniformGraphs, base, fixed
from glomo_pyg.transforms import glomo_graphs as glomo_module

DIRS = ("forward", "backward")
VOCAB = 20


def make_text(layers=2, heads=2):
    torch.manual_seed(0)
    return PretrainedGraphPredictor(*[
        GraphPredictor(num_tokens=VOCAB, hidden_channels=8, num_layers=layers, heads=heads,
                       cnn_layers=1, direction=d).eval() for d in DIRS]).eval()


def make_pixel(h=4, w=5):
    torch.manual_seed(0)
    return PretrainedGraphPredictor(*[
        PixelGraphPredictor(h, w, hidden_channels=8, num_layers=2, heads=2, cnn_layers=1,
                            direction=d).eval() for d in DIRS]).eval()


def tokens(n, seed=1):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def fixed_graphs():
    return [ChainGraphs(), UniformGraphs(), GridGraphs(3, 4)]


# ------------------------------------------------------------- stale edge-level attributes

def with_old_edges(x):
    """A sample that already has 3 edges and attributes of them, beside node- and
    graph-level ones that must stay."""
    n = x.size(0)
    return Data(x=x, edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]),
                edge_attr=torch.randn(3, 4), edge_label=torch.ones(3), num_edges=3,
                edge_score=torch.ones(3, 2), per_old_edge=torch.arange(3),
                pos=torch.randn(n, 2), y=torch.tensor([1]), words=[f"w{i}" for i in range(n)],
                knowledge=0.5, pos_edge_label_index=torch.tensor([[0, 1], [2, 3]]))


STALE = ("edge_attr", "edge_label", "num_edges", "edge_score", "per_old_edge")
KEPT = ("x", "pos", "y", "words", "knowledge", "pos_edge_label_index")


def check_stale_dropped(out, sample):
    if isinstance(out, HeteroData):
        keys = set(out.keys()) | set(out["unit"].keys())
        for store in out.edge_stores:
            assert set(store.keys()) == {"edge_index", "edge_weight"}
    else:
        keys = set(out.keys())
        assert out.edge_index.size(1) > 3
    assert not keys & set(STALE), keys & set(STALE)
    assert set(KEPT) <= keys
    assert set(STALE) <= set(sample.keys())  # (the input is not modified)


@pytest.mark.parametrize("form", [{}, dict(relation_columns=True), dict(hetero=True)])
@pytest.mark.parametrize("graphs", ["uniform", "grid", "glomo"])
def test_edge_attributes_of_the_old_edges_are_dropped(graphs, form):
    transform = {"uniform": lambda: UniformGraphs(**form),
                 "grid": lambda: GridGraphs(3, 4, **form),
                 "glomo": lambda: GlomoGraphs(make_text(), top_k=2, **form)}[graphs]()
    sample = with_old_edges(tokens(12))
    out = transform(sample)
    check_stale_dropped(out, sample)
    if not form:
        # a Batch: each sample's stale attributes go, the batch is rebuilt without them
        other = with_old_edges(tokens(12, seed=2))
        batch = transform(Batch.from_data_list([sample, other]))
        assert not set(batch.keys()) & set(STALE)
        assert batch.edge_index.size(1) == sum(transform(d).edge_index.size(1)
                                               for d in (sample, other))


def test_an_edge_attribute_beside_no_edge_index_is_dropped_and_labels_stay():
    # no edge_index: the "edge" keys give the old edge count; y of one old edge stays
    out = UniformGraphs()(Data(x=tokens(12), edge_attr=torch.zeros(3, 4), y=torch.tensor([0])))
    assert "edge_attr" not in out and out.edge_index.shape == (2, 132) and "y" in out
    one = ChainGraphs()(Data(x=tokens(5), edge_index=torch.tensor([[0], [1]]),
                             y=torch.tensor([1]), edge_attr=torch.ones(1, 2)))
    assert torch.equal(one.y, torch.tensor([1])) and "edge_attr" not in one


def test_to_hetero_drops_what_was_added_per_edge():
    t = ChainGraphs()
    data = t(Data(x=tokens(6)))
    data.edge_attr = torch.randn(data.edge_index.size(1), 3)
    out = t.to_hetero(data)
    assert "edge_attr" not in out.keys() and all("edge_attr" not in s for s in out.edge_stores)


# -------------------------------------------------------------------------- sample edges

def test_uniform_graphs_on_20000_units_are_refused_before_any_edge_is_made(monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("edges were built")

    monkeypatch.setattr(UniformGraphs, "direction_edges", no_build)
    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        UniformGraphs()(Data(x=torch.zeros(20000, 1)))
    assert time.perf_counter() - start < 1.0
    message = str(info.value)
    assert message.startswith("sample 0: 20,000 units would get up to 399,980,000 edges")
    assert "UniformGraphs" in message and "MAX_SAMPLE_EDGES = 2,097,152" in message
    for n in (12000, 16000):
        with pytest.raises(ValueError, match="MAX_SAMPLE_EDGES"):
            UniformGraphs(directions="forward")(Data(x=torch.zeros(n, 1)))


def test_the_edge_bound_counts_the_options_and_can_be_raised(monkeypatch):
    assert base.MAX_SAMPLE_EDGES == 1 << 21  # (a sample's edges: well under 1 GiB to make)
    UniformGraphs()(Data(x=torch.zeros(40, 1)))
    monkeypatch.setattr(base, "MAX_SAMPLE_EDGES", 12)
    UniformGraphs()(Data(x=torch.zeros(4, 1)))  # 12 edges: accepted
    with pytest.raises(ValueError, match="doubled by symmetric, plus self_loops' loops"):
        UniformGraphs(self_loops=True, symmetric=True)(Data(x=torch.zeros(4, 1)))
    with pytest.raises(ValueError, match=r"5 units would get up to 20 edges"):
        UniformGraphs()(Data(x=torch.zeros(5, 1)))
    monkeypatch.setattr(base, "MAX_SAMPLE_EDGES", 20)  # raised: read at each call
    assert UniformGraphs()(Data(x=torch.zeros(5, 1))).edge_index.size(1) == 20


def counted_edges(t, sample, monkeypatch):
    """The edges ``t`` counts for ``sample`` before making any (from its refusal)."""
    monkeypatch.setattr(base, "MAX_SAMPLE_EDGES", 0)
    with pytest.raises(ValueError) as info:
        t(sample)
    monkeypatch.undo()
    return int(str(info.value).split(" edges ")[0].split()[-1].replace(",", ""))


@pytest.mark.parametrize("options", [{}, dict(self_loops=True), dict(symmetric=True),
                                     dict(self_loops=True, symmetric=True),
                                     dict(symmetric=True, relation_columns=True)])
@pytest.mark.parametrize("make", [ChainGraphs, UniformGraphs, lambda **o: GridGraphs(3, 4, **o),
                                  lambda **o: GridGraphs(3, 4, relations="offset", **o),
                                  lambda **o: UniformGraphs("backward", **o)])
def test_the_fixed_graphs_count_their_edges_exactly(make, options, monkeypatch):
    t, sample = make(**options), Data(x=torch.zeros(12, 1))
    made = t(sample).edge_index.size(1)
    counted = counted_edges(t, sample, monkeypatch)
    # exact: fixed graphs have no self-edges and no edge whose reverse is in its relation;
    # relation columns merge the relations' edges between the same pair
    assert counted == made if "relation_columns" not in options else counted >= made


def test_grid_graphs_larger_than_the_bound_are_refused_at_the_call():
    with pytest.raises(ValueError, match=r"360,000 units would get up to 2,872,804 edges "
                                         r"\(GridGraphs"):
        GridGraphs(600, 600)(Data(x=torch.zeros(600 * 600, 1)))
    assert GridGraphs(512, 512).direction_count(512 * 512) * 2 <= base.MAX_SAMPLE_EDGES


# ------------------------------------------------------------------- cache of built edges

def held_bytes(t):
    return sum(fixed.built_bytes(e) for e in t._built.values())


def test_the_built_edges_cache_is_bounded_and_least_recently_used(monkeypatch):
    t = UniformGraphs()
    for n in range(2, 200):  # 198 lengths, 75 MB of edges in all
        t(Data(x=torch.zeros(n, 1)))
    assert held_bytes(t) <= fixed.BUILT_BYTES and 199 - 2 > len(t._built) > 1
    assert list(t._built)[-1] == 199 and 2 not in t._built
    monkeypatch.setattr(fixed, "BUILT_BYTES", 4 * fixed.built_bytes(t._edges(30)))
    t = ChainGraphs()
    for n in (5, 6, 7, 5, 8):
        t(Data(x=torch.zeros(n, 1)))
    assert list(t._built) == [6, 7, 5, 8]  # 5 used again: 6 is the oldest
    t = UniformGraphs()
    for n in range(40, 70):
        out = t(Data(x=torch.zeros(n, 1)))
        assert held_bytes(t) <= fixed.BUILT_BYTES or len(t._built) == 1
    assert out.edge_index.size(1) == 69 * 68  # (what was built is what is emitted)
    monkeypatch.setattr(fixed, "BUILT_BYTES", 0)  # the latest always stays
    t(Data(x=torch.zeros(9, 1)))
    assert list(t._built) == [9]


# ----------------------------------------------------------------- GlomoGraphs emission

def test_a_pixel_image_too_large_to_emit_is_refused_at_construction(monkeypatch):
    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        GlomoGraphs(make_pixel(), image_size=(4096, 4096), top_k=2)
    assert time.perf_counter() - start < 2.0
    message = str(info.value)
    assert message.startswith("image_size=(4096, 4096) is 16,777,216 pixels")
    assert "MAX_EMISSION_BYTES = 512 MiB" in message and "the largest image" in message
    per_pixel = glomo_module.emission_unit_bytes(make_pixel())
    assert f"{per_pixel:,} bytes per pixel" in message
    # 2 directions x 2 layers x 2 heads x (4 channels + bias) keys and queries, 2 copies,
    # and 16 states of 8 channels per direction, 4 bytes each
    assert per_pixel == 4 * (2 * 2 * 2 * 2 * 2 * 5 + 2 * 16 * 8)
    most = glomo_module.MAX_EMISSION_BYTES // per_pixel
    assert f"{most:,} pixels (e.g. {int(most ** 0.5)}x{int(most ** 0.5)})" in message
    # the size it names is the largest accepted
    monkeypatch.setattr(glomo_module, "MAX_EMISSION_BYTES", 30 * per_pixel)
    with pytest.raises(ValueError, match=r"30 pixels \(e.g. 5x5\)"):
        GlomoGraphs(make_pixel(), image_size=(5, 7))
    t = GlomoGraphs(make_pixel(), image_size=(5, 6), top_k=2)
    out = t(Data(x=torch.randint(0, 256, (30, 3), dtype=torch.uint8)))
    assert out.edge_index.size(1) > 0


def test_a_long_sequence_is_refused_before_the_predictor_runs(monkeypatch):
    t = GlomoGraphs(make_text(), top_k=2)
    per_unit = glomo_module.emission_unit_bytes(t.predictor)
    monkeypatch.setattr(glomo_module, "MAX_EMISSION_BYTES", 50 * per_unit)

    def no_call(*args, **kwargs):
        raise AssertionError("the predictor ran")

    monkeypatch.setattr(t.predictor, "forward", no_call)
    with pytest.raises(ValueError, match=r"sample 1: 51 units: .* the largest sample this "
                                         r"predictor takes is 50 units"):
        t([Data(x=tokens(50)), Data(x=tokens(51))])


def test_glomo_graphs_edges_are_bounded_before_emission():
    t = GlomoGraphs(make_text())  # no top_k: each target keeps every earlier unit
    with pytest.raises(ValueError, match=r"sample 0: 1,200 units would get up to "
                                         r"5,764,800 edges \(GlomoGraphs: 8 relations.*"
                                         r"or pass top_k= or max_distance="):
        t(Data(x=tokens(1200)))
    t(Data(x=tokens(30)))


@pytest.mark.parametrize("options", [{}, dict(top_k=3), dict(max_distance=2), dict(
    top_k=2, merge="mean", self_loops=True, symmetric=True), dict(products=True, max_distance=1),
    dict(top_k=40)])
def test_the_edges_glomo_graphs_count_bound_those_it_keeps(options, monkeypatch):
    t = GlomoGraphs(make_text(), **options)
    for n in (1, 5, 17):
        sample = Data(x=tokens(n))
        assert t(sample).edge_index.size(1) <= counted_edges(t, sample, monkeypatch)
    pixels = GlomoGraphs(make_pixel(), max_distance=1)
    sample = Data(x=torch.randint(0, 256, (20, 3), dtype=torch.uint8))
    assert pixels(sample).edge_index.size(1) <= counted_edges(pixels, sample, monkeypatch)
    dense = GlomoGraphs(make_text())  # no pruning: the bound is reached (all weights > 0?)
    assert dense(Data(x=tokens(9))).edge_index.size(1) <= dense.kept_edges(9)


# ---------------------------------------------------------------- numpy and torch scalars

@pytest.mark.parametrize("name, value, plain", [
    ("top_k", np.int64(4), 4), ("top_k", torch.tensor(4), 4),
    ("min_weight", np.float64(0.25), 0.25), ("min_weight", np.float32(0.25), 0.25),
    ("min_weight", torch.tensor(0.25), 0.25), ("min_weight", np.int64(0), 0),
    ("max_distance", np.int64(4), 4), ("max_distance", torch.tensor(4), 4),
    ("batch_size", np.int32(4), 4), ("batch_size", torch.tensor(4), 4)])
def test_numpy_and_torch_scalars_become_python_numbers(name, value, plain):
    t = GlomoGraphs(make_text(), **{name: value})
    reference = GlomoGraphs(make_text(), **{name: plain})
    assert type(getattr(t, name)) is type(plain) and getattr(t, name) == plain
    assert t.cache_key == reference.cache_key and repr(t) == repr(reference)


@pytest.mark.parametrize("name, value", [("top_k", np.float64(4.0)), ("top_k", torch.tensor([4])),
                                         ("min_weight", np.bool_(True)),
                                         ("batch_size", torch.tensor(2.0))])
def test_scalars_that_are_not_such_numbers_are_refused(name, value):
    with pytest.raises(ValueError, match=name):
        GlomoGraphs(make_text(), **{name: value})


def test_image_and_grid_sizes_of_numpy_or_torch_integers():
    t = GlomoGraphs(make_pixel(), image_size=(np.int64(3), torch.tensor(4)))
    assert t.image_size == (3, 4) and all(type(v) is int for v in t.image_size)
    assert t.cache_key == GlomoGraphs(make_pixel(), image_size=(3, 4)).cache_key
    g = GridGraphs(np.int64(3), torch.tensor(4))
    assert (type(g.height), type(g.width)) == (int, int)
    assert g.cache_key == GridGraphs(3, 4).cache_key and repr(g) == repr(GridGraphs(3, 4))


# ------------------------------------------------------------------------------- devices

@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_a_named_error():
    for device in ("cuda", "cuda:1", torch.device("cuda")):
        with pytest.raises(ValueError, match=r"device=.*cuda.* but CUDA is not available on "
                                             r"this machine"):
            GlomoGraphs(make_text(), device=device)


@pytest.mark.parametrize("device", ["bogus", "gpu", 3.5, "meta"])
def test_invalid_devices_are_named_errors(device):
    with pytest.raises(ValueError, match="device"):
        GlomoGraphs(make_text(), device=device)


def test_valid_devices_still_work():
    assert GlomoGraphs(make_text(), device=torch.device("cpu")).device == torch.device("cpu")
    assert GlomoGraphs(make_text(), device=None).device.type in ("cpu", "cuda")


# --------------------------------------------------------------- inputs that cannot be read

def unreadable_samples():
    return {"sparse": (Data(x=tokens(6).to_sparse()), "data.x is a sparse tensor"),
            "csr": (Data(x=torch.zeros(12, 3).to_sparse_csr()), "data.x is a sparse tensor"),
            "meta": (Data(x=torch.zeros(12, dtype=torch.long, device="meta")),
                     "data.x is on the meta device")}


@pytest.mark.parametrize("kind", ["sparse", "csr", "meta"])
def test_sparse_and_meta_inputs_are_refused_by_name(kind):
    sample, words = unreadable_samples()[kind]
    for t in (GlomoGraphs(make_text()), *fixed_graphs()):
        with pytest.raises(ValueError, match=f"sample 1: {words}"):
            t([Data(x=tokens(12)), sample])
