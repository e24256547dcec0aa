"""Figures: panel counts, axis labels, saved files, bad input."""
import numpy as np
import pytest
import torch
from reference import batch_vector

from glomo_pyg import GraphPredictor, LatentGraphs, PretrainedGraphPredictor
from glomo_pyg.analysis import (
    GraphStatisticsAccumulator,
    plot_graph_heatmaps,
    plot_pixel_weights,
    plot_statistics,
    plot_syntax_scores,
    save_figure,
)
from glomo_pyg.analysis.syntax import GraphScores, SyntaxComparison, SyntaxScores
from glomo_pyg.nn.pixel import PixelGraphPredictor
from glomo_pyg.pixels import image_units

TOKENS = "the cat sat on the mat .".split()


def text_graphs():
    torch.manual_seed(0)
    model = GraphPredictor(num_tokens=20, hidden_channels=16, num_layers=2, heads=2,
                           cnn_layers=1).eval()
    with torch.no_grad():
        return model(torch.randint(0, 20, (7 + 4,)), batch_vector([7, 4]))


def pixel_graphs():
    torch.manual_seed(0)
    parts = [PixelGraphPredictor(4, 5, hidden_channels=8, num_layers=2, heads=2, cnn_layers=1,
                                 direction=d).eval() for d in ("forward", "backward")]
    image = torch.randint(0, 256, (1, 3, 4, 5), dtype=torch.uint8)
    with torch.no_grad():
        return PretrainedGraphPredictor(*parts)(*image_units(image)), image[0]


def panels(fig):
    """Axes that show data (colour bars excluded)."""
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def test_heatmaps_have_one_panel_per_layer_and_head_with_labels():
    graphs = text_graphs()
    fig = plot_graph_heatmaps(graphs, 0, labels=TOKENS)
    axes = panels(fig)
    assert len(axes) == 4 and len(fig.axes) == 5  # + one shared colour bar
    assert [ax.get_title() for ax in axes] == ["forward/layer0/head0", "forward/layer0/head1",
                                               "forward/layer1/head0", "forward/layer1/head1"]
    assert [t.get_text() for t in axes[0].get_xticklabels()] == TOKENS
    assert axes[2].get_xlabel() == "source i" and axes[0].get_ylabel() == "target j"
    # the image is G transposed: row j, column i
    dense = graphs.to_dense(layer=1)[0, 1].numpy()  # sample 0, head 1: [i, j]
    assert np.allclose(axes[3].images[0].get_array(), dense[:7, :7].T)
    fig = plot_graph_heatmaps(graphs, 1, layers=[1], heads=[0], informative_rows=2)
    (ax,) = panels(fig)
    assert len(ax.get_yticklabels()) == 2 and ax.images[0].get_array().shape == (2, 4)


def test_informative_rows_keep_the_targets_furthest_from_uniform():
    d = torch.zeros(1, 1, 1, 5, 5)
    for j in range(1, 5):
        d[0, 0, 0, :j, j] = 1.0 / j  # uniform columns ...
    d[0, 0, 0, :, 4] = 0
    d[0, 0, 0, 3, 4] = 1.0          # ... except target 4, peaked on 3
    g = LatentGraphs.from_dense(d, direction="forward", ptr=torch.tensor([0, 5]))
    (ax,) = panels(plot_graph_heatmaps(g, 0, labels=list("abcde"), informative_rows=1))
    assert [t.get_text() for t in ax.get_yticklabels()] == ["e"]


def test_pixel_maps_every_graph_of_every_pixel():
    graphs, image = pixel_graphs()
    fig = plot_pixel_weights(graphs, image, [(2, 2), (3, 4)])
    axes = fig.axes
    grid = [ax for ax in axes if ax.get_label() != "<colorbar>"]
    # 2 pixels x (2 directions x 2 layers) rows x (1 image column + 2 heads)
    assert len(grid) == 2 * 4 * 3
    titles = [ax.get_title() for ax in grid]
    assert "pixel (2, 2)" in titles and "pixel (3, 4)" in titles
    assert "backward/layer1/head1" in titles
    # the last pixel has no allowed backward source: its rows say so and have no scale
    assert sum("(no edges)" in t for t in titles) == 4
    weights = [ax for ax in grid if ax.get_title() == "forward/layer0/head1"][0] \
        .images[0].get_array()
    dense = graphs.forward.to_dense(layer=0)[0, 1][:, 2 * 5 + 2].view(4, 5).numpy()
    assert np.allclose(weights, dense)


