"""How much memory this machine has, for refusing inputs that could never fit."""
from __future__ import annotations

import os
from typing import Optional


def physical_memory() -> Optional[int]:
    """Bytes of physical memory, or ``None`` where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
