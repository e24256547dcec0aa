"""The file format of saved graph predictors: a sealed JSON config plus safetensors
weights in one directory (docs/pretrained.md). Everything here reads and writes plain
data (a config and tensors); building modules from it is
:class:`~glomo_pyg.nn.PretrainedGraphPredictor`'s part, which reaches the files only
through this module. Both files are untrusted on reading, and nothing is ever
unpickled."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import (
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Union,
    cast,
    runtime_checkable,
)

import torch

from glomo_pyg.atomic_files import (
    atomic_write,
    interrupted_backup,
    remove_stale,
    replace_folder,
    write_json,
)
from glomo_pyg.graphs import DIRECTION_KEYS
from glomo_pyg.io import releases
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

MAX_CONFIG_BYTES = 256 << 20      # a 16M-token vocabulary fits
MAX_CONFIG_DEPTH = 16             # a saved config nests 5 deep
MAX_WEIGHTS_BYTES = 8 << 30       # far above any real predictor; checked before reading
_CHUNK = 1 << 22                  # weights are read and hashed this much at a time

# floating weights may be stored in 16 bits (released predictors are), widened on load
STORAGE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_OLD_TEMP_FILE = re.compile(r"^\.(config\.json|model\.safetensors)\..+\.tmp$")


MAX_VOCABULARY = 1 << 24  # token types a saved vocabulary may hold


@runtime_checkable
class SavablePredictor(Protocol):
    """What the files' writers (the Hub route, releases) read of a predictor: a
    :class:`~glomo_pyg.nn.PretrainedGraphPredictor` is one."""

    vocabulary: Optional[List[str]]

    @property
    def modality(self) -> str: ...

    @property
    def image_size(self) -> Optional[Tuple[int, int]]: ...

    @property
    def directions(self) -> tuple: ...

    @property
    def num_tokens(self) -> Optional[int]: ...

    @property
    def in_channels(self) -> Optional[int]: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def heads(self) -> int: ...

    def save_pretrained(self, path: Any, dtype: Optional[torch.dtype] = None) -> None: ...


class UnsealedPredictorWarning(UserWarning):
    """A predictor of format 1 or 2 was loaded: edits to it cannot be detected."""


class PretrainedFormatError(ValueError):
    """A saved predictor is missing, corrupt, mismatched or of a newer format."""


def _as_path(path: Any, function: str) -> Path:
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text:
        error = TypeError if not isinstance(text, str) else \
            PretrainedFormatError if function == "load_pretrained" else ValueError
        raise error(f"{function}: path is empty" if error is not TypeError else
                    f"{function}: path must be a str or os.PathLike naming the predictor's "
                    f"directory, got {type(path).__name__}")
    if "\0" in text:  # (os.path would fail on it with no word of which input)
        error = PretrainedFormatError if function == "load_pretrained" else ValueError
        raise error(f"{function}: the predictor's path or release name {text!r} holds a NUL "
                    "character: it is neither a file name nor a released predictor's name")
    return Path(text)


def _no_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:  # parsers disagree on which one wins: refuse
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a JSON number" if text.endswith(("NaN", "Infinity")) else
                         f"{text} is beyond the range of a float")
    return value


def _depth(value: Any) -> int:  # of an object or a list
    children = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(c) for c in children if isinstance(c, (dict, list))), default=0)


def describe_value(value: Any) -> str:
    """``value`` for an error message: short, with its JSON kind."""
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object", type(None): "null"}.get(type(value), "?")
    text = kind if isinstance(value, (dict, list)) else json.dumps(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return text if text == kind else f"{text} ({kind})"


def first_items(items: Sequence[Any], n: int = 5) -> str:
    """The first ``n`` of ``items``, for an error message."""
    return f"{list(items[:n])}{' ...' if len(items) > n else ''}"


def non_finite(tensors: Dict[str, torch.Tensor]) -> str:
    """What of ``tensors`` is NaN or infinite (``''``: nothing)."""
    bad = [f"{name} ({int((~torch.isfinite(t)).sum())} of {t.numel()} values)"
           for name, t in tensors.items()
           if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all())]
    return f"NaN or infinite weights in {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}" \
        if bad else ""


def write_predictor(path: PathLike, body: Dict[str, Any], tensors: Dict[str, torch.Tensor],
                    dtype: Optional[torch.dtype] = None) -> Path:
    """Write the predictor ``body`` (its ``directions``, ``vocabulary``, ... as
    :meth:`~glomo_pyg.nn.PretrainedGraphPredictor.save_pretrained` gives them) and its
    weights ``tensors`` into directory ``path``, replacing it whole; return ``path``. The
    config gets the format's header, the weights' size and SHA-256, and its seal.

    Args:
        path: the directory to write; it may hold only a saved predictor.
        body: the config's entries beyond the format's own.
        tensors: the weights by name (``<fw|bw>.<name>``).
        dtype: store every floating-point tensor in this dtype (``torch.float16`` or
            ``torch.bfloat16`` halve the file; loading widens them back); ``None`` keeps
            each tensor's own dtype.

    Raises:
        TypeError: ``path`` has the wrong type.
        ValueError: ``path`` is a file or holds other entries, ``dtype`` is not a storage
            dtype, or a weight is NaN or infinite (after the cast).
    """
    from safetensors.torch import save

    given = _as_path(path, "save_pretrained")
    target = Path(os.path.realpath(given))
    storage = dtype if isinstance(dtype, torch.dtype) and dtype in STORAGE_DTYPES else None
    tensors = {name: t.detach().to("cpu", storage if storage is not None and
                                   t.is_floating_point() else t.dtype).contiguous()
               for name, t in tensors.items()}
    _check_writable(given, target, dtype, storage, tensors)
    payload = save(tensors)
    config: Dict[str, Any] = dict(
        format=FORMAT, format_version=FORMAT_VERSION, glomo_pyg_version=__version__, **body,
        weights=dict(file=WEIGHTS_NAME, bytes=len(payload),
                     sha256=hashlib.sha256(payload).hexdigest()))
    config[SEAL_KEY] = seal_of(config)  # (last: it covers everything above)
    replace_folder(target, {WEIGHTS_NAME: payload,  # (the config is written last)
                            CONFIG_NAME: json.dumps(config, indent=2, allow_nan=False).encode()})
    return given


def _check_writable(given: Path, target: Path, dtype: Any, storage: Optional[torch.dtype],
                    tensors: Dict[str, torch.Tensor]) -> None:
    """Refuse a save into ``target`` that would replace something else, or lose values."""
    foreign = sorted(n for n in (os.listdir(target) if target.is_dir() else ())
                     if n not in (CONFIG_NAME, WEIGHTS_NAME) and not _OLD_TEMP_FILE.match(n))
    whole = "save_pretrained replaces the whole directory, so save into a new or empty directory"
    values = non_finite(tensors)  # (after the cast: float16 overflows to infinity)
    problems = [text for bad, text in (
        (dtype is not None and storage is None,
         f"save_pretrained: dtype must be None or one of {STORAGE_DTYPES}, got {dtype!r}"),
        (foreign, f"{given} holds {first_items(foreign)} besides a saved predictor: {whole}"),
        (os.path.lexists(target) and not target.is_dir(),
         f"{given} exists and is not a directory: {whole}"),
        (values, f"cannot save {given}: {values} (load_pretrained refuses them)"))
        if bad]
    if problems:
        raise ValueError("; ".join(problems))

def _resolve(given: PathLike) -> Tuple[Path, Optional[str]]:
    """The folder ``given`` names, and the release name it is found under (``None``: not
    a release; a bare name is a release's name)."""
    path = _as_path(given, "load_pretrained")
    if isinstance(given, str) and not os.path.lexists(given) and \
            releases.RELEASE_NAME.fullmatch(given) and \
            interrupted_backup(Path(os.path.realpath(given))) is None:
        names = releases.released_names()
        if given not in names:
            raise PretrainedFormatError(f"{given!r} is neither a folder nor the name of a "
                                        "released predictor; "
                                        + releases.available_releases(names))
        return releases.releases_root() / given, given
    return path, releases.release_name_of(path)


def _open_error(path: Path, name: Optional[str], err: Exception) -> PretrainedFormatError:
    """Why the folder ``path`` (``name`` None) or its file ``name`` cannot be opened."""
    missing = isinstance(err, FileNotFoundError)
    if name is not None:
        return PretrainedFormatError(f"{path / name} " + (
            f"is missing: {path} was not written by save_pretrained, or the save did not "
            "finish" if missing else f"cannot be read: {getattr(err, 'strerror', None) or err}"))
    what = "does not exist" if missing else f"is a file; a pretrained predictor is a " \
        f"directory holding {CONFIG_NAME} and {WEIGHTS_NAME} (written by save_pretrained)" \
        if isinstance(err, NotADirectoryError) else \
        f"cannot be opened ({cast(OSError, err).strerror})"  # (os.open's error)
    backup = interrupted_backup(Path(os.path.realpath(path))) if missing else None
    if backup is not None:
        what += (": a save_pretrained into it was interrupted while swapping directories (or "
                 f"is running now); the previous predictor is complete in {backup}. Rename "
                 f"{backup} to {path}, or save again (save_pretrained puts it back first)")
    return PretrainedFormatError(f"{path} {what}")


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[Tuple[int, int]]:
    """Descriptors of the config and the weights, opened through one folder handle."""
    with contextlib.ExitStack() as stack:
        fds, name = [], None
        try:
            dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            stack.callback(os.close, dir_fd)
            for name in (CONFIG_NAME, WEIGHTS_NAME):
                fds.append(open_regular(name, name, dir_fd=dir_fd))
                stack.callback(os.close, fds[-1])
        except (NotRegularFileError, OSError) as err:
            raise _open_error(path, name, err) from None
        yield fds[0], fds[1]


def _read_fd(fd: int, size: int, file: Path, digest: Optional[Any] = None,
             keep: bool = True) -> bytearray:
    """The ``size`` bytes of ``fd`` (if ``keep``), hashed into ``digest`` chunk by chunk."""
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


def _size(file: Path, fd: int, expected: Optional[int] = None,
          release: Optional[bool] = None) -> int:
    """The weights' (``release`` None: config's) size, refused unread if over its bound."""
    limit, what = (MAX_CONFIG_BYTES, "a predictor config") if release is None else (
        releases.MAX_WEIGHTS_BYTES, "a released predictor's weights") if release else (
        MAX_WEIGHTS_BYTES, "a predictor's weights")
    size = os.fstat(fd).st_size
    if size > limit or expected is not None and size != expected:
        raise PretrainedFormatError(
            f"{file} has {size} bytes, more than the {limit} ({limit / 2**20:g} MiB) {what} "
            "may have: it is not a file save_pretrained (or write_release) wrote; save the "
            "predictor again"
            if size > limit else f"{file} is truncated: {size} of {expected} bytes"
            if size < cast(int, expected) else f"{file} has {size} bytes, its config records "
            f"{expected}: the file was replaced or corrupted")
    return size


def _parse_config(data: Union[bytes, bytearray], file: Path) -> Dict[str, Any]:
    """``config.json`` as strict JSON: no NaN, duplicate keys or deep nesting."""
    deep = f"nested more than {MAX_CONFIG_DEPTH} deep"
    try:
        config = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates,
                            parse_constant=_finite, parse_float=_finite)
        why = deep if isinstance(config, (dict, list)) and \
            _depth(config) > MAX_CONFIG_DEPTH else None
    except RecursionError:  # (json and _depth both recurse)
        why = deep
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, too many digits, hooks
        why = f"not UTF-8: {err}" if isinstance(err, UnicodeDecodeError) else str(err)
    if why is not None:
        raise PretrainedFormatError(f"{file} is not valid JSON ({why})")
    return config if isinstance(config, dict) else {}


