"""Saving and loading pretrained graph predictors: a JSON config with a format
version plus safetensors weights. Loading never unpickles anything."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Union

import torch

from glomo_pyg.graphs import DIRECTION_KEYS
from glomo_pyg.nn import FeatureGraphEmitter, GraphPredictor  # noqa: F401 (registers emitters)
from glomo_pyg.nn.emitter import EMITTERS
from glomo_pyg.nn.pretrained import PretrainedGraphPredictor, register_persistence
from glomo_pyg.version import __version__

FORMAT = "glomo_pyg.pretrained_graph_predictor"
# 2: each direction saves its emitter's config() (the layout, a run-time choice, is no
#    longer part of it); 1: hand-copied constructor kwargs (still read, see _legacy_entry)
FORMAT_VERSION = 2
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

PathLike = Union[str, os.PathLike]


class PretrainedFormatError(ValueError):
    """A saved predictor cannot be loaded: missing, corrupt, mismatched or from an
    unsupported format version. The message names the file and the problem."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _atomic_write(path: Path, write) -> None:
    """Write through a temporary file in the same directory, then rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_pretrained(predictor: PretrainedGraphPredictor, path: PathLike) -> Path:
    """Save ``predictor`` into directory ``path`` (created if needed).

    Writes ``model.safetensors`` (all weights of both directions, as
    ``<fw|bw>.<parameter name>``) and then ``config.json``: the format name and
    version, the glomo_pyg version, each direction's class and constructor
    arguments, the vocabulary, and the weights file's size and SHA-256. Each
    file is written to a temporary name and renamed, so an interrupted save
    never leaves a config that points at partial weights.
    """
    from safetensors.torch import save

    if not isinstance(predictor, PretrainedGraphPredictor):
        raise TypeError(f"expected a PretrainedGraphPredictor, got {type(predictor).__name__}")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} exists and is not a directory")
    path.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu").contiguous()
               for name, t in predictor.predictors.state_dict().items()}
    payload = save(tensors)
    _atomic_write(path / WEIGHTS_NAME, lambda fh: fh.write(payload))
    config: Dict[str, Any] = dict(
        format=FORMAT, format_version=FORMAT_VERSION, glomo_pyg_version=__version__,
        directions={d: dict(cls=type(predictor.predictor(d)).__name__,
                            config=predictor.predictor(d).config())
                    for d in predictor.directions},
        vocabulary=predictor.vocabulary,
        weights=dict(file=WEIGHTS_NAME, bytes=len(payload),
                     sha256=hashlib.sha256(payload).hexdigest()))
    text = json.dumps(config, indent=2).encode()
    _atomic_write(path / CONFIG_NAME, lambda fh: fh.write(text))
    return path


def _read_config(path: Path) -> Dict[str, Any]:
    if not path.exists():
        raise PretrainedFormatError(f"{path} does not exist")
    if not path.is_dir():
        raise PretrainedFormatError(f"{path} is a file; a pretrained predictor is a directory "
                                    f"holding {CONFIG_NAME} and {WEIGHTS_NAME} (written by "
                                    "save_pretrained)")
    file = path / CONFIG_NAME
    if not file.is_file():
        raise PretrainedFormatError(f"{file} is missing: {path} was not written by "
                                    "save_pretrained, or the save did not finish")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PretrainedFormatError(f"{file} is not valid JSON ({err})") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise PretrainedFormatError(f"{file} is not a glomo_pyg pretrained-predictor config "
                                    f"(expected format {FORMAT!r})")
    version = config.get("format_version")
    if not isinstance(version, int):
        raise PretrainedFormatError(f"{file} has no integer format_version")
    if version > FORMAT_VERSION:
        raise PretrainedFormatError(
            f"{file} has format version {version}, written by glomo_pyg "
            f"{config.get('glomo_pyg_version', '?')}; this glomo_pyg ({__version__}) "
            f"reads versions up to {FORMAT_VERSION}: upgrade glomo_pyg")
    if version < 1:
        raise PretrainedFormatError(f"{file} has an invalid format version {version}")
    for key, kind in (("directions", dict), ("weights", dict)):
        if not isinstance(config.get(key), kind):
            raise PretrainedFormatError(f"{file} lacks the {key!r} entry")
    return config


def _check_weights_file(path: Path, config: Dict[str, Any]) -> Path:
    meta = config["weights"]
    if meta.get("file") != WEIGHTS_NAME:
        raise PretrainedFormatError(f"{path / CONFIG_NAME} names weights file "
                                    f"{meta.get('file')!r}; expected {WEIGHTS_NAME!r}")
    file = path / WEIGHTS_NAME
    if not file.is_file():
        raise PretrainedFormatError(f"{file} is missing")
    size, expected = file.stat().st_size, meta.get("bytes")
    if isinstance(expected, int) and size < expected:
        raise PretrainedFormatError(f"{file} is truncated: {size} of {expected} bytes")
    if isinstance(expected, int) and size > expected:
        raise PretrainedFormatError(f"{file} has {size} bytes, its config records {expected}: "
                                    "the file was replaced or corrupted")
    if meta.get("sha256") != _sha256(file):
        raise PretrainedFormatError(f"{file} does not match the SHA-256 recorded in "
                                    f"{CONFIG_NAME}: the file is corrupt or was modified")
    return file


def _read_weights(file: Path) -> Dict[str, torch.Tensor]:
    """Parse a safetensors file; anything else (a pickle, random bytes) is refused
    by the parser before any of it is interpreted as code or objects."""
    from safetensors.torch import load

    data = file.read_bytes()
    try:
        return load(data)
    except Exception as err:  # safetensors raises its own error types for bad headers
        raise PretrainedFormatError(f"{file} is not a valid safetensors file ({err})") from None


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


def _build(direction: str, entry: Any, file: Path) -> torch.nn.Module:
    if not isinstance(entry, dict) or entry.get("cls") not in EMITTERS or \
            not isinstance(entry.get("config"), dict):
        raise PretrainedFormatError(
            f"{file}: the {direction} entry must name one of {sorted(EMITTERS)} with its config")
    cls = EMITTERS[entry["cls"]]
    try:
        module = cls.from_config(dict(entry["config"]))
    except (TypeError, ValueError) as err:
        raise PretrainedFormatError(f"{file}: cannot build the {direction} {cls.__name__} from "
                                    f"its config ({err})") from None
    if module.direction != direction:
        raise PretrainedFormatError(f"{file}: the {direction} entry builds a predictor for "
                                    "the other direction")
    return module


def load_pretrained(path: PathLike, map_location: Union[str, torch.device, None] = None,
                    vocabulary: Optional[Sequence[str]] = None) -> PretrainedGraphPredictor:
    """Load a predictor written by :func:`save_pretrained`, in eval mode.

    Args:
        path: the directory given to :func:`save_pretrained`.
        map_location: device to put the weights on (default: CPU), e.g.
            ``'cuda'`` or ``torch.device('cuda', 1)``.
        vocabulary: if given, the vocabulary the caller's data was encoded
            with; it must equal the saved one.

    Raises:
        PretrainedFormatError: a missing, truncated, corrupt or modified file,
            a format version newer than this library reads, weights that do
            not match the config (missing, unexpected or differently shaped
            tensors), or a vocabulary mismatch. The message names the problem.
    """
    path = Path(path)
    config = _read_config(path)
    config_file = path / CONFIG_NAME
    weights = _read_weights(_check_weights_file(path, config))
    directions = config["directions"]
    unknown = sorted(set(directions) - set(DIRECTION_KEYS))
    if unknown or not directions:
        raise PretrainedFormatError(f"{config_file}: directions must be a non-empty subset of "
                                    f"{sorted(DIRECTION_KEYS)}, got {sorted(directions)}")
    if config["format_version"] == 1:
        directions = {d: _legacy_entry(e) for d, e in directions.items()}
    modules = {d: _build(d, directions[d], config_file) for d in directions}
    container = torch.nn.ModuleDict({DIRECTION_KEYS[d]: m for d, m in modules.items()})
    expected = container.state_dict()
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    shapes = [f"{k}: file {tuple(weights[k].shape)} vs config {tuple(expected[k].shape)}"
              for k in sorted(set(expected) & set(weights)) if weights[k].shape != expected[k].shape]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        if unexpected:
            parts.append(f"unexpected tensors {unexpected[:5]}"
                         f"{' ...' if len(unexpected) > 5 else ''}")
        if shapes:
            parts.append("shape mismatch " + "; ".join(shapes[:5]))
        raise PretrainedFormatError(f"{path / WEIGHTS_NAME} does not match {config_file}: "
                                    + "; ".join(parts))
    bad_dtype = [k for k in expected if weights[k].dtype != expected[k].dtype]
    if bad_dtype:
        raise PretrainedFormatError(f"{path / WEIGHTS_NAME}: unexpected dtypes for {bad_dtype[:5]}")
    container.load_state_dict(weights, strict=True)
    saved_vocab = config.get("vocabulary")
    if saved_vocab is not None and (not isinstance(saved_vocab, list) or
                                    not all(isinstance(t, str) for t in saved_vocab)):
        raise PretrainedFormatError(f"{config_file}: the vocabulary must be a list of strings")
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
                                             saved_vocab)
    except (TypeError, ValueError) as err:
        raise PretrainedFormatError(f"{config_file}: {err}") from None
    if map_location is not None:
        predictor = predictor.to(map_location)
    return predictor.eval()


register_persistence(save_pretrained, load_pretrained)
