"""The block-by-block kernels (glomo_pyg.graphs.score_blocks) against the dense reference of paper
Eq. 1 (glomo_pyg.kernels.latent_graph_dense): pruned edges (top-k, thresholds, merges,
windows, ties, padding) and propagation; the memory bound on a large image."""
import json
import os
import subprocess
import sys

import pytest
import torch

from glomo_pyg.graphs.pruning import prune_rows
from glomo_pyg.graphs.score_blocks import propagate_scores, pruned_graph_edges
from glomo_pyg.kernels import bounded_keys_queries, latent_graph_dense
from glomo_pyg.ordering import RasterOrder, SequenceOrder

TINY = 40  # scores per block: many blocks of one target, sources cut to their range


def keys_queries(b=3, h=3, t=11, d=5, seed=0, integer=False):
    g = torch.Generator().manual_seed(seed)
    if integer:  # exact scores: equal scores are exact ties
        k, q = (torch.randint(-2, 3, (b, h, t, d), generator=g).float() for _ in range(2))
    else:
        k, q = (torch.randn(b, h, t, d, generator=g) for _ in range(2))
    return k, q


def dense_rows(layers, lengths, order, normalization, window):
    """``[B, L, H, target, source]`` of the reference graphs; a window cuts each target's
    weights to the near sources and renormalises them (for both normalisations the same as
    masking the far pairs before normalising)."""
    out = []
    for k, q in layers:
        rows = latent_graph_dense(k, q, lengths, direction=order.direction,
                                  include_self=order.include_self,
                                  normalization=normalization).transpose(-1, -2)
        if window is not None:
            pos = torch.arange(k.size(2))
            near = order.window_distance(pos.view(-1, 1), pos.view(1, -1)) <= window
            rows = rows * near
            total = rows.sum(-1, keepdim=True)
            rows = rows / torch.where(total > 0, total, torch.ones(()))
        out.append(rows)
    return torch.stack(out, 1)


def reference(layers, lengths, order, normalization="relu2", heads=None, merge=None,
              top_k=None, min_weight=None, window=None):
    rows = dense_rows(layers, lengths, order, normalization, window)  # [B, L, H, j, i]
    if heads is not None:
        rows = rows[:, :, list(heads)]
    if merge is None:
        return prune_rows(rows.flatten(1, 2).contiguous(), top_k, min_weight)
    total = None  # heads summed per layer, then layers in order (the documented sum)
    for l in range(rows.size(1)):
        part = rows[:, l].sum(1, keepdim=True)
        total = part if total is None else total + part
    if merge == "mean":
        total = total / (rows.size(1) * rows.size(2))
    return prune_rows(total.contiguous(), top_k, min_weight)


def assert_same(got, want, rtol=2e-5):
    for a, b in zip(got[:4], want[:4]):
        assert torch.equal(a, b)
    torch.testing.assert_close(got[4], want[4], rtol=rtol, atol=1e-7)


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("include_self", [False, True])
@pytest.mark.parametrize("config", [
    dict(), dict(top_k=3), dict(top_k=2, min_weight=0.2), dict(min_weight=0.1),
    dict(merge="mean", top_k=4), dict(merge="sum", min_weight=0.05),
    dict(heads=[0, 2], top_k=2), dict(heads=[1], merge="mean"), dict(top_k=50)])
def test_pruned_edges_match_the_dense_reference(direction, include_self, config):
    layers = [keys_queries(seed=s) for s in range(2)]
    lengths = torch.tensor([11, 4, 7])  # padding
    order = SequenceOrder(direction, include_self)
    want = reference(layers, lengths, order, **config)
    for block in (TINY, 1 << 21):
        assert_same(pruned_graph_edges(layers, lengths, order=order, block_scores=block,
                                       **config), want)


@pytest.mark.parametrize("normalization", ["relu2", "softmax"])
def test_windows_over_sequences_and_image_rows(normalization):
    layers = [keys_queries(b=2, h=2, t=20, seed=3)]
    lengths = torch.tensor([20, 13])
    for order, window in ((SequenceOrder("forward"), 3), (SequenceOrder("backward"), 1),
                          (RasterOrder("forward", 4, 5), 1), (RasterOrder("backward", 4, 5), 2)):
        ls = torch.tensor([20, 20]) if isinstance(order, RasterOrder) else lengths
        want = reference(layers, ls, order, normalization, top_k=3, window=window)
        got = pruned_graph_edges(layers, ls, order=order, normalization=normalization,
                                 top_k=3, window=window, block_scores=TINY)
        assert_same(got, want, rtol=1e-5)


