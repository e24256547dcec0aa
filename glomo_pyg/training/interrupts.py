"""Stopping a training run on SIGTERM or SIGINT without losing what it learned: the
current step finishes, a checkpoint is written and :class:`TrainingInterrupted` raised; a
second signal stops at once. (Lightning 2.x's own SIGTERM handling exits with status 0
and writes no checkpoint.)"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from types import FrameType
from typing import Any, Callable, Dict, Iterator, Optional, Union

import lightning.pytorch as pl

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# what signal.getsignal returns
_Handler = Union[Callable[[int, Optional[FrameType]], Any], int, signal.Handlers, None]


class TrainingInterrupted(Exception):
    """Training stopped by a signal; ``checkpoint``: the one written at ``step``, or None."""

    def __init__(self, signum: int, step: int, checkpoint: Optional[str], detail: str = ""):
        self.signum, self.step, self.checkpoint = int(signum), int(step), checkpoint
        name = signal.Signals(self.signum).name
        super().__init__(
            f"stopped by {name} after step {step}; checkpoint written to {checkpoint}"
            if checkpoint else f"stopped by {name}{detail} before step {step + 1} was done; "
            "no new checkpoint (--resume continues from the last one)")

    @property
    def exit_code(self) -> int:
        """The status a process killed by the signal has in a shell (128 + signal)."""
        return 128 + self.signum


class GracefulInterrupt(pl.Callback):
    """Takes over SIGTERM and SIGINT while a run trains: ``install()`` before
    ``trainer.fit`` and ``restore()`` after it (no-ops outside the main thread). SIGTERM
    is forwarded to the DDP launcher's processes, and the ranks agree on the step to stop
    at. ``quiet``: do not announce the signal on stderr."""

    def __init__(self, checkpoint_path: str, quiet: bool = False):
        self.checkpoint_path, self.quiet = checkpoint_path, quiet
        self.signum: Optional[int] = None
        self.count = 0  # signals received
        self._previous: Dict[int, _Handler] = {}
        self._trainer: Optional[pl.Trainer] = None

    @staticmethod
    def _main_thread() -> bool:
        return threading.current_thread() is threading.main_thread()

    def install(self) -> None:
        for signum in SIGNALS if self._main_thread() else ():
            self._previous.setdefault(signum, signal.getsignal(signum))
            signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items() if self._main_thread() else ():
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


@contextlib.contextmanager
def interruptible(trainer: pl.Trainer, interrupt: GracefulInterrupt) -> Iterator[None]:
    """Runs the block (a ``trainer.fit``) with ``interrupt``'s handlers installed; the
    ``SystemExit`` Lightning raises after a signal becomes :class:`TrainingInterrupted`."""
    interrupt.install()
    try:
        yield
    except SystemExit:
        # Lightning exits after a KeyboardInterrupt (a second signal) and after its
        # SIGTERMException (a signal during the sanity check)
        if interrupt.signum is None:
            raise
        detail = " (sent twice: stop at once)" if interrupt.count > 1 else ""
        raise TrainingInterrupted(interrupt.signum, trainer.global_step, None,
                                  detail) from None
    finally:
        interrupt.restore()
