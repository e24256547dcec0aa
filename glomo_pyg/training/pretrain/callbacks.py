"""The Lightning callbacks of a pretraining run that make a resume checked and exact."""
from __future__ import annotations

import random
from typing import Any, Dict

import lightning.pytorch as pl
import numpy as np
import torch

from glomo_pyg.training.checkpoints import CHECKPOINT_KEY


class RunRecord(pl.Callback):
    """Writes the corpus fingerprint and the run's settings into every checkpoint."""

    def __init__(self, fingerprint: Dict[str, Any], settings: Dict[str, Any]):
        self.fingerprint, self.settings = fingerprint, settings

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
