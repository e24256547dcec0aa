"""Figures of learned graphs (matplotlib): heat maps of a sentence's graphs (paper
Fig. 3), one pixel's incoming weights for every graph (paper Fig. 4), dataset statistics
per head, syntax scores beside their baselines. Each is a :class:`matplotlib.figure.Figure`
built without pyplot (in a notebook, run ``%matplotlib inline`` first to see it)."""
from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple, cast

import numpy as np
import torch
from torch import Tensor

from glomo_pyg.analysis.statistics import DEAD_HEAD_SHARE, GraphStatisticsTable, HeadStatistics
from glomo_pyg.extras import require
from glomo_pyg.graph_conversion import check_index, check_sample, sample_edges
from glomo_pyg.graph_names import layer_name, relation_name
from glomo_pyg.kernels import check_graph_size
from glomo_pyg.ordering import RasterOrder
from glomo_pyg.settings import Rule, check_int

_DEAD, _NEAR_UNIFORM, _OK = "#c0392b", "#e67e22", "#2e86c1"


def _figure(width: float, height: float):
    figure = require("matplotlib.figure", "Drawing figures")
    return figure.Figure(figsize=(width, height), layout="constrained")


def save_figure(fig, path: str, formats: Sequence[str] = ("png", "svg"), dpi: int = 130
                ) -> List[str]:
    """Write ``fig`` as ``<path>.<format>`` for each of ``formats`` (png, svg, pdf; a
    suffix of one of them on ``path`` is dropped first); returns the paths written."""
    for f in formats:
        Rule(str, choices=("png", "svg", "pdf")).check("figure format", f)
    stem, ext = os.path.splitext(path)
    stem = stem if ext.lower() in (".png", ".svg", ".pdf") else path
    os.makedirs(os.path.dirname(os.path.abspath(stem)), exist_ok=True)
    for f in formats:
        fig.savefig(f"{stem}.{f}", dpi=dpi)
    return [f"{stem}.{f}" for f in formats]


def _sample_dense(graphs, sample: int, layer: int) -> Tensor:
    """``[H, T, T]`` weights of one sequence and layer (``[h, i, j] = G_ij``)."""
    t = check_sample(graphs, sample)
    check_graph_size("dense", 1, t, t, graphs.num_heads,
                     hint="A heatmap holds one sequence's dense weights. ")
    src, tgt, heads, weight = sample_edges(graphs, sample, layer)
    dense = torch.zeros(graphs.num_heads, t, t, dtype=torch.float64)
    dense[heads.cpu(), src.cpu(), tgt.cpu()] = weight.cpu().double()
    return dense


def _informative_targets(dense: List[Tensor], graphs, sample: int, keep: int) -> List[int]:
    """The ``keep`` targets furthest from uniform (mean KL over the panels), in order."""
    t = dense[0].size(-1)
    pos = torch.arange(t)
    count = graphs.order.num_sources(pos, torch.full((t,), t)).double()
    score = torch.zeros(t, dtype=torch.float64)
    for d in dense:  # [H, T, T]
        w = d.clamp_min(0)
        kl = count.clamp_min(1).log() - torch.special.entr(w).sum(1)
        score += torch.where(w.sum(1) > 0, kl, 0.0).sum(0)
    score[count < 2] = -1.0  # one allowed source: nothing to show
    top = torch.argsort(score, descending=True, stable=True)[:keep]
    return sorted(top.tolist())


