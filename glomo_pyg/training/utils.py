"""Helpers shared by the training loops."""
from __future__ import annotations

import contextlib
import logging


@contextlib.contextmanager
def quiet_lightning():
    """Hide Lightning's informational banners (device summary, tips) in this job's output."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
