"""LatentGraphs.within and the max_distance option of the transfer modules, against graphs
normalised with the far pairs masked out beforehand (tests/reference.py)."""
import re
import warnings

import pytest
import torch
from reference import allowed_pairs, batch_vector, dense_from_edges, dense_graph

from glomo_pyg import (
    DirectionalGraphs,
    GlomoTextClassifier,
    GlomoTransfer,
    GraphPredictor,
    LatentGraphs,
    PretrainedGraphPredictor,
    flex,
)
from glomo_pyg.ordering import RasterOrder

LENGTHS = [6, 1, 9, 2]
HEADS = 3
EVERY_RULE = pytest.mark.parametrize("direction,include_self", [
    ("forward", False), ("forward", True), ("backward", False), ("backward", True)])


def no_edges_built(graphs) -> bool:
    """Uniform graphs have not built their O(T^2) edges (nothing of the kind cached)."""
    return all(storage.layout == "sparse" and type(storage).__name__ == "UniformStorage"
               for storage in graphs.storages) and \
        not any(key[0] == "uniform-edges" for key in graphs.frame.cache)


def band(max_len, max_distance):
    i = torch.arange(max_len)
    return ((i.view(-1, 1) - i.view(1, -1)).abs() <= max_distance).view(1, 1, max_len, max_len)


def ptr_of(lengths):
    return torch.tensor([0] + lengths).cumsum(0)


@EVERY_RULE
@pytest.mark.parametrize("normalization", ["relu2", "softmax"])
@pytest.mark.parametrize("layout", ["sparse", "dense"])
@pytest.mark.parametrize("max_distance", [1, 2, 4])
def test_within_equals_masking_the_far_pairs_before_normalising(direction, include_self,
                                                                normalization, layout,
                                                                max_distance):
    torch.manual_seed(0)
    t = max(LENGTHS)
    scores = torch.randn(len(LENGTHS), HEADS, t, t, dtype=torch.float64, requires_grad=True)
    allowed = allowed_pairs(LENGTHS, t, direction, include_self)
    want = dense_graph(scores, allowed & band(t, max_distance), normalization)
    full = dense_graph(scores, allowed, normalization)
    graphs = LatentGraphs.from_dense([full], direction=direction, ptr=ptr_of(LENGTHS),
                                     include_self=include_self)
    if layout == "sparse":
        graphs = graphs.to_sparse()
    got = graphs.within(max_distance)
    assert got.layout == layout and got.num_heads == HEADS
    assert (got.direction, got.include_self) == (direction, include_self)
    torch.testing.assert_close(got.to_dense(0), want)
    # a target whose sources were all farther keeps no edge (never NaN); the others sum to 1
    (src, tgt), w, h = got.layer(0)
    assert bool(((tgt - src).abs() <= max_distance).all()) and bool((w > 0).all())
    sums = torch.zeros(HEADS * sum(LENGTHS), dtype=w.dtype).index_add(0, h * sum(LENGTHS) + tgt, w)
    has = torch.zeros(HEADS * sum(LENGTHS), dtype=torch.bool)
    has[h * sum(LENGTHS) + tgt] = True
    torch.testing.assert_close(sums[has], torch.ones_like(sums[has]))
    # gradients reach the scores as through the masked reference
    weights = torch.randn_like(want)
    (g_got,) = torch.autograd.grad((got.to_dense(0) * weights).sum(), scores)
    (g_want,) = torch.autograd.grad((want * weights).sum(), scores)
    torch.testing.assert_close(g_got, g_want)


