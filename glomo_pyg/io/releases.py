"""Released predictors: pretrained graph predictors shipped in ``pretrained/NAME/`` (the
wheel carries them as ``glomo_pyg/pretrained/NAME/``) and loaded by name
(docs/pretrained.md)."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union, cast

import torch

from glomo_pyg.atomic_files import replace_folder
from glomo_pyg.io.paths import open_regular
from glomo_pyg.io.seal import SEAL_KEY, seal_of
from glomo_pyg.nn.pretrained import PretrainedGraphPredictor

ENV_VAR = "GLOMO_PRETRAINED_DIR"
RELEASE_NAME = re.compile(r"[a-z0-9][a-z0-9.-]*")
RELEASE_FILES = ("README.md", "config.json", "model.safetensors")
# the repository carries the releases: each stays small, and so do all of them
MAX_WEIGHTS_BYTES = 6 << 20
MAX_RELEASES_BYTES = 16 << 20
# a card is a few KiB, and `glomo pretrained` reads every one: a larger one is refused unread
MAX_CARD_BYTES = 256 << 10
CARD_NAME = "README.md"

# the sealed config.json entry binding a release to its name, modality and card (write_release)
RELEASE_KEY = "release"
# The releases written before RELEASE_KEY, by the weights' SHA-256 their sealed config.json
# records: the name each must be found under (its weights identify it however the config is
# resealed or the card edited), so that a renamed copy is refused like a newer release.
UNSEALED_RELEASE_NAMES: Dict[str, str] = {
    "821e222df4ec8c524f8603a842c6f79e767a0574528eb74c359b8b4e44b7588e": "imdb-text-cpu",
    "98a9036a8cfa447a8e2bfe722a2c3f99d00cc5f66572eb7cb739a30de2f9ff26": "imagenet32-pixel-cpu",
    "a964e5e957115fe073cf50aa7002b3ac297e8f7e9449e5ca2b5f07c7309285cc": "imagenet32-pixel"}

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


def release_name_of(path: PathLike) -> Optional[str]:
    """The name under which the folder ``path`` is a release, or ``None`` if it is not in
    :func:`releases_root`: the entry of the releases folder as ``path`` spells it (an alias
    there is a name of its own), else the name of the folder it resolves to."""
    root, given = os.path.abspath(releases_root()), os.path.abspath(path)
    if os.path.dirname(given) == root:
        return os.path.basename(given)
    return os.path.basename(os.path.realpath(path)) if in_releases_root(path) else None


def _releases(root: Path, origin: str = "") -> List[str]:
    """The release names in ``root``; ``origin`` (``'$VAR=...: '``) prefixes an error."""
    try:
        entries = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as err:  # (a bare errno would not say which setting points there)
        why = "its path runs into a loop of symbolic links" if err.errno == errno.ELOOP \
            else err.strerror or str(err)
        hint = f"; point {ENV_VAR} at a folder of release folders, or unset it" if origin else ""
        raise ValueError(f"{origin}the releases folder {root} cannot be listed: {why}{hint}") \
            from None
    return sorted(n for n in entries
                  if RELEASE_NAME.fullmatch(n) and (root / n / "config.json").is_file())


def released_names() -> List[str]:
    """Names of the released predictors, sorted (none where the folder does not exist);
    a :class:`ValueError` naming the folder (and ``$GLOMO_PRETRAINED_DIR`` if it chose
    it) if it cannot be listed, e.g. a loop of symbolic links."""
    env = os.environ.get(ENV_VAR)
    return _releases(releases_root(), f"{ENV_VAR}={env!r}: " if env else "")


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
    into ``folder``, replacing it as a whole, and return ``folder``. The config seals the
    release's name, modality and card digest (:data:`RELEASE_KEY`): loading refuses the
    folder under another name or with another card (:func:`release_problem`).

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
            match the card; or the card would exceed :data:`MAX_CARD_BYTES`, the release
            :data:`MAX_WEIGHTS_BYTES` or the releases together :data:`MAX_RELEASES_BYTES`.
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
    files[CARD_NAME] = _readme(card).encode("utf-8")
    files["config.json"] = _sealed_config(files["config.json"], card["name"], modality,
                                          files[CARD_NAME])
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
        (len(files[CARD_NAME]) > MAX_CARD_BYTES, f"the model card would have "
         f"{len(files[CARD_NAME])} bytes, more than the {MAX_CARD_BYTES >> 10} KiB a card may "
         "have (glomo pretrained reads no more)"),
        (size > MAX_WEIGHTS_BYTES, f"the release's weights file has {size / 2**20:.2f} MiB, "
         f"more than the {MAX_WEIGHTS_BYTES / 2**20:g} MiB a release may hold"),
        (total > MAX_RELEASES_BYTES, f"the releases in {folder.parent} would take "
         f"{total / 2**20:.1f} MiB with this one, more than the "
         f"{MAX_RELEASES_BYTES / 2**20:g} MiB they may take together")) if bad]
    if problems:
        raise ValueError("; ".join(problems))
    replace_folder(Path(os.path.abspath(folder)), files)
    return folder


def _sealed_config(config: bytes, name: str, modality: str, card: bytes) -> bytes:
    """``config`` (save_pretrained's sealed JSON) with :data:`RELEASE_KEY` added and sealed:
    the release's name, modality and card digest, which loading holds the folder to."""
    body = {k: v for k, v in json.loads(config).items() if k != SEAL_KEY}
    body[RELEASE_KEY] = dict(name=name, modality=modality,
                             card_sha256=hashlib.sha256(card).hexdigest())
    body[SEAL_KEY] = seal_of(body)  # (last: it covers everything above)
    return json.dumps(body, indent=2, allow_nan=False).encode()


def card_bytes(folder: PathLike) -> Optional[bytes]:
    """The model card ``folder/README.md`` as bytes, ``None`` if it is missing or cannot
    be opened: the one place a card is read. It is opened without blocking (a FIFO is
    refused, :class:`~glomo_pyg.io.paths.NotRegularFileError`) and a card over
    :data:`MAX_CARD_BYTES` is refused by its size, unread (:class:`ValueError`)."""
    file = Path(folder) / CARD_NAME
    try:
        fd = open_regular(file, "model card")
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fd).st_size
        data = fh.read(MAX_CARD_BYTES + 1) if size <= MAX_CARD_BYTES else b""
    if max(size, len(data)) > MAX_CARD_BYTES:  # (it may grow after the fstat)
        raise ValueError(f"{file} has {max(size, len(data))} bytes, more than the "
                         f"{MAX_CARD_BYTES >> 10} KiB a model card may have: it is not a card "
                         "write_release wrote")
    return data


