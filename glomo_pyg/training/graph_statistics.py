"""A Lightning callback that logs graph statistics and health during training."""
from __future__ import annotations

import warnings
from typing import Any, Dict, List, Tuple

import lightning.pytorch as pl
import torch

from glomo_pyg.analysis.statistics import (
    DEAD_HEAD_SHARE,
    GraphHealth,
    graph_health,
    graph_statistics,
)
from glomo_pyg.graph_names import layer_name, relation_name
from glomo_pyg.settings import Rule

HEALTH_FIELDS = ("density", "empty", "adjacent", "distance", "entropy")

__all__ = ["GraphStatisticsCallback"]


class GraphStatisticsCallback(pl.Callback):
    """Every ``every_n_steps`` training steps, log :func:`graph_statistics` and per-head
    :func:`graph_health` of the current batch's graphs (its leading whole sequences up to
    ``max_units`` units), with ``dead`` and ``adj`` in the progress bar; a head that dies
    (more than ``dead_share`` of its targets without an incoming edge) is warned about
    once, and its recovery too, so that the warnings tell what ``dead`` counts
    (docs/training.md, dead heads).
    """

    def __init__(self, every_n_steps: int = 100, dead_share: float = DEAD_HEAD_SHARE,
                 max_units: int = 8192):
        super().__init__()
        self.every_n_steps = Rule(int, low=1).check("every_n_steps", every_n_steps)
        self.dead_share = Rule(float, low=0, high=1, low_open=True, high_open=True).check(
            "dead_share", dead_share)
        # (the sparse edges of e.g. 64 images of 1024 pixels would not fit in memory)
        self.max_units = Rule(int, low=2).check("max_units", max_units)
        self._dead: Dict[Tuple[str, int, int], int] = {}  # dead head -> the step it died
        self.last: Dict[str, GraphHealth] = {}
        self.history: List[Dict[str, object]] = []  # per check: step, direction, per-head health

    def check_health(self, direction: str, health: GraphHealth, step: int) -> List[str]:
        """Warn about heads of ``direction`` that died or recovered since the last check;
        returns the warnings."""
        dead = {(direction, l, h) for l, h in health.dead_heads(self.dead_share)}
        before = {x: k for x, k in self._dead.items() if x[0] == direction}
        died = [f"step {step}: graph {relation_name(d, l, h)} is dead: "
                f"{float(health.empty[l, h]):.0%} of its targets have no incoming edge "
                "(see docs/training.md, dead heads)" for d, l, h in sorted(dead - set(before))]
        recovered = [f"step {step}: graph {relation_name(d, l, h)}, dead since step "
                     f"{before[(d, l, h)]}, recovered: {float(health.empty[l, h]):.0%} of its "
                     "targets have no incoming edge" for d, l, h in sorted(set(before) - dead)]
        self._dead = {**{x: k for x, k in self._dead.items() if x[0] != direction},
                      **{x: before.get(x, step) for x in dead}}
        for message in died + recovered:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        return died + recovered

    def state_dict(self) -> Dict[str, Any]:
        # (checkpointed: a resumed run warns neither again about a head still dead, nor
        # misses its recovery)
        return dict(dead=[[d, l, h, k] for (d, l, h), k in sorted(self._dead.items())])

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._dead = {(str(d), int(l), int(h)): int(k)
                      for d, l, h, k in state_dict.get("dead", [])}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.every_n_steps or not trainer.is_global_zero:
            return
        x, index = pl_module.model_input(batch) if hasattr(pl_module, "model_input") else \
            (batch.x, batch.batch)
        if x.size(0) > self.max_units:  # whole leading sequences (index is sorted)
            keep = index <= max(int(index[self.max_units - 1]), 0)
            x, index = x[keep], index[keep]
        with torch.no_grad():
            graphs = pl_module.model.graphs(x, index)
        dead, adjacent = 0, []
        for direction in ("forward", "backward"):
            g = getattr(graphs, direction)
            if g is None:
                continue
            stats = {f"graphs/{direction}/{k}": v for k, v in graph_statistics(g).items()}
            health = graph_health(g)
            self.last[direction] = health
            uniform = dict(uniform_adjacent=health.uniform_adjacent,
                           uniform_distance=health.uniform_distance)
            self.history.append(dict(step=step, direction=direction, **uniform,
                                     **{k: getattr(health, k).tolist() for k in HEALTH_FIELDS}))
            stats.update({f"health/{relation_name(direction, l, h)}/{name}":
                          float(getattr(health, name)[l, h]) for name in HEALTH_FIELDS
                          for l in range(g.num_layers) for h in range(g.num_heads)})
            dead_heads = len(health.dead_heads(self.dead_share))
            stats.update({f"health/{direction}/{k}": v for k, v in
                          dict(uniform, dead_heads=dead_heads).items()})
            dead += dead_heads
            adjacent.append(health.adjacent.mean())
            self.check_health(direction, health, step)
            for logger in trainer.loggers:
                # straight to the loggers, at this step only (values logged through
                # LightningModule.log from a callback would be repeated at later steps)
                logger.log_metrics(stats, step=step)
                experiment: Any = getattr(logger, "experiment", None)
                if hasattr(experiment, "add_histogram"):
                    for l in range(g.num_layers):
                        ei = g.layer(l)[0]
                        experiment.add_histogram(
                            f"graphs/{direction}/{layer_name(l)}/edge_distance",
                            (ei[1] - ei[0]).abs().cpu(), step)
        if adjacent and trainer.progress_bar_callback is not None:
            # shown next to the loss until the next check
            trainer.progress_bar_metrics.update(
                dead=dead, adj=round(float(torch.stack(adjacent).mean()), 3))