def test_ties_go_to_the_lower_source_as_in_dense_pruning():
    # integer keys and queries: many exactly equal weights in each row
    layers = [keys_queries(b=2, h=2, t=16, d=2, seed=5, integer=True)]
    lengths = torch.tensor([16, 9])
    order = SequenceOrder("forward")
    rows = dense_rows(layers, lengths, order, "relu2", None).flatten(1, 2)
    top, _ = rows.topk(3, -1)
    assert bool((top[..., 1] == top[..., 2]).any())  # the case is really there
    for config in (dict(top_k=2), dict(top_k=1), dict(merge="sum", top_k=2)):
        want = reference(layers, lengths, order, **config)
        got = pruned_graph_edges(layers, lengths, order=order, block_scores=TINY, **config)
        assert_same(got, want)  # (indices exactly: ties broken alike)


def test_bit_for_bit_the_dense_pruning_when_a_block_holds_whole_rows():
    layers = [bounded_keys_queries(*keys_queries(t=33, seed=s)) for s in range(3)]
    lengths = torch.tensor([33, 20, 1])
    order = SequenceOrder("backward")
    for config in (dict(top_k=4), dict(merge="mean", top_k=4), dict(min_weight=0.05)):
        got = pruned_graph_edges(layers, lengths, order=order, **config)
        want = reference(layers, lengths, order, **config)
        for a, b in zip(got, want):
            assert torch.equal(a, b)


def test_no_edges_for_one_unit_sequences_and_empty_rows():
    k, q = keys_queries(b=2, h=1, t=3)
    lengths = torch.tensor([1, 1])
    got = pruned_graph_edges([(k, q)], lengths, order=SequenceOrder("forward"), top_k=2)
    assert all(t.numel() == 0 for t in got)
    # zero queries: every score 0, no squared-ReLU edge anywhere
    got = pruned_graph_edges([(k, q * 0)], torch.tensor([3, 3]),
                             order=SequenceOrder("forward"), top_k=2)
    assert all(t.numel() == 0 for t in got)


@pytest.mark.parametrize("normalization", ["relu2", "softmax"])
@pytest.mark.parametrize("shared", [False, True])
def test_propagation_matches_the_dense_graphs(normalization, shared):
    k, q = keys_queries(b=3, h=2, t=21, seed=7)
    lengths = torch.tensor([21, 5, 14])
    v = torch.randn(3, 1 if shared else 2, 21, 6)
    for order, window in ((SequenceOrder("forward"), None), (SequenceOrder("backward", True), None),
                          (SequenceOrder("forward"), 4)):
        rows = dense_rows([(k, q)], lengths, order, normalization, window)[:, 0]  # [B,H,j,i]
        want = rows @ v.expand(3, 2, 21, 6)
        for block in (TINY, 1 << 21):
            got = propagate_scores(k, q, v, lengths, order=order, normalization=normalization,
                                   window=window, block_scores=block)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        real = torch.arange(21).view(1, 1, -1) < lengths.view(-1, 1, 1)
        assert (got.abs().sum(-1)[~real.expand(3, 2, 21)] == 0).all()  # zero at padding


@pytest.mark.parametrize("normalization", ["relu2", "softmax"])
def test_head_mean_propagation_matches_the_averaged_dense_graphs(normalization):
    k, q = keys_queries(b=3, h=3, t=21, seed=8)
    lengths = torch.tensor([21, 5, 14])
    v = torch.randn(3, 1, 21, 6)
    for order, window in ((SequenceOrder("forward"), None), (SequenceOrder("backward"), 4),
                          (RasterOrder("forward", 3, 7), None)):
        rows = dense_rows([(k, q)], lengths if not isinstance(order, RasterOrder) else
                          torch.tensor([21, 21, 21]), order, normalization, window)[:, 0]
        full = lengths if not isinstance(order, RasterOrder) else torch.tensor([21, 21, 21])
        want = rows.mean(1, keepdim=True) @ v
        for block in (TINY, 1 << 21):
            got = propagate_scores(k, q, v, full, order=order, normalization=normalization,
                                   window=window, mean_heads=True, block_scores=block)
            assert got.shape == (3, 1, 21, 6)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="shared values"):
        propagate_scores(k, q, torch.randn(3, 3, 21, 6), lengths, order=SequenceOrder("forward"),
                         mean_heads=True)


