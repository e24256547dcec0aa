"""Saving and loading pretrained graph predictors: a JSON config with a format
version plus safetensors weights. Loading never unpickles anything.

A saved predictor is a directory holding ``config.json`` and ``model.safetensors``,
replaced as a whole by :func:`~glomo_pyg.atomic_files.replace_folder`.
:func:`load_pretrained` treats both files as untrusted: every value of the config is
type- and range-checked, and the config is compared with the safetensors header before
any module is built at its real size.
"""
from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import re
import threading
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from glomo_pyg.atomic_files import atomic_write, interrupted_backup, remove_stale, replace_folder
from glomo_pyg.graphs import DIRECTION_KEYS
from glomo_pyg.io.releases import (RELEASE_NAME, available_releases, in_releases_root,
                                   released_names, releases_root)
from glomo_pyg.nn import FeatureGraphEmitter, GraphPredictor  # noqa: F401 (registers emitters)
from glomo_pyg.nn.emitter import EMITTERS
from glomo_pyg.nn.pretrained import PretrainedGraphPredictor, register_persistence
from glomo_pyg.nn.settings import MAX_VOCABULARY, SAVED_SETTINGS, check_model_setting
from glomo_pyg.io.paths import NotRegularFileError, open_regular
from glomo_pyg.io.seal import SEAL_KEY, seal_of, seal_problem
from glomo_pyg.version import __version__

FORMAT = "glomo_pyg.pretrained_graph_predictor"
# 3: config.json is sealed (glomo_pyg.io.seal); 2: each direction saves its emitter's
# config(); 1: hand-copied constructor kwargs (see _legacy_entry). 1 and 2 still load.
FORMAT_VERSION = 3
SEALED_SINCE = 3
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

PathLike = Union[str, os.PathLike]

# --- limits on what a file may ask for ----------------------------------------------
MAX_CONFIG_BYTES = 256 << 20      # a 16M-token vocabulary fits
MAX_CONFIG_DEPTH = 16             # a saved config nests 5 deep
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

# floating weights may be saved in 16 bits (half the file; released predictors are) and
# are widened to the module's dtype on load
STORAGE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_OLD_TEMP_FILE = re.compile(r"^\.(config\.json|model\.safetensors)\..+\.tmp$")


class UnsealedPredictorWarning(UserWarning):
    """A predictor saved before bundles were sealed (format 1 or 2) was loaded: edits to
    its config or vocabulary cannot be detected. Save it again, or seal it as it is with
    :func:`reseal_pretrained`."""


class PretrainedFormatError(ValueError):
    """A saved predictor cannot be loaded: missing, corrupt, mismatched or from an
    unsupported format version. The message names the file and the problem."""


def _as_path(path: Any, function: str) -> Path:
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(text, str):
        raise TypeError(f"{function}: path must be a str or os.PathLike naming the predictor's "
                        f"directory, got {type(path).__name__}")
    if not text:
        raise (PretrainedFormatError if function == "load_pretrained" else ValueError)(
            f"{function}: path is empty")
    return Path(text)


# --- strict JSON ------------------------------------------------------------------------
def _no_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:  # parsers disagree on which one wins: refuse
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _depth_at_most(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return False
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return True


def _show(value: Any) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object", type(None): "null"}.get(type(value), "?")
    text = json.dumps(value) if not isinstance(value, (dict, list)) else kind
    if len(text) > 60:
        text = text[:57] + "..."
    return text if text == kind else f"{text} ({kind})"


def _cut(items: Sequence[Any], n: int = 5) -> str:
    return f"{list(items[:n])}{' ...' if len(items) > n else ''}"


# --- saving -------------------------------------------------------------------------------
def _non_finite(tensors: Dict[str, torch.Tensor]) -> List[str]:
    return [f"{name} ({int((~torch.isfinite(t)).sum())} of {t.numel()} values)"
            for name, t in tensors.items()
            if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all())]


def _bundle(predictor: PretrainedGraphPredictor, dtype: Optional[torch.dtype],
            given: Any) -> Dict[str, bytes]:
    """The two files of ``predictor``: weights (``<fw|bw>.<name>``) and sealed config."""
    from safetensors.torch import save

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
    config[SEAL_KEY] = seal_of(config)  # (last: it covers everything above)
    text = json.dumps(config, indent=2, allow_nan=False).encode()
    return {WEIGHTS_NAME: payload, CONFIG_NAME: text}  # (the config is written last)


