"""How glomo_pyg reports: log records of the loggers named after its modules
(``glomo_pyg.<module>``, INFO for progress and summaries, WARNING for what needs a look),
never ``print``. The ``glomo_pyg`` logger holds a :class:`logging.NullHandler`, so that the
library alone writes nothing; an application routes or silences everything through
``logging.getLogger("glomo_pyg")`` (docs/training.md, "Logging"). Warnings stay
:func:`warnings.warn`."""
from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from typing import Callable, Iterator, Optional

#: The package logger: every module's logger is a child of it.
PACKAGE = "glomo_pyg"


class LineFormatter(logging.Formatter):
    """The message alone, ``warning: `` before a WARNING or worse: the lines the ``glomo``
    command printed before its messages became log records."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        return f"warning: {text}" if record.levelno >= logging.WARNING else text


class _StdoutHandler(logging.StreamHandler):
    """To the ``sys.stdout`` of the moment (a notebook or a test may replace it)."""

    @property  # type: ignore[override]
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:  # (set by StreamHandler.__init__: ignored)
        pass


def line_handler() -> logging.Handler:
    """A handler printing each record as one plain line on standard output."""
    handler = _StdoutHandler()
    handler.setFormatter(LineFormatter())
    return handler


@contextlib.contextmanager
def logging_to(handler: logging.Handler, level: int = logging.INFO,
               propagate: Optional[bool] = None) -> Iterator[None]:
    """``handler`` on the ``glomo_pyg`` logger, at ``level`` (and ``propagate``, if given),
    for the duration of the block; the logger is restored after it."""
    package = logging.getLogger(PACKAGE)
    saved = package.level, package.propagate
    package.addHandler(handler)
    package.setLevel(level)
    if propagate is not None:
        package.propagate = propagate
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(saved[0])
        package.propagate = saved[1]


def logging_configured(name: str = PACKAGE) -> bool:
    """Whether the application has set up logging for the logger ``name``: a level on it
    or on one of its packages, or a handler (other than the package's NullHandler) on its
    way to the root logger."""
    logger: Optional[logging.Logger] = logging.getLogger(name)
    root = logging.getLogger()
    while logger is not None:
        if logger is not root and logger.level != logging.NOTSET:
            return True  # (the root's level is always set: WARNING unless changed)
        if any(not isinstance(h, logging.NullHandler) for h in logger.handlers):
            return True
        logger = logger.parent if logger.propagate else None
    return False


class _Forward(logging.Handler):
    def __init__(self, log: Callable[[str], None]):
        super().__init__()
        self.log = log
        self.setFormatter(LineFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        self.log(self.format(record))


def lines_to(log: Callable[[str], None]) -> logging.Handler:
    """A handler passing each record's line (:class:`LineFormatter`) to ``log``: a
    script's own printing function, or the deprecated ``log=`` arguments."""
    return _Forward(log)


def warn_log_argument(function: str) -> None:
    """The DeprecationWarning of a ``log=`` argument, blaming the caller of ``function``."""
    warnings.warn(f"{function}(log=...) is deprecated: its messages are log records of the "
                  f"'{PACKAGE}' logger; route them with logging.getLogger('{PACKAGE}') "
                  "(docs/training.md, 'Logging')", DeprecationWarning, stacklevel=3)


@contextlib.contextmanager
def job_output(log: Optional[Callable[[str], None]] = None) -> Iterator[None]:
    """Where the messages of a training job (``run_pretraining``, ``pretrain_moco``) go for
    its duration. The rule (docs/training.md, "Logging"):

    - logging set up by the application (:func:`logging_configured`): as configured;
    - nothing set up (a plain script or notebook): INFO records on standard output, one
      plain line each, as Lightning's ``Trainer`` reports by default;
    - a deprecated ``log`` callable: every INFO record's line to it, and only to it.
    """
    if log is not None:
        with logging_to(lines_to(log), propagate=False):
            yield
    elif not logging_configured():
        with logging_to(line_handler()):
            yield
    else:
        yield
