"""Saving and loading pretrained graph predictors: a JSON config with a format
version plus safetensors weights. Loading never unpickles anything.

A saved predictor is a directory holding ``config.json`` and ``model.safetensors``.
:func:`save_pretrained` writes a complete new directory beside it and swaps it into
place, so the path always holds one whole predictor, the previous or the new one.
:func:`load_pretrained` treats both files as untrusted: every value of the config is
type- and range-checked, and the config is compared with the safetensors header before
any module is built at its real size.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import inspect
import json
import os
import re
import secrets
import shutil
import stat
import struct
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from glomo_pyg.atomic_files import fsync_folder
from glomo_pyg.graphs import DIRECTION_KEYS
from glomo_pyg.io.releases import (RELEASE_NAME, available_releases, in_releases_root,
                                   released_names, releases_root)
from glomo_pyg.nn import FeatureGraphEmitter, GraphPredictor  # noqa: F401 (registers emitters)
from glomo_pyg.nn.emitter import EMITTERS
from glomo_pyg.nn.pretrained import PretrainedGraphPredictor, register_persistence
from glomo_pyg.nn.settings import MAX_STRING, MAX_VOCABULARY, check_model_setting  # noqa: F401
from glomo_pyg.io.paths import NotRegularFileError, open_regular
from glomo_pyg.io.seal import SEAL_KEY, seal_of, seal_problem
from glomo_pyg.version import __version__

FORMAT = "glomo_pyg.pretrained_graph_predictor"
# 2: each direction saves its emitter's config() (the layout, a run-time choice, is no
#    longer part of it); 1: hand-copied constructor kwargs (still read, see _legacy_entry)
# 3: config.json is sealed (glomo_pyg.io.seal); 2 and 1 still load, with a warning
FORMAT_VERSION = 3
SEALED_SINCE = 3
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

PathLike = Union[str, os.PathLike]

# --- limits on what a file may ask for ----------------------------------------------
MAX_CONFIG_BYTES = 256 << 20      # a 16M-token vocabulary fits
MAX_CONFIG_DEPTH = 16             # a saved config nests 5 deep
MAX_HEADER_BYTES = 100_000_000    # safetensors' own limit on its JSON header
# far above any real predictor (a release may hold 6 MiB): a larger weights file is
# refused by its size before it is read, so an edited or sparse file cannot exhaust memory
MAX_WEIGHTS_BYTES = 8 << 30
_CHUNK = 1 << 22                  # weights are read and hashed this much at a time

# The settings a saved emitter config may hold: the constructor arguments of the
# registered emitters. Their types and ranges are declared once, in
# glomo_pyg.nn.settings.ModelSettings (the same rules glomo pretrain checks its model
# section with); the upper bounds are far above any real predictor, so an edited config
# cannot ask for gigabytes or hours before it is compared with the weights. Every
# constructor argument of every registered emitter must be here
# (tests/test_pretrained_io.py checks it).
SAVED_SETTINGS = ("num_tokens", "in_channels", "hidden_channels", "head_channels", "heads",
                  "num_layers", "cnn_layers", "kernel_size", "padding_idx", "block_size",
                  "position_frequencies", "position_period", "height", "width", "grid_width",
                  "dropout", "pixel_mean", "pixel_std", "direction", "norm", "bias",
                  "position", "update", "include_self", "sparse", "pooled_context",
                  "local_context")

# safetensors dtype names of the torch dtypes a predictor may hold
_SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}
_DTYPE_BYTES = {name: torch.empty(0, dtype=dtype).element_size()
                for dtype, name in _SAFETENSORS_DTYPES.items()}
# floating weights may be saved in 16 bits (half the file; released predictors are) and
# are widened to the module's dtype on load
STORAGE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_NARROW = ("F16", "BF16")


class UnsealedPredictorWarning(UserWarning):
    """A predictor saved before bundles were sealed (format 1 or 2) was loaded: edits to
    its config or vocabulary cannot be detected. Save it again, or seal it as it is with
    :func:`reseal_pretrained`."""


class PretrainedFormatError(ValueError):
    """A saved predictor cannot be loaded: missing, corrupt, mismatched or from an
    unsupported format version. The message names the file and the problem."""


def _as_path(path: Any, function: str) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{function}: path must be a str or os.PathLike naming the predictor's "
                        f"directory, got {type(path).__name__}")
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"{function}: path must be a str or os.PathLike naming the predictor's "
                        f"directory, got a {type(text).__name__} path")
    if not text:
        raise (PretrainedFormatError if function == "load_pretrained" else ValueError)(
            f"{function}: path is empty")
    return Path(text)


# --- strict JSON ------------------------------------------------------------------------
class _JSONProblem(ValueError):
    pass


def _no_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:  # parsers disagree on which one wins: refuse
            raise _JSONProblem(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise _JSONProblem(f"{name} is not a JSON number")


def _depth_at_most(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return False
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return True


def _strict_json(data: bytes, max_depth: int) -> Any:
    """Standard JSON only (no NaN/Infinity, no duplicate keys), nested at most
    ``max_depth`` deep; any problem raises :class:`_JSONProblem`."""
    try:
        value = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates,
                           parse_constant=_no_constant)
    except RecursionError:
        raise _JSONProblem(f"nested more than {max_depth} deep") from None
    except UnicodeDecodeError as err:
        raise _JSONProblem(f"not UTF-8: {err}") from None
    except ValueError as err:  # JSONDecodeError, too many digits, the hooks above
        raise _JSONProblem(str(err)) from None
    if isinstance(value, (dict, list)) and not _depth_at_most(value, max_depth):
        raise _JSONProblem(f"nested more than {max_depth} deep")
    return value


def _show(value: Any) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object", type(None): "null"}.get(type(value), "?")
    text = json.dumps(value) if not isinstance(value, (dict, list)) else kind
    if len(text) > 60:
        text = text[:57] + "..."
    return text if text == kind else f"{text} ({kind})"


# --- saving -------------------------------------------------------------------------------
_TEMP = re.compile(r"^(new|old)-([0-9]+)-[0-9a-f]{8}$")
_OLD_TEMP_FILE = re.compile(r"^\.(config\.json|model\.safetensors)\..+\.tmp$")
_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


def _temp_path(target: Path, kind: str) -> Path:
    return target.parent / f".{target.name}.glomo-{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def _temporaries(target: Path) -> List[Tuple[str, int, Path]]:
    """``(kind, pid, path)`` of the siblings that saves into ``target`` made: ``new``
    directories being written (or, after the swap, holding the replaced predictor) and
    ``old`` backups of the two-rename swap."""
    prefix = f".{target.name}.glomo-"
    try:
        names = os.listdir(target.parent)
    except OSError:
        return []
    out = []
    for name in names:
        match = _TEMP.match(name[len(prefix):]) if name.startswith(prefix) else None
        if match:
            out.append((match.group(1), int(match.group(2)), target.parent / name))
    return out


_ACTIVE: set = set()  # temporaries of the saves running in this process


def _alive(pid: int, path: Optional[Path] = None) -> bool:
    """Whether the process that made a temporary may still be saving."""
    if pid == os.getpid():
        return path in _ACTIVE
    if os.name != "posix":
        return False  # no harmless liveness probe: treat leftovers as stale
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _complete(directory: Path) -> bool:
    return (directory / CONFIG_NAME).is_file() and (directory / WEIGHTS_NAME).is_file()


def _write_new_file(file: Path, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | \
        getattr(os, "O_CLOEXEC", 0)
    with os.fdopen(os.open(file, flags, 0o666), "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _recover(target: Path) -> None:
    """Tidy up after saves into ``target`` that were killed: if ``target`` is missing
    because a two-rename swap stopped half way, move the previous predictor back; then
    remove every temporary of a process that no longer runs."""
    stale = [(kind, path) for kind, pid, path in _temporaries(target)
             if not _alive(pid, path) and not path.is_symlink()]
    if not os.path.lexists(target):
        backups = [path for kind, path in stale if kind == "old" and _complete(path)]
        if backups:
            newest = max(backups, key=lambda p: p.stat().st_mtime)
            os.rename(newest, target)
            fsync_folder(target.parent)
            stale = [(kind, path) for kind, path in stale if path != newest]
    for _, path in stale:
        shutil.rmtree(path, ignore_errors=True)


def _remove_stale(target: Path) -> None:
    """On load: remove the staging folders that killed saves into ``target`` left (their
    writer no longer runs), so they do not last until the next save. A backup of a
    half-done swap is kept while ``target`` is missing: it is the previous predictor,
    which the next save puts back and the load error names. Best effort: a folder we may
    not write (a read-only install) is left as it is."""
    present = os.path.lexists(target)
    for kind, pid, path in _temporaries(target):
        if (kind == "new" or present) and not _alive(pid, path) and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


_renameat2_fn: Any = None


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2`` with
    ``RENAME_EXCHANGE``); ``False`` where the system or file system cannot."""
    global _renameat2_fn
    if not sys.platform.startswith("linux"):
        return False
    if _renameat2_fn is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
        except (OSError, AttributeError):
            fn = False
        else:
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                           ctypes.c_uint]
            fn.restype = ctypes.c_int
        _renameat2_fn = fn
    if not _renameat2_fn:
        return False
    if _renameat2_fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b),
                     _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


