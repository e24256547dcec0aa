"""Statistics of emitted graphs: density, edge distances and per-head health."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

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
    seqs, order = graphs.sequences, graphs.order
    # targets with an allowed source, and allowed pairs, over the whole batch
    count = order.num_sources(seqs.position, seqs.lengths[seqs.batch]).cpu().double()
    eligible = float((count > 0).sum())
    allowed = float(order.num_pairs(seqs.lengths).sum())
    # uniform reference: weight 1 / (allowed sources) on every allowed pair
    src, tgt = order.pairs(seqs.ptr)
    pos = seqs.position
    pair_dist = order.distance(pos[tgt], pos[src]).cpu().double()
    pair_w = 1.0 / count[tgt.cpu()]
    uniform_adjacent = float((pair_w * (pair_dist == 1)).sum()) / max(1.0, eligible)
    uniform_distance = float((pair_w * pair_dist).sum()) / max(1.0, eligible)
    L, H, n = graphs.num_layers, graphs.num_heads, graphs.num_nodes
    out = {k: torch.zeros(L, H, dtype=torch.float64) for k in ("density", "empty", "adjacent",
                                                              "distance")}
    for l in range(L):
        ei, w, eh = (t.detach().cpu() for t in graphs.layer(l))
        w = w.double()
        position = seqs.position.cpu()
        dist = order.distance(position[ei[1]], position[ei[0]])
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