def save_pretrained(predictor: PretrainedGraphPredictor, path: PathLike,
                    dtype: Optional[torch.dtype] = None) -> Path:
    """Save ``predictor`` into directory ``path`` (created if needed): ``model.safetensors``
    (the weights of both directions, as ``<fw|bw>.<parameter name>``) and a sealed
    ``config.json`` (format and versions, each direction's class and constructor
    arguments, the vocabulary, the weights file's size and SHA-256).

    The directory is replaced as a whole (:func:`~glomo_pyg.atomic_files.replace_folder`:
    a killed save leaves the complete previous or the complete new predictor, or, killed
    between its two renames, the previous one in a backup that the next save puts back
    and loading names), so ``path`` must hold nothing but a saved predictor.

    Args:
        predictor: the predictor to save.
        path: the directory to write.
        dtype: store every floating-point tensor in this dtype (``torch.float16`` or
            ``torch.bfloat16`` halve the file; :func:`load_pretrained` widens them back);
            ``None`` keeps each tensor's own dtype.

    Returns:
        ``path``.

    Raises:
        TypeError: ``predictor`` or ``path`` has the wrong type.
        ValueError: ``path`` is a file or holds other entries, ``dtype`` is not a storage
            dtype, or a weight is NaN or infinite (after the cast).
    """
    if not isinstance(predictor, PretrainedGraphPredictor):
        raise TypeError(f"expected a PretrainedGraphPredictor, got {type(predictor).__name__}")
    given = _as_path(path, "save_pretrained")
    target = Path(os.path.realpath(given))
    if dtype is not None and dtype not in STORAGE_DTYPES:
        raise ValueError(f"save_pretrained: dtype must be None or one of {STORAGE_DTYPES}, got "
                         f"{dtype!r}")
    foreign = sorted(n for n in (os.listdir(target) if target.is_dir() else ())
                     if n not in (CONFIG_NAME, WEIGHTS_NAME) and not _OLD_TEMP_FILE.match(n))
    if foreign or os.path.lexists(target) and not target.is_dir():
        what = f"holds {_cut(foreign)} besides a saved predictor" if foreign else \
            "exists and is not a directory"
        raise ValueError(f"{given} {what}: save_pretrained replaces the whole directory, so "
                         "save into a new or empty directory")
    replace_folder(target, _bundle(predictor, dtype, given))
    return given


# --- loading: the folder and its files ------------------------------------------------------
def _missing_directory(path: Path) -> PretrainedFormatError:
    backup = interrupted_backup(Path(os.path.realpath(path)))
    if backup is not None:
        return PretrainedFormatError(
            f"{path} does not exist: a save_pretrained into it was interrupted while swapping "
            f"directories (or is running now); the previous predictor is complete in "
            f"{backup}. Rename {backup} to {path}, or save again (save_pretrained puts it "
            "back first)")
    return PretrainedFormatError(f"{path} does not exist")


def _resolve(given: PathLike) -> Tuple[Path, bool]:
    """The folder ``given`` names, and whether it is a release. A bare name (``x``, not
    ``./x``) that is no existing path, nor one an interrupted save left a backup of,
    names a released predictor."""
    path = _as_path(given, "load_pretrained")
    if isinstance(given, str) and not os.path.lexists(given) and \
            RELEASE_NAME.fullmatch(given) and \
            interrupted_backup(Path(os.path.realpath(given))) is None:
        names = released_names()
        if given not in names:
            raise PretrainedFormatError(f"{given!r} is neither a folder nor the name of a "
                                        f"released predictor; {available_releases(names)}")
        return releases_root() / given, True
    return path, in_releases_root(path)


