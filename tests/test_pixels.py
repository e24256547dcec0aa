"""Pixel-graph mode (paper Sec. 3.5) on tiny images: raster masking and causality, the
180-degree backward mapping, layouts, the pixel objective, the CIFAR ResNet stage."""
import math

import pytest
import torch

from glomo_pyg import (
    Glomo,
    GlomoResNet,
    GlomoTransfer,
    LatentGraphs,
    PixelGraphPredictor,
    RasterOrder,
    flex,
)
from glomo_pyg.analysis.statistics import graph_health
from glomo_pyg.nn.decoder import IGNORE
from glomo_pyg.nn.pixel import MaskedConv2d, PixelContextHead, window_offsets
from glomo_pyg.nn.resnet import CifarResNet
from glomo_pyg.pixels import image_units, unit_images
from glomo_pyg.sequences import sequence_batch

H, W = 6, 5
SMALL = dict(hidden_channels=16, num_layers=2, heads=2, cnn_layers=2)


def images(b=3, h=H, w=W, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, 3, h, w), generator=g, dtype=torch.uint8)


def predictor(direction="forward", **kw):
    torch.manual_seed(0)
    return PixelGraphPredictor(H, W, **dict(SMALL, **kw), direction=direction).eval()


@pytest.mark.parametrize("mask_type", ["A", "B"])
def test_masked_convolution_reads_only_earlier_raster_positions(mask_type):
    torch.manual_seed(0)
    conv = MaskedConv2d(2, 3, 5, mask_type)
    x = torch.randn(1, 2, H, W, requires_grad=True)
    for p in range(H * W):
        r, c = divmod(p, W)
        (grad,) = torch.autograd.grad(conv(x)[0, :, r, c].sum(), x)
        seen = grad.abs().sum(1)[0].flatten() > 0
        later = torch.arange(H * W) > p
        assert not seen[later].any()
        assert bool(seen[p]) == (mask_type == "B")


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_graph_columns_depend_only_on_allowed_pixels_by_gradients(direction):
    model = predictor(direction, position="grid", position_frequencies=3, position_period=16.0)
    with torch.no_grad():
        model.scorer.position_coef.normal_()
    x, batch = image_units(images(1))
    captured = {}
    model.encoder.linear.register_forward_hook(lambda m, i, o: captured.update(h=o))
    dense = model(x, batch, layout="dense").to_dense()  # [L, 1, H, T, T]
    t = H * W
    for j in range(t):
        (grad,) = torch.autograd.grad(dense[:, 0, :, :, j].sum(), captured["h"],
                                      retain_graph=True)
        reached = grad.abs().sum(1) > 0
        allowed = torch.arange(t) < j if direction == "forward" else torch.arange(t) > j
        assert not reached[~allowed].any(), f"column {j} reads a pixel it may not"