# (dotted key, test, what it must be) of a config's entries; PretrainedGraphPredictor
# checks trained_length and trained_size
_ENTRIES = (
    ("format", lambda v: v == FORMAT, f"{FORMAT!r} (a glomo_pyg pretrained-predictor config)"),
    ("format_version", lambda v: type(v) is int and v >= 1, "an integer >= 1"),
    ("directions", lambda v: isinstance(v, dict) and v and set(v) <= set(DIRECTION_KEYS),
     f"a non-empty object with keys among {sorted(DIRECTION_KEYS)}"),
    ("weights.file", lambda v: v == WEIGHTS_NAME, repr(WEIGHTS_NAME)),
    ("weights.bytes", lambda v: type(v) is int and v >= 8,
     "the weights file's size in bytes (a safetensors file has at least 8)"),
    ("weights.sha256", lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v),
     "64 lowercase hex digits"),
    ("vocabulary", lambda v: v is None or isinstance(v, list) and len(v) <= MAX_VOCABULARY
     and all(isinstance(t, str) for t in v), f"a list of strings (at most {MAX_VOCABULARY})"),
    # (absent from configs saved before it was recorded: inferred from the vocabulary)
    ("lowercase", lambda v: v is None or isinstance(v, bool), "true, false or null"))


def _check_entries(config: Dict[str, Any], file: Path) -> None:
    def get(key: str) -> Any:  # the value at dotted ``key``, or None
        return functools.reduce(lambda value, part: value.get(part) if isinstance(
            value, dict) else None, key.split("."), cast(Any, config))

    bad = [f"{key} must be {what}, got {describe_value(get(key))}" for key, test, what in _ENTRIES
           if not test(get(key))]
    bad = bad[:1] if config.get("format") != FORMAT else bad  # (not a config at all)
    if bad:
        raise PretrainedFormatError(f"{file}: " + "; ".join(bad))


