"""The Hugging Face Hub route for saved predictors (docs/pretrained.md, "Hugging Face
Hub"). ``hf://owner/name`` names a Hub model repository holding a predictor folder: its
``config.json``, ``model.safetensors`` and ``README.md`` (if it has one), and nothing else
of the repository (never a pickle), are downloaded into the standard Hugging Face cache
and loaded with every check a local folder passes
(:func:`glomo_pyg.load_pretrained`). :func:`push_to_hub` uploads a predictor,
:func:`glomo_pyg.publish.push_folder` a saved folder. huggingface_hub (the ``hub`` extra)
is imported only when the route is used."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, Mapping, Optional, Tuple, Union
from urllib.parse import quote

from glomo_pyg.extras import require
from glomo_pyg.io import releases
from glomo_pyg.io.paths import NotRegularFileError, open_regular
from glomo_pyg.io.pretrained import (
    CONFIG_NAME,
    MAX_CONFIG_BYTES,
    MAX_WEIGHTS_BYTES,
    WEIGHTS_NAME,
    PretrainedFormatError,
    SavablePredictor,
)
from glomo_pyg.version import __version__

PREFIX = "hf://"
FEATURE = "the Hugging Face Hub route (hf:// names, push_to_hub)"
DEFAULT_MESSAGE = "Upload a GLoMo graph predictor"
# The Hub's rules for a repository id: 'owner/name', each part of letters, digits, '.',
# '_' and '-', not starting with '.', '_' or '-' nor ending with '.' or '-', at most 96
# characters; no '..' or '--' (so no part is a path step)
_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?")
# a branch, tag or commit: git ref components, none starting with '.' (the cache keeps
# refs/<revision> as a file: no '..' may climb out of it)
_REVISION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(?:/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
MAX_REVISION = 255
_COMMIT = re.compile(r"[0-9a-f]{40}")
# The files of a predictor folder, each with the bound the loader holds it to (checked
# with the sizes the Hub lists, before anything is fetched): nothing else is downloaded.
LIMITS: Dict[str, int] = {CONFIG_NAME: MAX_CONFIG_BYTES, WEIGHTS_NAME: MAX_WEIGHTS_BYTES,
                          releases.CARD_NAME: releases.MAX_CARD_BYTES}
REQUIRED = (CONFIG_NAME, WEIGHTS_NAME)
_WHAT = {CONFIG_NAME: "a predictor config", WEIGHTS_NAME: "a predictor's weights",
         releases.CARD_NAME: "a model card"}
_TOKEN_HINT = "log in with `hf auth login` or set HF_TOKEN"


class HubError(PretrainedFormatError):
    """The Hub route cannot give (or take) a predictor: a name that is no repository id,
    an unknown repository or revision, a repository without a predictor, a file over the
    limits, a Hub that cannot be reached or refuses."""


class HubNotFoundError(HubError):
    """The repository, its revision or the predictor's ``config.json`` does not exist
    (or is not visible with the token given)."""


class HubOfflineError(HubError):
    """Offline mode is on (``HF_HUB_OFFLINE=1``) or the Hub cannot be reached, and the
    predictor is not in the Hugging Face cache."""


@dataclasses.dataclass(frozen=True)
class HubPush:
    """What :func:`push_to_hub` or :func:`push_folder` uploaded, in one commit: ``url`` is
    the repository's page (at ``revision``); ``from_pretrained(f"hf://{repo_id}",
    revision=commit)`` loads exactly this."""

    repo_id: str
    revision: str
    commit: str
    url: str
    files: Tuple[str, ...]


def is_hub_name(name: Any) -> bool:
    """Whether ``name`` is a Hub name (``'hf://...'``, a string): always the Hub, never a
    local folder (a folder named ``hf:`` is ``'./hf:/...'``)."""
    return isinstance(name, str) and name.startswith(PREFIX)


def check_repo_id(repo_id: Any, what: str = "repo_id") -> str:
    """``repo_id`` if it is a Hub model repository id ``'owner/name'``, else a
    :class:`HubError` giving the rule (a path such as ``'../x'`` or ``'a/b/c'``, an empty
    name, a NUL or a backslash never is one)."""
    if not isinstance(repo_id, str):
        raise TypeError(f"{what} must be a string 'owner/name', got {type(repo_id).__name__}")
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(_PART.fullmatch(p) for p in parts) or ".." in repo_id or \
            "--" in repo_id or repo_id.endswith(".git"):
        hint = "; give a revision as revision=..." if "@" in repo_id else ""
        raise HubError(f"{what} {repo_id!r} is not a Hugging Face Hub repository id: it must "
                       "be 'owner/name', each part of letters, digits, '.', '_' and '-' "
                       "(starting with a letter or digit, at most 96 characters), without "
                       f"'..' or '--'{hint}")
    return repo_id


def checked_revision(revision: Any) -> Optional[str]:
    if revision is None:
        return None
    if not isinstance(revision, str):
        raise TypeError(f"revision must be a branch, tag or commit name, or None, got "
                        f"{type(revision).__name__}")
    if len(revision) > MAX_REVISION or not _REVISION.fullmatch(revision) or ".." in revision:
        raise HubError(f"revision {revision!r} is not a branch, tag or commit name (letters, "
                       "digits, '.', '_', '-' and '/' between parts; no '..')")
    return revision


def _at(repo_id: str, revision: Optional[str]) -> str:
    return PREFIX + repo_id + (f" (revision {revision!r})" if revision else "")


def hub_module() -> ModuleType:
    """huggingface_hub, with the submodules used here imported (it loads them lazily)."""
    for module in ("huggingface_hub.constants", "huggingface_hub.errors"):
        require(module, FEATURE)
    return require("huggingface_hub", FEATURE)


def _offline(hub: ModuleType) -> bool:
    """Offline as huggingface_hub reads it at import, or as the environment says now."""
    now = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    return bool(hub.constants.is_offline_mode()) or now


def _unreachable(err: BaseException) -> bool:
    """A network error (httpx's TransportError, whichever httpx the client uses)."""
    return isinstance(err, (ConnectionError, TimeoutError)) or \
        any(c.__name__ == "TransportError" for c in type(err).__mro__)


def _hub_error(hub: ModuleType, err: BaseException, repo_id: str, revision: Optional[str],
               pushing: bool = False) -> HubError:
    """A huggingface_hub (or network) error as a :class:`HubError` saying what it means."""
    errors, at, endpoint = hub.errors, _at(repo_id, revision), hub.constants.ENDPOINT
    if isinstance(err, errors.GatedRepoError):
        return HubNotFoundError(f"{at} is a gated repository on {endpoint}: accept its "
                                f"conditions on {endpoint}/{repo_id} and {_TOKEN_HINT}")
    if isinstance(err, errors.RepositoryNotFoundError):
        return HubNotFoundError(f"{at}: there is no model repository {repo_id!r} on "
                                f"{endpoint}, or it is private and no token with access to "
                                f"it was given ({_TOKEN_HINT})")
    if isinstance(err, errors.RevisionNotFoundError):
        return HubNotFoundError(f"{at}: the repository has no revision "
                                f"{revision or 'main'!r} (a branch, tag or commit)"
                                + ("; create the branch first" if pushing else ""))
    if isinstance(err, errors.RemoteEntryNotFoundError):
        return HubNotFoundError(f"{at}: a file the Hub listed is gone (the repository "
                                "changed meanwhile): load it again")
    if isinstance(err, errors.OfflineModeIsEnabled):
        return HubOfflineError(f"{at}: offline mode is on (HF_HUB_OFFLINE=1)")
    if isinstance(err, errors.HfHubHTTPError):
        status = getattr(err.response, "status_code", "?")
        said = (getattr(err, "server_message", None) or "").strip().splitlines()
        return HubError(f"{at}: the Hub at {endpoint} answered {status}"
                        + (f" ({said[0][:200]})" if said else "")
                        + (f": {_TOKEN_HINT}" if status in (401, 403) else ""))
    if _unreachable(err):
        return HubError(f"{at}: the Hub at {endpoint} cannot be reached "
                        f"({type(err).__name__}: {err})")
    return HubError(f"{at}: {'pushing' if pushing else 'downloading'} failed "
                    f"({type(err).__name__}: {err})")


# --- downloading --------------------------------------------------------------------------
def download(name: str, revision: Optional[str] = None) -> Path:
    """The folder of the predictor ``name`` (``'hf://owner/name'``, at ``revision``) in the
    Hugging Face cache, holding its ``config.json``, ``model.safetensors`` and
    ``README.md`` (if the repository has one): these are downloaded, nothing else. Every
    file's size is checked against :data:`LIMITS` with the size the Hub lists before any
    file is fetched, and all are taken from the one commit the revision names. Offline
    (``HF_HUB_OFFLINE=1``), or when the Hub cannot be reached, the cache alone answers.

    Raises:
        HubError: ``name`` is not ``hf://owner/name`` (a path-like name such as
            ``hf://../x``, ``hf://a/b/c``, or one holding a NUL or a backslash), the
            revision is not a revision name, or a file is over :data:`LIMITS`;
            :class:`HubNotFoundError` for an unknown repository or revision or one
            without a predictor; :class:`HubOfflineError` when offline and not cached.
        MissingExtraError: huggingface_hub is not installed (the ``hub`` extra).
    """
    repo_id = check_repo_id(name[len(PREFIX):] if is_hub_name(name) else name,
                            f"{name!r}: the repository")
    revision = checked_revision(revision)
    hub = hub_module()
    if _offline(hub):
        return _cached(hub, repo_id, revision, "offline mode is on (HF_HUB_OFFLINE=1)")
    try:
        info = _api(hub).model_info(repo_id, revision=revision, files_metadata=True)
    except Exception as err:
        if _unreachable(err):
            return _cached(hub, repo_id, revision, f"the Hub at {hub.constants.ENDPOINT} "
                           f"cannot be reached ({type(err).__name__})")
        raise _hub_error(hub, err, repo_id, revision) from None
    commit, files = _listing(info, repo_id, revision)
    return _fetch(hub, repo_id, revision, commit, files)


def _api(hub: ModuleType) -> Any:
    return hub.HfApi(library_name="glomo-pyg", library_version=__version__)


def _listed_size(sibling: Any) -> Optional[int]:
    sizes = [getattr(sibling, "size", None), getattr(getattr(sibling, "lfs", None), "size", None)]
    known = [s for s in sizes if isinstance(s, int) and not isinstance(s, bool)]
    return max(known) if known else None


def _listing(info: Any, repo_id: str, revision: Optional[str]) -> Tuple[str, Tuple[str, ...]]:
    """The commit and the predictor files of the repository listing ``info``, once the
    files a predictor needs are there and none is over its limit."""
    at, commit = _at(repo_id, revision), getattr(info, "sha", None)
    sizes = {s.rfilename: _listed_size(s) for s in getattr(info, "siblings", None) or ()
             if getattr(s, "rfilename", None) in LIMITS}
    missing = [n for n in REQUIRED if n not in sizes]
    if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
        raise HubError(f"{at}: the Hub did not say which commit the revision is ({commit!r})")
    if missing:
        raise HubNotFoundError(f"{at} holds no {' and no '.join(missing)}: it is not a "
                               "glomo_pyg predictor (push_to_hub or `glomo pretrained --push` "
                               "upload one)")
    over = [f"the Hub does not say how large {n} is" if size is None else
            f"{n} has {size} bytes, more than the {LIMITS[n]} ({LIMITS[n] / 2**20:g} MiB) "
            f"{_WHAT[n]} may have" for n, size in sizes.items()
            if size is None or size > LIMITS[n]]
    if over:
        raise HubError(f"{at}: " + "; ".join(over) + ": refused before downloading anything")
    return commit, tuple(n for n in LIMITS if n in sizes)


def _fetch(hub: ModuleType, repo_id: str, revision: Optional[str], commit: str,
           files: Tuple[str, ...]) -> Path:
    """Download ``files`` into the cache; their folder (the commit's snapshot)."""
    paths = []
    try:  # (config.json first, at the revision asked for: the cache then maps it to the
        for i, file in enumerate(files):  # commit for offline use; the rest pinned to it)
            paths.append(Path(hub.hf_hub_download(
                repo_id, file, revision=revision if i == 0 else commit,
                library_name="glomo-pyg", library_version=__version__)))
    except Exception as err:
        raise _hub_error(hub, err, repo_id, revision) from None
    folder = paths[0].parent
    if folder.name != commit or any(p.parent != folder for p in paths):
        raise HubError(f"{_at(repo_id, revision)} changed while it was downloaded (listed at "
                       f"commit {commit}, now at {folder.name}): load it again")
    return folder


def _cached(hub: ModuleType, repo_id: str, revision: Optional[str], why: str) -> Path:
    """The predictor's folder in the cache, without the network."""
    try:
        config = Path(hub.hf_hub_download(repo_id, CONFIG_NAME, revision=revision,
                                          local_files_only=True))
        hub.hf_hub_download(repo_id, WEIGHTS_NAME, revision=config.parent.name,
                            local_files_only=True)
    except (OSError, hub.errors.EntryNotFoundError):  # (LocalEntryNotFoundError is both)
        raise HubOfflineError(f"{_at(repo_id, revision)} is not in the Hugging Face cache "
                              f"({hub.constants.HF_HUB_CACHE}) and {why}: load it once online"
                              ", or unset HF_HUB_OFFLINE") from None
    return config.parent


def read_file(file: Path, limit: int) -> Optional[bytes]:
    """The bytes of the regular file ``file`` (``None`` if missing), at most ``limit``."""
    try:
        fd = open_regular(file, file.name)
    except FileNotFoundError:
        return None
    except (OSError, NotRegularFileError) as err:
        raise PretrainedFormatError(f"{file} cannot be read: {err}") from None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise PretrainedFormatError(f"{file} has more than the {limit} bytes "
                                    f"{_WHAT.get(file.name, 'a file')} may have")
    return data


def card_problem(folder: Path, modality: str) -> Optional[str]:
    """For a release (its config seals a name, modality and card digest): ``None`` if
    ``folder`` holds the card it was sealed with, else why not. Other predictors: None."""
    config = json.loads(read_file(folder / CONFIG_NAME, MAX_CONFIG_BYTES) or b"{}")
    entry = config.get(releases.RELEASE_KEY)
    if entry is None:
        return None
    name = entry.get("name") if isinstance(entry, dict) else None
    try:
        return releases.release_problem(name if isinstance(name, str) else "?", folder,
                                        config, modality)
    except ValueError as err:  # (a card too large, or no regular file)
        return str(err)


# --- pushing ------------------------------------------------------------------------------
def check_push(private: Any, token: Any, commit_message: Any) -> None:
    problems = [text for bad, text in (
        (private is not None and not isinstance(private, bool),
         f"private must be True, False or None, got {private!r}"),
        (token is not None and not isinstance(token, bool) and
         not (isinstance(token, str) and token.strip()),
         "token must be a Hub token (a non-empty string), True, False or None"),
        (not isinstance(commit_message, str) or not commit_message.strip(),
         f"commit_message must be non-empty text, got {commit_message!r}")) if bad]
    if problems:
        raise ValueError("; ".join(problems))


def card_fields(predictor: SavablePredictor, repo_id: str,
                card: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The card ``card`` with its name, summary and modality filled in from the predictor
    (what it shows, never a number it does not)."""
    if card is not None and not isinstance(card, Mapping):
        raise TypeError(f"card must be a mapping of model card fields, got "
                        f"{type(card).__name__}")
    fields = dict(card or {})
    modality = predictor.modality
    size = predictor.image_size
    units = f"{size[0]}x{size[1]} images" if size is not None else \
        f"words of a {predictor.num_tokens}-token vocabulary" if modality == "text" else \
        f"units of {predictor.in_channels} features"
    fields.setdefault("name", repo_id)
    shape = " x ".join(f"{n} {word}{'s' if n != 1 else ''}" for n, word in (
        (predictor.num_layers, "layer"), (predictor.heads, "head"),
        (len(predictor.directions), "direction")))
    fields.setdefault("summary", f"GLoMo latent graphs for PyTorch Geometric over {units}: "
                      f"{shape}.")
    fields.setdefault("modality", modality)
    if fields["modality"] != modality:
        raise ValueError(f"the card says modality {fields['modality']!r}, the predictor "
                         f"reads {modality}")
    return fields


def push_to_hub(predictor: SavablePredictor, repo_id: str, *,
                revision: Optional[str] = None, private: Optional[bool] = None,
                token: Union[str, bool, None] = None, commit_message: str = DEFAULT_MESSAGE,
                card: Optional[Mapping[str, Any]] = None) -> HubPush:
    """Upload ``predictor`` to the Hub model repository ``repo_id`` (created if missing)
    in one commit of exactly three files: ``config.json`` and ``model.safetensors`` as
    :meth:`~glomo_pyg.PretrainedGraphPredictor.save_pretrained` writes them, and a
    ``README.md`` model card (:func:`glomo_pyg.io.releases.model_card`: YAML front matter
    with ``library_name``, ``tags``, ``license``, and ``datasets`` and ``model-index``
    metrics only where ``card`` gives them).

    Args:
        predictor: the predictor to upload.
        repo_id: ``'owner/name'``.
        revision: the branch to commit to (default: main; it must exist).
        private: make a new repository private (``None``: the Hub's default).
        token: a Hub token (default: the logged-in one, or ``$HF_TOKEN``).
        commit_message: the commit's message.
        card: model card fields, all optional (:data:`glomo_pyg.io.releases.CARD_FIELDS`
            and :data:`~glomo_pyg.io.releases.CARD_EXTRAS`); ``name`` defaults to
            ``repo_id``, ``summary`` to the predictor's shape, ``modality`` to what it
            reads. A metric's value must be a number of the card's ``quality``.

    Raises:
        ValueError: a bad ``repo_id`` (a :class:`HubError`), option or card, checked
            before anything is written or sent.
        HubError: the Hub refuses or cannot be reached (:class:`HubOfflineError`: offline).
        MissingExtraError: huggingface_hub is not installed (the ``hub`` extra).
    """
    if not isinstance(predictor, SavablePredictor):
        raise TypeError(f"expected a PretrainedGraphPredictor, got {type(predictor).__name__}")
    repo_id, revision = check_repo_id(repo_id), checked_revision(revision)
    check_push(private, token, commit_message)
    text = releases.model_card(card_fields(predictor, repo_id, card), PREFIX + repo_id,
                               complete=False)
    hub = hub_module()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "predictor"
        predictor.save_pretrained(folder)
        files = {n: (folder / n).read_bytes() for n in REQUIRED}
    files[releases.CARD_NAME] = text.encode("utf-8")
    return upload(hub, repo_id, files, revision, private, token, commit_message)


def upload(hub: ModuleType, repo_id: str, files: Dict[str, bytes], revision: Optional[str],
            private: Optional[bool], token: Union[str, bool, None],
            commit_message: str) -> HubPush:
    """Create the repository if needed and commit ``files``, the files of one commit."""
    if _offline(hub):
        raise HubOfflineError(f"cannot push to {PREFIX}{repo_id}: offline mode is on "
                              "(HF_HUB_OFFLINE=1)")
    api = _api(hub)
    operations = [hub.CommitOperationAdd(path_in_repo=name, path_or_fileobj=data)
                  for name, data in files.items()]
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, token=token)
        commit = api.create_commit(repo_id, operations, commit_message=commit_message,
                                   revision=revision, token=token)
    except Exception as err:
        raise _hub_error(hub, err, repo_id, revision, pushing=True) from None
    url = f"{api.endpoint}/{repo_id}" + (f"/tree/{quote(revision, safe='')}" if revision else "")
    return HubPush(repo_id, revision or "main", str(commit.oid), url, tuple(files))

