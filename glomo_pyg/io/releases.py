"""Released predictors: pretrained graph predictors shipped in ``pretrained/NAME/`` (the
wheel carries them as ``glomo_pyg/pretrained/NAME/``) and loaded by name
(docs/pretrained.md)."""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Tuple, Union, cast

import torch

from glomo_pyg.atomic_files import replace_folder
from glomo_pyg.nn.pretrained import PretrainedGraphPredictor

ENV_VAR = "GLOMO_PRETRAINED_DIR"
RELEASE_NAME = re.compile(r"[a-z0-9][a-z0-9.-]*")
RELEASE_FILES = ("README.md", "config.json", "model.safetensors")
# the repository carries the releases: each stays small, and so do all of them
MAX_WEIGHTS_BYTES = 6 << 20
MAX_RELEASES_BYTES = 16 << 20

# the model card's sections, in order (after ``# name`` and the one-line summary)
CARD_SECTIONS: Dict[str, str] = {
    "release": "Release", "modality": "Modality", "quality": "Quality", "data": "Data",
    "recipe": "Recipe", "command": "Command", "hardware": "Hardware",
    "training_time": "Training time", "commit": "Commit"}
CARD_FIELDS = ("name", "summary", *CARD_SECTIONS)
MODALITIES = ("text", "pixels")
_TOP_HEADING = re.compile(r"^#{1,2}(\s|$)", re.MULTILINE)  # would split the card's sections

PathLike = Union[str, os.PathLike]


_PACKAGE = Path(__file__).resolve().parents[1]
INSTALLED_ROOT = _PACKAGE / "pretrained"  # an installed wheel's copy of the releases
CHECKOUT_ROOT = _PACKAGE.parent / "pretrained"  # a source checkout's (or editable install's)


def releases_root() -> Path:
    """Where releases are looked up: ``$GLOMO_PRETRAINED_DIR`` if set, else the releases
    installed with the package (``glomo_pyg/pretrained/``), else a source checkout's
    ``pretrained/`` beside ``glomo_pyg/``."""
    env = os.environ.get(ENV_VAR)
    if not env:
        return INSTALLED_ROOT if INSTALLED_ROOT.is_dir() else CHECKOUT_ROOT
    try:
        return Path(env).expanduser()
    except RuntimeError:  # '~user/...' for a user this system does not know
        raise ValueError(f"{ENV_VAR}={env!r}: its '~' names no home folder on this system; "
                         "give the releases folder as an absolute path") from None


def releases_origin() -> str:
    """Where :func:`releases_root` comes from, in words (``glomo pretrained`` says it)."""
    if os.environ.get(ENV_VAR):
        return f"${ENV_VAR}"
    return "installed with the glomo_pyg package" if INSTALLED_ROOT.is_dir() else \
        "the source checkout's pretrained/ folder"


def in_releases_root(path: PathLike) -> bool:
    """Whether ``path`` is a folder inside :func:`releases_root`, however it is named:
    resolved paths are compared, so a release cannot dodge the checks releases pass."""
    root, resolved = os.path.realpath(releases_root()), os.path.realpath(path)
    return resolved != root and os.path.commonpath([root, resolved]) == root


def _releases(root: Path) -> List[str]:
    try:
        entries = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(n for n in entries
                  if RELEASE_NAME.fullmatch(n) and (root / n / "config.json").is_file())


def released_names() -> List[str]:
    """Names of the released predictors, sorted (none where the folder does not exist)."""
    return _releases(releases_root())


def available_releases(names: List[str]) -> str:
    """A sentence naming the released predictors ``names`` and where they were looked for."""
    where = f"in {releases_root()} (set {ENV_VAR} to look elsewhere)"
    return f"released predictors {where}: {', '.join(names)}" if names else \
        f"no released predictors are installed {where}"


def release_path(name: str) -> Path:
    """The folder of the released predictor ``name``; :class:`ValueError` listing those
    there are if there is none."""
    names = released_names()
    if name not in names:
        raise ValueError(f"{name!r} is not a released predictor; {available_releases(names)}")
    return releases_root() / name


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


