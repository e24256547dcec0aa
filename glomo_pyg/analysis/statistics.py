"""Statistics of emitted graphs (docs/analysis.md): :func:`graph_statistics` (per layer,
one batch), :func:`graph_health` (per head, one batch), :class:`GraphStatisticsAccumulator`
and :func:`dataset_statistics` (per head, over many batches)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from glomo_pyg.graph_names import layer_name, relation_name
from glomo_pyg.graphs import LatentGraphs
from glomo_pyg.settings import check_int

# Edge-distance bins |i - j| (in units): [1, 2), [2, 3), [3, 5), [5, 9), ... [65, inf).
DISTANCE_EDGES = (1, 2, 3, 5, 9, 17, 33, 65)


def distance_bin_names(edges: Sequence[int] = DISTANCE_EDGES) -> List[str]:
    return [f"{lo}+" if hi is None else str(lo) if hi == lo + 1 else f"{lo}-{hi - 1}"
            for lo, hi in zip(edges, [*edges[1:], None])]


def graph_statistics(graphs: LatentGraphs, edges: Sequence[int] = DISTANCE_EDGES
                     ) -> Dict[str, float]:
    """Per layer ``l``: ``density`` (edges / allowed pairs), ``out_degree`` (mean
    outgoing edges per unit and head), ``distance`` (weight-averaged ``|i - j|`` per target,
    averaged over targets with edges) and ``dist_<bin>`` (fraction of edges whose
    ``|i - j|`` falls in each bin of ``edges``). Keys are ``layer<l>/<name>``, ``l``
    counted from 0 (:func:`~glomo_pyg.graph_names.layer_name`)."""
    stats: Dict[str, float] = {}
    bounds = torch.tensor(list(edges), dtype=torch.long)
    names = distance_bin_names(edges)
    density = graphs.density()
    for l in range(graphs.num_layers):
        ei, w, eh = graphs.layer(l)
        e, layer = ei.size(1), layer_name(l)
        dist = graphs.order.distance(graphs.sequences.position[ei[1]],
                                     graphs.sequences.position[ei[0]]).cpu()
        stats[f"{layer}/density"] = density[l]
        stats[f"{layer}/out_degree"] = e / max(1, graphs.num_nodes * graphs.num_heads)
        # each (head, target) column's weights sum to 1: sum(w * d) / #columns is the
        # mean over columns of the weight-averaged distance
        columns = int(torch.unique(eh * graphs.num_nodes + ei[1]).numel())
        stats[f"{layer}/distance"] = \
            float((w.detach().float().cpu() * dist).sum()) / columns if e else 0.0
        counts = torch.bucketize(dist, bounds, right=True).bincount(minlength=len(edges) + 1)
        for name, c in zip(names, counts[1:].tolist()):
            stats[f"{layer}/dist_{name}"] = c / e if e else 0.0
    return stats


DEAD_HEAD_SHARE = 0.5  # a head is dead when more than this share of its targets have no edge


@dataclass
class GraphHealth:
    """Per-head health of one direction's graphs, fields ``[L, H]`` as in
    :class:`HeadStatistics`, but ``entropy``: the mean normalised entropy of the targets'
    incoming weights (:meth:`LatentGraphs.column_entropy`: 1 uniform, 0 one source)."""

    density: torch.Tensor
    empty: torch.Tensor
    adjacent: torch.Tensor
    distance: torch.Tensor
    entropy: torch.Tensor
    uniform_adjacent: float
    uniform_distance: float

    def dead_heads(self, share: float = DEAD_HEAD_SHARE) -> List[Tuple[int, int]]:
        """``(layer, head)`` of every head with more than ``share`` of targets empty."""
        return [tuple(x) for x in (self.empty > share).nonzero().tolist()]


@torch.no_grad()
def graph_health(graphs: LatentGraphs) -> GraphHealth:
    """:class:`GraphHealth` of ``graphs``: this one batch's :class:`HeadStatistics` as
    ``[L, H]`` tensors."""
    rows = GraphStatisticsAccumulator().update(graphs).table().rows  # by layer, then head
    density, empty, adjacent, distance = (
        torch.tensor([getattr(r, k) for r in rows]).view(graphs.num_layers, -1)
        for k in ("density", "empty", "adjacent", "distance"))
    return GraphHealth(density, empty, adjacent, distance,
                       graphs.column_entropy().detach().cpu().double().nanmean(-1).float(),
                       rows[0].uniform_adjacent, rows[0].uniform_distance)


NEAR_UNIFORM_KL = 0.1  # nats: a head this close to uniform (on average over targets) is flagged
GRID_RADIUS = 4  # 2-D distance histograms of image graphs cover offsets up to this in rows/cols


@dataclass
class HeadStatistics:
    """Statistics of one graph (direction, layer, head) over a dataset (docs/analysis.md);
    ``uniform_*``: the same of the uniform graph. A head is ``dead`` above
    :data:`DEAD_HEAD_SHARE` ``empty``, ``near_uniform`` below :data:`NEAR_UNIFORM_KL`
    ``kl_uniform`` (``uniform_entropy - entropy``, the mean KL divergence from uniform)."""

    direction: str
    layer: int
    head: int
    density: float
    empty: float
    entropy: float
    uniform_entropy: float
    in_degree: float
    out_degree: float
    max_in_degree: int
    max_out_degree: int
    adjacent: float
    uniform_adjacent: float
    distance: float
    uniform_distance: float
    histogram: List
    uniform_histogram: List
    outside: float = 0.0

    @property
    def relation(self) -> str:
        """The graph's name, ``"forward/layer0/head3"``
        (:func:`~glomo_pyg.graph_names.relation_name`)."""
        return relation_name(self.direction, self.layer, self.head)

    @property
    def kl_uniform(self) -> float:
        return max(0.0, self.uniform_entropy - self.entropy)

    @property
    def dead(self) -> bool:
        return self.empty > DEAD_HEAD_SHARE

    @property
    def near_uniform(self) -> bool:
        return not self.dead and self.kl_uniform < NEAR_UNIFORM_KL

    def to_dict(self) -> Dict:
        return dict(relation=self.relation, **vars(self), kl_uniform=self.kl_uniform,
                    dead=self.dead, near_uniform=self.near_uniform)


@dataclass
class GraphStatisticsTable:
    """:class:`HeadStatistics` per (direction, layer, head) and the histograms' ``bins``
    (text), or ``grid_radius`` of their ``(2 r + 1) x (2 r + 1)`` offset maps (images)."""

    rows: List[HeadStatistics]
    bins: Optional[List[str]] = None
    grid_radius: Optional[int] = None
    num_sequences: int = 0
    num_units: int = 0

    @property
    def directions(self) -> List[str]:
        return list(dict.fromkeys(r.direction for r in self.rows))

    def row(self, direction: str, layer: int, head: int) -> HeadStatistics:
        """The row of ``(direction, layer, head)`` (:class:`KeyError` if none)."""
        return {(r.direction, r.layer, r.head): r for r in self.rows}[direction, layer, head]

    def dead_heads(self) -> List[Tuple[str, int, int]]:
        return [(r.direction, r.layer, r.head) for r in self.rows if r.dead]

    def near_uniform_heads(self) -> List[Tuple[str, int, int]]:
        return [(r.direction, r.layer, r.head) for r in self.rows if r.near_uniform]

    def to_dict(self) -> Dict:
        return dict(vars(self), rows=[r.to_dict() for r in self.rows])

    def to_csv(self) -> str:
        """The scalar columns as CSV text (one row per graph, histograms left out)."""
        header = ["relation", "direction", "layer", "head", "density", "empty", "entropy",
                  "kl_uniform", "in_degree", "out_degree", "adjacent", "distance",
                  "uniform_adjacent", "uniform_distance", "max_in_degree", "max_out_degree",
                  "dead", "near_uniform"]
        lines = [header] + [[d[k] for k in header] for d in (r.to_dict() for r in self.rows)]
        return "".join(",".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in line)
                       + "\n" for line in lines)

    def format(self) -> str:
        """A Markdown table; dead and near-uniform heads are marked in the last column."""
        lines = [f"{self.num_sequences} sequences, {self.num_units} units", "",
                 "| graph | density | empty | entropy | KL to uniform | in-degree | "
                 "adjacent (uniform) | distance (uniform) | flag |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for r in self.rows:
            flag = "DEAD" if r.dead else "near-uniform" if r.near_uniform else ""
            lines.append(
                f"| {r.relation} | {r.density:.3f} | "
                f"{r.empty:.3f} | {r.entropy:.2f} | {r.kl_uniform:.2f} | {r.in_degree:.1f} | "
                f"{r.adjacent:.3f} ({r.uniform_adjacent:.3f}) | "
                f"{r.distance:.2f} ({r.uniform_distance:.2f}) | {flag} |")
        return "\n".join(lines)


class _DirectionSums:
    """Running sums of one direction's statistics ([L, H] each, float64)."""

    def __init__(self, layers: int, heads: int, bins: int):
        z = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
        (self.edges, self.columns, self.entropy, self.uniform_entropy, self.adjacent,
         self.distance) = z(6, layers, heads)
        self.max_in, self.max_out = torch.zeros(2, layers, heads, dtype=torch.long)
        self.histogram = z(layers, heads, bins)
        self.uniform: Dict[str, Any] = dict(adjacent=0.0, distance=0.0, histogram=z(bins))
        self.allowed = self.eligible = self.units = 0.0


