"""Statistics of emitted graphs, and a Lightning callback that logs them during training."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Dict, List, Sequence, Set, Tuple

import lightning.pytorch as pl
import torch

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
    outgoing edges per unit and head), ``distance`` (weight-averaged |i - j| per target,
    averaged over targets with edges) and ``dist_<bin>`` (fraction of edges whose
    |i - j| falls in each bin of ``edges``). Keys are ``layer{l}/<name>``."""
    stats: Dict[str, float] = {}
    bounds = torch.tensor(list(edges), dtype=torch.long)
    names = distance_bin_names(edges)
    density = graphs.density()
    for l in range(graphs.num_layers):
        ei, w, eh = graphs.layer(l)
        e = ei.size(1)
        dist = (ei[1] - ei[0]).abs().cpu()
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
    """Per-head health of one direction's graphs, each field ``[L, H]``.

    * ``density``: edges / allowed (source, target) pairs;
    * ``empty``: share of targets (units with at least one allowed source) that have no
      incoming edge: a head whose ``empty`` exceeds :data:`DEAD_HEAD_SHARE` is *dead*;
    * ``adjacent``: weight on the adjacent unit (previous unit for forward graphs, next
      for backward), averaged over targets;
    * ``distance``: weight-averaged ``|i - j|``, averaged over targets with edges.

    ``uniform_adjacent`` and ``uniform_distance`` are the same statistics of uniform
    graphs over the same allowed sources (the reference a learned graph should depart
    from).
    """

    density: torch.Tensor
    empty: torch.Tensor
    adjacent: torch.Tensor
    distance: torch.Tensor
    uniform_adjacent: float
    uniform_distance: float

    def dead_heads(self, share: float = DEAD_HEAD_SHARE) -> List[Tuple[int, int]]:
        """``(layer, head)`` of every head with more than ``share`` of targets empty."""
        return [tuple(x) for x in (self.empty > share).nonzero().tolist()]