@EVERY_RULE
def test_uniform_graphs_within_a_window_are_uniform_over_the_window(direction, include_self):
    t = max(LENGTHS)
    allowed = (allowed_pairs(LENGTHS, t, direction, include_self) & band(t, 3)).double()
    count = allowed.sum(2, keepdim=True)
    want = torch.where(count > 0, allowed / count.clamp(min=1), torch.zeros(()))
    g = LatentGraphs.uniform(ptr_of(LENGTHS), num_layers=2, num_heads=HEADS, direction=direction,
                             include_self=include_self).within(3)
    for l in range(2):
        torch.testing.assert_close(dense_from_edges(*g.layer(l), LENGTHS, HEADS).double(),
                                   want.expand(-1, HEADS, -1, -1))
    # a window as long as the longest sequence changes nothing
    full = LatentGraphs.uniform(ptr_of(LENGTHS), num_layers=1, num_heads=HEADS,
                                direction=direction, include_self=include_self)
    x = torch.randn(sum(LENGTHS), 4)
    torch.testing.assert_close(full.within(t).propagate(x, 0), full.propagate(x, 0))


def test_within_keeps_the_edge_order_and_the_validating_constructor_accepts_it():
    torch.manual_seed(1)
    p = GraphPredictor(num_tokens=20, hidden_channels=18, num_layers=2, heads=HEADS, cnn_layers=1,
                       direction="backward", position="relative", position_frequencies=4).eval()
    x, batch = torch.randint(0, 20, (sum(LENGTHS),)), batch_vector(LENGTHS)
    with torch.no_grad():
        g = p(x, batch)
    w = g.within(2)
    n = sum(LENGTHS)
    for l in range(2):
        (src, tgt), head = w.edge_index[l], w.edge_head[l]
        key = (head * n + tgt) * n + src
        assert bool((key[1:] > key[:-1]).all())
    LatentGraphs(w.edge_index, w.edge_weight, w.edge_head, num_heads=HEADS, direction="backward",
                 ptr=ptr_of(LENGTHS))
    # the fused layout gives the same graphs, through its edges
    if flex.available():
        with torch.no_grad():
            fused = p(x, batch, layout="fused")
        assert fused.layout == "fused"
        for l in range(2):
            torch.testing.assert_close(fused.within(2).to_dense(l), w.to_dense(l))


@pytest.mark.parametrize("layout", ["sparse", "dense"])
def test_within_keeps_each_targets_total_weight_in_user_given_graphs(layout):
    # weights that do not sum to 1 (e.g. counts from another tool) keep their scale
    d = torch.zeros(1, 1, 1, 5, 5)
    d[0, 0, 0, 0, 4], d[0, 0, 0, 2, 4], d[0, 0, 0, 3, 4] = 3.0, 1.0, 2.0  # target 4: total 6
    d[0, 0, 0, 0, 3] = 0.5  # target 3: its only source is 3 units away
    g = LatentGraphs.from_dense(d, direction="forward", ptr=torch.tensor([0, 5]))
    g = g if layout == "dense" else g.to_sparse()
    torch.testing.assert_close(g.within(4).to_dense(0), d[0])  # nothing longer: unchanged
    want = torch.zeros(1, 1, 5, 5)
    want[0, 0, 2, 4], want[0, 0, 3, 4] = 2.0, 4.0  # 1 and 2, rescaled to the total 6
    torch.testing.assert_close(g.within(2).to_dense(0), want)


def test_within_refuses_bad_windows():
    g = LatentGraphs.uniform(ptr_of(LENGTHS), num_layers=1, num_heads=1, direction="forward")
    for bad in (0, -1, True, 2.5, "3", None):
        with pytest.raises(ValueError, match=f"max_distance must be an integer >= 1 .units., "
                                             f"got {re.escape(repr(bad))}$"):
            g.within(bad)


def make_predictor(trained_length=None):
    parts = {d: GraphPredictor(num_tokens=30, hidden_channels=18, num_layers=2, heads=HEADS,
                               cnn_layers=1, direction=d, position="relative",
                               position_frequencies=4) for d in ("forward", "backward")}
    with torch.no_grad():  # a distance term that learned something (it starts at zero)
        for part in parts.values():
            part.scorer.position_coef.normal_()
    return PretrainedGraphPredictor(parts["forward"], parts["backward"],
                                    trained_length=trained_length)


