"""The Lightning callbacks of a pretraining run that make a resume checked and exact."""
from __future__ import annotations

import math
import random
import time
from typing import Any, Dict, Optional

import lightning.pytorch as pl
import numpy as np
import torch

from glomo_pyg.training.checkpoints import CHECKPOINT_KEY


class RunRecord(pl.Callback):
    """Writes the corpus fingerprint and the run's settings into every checkpoint, and
    keeps the run's training time across resumes (:meth:`seconds`: the time of every
    earlier part, from the checkpoint's callback state, plus this one's)."""

    def __init__(self, fingerprint: Dict[str, Any], settings: Dict[str, Any]):
        self.fingerprint, self.settings = fingerprint, settings
        self.earlier_seconds = 0.0
        self._started: Optional[float] = None

    def on_train_start(self, trainer, pl_module) -> None:
        self._started = time.time()

    def seconds(self) -> float:
        """Seconds of training so far, over every part of a resumed run."""
        now = 0.0 if self._started is None else time.time() - self._started
        return self.earlier_seconds + now

    def state_dict(self) -> Dict[str, Any]:
        return dict(seconds=self.seconds())

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        seconds = state_dict.get("seconds")
        if isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0:
            self.earlier_seconds = float(seconds)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: Dict[str, Any]) -> None:
        checkpoint[CHECKPOINT_KEY] = dict(version=2, corpus=self.fingerprint,
                                          settings=self.settings)


class FinalCheckpoint(pl.Callback):
    """Writes ``last.ckpt`` at a last step between the periodic checkpoints, inside the
    training loop so that it holds the data position."""

    def __init__(self, path: str, every: int):
        self.path, self.every = path, every

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step >= trainer.max_steps and step % self.every:
            trainer.save_checkpoint(self.path)


class RandomStateCheckpoint(pl.Callback):
    """Saves and restores the Python, NumPy, torch and CUDA random states in checkpoints."""

    def state_dict(self) -> Dict[str, Any]:
        # (NumPy's global MT19937 state is the legacy tuple, never the dict of other generators)
        state = dict(python=list(random.getstate()[1]), python_version=random.getstate()[0],
                     python_gauss=random.getstate()[2],
                     numpy=np.random.get_state()[1].tolist(),  # type: ignore[index]
                     numpy_pos=int(np.random.get_state()[2]),  # type: ignore[index]
                     torch=torch.get_rng_state())
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        random.setstate((state["python_version"], tuple(state["python"]), state["python_gauss"]))
        np.random.set_state(("MT19937", np.asarray(state["numpy"], dtype=np.uint32),
                             state["numpy_pos"], 0, 0.0))
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
