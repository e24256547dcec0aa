"""The committed ledger of GPU runs: one JSON object per line, one line per run.

A line records what ran (``slice``, ``recipe`` digest, ``key``: e.g.
``resnet18/glomo/seed3``), where and on what (``commit``, ``device``, ``versions``),
when (``date``), how long (``seconds``) and what it measured (``metrics``). The pair
``(slice, recipe, key)`` names a run: the ledger never holds it twice, and a later
slice of the same recipe continues with the keys the ledger does not have yet.
"""
from __future__ import annotations

import json
import os
from typing import Dict, Iterable, List, Set, Tuple

from benchmarks.gpu import files
from glomo_pyg.atomic_files import atomic_write

FIELDS = ("slice", "recipe", "key", "run", "commit", "date", "device", "versions",
          "seconds", "metrics", "dry_run")


class LedgerError(ValueError):
    """A ledger that cannot be read, or a line that may not be added to it."""


def run_id(line: Dict) -> Tuple[str, str, str]:
    return line["slice"], line["recipe"], line["key"]


def check_line(line, where: str) -> Dict:
    if not isinstance(line, dict):
        raise LedgerError(f"{where}: a ledger line must be a JSON object")
    missing = [f for f in FIELDS if f not in line]
    if missing:
        raise LedgerError(f"{where}: missing {', '.join(missing)}")
    for f in ("slice", "recipe", "key", "run", "commit", "date", "device"):
        if not isinstance(line[f], str) or not line[f]:
            raise LedgerError(f"{where}: {f} must be a non-empty string")
    if not isinstance(line["metrics"], dict) or not isinstance(line["versions"], dict):
        raise LedgerError(f"{where}: metrics and versions must be JSON objects")
    if not isinstance(line["dry_run"], bool):
        raise LedgerError(f"{where}: dry_run must be true or false")
    return line


def read(path: str) -> List[Dict]:
    """Every line of the ledger at ``path`` (none if it does not exist), checked."""
    if not os.path.exists(path):
        return []
    lines, seen = [], set()
    with open(path, encoding="utf-8") as fh:
        for number, text in enumerate(fh, 1):
            if not text.strip():
                continue
            try:  # (bounded depth, finite numbers: a hostile line is a named error)
                line = files.loads(text)
            except ValueError as err:
                raise LedgerError(f"{path}:{number} is not JSON ({err})") from None
            check_line(line, f"{path}:{number}")
            if run_id(line) in seen:
                raise LedgerError(f"{path}:{number} repeats run {run_id(line)}")
            seen.add(run_id(line))
            lines.append(line)
    return lines


def recorded_keys(lines: Iterable[Dict], slice_name: str, recipe: str) -> Set[str]:
    """The keys the ledger holds for ``slice_name`` at ``recipe``."""
    return {l["key"] for l in lines if l["slice"] == slice_name and l["recipe"] == recipe}


def check_new(path: str, new: List[Dict]) -> List[Dict]:
    """The ledger's lines, once ``new`` is known to be well formed and to name no run the
    ledger (or ``new`` itself) already holds."""
    lines = read(path)
    seen = {run_id(l) for l in lines}
    for i, line in enumerate(new):
        check_line(line, f"new line {i + 1}")
        if run_id(line) in seen:
            raise LedgerError(f"the ledger already records run {run_id(line)} (slice, recipe, "
                              "key): a recorded run is never run or added twice")
        seen.add(run_id(line))
    return lines


def text(lines: List[Dict]) -> str:
    """The ledger file holding ``lines`` (strict JSON: a non-finite number is refused)."""
    try:
        return "".join(json.dumps(line, sort_keys=True, allow_nan=False) + "\n"
                       for line in lines)
    except ValueError as err:
        raise LedgerError(f"a ledger line cannot be written as JSON: {err}") from None


def staged(path: str, new: List[Dict]) -> Tuple[List[Dict], str]:
    """The ledger's lines with ``new`` added (refused as :func:`check_new` says) and the
    file's new text, written by nobody yet (ingest renames it into place with the rest)."""
    lines = check_new(path, new) + new
    return lines, text(lines)


def append(path: str, new: List[Dict]) -> None:
    """Add ``new`` lines (refused as :func:`check_new` says, before writing anything).
    The file is rewritten through a temporary file renamed into place: a kill leaves the
    old or the new one."""
    _, body = staged(path, new)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_write(path) as fh:
        fh.write(body)
