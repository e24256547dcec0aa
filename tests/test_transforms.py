"""glomo_pyg.transforms: GLoMo's graphs (and fixed baselines) as PyG edges.

Every value is checked against a plain reference written here: the predictor's own dense
graphs (``to_dense()``, ``[l, b, h, i, j] = G_ij``) read entry by entry in Python loops,
pruned / merged / multiplied by loops as the documentation describes."""
import functools
import os

import pytest
import torch
from torch_geometric.data import Batch, Data

from glomo_pyg import GraphPredictor, PretrainedGraphPredictor, graph_conversion
from glomo_pyg.nn.pixel import PixelGraphPredictor
from glomo_pyg.transforms import (
    ChainGraphs,
    GlomoGraphs,
    GraphsDataset,
    GridGraphs,
    UniformGraphs,
    UnitGraphs,
    image_data,
)

DIRS = ("forward", "backward")
VOCAB = 20


# ----------------------------------------------------------------------------- predictors

def make_text(seed=0, layers=3, heads=3, directions=DIRS, num_tokens=VOCAB):
    torch.manual_seed(seed)
    parts = {d: GraphPredictor(num_tokens=num_tokens, hidden_channels=12, num_layers=layers,
                               heads=heads, cnn_layers=1, direction=d).eval()
             for d in directions}
    return PretrainedGraphPredictor(parts.get("forward"), parts.get("backward")).eval()


def make_pixel(seed=0, h=4, w=5, layers=2, heads=2):
    torch.manual_seed(seed)
    return PretrainedGraphPredictor(*[
        PixelGraphPredictor(h, w, hidden_channels=8, num_layers=layers, heads=heads,
                            cnn_layers=1, direction=d).eval() for d in DIRS]).eval()


def make_features(seed=0, channels=4):
    torch.manual_seed(seed)
    return PretrainedGraphPredictor(*[
        GraphPredictor(in_channels=channels, hidden_channels=8, num_layers=2, heads=2,
                       cnn_layers=1, direction=d).eval() for d in DIRS]).eval()


@functools.lru_cache(None)
def text_predictor():
    return make_text(0)


@functools.lru_cache(None)
def pixel_predictor():
    return make_pixel(0)


def token_samples(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [Data(x=torch.randint(0, VOCAB, (n,), generator=g)) for n in lengths]


def image_samples(count, h=4, w=5, c=3, seed=2):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (count, c, h, w), dtype=torch.uint8, generator=g)
    return [image_data(img, y=torch.tensor([i])) for i, img in enumerate(images)]


# ----------------------------------------------------------------------------- reference

def emitted(predictor, samples, max_distance=None):
    """``{direction: [L, B, H, T, T]}``: the predictor's dense graphs of ``samples``
    emitted together in one call (default layout)."""
    xs = [d.x for d in samples]
    if xs[0].dtype == torch.uint8 or xs[0].is_floating_point():
        x = torch.cat(xs)
    else:
        x = torch.cat([v.reshape(-1) for v in xs]).long()
    batch = torch.repeat_interleave(torch.arange(len(xs)), torch.tensor([v.size(0) for v in xs]))
    with torch.no_grad():
        graphs = predictor(x, batch)
    out = {}
    for d in predictor.directions:
        g = getattr(graphs, d)
        if max_distance is not None:
            g = g.within(max_distance)
        out[d] = g.to_dense()
    return out


def relation_mats(dense, b, length, directions, layers, heads):
    """``[T, T]`` (``[i, j] = G_ij``) of sample ``b``, in the documented relation order."""
    return [dense[d][l, b, h, :length, :length] for d in directions for l in layers
            for h in heads]


def reference_edges(mats, min_weight=None, top_k=None):
    """(sources, targets, relations, weights) of ``mats`` by plain loops, sorted by
    (relation, target, source): nonzero entries, weights < min_weight dropped, then per
    target the top_k heaviest (ties: the lower source)."""
    src, tgt, rel, w = [], [], [], []
    for r, m in enumerate(mats):
        rows = m.tolist()
        n = len(rows)
        for j in range(n):
            kept = [(i, rows[i][j]) for i in range(n) if rows[i][j] != 0]
            if min_weight is not None:
                kept = [(i, v) for i, v in kept if v >= min_weight]
            if top_k is not None:
                kept = sorted(sorted(kept, key=lambda e: (-e[1], e[0]))[:top_k])
            for i, v in kept:
                src.append(i), tgt.append(j), rel.append(r), w.append(v)
    return src, tgt, rel, torch.tensor(w, dtype=torch.float32)


def assert_edges(out, mats, exact=True, min_weight=None, top_k=None, atol=1e-6):
    src, tgt, rel, w = reference_edges(mats, min_weight, top_k)
    assert out.edge_index.dtype == torch.long and out.edge_type.dtype == torch.long
    assert out.edge_weight.dtype == torch.float32
    assert out.edge_index.shape == (2, len(src))
    assert out.edge_weight.shape == out.edge_type.shape == (len(src),)
    assert out.edge_index[0].tolist() == src
    assert out.edge_index[1].tolist() == tgt
    assert out.edge_type.tolist() == rel
    if exact:
        assert torch.equal(out.edge_weight, w)
    else:
        torch.testing.assert_close(out.edge_weight, w, atol=atol, rtol=0)


def all_relations(predictor):
    return (predictor.directions, range(predictor.num_layers), range(predictor.heads))