def test_statistics_figure_text_and_image():
    table = GraphStatisticsAccumulator().update(text_graphs()).table()
    fig = plot_statistics(table)
    labels = [ax.get_ylabel() for ax in fig.axes]
    for label in ("density", "targets without edges", "KL from uniform (nats)",
                  "mean in-degree", "weight on adjacent units", "mean edge distance",
                  "edge distance |i - j|"):
        assert label in labels
    graphs, _ = pixel_graphs()
    table = GraphStatisticsAccumulator(grid_radius=2).update(graphs).table()
    fig = plot_statistics(table)
    maps = [ax for ax in fig.axes if ax.images and ax.get_title().startswith(("forward/",
                                                                               "backward/",
                                                                               "uniform"))]
    assert len(maps) == 8 + 2  # every graph plus the uniform map of each direction


def syntax_comparison():
    def scores(shift):
        per_graph = {m: np.full((2, 2), 0.3 + shift) for m in ("undirected", "directed", "ap")}
        per_layer = {m: np.full(2, 0.25 + shift) for m in per_graph}
        base = {"adjacent word": {m: 0.4 for m in per_graph},
                "uniform": {m: 0.2 for m in per_graph}}
        return SyntaxScores({"forward": GraphScores("forward", per_graph, per_layer, base, 10)},
                            sentences=3, skipped_sentences=0, unaligned_words=0,
                            short_sentences=0, unknown_fraction=0.0, exclude_punct=True)
    return SyntaxComparison(scores(0.1), scores(0.0), None, {"forward": (1, 0)})


def test_syntax_figure_bars_baselines_and_chosen_graph():
    fig = plot_syntax_scores(syntax_comparison())
    (ax,) = fig.axes
    bars = ax.patches
    assert len(bars) == 2 * (4 + 2)  # trained and untrained, 4 graphs + 2 layer averages
    heights = [b.get_height() for b in bars[:6]]
    assert heights == pytest.approx([0.4] * 4 + [0.35] * 2)
    assert [round(line.get_ydata()[0], 3) for line in ax.get_lines()] == [0.4, 0.2]
    outlined = [k for k, b in enumerate(bars[:6]) if b.get_edgecolor()[3] > 0]
    assert outlined == [2]  # layer 1, head 0
    assert ax.get_ylabel() == "undirected score"
    with pytest.raises(ValueError, match="metric"):
        plot_syntax_scores(syntax_comparison(), metric="las")


def test_save_figure_writes_png_and_svg(tmp_path):
    fig = plot_graph_heatmaps(text_graphs(), 1)
    paths = save_figure(fig, str(tmp_path / "sub" / "heat.png"))
    assert [p.rsplit(".", 1)[1] for p in paths] == ["png", "svg"]
    assert open(paths[0], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in open(paths[1], "rb").read(2000)
    with pytest.raises(ValueError, match="format"):
        save_figure(fig, str(tmp_path / "x"), formats=("gif",))


def test_bad_input():
    graphs = text_graphs()
    with pytest.raises(ValueError, match="sample"):
        plot_graph_heatmaps(graphs, 2)
    with pytest.raises(ValueError, match="labels"):
        plot_graph_heatmaps(graphs, 0, labels=["a"])
    with pytest.raises(ValueError, match="layer"):
        plot_graph_heatmaps(graphs, 0, layers=[5])
    with pytest.raises(ValueError, match="head"):
        plot_graph_heatmaps(graphs, 0, heads=[2])
    with pytest.raises(ValueError, match="informative_rows"):
        plot_graph_heatmaps(graphs, 0, informative_rows=0)
    with pytest.raises(ValueError, match="RasterOrder"):
        plot_pixel_weights(graphs, torch.zeros(3, 4, 5), [(0, 0)])
    pixel, image = pixel_graphs()
    with pytest.raises(ValueError, match="outside"):
        plot_pixel_weights(pixel, image, [(4, 0)])
    with pytest.raises(ValueError, match="image must be"):
        plot_pixel_weights(pixel, image[:, :3], [(0, 0)])
    with pytest.raises(ValueError, match="at least one pixel"):
        plot_pixel_weights(pixel, image, [])


def test_heatmaps_refuse_a_sequence_too_long_for_dense_weights(monkeypatch):
    import glomo_pyg.kernels as kernels
    from glomo_pyg.analysis.figures import plot_graph_heatmaps

    monkeypatch.setattr(kernels, "MAX_GRAPH_PAIRS", 100)
    graphs = LatentGraphs.uniform(torch.tensor([0, 20]), num_layers=1, num_heads=2,
                                  direction="forward")
    with pytest.raises(ValueError, match="A heatmap holds one sequence's dense weights"):
        plot_graph_heatmaps(graphs, heads=[0])
