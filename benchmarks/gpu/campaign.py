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
  and caches built once), else one process per key;
- optionally ``KEY_FIELDS``: the recipe's fields that only enumerate its keys (seeds,
  depths, variants): they are left out of the recipe's digest, so adding seeds or depths
  keeps every recorded run valid;
- optionally ``WHOLE_CALL = True``: the slice trains to its call's deadline and takes a
  full call alone; ``RETURNED_FILES``: the files it returns (default 2);
  ``estimate_seconds(keys, recipe, recorded)``: the time ``keys`` take together, from
  the ledger's ``recorded`` runs of the recipe where it can (default: the sum
  of their ``min_seconds``), which the schedule packs calls with.

A module may hold several slices (``any_gnn``: one per task, each carrying its own
archive): its ``slice_for(name)`` returns each one's module object, with the attributes
above.
"""
from __future__ import annotations

import dataclasses
import importlib
import time
from types import ModuleType
from typing import Callable, Dict, List

from glomo_pyg.digests import canonical_digest

# The campaign's slices (the order in which they run is the schedule's STAGES)
ORDER = ("profile", "pixel-pretrain", "cifar10", "text-pretrain", "imdb", "any-gnn-imdb",
         "any-gnn-cifar10", "speed", "cuda-tests")
MODULES = {"profile": "profile", "pixel-pretrain": "pixel_pretrain", "cifar10": "cifar10",
           "text-pretrain": "text_pretrain", "imdb": "imdb", "any-gnn-imdb": "any_gnn",
           "any-gnn-cifar10": "any_gnn", "speed": "speed",
           "cuda-tests": "cuda_tests"}
# slices of the campaign whose module is not written yet, each with why (plan lists them)
NOT_BUILT: Dict[str, str] = {}


def slice_module(name: str) -> ModuleType:
    if name in NOT_BUILT:
        raise ValueError(f"slice {name!r} is part of the campaign but not built yet: "
                         f"{NOT_BUILT[name]}")
    if name not in MODULES:
        raise ValueError(f"unknown slice {name!r}; the campaign's slices are "
                         f"{', '.join(ORDER)}")
    mod = importlib.import_module(f"benchmarks.gpu.slices.{MODULES[name]}")
    # a module of several slices (any_gnn: one per task) gives each its own
    return mod.slice_for(name) if hasattr(mod, "slice_for") else mod


def recipe_hash(recipe: Dict) -> str:
    """SHA-256 (16 hex digits) of ``recipe``'s canonical JSON."""
    return canonical_digest(recipe)[:16]


def recipe_digest(name: str, recipe: Dict) -> str:
    """The name of slice ``name``'s ``recipe`` in the ledger: its :func:`recipe_hash` without
    the fields that only enumerate keys (the slice's ``KEY_FIELDS``), so a recipe that
    only adds seeds or depths keeps its name and its recorded runs."""
    fields = getattr(slice_module(name), "KEY_FIELDS", ())
    return recipe_hash({k: v for k, v in recipe.items() if k not in fields})


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
    """The keys of ``name``'s recipe that the ledger does not record yet, in the slice's
    own order (:func:`benchmarks.gpu.schedule.ordered_pending` gives the campaign's)."""
    return [k for k in slice_module(name).keys(recipe) if k not in recorded]