def _check_version(config: Dict[str, Any], file: Path, path: Path, unsealed_ok: bool) -> None:
    version, reseal = config["format_version"], f"`glomo reseal {path}`"
    if SEALED_SINCE > version and unsealed_ok:
        warnings.warn(f"{file} has format version {version}, saved before predictors were "
                      "sealed: edits to its config or vocabulary cannot be detected. Seal it "
                      f"with {reseal}", UnsealedPredictorWarning, stacklevel=4)
        return
    writer = config.get("glomo_pyg_version")
    writer = writer if isinstance(writer, str) and len(writer) <= 64 else "?"
    problem = seal_problem(config) if SEALED_SINCE <= version <= FORMAT_VERSION else None
    why = (f"{file} has format version {version}, written by glomo_pyg {writer}; this "
           f"glomo_pyg ({__version__}) reads versions up to {FORMAT_VERSION}: upgrade glomo_pyg"
           if version > FORMAT_VERSION else
           f"{file}: {problem}. If the edit was deliberate, seal the predictor again with "
           f"{reseal} (glomo_pyg.publish.reseal_pretrained)" if problem else
           # (a lowered version must not step around the seal)
           f"{file} has format version {version}, which is not sealed: edits to its config "
           f"or vocabulary cannot be detected. Seal it with {reseal} (reseal_pretrained); to "
           "load it unsealed once, pass allow_unsealed=True (a released predictor must "
           "always be sealed)" if version < SEALED_SINCE else None)
    if why is not None:
        raise PretrainedFormatError(why)