# errors that say a directory cannot be replaced as a whole (a mount point, a parent we
# may not write): the files are then replaced inside it
_CANNOT_SWAP = (errno.EACCES, errno.EPERM, errno.EBUSY, errno.EXDEV, errno.EROFS)


class _CannotSwap(Exception):
    pass


def _swap_in(new: Path, target: Path) -> None:
    """Put the complete directory ``new`` at ``target``: at every instant ``target`` is
    the previous directory or ``new`` (one atomic exchange where the system has it;
    otherwise ``target`` is renamed to a backup and ``new`` into place, and a kill in
    between leaves the backup, which the next save restores and loading names)."""
    try:
        if not os.path.lexists(target):
            os.rename(new, target)
        elif _exchange(new, target):
            pass  # ``new`` now holds the previous predictor
        else:
            backup = _temp_path(target, "old")
            _ACTIVE.add(backup)
            try:
                os.rename(target, backup)
                try:
                    os.rename(new, target)
                except BaseException:
                    os.rename(backup, target)
                    raise
                fsync_folder(target.parent)
                shutil.rmtree(backup, ignore_errors=True)
            finally:
                _ACTIVE.discard(backup)
            return
    except OSError as err:
        if err.errno in _CANNOT_SWAP:
            raise _CannotSwap(err) from None
        raise
    fsync_folder(target.parent)


def _save_in_place(target: Path, payload: bytes, text: bytes, reason: Exception) -> None:
    """Where ``target`` cannot be replaced as a whole: write both files under temporary
    names inside it, then rename the weights and the config into place (a kill between
    the two renames leaves a config whose checksum the weights fail: reported on load,
    never loaded half-updated)."""
    warnings.warn(f"save_pretrained: cannot replace {target} as a whole ({reason}); writing "
                  "its files in place instead", RuntimeWarning, stacklevel=3)
    for name in os.listdir(target):
        match = _OLD_TEMP_FILE.match(name)
        pid = re.search(r"\.([0-9]+)-[0-9a-f]{8}\.tmp$", name) if match else None
        if match and (pid is None or not _alive(int(pid.group(1)))):
            with contextlib.suppress(OSError):
                os.unlink(target / name)
    temps = {}
    try:
        for name, data in ((WEIGHTS_NAME, payload), (CONFIG_NAME, text)):
            temps[name] = target / f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
            _write_new_file(temps[name], data)
        for name in (WEIGHTS_NAME, CONFIG_NAME):
            os.replace(temps.pop(name), target / name)
        fsync_folder(target)
    finally:
        for tmp in temps.values():
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _non_finite(tensors: Dict[str, torch.Tensor]) -> List[str]:
    return [f"{name} ({int((~torch.isfinite(t)).sum())} of {t.numel()} values)"
            for name, t in tensors.items()
            if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all())]


