"""Checkpoints of ``glomo pretrain``: atomic writes, safe reading, where to resume from."""
from __future__ import annotations

import logging
import os
import pickle
import re
import zipfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from glomo_pyg.atomic_files import atomic_write
from glomo_pyg.io.paths import NotRegularFileError, open_regular
from glomo_pyg.training.utils import rank_zero_info, rank_zero_warning

logger = logging.getLogger(__name__)

#: The entry ``glomo pretrain`` adds to its Lightning checkpoints (plain data only).
CHECKPOINT_KEY = "glomo"
_STEP_NAME = re.compile(r"^step(\d+)(?:-v\d+)?\.ckpt$")
#: A damaged checkpoint is kept under this suffix once a resume past it passes its checks.
DAMAGED_SUFFIX = ".damaged"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and why."""


class CorruptCheckpointError(CheckpointError):
    """Empty, truncated, damaged, or not a checkpoint of ``glomo pretrain``."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint that holds objects other than tensors and plain data."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint of another model or corpus than the run resuming from it."""


def atomic_save(obj: Any, path: str) -> None:
    """``torch.save(obj, path)`` through :func:`~glomo_pyg.atomic_files.atomic_write`."""
    with atomic_write(path, "wb") as fh:
        torch.save(obj, fh)


def stale_temporary_files(folder: str) -> List[str]:
    """Temporary files :func:`atomic_save` left in ``folder`` when killed mid-write."""
    return [f for f in _listed(folder) if os.path.basename(f).startswith(".")
            and f.endswith(".tmp") and ".ckpt." in os.path.basename(f)]


def _listed(folder: str) -> List[str]:
    return sorted(os.path.join(folder, n) for n in os.listdir(folder)) \
        if os.path.isdir(folder) else []


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, with :func:`atomic_save` for local paths (Lightning
    stages files in the system's temporary folder: a rename across file systems is a
    copy that a kill can cut short)."""

    def save_checkpoint(self, checkpoint: Dict[str, Any], path, storage_options=None) -> None:
        if storage_options is not None or "://" in str(path):  # remote storage: Lightning's
            return super().save_checkpoint(checkpoint, path, storage_options)  # own writer
        atomic_save(checkpoint, os.fspath(path))


def read_checkpoint(path: str) -> Dict[str, Any]:
    """The contents of the Lightning checkpoint ``path``, tensors memory-mapped, loaded
    with ``weights_only=True``.

    Raises:
        CorruptCheckpointError: empty, truncated, damaged, or not a checkpoint of
            ``glomo pretrain``.
        UnsafeCheckpointError: objects other than tensors and plain data.
        CheckpointError: not a regular file.
        OSError: the file cannot be opened.
    """
    path = os.fspath(path)
    try:  # (a FIFO or device would block the reads below; OSErrors name the file)
        os.close(open_regular(path, "checkpoint"))
    except NotRegularFileError as err:
        raise CheckpointError(str(err)) from None
    size = os.path.getsize(path)
    data: Any  # (checked below)
    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=True) \
            if zipfile.is_zipfile(path) else None
    except Exception as err:  # noqa: BLE001 (damaged archive members raise all sorts)
        found = re.search(r"\bGLOBAL ([\w.]+)", str(err))  # torch words it several ways
        if isinstance(err, pickle.UnpicklingError) and (found or "Unsupported class" in str(err)):
            what = f" ({found.group(1)})" if found else ""
            raise UnsafeCheckpointError(
                f"refusing to load {path}: it contains objects other than tensors and plain "
                f"data{what}. glomo pretrain never writes such checkpoints, so this file did "
                "not come from this run; remove it or replace it with one of the run's own "
                "checkpoints") from None
        first = " ".join(str(err).split()).split(". ")[0].rstrip(".") or "no details"
        raise CorruptCheckpointError(f"{path} is corrupt or truncated ({first})") from None
    lightning = isinstance(data, dict) and isinstance(data.get("state_dict"), Mapping) and \
        isinstance(data.get("global_step"), int)
    record = (data.get(CHECKPOINT_KEY) or {}) if lightning else {}
    if not lightning or not isinstance(record, Mapping) or any(
            record.get(k) is not None and not isinstance(record[k], Mapping)
            for k in ("corpus", "settings")):
        raise CorruptCheckpointError(
            f"{path} is corrupt or truncated ({size} bytes that are not a complete "
            "checkpoint archive)" if data is None else  # (an empty file too: a write cut off)
            f"{path}: its '{CHECKPOINT_KEY}' record (corpus fingerprint and settings) is "
            "damaged" if lightning else
            f"{path} is not a Lightning checkpoint of glomo pretrain (no state_dict and "
            "global_step)")
    return data


def checkpoint_files(folder: str) -> List[str]:
    return [f for f in _listed(folder) if f.endswith(".ckpt") and os.path.isfile(f)]


def newest_checkpoint_file(folder: str) -> Optional[str]:
    """``last.ckpt``, else the largest ``step<N>.ckpt``, else any ``*.ckpt`` (by name)."""
    files, last = checkpoint_files(folder), os.path.join(folder, "last.ckpt")
    if last in files:
        return last
    steps = [(_claimed_step(f), f) for f in files if _claimed_step(f) >= 0]
    return max(steps)[1] if steps else files[-1] if files else None


