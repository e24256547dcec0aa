"""Files a call returns: the limits they must fit, digests, the strict JSON they hold."""
from __future__ import annotations

import hashlib
import json
import os
from typing import Dict, List, Tuple

from benchmarks.gpu import limits
from glomo_pyg.atomic_files import atomic_write

MANIFEST = "manifest.json"
CONSOLE = "console.log"  # the call's own `tee` of everything printed (not digested)


class ReturnedFilesError(ValueError):
    """A returned folder that breaks the limits of what a call brings back."""


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def listing(folder: str) -> List[Tuple[str, int]]:
    """``(relative path, bytes)`` of every file under ``folder``, sorted; refuses links,
    special files, names a call cannot return and folders deeper than it returns."""
    out = []
    for top, dirs, names in os.walk(folder, followlinks=False):
        rel_top = os.path.relpath(top, folder)
        depth = 0 if rel_top == "." else rel_top.count(os.sep) + 1
        for d in dirs:
            if os.path.islink(os.path.join(top, d)):
                raise ReturnedFilesError(f"{os.path.join(top, d)} is a link: a call returns "
                                         "plain files only")
        for name in names + ([] if rel_top == "." else [os.path.basename(top)]):
            if not limits.NAME.match(name):
                raise ReturnedFilesError(f"{os.path.join(top, name)}: a call returns only names "
                                         "of letters, digits, '.', '_' and '-'")
        for name in names:
            path = os.path.join(top, name)
            rel = os.path.normpath(os.path.join(rel_top, name))
            if os.path.islink(path) or not os.path.isfile(path):
                raise ReturnedFilesError(f"{path} is not a plain file: a call returns plain "
                                         "files only")
            if depth > limits.RETURN_DEPTH:
                raise ReturnedFilesError(f"{rel} lies {depth} folders down: a call returns "
                                         f"files at most {limits.RETURN_DEPTH} folders down")
            out.append((rel, os.path.getsize(path)))
    return sorted(out)


def check_limits(folder: str) -> List[Tuple[str, int]]:
    """:func:`listing`, refused unless it fits what one call returns."""
    files = listing(folder)
    if len(files) > limits.RETURN_FILES:
        raise ReturnedFilesError(f"{folder} holds {len(files)} files; a call returns at most "
                                 f"{limits.RETURN_FILES}: {', '.join(f for f, _ in files)}")
    for rel, size in files:
        if size > limits.RETURN_FILE_BYTES:
            raise ReturnedFilesError(f"{rel} is {size / limits.MIB:.1f} MiB; a call returns "
                                     f"files of at most {limits.RETURN_FILE_BYTES // limits.MIB} MiB")
    total = sum(size for _, size in files)
    if total > limits.RETURN_TOTAL_BYTES:
        raise ReturnedFilesError(f"{folder} holds {total / limits.MIB:.1f} MiB; a call returns at "
                                 f"most {limits.RETURN_TOTAL_BYTES // limits.MIB} MiB in all")
    return files


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError(f"duplicate key {next(k for k in keys if keys.count(k) > 1)!r}")
    return dict(pairs)


def read_json(path: str, what: str, limit: int = 16 << 20) -> Dict:
    """A JSON object from ``path`` (no duplicate keys, no NaN, at most ``limit`` bytes)."""
    if not os.path.isfile(path):
        raise ValueError(f"{path} ({what}) is missing")
    if os.path.getsize(path) > limit:
        raise ValueError(f"{path} ({what}) is larger than {limit} bytes")
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh, object_pairs_hook=_no_duplicates,
                             parse_constant=lambda c: (_ for _ in ()).throw(
                                 ValueError(f"{c} is not JSON")))
    except ValueError as err:
        raise ValueError(f"{path} ({what}) is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} ({what}) must hold a JSON object")
    return data


def write_json(path: str, data: Dict) -> None:
    with atomic_write(path) as fh:
        json.dump(data, fh, indent=1, sort_keys=True, allow_nan=False)
