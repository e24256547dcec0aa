"""Files a call returns: the limits they must fit, digests, the strict JSON they hold."""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from typing import Dict, List, Tuple

from benchmarks.gpu import limits
from glomo_pyg import atomic_files

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
                                     f"files of at most "
                                     f"{limits.RETURN_FILE_BYTES // limits.MIB} MiB")
    total = sum(size for _, size in files)
    if total > limits.RETURN_TOTAL_BYTES:
        raise ReturnedFilesError(f"{folder} holds {total / limits.MIB:.1f} MiB; a call returns at "
                                 f"most {limits.RETURN_TOTAL_BYTES // limits.MIB} MiB in all")
    return files


MAX_DEPTH = 24  # nesting of any JSON read here (a ledger line's graph check is about 8)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError(f"duplicate key {next(k for k in keys if keys.count(k) > 1)!r}")
    return dict(pairs)


def _finite(text: str) -> float:
    # json parses 1e999 to inf: refused like the NaN and Infinity it stands for
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _depth(text: str) -> int:
    """The deepest nesting of ``text``'s arrays and objects, counted without recursion
    (json's own parser recurses: 5,000 brackets would raise RecursionError)."""
    depth = deepest = 0
    for c in re.sub(r"[^\[\]{}]", "", _STRING.sub("", text)):
        depth += 1 if c in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _plain_strings(value) -> None:
    """Refuse strings that cannot be written back as UTF-8 (a lone surrogate)."""
    if isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, dict):
        for k, v in value.items():
            _plain_strings(k)
            _plain_strings(v)
    elif isinstance(value, list):
        for v in value:
            _plain_strings(v)


def loads(text: str, max_depth: int = MAX_DEPTH):
    """Strict JSON: no duplicate keys, no NaN, Infinity or overflowing numbers, no lone
    surrogates, at most ``max_depth`` levels deep. Raises ``ValueError`` naming why."""
    if _depth(text) > max_depth:
        raise ValueError(f"nested deeper than {max_depth} levels")
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_float=_finite,
                          parse_constant=_refuse_constant)
        _plain_strings(data)
    except RecursionError:  # (cannot happen within max_depth; kept as a named error)
        raise ValueError(f"nested deeper than {max_depth} levels") from None
    except UnicodeError as err:
        raise ValueError(f"holds a string that is not UTF-8 ({err.reason})") from None
    return data


def parse_json(raw: bytes, what: str, limit: int = 16 << 20) -> Dict:
    """A JSON object from the bytes ``raw`` (:func:`loads`, at most ``limit`` bytes)."""
    if len(raw) > limit:
        raise ValueError(f"{what} is larger than {limit} bytes")
    try:
        data = loads(raw.decode("utf-8"))
    except ValueError as err:  # (UnicodeDecodeError included)
        raise ValueError(f"{what} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} must hold a JSON object")
    return data


def read_json(path: str, what: str, limit: int = 16 << 20) -> Dict:
    """A JSON object from ``path`` (:func:`parse_json`)."""
    if not os.path.isfile(path):
        raise ValueError(f"{path} ({what}) is missing")
    if os.path.getsize(path) > limit:
        raise ValueError(f"{path} ({what}) is larger than {limit} bytes")
    with open(path, "rb") as fh:
        raw = fh.read(limit + 1)
    return parse_json(raw, f"{path} ({what})", limit)


def copy_private(folder: str, rel: str, private: str, limit: int) -> Tuple[int, str]:
    """Read ``folder/rel`` once (no link followed, a plain file, at most ``limit`` bytes)
    into ``private/rel``; returns the copy's size and SHA-256. Everything after uses the
    copy: a file swapped in the returned folder afterwards is never read."""
    src = os.path.join(folder, rel)
    try:
        fd = os.open(src, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as err:
        raise ReturnedFilesError(f"{src} cannot be read ({err.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise ReturnedFilesError(f"{src} is not a plain file: a call returns plain files "
                                     "only")
        raw = fh.read(limit + 1)
    if len(raw) > limit:
        raise ReturnedFilesError(f"{src} grew past {limit} bytes while being read")
    dst = os.path.join(private, rel)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(dst, "xb") as fh:
        fh.write(raw)
    return len(raw), hashlib.sha256(raw).hexdigest()


def write_json(path: str, data: Dict) -> None:
    atomic_files.write_json(path, data, sort_keys=True, allow_nan=False)