def save_pretrained(predictor: PretrainedGraphPredictor, path: PathLike,
                    dtype: Optional[torch.dtype] = None) -> Path:
    """Save ``predictor`` into directory ``path`` (created if needed).

    Writes ``model.safetensors`` (all weights of both directions, as
    ``<fw|bw>.<parameter name>``) and ``config.json``: the format name and
    version, the glomo_pyg version, each direction's class and constructor
    arguments, the vocabulary, and the weights file's size and SHA-256.

    Both files are written (and synced) into a new sibling directory, which then
    replaces ``path`` in one atomic exchange (Linux) or two renames: a save killed at
    any point leaves ``path`` holding the complete previous or the complete new
    predictor, never a mixture (after a kill between the two renames the previous one
    waits in a sibling backup, which the next save puts back and loading names).
    Temporaries of earlier killed saves are removed. Because the whole directory is
    replaced, ``path`` must not hold anything but a saved predictor. Where ``path``
    itself cannot be renamed (a mount point, a parent directory without write
    permission) its two files are replaced in place, with a warning.

    Args:
        predictor: the predictor to save.
        path: the directory to write.
        dtype: store every floating-point tensor in this dtype: ``torch.bfloat16`` or
            ``torch.float16`` halve the file (:func:`load_pretrained` widens them back
            to float32); ``None`` (default) keeps each tensor's own dtype.

    Returns:
        ``path``.

    Raises:
        TypeError: ``predictor`` is not a :class:`PretrainedGraphPredictor` or ``path``
            not a str or os.PathLike.
        ValueError: ``path`` is a file or holds other entries, ``dtype`` is not one of
            float32, float16, bfloat16, or a weight is NaN or infinite (in float16, also
            one beyond its range).
    """
    from safetensors.torch import save

    if not isinstance(predictor, PretrainedGraphPredictor):
        raise TypeError(f"expected a PretrainedGraphPredictor, got {type(predictor).__name__}")
    given = _as_path(path, "save_pretrained")
    target = Path(os.path.realpath(given))
    if os.path.lexists(target) and not target.is_dir():
        raise ValueError(f"{given} exists and is not a directory")
    if dtype is not None and dtype not in STORAGE_DTYPES:
        raise ValueError(f"save_pretrained: dtype must be None or one of {STORAGE_DTYPES}, got "
                         f"{dtype!r}")
    tensors = {name: t.detach().to("cpu", dtype if dtype is not None and t.is_floating_point()
                                   else t.dtype).contiguous()
               for name, t in predictor.predictors.state_dict().items()}
    bad = _non_finite(tensors)  # (after the cast: float16 overflows to infinity)
    if bad:
        raise ValueError(f"cannot save {given}: NaN or infinite weights in {', '.join(bad[:5])}"
                         f"{' ...' if len(bad) > 5 else ''} (load_pretrained refuses them)")
    payload = save(tensors)
    config: Dict[str, Any] = dict(
        format=FORMAT, format_version=FORMAT_VERSION, glomo_pyg_version=__version__,
        directions={d: dict(cls=type(predictor.predictor(d)).__name__,
                            config=predictor.predictor(d).config())
                    for d in predictor.directions},
        vocabulary=predictor.vocabulary,
        trained_length=predictor.trained_length,
        trained_size=None if predictor.trained_size is None else list(predictor.trained_size),
        weights=dict(file=WEIGHTS_NAME, bytes=len(payload),
                     sha256=hashlib.sha256(payload).hexdigest()))
    try:
        config[SEAL_KEY] = seal_of(config)  # (last: it covers everything above)
        text = json.dumps(config, indent=2, allow_nan=False).encode()
    except ValueError as err:
        raise ValueError(f"cannot save {given}: the config holds a NaN or infinite number "
                         f"({err})") from None

    target.parent.mkdir(parents=True, exist_ok=True)
    _recover(target)
    if target.is_dir():
        foreign = sorted(n for n in os.listdir(target)
                         if n not in (CONFIG_NAME, WEIGHTS_NAME) and not _OLD_TEMP_FILE.match(n))
        if foreign:
            raise ValueError(f"{given} holds {foreign[:5]}{' ...' if len(foreign) > 5 else ''} "
                             "besides a saved predictor: save_pretrained replaces the whole "
                             "directory, so save into a new or empty directory")
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = None
    new = None
    try:
        while new is None:
            try:
                new = _temp_path(target, "new")
                _ACTIVE.add(new)
                os.mkdir(new)
            except FileExistsError:
                _ACTIVE.discard(new)
                new = None
            except OSError as err:
                if err.errno in _CANNOT_SWAP and target.is_dir():
                    _save_in_place(target, payload, text, err)
                    return given
                raise
        _write_new_file(new / WEIGHTS_NAME, payload)
        _write_new_file(new / CONFIG_NAME, text)
        if target.is_dir():  # keep the permissions of the directory it replaces
            os.chmod(new, stat.S_IMODE(os.stat(target).st_mode))
        fsync_folder(new)
        try:
            _swap_in(new, target)
        except _CannotSwap as err:
            _save_in_place(target, payload, text, err.args[0])
            return given
        if cwd is not None and cwd == str(target):
            os.chdir(target)  # our working directory was the replaced one
    finally:
        if new is not None:  # the unfinished new directory, or the replaced old one
            shutil.rmtree(new, ignore_errors=True)
            _ACTIVE.discard(new)
    return given


# --- loading ------------------------------------------------------------------------------
_DIR_FD = os.open in os.supports_dir_fd and hasattr(os, "O_DIRECTORY")


