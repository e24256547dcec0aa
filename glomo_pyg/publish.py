"""Publishing saved predictors: writing a release, rewriting its card, pushing a saved
folder to the Hugging Face Hub and sealing a predictor again. Each takes a folder and
holds it to every check :func:`~glomo_pyg.load_pretrained` makes, before and after it
writes, so nothing broken is published (docs/pretrained.md)."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union, cast

import torch

from glomo_pyg.atomic_files import replace_folder
from glomo_pyg.io import hub, releases
from glomo_pyg.io.pretrained import (
    PathLike,
    PretrainedFormatError,
    UnsealedPredictorWarning,
    read_unsealed,
    write_config,
)
from glomo_pyg.nn.pretrained import PretrainedGraphPredictor, load_pretrained, save_pretrained


def reseal_pretrained(path: PathLike) -> PathLike:
    """Seal the saved predictor ``path`` again as it now is (edited on purpose, or of
    format 1 or 2) and return ``path``. If it then fails :func:`~glomo_pyg.load_pretrained`,
    the old config is put back and the error raised."""
    old, config = read_unsealed(path)
    if config.get("format_version") == 1:  # another layout: migrated by a new save
        with warnings.catch_warnings():  # (being sealed is what was asked for)
            warnings.simplefilter("ignore", UnsealedPredictorWarning)
            predictor = load_pretrained(path, allow_unsealed=True)
        save_pretrained(predictor, path)
        return path
    write_config(path, config)
    try:
        load_pretrained(path)
    except Exception:
        write_config(path, old)
        raise
    return path


def _predictor_folder(folder: Any) -> Path:
    """The folder ``folder`` names: a path, or the name of a release."""
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be a str or os.PathLike naming a predictor folder or a "
                        f"release, got {type(folder).__name__}")
    if hub.is_hub_name(folder):
        raise ValueError(f"push_folder pushes a local folder or a release, got {folder!r}")
    text = os.fspath(folder)
    if isinstance(folder, str) and not os.path.lexists(text) and "\0" not in text and \
            releases.RELEASE_NAME.fullmatch(text):
        return releases.release_path(text)
    return Path(text)


def _verified(files: Dict[str, bytes], path: Path) -> PretrainedGraphPredictor:
    """The predictor of ``files`` (what will be pushed, byte for byte), loaded from a
    copy with every check, a release's card included."""
    with tempfile.TemporaryDirectory() as scratch:
        for name, data in files.items():
            (Path(scratch) / name).write_bytes(data)
        try:
            predictor = load_pretrained(Path(scratch))
            problem = hub.card_problem(Path(scratch), predictor.modality)
        except PretrainedFormatError as err:
            problem = str(err)
        if problem is not None:
            raise PretrainedFormatError(f"{path} is not pushed: "
                                        + problem.replace(scratch, str(path)))
    return predictor


def push_folder(folder: Union[str, os.PathLike], repo_id: str, *,
                revision: Optional[str] = None, private: Optional[bool] = None,
                token: Union[str, bool, None] = None,
                commit_message: str = hub.DEFAULT_MESSAGE) -> hub.HubPush:
    """Upload the predictor folder ``folder`` (a :func:`~glomo_pyg.save_pretrained`
    folder, or a release: its folder or its name) to ``repo_id`` as it is, in one commit:
    its ``config.json``, ``model.safetensors`` and ``README.md`` byte for byte (a release's
    sealed card included), nothing else of the folder. The files are loaded first with
    every check (a release's card against its seal), so a broken predictor is never
    pushed; a folder without a card gets the one :func:`~glomo_pyg.io.hub.push_to_hub` writes.

    Raises:
        PretrainedFormatError: the folder is not a predictor that loads.
        HubError, ValueError, MissingExtraError: as :func:`~glomo_pyg.io.hub.push_to_hub`.
    """
    repo_id, revision = hub.check_repo_id(repo_id), hub.checked_revision(revision)
    hub.check_push(private, token, commit_message)
    path = _predictor_folder(folder)
    hub_api = hub.hub_module()
    files = {n: data for n, limit in hub.LIMITS.items()
             if (data := hub.read_file(path / n, limit)) is not None}
    missing = [n for n in hub.REQUIRED if n not in files]
    if missing:
        raise PretrainedFormatError(f"{path} holds no {' and no '.join(missing)}: it is not "
                                    "a predictor folder (save_pretrained writes one)")
    predictor = _verified(files, path)
    if releases.CARD_NAME not in files:
        files[releases.CARD_NAME] = releases.model_card(
            hub.card_fields(predictor, repo_id, None), hub.PREFIX + repo_id,
            complete=False).encode("utf-8")
    return hub.upload(hub_api, repo_id, files, revision, private, token, commit_message)


