"""Released predictors: pretrained graph predictors shipped with the repository, one
folder ``pretrained/NAME/`` each, loaded by name.

A release folder holds exactly ``config.json`` and ``model.safetensors`` (written by
:func:`~glomo_pyg.io.save_pretrained`, every floating-point tensor in float16) and a
``README.md`` model card. :func:`write_release` writes one;
``PretrainedGraphPredictor.from_pretrained(NAME)`` and ``load_pretrained(NAME)`` load
one; ``glomo pretrained`` lists them. Releases live in :func:`releases_root`: the folder
named by the ``GLOMO_PRETRAINED_DIR`` environment variable, else the repository's
``pretrained/`` folder.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

import torch

from glomo_pyg.atomic_files import replace_folder
from glomo_pyg.nn.pretrained import PretrainedGraphPredictor

ENV_VAR = "GLOMO_PRETRAINED_DIR"
RELEASE_NAME = re.compile(r"[a-z0-9][a-z0-9.-]*")
RELEASE_FILES = ("README.md", "config.json", "model.safetensors")
# the repository carries the releases: each stays small, and so do all of them
MAX_WEIGHTS_BYTES = 6 << 20
MAX_RELEASES_BYTES = 16 << 20

# The model card: the README opens with ``# name`` and the one-line summary, then has
# one section per field, in this order.
CARD_SECTIONS: Dict[str, str] = {
    "release": "Release", "modality": "Modality", "quality": "Quality", "data": "Data",
    "recipe": "Recipe", "command": "Command", "hardware": "Hardware",
    "training_time": "Training time", "commit": "Commit"}
CARD_FIELDS = ("name", "summary", *CARD_SECTIONS)
MODALITIES = ("text", "pixels")
_TOP_HEADING = re.compile(r"^#{1,2}(\s|$)", re.MULTILINE)  # would split the card's sections

PathLike = Union[str, os.PathLike]


def releases_root() -> Path:
    """The folder that holds the released predictors.

    Returns:
        ``$GLOMO_PRETRAINED_DIR`` if set, else ``pretrained/`` beside the ``glomo_pyg``
        package (the repository root of a clone installed with ``pip install -e .``).
    """
    env = os.environ.get(ENV_VAR)
    if not env:
        return Path(__file__).resolve().parents[2] / "pretrained"
    try:
        return Path(env).expanduser()
    except RuntimeError:  # '~user/...' for a user this system does not know
        raise ValueError(f"{ENV_VAR}={env!r}: its '~' names no home folder on this system; "
                         "give the releases folder as an absolute path") from None


def in_releases_root(path: PathLike) -> bool:
    """Whether ``path`` is a folder inside :func:`releases_root`, however it is named
    (absolute, relative, through a symlink): resolved paths are compared, so a release
    cannot be loaded around the checks that releases pass."""
    root = os.path.realpath(releases_root())
    resolved = os.path.realpath(path)
    return resolved != root and os.path.commonpath([root, resolved]) == root


def released_names() -> List[str]:
    """Names of the released predictors in :func:`releases_root`, sorted (empty where the
    folder does not exist)."""
    root = releases_root()
    try:
        entries = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(n for n in entries
                  if RELEASE_NAME.fullmatch(n) and (root / n / "config.json").is_file())


def available_releases(names: List[str]) -> str:
    """A sentence saying which released predictors there are (``names``) and where they
    were looked for, for messages."""
    where = f"in {releases_root()} (set {ENV_VAR} to look elsewhere)"
    return f"released predictors {where}: {', '.join(names)}" if names else \
        f"no released predictors are installed {where}"


def release_path(name: str) -> Path:
    """The folder of the released predictor ``name``.

    Raises:
        ValueError: there is no such release; the message lists those there are.
    """
    names = released_names()
    if name not in names:
        raise ValueError(f"{name!r} is not a released predictor; {available_releases(names)}")
    return releases_root() / name


def _modality(predictor: PretrainedGraphPredictor) -> str:
    """``'pixels'``, ``'text'`` (token ids) or ``'features'`` (not releasable)."""
    if hasattr(predictor.predictor(predictor.directions[0]), "height"):
        return "pixels"
    return "text" if predictor.num_tokens is not None else "features"


def _check_card(card: Mapping) -> Dict[str, str]:
    if not isinstance(card, Mapping):
        raise TypeError(f"card must be a mapping of the fields {list(CARD_FIELDS)}, got "
                        f"{type(card).__name__}")
    unknown = sorted(str(k) for k in card if k not in CARD_FIELDS)  # (a misspelt field
    missing = [k for k in CARD_FIELDS  # would silently leave its section out)
               if not isinstance(card.get(k), str) or not card[k].strip()]
    out = {k: card[k].strip() for k in CARD_FIELDS if k not in missing}
    headed = [k for k in CARD_SECTIONS if k in out and k != "command" and
              _TOP_HEADING.search(out[k])]
    problems = [text for bad, text in (
        (unknown, f"unknown card fields {unknown}; a card has {list(CARD_FIELDS)}"),
        (missing, f"the card lacks the fields {missing} (each must be non-empty text)"),
        (not RELEASE_NAME.fullmatch(out.get("name", "x")),
         f"release name {out.get('name')!r} must match {RELEASE_NAME.pattern} (lower-case "
         "letters, digits, '.' and '-'): it is typed to load it"),
        ("\n" in out.get("summary", "") or out.get("summary", "").startswith("#"),
         f"the card's summary must be one line of text, got {out.get('summary')!r}"),
        (out.get("modality", "text") not in MODALITIES,
         f"the card's modality must be one of {MODALITIES}, got {out.get('modality')!r}"),
        (headed, f"the card fields {headed} hold '#' or '##' headings, which would split the "
         "README's sections: use '###' or deeper")) if bad]
    if problems:
        raise ValueError("; ".join(problems))
    return out


def _readme(card: Dict[str, str]) -> str:
    lines = [f"# {card['name']}", "", card["summary"], ""]
    for field, title in CARD_SECTIONS.items():
        text = card[field]
        if field == "command":  # a fence longer than any backtick run inside
            fence = "`" * max(3, 1 + max(map(len, re.findall("`+", text)), default=0))
            text = f"{fence}sh\n{text}\n{fence}"
        lines += [f"## {title}", "", text, ""]
    lines += ["## Loading", "", "```python", "from glomo_pyg import PretrainedGraphPredictor",
              "", f'predictor = PretrainedGraphPredictor.from_pretrained("{card["name"]}")',
              "```", ""]
    return "\n".join(lines)


def _release_bytes(root: Path, but: str) -> int:
    """Bytes of the releases in ``root`` other than ``but``."""
    names = os.listdir(root) if root.is_dir() else []
    return sum(f.stat().st_size for n in names if n != but and RELEASE_NAME.fullmatch(n) and
               (root / n / "config.json").is_file() for f in (root / n).iterdir() if f.is_file())


def _check_predictor(predictor: Union[PretrainedGraphPredictor, PathLike],
                     card: Dict[str, str]) -> PretrainedGraphPredictor:
    if isinstance(predictor, (str, os.PathLike)):
        predictor = PretrainedGraphPredictor.from_pretrained(predictor)
    if not isinstance(predictor, PretrainedGraphPredictor):
        raise TypeError(f"predictor must be a PretrainedGraphPredictor or the folder of a saved "
                        f"one, got {type(predictor).__name__}")
    modality = _modality(predictor)
    if modality != card["modality"] or modality == "text" and predictor.vocabulary is None:
        raise ValueError(f"the card says modality {card['modality']!r}, the predictor reads "
                         f"{modality}" if modality != card["modality"] else
                         "a text release must carry its vocabulary (users encode their text "
                         "with it): pass one to Glomo.to_pretrained")
    return predictor


def write_release(predictor: Union[PretrainedGraphPredictor, PathLike], folder: PathLike,
                  card: Mapping[str, str]) -> Path:
    """Write a released predictor into ``folder``: ``config.json`` and
    ``model.safetensors`` (floating-point tensors in float16: its finer mantissa keeps
    the graphs within about 0.1% of the float32 ones, where bfloat16's rounding can move
    a score across the pruning threshold) and the ``README.md`` model card. The sizes are
    checked before anything is written; the release then replaces ``folder`` as a whole
    (:func:`~glomo_pyg.atomic_files.replace_folder`), which may hold only an earlier one.

    Args:
        predictor: the predictor, or the folder (or released name) of a saved one.
        folder: the release folder, named after the release (``pretrained/NAME``).
        card: text for each of :data:`CARD_FIELDS`: ``name`` (``[a-z0-9][a-z0-9.-]*``),
            ``summary`` (one line), ``modality`` (``'text'`` or ``'pixels'``, as the
            predictor reads), ``hardware``, ``data``, ``recipe``, ``command``, ``commit``,
            ``training_time``, ``quality`` and ``release`` (markdown).

    Returns:
        ``folder``.

    Raises:
        TypeError: ``predictor`` or ``card`` has the wrong type.
        ValueError: a card field is missing, unknown or malformed; the folder is not
            named after the release or holds something else; the predictor does not
            match the card; or the release would exceed :data:`MAX_WEIGHTS_BYTES` or the
            releases together :data:`MAX_RELEASES_BYTES`.
    """
    card = _check_card(card)
    folder = Path(folder)
    foreign = os.path.lexists(folder) and (not folder.is_dir() or folder.is_symlink() or
                                           not set(os.listdir(folder)) <= set(RELEASE_FILES))
    if folder.name != card["name"] or foreign:
        raise ValueError(f"the release folder {folder} must be named after the release, "
                         f"{card['name']!r}: it is loaded by its folder's name"
                         if folder.name != card["name"] else f"{folder} exists and is not a "
                         "release folder; write_release only replaces an earlier release")
    predictor = _check_predictor(predictor, card)
    with tempfile.TemporaryDirectory() as scratch:  # (read back: a release is small)
        predictor.save_pretrained(scratch, dtype=torch.float16)
        files = {n: (Path(scratch) / n).read_bytes()
                 for n in ("model.safetensors", "config.json")}  # (the config last)
    files["README.md"] = _readme(card).encode("utf-8")
    size = len(files["model.safetensors"])
    total = _release_bytes(folder.parent, folder.name) + sum(map(len, files.values()))
    if size > MAX_WEIGHTS_BYTES or total > MAX_RELEASES_BYTES:
        raise ValueError(
            f"the release's weights file has {size / 2**20:.2f} MiB, more than the "
            f"{MAX_WEIGHTS_BYTES / 2**20:g} MiB a release may hold" if size > MAX_WEIGHTS_BYTES
            else f"the releases in {folder.parent} would take {total / 2**20:.1f} MiB with "
            f"this one, more than the {MAX_RELEASES_BYTES / 2**20:g} MiB they may take together")
    replace_folder(Path(os.path.abspath(folder)), files)
    return folder


def _summary(readme: Path) -> str:
    """The card's one-line summary: the first non-empty line after the title."""
    try:
        lines = readme.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in lines[1:] if line.strip()), "")


