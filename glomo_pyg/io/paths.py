"""Checks on output paths, made before any long work starts, and opening input files
that must be regular files (never a FIFO or a device, which could block a read forever)."""
from __future__ import annotations

import contextlib
import os
import stat
from typing import IO, BinaryIO, Iterator, Optional, Union


def check_output_file(path: Union[str, os.PathLike], name: str = "",
                      example: str = "") -> str:
    """``path`` as a string if it can be written as a file, else a :class:`ValueError`
    (prefixed with ``name``, e.g. ``'--output'``; ``example``: a file name to suggest).
    Refused before any work: an empty path, a NUL in it, a final separator, an existing
    folder or non-regular file (writing would replace it), a file on the way, a read-only
    folder. Missing folders are fine (they are created)."""
    path = os.fspath(path)
    problem = _output_file_problem(path, "; give a file name" +
                                   (f" (e.g. {example})" if example else ""))
    if problem is not None:
        raise ValueError(f"{name} {problem}" if name else problem)
    return path


def _output_file_problem(path: str, hint: str) -> Optional[str]:
    if not path:
        return "is empty" + hint
    if "\0" in path:
        return f"holds a NUL character: {path!r} is not a file name"
    if os.path.isdir(path):
        return f"{path} is a directory" + hint
    if path.endswith((os.sep, os.altsep or os.sep)):
        return f"{path} ends with a separator" + hint
    if os.path.lexists(path) and not os.path.isfile(path):
        return f"{path} is not a regular file (a FIFO, device or socket)" + hint
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent):  # the folders that will be created
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{path}: {parent} is a file, not a folder"
    if not os.access(parent, os.W_OK):
        return f"{path}: {parent} is not writable"
    return None


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


def descriptor_path(fd: int, path: Union[str, os.PathLike]) -> str:
    """A name that opens the very file ``fd`` holds (``/dev/fd/N`` where the system has it,
    else ``path``), for readers that take a file name (safetensors' ``safe_open``): they
    then read the file :func:`open_regular` checked, not whatever the name points at
    later."""
    return f"/dev/fd/{fd}" if os.path.isdir("/dev/fd") else os.fspath(path)


def open_input_file(path: Union[str, os.PathLike], name: str) -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file (not a FIFO, device,
    socket or folder, refused at once without blocking, nor a name with a NUL)."""
    path = os.fspath(path)
    try:
        return os.fdopen(open_regular(path, name), "rb")
    except ValueError:  # NotRegularFileError, or os.open refusing a NUL
        problem = f"holds a NUL character: {path!r} is not a file name" if "\0" in path else \
            f"{path} is a directory, not a file" if os.path.isdir(path) else \
            f"{path} is not a regular file (a FIFO, device or socket)"
        raise ValueError(f"{name} {problem}") from None


def check_input_file(path: Union[str, os.PathLike], name: str) -> str:
    """Refuse ``path`` unless it is a regular file (see :func:`open_input_file`)."""
    path = os.fspath(path)
    open_input_file(path, name).close()
    return path


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
