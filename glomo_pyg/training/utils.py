"""Helpers shared by the training loops."""
from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Callable, TypeVar

T = TypeVar("T")

# Lightning's warnings that do not apply to these jobs (in-memory data needs no loader
# workers; a resumed run writes into its own checkpoint folder; a frozen predictor is
# meant to stay in eval mode; short runs log less often than Lightning's default)
_NOT_APPLICABLE = ("does not have many workers", "isinstance.treespec, LeafSpec",
                   "Checkpoint directory .* exists and is not empty",
                   "Total length of .* across ranks is zero", "module.s. in eval mode",
                   "smaller than the logging interval")


@contextlib.contextmanager
def quiet_lightning():
    """Hide Lightning's banners and its warnings that do not apply here."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
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