def _open_file(path: Path, name: str, dir_fd: int) -> int:
    try:
        return open_regular(name, name, dir_fd=dir_fd)
    except (NotRegularFileError, OSError) as err:  # (a FIFO or device is never read)
        what = f"is missing: {path} was not written by save_pretrained, or the save did " \
            "not finish" if isinstance(err, FileNotFoundError) else \
            f"cannot be read: {getattr(err, 'strerror', None) or err}"
        raise PretrainedFormatError(f"{path / name} {what}") from None


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[Tuple[int, int]]:
    """File descriptors of the config and the weights, both opened through one handle on
    the directory: a save that swaps the directory meanwhile cannot pair one save's
    config with another's weights."""
    with contextlib.ExitStack() as stack:
        try:
            dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise _missing_directory(path) from None
        except OSError as err:
            what = f"is a file; a pretrained predictor is a directory holding {CONFIG_NAME} " \
                f"and {WEIGHTS_NAME} (written by save_pretrained)" if isinstance(
                    err, NotADirectoryError) else f"cannot be opened ({err.strerror})"
            raise PretrainedFormatError(f"{path} {what}") from None
        stack.callback(os.close, dir_fd)
        fds = [_open_file(path, name, dir_fd) for name in (CONFIG_NAME, WEIGHTS_NAME)]
        for fd in fds:
            stack.callback(os.close, fd)
        yield fds[0], fds[1]


def _read_fd(fd: int, size: int, file: Path, digest: Optional[Any] = None,
             keep: bool = True) -> bytearray:
    """The first ``size`` bytes of ``fd`` (empty unless ``keep``), read in chunks and
    hashed into ``digest`` as they come; a file that changes size meanwhile is refused."""
    data, done = bytearray(size if keep else 0), 0
    view = memoryview(data)
    os.lseek(fd, 0, os.SEEK_SET)
    while done < size:
        chunk = os.read(fd, min(_CHUNK, size - done))
        if not chunk:
            break
        if digest is not None:
            digest.update(chunk)
        if keep:
            view[done:done + len(chunk)] = chunk
        done += len(chunk)
    if done != size or os.read(fd, 1):
        raise PretrainedFormatError(f"{file} changed while it was read")
    return data


def _weights_size(file: Path, fd: int, expected: Optional[int] = None,
                  release: bool = False) -> int:
    """The weights file's size from ``fstat``, refused before any byte is read when over
    the bound (a sparse file may claim terabytes it never stored) or not ``expected``."""
    from glomo_pyg.io import releases

    size = os.fstat(fd).st_size
    limit = releases.MAX_WEIGHTS_BYTES if release else MAX_WEIGHTS_BYTES
    if size > limit:
        raise PretrainedFormatError(
            f"{file} has {size} bytes, more than the {limit} ({limit / 2**20:g} MiB) "
            f"{'a released' if release else 'a'} predictor's weights may have: it is not a "
            "file save_pretrained (or write_release) wrote; save the predictor again")
    if expected is not None and size != expected:
        raise PretrainedFormatError(
            f"{file} is truncated: {size} of {expected} bytes" if size < expected else
            f"{file} has {size} bytes, its config records {expected}: the file was replaced "
            "or corrupted")
    return size


def _read_config_bytes(file: Path, fd: int) -> bytes:
    """``config.json``'s bytes, refused by its size before reading when too large."""
    size = os.fstat(fd).st_size
    if size > MAX_CONFIG_BYTES:
        raise PretrainedFormatError(f"{file} has {size} bytes, more than the "
                                    f"{MAX_CONFIG_BYTES} a predictor config may have")
    return bytes(_read_fd(fd, size, file))


def _parse_config(data: bytes, file: Path) -> Dict[str, Any]:
    """``config.json``'s bytes as standard JSON (no NaN/Infinity, no duplicate keys,
    nested at most :data:`MAX_CONFIG_DEPTH` deep) of this format."""
    deep = f"nested more than {MAX_CONFIG_DEPTH} deep"
    try:
        config = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates,
                            parse_constant=_no_constant)
        why = deep if isinstance(config, (dict, list)) and \
            not _depth_at_most(config, MAX_CONFIG_DEPTH) else None
    except RecursionError:
        why = deep
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, too many digits, hooks
        why = f"not UTF-8: {err}" if isinstance(err, UnicodeDecodeError) else str(err)
    if why is not None:
        raise PretrainedFormatError(f"{file} is not valid JSON ({why})")
    return config if isinstance(config, dict) else {}