class GraphStatisticsAccumulator:
    """:class:`HeadStatistics` over batches: :meth:`update` with each batch's graphs,
    then :meth:`table`. Text graphs get 1-D distance histograms over ``edges``, image
    graphs (:class:`~glomo_pyg.ordering.RasterOrder`) 2-D histograms of the source's
    ``(row, column)`` offset within ``grid_radius``; one run must not mix them."""

    def __init__(self, edges: Sequence[int] = DISTANCE_EDGES, grid_radius: int = GRID_RADIUS):
        edges = list(edges)
        if not edges or any(not isinstance(e, int) or e < 1 for e in edges) or \
                edges != sorted(set(edges)):
            raise ValueError(f"edges must be increasing positive integers, got {edges}")
        self.edges, self.grid_radius = edges, check_int("grid_radius", grid_radius, 1, 64)
        self._sums: Dict[str, _DirectionSums] = {}
        self._kind: Optional[Tuple[bool, int, int]] = None  # (grid, layers, heads)
        self.num_sequences = self.num_units = 0

    @property
    def _grid(self) -> bool:
        assert self._kind is not None  # (set by the first update)
        return self._kind[0]

    def _bin(self, order, target: Tensor, source: Tensor) -> Tensor:
        """Histogram bin of each (target, source) pair."""
        if self._grid:
            r, w, side = self.grid_radius, order.width, 2 * self.grid_radius + 1
            dy, dx = source // w - target // w, source % w - target % w  # positions >= 0
            inside = (dy.abs() <= r) & (dx.abs() <= r)
            return torch.where(inside, (dy + r) * side + (dx + r), side * side)
        bounds = torch.tensor(self.edges, dtype=torch.long)
        return torch.bucketize(order.distance(target, source).long(), bounds, right=True)

    @torch.no_grad()
    def update(self, graphs) -> "GraphStatisticsAccumulator":
        from glomo_pyg.analysis.export import directions
        from glomo_pyg.ordering import RasterOrder

        parts = [g for _, g in directions(graphs)]
        for g in parts:
            kind = (isinstance(g.order, RasterOrder), g.num_layers, g.num_heads)
            self._kind = self._kind or kind
            if self._kind != kind:  # one table: one kind of graph, one architecture
                raise ValueError(f"graphs of {kind[1]} layers x {kind[2]} heads "
                                 f"({'image' if kind[0] else 'sequence'}) do not match earlier "
                                 f"ones: cannot mix image (grid) and sequence graphs or shapes "
                                 "in one table")
            self._update(g)
        self.num_sequences += parts[0].num_sequences
        self.num_units += parts[0].num_nodes
        return self

    def _update(self, g: LatentGraphs) -> None:
        L, H = g.num_layers, g.num_heads
        # 1-D: bin 0 holds distance 0 (self-loops, with include_self), then one per edge;
        # 2-D: the (2 r + 1)^2 offsets, then one for those outside
        bins = (2 * self.grid_radius + 1) ** 2 + 1 if self._grid else len(self.edges) + 1
        s = self._sums.setdefault(g.direction, _DirectionSums(L, H, bins))
        seqs, order = g.sequences, g.order
        position = seqs.position.cpu()
        count = order.num_sources(seqs.position, seqs.lengths[seqs.batch]).cpu().double()
        n = g.num_nodes
        s.allowed += float(order.num_pairs(seqs.lengths).sum())
        s.eligible += float((count > 0).sum())
        s.units += n
        # uniform reference over the same allowed pairs
        src, tgt = (t.cpu() for t in order.pairs(seqs.ptr))
        w_u = 1.0 / count[tgt]
        d_u = order.distance(position[tgt], position[src]).double()
        s.uniform["adjacent"] += float((w_u * (d_u == 1)).sum())
        s.uniform["distance"] += float((w_u * d_u).sum())
        s.uniform["histogram"] += torch.zeros(bins, dtype=torch.float64).index_add_(
            0, self._bin(order, position[tgt], position[src]), w_u)
        log_count = count.clamp_min(1).log()

        def per_head(index: Tensor, values: Tensor) -> Tensor:
            return torch.zeros(H, dtype=torch.float64).index_add_(0, index, values)

        def head_max(old: Tensor, index: Tensor, values: Tensor) -> Tensor:
            return torch.maximum(old, torch.zeros(H, dtype=torch.long)
                                 .scatter_reduce_(0, index, values, "amax"))

        for l in range(L):
            ei, w, eh = (t.detach().cpu() for t in g.layer(l))
            w = w.double()
            i, j = ei[0], ei[1]
            s.edges[l] += torch.bincount(eh, minlength=H).double()
            if not eh.numel():
                continue
            key, inverse = torch.unique(eh * n + j, return_inverse=True)  # (head, target)
            col_head, col_target = key // n, key % n
            s.columns[l] += torch.bincount(col_head, minlength=H).double()
            s.entropy[l] += per_head(eh, torch.special.entr(w))
            s.uniform_entropy[l] += per_head(col_head, log_count[col_target])
            dist = order.distance(position[j], position[i]).double()
            s.adjacent[l] += per_head(eh, w * (dist == 1))
            s.distance[l] += per_head(eh, w * dist)
            s.max_in[l] = head_max(s.max_in[l], col_head,
                                   torch.bincount(inverse, minlength=key.numel()))
            out_key, out_deg = torch.unique(eh * n + i, return_counts=True)
            s.max_out[l] = head_max(s.max_out[l], out_key // n, out_deg)
            flat = eh * bins + self._bin(order, position[j], position[i])
            s.histogram[l] += torch.zeros(H * bins, dtype=torch.float64).index_add_(
                0, flat, w).view(H, bins)

    def table(self) -> GraphStatisticsTable:
        """The :class:`GraphStatisticsTable` of every graph added so far."""
        if not self._sums:
            raise ValueError("no graphs were added: call update() first")
        rows = []
        for direction, s in sorted(self._sums.items(), key=lambda item: item[0] != "forward"):
            L, H = s.edges.shape
            eligible = max(1.0, s.eligible)
            u_hist = s.uniform["histogram"] / eligible
            for l in range(L):
                for h in range(H):
                    cols = float(s.columns[l, h])
                    c = max(1.0, cols)
                    hist = s.histogram[l, h] / c
                    rows.append(HeadStatistics(
                        direction=direction, layer=l, head=h,
                        density=float(s.edges[l, h]) / max(1.0, s.allowed),
                        empty=1.0 - cols / eligible if s.eligible else 0.0,
                        entropy=float(s.entropy[l, h]) / c,
                        uniform_entropy=float(s.uniform_entropy[l, h]) / c,
                        in_degree=float(s.edges[l, h]) / eligible,
                        out_degree=float(s.edges[l, h]) / max(1.0, s.units),
                        max_in_degree=int(s.max_in[l, h]), max_out_degree=int(s.max_out[l, h]),
                        adjacent=float(s.adjacent[l, h]) / eligible,
                        uniform_adjacent=s.uniform["adjacent"] / eligible,
                        distance=float(s.distance[l, h]) / c,
                        uniform_distance=s.uniform["distance"] / eligible,
                        histogram=self._shaped(hist), uniform_histogram=self._shaped(u_hist),
                        outside=float(hist[-1]) if self._grid else 0.0))
        first = "0" if self.edges[0] == 1 else f"0-{self.edges[0] - 1}"
        return GraphStatisticsTable(
            rows=rows, bins=None if self._grid else [first, *distance_bin_names(self.edges)],
            grid_radius=self.grid_radius if self._grid else None,
            num_sequences=self.num_sequences, num_units=self.num_units)

    def _shaped(self, hist: Tensor) -> List:
        side = 2 * self.grid_radius + 1
        return hist[:-1].view(side, side).tolist() if self._grid else hist.tolist()


@torch.no_grad()
def dataset_statistics(predictor, data, batch_size: int = 32, edges: Sequence[int] = DISTANCE_EDGES,
                       grid_radius: int = GRID_RADIUS) -> GraphStatisticsTable:
    """:class:`GraphStatisticsTable` of a predictor's graphs over a dataset.

    Args:
        predictor: a :class:`~glomo_pyg.nn.PretrainedGraphPredictor` (or any module
            mapping ``(x, batch)`` to graphs), in eval mode.
        data: text: a sequence of per-sequence tensors (``[T]`` token ids or ``[T, F]``
            features); images: a ``[N, C, H, W]`` tensor (the predictor's image size).
        batch_size (int): sequences or images per call of the predictor.
    """
    from glomo_pyg.analysis.export import concat_sequences
    from glomo_pyg.pixels import image_units

    check_int("batch_size", batch_size)
    acc = GraphStatisticsAccumulator(edges, grid_radius)
    images = isinstance(data, torch.Tensor) and data.dim() == 4
    if not images:
        data = list(data)
        for k, seq in enumerate(data):
            if not isinstance(seq, torch.Tensor) or seq.dim() not in (1, 2) or seq.size(0) < 1:
                raise ValueError(f"data[{k}] must be a non-empty [T] or [T, F] tensor, got "
                                 f"{getattr(seq, 'shape', type(seq).__name__)}")
    for k in range(0, len(data), batch_size):
        chunk = data[k:k + batch_size]
        acc.update(predictor(*(image_units(chunk) if images else concat_sequences(chunk))))
    return acc.table()
