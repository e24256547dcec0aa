"""The campaign's schedule: which pending runs the next GPU allocation makes, in which call.

An allocation is a budget of device time (:class:`~benchmarks.gpu.limits.JobLimits`):
a cold start, then call 1 (a full call), then call 2 with what is left, started while
the machine is still warm. Both calls are prepared before call 1, so call 2 needs no
work on the CPU machine between them. Each call runs one or more *parts* (a slice and
some of its pending keys, carried in a folder of their own) in turn.

Runs are taken in the order of :data:`STAGES`, which puts the paper's first answers
first (5 paired seeds of ResNet-18 on CIFAR-10, then of IMDB) and the rest after. A
slice that needs another's product (:data:`NEEDS`: a release) waits while that slice
has pending runs or runs in the same allocation. A slice marked ``WHOLE_CALL`` (it
trains to its call's deadline) takes a full call alone. Whatever else still fits in a
call is filled from the stages after, down to the fillers at the end (the profile's
pending keys, the speed sections, the CUDA tests of the ``cuda-tests`` slice).
"""
from __future__ import annotations

import dataclasses
import fnmatch
import math
import os
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from benchmarks.gpu import campaign, files
from benchmarks.gpu.ledger import recorded_keys
from benchmarks.gpu.limits import BUDGET_MARGIN_S, LIMITS, JobLimits

SETUP_S = 30.0        # a part's own start in a call: the runner, its data, its first import
RETURNED_FILES = 2    # a part's files back unless its slice says (manifest.json, run.log)


@dataclasses.dataclass(frozen=True)
class Stage:
    """The pending keys of ``slice`` that match ``keys`` (an ``fnmatch`` pattern)."""

    slice: str
    keys: str = "*"


STAGES: Tuple[Stage, ...] = (
    Stage("pixel-pretrain"),
    Stage("cifar10", "resnet18/*/seed[0-4]"),  # Table 3's first answer: 5 paired seeds
    Stage("text-pretrain"),
    Stage("imdb", "*/seed[0-4]"),              # Table 1's first answer: 5 paired seeds
    Stage("cifar10", "resnet34/*"),
    Stage("cifar10"),                          # ResNet-18 seeds 5-9
    Stage("imdb"),
    Stage("any-gnn-imdb"),                     # after the paper's results: a stock PyG
    Stage("any-gnn-cifar10"),                  # GNN over GLoMo's and fixed graphs
    Stage("profile"),                          # fillers: what is left of the profile,
    Stage("speed"),                            # the speed sections, the CUDA tests
    Stage("cuda-tests"),                       # of files marked after the profile's recipe
)
# a slice whose recipe names another's release waits for that slice's pending runs; the
# any-gnn slices wait for the paper's runs of their task (cifar10's after pixel-pretrain,
# whose new imagenet32-pixel any-gnn-cifar10 uses too)
NEEDS: Dict[str, str] = {"cifar10": "pixel-pretrain", "imdb": "text-pretrain",
                         "any-gnn-imdb": "imdb", "any-gnn-cifar10": "cifar10"}


@dataclasses.dataclass
class Part:
    """Some pending keys of one slice, run in one call from their own carry folder."""

    slice: str
    keys: List[str]
    seconds: float  # estimated, its start included
    carry: str = ""
    budget_s: Optional[float] = None  # None: what is left of the call when it starts


@dataclasses.dataclass
class Call:
    """One device call of an allocation."""

    number: int
    timeout_s: int
    parts: List[Part]

    @property
    def budget_s(self) -> int:
        return int(self.timeout_s - BUDGET_MARGIN_S)


def _slice(name: str, dry_run: bool):
    mod = campaign.slice_module(name)
    return mod, mod.recipe(dry_run)


def pending_by_slice(lines: List[Dict], dry_run: bool) -> Dict[str, List[str]]:
    """Every slice's pending keys (not blocked ones), in the slice's own order."""
    out = {}
    for name in campaign.ORDER:
        if name in campaign.NOT_BUILT:
            continue
        mod, recipe = _slice(name, dry_run)
        if getattr(mod, "blocked", None) and mod.blocked(recipe):
            continue
        done = recorded_keys(lines, name, campaign.recipe_digest(name, recipe))
        out[name] = campaign.pending(name, recipe, done)
    return out


def ordered_pending(name: str, lines: List[Dict], dry_run: bool = False) -> List[str]:
    """Slice ``name``'s pending keys in the campaign's order (:data:`STAGES`)."""
    mod, recipe = _slice(name, dry_run)
    todo = campaign.pending(name, recipe, recorded_keys(lines, name,
                                                        campaign.recipe_digest(name, recipe)))
    out: List[str] = []
    for stage in STAGES:
        if stage.slice == name:
            out += [k for k in todo if k not in out and fnmatch.fnmatchcase(k, stage.keys)]
    return out + [k for k in todo if k not in out]