def _backup(path: Path) -> Optional[Path]:
    """The newest complete backup that an interrupted save into ``path`` left."""
    backups = [p for kind, _, p in _temporaries(Path(os.path.realpath(path)))
               if kind == "old" and _complete(p)]
    return max(backups, key=lambda p: p.stat().st_mtime) if backups else None


def _missing_directory(path: Path) -> PretrainedFormatError:
    backup = _backup(path)
    if backup is not None:
        return PretrainedFormatError(
            f"{path} does not exist: a save_pretrained into it was interrupted while swapping "
            f"directories (or is running now); the previous predictor is complete in "
            f"{backup}. Rename {backup} to {path}, or save again (save_pretrained puts it "
            "back first)")
    return PretrainedFormatError(f"{path} does not exist")


def _released(text: str) -> Optional[Path]:
    """The folder of the released predictor named ``text``, or ``None`` where ``text`` is
    a path: an existing one, or one that is no bare name (``./x``, ``/x``, ``runs/x``),
    or one that an interrupted save left a backup of (whose error says so)."""
    if os.path.lexists(text) or not RELEASE_NAME.fullmatch(text) or _backup(Path(text)):
        return None
    names = released_names()
    if text not in names:
        raise PretrainedFormatError(f"{text!r} is neither a folder nor the name of a released "
                                    f"predictor; {available_releases(names)}")
    return releases_root() / text


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[Tuple[Optional[int], Optional[int]]]:
    """File descriptors of the config and the weights (``None`` where missing), both
    opened through one handle on the directory: a save that swaps the directory
    meanwhile cannot pair one save's config with another's weights."""
    if not path.exists():
        raise _missing_directory(path)
    if not path.is_dir():
        raise PretrainedFormatError(f"{path} is a file; a pretrained predictor is a directory "
                                    f"holding {CONFIG_NAME} and {WEIGHTS_NAME} (written by "
                                    "save_pretrained)")
    fds: List[int] = []
    dir_fd = None
    try:
        if _DIR_FD:
            try:
                dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
            except OSError as err:
                raise PretrainedFormatError(f"{path} cannot be opened ({err.strerror})") from None
        opened: List[Optional[int]] = []
        for name in (CONFIG_NAME, WEIGHTS_NAME):
            try:
                fd = open_regular(name, name, dir_fd=dir_fd) if dir_fd is not None else \
                    open_regular(path / name, name)
            except (FileNotFoundError, NotADirectoryError):
                opened.append(None)
                continue
            except NotRegularFileError as err:
                raise PretrainedFormatError(f"{path / name} is not a regular file ({err})") \
                    from None
            except OSError as err:
                raise PretrainedFormatError(f"{path / name} cannot be opened "
                                            f"({err.strerror})") from None
            fds.append(fd)
            opened.append(fd)
        yield opened[0], opened[1]
    finally:
        for fd in fds:
            os.close(fd)
        if dir_fd is not None:
            os.close(dir_fd)


