"""``glomo quickstart``: pretrain on planted dependencies and score their recovery."""
from __future__ import annotations

import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Optional, Tuple

import lightning.pytorch as pl
import torch
from torch_geometric.loader import DataLoader

from glomo_pyg.analysis.recovery import RecoveryReport, planted_source_recovery
from glomo_pyg.atomic_files import write_json
from glomo_pyg.data.synthetic import PlantedDependencyCorpus
from glomo_pyg.nn.glomo import Glomo
from glomo_pyg.nn.pretrained import save_pretrained
from glomo_pyg.settings import Rule, check_settings, rules, setting
from glomo_pyg.training.pretrain.config import TrainConfig, check_model_section
from glomo_pyg.training.pretrain.module import GlomoPretraining
from glomo_pyg.training.utils import checked_lightning, quiet_lightning

# validation and test items: disjoint index ranges of the training corpus's language
VALID_START, TEST_START = 10**7, 2 * 10**7
MAX_SEQUENCES = 1 << 24  # steps x batch size: 16.8M sequences, a 134 MB shuffled index


def predictor_dir(output_dir: str) -> str:
    """Where the quickstart saves its pretrained graph predictor."""
    return os.path.join(output_dir, "predictor")


_TRAIN = rules(TrainConfig)  # the settings shared with glomo pretrain, declared there


@dataclass
class QuickstartConfig:
    """Settings of ``glomo quickstart`` (defaults: a few minutes on 2 CPU cores); those it
    shares with ``glomo pretrain`` follow the rules of :class:`TrainConfig
    <glomo_pyg.training.pretrain.TrainConfig>`."""

    steps: int = setting(1000, low=1, doc="optimiser steps")
    batch_size: int = setting(32, rule=_TRAIN["batch_size"])
    test_sequences: int = setting(512, low=1, doc="held-out sequences the scores use")
    seed: int = setting(0, rule=_TRAIN["seed"])
    lr: float = setting(3e-3, rule=_TRAIN["lr"])
    graph_lr_scale: float = setting(1.0, rule=_TRAIN["graph_lr_scale"])
    graph_warmup_steps: int = setting(150, rule=_TRAIN["graph_warmup_steps"])
    grad_clip: float = setting(1.0, rule=_TRAIN["grad_clip"])
    corpus: Dict[str, Any] = setting(factory=lambda: dict(
        min_length=16, max_length=32, num_filler=16, num_slots=3, num_values=4, topic_size=5,
        min_distance=3, max_distance=12, dependencies=2),
        rule=Rule(dict), doc="PlantedDependencyCorpus arguments (checked by it)")
    model: Dict[str, Any] = setting(factory=lambda: dict(
        hidden_channels=48, num_layers=2, heads=4, cnn_layers=2, num_positions=32,
        context_length=3), rule=Rule(dict), doc="Glomo.text arguments")
    accelerator: str = setting("cpu", rule=_TRAIN["accelerator"])
    output_dir: Optional[str] = setting(None, doc="CSV logs, quickstart.json and the "
                                                  "predictor (predictor/)")
    progress_bar: bool = setting(True)

    def validate(self) -> None:
        """Every setting by its rule; :class:`ValueError` naming it."""
        check_settings(self)
        check_model_section(self.model, images=False)


@dataclass
class QuickstartResult:
    """Test-set figures. ``chosen`` is the (layer, head) graph that recovers planted
    sources best on the *validation* split; its test precision is ``chosen_precision``."""

    initial_test_loss: float
    final_test_loss: float
    chosen: Tuple[int, int]
    chosen_precision: float
    recovery: RecoveryReport
    recovery_untrained: RecoveryReport
    seconds: float
    density: Tuple[float, ...] = ()
    model: Optional[Glomo] = field(default=None, repr=False)  # the trained model, eval mode

    def format(self) -> str:
        r, u = self.recovery, self.recovery_untrained
        l, h = self.chosen
        layers = ", ".join(f"layer {i}: {v:.3f}" for i, v in enumerate(r.per_layer.tolist()))
        before = ", ".join(f"{v:.3f}" for v in u.per_layer.tolist())
        return "\n".join([
            f"trained {self.seconds:.0f} s; test loss {self.initial_test_loss:.3f} (untrained) "
            f"-> {self.final_test_loss:.3f}",
            f"precision@1 of the heaviest incoming edge at {r.num_dependencies} planted "
            f"dependencies (held-out test sequences):",
            f"  graph chosen on validation (layer {l}, head {h}):  {self.chosen_precision:.3f}",
            f"  head-averaged graph per layer:              {layers}",
            f"  baseline, uniform over allowed sources:     {r.uniform:.3f}",
            f"  baseline, previous unit:                    {r.previous_token:.3f}",
            f"  before training (same graph; head-averaged): "
            f"{float(u.per_graph[l, h]):.3f}; {before}",
            "forward graph density (edges / allowed pairs) per layer: "
            + ", ".join(f"{d:.3f}" for d in self.density),
        ])

    def to_dict(self) -> Dict[str, Any]:
        def rep(r: RecoveryReport):
            return {k: v.tolist() if torch.is_tensor(v) else v for k, v in vars(r).items()}
        return dict(initial_test_loss=self.initial_test_loss, final_test_loss=self.final_test_loss,
                    chosen_layer=self.chosen[0], chosen_head=self.chosen[1],
                    chosen_precision=self.chosen_precision, recovery=rep(self.recovery),
                    recovery_untrained=rep(self.recovery_untrained), seconds=self.seconds,
                    density=list(self.density))