# --- loading: the config ------------------------------------------------------------------
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# the top-level entries of a config (trained_length and trained_size are checked by the
# PretrainedGraphPredictor they are given to): dotted key, test, what it must be
_ENTRIES = (
    ("format", lambda v: v == FORMAT, f"{FORMAT!r} (a glomo_pyg pretrained-predictor config)"),
    ("format_version", lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    ("directions", lambda v: isinstance(v, dict) and v and set(v) <= set(DIRECTION_KEYS),
     f"a non-empty object with keys among {sorted(DIRECTION_KEYS)}"),
    ("weights.file", lambda v: v == WEIGHTS_NAME, repr(WEIGHTS_NAME)),
    ("weights.bytes", lambda v: _is_int(v) and v >= 8,
     "the weights file's size in bytes (a safetensors file has at least 8)"),
    ("weights.sha256", lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v),
     "64 lowercase hex digits"),
    ("vocabulary", lambda v: v is None or isinstance(v, list) and len(v) <= MAX_VOCABULARY
     and all(isinstance(t, str) for t in v), f"a list of strings (at most {MAX_VOCABULARY})"))


def _check_entries(config: Dict[str, Any], file: Path) -> None:
    def get(key: str) -> Any:
        value = config
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    bad = [f"{key} must be {what}, got {_show(get(key))}" for key, test, what in _ENTRIES
           if not test(get(key))]
    bad = bad[:1] if config.get("format") != FORMAT else bad  # (not a config at all)
    if bad:
        raise PretrainedFormatError(f"{file}: " + "; ".join(bad))


def _check_version(config: Dict[str, Any], file: Path, path: Path, unsealed_ok: bool) -> None:
    version = config["format_version"]
    if version > FORMAT_VERSION:
        writer = config.get("glomo_pyg_version")
        writer = writer if isinstance(writer, str) and len(writer) <= 64 else "?"
        raise PretrainedFormatError(
            f"{file} has format version {version}, written by glomo_pyg {writer}; this "
            f"glomo_pyg ({__version__}) reads versions up to {FORMAT_VERSION}: upgrade glomo_pyg")
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
                      f"with `glomo reseal {path}`", UnsealedPredictorWarning, stacklevel=4)


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


# Named emitter constructor arguments that format-2 files may lack: arguments added
# after format 2 first appeared, whose constructor defaults reproduce what files saved
# without them did. Any other missing one means an edited or truncated file: it is
# refused rather than filled with a default.
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
    missing = _missing_arguments(cls, config) if complete else []
    if unknown or missing:  # (a saved config records every named argument)
        raise PretrainedFormatError(
            f"{file}: cannot build the {direction} {cls.__name__} from its config: "
            + "; ".join(f"{what} arguments {_cut(names)}" for what, names in (
                ("unknown", unknown), ("it lacks", missing)) if names)
            + " (the file was edited or truncated)")
    for key, value in config.items():
        check_model_setting(key, value, PretrainedFormatError, show=_show, typed=True,
                            key=f"{file}: {direction} {cls.__name__} config: {key}")
    return cls, config


def _entries(config: Dict[str, Any], file: Path) -> Dict[str, Tuple[type, Dict[str, Any]]]:
    directions, version = config["directions"], config["format_version"]
    return {d: _entry(d, _legacy_entry(directions[d]) if version == 1 else directions[d],
                      file, complete=version >= 2)
            for d in DIRECTION_KEYS if d in directions}


# --- loading: modules and weights ---------------------------------------------------------
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
    return module  # (one built for the other direction: PretrainedGraphPredictor refuses it)


def _header(fd: int, file: Path) -> Dict[str, Tuple[int, ...]]:
    """Tensor names and shapes from the safetensors header, read by safetensors itself
    (which also refuses a file its tensors do not exactly cover); no tensor is read."""
    from safetensors import safe_open

    where = f"/dev/fd/{fd}" if os.path.isdir("/dev/fd") else str(file)  # (the opened file)
    try:
        with safe_open(where, framework="pt") as opened:
            return {k: tuple(opened.get_slice(k).get_shape()) for k in opened.keys()}
    except Exception as err:  # safetensors raises its own error types for bad headers
        raise PretrainedFormatError(f"{file} is not a valid safetensors file ({err})") from None