def estimate_seconds(name: str, keys: Sequence[str], recipe: Dict,
                     lines: Sequence[Dict] = ()) -> float:
    """The time ``keys`` of slice ``name`` take in one part, its start included: the
    slice's ``estimate_seconds(keys, recipe, recorded)`` (``recorded``: the ledger's runs
    of this recipe, whose times it may use) where it has one, else the sum of the keys'
    ``min_seconds``."""
    mod = campaign.slice_module(name)
    if hasattr(mod, "estimate_seconds"):
        digest = campaign.recipe_digest(name, recipe)
        recorded = [l for l in lines if l["slice"] == name and l["recipe"] == digest]
        return SETUP_S + mod.estimate_seconds(list(keys), recipe, recorded)
    return SETUP_S + sum(mod.min_seconds(k, recipe) for k in keys)


class _Filler:
    """Packs the parts of one call from the stages, given what earlier calls took."""

    def __init__(self, lines: List[Dict], pending: Dict[str, List[str]],
                 taken: Dict[str, Set[str]], dry_run: bool, limits: JobLimits,
                 tree_bytes: int, carry_bytes: Callable[[str], int]):
        self.lines, self.pending, self.taken, self.dry_run = lines, pending, taken, dry_run
        self.limits, self.tree_bytes, self.carry_bytes = limits, tree_bytes, carry_bytes

    def _waits(self, name: str) -> bool:
        need = NEEDS.get(name)
        return bool(need and self.pending.get(need))

    def _keys(self, stage: Stage) -> List[str]:
        return [k for k in self.pending.get(stage.slice, []) if fnmatch.fnmatchcase(k, stage.keys)
                and k not in self.taken.setdefault(stage.slice, set())]

    def _whole_call_first(self, budget: float) -> Optional[Part]:
        """The first runnable whole-call slice, when the runs before it in the order need
        less than half a call (a remainder: it waits for a shorter call, where the
        whole-call slice could not go)."""
        ahead: Dict[str, List[str]] = {}
        for stage in STAGES:
            keys = self._keys(stage)
            if not keys or self._waits(stage.slice):
                continue
            mod, recipe = _slice(stage.slice, self.dry_run)
            if getattr(mod, "WHOLE_CALL", False):
                need = sum(estimate_seconds(n, k, _slice(n, self.dry_run)[1], self.lines)
                           for n, k in ahead.items())
                if ahead and need < budget / 2 and \
                        self.tree_bytes + self.carry_bytes(stage.slice) <= self.limits.carry_bytes:
                    self.taken[stage.slice].update(keys)
                    return Part(stage.slice, keys, budget)
                return None
            ahead.setdefault(stage.slice, []).extend(keys)
        return None

    def fill(self, budget: float, full_call: bool) -> List[Part]:
        whole = self._whole_call_first(budget) if full_call else None
        if whole is not None:
            return [whole]
        parts: List[Part] = []
        used, returned = 0.0, 1  # (the call's console log comes back too)
        carried = self.tree_bytes
        stalled: Set[str] = set()  # slices with runs left in an earlier stage: their
        for stage in STAGES:       # later stages wait, so each slice runs in order
            name = stage.slice
            keys = self._keys(stage)
            if not keys or self._waits(name) or name in stalled:
                continue
            stalled.add(name)
            mod, recipe = _slice(name, self.dry_run)
            part = next((p for p in parts if p.slice == name), None)
            if part is None and (
                    returned + getattr(mod, "RETURNED_FILES", RETURNED_FILES) >
                    self.limits.return_files or
                    carried + self.carry_bytes(name) > self.limits.carry_bytes):
                continue  # (left for a call of its own)
            if getattr(mod, "WHOLE_CALL", False):
                if parts or not full_call:
                    continue
                self.taken[name].update(keys)
                return [Part(name, keys, budget)]
            chosen = []
            for key in keys:  # as many as fit, in order
                base = part.keys if part else []
                seconds = estimate_seconds(name, base + chosen + [key], recipe, self.lines)
                if used - (part.seconds if part else 0.0) + seconds > budget:
                    break
                chosen.append(key)
            if not chosen:
                continue
            if len(chosen) == len(keys):
                stalled.discard(name)
            self.taken[name].update(chosen)
            if part is None:
                part = Part(name, [], 0.0)
                parts.append(part)
                returned += getattr(mod, "RETURNED_FILES", RETURNED_FILES)
                carried += self.carry_bytes(name)
            used -= part.seconds
            part.keys += chosen
            part.seconds = estimate_seconds(name, part.keys, recipe, self.lines)
            used += part.seconds
        return parts


