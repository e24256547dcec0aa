"""The campaign's slices, in the order they run, and what each one's recipe is.

A slice is a module of :mod:`benchmarks.gpu.slices` with:

- ``ARCHIVES``: the data archives a real (GPU) run carries;
- ``recipe(dry_run) -> dict``: every setting its results depend on (toy sizes for the
  CPU dry run); its digest names the recipe in the ledger;
- ``keys(recipe) -> list``: the runs the recipe defines, in the order they run (a
  repeatable slice lists more than one call can do: the ledger says where it stands);
- ``min_seconds(key, recipe) -> float``: the least time worth starting ``key`` with;
- ``run_key(key, ctx) -> dict``: one run on the GPU machine, its metrics;
- ``RESULTS`` and ``report(lines, recipe) -> list``: the results file (under
  ``benchmarks/results/``) and the markdown generated there from the ledger's lines;
- optionally ``ingest(lines, folder, manifest, releases_root, log)``: what ingesting a
  returned folder writes besides the ledger (a released predictor);
- optionally ``prepare_extra(folder, archives, recipe, log)``: files made on the CPU
  machine that the call carries (e.g. word vectors: the GPU machine has no gensim),
  written into ``folder``; their digests are checked on the GPU machine;
- optionally ``INGEST_ARCHIVES``: archives of the project's data folder that ``ingest``
  reads on the CPU machine (``--shared-data``) to measure what came back; not carried;
- optionally ``KEYS_PER_PROCESS = None``: the call's keys run in one process (data
  and caches built once), else one process per key.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
import time
from types import ModuleType
from typing import Callable, Dict, List, Optional, Tuple

# The campaign's order: each slice sizes the next ones. text-pretrain comes before imdb
# so that the IMDB runs use the GPU text release (imdb uses the best text release there
# is): the other way round, every IMDB seed would be run twice.
ORDER = ("profile", "pixel-pretrain", "cifar10", "text-pretrain", "imdb", "speed")
MODULES = {"profile": "profile", "pixel-pretrain": "pixel_pretrain", "cifar10": "cifar10",
           "text-pretrain": "text_pretrain", "imdb": "imdb", "speed": "speed"}
# slices of the campaign whose module is not written yet, each with why (plan lists them)
NOT_BUILT: Dict[str, str] = {}


def slice_module(name: str) -> ModuleType:
    if name in NOT_BUILT:
        raise ValueError(f"slice {name!r} is part of the campaign but not built yet: "
                         f"{NOT_BUILT[name]}")
    if name not in MODULES:
        raise ValueError(f"unknown slice {name!r}; the campaign's slices are "
                         f"{', '.join(ORDER)}")
    return importlib.import_module(f"benchmarks.gpu.slices.{MODULES[name]}")


def digest(recipe: Dict) -> str:
    """The recipe's name in the ledger: SHA-256 (16 hex digits) of its canonical JSON."""
    text = json.dumps(recipe, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass
class Context:
    """What one run of a slice sees on the GPU machine (or the CPU in a dry run)."""

    slice: str
    recipe: Dict
    dry_run: bool
    data_dir: str   # built data
    out: str        # the folder that comes back (at most 8 files in all)
    work: str       # scratch space that does not come back
    deadline: float  # time.time() by which this run must have returned
    device: str     # 'cuda' or 'cpu'
    extra: str = ""  # the carried files a slice's prepare_extra wrote
    log: Callable = print

    def seconds_left(self) -> float:
        return self.deadline - time.time()

    def to_json(self) -> Dict:
        d = dataclasses.asdict(self)
        d.pop("log")
        return d


def pending(name: str, recipe: Dict, recorded) -> List[str]:
    """The keys of ``name``'s recipe that the ledger does not record yet, in order."""
    return [k for k in slice_module(name).keys(recipe) if k not in recorded]


def next_slice(ledger_lines: List[Dict], dry_run: bool = False) -> Optional[str]:
    """The first built slice in :data:`ORDER` with runs the ledger does not have (slices
    not built yet are passed over: ``plan`` lists them)."""
    from benchmarks.gpu.ledger import recorded_keys

    for name in ORDER:
        if name in NOT_BUILT:
            continue
        recipe = slice_module(name).recipe(dry_run)
        if pending(name, recipe, recorded_keys(ledger_lines, name, digest(recipe))):
            return name
    return None


SETUP_S = 30.0        # a slice's own start in a call: the runner, its data, its first import
RETURNED_FILES = 2    # a slice's files back unless its module says (manifest.json, run.log)


def call_plan(ledger_lines: List[Dict], dry_run: bool = False,
              budget_s: float = 510.0) -> List[Tuple[str, Optional[float]]]:
    """The slices of the next device call, each with its ``--budget-s`` (``None``: what
    is left of ``budget_s`` when it starts). Normally one slice with the whole budget;
    when the next slice's pending keys need (by their ``min_seconds``) less than half of
    it, the slice after it (built, not blocked, with pending keys) shares the call, if
    both slices' files and the console log fit in what a call returns. A slice whose
    module sets ``WHOLE_CALL`` (training to the call's deadline) never shares one: when it
    comes after the remainder of a short slice (one with runs recorded already), it goes
    first and alone, and the remainder waits for a later call."""
    from benchmarks.gpu.ledger import recorded_keys
    from benchmarks.gpu.limits import RETURN_FILES

    todo = []
    for name in ORDER:
        if name in NOT_BUILT:
            continue
        mod = slice_module(name)
        recipe = mod.recipe(dry_run)
        keys = pending(name, recipe, recorded_keys(ledger_lines, name, digest(recipe)))
        if keys and not (getattr(mod, "blocked", None) and mod.blocked(recipe)):
            started = len(keys) < len(mod.keys(recipe))
            todo.append((name, mod, recipe, keys, started))
    if not todo:
        return []
    name, mod, recipe, keys, started = todo[0]
    need = SETUP_S + sum(mod.min_seconds(k, recipe) for k in keys)
    if len(todo) == 1 or need > budget_s / 2 or getattr(mod, "WHOLE_CALL", False):
        return [(name, budget_s)]
    second = todo[1][1]
    if getattr(second, "WHOLE_CALL", False):
        return [(todo[1][0] if started else name, budget_s)]
    returned = sum(getattr(m, "RETURNED_FILES", RETURNED_FILES) for m in (mod, second)) + 1
    if returned > RETURN_FILES:
        return [(name, budget_s)]
    return [(name, float(math.ceil(need))), (todo[1][0], None)]