@contextlib.contextmanager
def _safetensors_errors(file: Path) -> Iterator[None]:
    """safetensors' own errors for a bad ``file`` as a :class:`PretrainedFormatError`."""
    try:
        yield
    except Exception as err:
        raise PretrainedFormatError(f"{file} is not a valid safetensors file ({err})") from None


Expected = Callable[[Dict[str, Tuple[int, ...]]], Dict[str, torch.Tensor]]


def _read_weights(path: Path, fd: int, config: Dict[str, Any], expected_tensors: Expected,
                  release: bool) -> Dict[str, torch.Tensor]:
    """The weights, once the file's size, header, SHA-256, dtypes and values pass;
    ``expected_tensors(header)``: the tensors the config describes (meta tensors are
    enough), given the file's header (names and shapes), or a
    :class:`PretrainedFormatError`."""
    from safetensors import safe_open
    from safetensors.torch import load

    file = path / WEIGHTS_NAME
    size = _size(file, fd, config["weights"]["bytes"], release)
    where = f"/dev/fd/{fd}" if os.path.isdir("/dev/fd") else str(file)  # (the opened file)
    with _safetensors_errors(file), safe_open(where, framework="pt") as opened:  # (no tensor)
        header = {k: tuple(opened.get_slice(k).get_shape()) for k in opened.keys()}
    expected = expected_tensors(header)
    digest = hashlib.sha256()
    data = _read_fd(fd, size, file, digest)  # (filled while hashed)
    if config["weights"]["sha256"] != digest.hexdigest():
        raise PretrainedFormatError(f"{file} does not match the SHA-256 recorded in "
                                    f"{CONFIG_NAME}: the file is corrupt or was modified")
    with _safetensors_errors(file):  # (a pickle or random bytes: refused, never interpreted)
        weights = load(bytes(data))
    bad = [k for k, t in weights.items() if k not in expected or t.dtype != expected[k].dtype
           and not (t.dtype in STORAGE_DTYPES[1:] and expected[k].is_floating_point()
                    and expected[k].element_size() > 2)]  # 16-bit floats widen, nothing else
    values = "" if bad else non_finite(weights)
    if bad or values:  # (a predictor with NaN weights emits empty or meaningless graphs)
        raise PretrainedFormatError(f"{file}: unexpected dtypes for {bad[:5]}" if bad else
                                    f"{file}: {values}")
    return weights


