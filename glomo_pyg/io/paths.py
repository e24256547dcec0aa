"""Checks on output paths, made before any long work starts, and opening input files
that must be regular files (never a FIFO or a device, which could block a read forever)."""
from __future__ import annotations

import contextlib
import os
import stat
from typing import IO, Iterator, Optional, Union


def check_output_file(path: str) -> None:
    """Raise :class:`ValueError` if ``path`` cannot be written as a file: it is a folder
    or not a regular file, a folder on its way is a file, or its folder is read-only."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):  # the folders to be created
        parent = os.path.dirname(parent)
    problem = (f"{path} is a directory; give a file name" if os.path.isdir(path) else
               f"{path} is not a regular file (a FIFO, device or socket); give a file name"
               if os.path.exists(path) and not os.path.isfile(path) else
               f"{path}: {parent} is a file, not a folder" if not os.path.isdir(parent) else
               f"{path}: {parent} is not writable" if not os.access(parent, os.W_OK) else None)
    if problem is not None:
        raise ValueError(problem)


def check_output_folder(path: str) -> None:
    """Raise :class:`ValueError` if ``path`` exists and is not a folder."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{path} is a file, not a folder")


class NotRegularFileError(ValueError):
    """A file to read is a FIFO, device, socket or folder (reading could block forever)."""


_READ_FLAGS = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0) | \
    getattr(os, "O_NONBLOCK", 0)  # opening a FIFO must not wait for a writer


def _kind(mode: int) -> str:
    return "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) \
        else "a device or socket"


def open_regular(path: Union[str, os.PathLike], what: str = "file",
                 dir_fd: Optional[int] = None) -> int:
    """A read-only descriptor of the regular file ``path`` (relative to ``dir_fd`` when
    given), opened without blocking and checked by ``fstat`` on the descriptor itself.

    Raises:
        NotRegularFileError: ``path`` is a FIFO, device, socket or folder.
    """
    fd = os.open(path, _READ_FLAGS, dir_fd=dir_fd)
    with contextlib.ExitStack() as closing:
        closing.callback(os.close, fd)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(f"{path} is {_kind(mode)}, not a regular file: give the "
                                      f"{what} itself (reading it could block forever)")
        if hasattr(os, "set_blocking"):  # ordinary reads from here on
            os.set_blocking(fd, True)
        closing.pop_all()
    return fd


def check_input_path(path: Union[str, os.PathLike], what: str) -> None:
    """Refuse, before any work, an input ``path`` (a file or a folder) that names a FIFO,
    device or socket (:class:`NotRegularFileError`); a missing path is left to the reader."""
    try:
        mode = os.stat(path).st_mode  # (stat never opens: it cannot block on a FIFO)
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise NotRegularFileError(f"{what} {path} is {_kind(mode)}, not a regular file or "
                                  "folder: give the file or folder itself (reading it could "
                                  "block forever)")


def open_regular_file(path: Union[str, os.PathLike], mode: str = "rb", what: str = "file",
                      encoding: Optional[str] = None) -> IO:
    """:func:`open_regular` as a file object (``mode`` ``'rb'`` or ``'r'``)."""
    return os.fdopen(open_regular(path, what), mode, encoding=encoding)


class FolderLockedError(OSError):
    """Another process holds the lock of the folder it writes into."""


LOCK_NAME = ".glomo.lock"


@contextlib.contextmanager
def locked_folder(folder: Union[str, os.PathLike], what: str = "run") -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``folder/.glomo.lock`` (the folder is created) for
    the ``with`` block; a second holder fails at once with :class:`FolderLockedError`.
    The file stays (removing it would let two processes lock two different files)."""
    import fcntl  # (POSIX: the only platforms glomo pretrain runs on)

    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise FolderLockedError(
            f"{folder} is locked: another {what} is writing into it ({path} is held). "
            "Wait for it to finish, or choose another output folder") from None
    try:
        yield
    finally:
        os.close(fd)  # (closing releases the lock)
