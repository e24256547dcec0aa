"""The linear-probe evaluation (glomo_pyg.evaluation): pooled [H ; M H] features against
GlomoTransfer's propagations and a direct pooling loop, head-averaged graphs against the
dense reference, the probe, the paired bootstrap, and bad input."""
import pytest
import torch

from glomo_pyg import GlomoTransfer, GraphPredictor, PixelGraphPredictor, PretrainedGraphPredictor
from glomo_pyg.evaluation import (
    LinearProbe,
    grid_graphs,
    paired_bootstrap,
    pool_units,
    probe_features,
    unit_features,
)
from glomo_pyg.graphs import DirectionalGraphs
from glomo_pyg.pixels import image_units
from glomo_pyg.transforms import GridGraphs

LENGTHS = [5, 1, 7, 3]


def text_predictor(seed=0):
    torch.manual_seed(seed)
    parts = [GraphPredictor(30, hidden_channels=8, num_layers=2, heads=2, direction=d).eval()
             for d in ("forward", "backward")]
    return PretrainedGraphPredictor(*parts)


def text_batch(seed=0, channels=3):
    g = torch.Generator().manual_seed(seed)
    n = sum(LENGTHS)
    batch = torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS))
    return torch.randint(0, 30, (n,), generator=g), batch, torch.randn(n, channels, generator=g)


def test_pooling_matches_a_direct_loop_over_samples_and_regions():
    x = torch.randn(2 * 12, 3)
    batch = torch.arange(2).repeat_interleave(12)
    got = pool_units(x, batch, poolings=("mean", "max"), regions=(3, 4, 2, 2))  # 3x4 images
    assert got.shape == (2, 2 * 4 * 3)
    for b in range(2):
        image = x[b * 12:(b + 1) * 12].view(3, 4, 3)
        # rows 0-1 | 2 (floor(r * 2 / 3)), columns 0-1 | 2-3
        regions = [image[:2, :2], image[:2, 2:], image[2:, :2], image[2:, 2:]]
        want_mean = torch.cat([r.reshape(-1, 3).mean(0) for r in regions])
        want_max = torch.cat([r.reshape(-1, 3).amax(0) for r in regions])
        torch.testing.assert_close(got[b], torch.cat([want_mean, want_max]))
    x, batch, _ = text_batch()
    got = pool_units(torch.randn(len(batch), 2), batch, poolings="max")
    assert got.shape == (len(LENGTHS), 2)


def test_unit_features_are_glomo_transfers_propagations_and_mix_like_it():
    predictor = text_predictor()
    x, batch, h = text_batch()
    transfer = GlomoTransfer(predictor, 3)
    torch.nn.init.normal_(transfer.mixer.logits)  # a non-uniform mixture
    units = unit_features(transfer, h, x, batch)
    d, k = len(predictor.directions), transfer.mixer.num_components
    assert units.shape == (h.size(0), (1 + d * k) * 3)
    torch.testing.assert_close(units[:, :3], h)
    propagated = units[:, 3:].view(-1, d, k, 3).permute(1, 2, 0, 3)  # [D, K, N, C]
    torch.testing.assert_close(propagated, transfer.propagations(h, x, batch))
    with torch.no_grad():  # the gate's inputs: the mixture of these components
        mixed = transfer.mixer.combine(propagated)
        want = transfer.mixer.mix(h, transfer.graphs(x, batch))
    for got, expected in zip(mixed, want):
        torch.testing.assert_close(got, expected)
    pooled = probe_features(transfer, h, batch, x=x)
    torch.testing.assert_close(pooled, pool_units(units, batch))
    none = GlomoTransfer(predictor, 3, graph="none")
    torch.testing.assert_close(unit_features(none, h, x, batch), h)