def test_transfer_with_max_distance_uses_the_windowed_graphs():
    torch.manual_seed(2)
    predictor = make_predictor()
    x, batch = torch.randint(0, 30, (sum(LENGTHS),)), batch_vector(LENGTHS)
    h = torch.randn(sum(LENGTHS), 6)
    plain = GlomoTransfer(predictor, in_channels=6)
    for graph in ("learned", "uniform", "adjacent"):
        windowed = GlomoTransfer(predictor, in_channels=6, graph=graph, max_distance=2)
        windowed.load_state_dict(plain.state_dict())
        reference = GlomoTransfer(predictor, in_channels=6, graph=graph)
        reference.load_state_dict(plain.state_dict())
        graphs = reference.graphs(x, batch)
        want = DirectionalGraphs(*(g.within(2) for g in graphs))
        torch.testing.assert_close(windowed(h, x, batch), plain(h, graphs=want))
        got = windowed.graphs(x, batch)
        for g in got:
            for (src, tgt), _, _ in g:
                assert bool(((tgt - src).abs() <= 2).all())
    # a window longer than every sequence changes nothing; graphs given are used as given
    long = GlomoTransfer(predictor, in_channels=6, max_distance=max(LENGTHS))
    long.load_state_dict(plain.state_dict())
    torch.testing.assert_close(long(h, x, batch), plain(h, x, batch))
    given = plain.graphs(x, batch)
    torch.testing.assert_close(long(h, graphs=given), plain(h, graphs=given))
    assert "max_distance=9" in repr(long) and "max_distance" not in repr(plain)
    for bad in (0, -3, True, 1.5):
        with pytest.raises(ValueError, match="max_distance must be None or an integer >= 1"):
            GlomoTransfer(predictor, in_channels=6, max_distance=bad)


def test_text_classifier_passes_max_distance_to_every_place():
    torch.manual_seed(3)
    predictor = make_predictor()
    embedding = torch.randn(30, 8)
    model = GlomoTextClassifier(embedding, predictor=predictor, places=("embedding", "rnn"),
                                hidden_channels=4, attention_heads=2, max_distance=3)
    assert model.glomo_embedding.max_distance == 3 == model.glomo_rnn.max_distance
    assert "max_distance=3" in repr(model)
    x, batch = torch.randint(1, 30, (sum(LENGTHS),)), batch_vector(LENGTHS)
    model.eval()
    out = model(x, batch)
    assert out.shape == (len(LENGTHS), 2) and bool(torch.isfinite(out).all())
    # the same weights without a window, or with one no pair exceeds (the longest review
    # has 9 words): the window changes the logits only where it cuts edges
    kwargs = dict(predictor=predictor, places=("embedding", "rnn"), hidden_channels=4,
                  attention_heads=2)
    plain = GlomoTextClassifier(embedding, **kwargs).eval()
    wide = GlomoTextClassifier(embedding, max_distance=8, **kwargs).eval()
    for other in (plain, wide):
        other.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert not torch.allclose(model(x, batch), plain(x, batch))
        torch.testing.assert_close(wide(x, batch), plain(x, batch))
    with pytest.raises(ValueError, match="max_distance must be None or an integer >= 1"):
        GlomoTextClassifier(embedding, predictor=predictor, max_distance=0)


