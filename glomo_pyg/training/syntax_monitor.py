"""A Lightning callback that scores the graphs against gold syntax while pretraining."""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

import lightning.pytorch as pl

from glomo_pyg.analysis.syntax import NothingToScore, align, syntax_scores
from glomo_pyg.analysis.treebank import GoldTree
from glomo_pyg.settings import Rule


class SyntaxMonitor(pl.Callback):
    """Every ``every_n_steps`` training steps (and at the end), score the model's graphs
    on a sample of gold trees with :func:`~glomo_pyg.analysis.syntax_scores` and log the
    undirected attachment of the best graph, each layer and the baselines as
    ``syntax/<direction>/...``; ``history`` keeps every result. Use a split that is not
    the one you report on.
    """

    def __init__(self, trees: Sequence[GoldTree], vocabulary: Sequence[str],
                 every_n_steps: int = 500, exclude_punct: bool = True, lower: bool = True):
        super().__init__()
        Rule(int, low=1).check("every_n_steps", every_n_steps)
        self.alignment = align(trees, vocabulary, lower)
        if not self.alignment.sentences:
            raise ValueError("SyntaxMonitor: no sentence of the sample could be aligned")
        self.every_n_steps, self.exclude_punct = every_n_steps, exclude_punct
        self.history: List[Dict[str, Any]] = []

    def check(self, model) -> "SyntaxMonitor":
        """Score once: :class:`ValueError` if the sample has nothing to score; ``self``."""
        try:
            self._scores(model)
        except NothingToScore as err:
            raise ValueError(f"the gold trees cannot be scored: {err}") from None
        return self

    def _scores(self, model):
        was_training = model.training
        model.eval()
        try:
            return syntax_scores(model.graphs, self.alignment, self.exclude_punct)
        finally:
            model.train(was_training)

    def score(self, pl_module) -> Dict[str, float]:
        scores = self._scores(pl_module.model)
        out: Dict[str, float] = {}
        for d, s in scores.directions.items():
            out[f"syntax/{d}/best"] = s.best("undirected")[2]
            out.update({f"syntax/{d}/layer{layer}": value
                        for layer, value in enumerate(s.per_layer["undirected"].tolist())})
            out.update({f"syntax/{d}/{name.replace(' ', '_')}": values["undirected"]
                        for name, values in s.baselines.items()})
        return out

    def _log(self, trainer, pl_module) -> None:
        step = trainer.global_step
        if self.history and self.history[-1]["step"] == step:
            return
        values = self.score(pl_module)
        self.history.append(dict(step=step, **values))
        for logger in trainer.loggers:
            logger.log_metrics(values, step=step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every_n_steps == 0 and trainer.is_global_zero:
            self._log(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            self._log(trainer, pl_module)
