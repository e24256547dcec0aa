"""Checks on output paths, made before any long work starts, and opening input files
that must be regular files (never a FIFO or a device, which could block a read forever)."""
from __future__ import annotations

import contextlib
import os
import stat
from typing import IO, Iterator, Optional, Union


def check_output_file(path: str) -> None:
    """Raise :class:`ValueError` if ``path`` cannot be written as a file: it is a
    directory or another non-regular file (written files replace what is there, so a
    device such as ``/dev/null`` would be lost), a folder on its way is a file, or the
    nearest existing folder is not writable. Missing folders are fine (they are created
    when the file is written)."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):  # the folders to be created
        parent = os.path.dirname(parent)
    problem = (f"{path} is a directory; give a file name" if os.path.isdir(path) else
               f"{path} is not a regular file (a FIFO, device or socket); give a file name"
               if os.path.exists(path) and not os.path.isfile(path) else  # (it would be lost)
               f"{path}: {parent} is a file, not a folder" if not os.path.isdir(parent) else
               f"{path}: {parent} is not writable" if not os.access(parent, os.W_OK) else None)
    if problem is not None:
        raise ValueError(problem)


def check_output_folder(path: str) -> None:
    """Raise :class:`ValueError` if ``path`` exists and is not a folder."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{path} is a file, not a folder")


class NotRegularFileError(ValueError):
    """A path given where a file is read names a FIFO, device, socket or folder: reading it
    could block forever (a FIFO without a writer) or never end (``/dev/zero``)."""


_READ_FLAGS = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0) | \
    getattr(os, "O_NONBLOCK", 0)  # opening a FIFO must not wait for a writer


def open_regular(path: Union[str, os.PathLike], what: str = "file",
                 dir_fd: Optional[int] = None) -> int:
    """A read-only descriptor of the regular file ``path`` (relative to ``dir_fd`` when
    given), opened without blocking and checked with ``fstat`` on the descriptor itself
    (no window for a swap between check and open).

    Raises:
        NotRegularFileError: ``path`` is a FIFO, device, socket or folder.
        FileNotFoundError / OSError: as :func:`os.open` raises them.
    """
    fd = os.open(path, _READ_FLAGS, dir_fd=dir_fd) if dir_fd is not None else \
        os.open(path, _READ_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) \
                else "a device or socket"
            raise NotRegularFileError(f"{path} is {kind}, not a regular file: give the {what} "
                                      "itself (reading it could block forever)")
        if hasattr(os, "set_blocking"):  # ordinary reads from here on
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_input_path(path: Union[str, os.PathLike], what: str) -> None:
    """Refuse, before any work, an input ``path`` (a file or a folder of files) that names
    a FIFO, device or socket: reading it would block or never end. A missing path is
    left to the reader, which says so.

    Raises:
        NotRegularFileError: ``path`` is neither a regular file nor a folder.
    """
    try:
        mode = os.stat(path).st_mode  # (stat never opens: it cannot block on a FIFO)
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise NotRegularFileError(f"{what} {path} is {kind}, not a regular file or folder: "
                                  "give the file or folder itself (reading it could block "
                                  "forever)")


def open_regular_file(path: Union[str, os.PathLike], mode: str = "rb", what: str = "file",
                      encoding: Optional[str] = None) -> IO:
    """:func:`open_regular` as a file object (``mode`` ``'rb'`` or ``'r'``)."""
    return os.fdopen(open_regular(path, what), mode, encoding=encoding)


class FolderLockedError(OSError):
    """Another process holds the folder's lock: two runs writing into one folder would
    overwrite each other's checkpoints and files."""


LOCK_NAME = ".glomo.lock"


@contextlib.contextmanager
def locked_folder(folder: Union[str, os.PathLike], what: str = "run") -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``folder/.glomo.lock`` (the folder is created) for
    the ``with`` block; a second holder fails at once. The lock dies with the process (a
    crash or kill frees it), so it never needs clearing by hand; the file is left in
    place (removing it would let two processes lock two different files).

    Raises:
        FolderLockedError: another process holds the lock.
    """
    import fcntl  # (POSIX: the only platforms glomo pretrain runs on)

    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderLockedError(
                f"{folder} is locked: another {what} is writing into it ({path} is held). "
                "Wait for it to finish, or choose another output folder") from None
        yield
    finally:
        os.close(fd)  # (closing releases the lock)
