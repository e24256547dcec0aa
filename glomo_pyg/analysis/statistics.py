"""Statistics of emitted graphs.

One vocabulary: :func:`graph_statistics` (per-layer numbers of one batch, for logs),
:func:`graph_health` (per-head health of one batch), :class:`GraphStatisticsAccumulator`
(per-head statistics over many batches; :meth:`~GraphStatisticsAccumulator.table` gives a
:class:`GraphStatisticsTable` of :class:`HeadStatistics` rows) and
:func:`dataset_statistics` (the accumulator over a predictor and a dataset). The Lightning
callback that logs them is :class:`~glomo_pyg.training.GraphStatisticsCallback`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from glomo_pyg.graphs import LatentGraphs

# Edge-distance bins |i - j| (in units): [1, 2), [2, 3), [3, 5), [5, 9), ... [65, inf).
DISTANCE_EDGES = (1, 2, 3, 5, 9, 17, 33, 65)


def distance_bin_names(edges: Sequence[int] = DISTANCE_EDGES) -> List[str]:
    names = []
    for lo, hi in zip(edges, list(edges[1:]) + [None]):
        names.append(f"{lo}+" if hi is None else (str(lo) if hi == lo + 1 else f"{lo}-{hi - 1}"))
    return names


def graph_statistics(graphs: LatentGraphs, edges: Sequence[int] = DISTANCE_EDGES
                     ) -> Dict[str, float]:
    """Per layer ``l``: ``density`` (edges / allowed pairs), ``out_degree`` (mean
    outgoing edges per unit and head), ``distance`` (weight-averaged ``|i - j|`` per target,
    averaged over targets with edges) and ``dist_<bin>`` (fraction of edges whose
    ``|i - j|`` falls in each bin of ``edges``). Keys are ``layer{l}/<name>``."""
    stats: Dict[str, float] = {}
    bounds = torch.tensor(list(edges), dtype=torch.long)
    names = distance_bin_names(edges)
    density = graphs.density()
    for l in range(graphs.num_layers):
        ei, w, eh = graphs.layer(l)
        e = ei.size(1)
        position = graphs.sequences.position
        dist = graphs.order.distance(position[ei[1]], position[ei[0]]).cpu()
        stats[f"layer{l}/density"] = density[l]
        stats[f"layer{l}/out_degree"] = e / max(1, graphs.num_nodes * graphs.num_heads)
        # each (head, target) column's weights sum to 1: sum(w * d) / #columns is the
        # mean over columns of the weight-averaged distance
        columns = int(torch.unique(eh * graphs.num_nodes + ei[1]).numel())
        stats[f"layer{l}/distance"] = \
            float((w.detach().float().cpu() * dist).sum()) / columns if e else 0.0
        counts = torch.bucketize(dist, bounds, right=True).bincount(minlength=len(edges) + 1)
        for name, c in zip(names, counts[1:].tolist()):
            stats[f"layer{l}/dist_{name}"] = c / e if e else 0.0
    return stats


DEAD_HEAD_SHARE = 0.5  # a head is dead when more than this share of its targets have no edge


@dataclass
class GraphHealth:
    """Per-head health of one direction's graphs, each field ``[L, H]``: ``density``,
    ``empty`` (a head is *dead* above :data:`DEAD_HEAD_SHARE`), ``adjacent``, ``distance``
    and the uniform references as in :class:`HeadStatistics`, and ``entropy``, the
    normalised entropy of a target's incoming weights (:meth:`LatentGraphs.column_entropy`:
    1 uniform, 0 a single source) averaged over targets with edges and at least two
    allowed sources (``NaN`` if none). Near 1 flags a pooling head; near 0 with
    ``distance`` near ``uniform_distance * 2``, a head that attends to the sequence's first
    (forward) or last (backward) unit only."""

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
    """:class:`GraphHealth` of ``graphs``: the :class:`HeadStatistics` of this one batch
    (:class:`GraphStatisticsAccumulator`) as ``[L, H]`` tensors, with the normalised
    entropy of :meth:`LatentGraphs.column_entropy`."""
    table = GraphStatisticsAccumulator().update(graphs).table()

    def field(name: str) -> Tensor:
        return torch.tensor([[getattr(r, name) for r in table.rows[l * graphs.num_heads:]
                              [:graphs.num_heads]] for l in range(graphs.num_layers)])

    return GraphHealth(*(field(k) for k in ("density", "empty", "adjacent", "distance")),
                       graphs.column_entropy().detach().cpu().double().nanmean(-1).float(),
                       table.rows[0].uniform_adjacent, table.rows[0].uniform_distance)


# --- statistics over a dataset, per direction, layer and head ----------------------------

NEAR_UNIFORM_KL = 0.1  # nats: a head this close to uniform (on average over targets) is flagged
GRID_RADIUS = 4  # 2-D distance histograms of image graphs cover offsets up to this in rows/cols


@dataclass
class HeadStatistics:
    """Statistics of one graph (direction, layer, head) over a dataset.

    * ``density``: edges / allowed (source, target) pairs, after pruning;
    * ``empty``: share of targets with an allowed source but no incoming edge
      (``dead`` when above :data:`DEAD_HEAD_SHARE`);
    * ``entropy``: entropy (nats) of a target's incoming weights, averaged over targets
      with edges; ``uniform_entropy`` is the same average of ``log(allowed sources)``, so
      ``kl_uniform = uniform_entropy - entropy`` is the mean KL divergence from the
      uniform graph (``near_uniform`` when below :data:`NEAR_UNIFORM_KL`);
    * ``in_degree`` / ``out_degree``: mean incoming edges per target with an allowed
      source / outgoing edges per unit; ``max_in_degree`` / ``max_out_degree`` the largest;
    * ``adjacent``: weight on the adjacent unit(s) (the previous word for forward text
      graphs; the 4-neighbourhood for images), averaged over targets with an allowed source;
    * ``distance``: weight-averaged distance ``|i - j|`` (Euclidean on image grids);
    * ``histogram``: share of the incoming weight per distance bin (1-D) or per
      ``(row, column)`` offset of the source from the target (2-D, images), averaged over
      targets with edges; ``outside`` is the share beyond the 2-D window.

    ``uniform_*`` fields hold the same statistics of the uniform graph over the same
    allowed sources: the reference a learned graph should depart from.
    """

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
    def kl_uniform(self) -> float:
        return max(0.0, self.uniform_entropy - self.entropy)

    @property
    def dead(self) -> bool:
        return self.empty > DEAD_HEAD_SHARE

    @property
    def near_uniform(self) -> bool:
        return not self.dead and self.kl_uniform < NEAR_UNIFORM_KL

    def to_dict(self) -> Dict:
        out = dict(self.__dict__)
        out.update(kl_uniform=self.kl_uniform, dead=self.dead, near_uniform=self.near_uniform)
        return out


_SHORT = {"forward": "fw", "backward": "bw"}
_SCALARS = ("density", "empty", "entropy", "kl_uniform", "in_degree", "out_degree",
            "adjacent", "distance")


@dataclass
class GraphStatisticsTable:
    """Rows of :class:`HeadStatistics`, one per (direction, layer, head), with the bins
    of the distance histograms: ``bins`` names the 1-D bins (text), or ``grid_radius`` is
    set and histograms are ``(2 r + 1) x (2 r + 1)`` offset maps (images)."""

    rows: List[HeadStatistics]
    bins: Optional[List[str]] = None
    grid_radius: Optional[int] = None
    num_sequences: int = 0
    num_units: int = 0

    @property
    def directions(self) -> List[str]:
        return list(dict.fromkeys(r.direction for r in self.rows))

    @property
    def num_layers(self) -> int:
        return 1 + max(r.layer for r in self.rows)

    @property
    def num_heads(self) -> int:
        return 1 + max(r.head for r in self.rows)

    def row(self, direction: str, layer: int, head: int) -> HeadStatistics:
        for r in self.rows:
            if (r.direction, r.layer, r.head) == (direction, layer, head):
                return r
        raise KeyError(f"no statistics for ({direction!r}, layer {layer}, head {head})")

    def dead_heads(self) -> List[Tuple[str, int, int]]:
        return [(r.direction, r.layer, r.head) for r in self.rows if r.dead]

    def near_uniform_heads(self) -> List[Tuple[str, int, int]]:
        return [(r.direction, r.layer, r.head) for r in self.rows if r.near_uniform]

    def to_dict(self) -> Dict:
        return dict(bins=self.bins, grid_radius=self.grid_radius,
                    num_sequences=self.num_sequences, num_units=self.num_units,
                    rows=[r.to_dict() for r in self.rows])

    def to_csv(self) -> str:
        """The scalar columns as CSV text (one row per graph, histograms left out)."""
        header = ["direction", "layer", "head", *_SCALARS, "uniform_adjacent",
                  "uniform_distance", "max_in_degree", "max_out_degree", "dead", "near_uniform"]
        lines = [",".join(header)]
        for r in self.rows:
            d = r.to_dict()
            lines.append(",".join(str(d[k]) if not isinstance(d[k], float) else f"{d[k]:.6g}"
                                  for k in header))
        return "\n".join(lines) + "\n"

    def format(self) -> str:
        """A Markdown table; dead and near-uniform heads are marked in the last column."""
        lines = [f"{self.num_sequences} sequences, {self.num_units} units",
                 "",
                 "| graph | density | empty | entropy | KL to uniform | in-degree | "
                 "adjacent (uniform) | distance (uniform) | flag |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for r in self.rows:
            flag = "DEAD" if r.dead else ("near-uniform" if r.near_uniform else "")
            lines.append(
                f"| {_SHORT[r.direction]} L{r.layer} h{r.head} | {r.density:.3f} | {r.empty:.3f} | "
                f"{r.entropy:.2f} | {r.kl_uniform:.2f} | {r.in_degree:.1f} | "
                f"{r.adjacent:.3f} ({r.uniform_adjacent:.3f}) | "
                f"{r.distance:.2f} ({r.uniform_distance:.2f}) | {flag} |")
        return "\n".join(lines)


class _DirectionSums:
    """Running sums of one direction's statistics ([L, H] each, float64)."""

    def __init__(self, layers: int, heads: int, bins: int):
        z = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
        self.edges, self.columns = z(layers, heads), z(layers, heads)
        self.entropy, self.uniform_entropy = z(layers, heads), z(layers, heads)
        self.adjacent, self.distance = z(layers, heads), z(layers, heads)
        self.max_in = torch.zeros(layers, heads, dtype=torch.long)
        self.max_out = torch.zeros(layers, heads, dtype=torch.long)
        self.histogram = z(layers, heads, bins)
        self.uniform = dict(adjacent=0.0, distance=0.0, histogram=z(bins))
        self.allowed = self.eligible = self.units = 0.0


