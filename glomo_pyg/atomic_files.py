"""Writing a file so that a reader (or a restart after a crash) sees either the old
file or the complete new one, never a part.

:func:`atomic_write` writes into a fresh temporary file beside the target (created with
``O_EXCL``, so it never follows a planted link), flushes and ``fsync``\\ s it, renames it
over the target (:func:`os.replace`: atomic on POSIX, and it replaces a link at the
target instead of following it), then ``fsync``\\ s the folder so the rename itself
survives a power loss. A write that fails or is interrupted removes its temporary file
and leaves the target as it was. Temporary files are named ``.<name>.<random>.tmp``.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import IO, Iterator, Optional


def umask() -> int:
    """The process's file-creation mask (read without changing it for long)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_folder(folder: str) -> None:
    """Flush a folder's entries (renames, new files) to disk, where the file system
    allows it (some cannot open or sync a folder: then nothing happens)."""
    if os.name != "posix":
        return
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_write(path, mode: str = "w", encoding: Optional[str] = "utf-8",
                 fsync: bool = True) -> Iterator[IO]:
    """A file object to write ``path`` through, atomically (module docstring).

    ``mode`` is ``'w'`` (text, ``encoding``) or ``'wb'``. The new file gets the
    permissions :func:`open` would give it (``0o666`` less the umask). ``fsync=False``
    skips both syncs (the rename stays atomic, but may not survive a power loss): for
    scratch files only.

    Example::

        with atomic_write("scores.json") as fh:
            json.dump(scores, fh)
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=folder)
    try:
        with os.fdopen(fd, mode, **({"encoding": encoding} if mode == "w" else {})) as fh:
            yield fh
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp's 0600, widened as open() would
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if fsync:
        fsync_folder(folder)