def test_head_mean_features_propagate_along_the_averaged_dense_graphs():
    predictor = text_predictor(1)
    x, batch, h = text_batch(1)
    transfer = GlomoTransfer(predictor, 3)
    units = unit_features(transfer, h, x, batch, heads="mean")
    graphs = transfer.graphs(x, batch)
    ptr = graphs.forward.ptr
    parts = [h]
    for g in graphs:  # per direction: G^0, G^1, then G^0 G^1 (the chain), head-averaged first
        mean = [g.to_dense(l).mean(1) for l in range(2)]  # [B, T(i), T(j)]

        def along(block, v):
            return torch.cat([block[b, :n, :n].t() @ v[ptr[b]:ptr[b] + n]
                              for b, n in enumerate(LENGTHS)])
        direct = [along(mean[0], h), along(mean[1], h)]
        parts += direct + [direct[0], along(mean[1], direct[0])]
    torch.testing.assert_close(units, torch.cat(parts, 1), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="heads must be one of"):
        unit_features(transfer, h, x, batch, heads="sum")


def test_grid_graphs_hold_the_grid_transform_edges_for_every_layer_and_head():
    ptr = torch.tensor([0, 12, 24])
    g = grid_graphs(ptr, 3, 4, num_layers=2, num_heads=2, direction="backward")
    assert (g.num_layers, g.num_heads, g.order.width) == (2, 2, 4)
    src, tgt, w = GridGraphs(3, 4).direction_edges(12, "backward")
    dense = g.to_dense(1)  # [B, H, T(i), T(j)]
    want = torch.zeros(12, 12)
    want[src, tgt] = w.float()
    for b in range(2):
        for head in range(2):
            torch.testing.assert_close(dense[b, head], want)
    with pytest.raises(ValueError, match="whole 3x4 images"):
        grid_graphs(torch.tensor([0, 12, 23]), 3, 4, num_layers=1, num_heads=1,
                    direction="forward")


def test_image_features_with_regions_and_fixed_graphs():
    torch.manual_seed(0)
    parts = [PixelGraphPredictor(4, 4, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1,
                                 direction=d).eval() for d in ("forward", "backward")]
    predictor = PretrainedGraphPredictor(*parts)
    images = torch.randint(0, 256, (3, 3, 4, 4), dtype=torch.uint8)
    x, batch = image_units(images)
    h = torch.randn(x.size(0), 2)
    ptr = torch.tensor([0, 16, 32, 48])
    grid = DirectionalGraphs(*(grid_graphs(ptr, 4, 4, num_layers=1, num_heads=2, direction=d)
                               for d in ("forward", "backward")))
    for variant, kwargs in (("learned", dict(x=x)), ("uniform", dict(x=x)),
                            ("adjacent", dict(x=x)), ("uniform", dict(graphs=grid))):
        transfer = GlomoTransfer(predictor, 2, graph=variant)
        got = probe_features(transfer, h, batch, regions=(4, 4, 2, 2), heads="mean", **kwargs)
        # 2 poolings x 4 regions x (H + 2 directions x (graph, chain) of 1 layer) x 2 channels
        assert got.shape == (3, 2 * 4 * 5 * 2)
        assert torch.isfinite(got).all()


def test_pooling_refuses_bad_input():
    x = torch.randn(10, 2)
    batch = torch.zeros(10, dtype=torch.long)
    with pytest.raises(ValueError, match="poolings"):
        pool_units(x, batch, poolings=("mean", "sum"))
    with pytest.raises(ValueError, match="poolings"):
        pool_units(x, batch, poolings=())
    with pytest.raises(ValueError, match="whole 3x4 images"):
        pool_units(x, batch, regions=(3, 4, 2, 2))  # 10 units are not a 3x4 image
    with pytest.raises(ValueError, match="rows"):
        pool_units(torch.randn(12, 2), torch.zeros(12, dtype=torch.long), regions=(3, 4, 0, 2))
    with pytest.raises(ValueError, match=r"\(height, width, rows, cols\)"):
        pool_units(torch.randn(12, 2), torch.zeros(12, dtype=torch.long), regions=(3, 4, 2))
    with pytest.raises(ValueError, match="num_samples"):
        pool_units(x, torch.arange(2).repeat_interleave(5), num_samples=1)
    with pytest.raises(ValueError, match=r"\[N, C\]"):
        pool_units(torch.randn(10), batch)
    transfer = GlomoTransfer(text_predictor(), 3)
    xt, bt, ht = text_batch()
    with pytest.raises(ValueError, match="h"):
        probe_features(transfer, torch.randn(len(bt), 4), bt, x=xt)
    graphs = transfer.graphs(xt, bt)
    with pytest.raises(ValueError, match="not both"):
        unit_features(transfer, ht, xt, bt, graphs=graphs, heads="mean")
    with pytest.raises(ValueError, match="DirectionalGraphs"):
        unit_features(transfer, ht, graphs=graphs.forward, heads="mean")