def release_problem(name: str) -> Optional[str]:
    """``None`` when the released predictor ``name`` loads (its seal and every other check
    pass), else why it does not, for ``glomo pretrained`` to name it."""
    try:
        PretrainedGraphPredictor.from_pretrained(release_path(name))
    except ValueError as err:  # (PretrainedFormatError is one)
        return str(err)
    return None


def describe_release(name: str) -> Dict[str, Any]:
    """What ``glomo pretrained`` lists about the released predictor ``name`` (loaded,
    so a broken release is reported).

    Returns:
        A dict: ``name``, ``modality`` (``'text'`` or ``'pixels'``), ``directions``,
        ``layers``, ``heads``, ``units`` (the vocabulary size, or ``[height, width]`` of
        the images), ``weights_bytes`` (of ``model.safetensors``), ``summary`` (the
        card's) and ``path``.

    Raises:
        ValueError: there is no such release, or it cannot be loaded
            (:exc:`~glomo_pyg.PretrainedFormatError`).
    """
    path = release_path(name)
    predictor = PretrainedGraphPredictor.from_pretrained(path)
    emitter = predictor.predictor(predictor.directions[0])
    modality = _modality(predictor)
    return dict(name=name, modality=modality, directions=len(predictor.directions),
                layers=predictor.num_layers, heads=predictor.heads,
                units=[emitter.height, emitter.width] if modality == "pixels"
                else predictor.num_tokens,
                weights_bytes=(path / "model.safetensors").stat().st_size,
                summary=_summary(path / "README.md"), path=str(path))
