"""Statistics of graphs over a dataset, per (direction, layer, head), against hand-computed
values on tiny graphs."""
import math

import pytest
import torch
from reference import batch_vector

from glomo_pyg import DirectionalGraphs, GraphPredictor, LatentGraphs, PretrainedGraphPredictor
from glomo_pyg.analysis import (
    GraphStatisticsAccumulator,
    HeadStatistics,
    dataset_statistics,
    graph_health,
)
from glomo_pyg.nn.pixel import PixelGraphPredictor
from glomo_pyg.ordering import RasterOrder
from glomo_pyg.pixels import image_units


def tiny_forward():
    """One sequence of 4 units, 1 layer, 2 heads (``[l, b, h, i, j] = G_ij``)."""
    d = torch.zeros(1, 1, 2, 4, 4)
    d[0, 0, 0, 0, 1] = 1.0                                        # target 1 <- 0
    d[0, 0, 0, 0, 2], d[0, 0, 0, 1, 2] = 0.25, 0.75               # target 2
    d[0, 0, 0, 0, 3], d[0, 0, 0, 1, 3], d[0, 0, 0, 2, 3] = 0.5, 0.25, 0.25
    d[0, 0, 1, 1, 3] = 1.0                                        # head 1: only 3 <- 1
    return LatentGraphs.from_dense(d, direction="forward", ptr=torch.tensor([0, 4]))


def test_text_statistics_against_hand_computed_values():
    table = GraphStatisticsAccumulator(edges=(1, 2, 3)).update(tiny_forward()).table()
    assert table.bins == ["0", "1", "2", "3+"]
    assert [(r.direction, r.layer, r.head) for r in table.rows] == \
        [("forward", 0, 0), ("forward", 0, 1)]
    h0, h1 = table.rows
    # 6 allowed pairs; 3 targets with an allowed source
    assert h0.density == pytest.approx(6 / 6) and h1.density == pytest.approx(1 / 6)
    assert h0.empty == 0.0 and h1.empty == pytest.approx(2 / 3)
    ent = [0.0, -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)),
           -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))]
    assert h0.entropy == pytest.approx(sum(ent) / 3)
    assert h0.uniform_entropy == pytest.approx((0 + math.log(2) + math.log(3)) / 3)
    assert h0.kl_uniform == pytest.approx(h0.uniform_entropy - h0.entropy)
    assert h1.entropy == 0.0 and h1.uniform_entropy == pytest.approx(math.log(3))
    assert h0.in_degree == pytest.approx(6 / 3) and h0.out_degree == pytest.approx(6 / 4)
    assert (h0.max_in_degree, h0.max_out_degree) == (3, 3)
    assert (h1.max_in_degree, h1.max_out_degree) == (1, 1)
    # weight on the previous unit: 1 + 0.75 + 0.25 over 3 targets; uniform: 1 + 1/2 + 1/3
    assert h0.adjacent == pytest.approx(2.0 / 3)
    assert h0.uniform_adjacent == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
    assert h1.adjacent == 0.0
    assert h0.distance == pytest.approx((1 + (0.5 + 0.75) + (1.5 + 0.5 + 0.25)) / 3)
    assert h1.distance == pytest.approx(2.0)
    # histogram: weight share per distance bin over targets with edges
    assert h0.histogram == pytest.approx([0.0, 2.0 / 3, (0.25 + 0.25) / 3, 0.5 / 3])
    assert h1.histogram == pytest.approx([0.0, 0.0, 1.0, 0.0])
    assert h0.uniform_histogram == pytest.approx([0.0, (1 + 0.5 + 1 / 3) / 3,
                                                  (0.5 + 1 / 3) / 3, (1 / 3) / 3])
    assert sum(h0.histogram) == pytest.approx(1.0)
    assert h1.dead and not h0.dead and not h1.near_uniform
    assert table.dead_heads() == [("forward", 0, 1)]
    assert table.row("forward", 0, 1) is h1
    with pytest.raises(KeyError):
        table.row("backward", 0, 0)