def separable(n=300, f=6, classes=3, seed=0, noise=0.3):
    """Samples (drawn with ``seed``) around the same class centres whatever the seed."""
    centres = torch.randn(classes, f, generator=torch.Generator().manual_seed(99)) * 3
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    return centres[y] + noise * torch.randn(n, f, generator=g), y


def test_linear_probe_learns_chooses_its_penalty_on_validation_and_leaves_inputs_alone():
    x, y = separable()
    x_test, y_test = separable(seed=1)
    kept = x.clone()
    probe = LinearProbe(l2_grid=(1.0, 1e-3), max_iter=50, seed=3).fit(x, y)
    torch.testing.assert_close(x, kept)  # standardised on copies
    assert set(probe.validation_accuracy) == {1.0, 1e-3}
    assert probe.l2 == max(probe.validation_accuracy, key=probe.validation_accuracy.get)
    assert (probe.predict(x_test) == y_test).double().mean() > 0.95
    again = LinearProbe(l2_grid=(1.0, 1e-3), max_iter=50, seed=3).fit(x, y)
    torch.testing.assert_close(again.logits(x), probe.logits(x))  # deterministic
    # a constant feature does not divide by zero
    constant = torch.cat([x, torch.full((x.size(0), 1), 2.0)], 1)
    assert torch.isfinite(LinearProbe(max_iter=20).fit(constant, y).logits(constant)).all()


def test_linear_probe_refuses_bad_input():
    x, y = separable(n=40)
    with pytest.raises(ValueError, match="l2_grid"):
        LinearProbe(l2_grid=(-1.0,))
    with pytest.raises(ValueError, match="validation"):
        LinearProbe(validation=1.0)
    with pytest.raises(ValueError, match="max_iter"):
        LinearProbe(max_iter=0)
    with pytest.raises(ValueError, match="labels"):
        LinearProbe().fit(x, y.float())
    with pytest.raises(ValueError, match="features"):
        LinearProbe().fit(x.long(), y)
    bad = x.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        LinearProbe().fit(bad, y)
    with pytest.raises(ValueError, match="class indices"):
        LinearProbe().fit(x, y - 1)
    with pytest.raises(ValueError, match="two classes"):
        LinearProbe().fit(x, torch.zeros_like(y))
    with pytest.raises(RuntimeError, match="fit"):
        LinearProbe().predict(x)
    probe = LinearProbe(max_iter=5).fit(x, y)
    with pytest.raises(ValueError, match="F = 6"):
        probe.predict(x[:, :5])


def test_paired_bootstrap_is_paired_and_covers_the_hand_computed_difference():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(5, 2000, generator=g) < 0.8
    same = paired_bootstrap(a, a, resamples=200)
    assert same == (0.0, 0.0, 0.0)  # paired: identical outcomes never differ
    b = a.clone()
    b[:, :100] = ~b[:, :100]  # b differs on 100 of 2000 samples
    want = (a.double() - b.double()).mean().item() * 100
    mean, low, high = paired_bootstrap(a, b, resamples=500)
    assert mean == pytest.approx(want)
    assert low < want < high and high - low < 3
    assert paired_bootstrap(a[0], b[0], resamples=50)[0] == pytest.approx(
        (a[0].double() - b[0].double()).mean().item() * 100)  # one seed
    with pytest.raises(ValueError, match="pair"):
        paired_bootstrap(a, b[:, :10])
    with pytest.raises(ValueError, match="0/1"):
        paired_bootstrap(a.double() * 2, b)
    with pytest.raises(ValueError, match="level"):
        paired_bootstrap(a, b, level=1.5)