def _expected(entries: Dict[str, Tuple[type, Dict[str, Any]]], header: Dict[str, Tuple],
              file: Path, config_file: Path) -> Dict[str, torch.Tensor]:
    """The tensors the config describes (on the meta device), which must be the header's."""
    budget = 8 * len(header) + 256  # modules and non-persistent buffers included
    expected = torch.nn.ModuleDict({DIRECTION_KEYS[d]: _build(d, cls, c, config_file, budget)
                                    for d, (cls, c) in entries.items()}).state_dict()
    missing = sorted(set(expected) - set(header))
    unexpected = sorted(k[:60] for k in set(header) - set(expected))
    shapes = [f"{k}: file {header[k]} vs config {tuple(expected[k].shape)}"
              for k in sorted(set(expected) & set(header)) if header[k] != expected[k].shape]
    parts = [f"{what} {_cut(items)}" for what, items in (
        ("missing tensors", missing), ("unexpected tensors", unexpected)) if items]
    parts += ["shape mismatch " + "; ".join(shapes[:5])] if shapes else []
    if parts:
        raise PretrainedFormatError(f"{file} does not match {config_file}: " + "; ".join(parts))
    return expected


def _read_weights(path: Path, fd: int, config: Dict[str, Any],
                  entries: Dict[str, Tuple[type, Dict[str, Any]]],
                  release: bool) -> Dict[str, torch.Tensor]:
    """The weights, once the file's size, header, SHA-256, dtypes and values pass."""
    from safetensors.torch import load

    file = path / WEIGHTS_NAME
    size = _weights_size(file, fd, config["weights"]["bytes"], release)
    expected = _expected(entries, _header(fd, file), file, path / CONFIG_NAME)
    digest = hashlib.sha256()
    data = _read_fd(fd, size, file, digest)  # (filled while hashed)
    if config["weights"]["sha256"] != digest.hexdigest():
        raise PretrainedFormatError(f"{file} does not match the SHA-256 recorded in "
                                    f"{CONFIG_NAME}: the file is corrupt or was modified")
    try:
        weights = load(bytes(data))
    except Exception as err:  # (a pickle or random bytes: refused before interpretation)
        raise PretrainedFormatError(f"{file} is not a valid safetensors file ({err})") from None
    bad = [k for k, t in weights.items() if k not in expected or t.dtype != expected[k].dtype
           and not (t.dtype in STORAGE_DTYPES[1:] and expected[k].is_floating_point()
                    and expected[k].element_size() > 2)]  # 16-bit floats widen, nothing else
    values = [] if bad else _non_finite(weights)
    if bad or values:  # (a predictor with NaN weights emits empty or meaningless graphs)
        raise PretrainedFormatError(f"{file}: unexpected dtypes for {bad[:5]}" if bad else
                                    f"{file}: NaN or infinite weights in "
                                    f"{', '.join(values[:5])}{' ...' if len(values) > 5 else ''}")
    return weights


def _check_vocabulary(given: Optional[Sequence[str]], saved: Optional[List[str]],
                      file: Path) -> None:
    if given is None:
        return
    given = [str(t) for t in given]
    if given != saved:
        if saved is None or len(given) != len(saved):
            detail = f"{len(given)} tokens given, {len(saved) if saved else 'none'} saved"
        else:
            i = next(i for i, (a, b) in enumerate(zip(given, saved)) if a != b)
            detail = f"first difference at id {i}: {given[i]!r} given, {saved[i]!r} saved"
        raise PretrainedFormatError(f"vocabulary mismatch with {file}: {detail}")


def _check_arguments(map_location: Any, vocabulary: Any) -> None:
    try:
        cuda = map_location is not None and torch.device(map_location).type == "cuda"
        why = ": CUDA is not available here" if cuda and not torch.cuda.is_available() else None
    except (RuntimeError, TypeError) as err:
        why = f" is not a device: {err}"
    if why is not None:
        raise ValueError(f"map_location {map_location!r}{why}")
    if vocabulary is not None and (isinstance(vocabulary, (str, bytes)) or
                                   not hasattr(vocabulary, "__iter__")):
        raise TypeError(f"vocabulary must be a sequence of tokens, got "
                        f"{type(vocabulary).__name__}")