def _claimed_step(path: str) -> int:
    """The N of a ``step<N>.ckpt`` file name, else -1."""
    m = _STEP_NAME.match(os.path.basename(path))
    return int(m.group(1)) if m else -1


def find_resume_checkpoint(folder: str, damaged: Optional[List[str]] = None
                           ) -> Optional[Tuple[str, Dict[str, Any]]]:
    """``(path, contents)`` of the newest usable checkpoint in ``folder`` (the largest
    ``global_step``; ``last.ckpt`` on ties), or None when there is no ``*.ckpt`` at all.
    Unusable files are logged (a WARNING) and appended to ``damaged`` when an older usable
    one is taken instead.

    Raises:
        CorruptCheckpointError: no file is usable (names them all).
        UnsafeCheckpointError: a file holds unsafe objects (the folder needs a look).
    """
    files = checkpoint_files(folder)
    if not files:
        return None
    claims = {f: _claimed_step(f) for f in files}
    # last.ckpt first (it wins ties), then other names, then step files newest first
    order = sorted(files, key=lambda f: (1, -claims[f]) if claims[f] >= 0 else
                   (0, os.path.basename(f) != "last.ckpt"))
    best: Optional[Tuple[int, str, Dict[str, Any]]] = None
    bad: List[Tuple[str, CheckpointError]] = []
    for f in order:
        if best is not None and 0 <= claims[f] <= best[0]:
            continue  # (a step file older than the best found is not read)
        try:
            data = read_checkpoint(f)
        except CorruptCheckpointError as err:  # (an unsafe file stops the search)
            bad.append((f, err))
            continue
        if best is None or data["global_step"] > best[0]:
            best = (data["global_step"], f, data)
    if best is None:
        reasons = "; ".join(str(err) for _, err in bad)
        raise CorruptCheckpointError(
            f"cannot resume: {reasons}; {folder} holds no usable checkpoint. Move the "
            "damaged file(s) away (e.g. rename to .corrupt) and run without --resume to "
            "start over")
    step, path, data = best
    if bad:  # one message: what is resumed from, what is kept, what is replaced
        names = ", ".join(f"{f} -> {f}{DAMAGED_SUFFIX}" for f, _ in bad)
        last = os.path.join(folder, "last.ckpt")
        copy = f", and {last} becomes a copy of {path}" if path != last else ""
        rank_zero_warning(logger, f"{'; '.join(str(err) for _, err in bad)}. Resuming from the "
                          f"newest usable checkpoint instead: {path} (step {step}); once the "
                          f"checks pass, the damaged file(s) are kept under new names ({names}), "
                          f"so that training does not overwrite them{copy}")
        if damaged is not None:
            damaged.extend(f for f, _ in bad)
    elif os.path.basename(path) != "last.ckpt":
        rank_zero_info(logger, f"resuming from {path} (step {step}), the newest checkpoint"
                       + (" (last.ckpt is older)" if os.path.join(folder, "last.ckpt") in files
                          else " (there is no last.ckpt)"))
    return path, data


def set_aside_damaged(paths: Sequence[str]) -> None:
    """Rename each damaged checkpoint to ``NAME.damaged``: kept for a look, out of the way."""
    for path in paths:
        if os.path.lexists(path):
            os.replace(path, path + DAMAGED_SUFFIX)


def _shape(value) -> Optional[Tuple[int, ...]]:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def check_checkpoint_matches(contents: Mapping[str, Any], path: str,
                             module: torch.nn.Module,
                             model_settings: Optional[Mapping[str, Any]] = None,
                             limit: int = 5, ignore: Sequence[str] = (),
                             saved_settings: Optional[Mapping[str, Any]] = None) -> None:
    """Raise :class:`CheckpointMismatchError` naming the differences when the checkpoint's
    weights (names and shapes) or its model settings ``saved_settings`` (as the caller
    reads them from its ``hyper_parameters``; except ``ignore``) differ from ``module``'s
    and ``model_settings``."""
    problems: List[str] = []
    if model_settings is not None and isinstance(saved_settings, Mapping):
        keys = sorted((set(saved_settings) | set(model_settings)) - set(ignore), key=str)
        diff = [f"model.{k}: checkpoint {saved_settings.get(k, '(unset)')!r}, this run "
                f"{model_settings.get(k, '(unset)')!r}" for k in keys
                if saved_settings.get(k, "(unset)") != model_settings.get(k, "(unset)")]
        if diff:
            problems.append("settings " + "; ".join(diff[:limit])
                            + (f"; and {len(diff) - limit} more" if len(diff) > limit else ""))
    saved, mine = contents["state_dict"], module.state_dict()
    missing = [k for k in mine if k not in saved]
    extra = [k for k in saved if k not in mine]
    shapes = [f"{k}: checkpoint {_shape(saved[k])}, this run {_shape(mine[k])}" for k in mine
              if k in saved and _shape(saved[k]) != _shape(mine[k])]
    for label, items in (("weights of other shapes", shapes),
                         ("weights missing from the checkpoint", missing),
                         ("weights this model does not have", extra)):
        if items:
            problems.append(f"{len(items)} {label} (" + "; ".join(items[:limit])
                            + (", ..." if len(items) > limit else "") + ")")
    if problems:
        raise CheckpointMismatchError(
            f"{path} does not match this run's configuration: " + "; ".join(problems)
            + ". It was written by another run or with other model or corpus settings; "
            "resume with that run's settings, or use another output_dir")