def read_card(folder: PathLike) -> Dict[str, str]:
    """The fields of the model card ``folder/README.md`` as :func:`write_release` lays it
    out: ``name`` (the title), ``summary`` (the first line after it) and each section of
    :data:`CARD_SECTIONS` the card holds, by field (``{"data": "Tiny ImageNet ..."}``).

    The card is each release's one description of itself (docs/pretrained.md): ``glomo
    pretrained`` quotes its summary and data from here. A ``## `` line inside a fenced
    block (the command) does not start a section; a missing or unreadable card gives
    ``{}``; one over :data:`MAX_CARD_BYTES` or no regular file, a :class:`ValueError`
    (see :func:`card_bytes`)."""
    data = card_bytes(folder)
    return {} if data is None else _parse_card(data.decode("utf-8", errors="replace"))


def _parse_card(card: str) -> Dict[str, str]:
    """The fields of the card text ``card`` (see :func:`read_card`)."""
    lines = card.splitlines()
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


def _named(name: str, folder: Path, sealed: str, how: str) -> str:
    return (f"{folder} is the released predictor {sealed!r}, as {how}, but is found under the "
            f"name {name!r}: a release is loaded by its folder's name, so a renamed or copied "
            f"release is refused. Rename the folder to {sealed}, or write the predictor as a "
            "release of the new name (glomo_pyg.io.releases.write_release)")


def _sealed_problems(name: str, folder: Path, entry: Any, modality: str) -> List[str]:
    """What is wrong with a release whose config seals its :data:`RELEASE_KEY` entry."""
    config, file = folder / "config.json", folder / CARD_NAME
    if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in (
            "name", "modality", "card_sha256")):
        return [f"{config}: its {RELEASE_KEY!r} entry must be an object of the release's "
                "name, modality and card_sha256 (strings), as write_release writes it"]
    if entry["name"] != name:
        return [_named(name, folder, entry["name"], "its sealed config.json records")]
    card = card_bytes(folder)
    return [text for bad, text in (
        (entry["modality"] != modality, f"{config} seals modality {entry['modality']!r}, the "
         f"predictor reads {modality}"),
        (card is None, f"{file} is missing: a release carries the model card it was sealed "
         "with (write_release)"),
        (card is not None and hashlib.sha256(card).hexdigest() != entry["card_sha256"],
         f"{file} is not the model card sealed with the release (its SHA-256 differs from "
         f"the one {config} records): it was edited or replaced; write the release again "
         "with write_release")) if bad]


def _unsealed_problems(name: str, folder: Path, config: Mapping[str, Any],
                       modality: str) -> List[str]:
    """What is wrong with a release whose config seals no name: one of
    :data:`UNSEALED_RELEASE_NAMES` must have its name, and a card must describe it."""
    weights = config.get("weights")
    known = UNSEALED_RELEASE_NAMES.get(weights.get("sha256", "")) \
        if isinstance(weights, dict) else None
    if known is not None and known != name:
        return [_named(name, folder, known, "the weights' SHA-256 its sealed config.json "
                       "records shows (a release made before names were sealed)")]
    card, file = read_card(folder), folder / CARD_NAME
    return [text for bad, text in (
        (card.get("name", name) != name, f"{file} is the model card of {card.get('name')!r} "
         f"(its title), but the release is found under the name {name!r}: a card describes "
         "its own release"),
        (card.get("modality", modality) != modality, f"{file} says modality "
         f"{card.get('modality')!r}, the predictor reads {modality}")) if bad]


def release_problem(name: str, folder: PathLike, config: Mapping[str, Any],
                    modality: str) -> Optional[str]:
    """``None`` if the folder ``folder``, found under the release name ``name``, is that
    release, else why not; loading a release asks this once its seal has passed.

    A release written by :func:`write_release` seals its name, modality and card's
    SHA-256 in ``config`` (:data:`RELEASE_KEY`): they must be ``name``, ``modality`` (what
    the loaded predictor reads) and the card's. An earlier release is held to the name
    :data:`UNSEALED_RELEASE_NAMES` gives its weights, and to its card's title and
    modality where it has a card."""
    folder = Path(folder)
    entry = config.get(RELEASE_KEY)
    problems = _unsealed_problems(name, folder, config, modality) if entry is None else \
        _sealed_problems(name, folder, entry, modality)
    return "; ".join(problems) if problems else None


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