MEMORY_SCRIPT = r"""
import json, resource, sys, torch
from glomo_pyg import PixelGraphPredictor, PretrainedGraphPredictor
from glomo_pyg.transforms import GlomoGraphs, image_data
torch.manual_seed(0)
side = int(sys.argv[1])
parts = [PixelGraphPredictor(side, side, hidden_channels=8, num_layers=2, heads=2,
                             cnn_layers=1, direction=d).eval() for d in ("forward", "backward")]
t = GlomoGraphs(PretrainedGraphPredictor(*parts), merge="mean", top_k=8, device="cpu")
image = image_data(torch.randint(0, 256, (3, side, side), dtype=torch.uint8))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = t(image)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps(dict(grew_mib=(peak - before) / 1024, edges=out.edge_index.size(1))))
"""


@pytest.mark.slow
def test_memory_is_the_edges_kept_plus_blocks_on_a_large_image():
    # 96x96 pixels: one dense graph layer of the 2 heads is 2 x 9216^2 x 4 B = 680 MiB
    side = 96
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(side)],
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OMP_NUM_THREADS="2"))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    n = side * side
    assert 0 < result["edges"] <= 2 * n * 8  # (both directions, top 8 of each target)
    # edges (28 B each, several copies while assembling), keys and queries (2 directions x
    # 2 layers x 2 heads x (4 + 1) dims, a few copies), score blocks of 8 MiB (a few live)
    bound = (40 * result["edges"] + 2 * 2 * 2 * 2 * n * 8 * 4 * 4) / 2**20 + 4 * 8 + 64
    assert result["grew_mib"] < bound, (result, bound)
    assert result["grew_mib"] < 680 / 4  # far below one dense layer


@pytest.mark.parametrize("size", [(5, 7), (12, 13)])
@pytest.mark.parametrize("config", [dict(top_k=3), dict(top_k=500),
                                    dict(merge="mean", top_k=4), dict(min_weight=0.05, heads=[1]),
                                    dict(max_distance=2, top_k=2)])
def test_glomo_graphs_on_resized_images_in_many_blocks(monkeypatch, size, config):
    """``GlomoGraphs`` on images of other sizes (``PretrainedGraphPredictor.resized``), cut
    into blocks of a few targets, against the dense graphs of the resized predictor pruned
    row by row; ``top_k=500`` is more than any target's allowed sources."""
    from glomo_pyg import PixelGraphPredictor, PretrainedGraphPredictor
    from glomo_pyg.graphs import score_blocks
    from glomo_pyg.transforms import GlomoGraphs, image_data

    torch.manual_seed(0)
    p = PretrainedGraphPredictor(*[
        PixelGraphPredictor(4, 4, hidden_channels=8, num_layers=2, heads=2, cnn_layers=1,
                            direction=d, position="grid").eval()
        for d in ("forward", "backward")]).eval()
    h, w = size
    g = torch.Generator().manual_seed(1)
    samples = [image_data(i) for i in torch.randint(0, 256, (3, 3, h, w), dtype=torch.uint8,
                                                    generator=g)]
    whole = GlomoGraphs(p, image_size=size, **config)(samples)
    monkeypatch.setattr(score_blocks, "BLOCK_SCORES", 12 * h * w)  # 6 targets (2 heads)
    out = GlomoGraphs(p, image_size=size, **config)(samples)
    resized = p.resized(h, w)
    x = torch.cat([d.x for d in samples])
    batch = torch.arange(3).repeat_interleave(h * w)
    with torch.no_grad():
        graphs = resized(x, batch, layout="dense")
    for i, (a, c) in enumerate(zip(out, whole)):
        assert torch.equal(a.edge_index, c.edge_index) and torch.equal(a.edge_type, c.edge_type)
        torch.testing.assert_close(a.edge_weight, c.edge_weight, rtol=1e-5, atol=1e-7)
        assert_transform_edges(a, graphs, i, config)


def assert_transform_edges(data, graphs, i, config, exact=False):
    """``data``'s edges are sample ``i``'s dense ``graphs`` selected, merged and pruned row
    by row as ``GlomoGraphs(**config)`` documents."""
    parts = []
    for r, d in enumerate(("forward", "backward")):
        gd = getattr(graphs, d)
        if "max_distance" in config:
            gd = gd.within(config["max_distance"])
        rows = gd.to_dense()[:, i:i + 1].transpose(-1, -2).permute(1, 0, 2, 3, 4)  # [1,L,H,j,i]
        if config.get("heads") is not None:
            rows = rows[:, :, config["heads"]]
        if config.get("merge"):
            total = None
            for l in range(rows.size(1)):
                part = rows[:, l].sum(1, keepdim=True)
                total = part if total is None else total + part
            rows = total / (rows.size(1) * rows.size(2)) if config["merge"] == "mean" else total
        else:
            rows = rows.flatten(1, 2)
        _, rel, tgt, src, wt = prune_rows(rows.contiguous(), config.get("top_k"),
                                          config.get("min_weight"))
        parts.append((src, tgt, rel + r * rows.size(1), wt))
    src, tgt, rel, wt = (torch.cat(t) for t in zip(*parts))
    assert torch.equal(data.edge_index, torch.stack([src, tgt]))
    assert torch.equal(data.edge_type, rel)
    if exact:
        assert torch.equal(data.edge_weight, wt.float())
    else:
        torch.testing.assert_close(data.edge_weight, wt.float(), rtol=1e-5, atol=1e-7)