def write_release(predictor: Union[PretrainedGraphPredictor, PathLike], folder: PathLike,
                  card: Mapping[str, str]) -> Path:
    """Write a released predictor (float16 weights, config and ``README.md`` model card)
    into ``folder``, replacing it as a whole, and return ``folder``. The config seals the
    release's name, modality and card digest (:data:`~glomo_pyg.io.releases.RELEASE_KEY`):
    loading refuses the folder under another name or with another card
    (:func:`~glomo_pyg.io.releases.release_problem`).

    Args:
        predictor: the predictor, or the folder (or released name) of a saved one.
        folder: the release folder, named after the release (``pretrained/NAME``); it may
            hold only an earlier release.
        card: text for each of :data:`~glomo_pyg.io.releases.CARD_FIELDS`: ``name``
            (``[a-z0-9][a-z0-9.-]*``), ``summary`` (one line), ``modality`` (``'text'`` or
            ``'pixels'``, as the predictor reads) and the markdown sections of
            :data:`~glomo_pyg.io.releases.CARD_SECTIONS`; and optionally
            :data:`~glomo_pyg.io.releases.CARD_EXTRAS` for the card's YAML front matter
            (see :func:`~glomo_pyg.io.releases.model_card`): ``datasets`` (Hub dataset
            ids) and ``metrics``.

    Raises:
        TypeError: ``predictor`` or ``card`` has the wrong type.
        ValueError: a card field is missing, unknown or malformed; the folder is not
            named after the release or holds something else; the predictor does not
            match the card; or the card, the release's weights or the releases together
            would exceed their bounds (:mod:`glomo_pyg.io.releases`: ``MAX_CARD_BYTES``,
            ``MAX_WEIGHTS_BYTES``, ``MAX_RELEASES_BYTES``).
    """
    card, folder = releases.check_card(card), Path(folder)
    if isinstance(predictor, (str, os.PathLike)):
        predictor = PretrainedGraphPredictor.from_pretrained(predictor)
    if not isinstance(predictor, PretrainedGraphPredictor):
        raise TypeError(f"predictor must be a PretrainedGraphPredictor or the folder of a saved "
                        f"one, got {type(predictor).__name__}")
    modality = predictor.modality
    with tempfile.TemporaryDirectory() as scratch:  # (read back: a release is small)
        predictor.save_pretrained(scratch, dtype=torch.float16)
        files = {n: (Path(scratch) / n).read_bytes()
                 for n in ("model.safetensors", "config.json")}  # (the config last)
    files[releases.CARD_NAME] = releases.card_text(card).encode("utf-8")
    files["config.json"] = releases.sealed_release_config(
        files["config.json"], card["name"], modality, files[releases.CARD_NAME])
    problems = _release_problems(predictor, folder, card, files)
    if problems:
        raise ValueError("; ".join(problems))
    replace_folder(Path(os.path.abspath(folder)), files)
    return folder