def check_vocabulary(given: Sequence[str], saved: Optional[List[str]], file: Path) -> None:
    """Refuse a ``given`` vocabulary other than the ``saved`` one of ``file``."""
    given = [str(t) for t in given]
    if given != saved:
        i = next(i for i, (a, b) in enumerate(zip(given, saved)) if a != b) \
            if saved is not None and len(given) == len(saved) else None
        raise PretrainedFormatError(f"vocabulary mismatch with {file}: " + (
            f"{len(given)} tokens given, {len(saved) if saved else 'none'} saved" if i is None
            else f"first difference at id {i}: {given[i]!r} given, "
                 f"{cast(List[str], saved)[i]!r} saved"))


def check_release(name: str, path: Path, config: Dict[str, Any], modality: str) -> None:
    """Refuse the release folder ``path`` found under ``name`` unless it is that release
    (its sealed name, its card: :func:`glomo_pyg.io.releases.release_problem`)."""
    try:
        problem = releases.release_problem(name, path, config, modality)
    except ValueError as err:  # its card is too large or no regular file
        problem = str(err)
    if problem is not None:
        raise PretrainedFormatError(problem)




@dataclass
class SavedFolder:
    """An opened predictor folder whose config passed every check of the format (strict
    JSON, entries, version, seal); :meth:`read_weights` reads and checks the weights
    through the descriptor opened with the config."""

    path: Path
    release: Optional[str]  # the release name it was found under, if any
    config: Dict[str, Any]
    weights_fd: int

    @property
    def config_file(self) -> Path:
        return self.path / CONFIG_NAME

    @property
    def version(self) -> int:
        return cast(int, self.config["format_version"])

    def read_weights(self, expected_tensors: Expected) -> Dict[str, torch.Tensor]:
        """The weights, once their size, header (against ``expected_tensors(header)``),
        SHA-256, dtypes and values pass."""
        return _read_weights(self.path, self.weights_fd, self.config, expected_tensors,
                             self.release is not None)


@contextlib.contextmanager
def open_saved(given: PathLike, allow_unsealed: bool = False) -> Iterator[SavedFolder]:
    """The predictor folder ``given`` (a path, or a released predictor's bare name),
    opened and its config checked (docs/design.md lists the checks in order); a
    release is never loaded unsealed.

    Raises:
        TypeError: ``given`` is not a str or os.PathLike.
        PretrainedFormatError: a missing folder or release, a path or name holding a NUL,
            a missing, corrupt, edited or newer config.
    """
    path, release = _resolve(given)
    config_file = path / CONFIG_NAME
    remove_stale(Path(os.path.realpath(path)))
    with _opened(path) as (config_fd, weights_fd):
        config = _parse_config(_read_fd(config_fd, _size(config_file, config_fd),
                                        config_file), config_file)
        _check_entries(config, config_file)
        _check_version(config, config_file, path, allow_unsealed and release is None)
        yield SavedFolder(path, release, config, weights_fd)


def read_unsealed(path: PathLike) -> Tuple[bytes, Dict[str, Any]]:
    """The config of the saved predictor ``path`` as it is (bytes and parsed, not held
    to its seal), with its ``weights`` entry set to the weights file as it now is."""
    path = _as_path(path, "reseal_pretrained")
    config_file, weights_file = path / CONFIG_NAME, path / WEIGHTS_NAME
    with _opened(path) as (config_fd, weights_fd):
        old = bytes(_read_fd(config_fd, _size(config_file, config_fd), config_file))
        digest, size = hashlib.sha256(), _size(weights_file, weights_fd, release=False)
        _read_fd(weights_fd, size, weights_file, digest, keep=False)
    config = _parse_config(old, config_file)
    config["weights"] = dict(file=WEIGHTS_NAME, bytes=size, sha256=digest.hexdigest())
    return old, config


def write_config(path: PathLike, config: Union[Dict[str, Any], bytes]) -> None:
    """Write ``config`` as the config of the saved predictor ``path``: a dict sealed at
    the current format version, or bytes as they are (an old config put back)."""
    config_file = Path(path) / CONFIG_NAME
    if isinstance(config, bytes):
        with atomic_write(config_file, "wb") as fh:
            fh.write(config)
        return
    body = {**config, "format_version": FORMAT_VERSION}
    write_json(config_file, {**body, SEAL_KEY: seal_of(body)}, allow_nan=False)