def same_edges(a, b, exact=False):
    """Equal edges; weights equal, or (samples emitted in different batches: padding
    changes the predictor's float rounding, up to a few 1e-6 here) close."""
    assert torch.equal(a.edge_index, b.edge_index)
    assert torch.equal(a.edge_type, b.edge_type)
    if exact:
        assert torch.equal(a.edge_weight, b.edge_weight)
    else:
        torch.testing.assert_close(a.edge_weight, b.edge_weight, atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------- 1. exactness

def test_text_edges_are_exactly_the_emitted_graphs_one_sample_at_a_time():
    p = text_predictor()
    t = GlomoGraphs(p, batch_size=1)
    assert t.relations == [f"{d}/layer{l}/head{h}" for d in DIRS for l in range(3)
                           for h in range(3)]
    assert t.num_relations == 18
    samples = token_samples([5, 1, 9, 2, 7])
    outs = t(samples)
    assert len(outs) == 5
    for data, out in zip(samples, outs):
        n = data.x.size(0)
        dense = emitted(p, [data])
        assert_edges(out, relation_mats(dense, 0, n, *all_relations(p)), exact=True)
        assert torch.equal(out.x, data.x)
    assert outs[1].edge_index.shape == (2, 0)  # one token: no allowed source
    assert outs[4].edge_index.numel() > 0


def test_text_batched_emission_matches_the_same_call_exactly():
    p = text_predictor()
    samples = token_samples([4, 9, 1, 6])
    outs = GlomoGraphs(p)(samples)  # one call for all four
    dense = emitted(p, samples)
    for b, (data, out) in enumerate(zip(samples, outs)):
        mats = relation_mats(dense, b, data.x.size(0), *all_relations(p))
        assert_edges(out, mats, exact=True)


def test_pixel_edges_are_exactly_the_emitted_graphs():
    p = pixel_predictor()
    t = GlomoGraphs(p, batch_size=1)
    assert t.relations == [f"{d}/layer{l}/head{h}" for d in DIRS for l in range(2)
                           for h in range(2)]
    samples = image_samples(3)
    outs = t(samples)
    for data, out in zip(samples, outs):
        dense = emitted(p, [data])
        assert_edges(out, relation_mats(dense, 0, 20, *all_relations(p)), exact=True)
        assert torch.equal(out.pos, data.pos) and torch.equal(out.y, data.y)
    # batched: same call exactly, single calls up to rounding (indices equal)
    together = GlomoGraphs(p)(samples)
    dense = emitted(p, samples)
    for b, out in enumerate(together):
        assert_edges(out, relation_mats(dense, b, 20, *all_relations(p)), exact=True)
        same_edges(out, outs[b])


def test_pixel_image_size_other_than_the_predictors():
    p = pixel_predictor()
    t = GlomoGraphs(p, image_size=(3, 4))
    assert t.image_size == (3, 4)
    samples = image_samples(2, h=3, w=4)
    outs = t(samples)
    dense = emitted(p.resized(3, 4), samples)
    for b, out in enumerate(outs):
        assert_edges(out, relation_mats(dense, b, 12, *all_relations(p)), exact=True)
    with pytest.raises(ValueError, match="4x5|3x4"):
        t(image_samples(1))  # a 4x5 image to a 3x4 transform


def test_image_data_layout():
    image = torch.arange(2 * 3 * 4, dtype=torch.uint8).view(2, 3, 4)
    data = image_data(image, y=torch.tensor([7]))
    assert data.x.shape == (12, 2) and data.x.dtype == torch.uint8
    for r in range(3):
        for c in range(4):
            assert data.x[r * 4 + c].tolist() == [image[0, r, c].item(), image[1, r, c].item()]
            assert data.pos[r * 4 + c].tolist() == [r, c]
    assert data.y.tolist() == [7]
    with pytest.raises(ValueError):
        image_data(torch.zeros(1, 2, 3, 4, dtype=torch.uint8))  # a batch, not one image
    with pytest.raises((TypeError, ValueError)):
        image_data(torch.zeros(3, 4, 5))  # float


def test_feature_predictor_edges():
    p = make_features()
    t = GlomoGraphs(p)
    g = torch.Generator().manual_seed(3)
    samples = [Data(x=torch.randn(n, 4, generator=g)) for n in (3, 6)]
    outs = t(samples)
    dense = emitted(p, samples)
    for b, (data, out) in enumerate(zip(samples, outs)):
        assert_edges(out, relation_mats(dense, b, data.x.size(0), *all_relations(p)))
    with pytest.raises(ValueError, match="features"):
        t(Data(x=torch.randn(3, 5)))
    with pytest.raises(ValueError, match="features"):
        t(Data(x=torch.arange(3)))


def test_token_shapes_and_dtypes_give_the_same_edges():
    p = text_predictor()
    t = GlomoGraphs(p)
    x = token_samples([8])[0].x
    base = t(Data(x=x))
    same_edges(t(Data(x=x.view(-1, 1))), base, exact=True)
    same_edges(t(Data(x=x.int())), base, exact=True)


# ----------------------------------------------------------------------------- 2. batching

def test_list_batch_and_batch_sizes_agree_with_single_samples():
    p = text_predictor()
    samples = token_samples([3, 8, 1, 5, 6, 2, 7])
    singles = [GlomoGraphs(p)(d) for d in samples]
    for bs in (1, 2, 3, 64):
        t = GlomoGraphs(p, batch_size=bs)
        outs = t(samples)
        assert isinstance(outs, list) and len(outs) == len(samples)
        for start in range(0, len(samples), bs):  # exact against each emitted chunk
            chunk = samples[start:start + bs]
            dense = emitted(p, chunk)
            for b, d in enumerate(chunk):
                mats = relation_mats(dense, b, d.x.size(0), *all_relations(p))
                assert_edges(outs[start + b], mats, exact=True)
        for out, single in zip(outs, singles):
            same_edges(out, single)
    # a tuple works as a list
    assert len(GlomoGraphs(p)(tuple(samples[:2]))) == 2


def test_batch_input_gives_a_batch_of_the_per_sample_outputs():
    p = text_predictor()
    samples = token_samples([3, 8, 1, 5])
    t = GlomoGraphs(p)
    batch = Batch.from_data_list(samples)
    out = t(batch)
    assert isinstance(out, Batch) and out.num_graphs == 4
    listed = t(samples)
    for got, want, single in zip(out.to_data_list(), listed, samples):
        same_edges(got, want, exact=True)
        same_edges(got, t(single))
        assert torch.equal(got.x, single.x)
    # global ids inside the batch: both ends of every edge in the same graph
    src, tgt = out.edge_index
    assert torch.equal(out.batch[src], out.batch[tgt])
    assert int(out.edge_index.max()) < out.num_nodes
    # the input batch is untouched
    assert "edge_index" not in batch


def test_empty_list_and_explicit_cpu_device():
    t = GlomoGraphs(text_predictor(), device="cpu")
    assert t.device == torch.device("cpu") and t([]) == []
    data = token_samples([5])[0]
    same_edges(t(data), GlomoGraphs(text_predictor())(data), exact=True)


def test_forward_on_a_batch_keeps_the_graphs_apart():
    t = GlomoGraphs(text_predictor())
    batch = Batch.from_data_list(token_samples([3, 4]))
    out = t.forward(batch)
    src, tgt = out.edge_index
    assert torch.equal(batch.batch[src], batch.batch[tgt])


def test_products_sub_chunk_when_the_dense_blocks_would_be_too_large(monkeypatch):
    from glomo_pyg import kernels

    p = text_predictor()
    samples = token_samples([3, 9, 4, 8, 2])
    t = GlomoGraphs(p, products=True)
    whole = t(samples)
    # room for two 9-unit samples' 18 relations: the 5 samples go in chunks of 2
    monkeypatch.setattr(kernels, "MAX_GRAPH_PAIRS", 18 * 81 * 2)
    calls = []
    monkeypatch.setattr(t, "_dense_edges", lambda g, f=t._dense_edges: calls.append(
        g.num_sequences) or f(g))
    parts = t(samples)
    assert calls == [2, 2, 2, 2, 1, 1]  # (both directions of each chunk)
    for a, c in zip(parts, whole):
        same_edges(a, c)
    for start in range(0, 5, 2):  # each chunk as if transformed alone
        for a, c in zip(parts[start:start + 2], t(samples[start:start + 2])):
            same_edges(a, c, exact=True)


def test_pruned_edges_need_no_dense_blocks(monkeypatch):
    """Without products every sample of a call is pruned block by block from its keys and
    queries: the dense bound does not split the call, and no dense graph is formed."""
    from glomo_pyg import kernels
    from glomo_pyg.graphs import storage

    p = text_predictor()
    samples = token_samples([3, 9, 4, 8, 2])
    expected = emitted(p, samples)
    monkeypatch.setattr(kernels, "MAX_GRAPH_PAIRS", 18 * 81 * 2)
    monkeypatch.setattr(storage.FusedStorage, "dense", None)  # (a call would fail)
    for kw in (dict(), dict(top_k=2), dict(min_weight=0.2, top_k=3)):
        out = GlomoGraphs(p, **kw)(samples)
        for b, d in enumerate(samples):
            assert_edges(out[b], relation_mats(expected, b, d.x.size(0), *all_relations(p)),
                         exact=False, atol=1e-6, **kw)


# ----------------------------------------------------------------------------- 3. selection

def test_selection_of_directions_layers_heads():
    p = text_predictor()
    t = GlomoGraphs(p, directions=("backward",), layers=[1], heads=[0, 2])
    assert t.relations == ["backward/layer1/head0", "backward/layer1/head2"]
    samples = token_samples([6, 9])
    outs = t(samples)
    dense = emitted(p, samples)
    for b, (data, out) in enumerate(zip(samples, outs)):
        mats = relation_mats(dense, b, data.x.size(0), ["backward"], [1], [0, 2])
        assert_edges(out, mats, exact=True)
        assert out.edge_type.max() == 1
        assert (out.edge_index[0] > out.edge_index[1]).all()  # backward: sources after
    # names map to the right graphs, whatever the selection order given
    t = GlomoGraphs(p, directions=["backward", "forward"], layers=(2, 0), heads=[2, 1])
    assert t.directions == DIRS and t.layers == (0, 2) and t.heads == (1, 2)
    data = samples[1]
    out = t(data)
    dense = emitted(p, [data])
    assert out.edge_type.unique().tolist() == list(range(8))
    for (i, j), r, w in zip(out.edge_index.t().tolist(), out.edge_type.tolist(),
                            out.edge_weight.tolist()):
        d, layer, head = t.relations[r].split("/")
        g = dense[d][int(layer[len("layer"):]), 0, int(head[len("head"):])]
        assert g[i, j].item() == w and w > 0
        assert (i < j) == (d == "forward")
    # a single int selects one
    assert GlomoGraphs(p, layers=2, heads=1, directions="forward").relations == \
        ["forward/layer2/head1"]


def test_one_direction_predictor():
    p = make_text(5, directions=("backward",))
    t = GlomoGraphs(p)
    assert t.relations[0].startswith("backward/") and len(t.relations) == 9
    data = token_samples([7])[0]
    assert_edges(t(data), relation_mats(emitted(p, [data]), 0, 7, *all_relations(p)))
    with pytest.raises(ValueError, match="directions"):
        GlomoGraphs(p, directions="forward")


# ----------------------------------------------------------------------------- 4. products

def matmul_loops(a, b):
    n = len(a)
    return [[sum(a[i][k] * b[k][j] for k in range(n)) for j in range(n)] for i in range(n)]


def test_products_are_the_hierarchical_products():
    p = text_predictor()
    t = GlomoGraphs(p, products=True)
    assert t.relations[:4] == ["forward/layers0-0/head0", "forward/layers0-0/head1",
                               "forward/layers0-0/head2", "forward/layers0-1/head0"]
    data = token_samples([7])[0]
    n = 7
    with torch.no_grad():
        graphs = p(data.x, torch.zeros(n, dtype=torch.long))
    dense = emitted(p, [data])
    mats = []
    for d in DIRS:
        for l in range(3):
            for h in range(3):
                prod = dense[d][0, 0, h].double().tolist()
                for k in range(1, l + 1):
                    prod = matmul_loops(prod, dense[d][k, 0, h].double().tolist())
                prod = torch.tensor(prod, dtype=torch.float32)
                # the library's own sparse product agrees
                hier = graph_conversion.hierarchical(getattr(graphs, d), 0, l, h).to_dense()
                torch.testing.assert_close(hier, prod, atol=1e-6, rtol=0)
                mats.append(prod)
    out = t(data)
    assert_edges(out, mats, exact=False)
    # a product of l + 1 layers (no self edges) spans at least l + 1 units
    src, tgt = out.edge_index
    for r, name in enumerate(t.relations):
        steps = int(name.split("/")[1].split("-")[1]) + 1
        of = out.edge_type == r
        gap = tgt[of] - src[of] if name.startswith("forward") else src[of] - tgt[of]
        assert (gap >= steps).all(), name


def test_products_with_selected_layers_and_merge():
    p = text_predictor()
    data = token_samples([6])[0]
    dense = emitted(p, [data])

    def product(d, l, h):
        m = dense[d][0, 0, h].double()
        for k in range(1, l + 1):
            m = m @ dense[d][k, 0, h].double()
        return m

    t = GlomoGraphs(p, products=True, layers=[2], heads=[1], directions="forward")
    assert t.relations == ["forward/layers0-2/head1"]
    assert_edges(t(data), [product("forward", 2, 1).float()], exact=False)
    t = GlomoGraphs(p, products=True, layers=[0, 2], merge="mean")
    mats = [sum(product(d, l, h) for l in (0, 2) for h in range(3)).div(6).float()
            for d in DIRS]
    assert_edges(t(data), mats, exact=False)


# ----------------------------------------------------------------------------- 5. merge

@pytest.mark.parametrize("merge", ["sum", "mean"])
@pytest.mark.parametrize("layers,heads", [(None, None), ([0, 2], [1])])
def test_merge(merge, layers, heads):
    p = text_predictor()
    t = GlomoGraphs(p, merge=merge, layers=layers, heads=heads)
    assert t.relations == ["forward", "backward"] and t.num_relations == 2
    ls = range(3) if layers is None else layers
    hs = range(3) if heads is None else heads
    samples = token_samples([5, 8])
    for data, out in zip(samples, t(samples)):
        n = data.x.size(0)
        dense = emitted(p, [data])
        mats = []
        for d in DIRS:
            acc = [[0.0] * n for _ in range(n)]
            for l in ls:
                for h in hs:
                    g = dense[d][l, 0, h].tolist()
                    for i in range(n):
                        for j in range(n):
                            acc[i][j] += g[i][j]
            count = len(ls) * len(hs)
            if merge == "mean":
                acc = [[v / count for v in row] for row in acc]
            mats.append(torch.tensor(acc, dtype=torch.float32))
        assert_edges(out, mats, exact=False)
        if merge == "mean":  # a target's weights: the share of merged graphs giving it sources
            sums = torch.zeros(2, n).index_put_((out.edge_type, out.edge_index[1]),
                                                out.edge_weight, accumulate=True)
            for r, d in enumerate(DIRS):
                for j in range(n):
                    share = sum(bool(dense[d][l, 0, h, :, j].any()) for l in ls for h in hs)
                    assert sums[r, j].item() == pytest.approx(share / count, abs=1e-5)


# ----------------------------------------------------------------------------- 6. pruning

def weights_of(out):
    return sorted(set(out.edge_weight.tolist()))


def test_min_weight_drops_exactly_the_lighter_edges():
    p = text_predictor()
    samples = token_samples([6, 9])
    full = GlomoGraphs(p)(samples)[1]  # (emitted with sample 0, as below)
    values = weights_of(full)
    threshold = values[len(values) // 2]  # an emitted weight: kept (not < threshold)
    t = GlomoGraphs(p, min_weight=threshold)
    outs = t(samples)
    dense = emitted(p, samples)
    for b, (data, out) in enumerate(zip(samples, outs)):
        mats = relation_mats(dense, b, data.x.size(0), *all_relations(p))
        assert_edges(out, mats, exact=True, min_weight=threshold)
        assert (out.edge_weight >= threshold).all()
    assert (outs[1].edge_weight == threshold).any()
    kept = (full.edge_weight >= threshold).sum()
    assert 0 < kept == outs[1].edge_index.size(1) < full.edge_index.size(1)
    # min_weight=0 keeps everything
    same_edges(GlomoGraphs(p, min_weight=0)(samples)[1], full, exact=True)
    same_edges(GlomoGraphs(p, min_weight=0.0)(samples)[1], full, exact=True)


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_top_k_keeps_the_heaviest_sources_per_relation_and_target(top_k):
    p = text_predictor()
    samples = token_samples([4, 9])
    outs = GlomoGraphs(p, top_k=top_k)(samples)
    dense = emitted(p, samples)
    for b, (data, out) in enumerate(zip(samples, outs)):
        mats = relation_mats(dense, b, data.x.size(0), *all_relations(p))
        assert_edges(out, mats, exact=True, top_k=top_k)
        per_target = torch.bincount(out.edge_type * 100 + out.edge_index[1])
        assert per_target.max() <= top_k


def test_top_k_larger_than_the_sequence_keeps_everything():
    p = text_predictor()
    data = token_samples([7])[0]
    full = GlomoGraphs(p)(data)
    for k in (7, 8, 100):
        same_edges(GlomoGraphs(p, top_k=k)(data), full, exact=True)


def test_top_k_and_min_weight_together():
    p = text_predictor()
    data = token_samples([9])[0]
    values = weights_of(GlomoGraphs(p)(data))
    threshold = values[len(values) // 3]
    out = GlomoGraphs(p, top_k=2, min_weight=threshold)(data)
    mats = relation_mats(emitted(p, [data]), 0, 9, *all_relations(p))
    assert_edges(out, mats, exact=True, min_weight=threshold, top_k=2)


@pytest.mark.parametrize("merge", ["sum", "mean"])
def test_pruning_comes_after_merging(merge):
    p = text_predictor()
    data = token_samples([9])[0]
    dense = emitted(p, [data])
    mats = []
    for d in DIRS:
        m = sum(dense[d][l, 0, h].double() for l in range(3) for h in range(3))
        mats.append((m / 9 if merge == "mean" else m).float())
    merged = GlomoGraphs(p, merge=merge)(data)
    assert_edges(merged, mats, exact=False)
    # a threshold half-way between two merged weights (no rounding at the boundary)
    values = sorted(set(torch.cat([m.flatten() for m in mats]).tolist()) - {0.0})
    k = len(values) // 2
    threshold = (values[k] + values[k + 1]) / 2
    out = GlomoGraphs(p, merge=merge, top_k=2, min_weight=threshold)(data)
    assert_edges(out, mats, exact=False, min_weight=threshold, top_k=2)
    # pruning the merged relation, not each (layer, head) before merging
    assert torch.bincount(out.edge_type * 100 + out.edge_index[1]).max() == 2
    assert out.edge_index.size(1) < merged.edge_index.size(1)


def uniform_predictor():
    """A predictor whose graphs are uniform over the allowed sources (all ties)."""
    p = make_text(0, layers=1, heads=1)
    with torch.no_grad():
        for param in p.parameters():
            param.zero_()
        for d in DIRS:
            p.predictor(d).scorer.bias.fill_(1.0)
    return p


def test_uniform_predictor_really_is_uniform():
    p = uniform_predictor()
    data = token_samples([9])[0]
    dense = emitted(p, [data])
    for j in range(1, 9):
        col = dense["forward"][0, 0, 0, :, j]
        torch.testing.assert_close(col[:j], torch.full((j,), 1.0 / j))
        assert not col[j:].any()


@pytest.mark.parametrize("length", [9, 40])
def test_top_k_ties_keep_the_lower_source(length):
    # (torch.topk alone returns tied entries in no documented order: at these lengths it
    # does not prefer the lower source)
    p = uniform_predictor()
    data = token_samples([length])[0]
    out = GlomoGraphs(p, top_k=2)(data)
    n = length
    want = [(0, i, j) for j in range(n) for i in range(min(j, 2))] + \
           [(1, i, j) for j in range(n) for i in range(j + 1, min(n, j + 3))]
    got = list(zip(out.edge_type.tolist(), out.edge_index[0].tolist(),
                   out.edge_index[1].tolist()))
    assert got == want
    mats = relation_mats(emitted(p, [data]), 0, n, *all_relations(p))
    for k in (1, 3, 5):
        assert_edges(GlomoGraphs(p, top_k=k)(data), mats, exact=True, top_k=k)
        # with a floor: forward targets j keep 1/j >= 0.2 (j <= 5), backward n-1-j <= 5
        assert_edges(GlomoGraphs(p, top_k=k, min_weight=0.2)(data), mats, exact=True,
                     min_weight=0.2, top_k=k)


# ----------------------------------------------------------------------------- 7. max_distance

@pytest.mark.parametrize("distance", [1, 2, 4])
def test_max_distance_is_the_predictors_window(distance):
    p = text_predictor()
    samples = token_samples([3, 9])
    outs = GlomoGraphs(p, max_distance=distance)(samples)
    dense = emitted(p, samples, max_distance=distance)
    for b, (data, out) in enumerate(zip(samples, outs)):
        mats = relation_mats(dense, b, data.x.size(0), *all_relations(p))
        assert_edges(out, mats, exact=False)
        assert ((out.edge_index[0] - out.edge_index[1]).abs() <= distance).all()
    # with pruning on top
    out = GlomoGraphs(p, max_distance=distance, top_k=1)(samples[1])
    mats = relation_mats(emitted(p, [samples[1]], max_distance=distance), 0, 9,
                         *all_relations(p))
    assert_edges(out, mats, exact=False, top_k=1)


def test_max_distance_on_images_is_the_raster_window():
    p = pixel_predictor()
    samples = image_samples(2)
    outs = GlomoGraphs(p, max_distance=1)(samples)
    dense = emitted(p, samples, max_distance=1)
    for b, out in enumerate(outs):
        assert_edges(out, relation_mats(dense, b, 20, *all_relations(p)), exact=False)
        src, tgt = out.edge_index
        assert ((src // 5 - tgt // 5).abs() <= 1).all() and ((src % 5 - tgt % 5).abs() <= 1).all()
        assert out.edge_index.size(1) > 0


# ----------------------------------------------------------------------------- 8. baselines

def fixed_edges(out):
    return list(zip(out.edge_type.tolist(), out.edge_index[0].tolist(),
                    out.edge_index[1].tolist(), out.edge_weight.tolist()))


def check_sorted_and_normalised(out, n):
    key = [(r, j, i) for r, i, j, _ in fixed_edges(out)]
    assert key == sorted(key) and len(set(key)) == len(key)
    sums = {}
    for r, _i, j, w in fixed_edges(out):
        sums[r, j] = sums.get((r, j), 0.0) + w
    for v in sums.values():
        assert v == pytest.approx(1.0, abs=1e-6)


def test_chain_graphs():
    t = ChainGraphs()
    assert t.relations == ["forward", "backward"] and t.num_relations == 2
    out = t(Data(x=torch.arange(5)))
    want = [(0, t_ - 1, t_, 1.0) for t_ in range(1, 5)] + \
           [(1, t_ + 1, t_, 1.0) for t_ in range(0, 4)]
    assert fixed_edges(out) == want
    assert out.edge_weight.dtype == torch.float32 and out.edge_type.dtype == torch.long
    assert out.edge_index.dtype == torch.long
    check_sorted_and_normalised(out, 5)
    back = ChainGraphs(directions="backward")
    assert back.relations == ["backward"]
    assert fixed_edges(back(Data(x=torch.arange(3)))) == [(0, 1, 0, 1.0), (0, 2, 1, 1.0)]
    assert t(Data(x=torch.arange(1))).edge_index.shape == (2, 0)
    # pixels: across row ends, in raster order
    img = image_samples(1, h=2, w=3)[0]
    assert fixed_edges(ChainGraphs("forward")(img)) == [(0, k - 1, k, 1.0) for k in range(1, 6)]


def test_uniform_graphs():
    n = 6
    out = UniformGraphs()(Data(x=torch.arange(n)))
    want = [(0, i, j, 1.0 / j) for j in range(n) for i in range(j)] + \
           [(1, i, j, 1.0 / (n - 1 - j)) for j in range(n) for i in range(j + 1, n)]
    got = fixed_edges(out)
    assert [g[:3] for g in got] == [w[:3] for w in want]
    assert torch.equal(out.edge_weight, torch.tensor([w[3] for w in want], dtype=torch.float32))
    check_sorted_and_normalised(out, n)
    assert UniformGraphs()(Data(x=torch.arange(1))).edge_index.shape == (2, 0)


def grid_reference(h, w, direction):
    sign = -1 if direction == "forward" else 1
    offsets = [(sign * dr, sign * dc) for dr, dc in ((1, 1), (1, 0), (1, -1), (0, 1))]
    edges = []
    for r in range(h):
        for c in range(w):
            sources = sorted((r + dr) * w + (c + dc) for dr, dc in offsets
                             if 0 <= r + dr < h and 0 <= c + dc < w)
            edges += [(s, r * w + c, 1.0 / len(sources)) for s in sources]
    return edges


def test_grid_graphs_exact_edges_on_3x4():
    t = GridGraphs(3, 4)
    out = t(image_samples(1, h=3, w=4)[0])
    got = fixed_edges(out)
    forward = [e[1:] for e in got if e[0] == 0]
    backward = [e[1:] for e in got if e[0] == 1]
    want_f = [tuple(e) for e in grid_reference(3, 4, "forward")]
    want_b = [tuple(e) for e in grid_reference(3, 4, "backward")]
    assert [e[:2] for e in forward] == [e[:2] for e in want_f]
    assert [e[:2] for e in backward] == [e[:2] for e in want_b]
    assert [e[2] for e in forward] == pytest.approx([e[2] for e in want_f])
    assert [e[2] for e in backward] == pytest.approx([e[2] for e in want_b])
    # spelled out: pixel 5 = (1, 1) reads 0, 1, 2, 4 forward and 6, 8, 9, 10 backward
    assert sorted(s for s, tg, _ in forward if tg == 5) == [0, 1, 2, 4]
    assert sorted(s for s, tg, _ in backward if tg == 5) == [6, 8, 9, 10]
    assert sorted(s for s, tg, _ in forward if tg == 4) == [0, 1]   # left edge
    assert sorted(s for s, tg, _ in forward if tg == 3) == [2]      # top-right corner
    assert sorted(s for s, tg, _ in forward if tg == 11) == [6, 7, 10]  # bottom-right
    assert sorted(s for s, tg, _ in backward if tg == 0) == [1, 4, 5]   # top-left
    assert not [s for s, tg, _ in forward if tg == 0]
    # 3x4: 9 horizontal + 8 vertical + 12 diagonal pairs, each once per direction
    pairs = {(min(s, tg), max(s, tg)) for s, tg, _ in forward}
    assert len(forward) == len(backward) == len(pairs) == 3 * 3 + 2 * 4 + 2 * 2 * 3
    assert pairs == {(min(s, tg), max(s, tg)) for s, tg, _ in backward}
    check_sorted_and_normalised(out, 12)
    # wrong number of units refused
    with pytest.raises(ValueError, match="12 pixels of one 3x4 image, got 11"):
        t(Data(x=torch.zeros(11, 3, dtype=torch.uint8)))
    with pytest.raises(ValueError):
        GridGraphs(0, 4)
    assert GridGraphs(3, 4, directions="backward").relations == ["backward"]


def test_grid_graphs_one_relation_per_offset():
    t = GridGraphs(3, 4, relations="offset")
    assert t.relations == ["forward/up-left", "forward/up", "forward/up-right", "forward/left",
                           "backward/down-right", "backward/down", "backward/down-left",
                           "backward/right"]
    out = t(image_samples(1, h=3, w=4)[0])
    got = fixed_edges(out)
    # every relation: each pixel reads its one neighbour at that (row, column) offset
    steps = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (1, 1), (1, 0), (1, -1), (0, 1)]
    want = [(r, (row + dr) * 4 + col + dc, row * 4 + col, 1.0)
            for r, (dr, dc) in enumerate(steps) for row in range(3) for col in range(4)
            if 0 <= row + dr < 3 and 0 <= col + dc < 4]
    assert got == want
    assert [s for r, s, tg, _ in got if tg == 5] == [0, 1, 2, 4, 10, 9, 8, 6]
    check_sorted_and_normalised(out, 12)
    # the same pairs as the merged grid, direction by direction
    merged = fixed_edges(GridGraphs(3, 4)(image_samples(1, h=3, w=4)[0]))
    for d in (0, 1):
        assert sorted(e[1:3] for e in got if (e[0] >= 4) == d) == \
            sorted(e[1:3] for e in merged if e[0] == d)
    assert GridGraphs(3, 4, "backward", relations="offset").relations[0] == "backward/down-right"
    # the default's key is the one it had before the option (cached runs keep their
    # graphs' keys); the split has its own
    assert GridGraphs(16, 16).cache_key == "cedfc655e4440551053acaef5751f056"
    assert ChainGraphs().cache_key == "42ae2baeaf752ebfd3d0f158bfa498b2"
    assert UniformGraphs().cache_key == "49573c0055062d204bb7288966477e96"
    assert GridGraphs(3, 4).cache_key == GridGraphs(3, 4, relations="direction").cache_key
    assert t.cache_key != GridGraphs(3, 4).cache_key
    for bad in ("offsets", None, 8):
        with pytest.raises(ValueError, match="relations must be one of"):
            GridGraphs(3, 4, relations=bad)


def test_fixed_graphs_on_lists_and_batches():
    samples = token_samples([3, 1, 5])
    for t in (ChainGraphs(), UniformGraphs()):
        outs = t(samples)
        batched = t(Batch.from_data_list(samples))
        for d, out, got in zip(samples, outs, batched.to_data_list()):
            same_edges(out, t(d), exact=True)
            same_edges(got, out, exact=True)
            assert "edge_index" not in d
    assert ChainGraphs().cache_key != UniformGraphs().cache_key
    assert ChainGraphs().cache_key == ChainGraphs().cache_key
    assert ChainGraphs().cache_key != ChainGraphs("forward").cache_key
    assert GridGraphs(3, 4).cache_key != GridGraphs(4, 3).cache_key


@pytest.mark.parametrize("graphs", [ChainGraphs, UniformGraphs])
def test_fixed_graph_outputs_do_not_share_storage(graphs):
    t = graphs()
    first = t(Data(x=torch.arange(4)))
    want = t(Data(x=torch.arange(4)))
    want = (want.edge_index.clone(), want.edge_weight.clone())
    first.edge_weight.mul_(2)  # e.g. a user's in-place normalisation
    first.edge_index[0, 0] = 3
    later = t(Data(x=torch.arange(4, 8)))
    assert torch.equal(later.edge_index, want[0]) and torch.equal(later.edge_weight, want[1])


# ----------------------------------------------------------------------------- 9. dataset

class Counting:
    """Counts the calls of a predictor (instance-level forward wrapper)."""

    def __init__(self, predictor):
        self.calls = 0
        inner = predictor.forward

        def forward(*args, **kwargs):
            self.calls += 1
            return inner(*args, **kwargs)

        predictor.forward = forward


def dataset_samples():
    g = torch.Generator().manual_seed(4)
    return [Data(x=torch.randint(0, VOCAB, (n,), generator=g), y=torch.tensor([n % 2]))
            for n in (3, 7, 5, 1, 6)]


def assert_dataset_is(ds, outs):
    assert len(ds) == len(outs)
    for i, want in enumerate(outs):
        got = ds[i]
        assert set(got.keys()) == set(want.keys())
        for k in want.keys():
            assert torch.equal(got[k], want[k]), (i, k)


def test_graphs_dataset_is_made_once_and_cached(tmp_path):
    p = make_text(0)
    counter = Counting(p)
    samples = dataset_samples()
    t = GlomoGraphs(p, batch_size=2)
    ds = GraphsDataset(str(tmp_path), samples, t)
    assert counter.calls == 3  # 5 samples, 2 per call
    assert ds.relations == t.relations
    files = os.listdir(tmp_path / "processed")
    assert files == [f"graphs-{ds.key}.safetensors"]
    counter.calls = 0
    outs = t(samples)  # same chunks as the dataset's: equal exactly
    counter.calls = 0
    assert_dataset_is(ds, outs)
    # dataset[i] equals the transform of sample i (alone: up to rounding)
    for i, d in enumerate(samples):
        same_edges(ds[i], GlomoGraphs(make_text(0))(d))
        assert torch.equal(ds[i].y, d.y) and torch.equal(ds[i].x, d.x)
    # the same transform (rebuilt, from an equal predictor) and samples: read, not made
    p2 = make_text(0)
    counter2 = Counting(p2)
    ds2 = GraphsDataset(str(tmp_path), [d.clone() for d in samples], GlomoGraphs(p2, batch_size=2))
    assert counter2.calls == 0 and ds2.key == ds.key
    assert_dataset_is(ds2, outs)
    # force_reload makes them again
    ds3 = GraphsDataset(str(tmp_path), samples, GlomoGraphs(p2, batch_size=2), force_reload=True)
    assert counter2.calls == 3
    assert_dataset_is(ds3, outs)


def test_graphs_dataset_other_predictor_or_samples_never_read_old_graphs(tmp_path):
    samples = dataset_samples()
    old = GraphsDataset(str(tmp_path), samples, GlomoGraphs(make_text(0)))
    p = make_text(0)
    with torch.no_grad():
        p.predictor("forward").scorer.key[0].weight[0, 0] += 0.5  # one weight differs
    counter = Counting(p)
    t = GlomoGraphs(p, batch_size=1)
    new = GraphsDataset(str(tmp_path), samples, t)
    assert counter.calls == len(samples)
    assert new.key != old.key
    assert sorted(os.listdir(tmp_path / "processed")) == sorted(
        [f"graphs-{old.key}.safetensors", f"graphs-{new.key}.safetensors"])
    assert_dataset_is(new, [t(d) for d in samples])
    assert any(not torch.equal(new[i].edge_weight, old[i].edge_weight) or
               not torch.equal(new[i].edge_index, old[i].edge_index) for i in range(5))
    # other samples: another file too
    other = GraphsDataset(str(tmp_path), samples[:3], GlomoGraphs(make_text(0)))
    assert other.key not in (old.key, new.key) and len(other) == 3
    # another option: another file
    pruned = GraphsDataset(str(tmp_path), samples, GlomoGraphs(make_text(0), top_k=1))
    assert pruned.key not in (old.key, new.key, other.key)
    assert len(os.listdir(tmp_path / "processed")) == 4


def test_graphs_dataset_with_fixed_graphs(tmp_path):
    samples = dataset_samples()
    ds = GraphsDataset(str(tmp_path), samples, ChainGraphs())
    assert_dataset_is(ds, ChainGraphs()(samples))
    assert ds.relations == ["forward", "backward"]


@pytest.mark.parametrize("damage", ["truncate", "empty", "garbage", "other_key", "cut_tail"])
def test_graphs_dataset_rebuilds_a_damaged_cache(tmp_path, damage):
    from safetensors.torch import save

    samples = dataset_samples()
    p = make_text(0)
    counter = Counting(p)
    t = GlomoGraphs(p, batch_size=1)
    ds = GraphsDataset(str(tmp_path), samples, t)
    outs = [t(d) for d in samples]
    assert_dataset_is(ds, outs)
    path = ds.processed_paths[0]
    size = os.path.getsize(path)
    if damage == "truncate":
        with open(path, "r+b") as fh:
            fh.truncate(size // 2)
    elif damage == "empty":
        open(path, "wb").close()
    elif damage == "garbage":
        with open(path, "wb") as fh:
            fh.write(bytes((i * 37 + 11) % 256 for i in range(size)))
    elif damage == "cut_tail":
        with open(path, "r+b") as fh:
            fh.truncate(size - 4)
    else:  # a valid file of another key (e.g. the old graphs of another predictor)
        with open(path, "wb") as fh:
            fh.write(save({"data.x": torch.zeros(3), "slices.x": torch.tensor([0, 3])},
                          metadata={"key": "0" * 32}))
    counter.calls = 0
    again = GraphsDataset(str(tmp_path), samples, t)
    assert counter.calls == len(samples)  # made again
    assert_dataset_is(again, outs)
    counter.calls = 0
    assert_dataset_is(GraphsDataset(str(tmp_path), samples, t), outs)  # and cached again
    assert counter.calls == 0


def test_graphs_dataset_refusals(tmp_path):
    t = GlomoGraphs(text_predictor())
    with pytest.raises(TypeError, match="'name' is a object.*never pickled"):
        GraphsDataset(str(tmp_path), [Data(x=torch.arange(3), name=object())], t)
    with pytest.raises(TypeError, match="sample 1"):
        GraphsDataset(str(tmp_path), [Data(x=torch.arange(3)), torch.arange(3)], t)
    with pytest.raises(TypeError, match="graph transform"):
        GraphsDataset(str(tmp_path), [Data(x=torch.arange(3))], lambda d: d)
    with pytest.raises(ValueError, match="at least one sample"):
        GraphsDataset(str(tmp_path), [], t)
    assert not (tmp_path / "processed").exists() or not os.listdir(tmp_path / "processed")


# ----------------------------------------------------------------------------- 10. PyG layers

def test_stock_pyg_layers_on_transformed_batches():
    from torch_geometric.nn import GATConv, GraphConv, RGCNConv

    p = text_predictor()
    t = GlomoGraphs(p, top_k=4)
    batch = t(Batch.from_data_list(token_samples([5, 8, 3])))
    torch.manual_seed(0)
    embed = torch.nn.Embedding(VOCAB, 8)
    rgcn = RGCNConv(8, 8, num_relations=t.num_relations)
    gcn = GraphConv(8, 8)
    gat = GATConv(8, 8, heads=2, edge_dim=1)
    h = embed(batch.x)
    out = rgcn(h, batch.edge_index, batch.edge_type)
    out = out + gcn(h, batch.edge_index, batch.edge_weight)
    out = out + gat(h, batch.edge_index, batch.edge_weight.unsqueeze(1)).view(-1, 2, 8).mean(1)
    assert out.shape == (16, 8) and torch.isfinite(out).all()
    out.square().sum().backward()
    for module in (embed, rgcn, gcn, gat):
        grads = [q.grad for q in module.parameters() if q.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert any(g.abs().sum() > 0 for g in grads)


def test_csr_adjacency_from_sorted_edges_equals_the_edge_list():
    """docs/any_gnn.md's recipe: one relation's CSR (rows: targets) built without a sort
    gives stock layers the same output as its edge list, for every relation of a batch."""
    from torch_geometric.nn import GCNConv, GraphConv

    from benchmarks.any_gnn import relation_adjacency

    t = GlomoGraphs(text_predictor(), top_k=3)
    batch = t(Batch.from_data_list(token_samples([5, 1, 7])))
    torch.manual_seed(0)
    x = torch.randn(batch.num_nodes, 4)
    n = batch.num_nodes
    for conv in (GraphConv(4, 3), GCNConv(4, 3, normalize=False)):
        for r in range(t.num_relations):
            keep = batch.edge_type == r
            (src, tgt), w = batch.edge_index[:, keep], batch.edge_weight[keep]
            rows = torch.zeros(n + 1, dtype=torch.long)
            rows[1:] = torch.bincount(tgt, minlength=n).cumsum(0)
            adjacency = torch.sparse_csr_tensor(rows, src, w, (n, n))
            dense = adjacency.to_dense()
            got = conv(x, adjacency)
            bench = conv(x, relation_adjacency(batch, r))
            want_dense = torch.zeros(n, n).index_put_((tgt, src), w, accumulate=True)
            assert torch.equal(dense, want_dense)  # (the sorted edges made a valid CSR)
            want = conv(x, batch.edge_index[:, keep], w)
            torch.testing.assert_close(got, want)
            torch.testing.assert_close(bench, want)


# ----------------------------------------------------------------------------- 11. bad input

def test_wrong_modality_is_refused():
    text, pixel = GlomoGraphs(text_predictor()), GlomoGraphs(pixel_predictor())
    img = image_samples(1)[0]
    with pytest.raises(TypeError, match="text predictor.*pixels need a pixel predictor"):
        text(img)
    with pytest.raises(TypeError, match="pixel predictor.*token ids need a text predictor"):
        pixel(Data(x=torch.randint(0, 20, (20, 3))))
    with pytest.raises(TypeError, match="pixel predictor"):
        pixel(Data(x=torch.randint(0, 20, (20,))))
    with pytest.raises(TypeError, match="text predictor"):
        text(Data(x=torch.randint(0, 20, (6, 2))))
    with pytest.raises(TypeError, match="text predictor"):
        text(Data(x=torch.rand(6)))


def test_token_ids_outside_the_vocabulary():
    t = GlomoGraphs(text_predictor())
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 20\).*\[0, 20\]"):
        t(Data(x=torch.tensor([0, 5, 20])))
    with pytest.raises(ValueError, match=r"\[0, 20\).*\[-1, 3\]"):
        t(Data(x=torch.tensor([3, -1, 2])))
    with pytest.raises(ValueError, match="sample 1"):
        t([Data(x=torch.tensor([1, 2])), Data(x=torch.tensor([1, 99]))])
    t(Data(x=torch.tensor([0, 19])))  # the ends are fine


def test_wrong_images_are_refused():
    t = GlomoGraphs(pixel_predictor())
    with pytest.raises(ValueError, match="4x5 image of 3 channels.*image_size"):
        t(image_samples(1, h=4, w=4)[0])
    with pytest.raises(ValueError, match="4x5 image of 3 channels"):
        t(image_samples(1, c=1)[0])
    with pytest.raises(ValueError, match="4x5 image of 3 channels"):
        t(Data(x=torch.zeros(60, dtype=torch.uint8)))
    with pytest.raises(ValueError, match="image_size"):
        GlomoGraphs(pixel_predictor(), image_size=(1, 1))
    with pytest.raises(ValueError, match="image_size"):
        GlomoGraphs(pixel_predictor(), image_size=(0, 4))
    with pytest.raises(ValueError, match="image_size"):
        GlomoGraphs(pixel_predictor(), image_size=16)
    with pytest.raises(ValueError, match="image_size"):
        GlomoGraphs(pixel_predictor(), image_size=(4.0, 5))


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(top_k=0), ValueError, "top_k"),
    (dict(top_k=-1), ValueError, "top_k"),
    (dict(top_k=1.5), ValueError, "top_k"),
    (dict(top_k=True), ValueError, "top_k"),
    (dict(min_weight=-0.1), ValueError, "min_weight"),
    (dict(min_weight=float("nan")), ValueError, "min_weight"),
    (dict(min_weight=float("inf")), ValueError, "min_weight"),
    (dict(min_weight="0.1"), ValueError, "min_weight"),
    (dict(merge="max"), ValueError, "merge"),
    (dict(products="yes"), ValueError, "products"),
    (dict(layers=[3]), ValueError, r"layers must be distinct integers in \[0, 3\)"),
    (dict(layers=[-1]), ValueError, "layers"),
    (dict(layers=[0, 0]), ValueError, "layers"),
    (dict(layers=[]), ValueError, "layers"),
    (dict(layers=[True]), ValueError, "layers"),
    (dict(layers="0"), ValueError, "layers"),
    (dict(heads=[3]), ValueError, r"heads must be distinct integers in \[0, 3\)"),
    (dict(heads=[1, 1]), ValueError, "heads"),
    (dict(directions=["sideways"]), ValueError, "directions"),
    (dict(directions=[]), ValueError, "directions"),
    (dict(directions=["forward", "forward"]), ValueError, "directions"),
    (dict(image_size=(16, 16)), ValueError, "image_size is for pixel predictors"),
    (dict(batch_size=0), ValueError, "batch_size"),
    (dict(max_distance=0), ValueError, "max_distance"),
])
def test_bad_options_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        GlomoGraphs(text_predictor(), **kwargs)


def test_bad_predictor_and_samples():
    with pytest.raises(TypeError, match="PretrainedGraphPredictor"):
        GlomoGraphs(42)
    with pytest.raises(TypeError, match="PretrainedGraphPredictor"):
        GlomoGraphs(text_predictor().predictor("forward"))
    t = GlomoGraphs(text_predictor())
    with pytest.raises(TypeError, match="sample 1: expected a torch_geometric Data, got Tensor"):
        t([Data(x=torch.arange(3)), torch.arange(3)])
    with pytest.raises(TypeError, match="takes a Data, a Batch or a list of Data"):
        t(torch.arange(3))
    with pytest.raises(ValueError, match="at least one"):
        t(Data(x=torch.zeros(0, dtype=torch.long)))
    with pytest.raises(ValueError, match="data.x"):
        t(Data(pos=torch.zeros(3, 2)))
    with pytest.raises(ValueError, match="data.x"):
        t(Data(x=torch.tensor(3)))
    for fixed in (ChainGraphs(), UniformGraphs()):
        with pytest.raises(ValueError, match="at least one"):
            fixed(Data(x=torch.zeros(0, dtype=torch.long)))
        with pytest.raises(TypeError, match="sample 0"):
            fixed(["not data"])
    with pytest.raises(ValueError, match="directions"):
        ChainGraphs(directions="up")


def test_inputs_are_not_modified():
    t = GlomoGraphs(text_predictor(), top_k=2)
    samples = token_samples([4, 6])
    old_edges = torch.tensor([[0, 1], [1, 2]])
    samples[1].edge_index = old_edges
    samples[1].edge_weight = torch.tensor([0.5, 0.5])
    before = [{k: v.clone() for k, v in d.to_dict().items()} for d in samples]
    ids = [id(d.x) for d in samples]
    outs = t(samples)
    for d, b, i in zip(samples, before, ids):
        assert set(d.keys()) == set(b.keys())
        for k, v in b.items():
            assert torch.equal(d[k], v)
        assert id(d.x) == i
    assert "edge_type" not in samples[1] and samples[1].edge_index is old_edges
    assert outs[1] is not samples[1] and outs[1].edge_index.size(1) > 2
    assert "edge_index" not in samples[0]
    # a Batch input too
    batch = Batch.from_data_list(token_samples([3, 5]))
    before = {k: v.clone() for k, v in batch.to_dict().items()}
    t(batch)
    assert set(batch.keys()) == set(before.keys())
    for k, v in before.items():
        assert torch.equal(batch[k], v)


# ----------------------------------------------------------------------------- 12. cache_key

def test_cache_key():
    a, b = GlomoGraphs(make_text(0)), GlomoGraphs(make_text(0))
    assert a.cache_key == b.cache_key and len(a.cache_key) == 32
    assert make_text(0).fingerprint() == make_text(0).fingerprint()
    assert isinstance(a, UnitGraphs)
    with pytest.raises(TypeError, match="abstract"):
        UnitGraphs()  # relations, key_parts and sample_edges are the subclass's
    changed = make_text(0)
    with torch.no_grad():
        changed.predictor("backward").scorer.bias[1] += 1e-3
    assert GlomoGraphs(changed).cache_key != a.cache_key
    assert changed.fingerprint() != make_text(0).fingerprint()
    assert GlomoGraphs(make_text(1)).cache_key != a.cache_key
    keys = {a.cache_key}
    for kwargs in (dict(top_k=3), dict(top_k=4), dict(merge="sum"), dict(merge="mean"),
                   dict(min_weight=0.1), dict(products=True), dict(layers=[0]),
                   dict(heads=[1]), dict(directions="forward"), dict(max_distance=2)):
        key = GlomoGraphs(make_text(0), **kwargs).cache_key
        assert key not in keys, kwargs
        keys.add(key)
    # batch_size does not change the edges' definition
    assert GlomoGraphs(make_text(0), batch_size=3).cache_key == a.cache_key
    # pixel predictors: the image size is part of the key
    assert GlomoGraphs(make_pixel(0)).cache_key != \
        GlomoGraphs(make_pixel(0), image_size=(3, 4)).cache_key
    assert GlomoGraphs(make_pixel(0)).cache_key == \
        GlomoGraphs(make_pixel(0), image_size=(4, 5)).cache_key
    assert repr(a).startswith("GlomoGraphs(") and "relations=18" in repr(a)


def test_cache_key_follows_later_weight_changes():
    p = make_text(0)
    t = GlomoGraphs(p)
    key = t.cache_key
    with torch.no_grad():
        p.predictor("forward").scorer.bias[0] += 0.5
    assert t.cache_key != key


def test_predictor_from_a_saved_folder(tmp_path):
    p = make_text(0)
    p.save_pretrained(str(tmp_path / "pred"))
    t = GlomoGraphs(str(tmp_path / "pred"))
    assert t.cache_key == GlomoGraphs(make_text(0)).cache_key
    data = token_samples([6])[0]
    same_edges(t(data), GlomoGraphs(make_text(0))(data), exact=True)


# ----------------------------------------------------------------------------- released

def test_released_text_predictor_by_name():
    p = PretrainedGraphPredictor.from_pretrained("imdb-text-cpu")
    t = GlomoGraphs("imdb-text-cpu", batch_size=1)
    assert t.cache_key == GlomoGraphs(p).cache_key
    g = torch.Generator().manual_seed(5)
    samples = [Data(x=torch.randint(0, p.num_tokens, (n,), generator=g)) for n in (6, 11)]
    for data, out in zip(samples, t(samples)):
        dense = emitted(p, [data])
        assert_edges(out, relation_mats(dense, 0, data.x.size(0), *all_relations(p)))
    with pytest.raises(ValueError, match=rf"\[0, {p.num_tokens}\)"):
        t(Data(x=torch.tensor([p.num_tokens])))


def test_released_pixel_predictor_at_16x16():
    p = PretrainedGraphPredictor.from_pretrained("imagenet32-pixel-cpu")
    t = GlomoGraphs(p, image_size=(16, 16), layers=[1], heads=[0, 3])
    data = image_samples(1, h=16, w=16)[0]
    out = t(data)
    dense = emitted(p.resized(16, 16), [data])
    mats = relation_mats(dense, 0, 256, DIRS, [1], [0, 3])
    assert_edges(out, mats, exact=True)
    assert t.relations == ["forward/layer1/head0", "forward/layer1/head3",
                           "backward/layer1/head0", "backward/layer1/head3"]


# ----------------------------------------------------------------------------- 13. PyG's own cache

def _user_dataset(root, samples, pre_transform):
    """A user's own InMemoryDataset that runs the transform as its pre_transform on the
    whole list, and names its processed file after the transform's cache_key (docs)."""
    from torch_geometric.data import InMemoryDataset

    class Reviews(InMemoryDataset):
        def __init__(self):
            super().__init__(root, pre_transform=pre_transform)
            self.load(self.processed_paths[0])

        @property
        def processed_file_names(self):
            return [f"reviews-{self.pre_transform.cache_key}.pt"]

        def process(self):
            self.save(self.pre_transform(list(samples)), self.processed_paths[0])

    return Reviews()


def test_a_users_in_memory_dataset_with_the_transform_as_pre_transform(tmp_path):
    samples = token_samples([4, 6, 3])
    calls = []
    first = GlomoGraphs(make_text(0), batch_size=8)
    first.predictor.register_forward_hook(lambda *a: calls.append(1))
    dataset = _user_dataset(str(tmp_path), samples, first)
    assert calls == [1]  # three samples, one predictor call
    for data, expected in zip(dataset, first(samples)):
        assert torch.equal(data.edge_index, expected.edge_index)
        assert torch.equal(data.edge_weight, expected.edge_weight)
    again = _user_dataset(str(tmp_path), samples, first)
    assert calls == [1, 1] and len(again) == 3  # (the check above called it once more)
    other = GlomoGraphs(make_text(1))
    with pytest.warns(UserWarning, match="pre_transform"):  # PyG sees another repr
        rebuilt = _user_dataset(str(tmp_path), samples, other)
    for data, expected in zip(rebuilt, other(samples)):
        assert torch.equal(data.edge_weight, expected.edge_weight)


# ----------------------------------------------------------------------------- 14. PyG's contract,
# repr, the edge options, EdgeIndex and HeteroData forms

def dense_of(out, num_relations, n):
    """``[R, T, T]`` (``[r, i, j]``: the weight of edge ``i -> j`` in relation ``r``)."""
    a = torch.zeros(num_relations, n, n, dtype=torch.float64)
    for (i, j), w, r in zip(out.edge_index.t().tolist(), out.edge_weight.tolist(),
                            out.edge_type.tolist()):
        assert a[r, i, j] == 0, "one edge per pair and relation"
        a[r, i, j] = w
    return a


def assert_sorted_unique(out, n):
    key = (out.edge_type * n + out.edge_index[1]) * n + out.edge_index[0]
    assert bool((key[1:] > key[:-1]).all()), "sorted by (relation, target, source), no repeats"


def reference_options(a, renormalize=False, self_loops=False, symmetric=False):
    """The documented order on dense ``[R, T, T]``: renormalise per target (column),
    ``A + I``, ``(A + A^T) / 2``."""
    if renormalize:
        total = a.sum(1, keepdim=True)
        a = torch.where(total > 0, a / total.clamp_min(1e-300), a)
    if self_loops:
        a = a + torch.eye(a.size(-1), dtype=a.dtype)
    if symmetric:
        a = (a + a.transpose(1, 2)) / 2
    return a


def test_transforms_follow_base_transforms_contract():
    from torch_geometric.transforms import BaseTransform

    for t in (GlomoGraphs(text_predictor()), ChainGraphs(), UniformGraphs(), GridGraphs(2, 3)):
        assert type(t).__call__ is BaseTransform.__call__  # copies, then calls forward
    t = GlomoGraphs(text_predictor(), top_k=2)
    data = token_samples([5])[0]
    same_edges(t.forward(data), t(data), exact=True)
    assert "edge_index" not in data  # forward edits a copy of each sample, not the input
    batch = t(Batch.from_data_list(token_samples([3, 4])))
    assert isinstance(batch, Batch) and batch.num_graphs == 2


def test_repr_shows_every_option():
    import torch_geometric.transforms as T

    t = GlomoGraphs(text_predictor(), layers=[1], heads=[0, 2], merge="mean", top_k=3,
                    min_weight=0.01, max_distance=4, batch_size=7, device="cpu",
                    renormalize=True, self_loops=True, symmetric=True, as_edge_index=True,
                    hetero=True)
    shown = repr(T.Compose([t, T.ToUndirected()]))
    for part in ("predictor='" + text_predictor().fingerprint()[:16] + "'",
                 "directions=('forward', 'backward')", "layers=(1,)", "heads=(0, 2)",
                 "products=False", "merge='mean'", "top_k=3", "min_weight=0.01",
                 "max_distance=4", "batch_size=7", "device='cpu'", "renormalize=True",
                 "self_loops=True", "symmetric=True", "as_edge_index=True", "hetero=True",
                 "num_relations=2"):
        assert part in shown, part
    assert "image_size=(4, 5)" in repr(GlomoGraphs(pixel_predictor()))
    assert repr(GridGraphs(2, 3, relations="offset", symmetric=True)) == (
        "GridGraphs(height=2, width=3, relations='offset', directions=('forward', 'backward'), "
        "self_loops=False, symmetric=True, as_edge_index=False, hetero=False, "
        "relation_columns=False, num_relations=8)")


@pytest.mark.parametrize("options", [dict(renormalize=True), dict(self_loops=True),
                                     dict(symmetric=True),
                                     dict(renormalize=True, self_loops=True, symmetric=True)])
@pytest.mark.parametrize("pruning", [dict(top_k=2), dict(merge="mean", min_weight=0.05)])
def test_edge_options_equal_the_dense_reference(options, pruning):
    samples = token_samples([6, 4])
    plain = GlomoGraphs(text_predictor(), **pruning)
    t = GlomoGraphs(text_predictor(), **pruning, **options)
    for data, base, out in zip(samples, plain(samples), t(samples)):
        n, r = data.x.size(0), t.num_relations
        expected = reference_options(dense_of(base, r, n), **options)
        assert_sorted_unique(out, n)
        assert torch.allclose(dense_of(out, r, n), expected, atol=1e-6)
        assert expected.count_nonzero() == out.edge_index.size(1)
    if options.get("renormalize") and len(options) == 1:  # each target's kept weights sum to 1
        out = t(samples[0])
        sums = torch.zeros(t.num_relations, 6).index_put_(
            (out.edge_type, out.edge_index[1]), out.edge_weight, accumulate=True)
        has = torch.zeros_like(sums, dtype=torch.bool)
        has[out.edge_type, out.edge_index[1]] = True
        assert torch.allclose(sums[has], torch.ones(int(has.sum())), atol=1e-6)
        base = plain(samples[0])
        old = torch.zeros_like(sums).index_put_(
            (base.edge_type, base.edge_index[1]), base.edge_weight, accumulate=True)
        assert bool((old[has] < 1 - 1e-3).any())  # (so the test can fail)


@pytest.mark.parametrize("graphs", [ChainGraphs, UniformGraphs, lambda **o: GridGraphs(2, 3, **o),
                                    lambda **o: GridGraphs(2, 3, relations="offset", **o)])
def test_fixed_graphs_edge_options(graphs):
    data = image_samples(1, h=2, w=3)[0]
    plain, t = graphs(), graphs(self_loops=True, symmetric=True)
    base, out = plain(data), t(data)
    expected = reference_options(dense_of(base, t.num_relations, 6), self_loops=True,
                                 symmetric=True)
    assert_sorted_unique(out, 6)
    assert torch.allclose(dense_of(out, t.num_relations, 6), expected)
    assert t.cache_key != plain.cache_key
    assert "renormalize" not in repr(t)
    with pytest.raises(TypeError, match="renormalize"):
        graphs(renormalize=True)


def test_pyg_compose_after_the_transform_stays_aligned():
    import torch_geometric.transforms as T
    from torch_geometric.utils import add_self_loops, to_undirected

    p = text_predictor()
    data = token_samples([7])[0]
    hetero = T.Compose([GlomoGraphs(p, top_k=3, renormalize=True, hetero=True),
                        T.AddSelfLoops(attr="edge_weight"), T.ToUndirected()])(data)
    flat = GlomoGraphs(p, top_k=3, renormalize=True)(data)
    t = GlomoGraphs(p)
    for r, edge_type in enumerate(t.edge_types):  # PyG's transforms, per relation
        keep = flat.edge_type == r
        edge_index, weight = add_self_loops(flat.edge_index[:, keep], flat.edge_weight[keep],
                                            fill_value=1.0, num_nodes=7)
        edge_index, weight = to_undirected(edge_index, weight)
        store = hetero[edge_type]
        assert store.edge_index.size(1) == store.edge_weight.numel()
        assert torch.equal(store.edge_index, edge_index)
        assert torch.allclose(store.edge_weight, weight)
    homogeneous = hetero.to_homogeneous()
    assert homogeneous.edge_index.size(1) == homogeneous.edge_weight.numel() == \
        homogeneous.edge_type.numel()
    assert torch.equal(homogeneous.x, data.x)
    # the same steps as the transform's own options, on the homogeneous form
    own = GlomoGraphs(p, top_k=3, renormalize=True, self_loops=True, symmetric=True)(data)
    assert own.edge_index.size(1) == own.edge_weight.numel() == own.edge_type.numel()
    for r, edge_type in enumerate(t.edge_types):  # the same edges, relation by relation
        keep = own.edge_type == r
        pairs = set(map(tuple, own.edge_index[:, keep].t().tolist()))
        assert pairs == set(map(tuple, hetero[edge_type].edge_index.t().tolist()))


def columns_of(out, num_relations, n):
    """``[R, T, T]`` of the ``relation_columns`` form (after checking it is that form)."""
    assert "edge_type" not in out and out.edge_weight.shape == (out.edge_index.size(1),
                                                               num_relations)
    a = torch.zeros(num_relations, n, n, dtype=torch.float64)
    for (i, j), row in zip(out.edge_index.t().tolist(), out.edge_weight.tolist()):
        assert not a[:, i, j].any(), "one edge per pair"
        a[:, i, j] = torch.tensor(row, dtype=torch.float64)
    return a


@pytest.mark.parametrize("options", [dict(), dict(renormalize=True, self_loops=True),
                                     dict(symmetric=True, as_edge_index=True)])
def test_relation_columns_hold_every_relation_of_each_pair(options):
    samples = token_samples([6, 4])
    flat = GlomoGraphs(text_predictor(), top_k=2, **options)
    t = GlomoGraphs(text_predictor(), top_k=2, relation_columns=True, **options)
    old = Data(x=samples[0].x, edge_type=torch.zeros(3, dtype=torch.long))
    for data, base, out in zip([old, samples[1]], flat([old, samples[1]]), t([old, samples[1]])):
        n, r = data.x.size(0), t.num_relations
        assert torch.equal(columns_of(out, r, n), dense_of(base, r, n))
        key = out.edge_index[1] * n + out.edge_index[0]
        assert bool((key[1:] > key[:-1]).all()), "sorted by (target, source)"
        assert bool((out.edge_weight != 0).any(1).all()), "every pair has an edge"
        if options.get("as_edge_index"):
            assert out.edge_index.sort_order == "col" and out.edge_index.is_undirected
            out.edge_index.validate()
        same_edges(t.to_hetero(out).to_homogeneous(), flat.to_hetero(base).to_homogeneous(),
                   exact=True)
    assert "edge_type" in old  # (the input is not modified)
    with pytest.raises(ValueError, match="two output forms"):
        GlomoGraphs(text_predictor(), hetero=True, relation_columns=True)
    fixed = ChainGraphs(relation_columns=True)(samples[1])
    assert fixed.edge_weight.shape == (6, 2) and "relation_columns=True" in repr(ChainGraphs(
        relation_columns=True))


def test_pyg_compose_on_relation_columns_stays_aligned():
    """The issue's composition on the homogeneous form: each relation gets its own loops
    and reverse edges, exactly as PyG's transforms give them relation by relation."""
    import torch_geometric.transforms as T
    from torch_geometric.utils import add_self_loops, to_undirected

    p = text_predictor()
    data = token_samples([7])[0]
    t = GlomoGraphs(p, top_k=3, renormalize=True, relation_columns=True)
    composed = T.Compose([t, T.AddSelfLoops(attr="edge_weight"), T.ToUndirected()])
    shown = repr(composed)
    assert "relation_columns=True" in shown and "top_k=3" in shown
    out = composed(data)
    assert out.edge_index.size(1) == out.edge_weight.size(0) and "edge_type" not in out
    flat = GlomoGraphs(p, top_k=3, renormalize=True)(data)
    expected = torch.zeros(t.num_relations, 7, 7, dtype=torch.float64)
    for r in range(t.num_relations):  # PyG's transforms, per relation
        keep = flat.edge_type == r
        edge_index, weight = add_self_loops(flat.edge_index[:, keep], flat.edge_weight[keep],
                                            fill_value=1.0, num_nodes=7)
        edge_index, weight = to_undirected(edge_index, weight)
        expected[r].index_put_(tuple(edge_index), weight.double(), accumulate=True)
    got = torch.zeros_like(expected)
    for (i, j), row in zip(out.edge_index.t().tolist(), out.edge_weight.tolist()):
        got[:, i, j] += torch.tensor(row, dtype=torch.float64)
    assert torch.allclose(got, expected, atol=1e-6)
    hetero = t.to_hetero(out)  # (PyG's transforms sort by source: to_hetero re-sorts)
    for r, edge_type in enumerate(t.edge_types):
        store = hetero[edge_type]
        assert store.edge_index.size(1) == store.edge_weight.numel() == \
            int(expected[r].count_nonzero())


def relation_dicts(hetero, edge_types):
    """Per edge type, ``{(i, j): weight}`` (repeated pairs summed, zeros dropped)."""
    out = {}
    for edge_type in edge_types:
        pairs = {}
        store = hetero[edge_type]
        for (i, j), w in zip(store.edge_index.t().tolist(), store.edge_weight.tolist()):
            pairs[(i, j)] = pairs.get((i, j), 0.0) + w
        out[edge_type] = {k: round(v, 5) for k, v in pairs.items() if v != 0}
    return out


PYG_EDGE_TRANSFORMS = {
    "AddSelfLoops": lambda T: T.AddSelfLoops(attr="edge_weight"),
    "AddRemainingSelfLoops": lambda T: T.AddRemainingSelfLoops(attr="edge_weight"),
    "ToUndirected": lambda T: T.ToUndirected(),
    "RemoveDuplicatedEdges": lambda T: T.RemoveDuplicatedEdges(key=["edge_weight"]),
}


@pytest.mark.parametrize("name", sorted(PYG_EDGE_TRANSFORMS))
def test_which_pyg_transforms_compose_with_which_form(name):
    """docs/any_gnn.md's table: on the relation-columns and HeteroData forms, PyG's edge
    transforms act relation by relation; on the edge_type form they leave edge_type
    misaligned or mixed, and to_hetero (the library's door) refuses the result."""
    import torch_geometric.transforms as T

    make = PYG_EDGE_TRANSFORMS[name]
    p, data = text_predictor(), token_samples([8], seed=4)[0]
    hetero_t = GlomoGraphs(p, top_k=3, hetero=True)
    want = relation_dicts(make(T)(hetero_t(data)), hetero_t.edge_types)
    columns_t = GlomoGraphs(p, top_k=3, relation_columns=True)
    out = make(T)(columns_t(data))
    assert out.edge_weight.shape == (out.edge_index.size(1), columns_t.num_relations)
    assert relation_dicts(columns_t.to_hetero(out), columns_t.edge_types) == want
    flat_t = GlomoGraphs(p, top_k=3)
    flat = make(T)(flat_t(data))
    with pytest.raises(ValueError, match="to_hetero takes a Data emitted by this GlomoGraphs"):
        flat_t.to_hetero(flat)


def test_relation_columns_train_a_gnn_with_edge_features(tmp_path):
    from torch_geometric.nn import GATConv

    from glomo_pyg.transforms import GraphsDataset

    t = GlomoGraphs(text_predictor(), top_k=3, symmetric=True, relation_columns=True)
    samples = token_samples([5, 7, 4])
    dataset = GraphsDataset(str(tmp_path / "columns"), samples, t)
    for data, direct in zip(dataset, t(samples)):
        assert torch.equal(data.edge_index, direct.edge_index)
        assert torch.equal(data.edge_weight, direct.edge_weight)
    batch = Batch.from_data_list(list(dataset))
    torch.manual_seed(0)
    embed = torch.nn.Embedding(VOCAB, 8)
    conv = GATConv(8, 4, heads=2, edge_dim=t.num_relations)
    out = conv(embed(batch.x), batch.edge_index, edge_attr=batch.edge_weight)
    assert out.shape == (16, 8) and bool(torch.isfinite(out).all())
    out.square().mean().backward()
    assert conv.lin_edge.weight.grad is not None and conv.lin_edge.weight.grad.abs().sum() > 0


def test_edge_index_output_validates_and_claims_only_what_holds():
    from torch_geometric import EdgeIndex

    samples = token_samples([5, 8])
    many = GlomoGraphs(text_predictor(), top_k=2, as_edge_index=True)(samples[1])
    assert isinstance(many.edge_index, EdgeIndex) and many.edge_index.sort_order is None
    many.edge_index.validate()
    assert many.edge_index.sparse_size() == (8, 8)
    for options in (dict(), dict(symmetric=True)):
        one = dict(directions="forward", merge="mean", top_k=2, **options)  # one relation
        t = GlomoGraphs(text_predictor(), as_edge_index=True, **one)
        out = t(samples[1])
        ei = out.edge_index
        assert ei.sort_order == "col" and ei.is_undirected == bool(options)
        ei.validate()
        same_edges(out, GlomoGraphs(text_predictor(), **one)(samples[1]), exact=True)
        batch = t(Batch.from_data_list(samples))
        assert isinstance(batch.edge_index, EdgeIndex)
        batch.edge_index.validate()
    hetero = GlomoGraphs(text_predictor(), top_k=2, as_edge_index=True, hetero=True)(samples[0])
    for store in hetero.edge_stores:
        assert store.edge_index.sort_order == "col"
        store.edge_index.validate()


def test_hetero_form_trains_a_to_hetero_model():
    from torch_geometric.nn import GraphConv, to_hetero

    t = GlomoGraphs(text_predictor(), layers=[0], top_k=3, hetero=True)
    samples = token_samples([5, 7])
    flat = GlomoGraphs(text_predictor(), layers=[0], top_k=3)(samples)
    outs = t(samples)
    assert [e[1] for e in t.edge_types] == [r.replace("/", "_") for r in t.relations]
    for out, data, emitted_ in zip(outs, samples, flat):
        assert out.node_types == ["unit"] and torch.equal(out["unit"].x, data.x)
        same_edges(t.to_hetero(emitted_).to_homogeneous(),
                          out.to_homogeneous(), exact=True)
    batch = Batch.from_data_list(outs)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GraphConv(8, 4)

        def forward(self, x, edge_index, edge_weight):
            return self.conv(x, edge_index, edge_weight)

    torch.manual_seed(0)
    embed = torch.nn.Embedding(VOCAB, 8)
    model = to_hetero(Net(), batch.metadata(), aggr="sum")
    x = {"unit": embed(batch["unit"].x)}
    out = model(x, batch.edge_index_dict, batch.edge_weight_dict)["unit"]
    assert out.shape == (12, 4)
    out.square().mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads) and embed.weight.grad is not None


@pytest.mark.parametrize("kwargs,match", [
    (dict(renormalize="yes"), "renormalize must be True or False"),
    (dict(self_loops=1), "self_loops must be True or False"),
    (dict(symmetric=None), "symmetric must be True or False"),
    (dict(as_edge_index=0), "as_edge_index must be True or False"),
    (dict(hetero="hetero"), "hetero must be True or False"),
    (dict(relation_columns=1), "relation_columns must be True or False"),
])
def test_bad_edge_options_are_refused(kwargs, match):
    with pytest.raises(TypeError, match=match):
        GlomoGraphs(text_predictor(), **kwargs)
    if "renormalize" not in kwargs:  # (the fixed graphs have no renormalize)
        with pytest.raises(TypeError, match=match):
            ChainGraphs(**kwargs)


def test_to_hetero_refuses_what_the_transform_did_not_emit():
    t = GlomoGraphs(text_predictor())
    with pytest.raises(ValueError, match="to_hetero takes a Data emitted by this GlomoGraphs"):
        t.to_hetero(token_samples([4])[0])
    wide = GlomoGraphs(text_predictor())(token_samples([4])[0])
    with pytest.raises(ValueError, match=r"edge_type \[E\] in \[0, 2\)"):
        GlomoGraphs(text_predictor(), merge="sum").to_hetero(wide)
    import torch_geometric.transforms as T

    misaligned = T.AddSelfLoops(attr="edge_weight")(wide)  # (edge_type left shorter)
    with pytest.raises(ValueError, match="relation_columns=True"):
        t.to_hetero(misaligned)
    columns = GlomoGraphs(text_predictor(), relation_columns=True)(token_samples([4])[0])
    with pytest.raises(ValueError, match=r"edge_weight \[E, 2\]"):
        GlomoGraphs(text_predictor(), merge="sum").to_hetero(columns)


def test_edge_options_and_forms_are_in_the_cache_key():
    base = GlomoGraphs(make_text(0))
    options = ("renormalize", "self_loops", "symmetric", "as_edge_index", "hetero",
               "relation_columns")
    assert not any(k in base.key_parts() for k in options)
    keys = {base.cache_key}
    for option in options:
        key = GlomoGraphs(make_text(0), **{option: True}).cache_key
        assert key not in keys, option
        keys.add(key)


# ----------------------------------------------------------------------------- 15. extrapolation

def _warnings_of(call):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_glomo_graphs_warns_once_beyond_the_trained_length():
    t = GlomoGraphs("imdb-text-cpu", top_k=2, device="cpu")
    long = Data(x=torch.randint(5, 100, (240,), generator=torch.Generator().manual_seed(0)))
    first = _warnings_of(lambda: t(long))
    assert len(first) == 1 and first[0].startswith("GlomoGraphs: sequences of up to 240 units")
    assert "pretrained on sequences of at most 64" in first[0]
    assert "Pass max_distance=63" in first[0]
    assert _warnings_of(lambda: t(long)) == []  # once
    assert _warnings_of(lambda: GlomoGraphs("imdb-text-cpu", top_k=2, device="cpu")(
        Data(x=long.x[:64]))) == []  # within the trained length
    assert _warnings_of(lambda: GlomoGraphs("imdb-text-cpu", top_k=2, max_distance=63,
                                            device="cpu")(long)) == []


def test_glomo_graphs_warns_on_images_larger_than_the_trained_crops():
    image = image_data(torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8,
                                     generator=torch.Generator().manual_seed(0)))
    t = GlomoGraphs("imagenet32-pixel-cpu", top_k=2, device="cpu")
    first = _warnings_of(lambda: t(image))
    assert len(first) == 1 and first[0].startswith("GlomoGraphs: 32x32 images")
    assert "pretrained on 16x16 images" in first[0] and "Pass max_distance=15" in first[0]
    assert _warnings_of(lambda: t(image)) == []
    assert _warnings_of(lambda: GlomoGraphs("imagenet32-pixel-cpu", top_k=2, max_distance=15,
                                            device="cpu")(image)) == []