def allocation(lines: List[Dict], dry_run: bool = False, limits: JobLimits = LIMITS,
               warm: bool = False, tree_bytes: int = 0,
               carry_bytes: Callable[[str], int] = lambda name: 0,
               calls: int = 2) -> List[Call]:
    """The calls of the next allocation (at most ``calls``), each with its parts, their
    keys and carry folders (``.gpu-callN-SLICE``). ``warm``: a machine is held already
    (no start-up to pay). ``tree_bytes``: the working tree every call carries;
    ``carry_bytes(slice)``: what a part of that slice carries besides it (together
    within ``limits.carry_bytes``)."""
    pending = pending_by_slice(lines, dry_run)
    taken: Dict[str, Set[str]] = {}
    filler = _Filler(lines, pending, taken, dry_run, limits, tree_bytes, carry_bytes)
    left = limits.allocation_s - (0.0 if warm else limits.startup_s)
    out: List[Call] = []
    for number in range(1, calls + 1):
        timeout = int(min(limits.call_s, left))
        if timeout < max(limits.min_call_s, 2 * BUDGET_MARGIN_S):
            break
        call = Call(number, timeout, [])
        call.parts = filler.fill(call.budget_s, full_call=timeout >= limits.call_s)
        if not call.parts:
            break
        for i, part in enumerate(call.parts):
            part.carry = f".gpu-call{number}-{part.slice}"
            last = i == len(call.parts) - 1
            part.budget_s = None if last else float(math.ceil(part.seconds))
        out.append(call)
        left -= timeout + limits.gap_s
    return out


def returned_folders(root: str, lines: List[Dict]) -> List[Tuple[str, str]]:
    """Call folders under ``root`` (e.g. ``../shared/gpu-returns``) whose run the ledger
    lacks, as ``(folder, what)``: a folder holding ``manifest.json``, or one folder down
    (a call of several parts). ``what`` names the slice and run, or why the manifest
    cannot be read (``ingest`` says more). Nothing is trusted here: only listed."""
    if not os.path.isdir(root):
        return []
    known = {l["run"] for l in lines}
    out = []

    def look(folder: str) -> bool:
        path = os.path.join(folder, files.MANIFEST)
        if os.path.islink(folder) or not os.path.isfile(path):
            return False
        try:
            manifest = files.read_json(path, "a returned call's manifest", limit=1 << 20)
            run, name = manifest.get("run"), manifest.get("slice")
            if isinstance(run, str) and run in known:
                return True
            what = f"slice {name!r}, run {run!r}"
        except (ValueError, OSError, RecursionError) as err:
            what = f"unreadable manifest ({str(err)[:120]})"
        out.append((folder, what))
        return True

    for entry in sorted(os.listdir(root)):
        folder = os.path.join(root, entry)
        if os.path.isdir(folder) and not look(folder):
            for sub in sorted(os.listdir(folder)):
                if os.path.isdir(os.path.join(folder, sub)):
                    look(os.path.join(folder, sub))
    return out


def forecast(lines: List[Dict], dry_run: bool = False, limits: JobLimits = LIMITS,
             most: int = 30) -> List[List[Call]]:
    """The allocations (at most ``most``) that would record every runnable pending run if
    each call ran exactly what :func:`allocation` plans for it, at its estimates (an
    estimate of the campaign's GPU time, not a promise: runs recorded later replace the
    slices' priors)."""
    lines = list(lines)
    out: List[List[Call]] = []
    while len(out) < most:
        calls = allocation(lines, dry_run, limits)
        if not calls:
            break
        out.append(calls)
        for part in (p for c in calls for p in c.parts):
            recipe = campaign.slice_module(part.slice).recipe(dry_run)
            digest = campaign.recipe_digest(part.slice, recipe)
            lines += [dict(slice=part.slice, recipe=digest, key=k, run="forecast",
                           metrics={}) for k in part.keys]
    return out


def answered_after(allocations: List[List[Call]], stage: Stage,
                   lines: List[Dict], dry_run: bool = False) -> Optional[int]:
    """The number of allocations of ``allocations`` after which every pending run of
    ``stage`` is planned (``None``: not within them; 0: none pending)."""
    todo = {k for k in pending_by_slice(lines, dry_run).get(stage.slice, [])
            if fnmatch.fnmatchcase(k, stage.keys)}
    for number, calls in enumerate(allocations, 1):
        if not todo:
            return number - 1
        todo -= {k for c in calls for p in c.parts if p.slice == stage.slice for k in p.keys}
    return len(allocations) if not todo else None