def test_uniform_graphs_are_flagged_near_uniform_and_match_their_reference():
    ptr = torch.tensor([0, 7, 12])
    graphs = LatentGraphs.uniform(ptr, num_layers=2, num_heads=3, direction="backward")
    table = GraphStatisticsAccumulator().update(graphs).table()
    assert len(table.rows) == 6 and table.near_uniform_heads() == \
        [("backward", l, h) for l in range(2) for h in range(3)]
    for r in table.rows:
        assert r.kl_uniform == pytest.approx(0.0, abs=1e-9)
        assert r.adjacent == pytest.approx(r.uniform_adjacent)
        assert r.distance == pytest.approx(r.uniform_distance)
        assert r.histogram == pytest.approx(r.uniform_histogram)
        assert r.density == pytest.approx(1.0) and r.empty == 0.0


def test_agrees_with_graph_health_and_accumulates_over_batches():
    torch.manual_seed(0)
    model = GraphPredictor(num_tokens=30, hidden_channels=18, num_layers=2, heads=3,
                           cnn_layers=1).double().eval()
    lengths = [5, 9, 2, 7]
    x = torch.randint(0, 30, (sum(lengths),))
    with torch.no_grad():
        whole = model(x, batch_vector(lengths))
        first = model(x[:14], batch_vector(lengths[:2]))
        second = model(x[14:], batch_vector(lengths[2:]))
    one = GraphStatisticsAccumulator().update(whole).table()
    two = GraphStatisticsAccumulator().update(first).update(second).table()
    health = graph_health(whole)
    for a, b in zip(one.rows, two.rows):
        for key in ("density", "empty", "entropy", "uniform_entropy", "adjacent", "distance",
                    "in_degree", "out_degree", "max_in_degree", "max_out_degree"):
            assert getattr(a, key) == pytest.approx(getattr(b, key)), key
        assert a.histogram == pytest.approx(b.histogram)
        assert a.density == pytest.approx(float(health.density[a.layer, a.head]), rel=1e-5)
        assert a.empty == pytest.approx(float(health.empty[a.layer, a.head]), abs=1e-6)
        assert a.adjacent == pytest.approx(float(health.adjacent[a.layer, a.head]), rel=1e-5)
        assert a.distance == pytest.approx(float(health.distance[a.layer, a.head]), rel=1e-5)
    assert (one.num_sequences, one.num_units) == (4, 23) == (two.num_sequences, two.num_units)


def test_grid_histograms_use_row_and_column_offsets():
    # a 2 x 3 image, forward raster order: target 4 (row 1, col 1)
    d = torch.zeros(1, 1, 1, 6, 6)
    d[0, 0, 0, 3, 4] = 0.5   # left neighbour: offset (0, -1)
    d[0, 0, 0, 1, 4] = 0.25  # above: (-1, 0)
    d[0, 0, 0, 2, 4] = 0.25  # above-right: (-1, +1)
    g = LatentGraphs.from_dense(d, direction="forward", ptr=torch.tensor([0, 6]))
    g = g.with_order(RasterOrder("forward", 2, 3))
    table = GraphStatisticsAccumulator(grid_radius=1).update(g).table()
    assert table.grid_radius == 1 and table.bins is None
    (r,) = table.rows
    hist = torch.tensor(r.histogram, dtype=torch.float64)
    assert hist.shape == (3, 3)
    # rows: dy = -1, 0, +1; columns: dx = -1, 0, +1; averaged over the 1 target with edges
    expected = torch.zeros(3, 3, dtype=torch.float64)
    expected[1, 0], expected[0, 1], expected[0, 2] = 0.5, 0.25, 0.25
    assert torch.allclose(hist, expected)
    assert r.outside == 0.0
    assert r.adjacent == pytest.approx(0.75 / 5)  # 4-neighbours, over 5 eligible targets
    assert r.distance == pytest.approx(0.5 + 0.25 + 0.25 * math.sqrt(2))