def plot_graph_heatmaps(graphs, sample: int = 0, labels: Optional[Sequence[str]] = None,
                        layers: Optional[Sequence[int]] = None,
                        heads: Optional[Sequence[int]] = None,
                        informative_rows: Optional[int] = None, title: Optional[str] = None,
                        panel_size: float = 2.4):
    """Heat maps of one sequence's graphs, one panel per (layer, head) (paper Fig. 3): row
    ``j`` is target ``j``'s incoming distribution ``G_ij`` over sources ``i``.

    Args:
        graphs (LatentGraphs): one direction's graphs.
        sample (int): which sequence of the batch.
        labels: names of both axes (e.g. the tokens).
        informative_rows (int): keep only the ``k`` targets whose weights depart most
            from uniform, as in the paper.
    """
    cm = require("matplotlib.cm", "Drawing figures")
    Normalize = require("matplotlib.colors", "Drawing figures").Normalize

    layers = list(range(graphs.num_layers)) if layers is None else list(layers)
    heads = list(range(graphs.num_heads)) if heads is None else list(heads)
    if not layers or not heads:
        raise ValueError("give at least one layer and one head")
    for h in heads:
        check_index("head", h, graphs.num_heads)
    t = check_sample(graphs, sample, labels)
    dense = [_sample_dense(graphs, sample, l) for l in layers]
    names = [str(x) for x in labels] if labels is not None else [str(i) for i in range(t)]
    rows = list(range(t))
    if informative_rows is not None:
        rows = _informative_targets([d[heads] for d in dense], graphs, sample,
                                    check_int("informative_rows", informative_rows))
    scale = max(1.0, t / 16)
    fig = _figure(panel_size * scale * len(heads) + 1.0,
                  panel_size * scale * len(layers) * max(0.35, len(rows) / max(1, t)) + 0.8)
    axes = fig.subplots(len(layers), len(heads), squeeze=False)
    norm = Normalize(0.0, 1.0)
    fontsize = 7 if t <= 24 else 5
    for a, l in enumerate(layers):
        for b, h in enumerate(heads):
            ax = axes[a][b]
            ax.imshow(dense[a][h].T[rows].numpy(), cmap="viridis", norm=norm, aspect="auto",
                      interpolation="nearest")
            ax.set_title(relation_name(graphs.direction, l, h), fontsize=8)
            ax.set_xticks(range(t), names, rotation=90, fontsize=fontsize)
            ax.set_yticks(range(len(rows)), [names[r] for r in rows], fontsize=fontsize)
            if a == len(layers) - 1:
                ax.set_xlabel("source i", fontsize=8)
            if b == 0:
                ax.set_ylabel("target j", fontsize=8)
    fig.colorbar(cm.ScalarMappable(norm=norm, cmap="viridis"), ax=axes, shrink=0.8,
                 label="weight G_ij")
    fig.suptitle(title or f"{graphs.direction} graphs of sample {sample}"
                 + (f" ({len(rows)} most informative targets)" if informative_rows else ""),
                 fontsize=10)
    return fig


def plot_pixel_weights(graphs, image: Tensor, pixels: Sequence[Tuple[int, int]],
                       sample: int = 0, title: Optional[str] = None, panel_size: float = 1.6):
    """For each pixel ``(row, column)`` in ``pixels``: the image with the pixel marked, then
    its incoming weights for every (direction, layer, head) (paper Fig. 4), a row of
    panels per (direction, layer), a column per head.

    Args:
        graphs (DirectionalGraphs or LatentGraphs): graphs of image ``sample``.
        image (Tensor): ``[C, H, W]`` (uint8, or float in ``[0, 1]``) for display.
        pixels (list of (int, int)): target pixels.
    """
    from glomo_pyg.analysis.export import directions

    parts = directions(graphs)
    order = parts[0][1].order
    raster = isinstance(order, RasterOrder)
    width, height = (order.width, order.height) if isinstance(order, RasterOrder) else \
        (None, None)
    if not raster or not isinstance(image, Tensor) or image.dim() != 3 or \
            image.shape[1:] != (height, width):
        raise ValueError(f"plot_pixel_weights needs image graphs (a RasterOrder), and the "
                         f"image must be [C, {height}, {width}], got "
                         f"{getattr(image, 'shape', type(image).__name__)}")
    assert height is not None and width is not None  # (the image's shape matched them)
    pixels = cast(List[Tuple[int, int]], [tuple(int(v) for v in p) for p in pixels])
    if not pixels or not all(0 <= r < height and 0 <= c < width for r, c in pixels):
        raise ValueError(f"give at least one pixel (row, column), none outside the "
                         f"{height}x{width} image, got {pixels}")
    rgb = (image.detach().cpu().float() / (255.0 if image.dtype == torch.uint8 else 1.0)
           ).clamp(0, 1).permute(1, 2, 0).numpy()
    rgb = rgb[:, :, 0] if rgb.shape[2] == 1 else rgb
    # one block of rows per pixel: a row per (direction, layer), a column per head
    dense = {(d, l): _sample_dense(g, sample, l) for d, g in parts for l in range(g.num_layers)}
    heads = parts[0][1].num_heads
    fig = _figure(panel_size * (heads + 1) + 0.8, panel_size * len(pixels) * len(dense) + 0.5)
    axes = iter(fig.subplots(len(pixels) * len(dense), heads + 1, squeeze=False))
    for r, c in pixels:
        for b, ((d, l), weights) in enumerate(dense.items()):
            row = next(axes)
            row[0].set(xticks=[], yticks=[])
            if b:
                row[0].axis("off")
            else:
                row[0].imshow(rgb, cmap="gray" if rgb.ndim == 2 else None,
                              interpolation="nearest")
                row[0].scatter([c], [r], marker="x", c="red", s=25)
                row[0].set_title(f"pixel ({r}, {c})", fontsize=7)
            _pixel_weight_panels(fig, row[1:], weights[:, :, r * width + c], (r, c),
                                 (d, l), height, width)
    fig.suptitle(title or "incoming weights of the marked pixel (red x), every graph",
                 fontsize=9)
    return fig