def test_position_extrapolation_benchmark_runs_and_refuses_predictors_without_the_term(
        tmp_path):
    from benchmarks import position_extrapolation

    words = ["<pad>", "<unk>", "<bos>", "<eos>"] + [f"w{k}" for k in range(26)]
    for kind in ("pos", "neg"):
        folder = tmp_path / "aclImdb" / "test" / kind
        folder.mkdir(parents=True)
        for k in range(4):
            (folder / f"{k}_{8 if kind == 'pos' else 2}.txt").write_text(
                " ".join(words[4 + (k * 7 + i) % 26] for i in range(9 + 2 * k)))
    torch.manual_seed(4)
    predictor = make_predictor()
    with torch.no_grad():  # a distance term that is not zero
        for d in predictor.directions:
            predictor.predictor(d).scorer.position_coef.normal_()
    PretrainedGraphPredictor(predictor.predictor("forward"), predictor.predictor("backward"),
                             vocabulary=words, trained_length=6).save_pretrained(tmp_path / "p")
    results = tmp_path / "out.md"
    args = ["--predictor", str(tmp_path / "p"), "--data-dir", str(tmp_path),  # window: 6
            "--length", "12", "--reviews", "8", "--results", str(results)]
    position_extrapolation.main(args)
    text = results.read_text()
    assert "window 6, reviews cut to 12 tokens" in text
    assert text.count("| forward | 1 | 2 |") == 2 and text.count("| backward | 0 | 0 |") == 2
    share = [line for line in text.splitlines() if line.startswith("| forward | 0 | 0 |")][1]
    cells = [float(c.strip("* ")) for c in share.strip("|").split("|")[3:]]
    assert all(0.0 <= c <= 1.0 for c in cells) and cells[1] > 0  # weight beyond the window
    plain = PretrainedGraphPredictor(
        GraphPredictor(num_tokens=30, hidden_channels=18, num_layers=1, heads=HEADS,
                       cnn_layers=1), vocabulary=words)
    plain.save_pretrained(tmp_path / "plain")
    PretrainedGraphPredictor(predictor.predictor("forward"), predictor.predictor("backward"),
                             vocabulary=words).save_pretrained(tmp_path / "old")
    for extra, message in [(["--predictor", str(tmp_path / "plain"), "--window", "6"],
                            "no learned distance term"),
                           (["--window", "12"], "--length > --window"),
                           (["--predictor", str(tmp_path / "old")], "pass --window")]:
        with pytest.raises(SystemExit, match=message):
            position_extrapolation.main(args + extra)


