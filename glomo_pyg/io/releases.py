"""Released predictors: pretrained graph predictors shipped in ``pretrained/NAME/`` (the
wheel carries them as ``glomo_pyg/pretrained/NAME/``) and loaded by name
(docs/pretrained.md)."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from glomo_pyg.io.paths import open_regular
from glomo_pyg.io.seal import SEAL_KEY, seal_of

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
# optional card entries, written only into the card's YAML front matter (Hugging Face's
# metadata): Hub dataset ids, and measured numbers of the Quality section (model-index)
CARD_EXTRAS = ("datasets", "metrics")
MODALITIES = ("text", "pixels")
# the front matter every card opens with (https://huggingface.co/docs/hub/model-cards)
LIBRARY_NAME = "glomo-pyg"
CARD_TAGS = ("graph-machine-learning", "pytorch-geometric", "glomo")
CARD_LICENSE = "mit"  # the project's (LICENSE)
METRIC_KEYS = ("name", "type", "value", "dataset", "dataset_type")  # and optional "task"
DEFAULT_TASK = "graph-ml"  # the Hub's task id for graph machine learning
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
_PLAIN_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?")
# huggingface_hub.repocard.REGEX_YAML_BLOCK: what the Hub reads as a card's metadata is
# never read as a section here (nor the other way round)
_FRONT_MATTER = re.compile(r"^(\s*---(?:\r\n|\r|\n))([\S\s]*?)"
                           r"((?:\r\n|\r|\n)---[ \t]*(\r\n|\n|$))")
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


def releases_in(root: Path, origin: str = "") -> List[str]:
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
    return releases_in(releases_root(), f"{ENV_VAR}={env!r}: " if env else "")


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


def check_card(card: Mapping, complete: bool = True) -> Dict[str, Any]:
    """``card`` checked: its text fields stripped (``complete``: all of :data:`CARD_FIELDS`,
    as a release needs; else ``name``, ``summary``, ``modality`` and any others, as a Hub
    card needs) and its :data:`CARD_EXTRAS` normalised."""
    if not isinstance(card, Mapping):
        raise TypeError(f"card must be a mapping of the fields {list(CARD_FIELDS)}, got "
                        f"{type(card).__name__}")
    required = CARD_FIELDS if complete else ("name", "summary", "modality")
    unknown = sorted(str(k) for k in card  # (a misspelt field would silently leave its
                     if k not in CARD_FIELDS and k not in CARD_EXTRAS)  # section out)
    missing = [k for k in CARD_FIELDS if (k in required or k in card) and
               (not isinstance(card.get(k), str) or not card[k].strip())]
    out: Dict[str, Any] = {k: card[k].strip() for k in CARD_FIELDS
                           if k in card and k not in missing}
    name, summary = out.get("name", "x"), out.get("summary", "")
    modalities = MODALITIES if complete else (*MODALITIES, "features")
    headed = [k for k in CARD_SECTIONS if k in out and k != "command" and
              _TOP_HEADING.search(out[k])]
    extras, extra_problems = _check_extras(card, out.get("quality", ""))
    problems = [text for bad, text in (
        (unknown, f"unknown card fields {unknown}; a card has {list(CARD_FIELDS)} and "
         f"optionally {list(CARD_EXTRAS)}"),
        (missing, f"the card lacks the fields {missing} (each must be non-empty text)"),
        (complete and not RELEASE_NAME.fullmatch(name),
         f"release name {name!r} must match {RELEASE_NAME.pattern} (lower-case "
         "letters, digits, '.' and '-'): it is typed to load it"),
        (not complete and not _one_line(name), f"the card's name (its title) must be one "
         f"line of text, got {name!r}"),
        ("\n" in summary or summary.startswith("#"),
         f"the card's summary must be one line of text, got {summary!r}"),
        (out.get("modality", "text") not in modalities,
         f"the card's modality must be one of {modalities}, got {out.get('modality')!r}"),
        (headed, f"the card fields {headed} hold '#' or '##' headings, which would split the "
         "README's sections: use '###' or deeper")) if bad] + extra_problems
    if problems:
        raise ValueError("; ".join(problems))
    return {**out, **extras}


def _one_line(text: str) -> bool:
    return len(text.splitlines()) == 1 and not text.startswith("#")


def _check_extras(card: Mapping, quality: str) -> Tuple[Dict[str, Any], List[str]]:
    """The card's :data:`CARD_EXTRAS`, normalised, and what is wrong with them. A metric
    must quote a number the Quality section writes: the front matter never adds one."""
    out: Dict[str, Any] = {}
    problems = []
    datasets = card.get("datasets", [])
    if isinstance(datasets, (list, tuple)) and all(
            isinstance(d, str) and _HUB_ID.fullmatch(d) and ".." not in d for d in datasets):
        out["datasets"] = list(datasets)
    else:
        problems.append("the card's datasets must be a list of Hugging Face Hub dataset ids "
                        f"('owner/name' or 'name'), got {datasets!r}")
    metrics = card.get("metrics", [])
    if not isinstance(metrics, (list, tuple)):
        return out, problems + [f"the card's metrics must be a list of mappings of "
                                f"{list(METRIC_KEYS)}, got {type(metrics).__name__}"]
    checked = [_check_metric(i, m, quality) for i, m in enumerate(metrics)]
    problems += [p for _, p in checked if p is not None]
    out["metrics"] = [m for m, _ in checked if m is not None]
    return out, problems


def _check_metric(i: int, metric: Any, quality: str) -> Tuple[Optional[Dict[str, str]],
                                                               Optional[str]]:
    """One entry of ``metrics`` as text ready for the front matter, or what is wrong."""
    keys = (*METRIC_KEYS, "task")
    if not isinstance(metric, Mapping) or set(metric) - set(keys) or \
            not set(METRIC_KEYS) <= set(metric):
        return None, (f"metrics[{i}] must be a mapping of {list(METRIC_KEYS)} (and optionally "
                      f"'task', default {DEFAULT_TASK!r}), got {metric!r}")
    out = {k: metric.get(k, DEFAULT_TASK) for k in keys if k != "value"}
    ids = ("type", "dataset_type", "task")  # (identifiers: no spaces)
    bad = [k for k, v in out.items() if not isinstance(v, str) or not v.strip() or len(v) > 200
           or not (_HUB_ID.fullmatch(v) if k in ids else _one_line(v))]
    value = metric["value"]
    number = value if isinstance(value, str) else repr(value) \
        if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
    if bad:
        return None, f"metrics[{i}]: {bad} must be one line of text (type, dataset_type and " \
            f"task: identifiers such as 'uuas' or 'loss'), got {metric!r}"
    if not _PLAIN_NUMBER.fullmatch(number):
        return None, f"metrics[{i}] ({out['name']}): the value must be a number written as " \
            f"a plain decimal (0.429, 12), got {value!r}"
    if not re.search(rf"(?<![\w.]){re.escape(number)}(?!\d)", quality):
        return None, f"metrics[{i}] ({out['name']}): {number} is not a number of the card's " \
            "Quality section: a metric quotes what was measured there"
    return {**out, "value": number}, None


def _quoted(text: str) -> str:
    """``text`` as a YAML double-quoted scalar: what is not printable, escaped."""
    return '"' + "".join("\\" + c if c in '"\\' else c if c.isprintable() else
                         f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}"
                         for c in text) + '"'


def _front_matter(card: Mapping[str, Any]) -> List[str]:
    """The lines of the card's YAML front matter: library, license, tags, and the
    datasets and measured metrics (``model-index``) where the card has them."""
    lines = ["---", f"library_name: {LIBRARY_NAME}", f"license: {CARD_LICENSE}", "tags:",
             *(f"- {tag}" for tag in CARD_TAGS)]
    if card.get("datasets"):
        lines += ["datasets:", *(f"- {_quoted(d)}" for d in card["datasets"])]
    groups: Dict[Tuple[str, str, str], List[Dict[str, str]]] = {}
    for m in card.get("metrics", ()):
        groups.setdefault((m["task"], m["dataset"], m["dataset_type"]), []).append(m)
    if groups:
        lines += ["model-index:", f"- name: {_quoted(card['name'])}", "  results:"]
    for (task, dataset, kind), group in groups.items():
        lines += ["  - task:", f"      type: {_quoted(task)}", "    dataset:",
                  f"      name: {_quoted(dataset)}", f"      type: {_quoted(kind)}",
                  "    metrics:"]
        for m in group:
            lines += [f"    - name: {_quoted(m['name'])}", f"      type: {_quoted(m['type'])}",
                      f"      value: {m['value']}"]
    return [*lines, "---"]


def card_text(card: Dict[str, Any], load_as: Optional[str] = None) -> str:
    """The ``README.md`` text of the checked card ``card`` (:func:`check_card`)."""
    lines = [*_front_matter(card), f"# {card['name']}", "", card["summary"], ""]
    for field, title in CARD_SECTIONS.items():
        if field not in card:  # (a Hub card may leave sections out)
            continue
        text = card[field]
        if field == "command":  # a fence longer than any backtick run inside
            fence = "`" * max(3, 1 + max(map(len, re.findall("`+", text)), default=0))
            text = f"{fence}sh\n{text}\n{fence}"
        lines += [f"## {title}", "", text, ""]
    lines += ["## Loading", "", "```python", "from glomo_pyg import PretrainedGraphPredictor",
              "", "predictor = PretrainedGraphPredictor.from_pretrained("
              f'"{load_as or card["name"]}")', "```", ""]
    return "\n".join(lines)


def model_card(card: Mapping[str, Any], load_as: Optional[str] = None,
               complete: bool = True) -> str:
    """The ``README.md`` text of the model card ``card``, as :func:`write_release` writes
    it: YAML front matter (``library_name``, ``license``, ``tags``, and ``datasets`` and a
    ``model-index`` of ``metrics`` where given), the title, the summary, the sections of
    :data:`CARD_SECTIONS` in order and how to load it (``from_pretrained(load_as)``,
    default the card's name).

    ``complete=False`` (a card for the Hub) needs only ``name``, ``summary`` and
    ``modality`` (``'features'`` allowed) and writes the sections it is given.
    ``metrics`` entries are mappings of :data:`METRIC_KEYS` (and ``task``, default
    :data:`DEFAULT_TASK`); each ``value`` must be a number the Quality section writes.
    A :class:`ValueError` names every problem of the card."""
    return card_text(check_card(card, complete), load_as)


def replaceable_release_folder(folder: PathLike) -> bool:
    """Whether a release may be written at ``folder``: absent, or a folder holding only a
    release's files (never a user's folder that happens to bear the release's name)."""
    folder = Path(folder)
    return not os.path.lexists(folder) or (folder.is_dir() and not folder.is_symlink() and
                                          set(os.listdir(folder)) <= set(RELEASE_FILES))


def sealed_release_config(config: bytes, name: str, modality: str, card: bytes) -> bytes:
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
    pretrained`` quotes its summary and data from here. The YAML front matter is skipped
    (:func:`card_body`: nothing in it is a field); a ``## `` line inside a fenced block
    (the command) does not start a section, and the command is given without its fence,
    as :func:`write_release` was given it; a missing or unreadable card gives ``{}``; one
    over :data:`MAX_CARD_BYTES` or no regular file, a :class:`ValueError` (see
    :func:`card_bytes`)."""
    data = card_bytes(folder)
    return {} if data is None else _parse_card(data.decode("utf-8", errors="replace"))


def card_body(card: str) -> str:
    """The card text ``card`` without its YAML front matter (metadata for the Hub: it holds
    no section, title or summary, however it is written)."""
    card = card.removeprefix("\ufeff")  # (the Hub reads cards as utf-8-sig)
    match = _FRONT_MATTER.search(card)
    return card[match.end():] if match else card


def _parse_card(card: str) -> Dict[str, str]:
    """The fields of the card text ``card`` (see :func:`read_card`)."""
    lines = card_body(card).splitlines()
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
    command = text.get("command", "").split("\n")  # (as written: inside its fence)
    opening = re.fullmatch(r"(`{3,})sh", command[0])
    if len(command) > 1 and opening and command[-1] == opening.group(1):
        text["command"] = "\n".join(command[1:-1])
    return {k: v for k, v in text.items() if v}


def _named(name: str, folder: Path, sealed: str, how: str) -> str:
    return (f"{folder} is the released predictor {sealed!r}, as {how}, but is found under the "
            f"name {name!r}: a release is loaded by its folder's name, so a renamed or copied "
            f"release is refused. Rename the folder to {sealed}, or write the predictor as a "
            "release of the new name (glomo_pyg.publish.write_release)")


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
