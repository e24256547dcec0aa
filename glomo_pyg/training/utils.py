"""Helpers shared by the training loops."""
from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Callable, Optional, TypeVar

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from glomo_pyg.logs import PACKAGE

T = TypeVar("T")


# (stacklevel 3: the record names the caller, past this function and Lightning's wrapper)
@rank_zero_only
def rank_zero_info(logger: logging.Logger, message: str) -> None:
    """``logger.info(message)`` in the process of global rank 0 only, so that a run of
    several processes reports once (Lightning's rank: from the launcher's environment,
    then from the strategy of the first trainer built)."""
    logger.info(message, stacklevel=3)


@rank_zero_only
def rank_zero_warning(logger: logging.Logger, message: str) -> None:
    """``logger.warning(message)`` in the process of global rank 0 only."""
    logger.warning(message, stacklevel=3)


# Lightning's warnings that do not apply to these jobs (in-memory data needs no loader
# workers; a resumed run writes into its own checkpoint folder; a frozen predictor is
# meant to stay in eval mode; short runs log less often than Lightning's default)
_NOT_APPLICABLE = ("does not have many workers", "isinstance.treespec, LeafSpec",
                   "Checkpoint directory .* exists and is not empty",
                   "Total length of .* across ranks is zero", "module.s. in eval mode",
                   "smaller than the logging interval")


@contextlib.contextmanager
def quiet_lightning():
    """Hide Lightning's banners and its warnings that do not apply here. Lightning's
    loggers are held at WARNING, or at the ``glomo_pyg`` logger's level when that is higher
    (silencing glomo_pyg silences them too), then restored."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [lg.level for lg in loggers]
    level = max(logging.WARNING, logging.getLogger(PACKAGE).getEffectiveLevel())
    for lg in loggers:
        lg.setLevel(level)
    try:
        with warnings.catch_warnings():
            for text in _NOT_APPLICABLE:
                warnings.filterwarnings("ignore", f".*{text}.*")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def checked_lightning(settings: str, build: Callable[[], T]) -> T:
    """``build()``; settings Lightning refuses raise :class:`ValueError` naming them."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    try:
        with quiet_lightning():
            return build()
    except (MisconfigurationException, TypeError, ImportError) as err:
        # (ImportError: a logger, accelerator or precision plugin whose package is missing;
        # TypeError: devices Lightning cannot parse for the accelerator)
        raise ValueError(f"{settings}: {err}") from None


def default_precision(precision: Optional[str], accelerator: str) -> str:
    """``precision`` as given, else the training jobs' default: bf16 autocast on a GPU
    (``accelerator`` ``'gpu'``/``'cuda'``, or ``'auto'`` with one present), float32
    elsewhere."""
    if precision:
        return precision
    gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and
                                             torch.cuda.is_available())
    return "bf16-mixed" if gpu else "32-true"