def _pixel_weight_panels(fig, panels, column: Tensor, pixel: Tuple[int, int],
                         graph: Tuple[str, int], height: int, width: int) -> None:
    """Draws a pixel's ``[H, T]`` incoming weights in ``graph`` (direction, layer), a head
    per panel, on one colour scale."""
    r, c = pixel
    top = max(1e-12, float(column.max()))  # one colour scale per row
    for h, ax in enumerate(panels):
        im = ax.imshow(column[h].view(height, width).numpy(), cmap="viridis", vmin=0.0,
                       vmax=top, interpolation="nearest")
        ax.scatter([c], [r], marker="x", c="red", s=12)
        ax.set(xticks=[], yticks=[])
        ax.set_title(relation_name(*graph, h) + (" (no edges)" if column[h].max() <= 0
                                                 else ""),
                     fontsize=7)
    if top > 1e-12:  # a row without edges (no allowed source) has no scale
        fig.colorbar(im, ax=panels[-1], shrink=0.8).ax.tick_params(labelsize=6)


def plot_statistics(table: GraphStatisticsTable, title: Optional[str] = None):
    """Per-graph statistics of a :class:`~glomo_pyg.analysis.GraphStatisticsTable`: bars
    per (direction, layer, head) for density, empty targets, KL from uniform, in-degree,
    weight on adjacent units and distance (uniform's as a dashed line), and the distance
    histograms (text) or offset maps (images). Dead heads red, near-uniform orange."""
    rows = table.rows
    names = [r.relation for r in rows]
    colours = [_DEAD if r.dead else _NEAR_UNIFORM if r.near_uniform else _OK for r in rows]
    grid = table.grid_radius is not None
    n_maps = len(rows) + len(table.directions)  # offset maps: each graph's and uniform's
    cols = min(n_maps, 9 if n_maps <= 18 else 12)
    low = 1.4 * -(-n_maps // cols) if grid else 2.5
    fig = _figure(min(16.0, max(9.0, 0.6 * len(rows))), 5.5 + low)
    top, bottom = fig.subfigures(2, 1, height_ratios=[5.0, low])
    _metric_bars(top, rows, names, colours)
    if grid:
        _offset_maps(bottom, table, names, colours, n_maps, cols)
    else:
        _distance_histograms(bottom, table, names)
    fig.suptitle(title or f"graph statistics over {table.num_sequences} sequences "
                          f"({table.num_units} units)", fontsize=10)
    return fig


def _metric_bars(sub, rows: List[HeadStatistics], names: List[str], colours: List[str]) -> None:
    """Draws in subfigure ``sub`` a bar per graph for each metric, and the colours' legend."""
    Patch = require("matplotlib.patches", "Drawing figures").Patch

    x = np.arange(len(rows))
    metrics = [("density", "density", None), ("empty", "targets without edges", None),
               ("kl_uniform", "KL from uniform (nats)", None),
               ("in_degree", "mean in-degree", None),
               ("adjacent", "weight on adjacent units", "uniform_adjacent"),
               ("distance", "mean edge distance", "uniform_distance")]
    for ax, (key, label, ref) in zip(sub.subplots(2, 3).flat, metrics):
        ax.bar(x, [getattr(r, key) for r in rows], color=colours)
        if ref is not None:
            ax.axhline(getattr(rows[0], ref), color="k", ls="--", lw=1, label="uniform")
            ax.legend(fontsize=7, loc="upper right")
        if key == "empty":
            ax.axhline(DEAD_HEAD_SHARE, color=_DEAD, ls=":", lw=1)
        ax.set_ylabel(label, fontsize=8)
        ax.set_xticks(x, names, rotation=90, fontsize=6)
        ax.tick_params(axis="y", labelsize=7)
    sub.legend(handles=[Patch(color=_OK, label="alive"),
                        Patch(color=_NEAR_UNIFORM, label="near-uniform"),
                        Patch(color=_DEAD, label="dead (over half the targets empty)")],
               loc="outside lower center", fontsize=7, ncols=3)


def _offset_maps(sub, table: GraphStatisticsTable, names: List[str], colours: List[str],
                 n_maps: int, cols: int) -> None:
    """Draws in ``sub`` each graph's map of weight by the source's offset, uniform's first."""
    assert table.grid_radius is not None
    rows = table.rows
    side = 2 * table.grid_radius + 1
    maps: List[Tuple[str, Any, str]] = []
    for d in table.directions:
        mine = [k for k, r in enumerate(rows) if r.direction == d]
        maps.append((f"uniform {d}", rows[mine[0]].uniform_histogram, "k"))
        maps += [(names[k], rows[k].histogram, colours[k]) for k in mine]
    panels = sub.subplots(-(-n_maps // cols), cols, squeeze=False).ravel()
    for ax in panels[n_maps:]:
        ax.axis("off")
    for ax, (name, hist, colour) in zip(panels, maps):
        ax.set(xticks=[], yticks=[])
        ax.imshow(np.asarray(hist), cmap="magma", vmin=0.0, interpolation="nearest",
                  extent=(-side / 2, side / 2, side / 2, -side / 2))
        ax.set_title(name, fontsize=7, color=colour)
    sub.suptitle(f"share of incoming weight by the source's offset from the target "
                 f"(centre), up to {table.grid_radius} rows and columns", fontsize=8)


def _distance_histograms(sub, table: GraphStatisticsTable, names: List[str]) -> None:
    """Draws in ``sub`` each graph's share of weight per distance bin, uniform's first."""
    rows = table.rows
    ax = sub.subplots()
    hist = np.asarray([rows[0].uniform_histogram] + [r.histogram for r in rows])
    im = ax.imshow(hist.T, cmap="magma", aspect="auto", vmin=0.0, interpolation="nearest")
    ax.set_xticks(np.arange(len(rows) + 1), ["uniform"] + names, rotation=90, fontsize=6)
    bins = cast(List[str], table.bins)  # (sequence graphs: distance bins)
    ax.set_yticks(np.arange(len(bins)), bins, fontsize=7)
    ax.set_ylabel("edge distance |i - j|", fontsize=8)
    ax.set_title("share of incoming weight per distance bin", fontsize=8)
    sub.colorbar(im, ax=ax, label="share of weight")


def plot_syntax_scores(comparison, metric: str = "undirected", title: Optional[str] = None):
    """Scores of every graph against gold syntax (a
    :class:`~glomo_pyg.analysis.SyntaxComparison`), one panel per direction: a bar per
    (layer, head) and head-averaged layer, the untrained predictor's as hollow bars, the
    chosen graph outlined, the baselines as horizontal lines."""
    from glomo_pyg.analysis.syntax import METRIC

    METRIC.check("metric", metric)
    ev, un = comparison.evaluation, comparison.untrained
    directions = list(ev.directions)
    fig = _figure(5.6 * len(directions) + 0.5, 3.6)
    axes = fig.subplots(1, len(directions), squeeze=False)[0]
    styles = ["--", ":", "-.", (0, (5, 1))]
    for ax, d in zip(axes, directions):
        s = ev.directions[d]
        per_graph, per_layer = s.per_graph[metric], s.per_layer[metric]
        L, H = per_graph.shape
        names = [relation_name(d, l, h) for l in range(L) for h in range(H)] + \
                [f"{d}/{layer_name(l)} avg" for l in range(L)]
        values = list(per_graph.reshape(-1)) + list(per_layer)
        x = np.arange(len(values))
        chosen = comparison.chosen.get(d)
        edge = ["k" if chosen is not None and k == chosen[0] * H + chosen[1] else "none"
                for k in range(len(values))]
        ax.bar(x, values, color=["#2e86c1"] * (L * H) + ["#1b4f72"] * L, edgecolor=edge,
               linewidth=1.5, label="trained")
        if un is not None:
            u = un.directions[d]
            ax.bar(x, list(u.per_graph[metric].reshape(-1)) + list(u.per_layer[metric]),
                   fill=False, edgecolor="#888888", linewidth=0.8, label="untrained")
        for (name, base), style in zip(s.baselines.items(), styles):
            ax.axhline(base[metric], color="k", ls=style, lw=1, label=name)
        ax.set_xticks(x, names, rotation=90, fontsize=7)
        ax.set_ylabel(f"{metric} score", fontsize=8)
        ax.set_title(f"{d} graphs ({s.targets} targets)", fontsize=9)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars
    fig.suptitle(title or f"graphs against gold syntax ({metric}; outlined: the graph "
                          "chosen on the selection trees)", fontsize=9)
    return fig