def test_transfer_warns_once_when_a_learned_distance_term_extrapolates():
    from glomo_pyg.analysis import untrained_copy

    torch.manual_seed(5)
    p = make_predictor(trained_length=6)
    x, batch = torch.randint(0, 30, (sum(LENGTHS),)), batch_vector(LENGTHS)  # longest: 9
    h = torch.randn(sum(LENGTHS), 6)
    transfer = GlomoTransfer(p, in_channels=6)
    with pytest.warns(RuntimeWarning, match=r"up to 9 units.*at most 6.*max_distance=5") as seen:
        transfer(h, x, batch)
    assert seen[0].filename == __file__  # it points at the caller
    with pytest.warns(RuntimeWarning, match="extrapolations"):  # a window wider than trained
        GlomoTransfer(p, in_channels=6, max_distance=6)(h, x, batch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        transfer(h, x, batch)  # once per module
        GlomoTransfer(p, in_channels=6, max_distance=5)(h, x, batch)  # cut: nothing to say
        GlomoTransfer(p, in_channels=6, graph="uniform")(h, x, batch)  # no distance term
        short = [3, 6]
        GlomoTransfer(p, in_channels=6)(torch.randn(9, 6), torch.randint(0, 30, (9,)),
                                        batch_vector(short))  # within the trained length
        plain = PretrainedGraphPredictor(
            GraphPredictor(num_tokens=30, hidden_channels=18, num_layers=2, heads=HEADS,
                           cnn_layers=1), trained_length=6)
        assert not plain.learned_distance and p.learned_distance
        GlomoTransfer(plain, in_channels=6)(h, x, batch)  # the paper's scores: no term
        fresh = untrained_copy(p)  # a distance term at its zero initialisation
        assert fresh.trained_length == 6 and not fresh.learned_distance
        GlomoTransfer(fresh, in_channels=6)(h, x, batch)


def test_within_is_finite_when_the_kept_weights_are_tiny():
    # float32: near weights of 1e-44 beside a far weight of 1 (a distance term that
    # favours far units): the kept column is rescaled without overflowing
    d = torch.zeros(1, 1, 1, 5, 5)
    d[0, 0, 0, 0, 4], d[0, 0, 0, 2, 4], d[0, 0, 0, 3, 4] = 1.0, 1e-44, 1e-44
    g = LatentGraphs.from_dense(d, direction="forward", ptr=torch.tensor([0, 5]))
    want = torch.zeros(1, 1, 5, 5)
    want[0, 0, 2, 4] = want[0, 0, 3, 4] = 0.5
    for graphs in (g, g.to_sparse()):
        got = graphs.within(2)
        torch.testing.assert_close(got.to_dense(0), want)
        assert bool(torch.isfinite(got.propagate(torch.randn(5, 3), 0)).all())


@EVERY_RULE
def test_uniform_graphs_stay_lazy_and_propagate_the_window_mean(direction, include_self):
    ptr = ptr_of(LENGTHS)
    g = LatentGraphs.uniform(ptr, num_layers=2, num_heads=HEADS, direction=direction,
                             include_self=include_self).within(3)
    assert g.layout == "sparse" and no_edges_built(g)  # no O(T^2) edges were built
    x = torch.randn(sum(LENGTHS), 4, dtype=torch.float64)
    want = torch.zeros_like(x)  # the mean over the sources within 3 units, by hand
    for start, t in zip(ptr[:-1].tolist(), LENGTHS):
        for p in range(t):
            if direction == "forward":
                sources = range(max(0, p - 3), p + int(include_self))
            else:
                sources = range(p + 1 - int(include_self), min(t, p + 4))
            if len(sources):
                want[start + p] = x[[start + i for i in sources]].mean(0)
    for l in range(2):
        torch.testing.assert_close(g.propagate(x, l), want.expand(HEADS, -1, -1))
    assert g.num_edges == [g.layer(0)[1].numel()] * 2  # counted lazily = built
    assert g.within(5).propagate(x, 0).equal(g.propagate(x, 0))  # the narrower window wins


def test_transfer_takes_numpy_integers_for_max_distance():
    import numpy as np

    assert GlomoTransfer(make_predictor(), in_channels=6,
                         max_distance=np.int64(4)).max_distance == 4
    g = LatentGraphs.uniform(ptr_of(LENGTHS), num_layers=1, num_heads=1, direction="forward")
    assert g.within(np.int32(2)).window == 2


# --- pixel graphs: the window counts the larger of the row and column offsets ------------
IMAGE = (4, 5)  # height, width: T = 20


def chebyshev_band(height, width, max_distance):
    """``[1, 1, T, T]``: both the row and the column offset of (i, j) at most the window,
    written from the grid coordinates (not from the library's orders)."""
    rows = torch.arange(height).repeat_interleave(width)
    cols = torch.arange(width).repeat(height)
    near = ((rows.view(-1, 1) - rows.view(1, -1)).abs() <= max_distance) & \
        ((cols.view(-1, 1) - cols.view(1, -1)).abs() <= max_distance)
    return near.view(1, 1, height * width, height * width)


@EVERY_RULE
@pytest.mark.parametrize("layout", ["sparse", "dense"])
@pytest.mark.parametrize("max_distance", [1, 2, 3])
def test_pixel_graphs_within_equal_masking_the_far_offsets_before_normalising(
        direction, include_self, layout, max_distance):
    torch.manual_seed(2)
    h, w = IMAGE
    t, images = h * w, 3
    scores = torch.randn(images, HEADS, t, t, dtype=torch.float64, requires_grad=True)
    allowed = allowed_pairs([t] * images, t, direction, include_self)  # raster = 1-D order
    want = dense_graph(scores, allowed & chebyshev_band(h, w, max_distance))
    graphs = LatentGraphs.from_dense([dense_graph(scores, allowed)], direction=direction,
                                     ptr=ptr_of([t] * images), include_self=include_self)
    graphs = graphs.with_order(RasterOrder(direction, h, w, include_self))
    if layout == "sparse":
        graphs = graphs.to_sparse()
    got = graphs.within(max_distance)
    assert got.layout == layout and got.order == graphs.order
    torch.testing.assert_close(got.to_dense(0), want)
    x = torch.randn(images * t, 4, dtype=torch.float64)
    torch.testing.assert_close(got.propagate(x, 0),
                               torch.einsum("bhij,bic->hbjc", want, x.view(images, t, 4)
                                            ).reshape(HEADS, images * t, 4))
    weights = torch.randn_like(want)
    (g_got,) = torch.autograd.grad((got.to_dense(0) * weights).sum(), scores)
    (g_want,) = torch.autograd.grad((want * weights).sum(), scores)
    torch.testing.assert_close(g_got, g_want)
    # a window as wide as the image changes nothing (the raster distance would have cut)
    assert graphs.within(max(h, w) - 1) is graphs


@EVERY_RULE
@pytest.mark.parametrize("h,w,d", [(4, 5, 2), (4, 5, 1), (7, 3, 1), (7, 3, 4), (2, 9, 3)])
def test_uniform_pixel_graphs_within_a_window_propagate_the_window_mean(direction,
                                                                        include_self, h, w, d):
    t, images = h * w, 2
    order = RasterOrder(direction, h, w, include_self)
    g = LatentGraphs.uniform(ptr_of([t] * images), num_layers=2, num_heads=HEADS,
                             direction=direction, include_self=include_self, order=order)
    g = g.within(d)
    assert no_edges_built(g)  # box sums: no O(T^2) edges were built
    x = torch.randn(images * t, 3, dtype=torch.float64)
    want = torch.zeros_like(x)  # by hand: the mean over the sources in the square window
    for b in range(images):
        for p in range(t):
            r, c = divmod(p, w)
            sources = [q for q in range(t) if (q < p or (include_self and q == p)
                                               if direction == "forward" else
                                               q > p or (include_self and q == p))
                       and abs(q // w - r) <= d and abs(q % w - c) <= d]
            if sources:
                want[b * t + p] = x[[b * t + q for q in sources]].mean(0)
    for l in range(2):
        torch.testing.assert_close(g.propagate(x, l), want.expand(HEADS, -1, -1))
    counted = g.num_edges  # lazily, in closed form
    assert counted == [g.layer(0)[1].numel()] * 2
    torch.testing.assert_close(g.to_sparse().propagate(x, 0), g.propagate(x, 0))


@pytest.mark.skipif(not flex.available(), reason="needs FlexAttention")
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_fused_graphs_within_a_window_match_the_cut_edges(direction):
    # the window goes into FlexAttention's block mask; 32 x 32 images and 400-token
    # sequences span several 128-unit blocks, so far-apart blocks are skipped
    from glomo_pyg import PixelGraphPredictor
    from glomo_pyg.pixels import image_units

    torch.manual_seed(3)
    pixel = PixelGraphPredictor(in_channels=3, height=32, width=32, hidden_channels=8,
                                num_layers=1, heads=2, cnn_layers=1, direction=direction,
                                position="grid").eval()
    text = GraphPredictor(num_tokens=30, hidden_channels=16, num_layers=1, heads=2,
                          cnn_layers=1, direction=direction, position="relative").eval()
    with torch.no_grad():
        for p in (pixel, text):
            p.scorer.position_coef.normal_()
        x, batch = image_units(torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8))
        lengths = [400, 130, 300]
        tokens = torch.randint(0, 30, (sum(lengths),))
        cases = [(pixel(x, batch, layout="fused"), pixel(x, batch, layout="sparse"), (3, 15)),
                 (text(tokens, batch_vector(lengths), layout="fused"),
                  text(tokens, batch_vector(lengths), layout="sparse"), (10, 150))]
        for fused, sparse, windows in cases:
            assert fused.layout == "fused"
            v = torch.randn(fused.num_nodes, 5)
            for d in windows:
                got = fused.within(d)
                assert got.layout == "fused" and got.order == fused.order
                want = sparse.within(d).propagate(v, 0)
                torch.testing.assert_close(got.propagate(v, 0), want, atol=1e-5, rtol=1e-4)
                assert not torch.allclose(want, sparse.propagate(v, 0), atol=1e-3)
                moved = got.to(torch.device("cpu"))  # moved graphs keep the window
                torch.testing.assert_close(moved.propagate(v, 0), want, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(fused.within(10).to_dense(0), sparse.within(10).to_dense(0),
                                   atol=1e-5, rtol=1e-4)


def pixel_predictor(trained_size=None, learned=True):
    from glomo_pyg import PixelGraphPredictor

    parts = [PixelGraphPredictor(in_channels=3, height=8, width=8, hidden_channels=8,
                                 num_layers=1, heads=2, cnn_layers=1, direction=d,
                                 position="grid") for d in ("forward", "backward")]
    if learned:
        with torch.no_grad():
            for part in parts:
                part.scorer.position_coef.normal_()
    return PretrainedGraphPredictor(*parts, trained_size=trained_size)


def test_transfer_cuts_pixel_graphs_and_warns_once_for_images_larger_than_the_crops():
    from glomo_pyg.pixels import image_units

    torch.manual_seed(4)
    x, batch = image_units(torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8))
    p = pixel_predictor(trained_size=(4, 4))
    cut = GlomoTransfer(p, in_channels=3, max_distance=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # within the window: silent
        graphs = cut.graphs(x, batch)
        uniform = GlomoTransfer(p, in_channels=3, graph="uniform", max_distance=3).graphs(
            num_nodes=x.size(0), batch=batch)
    full = p(x, batch)
    v = torch.randn(x.size(0), 3)
    for got, ref in ((graphs.forward, full.forward), (graphs.backward, full.backward)):
        torch.testing.assert_close(got.propagate(v, 0), ref.within(3).propagate(v, 0))
    assert uniform.forward.order == full.forward.order and uniform.forward.window == 3
    # adjacent pixel graphs: the edge from the end of the row above is 7 columns long
    adjacent = GlomoTransfer(p, in_channels=3, graph="adjacent", max_distance=3).graphs(
        num_nodes=x.size(0), batch=batch)
    (src, tgt), _, _ = adjacent.forward.layer(0)
    assert bool(((tgt - src) == 1).all()) and not bool((tgt % 8 == 0).any())
    loose = GlomoTransfer(p, in_channels=3)
    with pytest.warns(RuntimeWarning, match=r"8x8 images, but .* pretrained on 4x4 images: "
                                            r"its scores for row or column offsets of 4 or "
                                            r"more are extrapolations. Pass max_distance=3"):
        loose.graphs(x, batch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loose.graphs(x, batch)  # once
        for quiet in (pixel_predictor(), pixel_predictor((8, 8)),
                      pixel_predictor((4, 4), learned=False)):  # unknown, same size, untrained
            GlomoTransfer(quiet, in_channels=3).graphs(x, batch)
    with pytest.warns(RuntimeWarning, match="Pass max_distance=3"):  # a window too wide
        GlomoTransfer(p, in_channels=3, max_distance=5).graphs(x, batch)


def test_trained_size_is_checked_and_travels_with_resized_predictors(tmp_path):
    from glomo_pyg import GlomoResNet

    p = pixel_predictor(trained_size=[4, 4])
    assert "max_distance=3" in repr(GlomoResNet(GlomoTransfer(p, 3, max_distance=3), width=4))
    assert p.trained_size == (4, 4) and "trained_size=(4, 4)" in repr(p)
    assert p.resized(16, 16).trained_size == (4, 4)
    p.save_pretrained(tmp_path / "p")
    assert PretrainedGraphPredictor.from_pretrained(tmp_path / "p").trained_size == (4, 4)
    for bad in ((4,), (4, 1), (4.0, 4), (True, 4), "44", 4, (4, 1 << 21)):
        with pytest.raises(ValueError, match="trained_size must be (None or )?.height, width."):
            pixel_predictor(trained_size=bad)


def test_position_extrapolation_benchmark_measures_pixel_predictors(tmp_path):
    import pickle

    import numpy as np

    from benchmarks import position_extrapolation

    rng = np.random.default_rng(0)
    (tmp_path / "cifar-10-batches-py").mkdir()
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as fh:
        pickle.dump({b"data": rng.integers(0, 256, (6, 3072), dtype=np.uint8),
                     b"labels": [0, 1, 2, 3, 4, 5]}, fh)
    torch.manual_seed(6)
    pixel_predictor(trained_size=(8, 8)).save_pretrained(tmp_path / "p")  # 8 x 8 crops
    results = tmp_path / "out.md"
    args = ["--predictor", str(tmp_path / "p"), "--data-dir", str(tmp_path), "--images", "3",
            "--results", str(results)]
    position_extrapolation.main(args)
    text = results.read_text()
    assert "8x8 crops, whole 32x32 CIFAR-10 images" in text
    assert text.count("| forward | 0 | 1 | rows |") == 1
    share = [line for line in text.splitlines() if line.startswith("| backward | 0 | 1 |")
             and "rows" not in line and "columns" not in line][0]
    cells = [float(c.strip("* ")) for c in share.strip("|").split("|")[3:]]
    # crops, whole, whole beyond, uniform, uniform beyond, windowed: shares in [0, 1]
    assert len(cells) == 6 and all(0.0 <= c <= 1.0 for c in cells)
    assert cells[2] > 0 and cells[4] > 0.5  # weight beyond the crops; uniform's is most
    pixel_predictor().save_pretrained(tmp_path / "old")
    from glomo_pyg import PixelGraphPredictor
    PretrainedGraphPredictor(PixelGraphPredictor(height=8, width=8, hidden_channels=8,
                                                 num_layers=1, heads=2, cnn_layers=1),
                             trained_size=(8, 8)).save_pretrained(tmp_path / "plain")
    for extra, message in [(["--predictor", str(tmp_path / "old")], "pass --window .the crop"),
                           (["--predictor", str(tmp_path / "plain")], "no learned offset term"),
                           (["--window", "32"], "need 2 <= --window < 32")]:
        with pytest.raises(SystemExit, match=message):
            position_extrapolation.main(args + extra)


@pytest.mark.parametrize("block", [4, 8])
def test_windowed_block_structure_never_skips_an_allowed_pair(block, monkeypatch):
    # FlexAttention skips key blocks the block structure leaves out and evaluates no
    # element mask in "full" blocks: both must agree with the element rule exactly
    monkeypatch.setattr(flex, "BLOCK", block)
    torch.manual_seed(7)
    cases = [(torch.tensor([13, 5, 16]), None), (torch.tensor([16]), 4), (torch.tensor([24]), 3),
             (torch.tensor([24]), 8)]  # 1-D lengths; images of 4, 3 and 8 columns
    for lengths, grid in cases:
        t = -(-int(lengths.max()) // block) * block
        for direction in ("forward", "backward"):
            for include_self in (False, True):
                for window in (1, 2, 3, 5, 9):
                    order = (RasterOrder(direction, t // grid, grid, include_self) if grid
                             else RasterOrder(direction, 1, t, include_self))
                    pos = torch.arange(t)
                    rule = (order.allowed(pos.view(-1, 1), pos.view(1, -1))
                            & (order.window_distance(pos.view(-1, 1), pos.view(1, -1)) <= window
                               if grid else (pos.view(-1, 1) - pos.view(1, -1)).abs() <= window))
                    num, idx, full_num, full_idx = flex._block_structure(
                        lengths, t, direction, include_self, window, grid)
                    for b, n in enumerate(lengths.tolist()):
                        real = (pos < n).view(-1, 1) & (pos < n).view(1, -1)
                        want = (rule & real).view(t // block, block, t // block, block)
                        some, every = want.any((1, 3)), want.all((1, 3))
                        listed = torch.zeros_like(some)
                        full = torch.zeros_like(some)
                        for q in range(t // block):
                            listed[q, idx[b, 0, q, :num[b, 0, q]].long()] = True
                            full[q, full_idx[b, 0, q, :full_num[b, 0, q]].long()] = True
                        assert not bool((some & ~(listed | full)).any())  # nothing dropped
                        assert bool(every[full].all())  # full blocks hold only allowed pairs
