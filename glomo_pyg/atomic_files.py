"""Writing a file or a whole folder so that a reader (or a restart after a crash) sees
either the old one or the complete new one, never a part: each is written beside the
target (a file with ``O_EXCL``: never through a planted link), synced, then renamed
over it."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import warnings
from pathlib import Path
from typing import IO, Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union


def umask() -> int:
    """The process's file-creation mask (read without changing it for long)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_folder(folder: Union[str, os.PathLike]) -> None:
    """Flush a folder's entries (renames, new files) to disk where the system allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_write(path, mode: str = "w", encoding: Optional[str] = "utf-8") -> Iterator[IO]:
    """A file object to write ``path`` through, atomically (``mode`` ``'w'``: text in
    ``encoding``, or ``'wb'``), with the permissions :func:`open` would give it; a failed
    write leaves ``path`` as it was and no temporary file (``.<name>.<random>.tmp``)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=folder)
    try:
        text: Dict[str, Any] = {"encoding": encoding} if mode == "w" else {}
        with os.fdopen(fd, mode, **text) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp's 0600, widened as open() would
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # (a failed write's; once renamed, there is none)
    fsync_folder(folder)


def write_json(path, data: Any, sort_keys: bool = False, allow_nan: bool = True) -> None:
    """``data`` as JSON (``indent=1``) written to ``path`` through :func:`atomic_write`."""
    with atomic_write(path) as fh:
        json.dump(data, fh, indent=1, sort_keys=sort_keys, allow_nan=allow_nan)


# --- whole folders ------------------------------------------------------------------------
_STAGED = re.compile(r"^(new|old)-[0-9]+-[0-9a-f]{8}$")
# errors that say a folder cannot be replaced as a whole (a mount point, a parent we may
# not write): its files are then replaced inside it
_CANNOT_SWAP = (errno.EACCES, errno.EPERM, errno.EBUSY, errno.EXDEV, errno.EROFS)


def _staged_path(target: Path, kind: str) -> Path:
    return target.parent / f".{target.name}.glomo-{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def staged_folders(target: Path) -> List[Tuple[str, Path]]:
    """``(kind, path)`` of the siblings that :func:`replace_folder` made for ``target``:
    ``new`` folders being written and ``old`` backups of the two-rename swap."""
    prefix = f".{target.name}.glomo-"
    try:
        names = os.listdir(target.parent)
    except OSError:
        return []
    return [(n[len(prefix):].split("-")[0], target.parent / n) for n in names
            if n.startswith(prefix) and _STAGED.match(n[len(prefix):])]


def interrupted_backup(target: Path) -> Optional[Path]:
    """The newest backup of ``target`` that a swap cut short between its two renames left."""
    backups = [p for kind, p in staged_folders(target) if kind == "old"]
    return max(backups, key=lambda p: p.stat().st_mtime) if backups else None


@contextlib.contextmanager
def _writers_lock(folder: Path, wait: bool) -> Iterator[bool]:
    """An exclusive ``flock`` on ``folder``; yields whether it is held."""
    import fcntl  # (POSIX)

    with contextlib.ExitStack() as stack:
        held = False
        with contextlib.suppress(OSError):
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
            stack.callback(os.close, fd)  # (closing releases the lock)
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            held = True
        yield held


def remove_stale(target: Path) -> None:
    """Remove what killed writers of ``target`` staged, unless a writer runs now; a backup
    is kept while ``target`` is missing (the next :func:`replace_folder` puts it back)."""
    with _writers_lock(target.parent, wait=False) as held:
        present = os.path.lexists(target)
        for kind, path in staged_folders(target) if held else []:
            if kind == "new" or present:
                shutil.rmtree(path, ignore_errors=True)  # (refuses a symlink: kept)


def _recover(target: Path) -> None:
    """Put back the backup of a swap killed between its renames, then remove the rest."""
    staged, backup = staged_folders(target), interrupted_backup(target)
    if backup is not None and not os.path.lexists(target):
        os.rename(backup, target)
        fsync_folder(target.parent)
    for _, path in staged:  # (the backup, once put back, is no longer there)
        shutil.rmtree(path, ignore_errors=True)


def _write_files(folder: Path, files: Mapping[str, bytes]) -> None:
    for name, data in files.items():
        with atomic_write(folder / name, "wb") as fh:
            fh.write(data)


def _swap_in(new: Path, target: Path) -> None:
    """Rename ``new`` to ``target``, an existing ``target`` first renamed to a backup."""
    if os.path.lexists(target):
        backup = _staged_path(target, "old")
        os.rename(target, backup)
        try:
            os.rename(new, target)
        except BaseException:
            os.rename(backup, target)
            raise
        shutil.rmtree(backup, ignore_errors=True)
    else:
        os.rename(new, target)
    fsync_folder(target.parent)


@contextlib.contextmanager
def _stage(target: Path) -> Iterator[Path]:
    """An empty folder beside ``target`` to fill, under the writers' lock of its parent
    (what killed writers left is cleaned first); removed afterwards unless swapped in."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with _writers_lock(target.parent, wait=True) as held:
        if held:
            _recover(target)
        new = _staged_path(target, "new")
        try:
            os.mkdir(new)
            yield new
        finally:
            shutil.rmtree(new, ignore_errors=True)  # (once swapped in, there is none)


def _publish(new: Path, target: Path) -> None:
    """Swap the filled ``new`` in for ``target`` (keeping the permissions of the folder it
    replaces)."""
    if target.is_dir():
        os.chmod(new, stat.S_IMODE(os.stat(target).st_mode))
    _swap_in(new, target)


@contextlib.contextmanager
def _working_folder_kept(target: Path) -> Iterator[None]:
    cwd = None
    with contextlib.suppress(OSError):
        cwd = os.getcwd()
    yield
    if cwd == str(target):
        os.chdir(target)  # our working folder was the replaced one


def replace_folder(target: Path, files: Mapping[str, bytes]) -> None:
    """Make ``target`` a folder holding exactly ``files`` (name: bytes, the last written
    last), staged as a sibling that then takes its place; a kill leaves the old folder, the
    new one, or a backup the next call puts back. Where ``target`` cannot be renamed, its
    files are replaced in place, with a warning."""
    with _working_folder_kept(target), _stage(target) as new:
        try:
            _write_files(new, files)
            _publish(new, target)
        except OSError as err:
            if err.errno not in _CANNOT_SWAP or not target.is_dir():
                raise
            warnings.warn(f"cannot replace {target} as a whole ({err}); writing its files in "
                          "place instead", RuntimeWarning, stacklevel=3)
            stale = re.compile(r"^\.(" + "|".join(map(re.escape, files)) + r")\..+\.tmp$")
            for name in filter(stale.match, os.listdir(target)):
                with contextlib.suppress(OSError):
                    os.unlink(target / name)
            _write_files(target, files)


@contextlib.contextmanager
def staged_folder(target: Path) -> Iterator[Path]:
    """A new empty folder to write ``target``'s files into, for folders too large to hold
    in memory (:func:`replace_folder` takes bytes): when the block ends it replaces
    ``target`` as a whole, with :func:`replace_folder`'s guarantees; if the block raises (or
    the process is killed) ``target`` is left as it was."""
    with _working_folder_kept(target), _stage(target) as new:
        yield new
        _publish(new, target)
