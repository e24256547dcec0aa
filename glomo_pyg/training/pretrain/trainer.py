"""The Lightning ``Trainer`` of a pretraining run, and checks before any corpus work."""
from __future__ import annotations

import csv
import os
from typing import Any, Dict, List, Optional, cast

import lightning.pytorch as pl
import torch

from glomo_pyg.io.memory import physical_memory
from glomo_pyg.training.checkpoints import AtomicCheckpointIO, newest_checkpoint_file
from glomo_pyg.training.graph_statistics import GraphStatisticsCallback
from glomo_pyg.training.pretrain.callbacks import FinalCheckpoint, RandomStateCheckpoint
from glomo_pyg.training.pretrain.config import (
    IMAGE_FORMATS,
    PretrainConfig,
    TrainConfig,
    short_repr,
)
from glomo_pyg.training.pretrain.module import GlomoPretraining
from glomo_pyg.training.utils import checked_lightning, default_precision


def _precision(train: TrainConfig) -> str:
    return default_precision(train.precision, train.accelerator)


def _continued_csv_logger(save_dir: str, start_step: int):
    """Lightning's :class:`~lightning.pytorch.loggers.CSVLogger` in ``save_dir/logs/version_0``
    whose ``metrics.csv`` a resumed run continues: the rows logged before the checkpoint of
    ``start_step`` are kept (Lightning's writer deletes the file), those of the steps
    trained again after it are dropped, so that the file equals an uninterrupted run's."""

    def before_checkpoint(row: Dict[str, str]) -> bool:
        # the graph statistics of step k are logged at step k, before its checkpoint;
        # Lightning logs a batch's training metrics (train_loss) at the count of steps
        # before it, so step k's row holding train_loss is the first batch after it
        step = float(row.get("step") or "inf")
        return step < start_step or (step == start_step and not row.get("train_loss"))

    from lightning.fabric.loggers.logger import rank_zero_experiment
    from lightning.pytorch.loggers import CSVLogger
    from lightning.pytorch.loggers.csv_logs import ExperimentWriter

    class ContinuedWriter(ExperimentWriter):
        def _check_log_dir_exists(self) -> None:  # (Lightning's removes metrics.csv)
            if not self._fs.isfile(self.metrics_file_path):
                return
            with self._fs.open(self.metrics_file_path, "r", newline="") as fh:
                reader = csv.DictReader(fh)
                rows = [r for r in reader if before_checkpoint(r)]
                self.metrics_keys = list(reader.fieldnames or [])
            with self._fs.open(self.metrics_file_path, "w", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=self.metrics_keys)
                writer.writeheader()
                writer.writerows(rows)

    class ContinuedCSVLogger(CSVLogger):
        @property
        @rank_zero_experiment
        def experiment(self) -> Any:  # (Lightning's: a writer, or a dummy off rank 0)
            if self._experiment is None:
                self._fs.makedirs(self.root_dir, exist_ok=True)
                self._experiment = ContinuedWriter(log_dir=self.log_dir)
            return self._experiment

    return ContinuedCSVLogger(save_dir, name="logs", version=0)


def build_trainer(config: PretrainConfig, extra_callbacks: Optional[List[pl.Callback]] = None,
                  start_step: int = 0, progress_bar: Optional[bool] = None) -> pl.Trainer:
    """The run's trainer; ``start_step``: the step a resumed run continues from (its logs
    continue in the same folder, ``<output_dir>/logs/version_0``); ``progress_bar``:
    whether Lightning draws its bar (default: ``train.progress_bar``)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    t = config.train
    checkpoints = ModelCheckpoint(dirpath=os.path.join(config.output_dir, "checkpoints"),
                                  filename="step{step}", auto_insert_metric_name=False,
                                  every_n_train_steps=t.checkpoint_every, save_top_k=-1,
                                  save_last=True, enable_version_counter=False)
    # (no version counter: a resumed run rewrites last.ckpt and step<N>.ckpt, never
    # writing 'last-v1.ckpt' beside a damaged 'last.ckpt')
    callbacks = [checkpoints, GraphStatisticsCallback(t.graph_stats_every), RandomStateCheckpoint(),
                 FinalCheckpoint(os.path.join(config.output_dir, "checkpoints", "last.ckpt"),
                                  t.checkpoint_every), *(extra_callbacks or [])]

    def build() -> pl.Trainer:
        from lightning.pytorch.loggers import TensorBoardLogger

        # one folder per run, whatever its resumes (TensorBoard adds an events file to it)
        logger = TensorBoardLogger(config.output_dir, name="logs", version=0) \
            if t.logger == "tensorboard" else _continued_csv_logger(config.output_dir, start_step)
        return pl.Trainer(max_steps=t.max_steps, accelerator=t.accelerator, devices=t.devices,
                          num_nodes=t.num_nodes, strategy=t.strategy,
                          precision=cast(Any, _precision(t)),  # (Lightning checks the name)
                          gradient_clip_val=t.grad_clip or None, logger=logger,
                          callbacks=callbacks, log_every_n_steps=t.log_every,
                          val_check_interval=t.validate_every, check_val_every_n_epoch=None,
                          enable_progress_bar=t.progress_bar if progress_bar is None else
                          progress_bar, enable_model_summary=False,
                          use_distributed_sampler=False, default_root_dir=config.output_dir,
                          plugins=[AtomicCheckpointIO()])

    return checked_lightning(f"train settings (logger {t.logger!r}, accelerator "
                             f"{t.accelerator!r}, devices {t.devices!r}, strategy "
                             f"{t.strategy!r}, precision {_precision(t)!r})", build)


def last_checkpoint(output_dir: str) -> Optional[str]:
    """The run's newest checkpoint file by name, or None."""
    return newest_checkpoint_file(os.path.join(output_dir, "checkpoints"))


