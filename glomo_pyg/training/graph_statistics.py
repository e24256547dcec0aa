"""Statistics of emitted graphs, and a Lightning callback that logs them during training."""
from __future__ import annotations

from typing import Dict, List, Sequence

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


class GraphStatistics(pl.Callback):
    """Every ``every_n_steps`` training steps, emit the forward graphs of the current
    batch (no gradient) and log :func:`graph_statistics` as ``graphs/<direction>/...``
    to the trainer's loggers; with TensorBoard, also the edge-distance histogram."""

    def __init__(self, every_n_steps: int = 100):
        super().__init__()
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.every_n_steps or not trainer.is_global_zero:
            return
        model = pl_module.model
        with torch.no_grad():
            graphs = model.graphs(batch.x, batch.batch)
        for direction in ("forward", "backward"):
            g = getattr(graphs, direction)
            if g is None:
                continue
            stats = {f"graphs/{direction}/{k}": v for k, v in graph_statistics(g).items()}
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