def _release_problems(predictor: PretrainedGraphPredictor, folder: Path,
                      card: Dict[str, Any], files: Dict[str, bytes]) -> List[str]:
    """Why the release ``files`` of ``predictor`` may not be written at ``folder``."""
    modality, size = predictor.modality, len(files["model.safetensors"])
    card_size = len(files[releases.CARD_NAME])
    total = sum(map(len, files.values())) + sum(  # (and the other releases beside it)
        f.stat().st_size for n in releases.releases_in(folder.parent) if n != folder.name
        for f in (folder.parent / n).iterdir() if f.is_file())
    return [text for bad, text in (
        (modality != card["modality"], f"the card says modality {card['modality']!r}, the "
         f"predictor reads {modality}"),
        (modality == "text" and predictor.vocabulary is None, "a text release must carry its "
         "vocabulary (users encode their text with it): pass one to Glomo.to_pretrained"),
        (folder.name != card["name"], f"the release folder {folder} must be named after the "
         f"release, {card['name']!r}: it is loaded by its folder's name"),
        (not releases.replaceable_release_folder(folder), f"{folder} exists and is not a "
         "release folder; write_release only replaces an earlier release"),
        (card_size > releases.MAX_CARD_BYTES, f"the model card would have {card_size} bytes, "
         f"more than the {releases.MAX_CARD_BYTES >> 10} KiB a card may have (glomo "
         "pretrained reads no more)"),
        (size > releases.MAX_WEIGHTS_BYTES, f"the release's weights file has "
         f"{size / 2**20:.2f} MiB, more than the {releases.MAX_WEIGHTS_BYTES / 2**20:g} MiB a "
         "release may hold"),
        (total > releases.MAX_RELEASES_BYTES, f"the releases in {folder.parent} would take "
         f"{total / 2**20:.1f} MiB with this one, more than the "
         f"{releases.MAX_RELEASES_BYTES / 2**20:g} MiB they may take together")) if bad]


def rewrite_card(folder: PathLike, changes: Optional[Mapping[str, Any]] = None) -> Path:
    """Write the model card of the release in ``folder`` again with today's card writer
    (its fields as :func:`~glomo_pyg.io.releases.read_card` reads them, updated with
    ``changes``, e.g. ``metrics`` or ``datasets``), and seal it into the release's
    ``config.json`` (:data:`~glomo_pyg.io.releases.RELEASE_KEY`); the weights are kept
    byte for byte. The release must load before (every check) and after; return
    ``folder``.

    Raises:
        PretrainedFormatError: the release does not load as it is.
        ValueError: the card with ``changes`` is not a valid card (see :func:`write_release`).
    """
    folder = Path(folder)
    modality = PretrainedGraphPredictor.from_pretrained(folder).modality
    card = releases.check_card({**releases.read_card(folder), **(changes or {})})
    files = {n: (folder / n).read_bytes() for n in ("model.safetensors", "config.json")}
    recorded = json.loads(files["config.json"]).get("weights", {}).get("sha256")
    if hashlib.sha256(files["model.safetensors"]).hexdigest() != recorded:
        raise ValueError(f"{folder} changed while its card was rewritten: try again")
    files[releases.CARD_NAME] = releases.card_text(card).encode("utf-8")
    files["config.json"] = releases.sealed_release_config(
        files["config.json"], card["name"], modality, files[releases.CARD_NAME])
    replace_folder(Path(os.path.abspath(folder)), files)
    PretrainedGraphPredictor.from_pretrained(folder)
    return folder


def describe_release(name: str) -> Dict[str, Any]:
    """What ``glomo pretrained`` lists about the released predictor ``name``, loaded (a
    :class:`ValueError` if there is none, or a ``PretrainedFormatError`` if it is broken):
    its shapes, and its card's ``summary`` and ``data`` (the data it was trained on, the
    card's "Data" section on one line)."""
    path = releases.release_path(name)
    predictor = PretrainedGraphPredictor.from_pretrained(path)
    modality = predictor.modality
    card = releases.read_card(path)
    return dict(name=name, modality=modality, directions=len(predictor.directions),
                layers=predictor.num_layers, heads=predictor.heads,
                units=list(cast(Tuple[int, int], predictor.image_size)) if modality == "pixels"
                else predictor.num_tokens,
                weights_bytes=(path / "model.safetensors").stat().st_size,
                summary=card.get("summary", ""), data=" ".join(card.get("data", "").split()),
                path=str(path), origin=releases.releases_origin())