def is_launcher_child() -> bool:
    """True in the processes Lightning's DDP launcher starts besides the first."""
    return int(os.environ.get("LOCAL_RANK", 0)) > 0 or int(os.environ.get("NODE_RANK", 0)) > 0


def check_model_builds(config: PretrainConfig) -> None:
    """Build the model on the meta device: bad settings fail before the corpus is read."""
    c = config.corpus
    if c.format in IMAGE_FORMATS:
        kwargs = dict(config.model, modality="image", in_channels=3, height=c.crop or 32,
                      width=c.crop or 32)
    else:  # (the vocabulary is not read yet; max_size is only its cap)
        kwargs = dict(config.model, num_tokens=8, padding_idx=0)
    problem: Optional[str]
    try:
        with torch.device("meta"):  # shapes only: no memory, however wide the settings
            module = GlomoPretraining(**kwargs)
    except (TypeError, ValueError, RuntimeError) as err:  # (RuntimeError: an overflow)
        first = (str(err).strip() or type(err).__name__).splitlines()[0]  # (not C++ frames)
        problem = f"cannot be built: {first[:300]}"
    else:
        size = sum(p.numel() * p.element_size() for p in module.parameters())
        memory = physical_memory()
        problem = None if memory is None or size <= memory else (
            f"give {sum(p.numel() for p in module.parameters()):,} parameters "
            f"({size / 2**30:.1f} GiB), more than this machine's memory "
            f"({memory / 2**30:.1f} GiB); lower hidden_channels or num_layers")
    if problem:
        raise ValueError(f"model settings {short_repr(config.model)} {problem}")


# (Lightning's own environment reads the node rank from NODE_RANK, GROUP_RANK or RANK)
_CLUSTER_ENVIRONMENTS = (("MASTER_ADDR", "NODE_RANK"), ("MASTER_ADDR", "GROUP_RANK"),
                         ("MASTER_ADDR", "RANK"), ("SLURM_NTASKS",), ("TORCHELASTIC_RUN_ID",),
                         ("OMPI_COMM_WORLD_SIZE",), ("PMI_SIZE",), ("LSB_JOBID",))


def check_trainer_builds(config: PretrainConfig) -> None:
    """Build the trainer once; refuse what would hang or fail at the first step."""
    t = config.train
    if t.num_nodes > 1 and not any(all(k in os.environ for k in keys)
                                   for keys in _CLUSTER_ENVIRONMENTS):
        raise ValueError(f"train.num_nodes is {t.num_nodes}, but no cluster environment is set "
                         "(MASTER_ADDR with NODE_RANK, GROUP_RANK or RANK; SLURM, torchrun, MPI "
                         "or LSF): started on one machine, the run would wait for the other "
                         "nodes indefinitely")
    from lightning.pytorch.accelerators import CPUAccelerator

    trainer = build_trainer(config)
    if isinstance(trainer.accelerator, CPUAccelerator) and trainer.precision == "16-true":
        raise ValueError("train.precision '16-true' is not supported on the CPU (float16 "
                         "training diverges there); use '32-true' or 'bf16-mixed'")