@torch.no_grad()
def graph_health(graphs: LatentGraphs) -> GraphHealth:
    """:class:`GraphHealth` of ``graphs`` (computed on the sparse edges)."""
    seqs = graphs.sequences
    lengths = seqs.lengths.cpu().double()
    self_loops = graphs.include_self
    # targets with an allowed source, and allowed pairs, over the whole batch
    eligible = float(lengths.sum()) if self_loops else float((lengths - 1).clamp_min(0).sum())
    allowed = float((lengths * (lengths + 1) / 2).sum()) if self_loops else \
        float((lengths * (lengths - 1) / 2).sum())
    # uniform reference: target at position p (forward) has p (or p + 1) sources
    pos = seqs.position.cpu().double()
    if graphs.direction == "backward":
        pos = lengths[seqs.batch.cpu()] - 1 - pos
    count = pos + 1 if self_loops else pos
    has = count > 0
    uniform_adjacent = float(((pos[has] >= 1).double() / count[has]).sum() / max(1.0, eligible))
    # mean distance of a uniform column over sources at distances 0/1 .. p
    lo = 0.0 if self_loops else 1.0
    uniform_distance = float(((lo + pos[has]) / 2).mean()) if has.any() else 0.0
    L, H, n = graphs.num_layers, graphs.num_heads, graphs.num_nodes
    out = {k: torch.zeros(L, H, dtype=torch.float64) for k in ("density", "empty", "adjacent",
                                                              "distance")}
    for l in range(L):
        ei, w, eh = (t.detach().cpu() for t in graphs.layer(l))
        w = w.double()
        dist = (ei[1] - ei[0]).abs()
        edges = torch.bincount(eh, minlength=H).double()
        columns = torch.zeros(H, dtype=torch.float64)
        if eh.numel():
            key = torch.unique(eh * n + ei[1])
            columns = torch.bincount(key // n, minlength=H).double()
        out["density"][l] = edges / max(1.0, allowed)
        out["empty"][l] = 1.0 - columns / max(1.0, eligible)
        out["adjacent"][l] = torch.zeros(H, dtype=torch.float64).index_add_(
            0, eh, w * (dist == 1)) / max(1.0, eligible)
        out["distance"][l] = torch.zeros(H, dtype=torch.float64).index_add_(
            0, eh, w * dist) / columns.clamp_min(1.0)
    return GraphHealth(**{k: v.float() for k, v in out.items()},
                       uniform_adjacent=uniform_adjacent, uniform_distance=uniform_distance)


class GraphStatistics(pl.Callback):
    """Every ``every_n_steps`` training steps, emit the graphs of the current batch (no
    gradient) and log, per direction:

    * :func:`graph_statistics` as ``graphs/<direction>/layer<l>/...``;
    * :func:`graph_health` per head as ``health/<direction>/layer<l>/head<h>/<name>``
      (``density``, ``empty``, ``adjacent``, ``distance``) and the uniform references;
    * in the progress bar, ``dead`` (number of dead heads over both directions) and
      ``adj`` (mean weight on the adjacent unit over all heads; uniform graphs give
      about ``1 / mean sequence length``).

    A head that dies (more than :data:`DEAD_HEAD_SHARE` of its targets without an
    incoming edge) raises a warning naming it, once until it recovers. With
    TensorBoard, the edge-distance histogram is logged too.
    """

    def __init__(self, every_n_steps: int = 100, dead_share: float = DEAD_HEAD_SHARE):
        super().__init__()
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        if not 0 < dead_share < 1:
            raise ValueError(f"dead_share must lie in (0, 1), got {dead_share}")
        self.every_n_steps, self.dead_share = every_n_steps, dead_share
        self._dead: Set[Tuple[str, int, int]] = set()
        self.last: Dict[str, GraphHealth] = {}
        self.history: List[Dict[str, object]] = []  # per check: step, direction, per-head health

    def check_health(self, direction: str, health: GraphHealth, step: int) -> List[str]:
        """Warn about heads that died since the last check; returns the warnings."""
        dead = {(direction, l, h) for l, h in health.dead_heads(self.dead_share)}
        messages = []
        for d, l, h in sorted(dead - {x for x in self._dead if x[0] == direction}):
            messages.append(f"step {step}: graph head {h} of layer {l} ({d}) is dead: "
                            f"{float(health.empty[l, h]):.0%} of its targets have no incoming "
                            "edge (see docs/training.md, dead heads)")
        self._dead = {x for x in self._dead if x[0] != direction} | dead
        for message in messages:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        return messages

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.every_n_steps or not trainer.is_global_zero:
            return
        model = pl_module.model
        with torch.no_grad():
            graphs = model.graphs(batch.x, batch.batch)
        dead, adjacent = 0, []
        for direction in ("forward", "backward"):
            g = getattr(graphs, direction)
            if g is None:
                continue
            stats = {f"graphs/{direction}/{k}": v for k, v in graph_statistics(g).items()}
            health = graph_health(g)
            self.last[direction] = health
            self.history.append(dict(step=step, direction=direction,
                                     **{k: getattr(health, k).tolist() for k in
                                        ("density", "empty", "adjacent", "distance")},
                                     uniform_adjacent=health.uniform_adjacent,
                                     uniform_distance=health.uniform_distance))
            for l in range(g.num_layers):
                for h in range(g.num_heads):
                    for name in ("density", "empty", "adjacent", "distance"):
                        stats[f"health/{direction}/layer{l}/head{h}/{name}"] = \
                            float(getattr(health, name)[l, h])
            stats[f"health/{direction}/dead_heads"] = len(health.dead_heads(self.dead_share))
            stats[f"health/{direction}/uniform_adjacent"] = health.uniform_adjacent
            stats[f"health/{direction}/uniform_distance"] = health.uniform_distance
            dead += len(health.dead_heads(self.dead_share))
            adjacent.append(health.adjacent.mean())
            self.check_health(direction, health, step)
            for logger in trainer.loggers:
                # straight to the loggers, at this step only (values logged through
                # LightningModule.log from a callback would be repeated at later steps)
                logger.log_metrics(stats, step=step)
                experiment = getattr(logger, "experiment", None)
                if hasattr(experiment, "add_histogram"):
                    for l in range(g.num_layers):
                        ei = g.layer(l)[0]
                        experiment.add_histogram(f"graphs/{direction}/layer{l}/edge_distance",
                                                 (ei[1] - ei[0]).abs().cpu(), step)
        if adjacent and trainer.progress_bar_callback is not None:
            bar = trainer.progress_bar_metrics  # shown next to the loss until the next check
            bar["dead"] = dead
            bar["adj"] = round(float(torch.stack(adjacent).mean()), 3)