def _read_fd(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    os.lseek(fd, 0, os.SEEK_SET)
    while size <= limit:
        chunk = os.read(fd, min(_CHUNK, limit + 1 - size))  # (os.read allocates it whole)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _bounded_weights_size(file: Path, fd: int, release: bool = False) -> int:
    """The weights file's size from ``fstat``, refused before any byte is read when it is
    over :data:`MAX_WEIGHTS_BYTES` (a sparse file may claim terabytes it never stored), or
    for a ``release`` over the releases' own bound."""
    from glomo_pyg.io import releases

    size = os.fstat(fd).st_size
    limit, whose = (releases.MAX_WEIGHTS_BYTES, "a released predictor's") if release else \
        (MAX_WEIGHTS_BYTES, "a predictor's")
    if size > limit:
        raise PretrainedFormatError(
            f"{file} has {size} bytes, more than the {limit} ({limit / 2**20:g} MiB) "
            f"{whose} weights may have: it is not a file save_pretrained (or write_release) "
            "wrote; save the predictor again")
    return size


def _sha256_fd(fd: int, size: int, file: Path, into: Optional[bytearray] = None) -> str:
    """SHA-256 of the first ``size`` bytes of ``fd``, read in chunks (so memory stays
    small), copied into ``into`` when given; a file that changes size meanwhile is
    refused."""
    digest, done = hashlib.sha256(), 0
    view = memoryview(into) if into is not None else None
    os.lseek(fd, 0, os.SEEK_SET)
    while done < size:
        chunk = os.read(fd, min(_CHUNK, size - done))
        if not chunk:
            break
        digest.update(chunk)
        if view is not None:
            view[done:done + len(chunk)] = chunk
        done += len(chunk)
    if done != size or os.read(fd, 1):
        raise PretrainedFormatError(f"{file} changed while it was read")
    return digest.hexdigest()


def _read_config_bytes(file: Path, fd: int) -> bytes:
    """``config.json``'s bytes, refused by its size before reading when over
    :data:`MAX_CONFIG_BYTES`."""
    size = os.fstat(fd).st_size
    data = _read_fd(fd, MAX_CONFIG_BYTES) if size <= MAX_CONFIG_BYTES else b""
    if max(size, len(data)) > MAX_CONFIG_BYTES:
        raise PretrainedFormatError(f"{file} has {max(size, len(data))} bytes, more than the "
                                    f"{MAX_CONFIG_BYTES} a predictor config may have")
    return data


def _parse_config(data: bytes, file: Path) -> Dict[str, Any]:
    """``config.json``'s bytes as strict JSON of this format (nothing else checked)."""
    try:
        config = _strict_json(data, MAX_CONFIG_DEPTH)
    except _JSONProblem as err:
        raise PretrainedFormatError(f"{file} is not valid JSON ({err})") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise PretrainedFormatError(f"{file} is not a glomo_pyg pretrained-predictor config "
                                    f"(expected format {FORMAT!r})")
    return config


def _read_config(path: Path, fd: Optional[int], unsealed_ok: bool = True) -> Dict[str, Any]:
    file = path / CONFIG_NAME
    if fd is None:
        raise PretrainedFormatError(f"{file} is missing: {path} was not written by "
                                    "save_pretrained, or the save did not finish")
    config = _parse_config(_read_config_bytes(file, fd), file)
    version = config.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise PretrainedFormatError(f"{file} has no integer format_version")
    if version > FORMAT_VERSION:
        writer = config.get("glomo_pyg_version")
        writer = writer if isinstance(writer, str) and len(writer) <= 64 else "?"
        raise PretrainedFormatError(
            f"{file} has format version {version}, written by glomo_pyg {writer}; this "
            f"glomo_pyg ({__version__}) reads versions up to {FORMAT_VERSION}: upgrade glomo_pyg")
    if version < 1:
        raise PretrainedFormatError(f"{file} has an invalid format version {version}")
    if version >= SEALED_SINCE:
        problem = seal_problem(config)
        if problem is not None:
            raise PretrainedFormatError(
                f"{file}: {problem}. If the edit was deliberate, seal the predictor again "
                f"with `glomo reseal {path}` (glomo_pyg.io.pretrained.reseal_pretrained)")
    elif not unsealed_ok:  # (a lowered version must not step around the seal)
        raise PretrainedFormatError(
            f"{file} has format version {version}, which is not sealed: edits to its config "
            f"or vocabulary cannot be detected. Seal it with `glomo reseal {path}` "
            "(reseal_pretrained); to load it unsealed once, pass allow_unsealed=True "
            "(a released predictor must always be sealed)")
    else:
        warnings.warn(f"{file} has format version {version}, saved before predictors were "
                      "sealed: edits to its config or vocabulary cannot be detected. Seal it "
                      f"with `glomo reseal {path}`", UnsealedPredictorWarning, stacklevel=3)
    for key, kind in (("directions", dict), ("weights", dict)):
        if not isinstance(config.get(key), kind):
            raise PretrainedFormatError(f"{file} lacks the {key!r} entry")
    meta = config["weights"]
    if meta.get("file") != WEIGHTS_NAME:
        raise PretrainedFormatError(f"{file} names weights file {_show(meta.get('file'))}; "
                                    f"expected {WEIGHTS_NAME!r}")
    size = meta.get("bytes")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise PretrainedFormatError(f"{file}: weights.bytes must be the weights file's size in "
                                    f"bytes, got {_show(size)}")
    if size < 8:
        raise PretrainedFormatError(f"{file}: weights.bytes records a {size}-byte weights "
                                    "file, but a safetensors file holds at least 8 bytes (the "
                                    "length of its header): the weights file is not one "
                                    "save_pretrained wrote")
    digest = meta.get("sha256")
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise PretrainedFormatError(f"{file}: weights.sha256 must be 64 lowercase hex digits, "
                                    f"got {_show(digest)}")
    vocab = config.get("vocabulary")
    if vocab is not None and (not isinstance(vocab, list) or
                              not all(isinstance(t, str) for t in vocab)):
        raise PretrainedFormatError(f"{file}: the vocabulary must be a list of strings")
    if vocab is not None and len(vocab) > MAX_VOCABULARY:
        raise PretrainedFormatError(f"{file}: the vocabulary has {len(vocab)} entries, more "
                                    f"than the {MAX_VOCABULARY} this loader accepts")
    length = config.get("trained_length")  # (absent in older files: unknown)
    if length is not None and (isinstance(length, bool) or not isinstance(length, int) or
                               not 2 <= length <= 1 << 40):
        raise PretrainedFormatError(f"{file}: trained_length must be an integer >= 2 (the "
                                    f"longest training sequence), got {_show(length)}")
    size = config.get("trained_size")  # (absent in older files: unknown)
    if size is not None and not (isinstance(size, list) and len(size) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and 2 <= v <= 1 << 20 for v in size)):
        raise PretrainedFormatError(f"{file}: trained_size must be [height, width], two "
                                    f"integers in [2, 2^20] (pixels), got {_show(size)}")
    return config


def _legacy_entry(entry: Any) -> Any:
    """A format-1 direction entry (``cls`` + hand-copied ``kwargs``) as format 2: the
    run-time ``layout`` is dropped, and a ``FeaturePredictor`` (the "-decouple"
    ablation, always saved with ``decouple=False``) becomes its emitter class."""
    if not isinstance(entry, dict) or not isinstance(entry.get("kwargs"), dict):
        return entry
    kwargs = {k: v for k, v in entry["kwargs"].items() if k != "layout"}
    cls = entry.get("cls")
    if cls == "FeaturePredictor" and kwargs.get("decouple") is False:
        cls = "FeatureGraphEmitter"
        kwargs.pop("decouple")
    return dict(cls=cls, config=kwargs)


def _check_value(key: str, value: Any, where: str) -> None:
    """One saved setting, by its declared rule (:mod:`glomo_pyg.nn.settings`)."""
    check_model_setting(key, value, PretrainedFormatError, key=f"{where}: {key}", show=_show,
                        typed=True)


# Named emitter constructor arguments that format-2 files may lack: arguments added
# after format 2 first appeared, whose constructor defaults reproduce what files saved
# without them did (FeatureGraphEmitter took pooled_context through **scorer_kwargs at
# first, recorded only when passed; local_context came later). A format-2 file records
# every named constructor argument its writer had (ConfigurableModule.config), so any
# other missing one means an edited or truncated file: it is refused rather than filled
# with a default.
ADDED_SINCE_FORMAT_2: Dict[str, Tuple[str, ...]] = {
    "FeatureGraphEmitter": ("pooled_context", "local_context")}


def _missing_arguments(cls: type, config: Dict[str, Any]) -> List[str]:
    """Constructor arguments of ``cls`` that a format-2 ``config`` should hold but lacks."""
    params = inspect.signature(cls.__init__).parameters
    added = set(ADDED_SINCE_FORMAT_2.get(cls.__name__, ()))
    return sorted(name for name, p in params.items() if name != "self" and p.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        and name not in config and name not in added)