def test_backward_graphs_are_the_forward_graphs_of_the_rotated_image_mapped_back():
    bw = predictor("backward")
    fw = predictor("forward")
    fw.load_state_dict(bw.state_dict())
    img = images(2)
    with torch.no_grad():
        g_bw = bw(*image_units(img), layout="dense").to_dense()
        g_fw = fw(*image_units(img.flip(2, 3)), layout="dense").to_dense()
    assert g_bw.abs().sum() > 0
    torch.testing.assert_close(g_bw, g_fw.flip(-1, -2), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_every_layout_gives_the_same_pixel_graphs(direction):
    model = predictor(direction, bias="threshold", position="grid", position_frequencies=2,
                      position_period=12.0)
    with torch.no_grad():
        model.scorer.position_coef.normal_()
    x, batch = image_units(images(3))
    with torch.no_grad():
        ref = model(x, batch, layout="sparse")
        layouts = ["dense", "auto"] + (["fused"] if flex.available() else [])
        for layout in layouts:
            g = model(x, batch, layout=layout)
            assert isinstance(g.order, RasterOrder) and g.order.width == W
            torch.testing.assert_close(g.to_dense(), ref.to_dense(), atol=1e-5, rtol=1e-4)
            h = torch.randn(x.size(0), 4)
            torch.testing.assert_close(g.propagate(h, 1), ref.propagate(h, 1), atol=1e-5,
                                       rtol=1e-4)


def test_raster_order_distances_and_neighbourhood_statistics():
    order = RasterOrder("forward", 3, 4)
    t = torch.tensor
    # (1, 1) = unit 5: left is 4, above is 1, above-left is 0
    assert order.distance(t([5]), t([4])).item() == 1
    assert order.distance(t([5]), t([1])).item() == 1
    assert order.distance(t([5]), t([0])).item() == pytest.approx(math.sqrt(2))
    assert order.allowed(t(5), t(4)) and not order.allowed(t(5), t(6))
    with pytest.raises(ValueError, match="height"):
        RasterOrder("forward", 0, 4)
    # graphs with all weight on the left neighbour: adjacent weight 1 where it exists
    b = 2
    ptr = torch.arange(b + 1) * 12
    src, tgt = [], []
    for img in range(b):
        for p in range(12):
            if p % 4:
                src.append(img * 12 + p - 1)
                tgt.append(img * 12 + p)
    ei = torch.tensor([src, tgt])
    g = LatentGraphs([ei], [torch.ones(len(src))], [torch.zeros(len(src), dtype=torch.long)],
                     num_heads=1, direction="forward", ptr=ptr, order=order)
    health = graph_health(g)
    # 9 of 11 targets per image have a left neighbour; the other 2 (first column) none
    assert health.adjacent[0, 0].item() == pytest.approx(9 / 11)
    assert health.empty[0, 0].item() == pytest.approx(2 / 11)
    with pytest.raises(ValueError, match="cover each sequence.s units"):
        LatentGraphs.uniform(torch.tensor([0, 12, 20]), num_layers=1, num_heads=1,
                             direction="forward", order=order)


def test_grid_position_term_is_a_function_of_row_and_column_offsets():
    model = predictor(position="grid", position_frequencies=3, position_period=16.0)
    sc = model.scorer
    with torch.no_grad():
        sc.position_coef.normal_()
        for lin in (*sc.key, *sc.query):
            lin.weight.zero_()
            lin.bias.zero_()
    t = H * W
    k, q = sc.augmented(1, torch.zeros(1, t, 16), torch.zeros(1, t, 16))
    scores = torch.einsum("bhid,bhjd->bhij", k, q)[0]  # [H, i, j]
    pos = torch.arange(t)
    rc = torch.stack([pos // W, pos % W], -1)
    offsets = rc.view(1, -1, 2) - rc.view(-1, 1, 2)  # [i, j] -> (r_j - r_i, c_j - c_i)
    torch.testing.assert_close(scores, sc.relative_bias(1, offsets), atol=1e-4, rtol=1e-4)


def test_pixel_context_targets_are_the_future_window():
    assert window_offsets("forward") == [(0, 1), (1, -1), (1, 0), (1, 1)]
    assert window_offsets("backward") == [(0, -1), (-1, 1), (-1, 0), (-1, -1)]
    head = PixelContextHead(8, 3, 3, in_channels=1)
    x = torch.arange(18, dtype=torch.uint8).view(18, 1)  # two 3x3 images, value = unit id
    seqs = sequence_batch(18, torch.arange(2).repeat_interleave(9), x.device)
    out = head.targets(x, seqs, torch.tensor([0, 4, 8, 11]), "forward")[..., 0]
    assert out.tolist() == [[1, IGNORE, 3, 4], [5, 6, 7, 8], [IGNORE] * 4,
                            [IGNORE, 13, 14, IGNORE]]
    back = PixelContextHead(8, 3, 3, 1, "backward")
    assert back.targets(x, seqs, torch.tensor([4, 9]), "backward")[..., 0].tolist() == \
        [[3, 2, 1, 0], [IGNORE] * 4]


def test_glomo_image_model_trains_and_exports_pixel_graphs():
    torch.manual_seed(0)
    model = Glomo.image(H, W, **SMALL, num_positions=6, keep_alive=0.05)
    x, batch = image_units(images(4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(3):
        out = model(x, batch)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(float(out.loss))
    assert all(math.isfinite(v) for v in losses)
    assert losses[0] == pytest.approx(math.log(256), abs=0.2)  # 256-way, untrained
    pretrained = model.to_pretrained().eval()
    graphs = pretrained(x, batch)
    nx_graph = graphs.forward.to_networkx(1, layer=0, head=1)
    assert nx_graph.number_of_nodes() == H * W
    assert all(u < v for u, v in nx_graph.edges())  # sources earlier in raster order
    assert isinstance(graphs.backward.order, RasterOrder)


def test_saved_pixel_predictor_round_trips(tmp_path):
    model = Glomo.image(H, W, **SMALL, position="grid", position_frequencies=2,
                        position_period=12.0, pixel_mean=[0.5, 0.4, 0.3], pixel_std=[0.2] * 3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    pretrained = model.to_pretrained()
    pretrained.save_pretrained(tmp_path / "pixels")
    loaded = type(pretrained).from_pretrained(tmp_path / "pixels")
    x, batch = image_units(images(2))
    with torch.no_grad():
        a, b = pretrained(x, batch), loaded(x, batch)
    torch.testing.assert_close(a.forward.to_dense(), b.forward.to_dense())
    torch.testing.assert_close(a.backward.to_dense(), b.backward.to_dense())
    assert loaded.predictor("forward").encoder.pixel_mean.tolist() == \
        pytest.approx([0.5, 0.4, 0.3])


def test_bad_pixel_input_gets_named_errors():
    model = predictor()
    x, batch = image_units(images(2))
    with pytest.raises(TypeError, match="uint8"):
        model(x.float(), batch)
    with pytest.raises(ValueError, match=r"\[N, 3\]"):
        model(x[:, :2], batch)
    with pytest.raises(ValueError, match="whole 6x5 images"):
        model(x[:-1], batch[:-1])
    with pytest.raises(ValueError, match="whole 6x5 images"):
        model(*image_units(images(2, h=4, w=4)))
    with pytest.raises(TypeError, match="uint8"):
        image_units(images(1).float())
    with pytest.raises(ValueError, match="at least two pixels"):
        image_units(images(1, 1, 1))
    with pytest.raises(ValueError, match="odd"):
        MaskedConv2d(3, 3, 4)
    with pytest.raises(ValueError, match="pixel_mean"):
        PixelGraphPredictor(H, W, **SMALL, pixel_mean=[0.5, 0.5], pixel_std=[1, 1])
    with pytest.raises(ValueError, match="pixel_mean"):
        PixelGraphPredictor(H, W, **SMALL, pixel_std=[0.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="None or 'grid'"):
        PixelGraphPredictor(H, W, **SMALL, position="relative")
    assert unit_images(x, H, W).shape == (2, 3, H, W)
    assert torch.equal(unit_images(x, H, W), images(2))


@pytest.mark.parametrize("graph", ["learned", "uniform", "adjacent", "none"])
def test_resnet_with_and_without_the_glomo_stage(graph):
    torch.manual_seed(0)
    model = Glomo.image(8, 8, **SMALL)
    transfer = GlomoTransfer(model.to_pretrained(), 3, graph=graph)
    net = GlomoResNet(transfer, depth=18, width=4).eval()
    img = images(2, 8, 8)
    out = net(img)
    assert out.shape == (2, 10) and net.resnet.in_channels == 6
    if graph != "none":  # precomputed propagations give the same output
        h = net.stage_input(img)
        prop = transfer.propagations(h, *image_units(img))
        torch.testing.assert_close(net(img, propagated=prop), out, atol=1e-5, rtol=1e-4)
    plain = GlomoResNet(None, depth=34, width=4).eval()
    assert plain(img).shape == (2, 10) and plain.resnet.in_channels == 3
    with pytest.raises(ValueError, match="depth"):
        CifarResNet(depth=50)
    with pytest.raises(TypeError, match="uint8"):
        net(img.float())
    with pytest.raises(ValueError, match="3 channels"):
        net(images(2, 8, 8)[:, :2])
    if graph == "learned":  # same number of pixels, other shape: refused by size
        wide = GlomoResNet(GlomoTransfer(Glomo.image(4, 16, **SMALL).to_pretrained(), 3),
                           width=4)
        with pytest.raises(ValueError, match="must be 4x16"):
            wide(img)


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("include_self", [False, True])
def test_uniform_propagation_in_closed_form_equals_the_edges(direction, include_self):
    ptr = torch.tensor([0, 1, 6, 9, 17])
    g = LatentGraphs.uniform(ptr, num_layers=2, num_heads=3, direction=direction,
                             include_self=include_self)
    edges = LatentGraphs(g.edge_index, g.edge_weight, g.edge_head, num_heads=3,
                         direction=direction, ptr=ptr, include_self=include_self)
    assert g.num_edges == edges.num_edges
    for x in (torch.randn(17, 4), torch.randn(3, 17, 4)):
        torch.testing.assert_close(g.propagate(x, 1), edges.propagate(x, 1))


def test_resized_predictor_keeps_its_weights_and_graphs():
    model = predictor(position="grid", position_frequencies=2, position_period=24.0)
    big = model.resized(8, 9)
    assert (big.height, big.width) == (8, 9) and big.order.width == 9
    back = big.resized(H, W)
    x, batch = image_units(images(2))
    with torch.no_grad():
        torch.testing.assert_close(back(x, batch).to_dense(), model(x, batch).to_dense())
        assert big(*image_units(images(1, 8, 9))).num_nodes == 72
    pretrained = Glomo.image(H, W, **SMALL).to_pretrained().resized(8, 8)
    assert pretrained.predictor("backward").height == 8


def test_pixel_predictor_is_a_registered_emitter_and_the_abstract_base_is_not():
    from glomo_pyg.nn import EMITTERS
    assert EMITTERS["PixelGraphPredictor"] is PixelGraphPredictor
    assert "ScoredEmitter" not in EMITTERS and "GraphEmitter" not in EMITTERS