def test_one_rule_for_transfer_and_transforms():
    p = PretrainedGraphPredictor.from_pretrained("imdb-text-cpu")
    message = p.extrapolation_warning(240)
    assert message is not None and message.startswith("GlomoTransfer: ")
    assert p.extrapolation_warning(240, owner="GlomoGraphs") == \
        "GlomoGraphs: " + message[len("GlomoTransfer: "):]
    assert p.extrapolation_warning(64) is None and p.extrapolation_warning(240, 63) is None
    assert p.extrapolation_warning(240, 64) is not None  # a window wider than learned
    assert text_predictor().extrapolation_warning(10 ** 6) is None  # no trained_length


def test_to_hetero_refuses_relations_that_pyg_merged_within_range():
    """``T.ToUndirected`` on two merged directions adds the edge types of a pair and its
    reverse (0 + 1 = 1): still in range and aligned, so only the emitted order tells."""
    import torch_geometric.transforms as T

    t = GlomoGraphs(text_predictor(), merge="mean", top_k=3)
    out = T.ToUndirected()(t(token_samples([9], seed=5)[0]))
    assert out.edge_type.numel() == out.edge_index.size(1)
    assert int(out.edge_type.max()) < t.num_relations  # (nothing out of range)
    with pytest.raises(ValueError, match="reordered or merged since"):
        t.to_hetero(out)