def _entry(direction: str, entry: Any, file: Path,
           complete: bool = True) -> Tuple[type, Dict[str, Any]]:
    """The emitter class and the checked config of one direction entry; ``complete``
    (format 2) requires every named constructor argument (:data:`ADDED_SINCE_FORMAT_2`
    aside)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("cls"), str) or \
            entry["cls"] not in EMITTERS or not isinstance(entry.get("config"), dict):
        raise PretrainedFormatError(
            f"{file}: the {direction} entry must name one of {sorted(EMITTERS)} with its config")
    cls, config = EMITTERS[entry["cls"]], entry["config"]
    unknown = sorted(k for k in config if k not in SAVED_SETTINGS)
    if unknown:
        raise PretrainedFormatError(f"{file}: cannot build the {direction} {cls.__name__} from "
                                    f"its config (unknown arguments {unknown[:5]})")
    missing = _missing_arguments(cls, config) if complete else []
    if missing:
        raise PretrainedFormatError(f"{file}: the {direction} {cls.__name__} config lacks "
                                    f"arguments {missing[:5]} (a saved config records every "
                                    "named argument: the file was edited or truncated)")
    for key, value in config.items():
        _check_value(key, value, f"{file}: {direction} {cls.__name__} config")
    return cls, config


class _TooManyTensors(Exception):
    pass


@contextlib.contextmanager
def _registration_budget(limit: int) -> Iterator[None]:
    """Raise :class:`_TooManyTensors` once modules built on this thread register more
    than ``limit`` submodules, parameters and buffers in all."""
    from torch.nn.modules import module as nn_module

    thread, count = threading.get_ident(), [0]

    def hook(*args):
        if threading.get_ident() == thread:
            count[0] += 1
            if count[0] > limit:
                raise _TooManyTensors
        return None

    handles = [nn_module.register_module_module_registration_hook(hook),
               nn_module.register_module_parameter_registration_hook(hook),
               nn_module.register_module_buffer_registration_hook(hook)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _build(direction: str, cls: type, config: Dict[str, Any], file: Path,
           budget: Optional[int] = None) -> torch.nn.Module:
    """The emitter of ``config``; with ``budget``, on the meta device (no memory) and
    stopped once it registers more than ``budget`` modules and tensors."""
    try:
        if budget is None:
            module = cls.from_config(dict(config))
        else:
            with _registration_budget(budget), torch.device("meta"):
                module = cls.from_config(dict(config))
    except _TooManyTensors:
        raise PretrainedFormatError(f"{file}: the {direction} {cls.__name__} config describes "
                                    f"far more tensors than {WEIGHTS_NAME} holds") from None
    except (TypeError, ValueError, OverflowError, RuntimeError) as err:
        raise PretrainedFormatError(f"{file}: cannot build the {direction} {cls.__name__} from "
                                    f"its config ({err})") from None
    if module.direction != direction:
        raise PretrainedFormatError(f"{file}: the {direction} entry builds a predictor for "
                                    "the other direction")
    return module


def _check_weights_size(file: Path, fd: Optional[int], config: Dict[str, Any],
                        release: bool = False) -> int:
    """The weights file's size, which must be the one its config records."""
    if fd is None:
        raise PretrainedFormatError(f"{file} is missing")
    expected = config["weights"]["bytes"]
    size = _bounded_weights_size(file, fd, release)
    if size < expected:
        raise PretrainedFormatError(f"{file} is truncated: {size} of {expected} bytes")
    if size > expected:
        raise PretrainedFormatError(f"{file} has {size} bytes, its config records {expected}: "
                                    "the file was replaced or corrupted")
    return expected


def _read_weights(path: Path, fd: Optional[int], config: Dict[str, Any]) -> bytearray:
    """The weights file's bytes, once its size and SHA-256 match the config."""
    file = path / WEIGHTS_NAME
    expected = _check_weights_size(file, fd, config)
    data = bytearray(expected)  # (filled while hashed: one copy in memory, not two)
    if config["weights"]["sha256"] != _sha256_fd(fd, expected, file, into=data):
        raise PretrainedFormatError(f"{file} does not match the SHA-256 recorded in "
                                    f"{CONFIG_NAME}: the file is corrupt or was modified")
    return data


def _read_header_prefix(fd: int, file: Path) -> bytes:
    """The first ``8 + header length`` bytes of the weights file: enough to check its
    tensors against the config before the (possibly large) rest is read."""
    size = os.fstat(fd).st_size
    os.lseek(fd, 0, os.SEEK_SET)
    first = os.read(fd, 8)
    if len(first) < 8:
        raise PretrainedFormatError(f"{file} is not a valid safetensors file (shorter than "
                                    "the 8-byte header length)")
    length = struct.unpack("<Q", first)[0]
    if length > MAX_HEADER_BYTES or 8 + length > size:
        raise PretrainedFormatError(f"{file} is not a valid safetensors file (a header of "
                                    f"{length} bytes does not fit the file's {size} bytes)")
    data = _read_fd(fd, 8 + length)
    return data[:8 + length]