def test_dataset_statistics_of_text_and_images():
    torch.manual_seed(0)
    model = GraphPredictor(num_tokens=20, hidden_channels=16, num_layers=2, heads=2,
                           cnn_layers=1).eval()
    predictor = PretrainedGraphPredictor(model, None)
    seqs = [torch.randint(0, 20, (n,)) for n in (4, 7, 3, 9, 5)]
    table = dataset_statistics(predictor, seqs, batch_size=2)
    acc = GraphStatisticsAccumulator()
    with torch.no_grad():
        acc.update(predictor(torch.cat(seqs), batch_vector([4, 7, 3, 9, 5])))
    ref = acc.table()
    assert table.num_sequences == 5 and len(table.rows) == 4
    for a, b in zip(table.rows, ref.rows):
        assert a.entropy == pytest.approx(b.entropy) and a.density == pytest.approx(b.density)

    pixel = PretrainedGraphPredictor(
        PixelGraphPredictor(4, 5, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1,
                            direction="forward").eval(),
        PixelGraphPredictor(4, 5, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1,
                            direction="backward").eval())
    images = torch.randint(0, 256, (3, 3, 4, 5), dtype=torch.uint8)
    table = dataset_statistics(pixel, images, batch_size=2)
    assert table.grid_radius is not None and table.directions == ["forward", "backward"]
    assert table.num_units == 60 and len(table.rows) == 4
    with torch.no_grad():
        direct = GraphStatisticsAccumulator().update(pixel(*image_units(images))).table()
    for a, b in zip(table.rows, direct.rows):
        assert a.kl_uniform == pytest.approx(b.kl_uniform)
    for r in table.rows:
        assert all(math.isfinite(v) for v in (r.entropy, r.distance, r.adjacent))
        assert sum(map(sum, r.histogram)) + r.outside == pytest.approx(1.0)


def test_table_exports():
    table = GraphStatisticsAccumulator().update(tiny_forward()).table()
    text = table.format()
    assert "DEAD" in text and "forward/layer0/head1" in text
    csv = table.to_csv().splitlines()
    assert len(csv) == 3 and csv[0].startswith("relation,direction,layer,head,density")
    assert csv[1].startswith("forward/layer0/head0,forward,0,0,")
    assert csv[2].endswith("True,False")
    d = table.to_dict()
    assert d["bins"] == table.bins and d["rows"][1]["dead"] is True
    assert isinstance(table.rows[0], HeadStatistics)


def test_bad_input():
    with pytest.raises(ValueError, match="edges"):
        GraphStatisticsAccumulator(edges=(3, 2))
    with pytest.raises(ValueError, match="edges"):
        GraphStatisticsAccumulator(edges=())
    with pytest.raises(ValueError, match="grid_radius"):
        GraphStatisticsAccumulator(grid_radius=0)
    with pytest.raises(ValueError, match="no graphs"):
        GraphStatisticsAccumulator().table()
    with pytest.raises(TypeError, match="LatentGraphs"):
        GraphStatisticsAccumulator().update(torch.zeros(3))
    acc = GraphStatisticsAccumulator().update(tiny_forward())
    other = LatentGraphs.uniform(torch.tensor([0, 4]), num_layers=2, num_heads=2,
                                 direction="forward")
    with pytest.raises(ValueError, match="layers"):
        acc.update(other)
    grid = tiny_forward().with_order(RasterOrder("forward", 2, 2))
    with pytest.raises(ValueError, match="mix"):
        acc.update(grid)
    model = PretrainedGraphPredictor(GraphPredictor(num_tokens=5, hidden_channels=8,
                                                    num_layers=1, heads=1).eval(), None)
    with pytest.raises(ValueError, match="batch_size"):
        dataset_statistics(model, [torch.tensor([1, 2])], batch_size=0)
    with pytest.raises(ValueError, match=r"data\[1\]"):
        dataset_statistics(model, [torch.tensor([1, 2]), torch.tensor([], dtype=torch.long)])
    # a DirectionalGraphs with one direction is fine
    assert GraphStatisticsAccumulator().update(DirectionalGraphs(tiny_forward(), None)).table()
