"""Stopping a training run on SIGTERM or SIGINT without losing what it learned.

:class:`GracefulInterrupt` (a Lightning callback) takes over both signals while a run
trains. The first one lets the current step finish; then the run writes a checkpoint
(atomically, at the same point of the step as the periodic checkpoints, so a resumed run
continues exactly) and stops with :class:`TrainingInterrupted`, whose ``exit_code`` is
the shell's ``128 + signal`` (143 for SIGTERM, 130 for SIGINT): ``glomo pretrain && next``
does not carry on. A second signal stops at once, without a new checkpoint.

Why not Lightning's own SIGTERM handling: Lightning 2.x raises a ``SystemExit`` with
status 0 after the step's checkpoint hook and writes no checkpoint. The callback replaces
Lightning's handler once training starts, forwards SIGTERM to the DDP launcher's
processes, and the ranks agree on stopping before the same step's checkpoint.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Dict, Optional

import lightning.pytorch as pl

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TrainingInterrupted(Exception):
    """Training stopped by a signal. ``checkpoint``: the checkpoint written at ``step``
    (None when a second signal stopped the run at once)."""

    def __init__(self, signum: int, step: int, checkpoint: Optional[str], detail: str = ""):
        self.signum, self.step, self.checkpoint = int(signum), int(step), checkpoint
        name = signal.Signals(self.signum).name
        if checkpoint:
            text = f"stopped by {name} after step {step}; checkpoint written to {checkpoint}"
        else:
            text = (f"stopped by {name}{detail} before step {step + 1} was done; no new "
                    "checkpoint (--resume continues from the last one)")
        super().__init__(text)

    @property
    def exit_code(self) -> int:
        """The status a process killed by the signal has in a shell (128 + signal)."""
        return 128 + self.signum


class GracefulInterrupt(pl.Callback):
    """See the module's description. ``install()`` before ``trainer.fit`` and
    ``restore()`` after it (both no-ops outside the main thread, where Python cannot
    handle signals). ``quiet``: do not announce the signal on stderr (the other DDP
    processes)."""

    def __init__(self, checkpoint_path: str, quiet: bool = False):
        self.checkpoint_path, self.quiet = checkpoint_path, quiet
        self.signum: Optional[int] = None
        self.count = 0  # signals received
        self._previous: Dict[int, object] = {}
        self._trainer: Optional[pl.Trainer] = None

    @staticmethod
    def _main_thread() -> bool:
        return threading.current_thread() is threading.main_thread()

    def install(self) -> None:
        if not self._main_thread():
            return
        for signum in SIGNALS:
            self._previous.setdefault(signum, signal.getsignal(signum))
            signal.signal(signum, self._handle)

    def restore(self) -> None:
        if not self._main_thread():
            return
        for signum, handler in self._previous.items():
            if handler is not None:
                signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        self.count += 1
        if self.signum is not None:
            raise KeyboardInterrupt(f"second {name}")
        self.signum = signum
        # os.write: a signal handler must not re-enter a buffered stream it interrupted
        if not self.quiet:
            os.write(2, f"\n{name} received: finishing the current step, then writing a "
                        f"checkpoint and stopping (send it again to stop at once)\n".encode())
        launcher = getattr(getattr(self._trainer, "strategy", None), "launcher", None)
        if signum == signal.SIGTERM and launcher is not None and hasattr(launcher, "kill"):
            launcher.kill(signum)  # the other DDP processes stop at the same step

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning has just put its own SIGTERM handler in place; ours decides instead
        if self._main_thread() and self._previous:
            signal.signal(signal.SIGTERM, self._handle)

    def on_train_batch_end(self, trainer: pl.Trainer, *args) -> None:
        stop = self.signum is not None
        if trainer.world_size > 1:
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if not stop:
            return
        trainer.save_checkpoint(self.checkpoint_path)  # every rank takes part; rank 0 writes
        raise TrainingInterrupted(self.signum or signal.SIGTERM, trainer.global_step,
                                  self.checkpoint_path)