def _read_header(data: bytes, file: Path) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
    """Tensor names, dtypes and shapes from the safetensors header (no tensor is read)."""
    def bad(why: str) -> PretrainedFormatError:
        return PretrainedFormatError(f"{file} is not a valid safetensors file ({why})")

    if len(data) < 8:
        raise bad("shorter than the 8-byte header length")
    length = struct.unpack("<Q", data[:8])[0]
    if length > MAX_HEADER_BYTES or 8 + length > len(data):
        raise bad(f"a header of {length} bytes does not fit the file's {len(data)} bytes")
    try:
        header = _strict_json(data[8:8 + length], 3)
    except _JSONProblem as err:
        raise bad(f"header: {err}") from None
    if not isinstance(header, dict):
        raise bad("the header is not a JSON object")
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        shape = info.get("shape") if isinstance(info, dict) else None
        if not isinstance(info, dict) or not isinstance(info.get("dtype"), str) or \
                not isinstance(shape, list) or not all(
                    isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
            raise bad(f"header entry {name[:60]!r} has no dtype and shape")
        out[name] = (info["dtype"], tuple(shape))
    return out


def _compare(expected: Dict[str, torch.Tensor], header: Dict[str, Tuple[str, Tuple[int, ...]]],
             weights_file: Path, config_file: Path) -> None:
    missing = sorted(set(expected) - set(header))
    unexpected = sorted(set(header) - set(expected))
    shapes = [f"{k}: file {header[k][1]} vs config {tuple(expected[k].shape)}"
              for k in sorted(set(expected) & set(header))
              if header[k][1] != tuple(expected[k].shape)]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        if unexpected:
            parts.append(f"unexpected tensors {[k[:60] for k in unexpected[:5]]}"
                         f"{' ...' if len(unexpected) > 5 else ''}")
        if shapes:
            parts.append("shape mismatch " + "; ".join(shapes[:5]))
        raise PretrainedFormatError(f"{weights_file} does not match {config_file}: "
                                    + "; ".join(parts))
    bad_dtype = [k for k in expected
                 if header[k][0] != _SAFETENSORS_DTYPES.get(expected[k].dtype, "?") and not
                 (header[k][0] in _NARROW and expected[k].is_floating_point() and
                  expected[k].element_size() > 2)]  # 16-bit floats widen, nothing else
    if bad_dtype:
        raise PretrainedFormatError(f"{weights_file}: unexpected dtypes for {bad_dtype[:5]}")


def _parse_weights(data: Union[bytes, bytearray], file: Path) -> Dict[str, torch.Tensor]:
    """Parse a safetensors file; anything else (a pickle, random bytes) is refused
    by the parser before any of it is interpreted as code or objects."""
    from safetensors.torch import load

    try:
        return load(bytes(data))
    except Exception as err:  # safetensors raises its own error types for bad headers
        raise PretrainedFormatError(f"{file} is not a valid safetensors file ({err})") from None


def load_pretrained(path: PathLike, map_location: Union[str, torch.device, None] = None,
                    vocabulary: Optional[Sequence[str]] = None,
                    allow_unsealed: bool = False) -> PretrainedGraphPredictor:
    """Load a predictor written by :func:`save_pretrained`, in eval mode.

    The files are untrusted input. In order: the config is at most 256 MiB of standard
    JSON (no NaN, no duplicate keys, nested at most 16 deep); its format and version are
    known; every emitter argument has the JSON type its constructor takes (``true`` /
    ``false`` for booleans, numbers for numbers) and lies within a generous range (see
    ``SAVED_SETTINGS``, by the rules of :class:`~glomo_pyg.nn.settings.ModelSettings`);
    the weights file has the recorded size and SHA-256; its
    safetensors header lists exactly the tensors, shapes and dtypes the config
    describes (checked on modules built on the meta device, which allocate nothing);
    the tensors parse and are all finite. Only then are the modules built and filled.

    Floating-point weights stored in 16 bits (``save_pretrained(..., dtype=...)``, as
    released predictors are) are widened to the modules' float32. Both files must be
    regular files (a FIFO or device is refused at once, never read); a weights file over
    :data:`MAX_WEIGHTS_BYTES` is refused by its size before it is read, and the weights
    are hashed in chunks as they are read. Staging folders that killed saves into
    ``path`` left are removed (when their writer no longer runs).

    Args:
        path: the directory given to :func:`save_pretrained`, or the name of a released
            predictor (a bare name such as ``'imdb-text-cpu'`` that is no existing
            path; see ``glomo_pyg.io.releases``).
        map_location: device to put the weights on (default: CPU), e.g.
            ``'cuda'`` or ``torch.device('cuda', 1)``.
        vocabulary: if given, the vocabulary the caller's data was encoded
            with; it must equal the saved one.
        allow_unsealed: load a predictor of format 1 or 2 (saved before predictors were
            sealed; edits to it cannot be detected), with an
            :class:`UnsealedPredictorWarning`. Without it such a predictor is refused:
            seal it with :func:`reseal_pretrained` (``glomo reseal DIR``). A folder
            inside :func:`~glomo_pyg.io.releases.releases_root` is a release however it
            is named (path, relative path, symlink) and must always pass its seal.

    Raises:
        TypeError: ``path`` is not a str or os.PathLike.
        PretrainedFormatError: a missing folder (a bare name: neither a folder nor a
            released predictor; the message lists the released ones), a missing,
            truncated, corrupt or modified file,
            a format version newer than this library reads, a config value of the
            wrong type or out of range, weights that do not match the config
            (missing, unexpected or differently shaped tensors) or are NaN or
            infinite, or a vocabulary mismatch. The message names the file and
            the problem.
    """
    given, path = path, _as_path(path, "load_pretrained")
    released = _released(given) if isinstance(given, str) else None  # (a Path is a path)
    path = released or path
    is_release = released is not None or in_releases_root(path)
    if map_location is not None:  # checked before anything is read
        try:
            device = torch.device(map_location)
        except (RuntimeError, TypeError) as err:
            raise ValueError(f"map_location {map_location!r} is not a device: {err}") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"map_location {map_location!r}: CUDA is not available here")
    if vocabulary is not None and (isinstance(vocabulary, (str, bytes)) or
                                   not hasattr(vocabulary, "__iter__")):
        raise TypeError(f"vocabulary must be a sequence of tokens, got "
                        f"{type(vocabulary).__name__}")
    config_file, weights_file = path / CONFIG_NAME, path / WEIGHTS_NAME
    _remove_stale(Path(os.path.realpath(path)))
    with _opened(path) as (config_fd, weights_fd):
        config = _read_config(path, config_fd, unsealed_ok=allow_unsealed and not is_release)
        directions = config["directions"]
        unknown = sorted(set(directions) - set(DIRECTION_KEYS))
        if unknown or not directions:
            raise PretrainedFormatError(f"{config_file}: directions must be a non-empty subset "
                                        f"of {sorted(DIRECTION_KEYS)}, got {sorted(directions)[:5]}")
        if config["format_version"] == 1:
            directions = {d: _legacy_entry(e) for d, e in directions.items()}
        entries = {d: _entry(d, directions[d], config_file,
                             complete=config["format_version"] >= 2)
                   for d in DIRECTION_KEYS if d in directions}
        _check_weights_size(weights_file, weights_fd, config, is_release)
        # the header first: the tensors it lists must be the config's, and the file
        # exactly their size, before the rest is read (a sparse file may claim terabytes)
        prefix = _read_header_prefix(weights_fd, weights_file)
        header = _read_header(prefix, weights_file)
        budget = 8 * len(header) + 256  # modules and non-persistent buffers included
        shapes = torch.nn.ModuleDict({DIRECTION_KEYS[d]: _build(d, cls, c, config_file, budget)
                                      for d, (cls, c) in entries.items()})
        expected = shapes.state_dict()
        _compare(expected, header, weights_file, config_file)
        tensor_bytes = sum(t.numel() * _DTYPE_BYTES[header[k][0]] for k, t in expected.items())
        del shapes, expected
        if config["weights"]["bytes"] != len(prefix) + tensor_bytes:
            raise PretrainedFormatError(
                f"{weights_file}: {CONFIG_NAME} records {config['weights']['bytes']} bytes, "
                f"its header and tensors take {len(prefix) + tensor_bytes}: the file was "
                "replaced or corrupted")
        data = _read_weights(path, weights_fd, config)
    if data[:len(prefix)] != prefix:
        raise PretrainedFormatError(f"{weights_file} changed while it was read")
    weights = _parse_weights(data, weights_file)
    del data
    bad = _non_finite(weights)
    if bad:
        raise PretrainedFormatError(f"{weights_file}: NaN or infinite weights in "
                                    f"{', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}; "
                                    "a predictor with them emits empty or meaningless graphs")
    modules = {d: _build(d, cls, c, config_file) for d, (cls, c) in entries.items()}
    container = torch.nn.ModuleDict({DIRECTION_KEYS[d]: m for d, m in modules.items()})
    container.load_state_dict(weights, strict=True)
    saved_vocab = config.get("vocabulary")
    if vocabulary is not None:
        vocabulary = [str(t) for t in vocabulary]
        if saved_vocab is None:
            raise PretrainedFormatError(f"{config_file} holds no vocabulary to compare with the "
                                        "given one")
        if vocabulary != saved_vocab:
            if len(vocabulary) != len(saved_vocab):
                detail = f"{len(vocabulary)} tokens given, {len(saved_vocab)} saved"
            else:
                i = next(i for i, (a, b) in enumerate(zip(vocabulary, saved_vocab)) if a != b)
                detail = f"first difference at id {i}: {vocabulary[i]!r} given, {saved_vocab[i]!r} saved"
            raise PretrainedFormatError(f"vocabulary mismatch with {config_file}: {detail}")
    try:
        predictor = PretrainedGraphPredictor(modules.get("forward"), modules.get("backward"),
                                             saved_vocab, config.get("trained_length"),
                                             config.get("trained_size"))
    except (TypeError, ValueError) as err:
        raise PretrainedFormatError(f"{config_file}: {err}") from None
    if map_location is not None:
        predictor = predictor.to(map_location)
    return predictor.eval()


