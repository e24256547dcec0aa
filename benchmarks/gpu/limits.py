"""What one GPU call may carry and return (the lending workplace's limits)."""
from __future__ import annotations

import re

MIB = 1 << 20
CARRY_BYTES = 64 * MIB          # the working tree plus carried folders, per call
RETURN_FILES = 8                # files that come back from the output folder
RETURN_FILE_BYTES = 16 * MIB    # each of them
RETURN_TOTAL_BYTES = 64 * MIB   # all of them together
RETURN_DEPTH = 2                # OUT/a/b/file comes back, OUT/a/b/c/file does not
CALL_SECONDS = 540              # one call's timeout_s: with a machine's start (1-2 min) it
                                # leaves a retry only when the call ends early; a call's
                                # --budget-s stays 30 s under the limit it gets
NAME = re.compile(r"^[A-Za-z0-9._-]+$")  # file and folder names that come back
