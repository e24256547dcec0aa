"""What a time-limited GPU job allows: one *allocation* of device time, spent in *calls*
(one command each) that carry the tree and some folders there and bring files back.

Every limit is a setting: :class:`JobLimits` holds today's values as defaults, and an
environment variable ``GLOMO_GPU_<FIELD>`` (e.g. ``GLOMO_GPU_ALLOCATION_S=1800``)
overrides one for a provider or a grant with other limits. The module's constants are
the current settings, read once at import.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Mapping, Optional

MIB = 1 << 20
ENV_PREFIX = "GLOMO_GPU_"
BUDGET_MARGIN_S = 30  # a call's --budget-s stays this far under its timeout: the run's
                      # own start and the transfer of what comes back


@dataclasses.dataclass(frozen=True)
class JobLimits:
    """The limits of one GPU allocation and of its calls (seconds and bytes)."""

    allocation_s: float = 900.0  # device time of one allocation: starts, calls, idle
    startup_s: float = 120.0     # a cold machine's start (1-2 min), counted in it
    call_s: float = 540.0        # a call's timeout: under the per-call maximum (600 s) so
                                 # that a call ending early leaves time for another
    gap_s: float = 20.0          # from one call's end to the next call's start on a warm
                                 # machine (the tree is sent again)
    warm_s: float = 30.0         # a machine stays warm this long after a call
    min_call_s: float = 90.0     # a shorter call is not worth its transfers
    carry_bytes: int = 64 * MIB        # the working tree plus carried folders, per call
    return_files: int = 8              # files that come back from the output folder
    return_file_bytes: int = 16 * MIB  # each of them
    return_total_bytes: int = 64 * MIB  # all of them together
    return_depth: int = 2              # OUT/a/b/file comes back, OUT/a/b/c/file does not

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not value == value or value < 0 or value == float("inf"):
                raise ValueError(f"GPU job limit {field.name} must be a finite number >= 0, "
                                 f"got {value!r}")
        if self.call_s < 2 * BUDGET_MARGIN_S:
            raise ValueError(f"GPU job limit call_s must be at least {2 * BUDGET_MARGIN_S} s, "
                             f"got {self.call_s}")

    @property
    def call_budget_s(self) -> float:
        """A full call's ``--budget-s``."""
        return self.call_s - BUDGET_MARGIN_S


def from_environment(environ: Optional[Mapping[str, str]] = None) -> JobLimits:
    """:class:`JobLimits` with every ``GLOMO_GPU_<FIELD>`` of ``environ`` (default
    ``os.environ``) applied; a value that is not a number is refused, naming it."""
    environ = os.environ if environ is None else environ
    values = {}
    for field in dataclasses.fields(JobLimits):
        name = ENV_PREFIX + field.name.upper()
        if name not in environ:
            continue
        text = environ[name]
        try:
            values[field.name] = int(text) if field.type == "int" else float(text)
        except ValueError:
            raise ValueError(f"{name}={text!r} is not a number (GPU job limit "
                             f"{field.name})") from None
    return JobLimits(**values)


LIMITS = from_environment()
CARRY_BYTES = LIMITS.carry_bytes
RETURN_FILES = LIMITS.return_files
RETURN_FILE_BYTES = LIMITS.return_file_bytes
RETURN_TOTAL_BYTES = LIMITS.return_total_bytes
RETURN_DEPTH = LIMITS.return_depth
CALL_SECONDS = int(LIMITS.call_s)
NAME = re.compile(r"^[A-Za-z0-9._-]+$")  # file and folder names that come back