def test_what_the_fused_layout_refuses_takes_the_dense_graphs():
    """float64 predictors, and softmax predictors whose scores could overflow the fused
    layout, are pruned from their dense graphs (as before the block-by-block path)."""
    from torch_geometric.data import Data

    from glomo_pyg import GraphPredictor, PretrainedGraphPredictor
    from glomo_pyg.transforms import GlomoGraphs

    def softmax_predictor(seed):
        torch.manual_seed(seed)
        return PretrainedGraphPredictor(*[
            GraphPredictor(num_tokens=50, hidden_channels=16, num_layers=2, heads=2,
                           sparse=False, direction=d).eval()
            for d in ("forward", "backward")]).eval()

    huge = softmax_predictor(1)
    with torch.no_grad():
        for m in huge.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.mul_(1e20)  # scores far past float32
    g = torch.Generator().manual_seed(0)
    samples = [Data(x=torch.randint(0, 50, (n,), generator=g)) for n in (3, 17, 40)]
    x = torch.cat([d.x for d in samples])
    batch = torch.repeat_interleave(torch.arange(3), torch.tensor([3, 17, 40]))
    for p in (softmax_predictor(0).double(), huge):
        with torch.no_grad():
            graphs = p(x, batch, layout="dense")
        for config in (dict(top_k=3), dict(merge="sum", min_weight=0.1)):
            out = GlomoGraphs(p, **config)(samples)
            for i, data in enumerate(out):
                assert_transform_edges(data, graphs, i, config, exact=True)


@pytest.mark.parametrize("scale", ["huge", "tiny queries", "tiny keys", "mixed rows",
                                   "padding garbage"])
@pytest.mark.parametrize("window", [None, 4])
def test_propagation_of_extreme_scores_matches_the_dense_graphs(scale, window):
    """Propagation squares the scores without dividing by each target's largest: scores
    near float32's range (bounded keys and queries up to 2**50, or 1e-30) are rescaled by
    exact powers of two, never overflowing or vanishing; garbage at padded keys does not
    set the scale."""
    k, q = keys_queries(b=2, h=2, t=17, d=4, seed=11)
    lengths = torch.tensor([17, 9])
    if scale == "huge":
        k, q = k * 2.0 ** 45, q * 2.0 ** 45  # scores ~2**90: squares overflow float32
    elif scale == "tiny queries":
        q = q * 1e-30  # squares underflow float32
    elif scale == "tiny keys":
        k = k * 1e-35
    elif scale == "mixed rows":  # targets of very different scales in one sample
        q = q * torch.logspace(-30, 30, 17).view(1, 1, -1, 1)
    else:
        k = k.clone()
        k[1, :, 9:] = 2.0 ** 49  # padded units of sample 1
    k, q = bounded_keys_queries(k, q)
    v = torch.randn(2, 2, 17, 3, dtype=torch.float64)
    order = SequenceOrder("forward")
    rows = dense_rows([(k.double(), q.double())], lengths, order, "relu2", window)[:, 0]
    want = rows @ v
    got = propagate_scores(k, q, v.float(), lengths, order=order, window=window,
                           block_scores=TINY)
    assert torch.isfinite(got).all()
    real = (torch.arange(17) < lengths.view(-1, 1)).view(2, 1, 17, 1)
    torch.testing.assert_close(got.double() * real, want * real, rtol=1e-4, atol=1e-5)
    assert int((rows.sum(-1) > 0.99).sum()) >= 20  # (the case is there: targets with edges)


def test_propagation_returns_head_major_storage_and_takes_strided_values():
    k, q = keys_queries(b=3, h=2, t=13, seed=12)
    lengths = torch.tensor([13, 13, 13])
    head_major = torch.randn(2, 3, 13, 4)  # [H, B, T, C], as the graph storage holds them
    order = SequenceOrder("backward")
    got = propagate_scores(k, q, head_major.transpose(0, 1), lengths, order=order)
    want = propagate_scores(k, q, head_major.transpose(0, 1).contiguous(), lengths, order=order)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert got.transpose(0, 1).is_contiguous()
