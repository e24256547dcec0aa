"""How much memory this machine has, for refusing inputs that could never fit."""
import os


def physical_memory() -> int | None:
    """Bytes of physical memory, or ``None`` where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