def write_release(predictor: Union[PretrainedGraphPredictor, PathLike], folder: PathLike,
                  card: Mapping[str, str]) -> Path:
    """Write a released predictor (float16 weights, config and ``README.md`` model card)
    into ``folder``, replacing it as a whole, and return ``folder``.

    Args:
        predictor: the predictor, or the folder (or released name) of a saved one.
        folder: the release folder, named after the release (``pretrained/NAME``); it may
            hold only an earlier release.
        card: text for each of :data:`CARD_FIELDS`: ``name`` (``[a-z0-9][a-z0-9.-]*``),
            ``summary`` (one line), ``modality`` (``'text'`` or ``'pixels'``, as the
            predictor reads) and the markdown sections of :data:`CARD_SECTIONS`.

    Raises:
        TypeError: ``predictor`` or ``card`` has the wrong type.
        ValueError: a card field is missing, unknown or malformed; the folder is not
            named after the release or holds something else; the predictor does not
            match the card; or the release would exceed :data:`MAX_WEIGHTS_BYTES` or the
            releases together :data:`MAX_RELEASES_BYTES`.
    """
    card, folder = _check_card(card), Path(folder)
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
    files["README.md"] = _readme(card).encode("utf-8")
    size = len(files["model.safetensors"])
    total = sum(map(len, files.values())) + sum(  # (and the other releases beside it)
        f.stat().st_size for n in _releases(folder.parent) if n != folder.name
        for f in (folder.parent / n).iterdir() if f.is_file())
    problems = [text for bad, text in (
        (modality != card["modality"], f"the card says modality {card['modality']!r}, the "
         f"predictor reads {modality}"),
        (modality == "text" and predictor.vocabulary is None, "a text release must carry its "
         "vocabulary (users encode their text with it): pass one to Glomo.to_pretrained"),
        (folder.name != card["name"], f"the release folder {folder} must be named after the "
         f"release, {card['name']!r}: it is loaded by its folder's name"),
        (os.path.lexists(folder) and (not folder.is_dir() or folder.is_symlink() or
                                      not set(os.listdir(folder)) <= set(RELEASE_FILES)),
         f"{folder} exists and is not a release folder; write_release only replaces an "
         "earlier release"),
        (size > MAX_WEIGHTS_BYTES, f"the release's weights file has {size / 2**20:.2f} MiB, "
         f"more than the {MAX_WEIGHTS_BYTES / 2**20:g} MiB a release may hold"),
        (total > MAX_RELEASES_BYTES, f"the releases in {folder.parent} would take "
         f"{total / 2**20:.1f} MiB with this one, more than the "
         f"{MAX_RELEASES_BYTES / 2**20:g} MiB they may take together")) if bad]
    if problems:
        raise ValueError("; ".join(problems))
    replace_folder(Path(os.path.abspath(folder)), files)
    return folder


def read_card(folder: PathLike) -> Dict[str, str]:
    """The fields of the model card ``folder/README.md`` as :func:`write_release` lays it
    out: ``name`` (the title), ``summary`` (the first line after it) and each section of
    :data:`CARD_SECTIONS` the card holds, by field (``{"data": "Tiny ImageNet ..."}``).

    The card is each release's one description of itself (docs/pretrained.md): ``glomo
    pretrained`` quotes its summary and data from here. A ``## `` line inside a fenced
    block (the command) does not start a section; an unreadable card gives ``{}``."""
    try:
        lines = (Path(folder) / "README.md").read_text(encoding="utf-8",
                                                       errors="replace").splitlines()
    except OSError:
        return {}
    titles = {title: field for field, title in CARD_SECTIONS.items()}
    fields: Dict[str, List[str]] = {"summary": []}
    current, fence = "summary", ""
    for line in lines:
        run = re.match(r"`{3,}", line)
        if run and (not fence or line.strip() == fence):
            fence = "" if fence else run.group()
        elif not fence and line.startswith("# ") and "name" not in fields:
            fields["name"] = [line[2:]]
            continue
        elif not fence and line.startswith("## "):
            current = titles.get(line[3:].strip(), "")  # ('' for Loading, or a section
            fields.setdefault(current, [])  # this version does not know)
            continue
        fields.setdefault(current, []).append(line)
    text = {k: "\n".join(v).strip() for k, v in fields.items() if k}
    text["summary"] = next(iter(text["summary"].splitlines()), "")
    return {k: v for k, v in text.items() if v}


def describe_release(name: str) -> Dict[str, Any]:
    """What ``glomo pretrained`` lists about the released predictor ``name``, loaded (a
    :class:`ValueError` if there is none, or a ``PretrainedFormatError`` if it is broken):
    its shapes, and its card's ``summary`` and ``data`` (the data it was trained on, the
    card's "Data" section on one line)."""
    path = release_path(name)
    predictor = PretrainedGraphPredictor.from_pretrained(path)
    modality = predictor.modality
    card = read_card(path)
    return dict(name=name, modality=modality, directions=len(predictor.directions),
                layers=predictor.num_layers, heads=predictor.heads,
                units=list(cast(Tuple[int, int], predictor.image_size)) if modality == "pixels"
                else predictor.num_tokens,
                weights_bytes=(path / "model.safetensors").stat().st_size,
                summary=card.get("summary", ""), data=" ".join(card.get("data", "").split()),
                path=str(path), origin=releases_origin())