def reseal_pretrained(path: PathLike) -> Path:
    """Seal a saved predictor again, as it now is: for a ``config.json`` edited on purpose
    (a renamed vocabulary entry, a changed setting) or a predictor of format 1 or 2.

    The weights file's size and SHA-256 are recorded anew (hashed in chunks: the file is
    never held in memory whole, and one over :data:`MAX_WEIGHTS_BYTES` is refused by its
    size before it is read), the format version becomes the current one and the seal
    covers the whole bundle; then the predictor is loaded as any other (every check of
    :func:`load_pretrained`), and if that fails the previous ``config.json`` is put back
    and the error raised: resealing never leaves a predictor that does not load. The new
    ``config.json`` replaces the old one atomically. A format-1 predictor (another
    layout) is loaded and saved again instead.

    Returns:
        ``path``.
    """
    from glomo_pyg.atomic_files import atomic_write

    given, path = path, _as_path(path, "reseal_pretrained")
    config_file, weights_file = path / CONFIG_NAME, path / WEIGHTS_NAME
    with _opened(path) as (config_fd, weights_fd):
        if config_fd is None:
            raise _missing_directory(path) if not path.is_dir() else PretrainedFormatError(
                f"{config_file} is missing: nothing to seal")
        old = _read_config_bytes(config_file, config_fd)
        if weights_fd is None:
            raise PretrainedFormatError(f"{weights_file} is missing: nothing to seal")
        size = _bounded_weights_size(weights_file, weights_fd)
        digest = _sha256_fd(weights_fd, size, weights_file)
    config = _parse_config(old, config_file)
    if config.get("format_version") == 1:  # another layout: migrated by a new save
        with warnings.catch_warnings():  # (being sealed is what was asked for)
            warnings.simplefilter("ignore", UnsealedPredictorWarning)
            predictor = load_pretrained(path, allow_unsealed=True)
        save_pretrained(predictor, path)
        return given
    config["format_version"] = FORMAT_VERSION
    config["weights"] = dict(file=WEIGHTS_NAME, bytes=size, sha256=digest)
    config[SEAL_KEY] = seal_of(config)
    with atomic_write(config_file, "wb") as fh:
        fh.write(json.dumps(config, indent=2, allow_nan=False).encode())
    try:
        load_pretrained(path)
    except Exception:
        with atomic_write(config_file, "wb") as fh:
            fh.write(old)
        raise
    return given


register_persistence(save_pretrained, load_pretrained)