class GraphStatisticsAccumulator:
    """Accumulates :class:`HeadStatistics` over batches of graphs: call :meth:`update`
    with each batch's :class:`~glomo_pyg.LatentGraphs` (or a
    :class:`~glomo_pyg.DirectionalGraphs`), then :meth:`table`.

    Text graphs get 1-D distance histograms over ``edges``; image graphs (ordered by a
    :class:`~glomo_pyg.ordering.RasterOrder`) get 2-D histograms of the source's
    ``(row, column)`` offset within ``grid_radius``. A run must not mix the two.

    Example::

        acc = GraphStatisticsAccumulator()
        for x, batch in loader:
            acc.update(predictor(x, batch))
        print(acc.table().format())
    """

    def __init__(self, edges: Sequence[int] = DISTANCE_EDGES, grid_radius: int = GRID_RADIUS):
        edges = list(edges)
        if not edges or any(not isinstance(e, int) or e < 1 for e in edges) or \
                edges != sorted(set(edges)):
            raise ValueError(f"edges must be increasing positive integers, got {edges}")
        if not isinstance(grid_radius, int) or not 1 <= grid_radius <= 64:
            raise ValueError(f"grid_radius must be an integer in [1, 64], got {grid_radius!r}")
        self.edges, self.grid_radius = edges, grid_radius
        self._sums: Dict[str, _DirectionSums] = {}
        self._grid: Optional[bool] = None
        self._kind: Optional[Tuple[bool, int, int]] = None
        self.num_sequences = self.num_units = 0

    def _bins(self, grid: bool) -> int:
        # 1-D: bin 0 holds distance 0 (self-loops, with include_self), then one bin per edge
        return (2 * self.grid_radius + 1) ** 2 + 1 if grid else len(self.edges) + 1

    def _bin(self, order, target: Tensor, source: Tensor) -> Tensor:
        """Histogram bin of each (target, source) pair."""
        if self._grid:
            r, w = self.grid_radius, order.width
            dy = torch.div(source, w, rounding_mode="floor") - \
                torch.div(target, w, rounding_mode="floor")
            dx = source % w - target % w
            inside = (dy.abs() <= r) & (dx.abs() <= r)
            side = 2 * r + 1
            return torch.where(inside, (dy + r) * side + (dx + r),
                               torch.full_like(dy, side * side))
        bounds = torch.tensor(self.edges, dtype=torch.long)
        return torch.bucketize(order.distance(target, source).long(), bounds, right=True)

    @torch.no_grad()
    def update(self, graphs) -> "GraphStatisticsAccumulator":
        from glomo_pyg.analysis.export import directions
        from glomo_pyg.ordering import RasterOrder

        parts = [g for _, g in directions(graphs)]
        for g in parts:
            kind = (isinstance(g.order, RasterOrder), g.num_layers, g.num_heads)
            if self._kind is None:
                self._kind = kind
                self._grid = kind[0]
            elif self._kind != kind:  # one table: one kind of graph, one architecture
                raise ValueError(f"graphs of {kind[1]} layers x {kind[2]} heads "
                                 f"({'image' if kind[0] else 'sequence'}) do not match earlier "
                                 f"ones: cannot mix image (grid) and sequence graphs or shapes "
                                 "in one table")
            self._update(g)
        if parts:
            self.num_sequences += parts[0].num_sequences
            self.num_units += parts[0].num_nodes
        return self

    def _update(self, g: LatentGraphs) -> None:
        L, H = g.num_layers, g.num_heads
        bins = self._bins(self._grid)
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
        for l in range(L):
            ei, w, eh = (t.detach().cpu() for t in g.layer(l))
            w = w.double()
            i, j = ei[0], ei[1]
            s.edges[l] += torch.bincount(eh, minlength=H).double()
            if not eh.numel():
                continue
            column = eh * n + j
            key, inverse = torch.unique(column, return_inverse=True)
            col_head, col_target = key // n, key % n
            s.columns[l] += torch.bincount(col_head, minlength=H).double()
            plogp = torch.where(w > 0, -w * w.clamp_min(1e-300).log(), torch.zeros_like(w))
            s.entropy[l] += torch.zeros(H, dtype=torch.float64).index_add_(0, eh, plogp)
            s.uniform_entropy[l] += torch.zeros(H, dtype=torch.float64).index_add_(
                0, col_head, log_count[col_target])
            dist = order.distance(position[j], position[i]).double()
            s.adjacent[l] += torch.zeros(H, dtype=torch.float64).index_add_(0, eh, w * (dist == 1))
            s.distance[l] += torch.zeros(H, dtype=torch.float64).index_add_(0, eh, w * dist)
            in_deg = torch.bincount(inverse, minlength=key.numel())
            s.max_in[l] = torch.maximum(s.max_in[l], torch.zeros(H, dtype=torch.long)
                                        .scatter_reduce_(0, col_head, in_deg, "amax"))
            out_key, out_deg = torch.unique(eh * n + i, return_counts=True)
            s.max_out[l] = torch.maximum(s.max_out[l], torch.zeros(H, dtype=torch.long)
                                         .scatter_reduce_(0, out_key // n, out_deg, "amax"))
            flat = eh * bins + self._bin(order, position[j], position[i])
            s.histogram[l] += torch.zeros(H * bins, dtype=torch.float64).index_add_(
                0, flat, w).view(H, bins)

    def table(self) -> GraphStatisticsTable:
        """The :class:`GraphStatisticsTable` of every graph added so far."""
        if not self._sums:
            raise ValueError("no graphs were added: call update() first")
        rows = []
        for direction in ("forward", "backward"):
            s = self._sums.get(direction)
            if s is None:
                continue
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
        return GraphStatisticsTable(
            rows=rows, bins=None if self._grid else [("0" if self.edges[0] == 1 else f"0-{self.edges[0] - 1}"),
                                              *distance_bin_names(self.edges)],
            grid_radius=self.grid_radius if self._grid else None,
            num_sequences=self.num_sequences, num_units=self.num_units)

    def _shaped(self, hist: Tensor) -> List:
        if self._grid:
            side = 2 * self.grid_radius + 1
            return hist[:-1].view(side, side).tolist()
        return hist.tolist()


@torch.no_grad()
def dataset_statistics(predictor, data, batch_size: int = 32, edges: Sequence[int] = DISTANCE_EDGES,
                       grid_radius: int = GRID_RADIUS) -> GraphStatisticsTable:
    """:class:`GraphStatisticsTable` of a predictor's graphs over a dataset.

    Args:
        predictor: a :class:`~glomo_pyg.nn.PretrainedGraphPredictor` (or any module
            mapping ``(x, batch)`` to :class:`~glomo_pyg.DirectionalGraphs` or
            :class:`~glomo_pyg.LatentGraphs`), in eval mode.
        data: text: a sequence of per-sequence tensors (``[T]`` token ids or ``[T, F]``
            features); images: a ``[N, C, H, W]`` tensor (the predictor's image size).
        batch_size (int): sequences or images per call of the predictor.
    """
    from glomo_pyg.pixels import image_units

    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    acc = GraphStatisticsAccumulator(edges, grid_radius)
    if isinstance(data, torch.Tensor) and data.dim() == 4:
        batches = (image_units(data[k:k + batch_size]) for k in range(0, data.size(0), batch_size))
    else:
        data = list(data)
        for k, seq in enumerate(data):
            if not isinstance(seq, torch.Tensor) or seq.dim() not in (1, 2) or seq.size(0) < 1:
                raise ValueError(f"data[{k}] must be a non-empty [T] or [T, F] tensor, got "
                                 f"{getattr(seq, 'shape', type(seq).__name__)}")

        def batches_of_sequences():
            for k in range(0, len(data), batch_size):
                chunk = data[k:k + batch_size]
                batch = torch.cat([torch.full((s.size(0),), b, dtype=torch.long)
                                   for b, s in enumerate(chunk)]).to(chunk[0].device)
                yield torch.cat(chunk), batch
        batches = batches_of_sequences()
    for x, batch in batches:
        acc.update(predictor(x, batch))
    return acc.table()