def load_pretrained(path: PathLike, map_location: Union[str, torch.device, None] = None,
                    vocabulary: Optional[Sequence[str]] = None,
                    allow_unsealed: bool = False) -> PretrainedGraphPredictor:
    """Load a predictor written by :func:`save_pretrained`, in eval mode.

    The files are untrusted input, checked in order: the config is at most
    :data:`MAX_CONFIG_BYTES` of standard JSON, of a known format and version, and its
    seal matches; every emitter argument has its JSON type and lies within the range of
    :class:`~glomo_pyg.nn.settings.ModelSettings`; the weights file has the recorded size
    (by ``fstat``, before it is read) and a safetensors header listing exactly the
    tensors and shapes the config describes (modules built on the meta device); then it
    is read and hashed in chunks, and its tensors must have the expected dtypes (16-bit
    floats are widened) and be finite. Only then are the modules built. Both files must
    be regular files (a FIFO is never read). Staging folders of killed saves are removed.

    Args:
        path: the directory given to :func:`save_pretrained`, or the name of a released
            predictor (a bare name such as ``'imdb-text-cpu'`` that is no existing path).
        map_location: device to put the weights on (default: CPU).
        vocabulary: if given, it must equal the saved vocabulary.
        allow_unsealed: load a predictor of format 1 or 2 (not sealed), with an
            :class:`UnsealedPredictorWarning`; without it such a predictor is refused
            (seal it with :func:`reseal_pretrained`). A folder inside
            :func:`~glomo_pyg.io.releases.releases_root`, however named, is a release and
            must always pass its seal.

    Raises:
        TypeError: ``path`` is not a str or os.PathLike.
        PretrainedFormatError: a missing folder (for a bare name, the message lists the
            released predictors), a missing, corrupt or modified file, a newer format, a
            config value of the wrong type or out of range, weights that do not match the
            config or are not finite, or a vocabulary mismatch; the message names the file.
    """
    path, is_release = _resolve(path)
    _check_arguments(map_location, vocabulary)
    config_file = path / CONFIG_NAME
    remove_stale(Path(os.path.realpath(path)))
    with _opened(path) as (config_fd, weights_fd):
        config = _parse_config(_read_config_bytes(config_file, config_fd), config_file)
        _check_entries(config, config_file)
        _check_version(config, config_file, path, allow_unsealed and not is_release)
        entries = _entries(config, config_file)
        weights = _read_weights(path, weights_fd, config, entries, is_release)
    modules = {d: _build(d, cls, c, config_file) for d, (cls, c) in entries.items()}
    torch.nn.ModuleDict({DIRECTION_KEYS[d]: m for d, m in modules.items()}).load_state_dict(
        weights, strict=True)
    _check_vocabulary(vocabulary, config.get("vocabulary"), config_file)
    try:
        predictor = PretrainedGraphPredictor(modules.get("forward"), modules.get("backward"),
                                             config.get("vocabulary"),
                                             config.get("trained_length"),
                                             config.get("trained_size"))
    except (TypeError, ValueError) as err:
        raise PretrainedFormatError(f"{config_file}: {err}") from None
    if map_location is not None:
        predictor = predictor.to(map_location)
    return predictor.eval()


def reseal_pretrained(path: PathLike) -> Path:
    """Seal a saved predictor again, as it now is: a ``config.json`` edited on purpose,
    or a predictor of format 1 or 2. The weights' size and SHA-256 are recorded anew and
    the format version becomes the current one; the new ``config.json`` replaces the old
    one atomically, and if the predictor then fails :func:`load_pretrained` the old one
    is put back and the error raised. A format-1 predictor is loaded and saved again.

    Returns:
        ``path``.
    """
    given, path = path, _as_path(path, "reseal_pretrained")
    config_file, weights_file = path / CONFIG_NAME, path / WEIGHTS_NAME
    with _opened(path) as (config_fd, weights_fd):
        old = _read_config_bytes(config_file, config_fd)
        digest, size = hashlib.sha256(), _weights_size(weights_file, weights_fd)
        _read_fd(weights_fd, size, weights_file, digest, keep=False)
    config = _parse_config(old, config_file)
    if config.get("format_version") == 1:  # another layout: migrated by a new save
        with warnings.catch_warnings():  # (being sealed is what was asked for)
            warnings.simplefilter("ignore", UnsealedPredictorWarning)
            predictor = load_pretrained(path, allow_unsealed=True)
        save_pretrained(predictor, path)
        return given
    config["format_version"] = FORMAT_VERSION
    config["weights"] = dict(file=WEIGHTS_NAME, bytes=size, sha256=digest.hexdigest())
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