@torch.no_grad()
def _evaluate(model, test_batch):
    model.eval()
    loss = float(model(test_batch.x, test_batch.batch).loss)
    graphs = model.graphs(test_batch.x, test_batch.batch).forward
    return loss, planted_source_recovery(graphs, test_batch.source), tuple(graphs.density())


def run_quickstart(config: Optional[QuickstartConfig] = None) -> QuickstartResult:
    """Pretrain GLoMo on the synthetic corpus and measure planted-source recovery (``None``:
    the default :class:`QuickstartConfig`)."""
    config = QuickstartConfig() if config is None else config
    config.validate()
    if config.steps * config.batch_size > MAX_SEQUENCES:  # the shuffled index is allocated
        raise ValueError(f"steps x batch_size = {config.steps * config.batch_size} sequences; at "
                         f"most {MAX_SEQUENCES} (the quickstart corpus is generated per run)")
    if config.graph_warmup_steps >= config.steps:
        warnings.warn(f"graph_warmup_steps ({config.graph_warmup_steps}) >= steps "
                      f"({config.steps}): the graph predictor stays frozen, so the scores "
                      "are those of its random initialisation", RuntimeWarning, stacklevel=2)
    pl.seed_everything(config.seed, verbose=False)
    train = PlantedDependencyCorpus(num_sequences=config.steps * config.batch_size,
                                    seed=config.seed, **config.corpus)
    valid_batch, test_batch = (
        next(iter(DataLoader(PlantedDependencyCorpus(num_sequences=config.test_sequences,
                                                     seed=config.seed, start=start,
                                                     **config.corpus),
                             batch_size=config.test_sequences)))
        for start in (VALID_START, TEST_START))
    module = GlomoPretraining(num_tokens=train.num_tokens, **config.model, lr=config.lr,
                              graph_lr_scale=config.graph_lr_scale,
                              graph_warmup_steps=config.graph_warmup_steps)
    initial_loss, untrained, _ = _evaluate(module.model, test_batch)
    module.model.train()  # Lightning keeps the modes it finds
    logger = pl.loggers.CSVLogger(config.output_dir, name="quickstart") if config.output_dir \
        else False
    trainer = checked_lightning(f"accelerator {config.accelerator!r}", lambda: pl.Trainer(
        max_steps=config.steps, accelerator=config.accelerator, devices=1,
        gradient_clip_val=config.grad_clip, logger=logger, enable_checkpointing=False,
        enable_model_summary=False, enable_progress_bar=config.progress_bar,
        log_every_n_steps=10, num_sanity_val_steps=0))
    start = time.perf_counter()
    with quiet_lightning():
        trainer.fit(module, DataLoader(train, batch_size=config.batch_size, shuffle=True))
    seconds = time.perf_counter() - start
    final_loss, recovery, density = _evaluate(module.model, test_batch)
    layer, head, _ = _evaluate(module.model, valid_batch)[1].best
    result = QuickstartResult(initial_loss, final_loss, (layer, head),
                              float(recovery.per_graph[layer, head]), recovery, untrained, seconds,
                              density, module.model.eval())
    if config.output_dir:
        write_json(os.path.join(config.output_dir, "quickstart.json"),
                   dict(config=asdict(config), result=result.to_dict()))
        predictor = module.model.to_pretrained(train.vocab.tokens())
        save_pretrained(predictor, predictor_dir(config.output_dir))
    return result
