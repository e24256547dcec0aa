"""``speed``: the GPU sections of ``python -m benchmarks.speed`` at their full sizes, one
key per section (the fused layout first: T up to 8192 against a hand-written
FlexAttention call, dense and sparse; then one pretraining step per layout, the transfer
forward, aggregation, emission and the top-k transforms of images). Each section's markdown
table and raw numbers go into the ledger; its results block in ``results/speed.md`` is
generated from them.
"""
from __future__ import annotations

import argparse
from typing import Dict, List

from benchmarks.gpu.report import md, no_html
from benchmarks.gpu.slices import profile

ARCHIVES = ()
RESULTS = "speed.md"
KEY_FIELDS = ("sections",)  # more sections keep the recorded ones
SECTIONS = ("fused", "pretraining", "transfer", "aggregation", "emission", "transforms")


def recipe(dry_run: bool) -> Dict:
    r = dict(sections=list(SECTIONS), quick=False, repeats=5, lengths=None,
             pyg_max_edges=1_000_000)
    if dry_run:  # the CPU sizes of --quick, only their T = 128 cases, one repeat; the
        # pretraining and transfer sections take minutes even so on a CPU and are left out
        # (the slice's code is the same for every section)
        r.update(sections=["fused", "aggregation", "emission"], quick=True, repeats=1,
                 lengths=[128])
    return r


def keys(recipe: Dict) -> List[str]:
    return list(recipe["sections"])


def min_seconds(key: str, recipe: Dict) -> float:
    return 5.0 if recipe["quick"] else 90.0


def run_key(key: str, ctx) -> Dict:
    from benchmarks.speed.__main__ import SECTIONS as MODULES
    from benchmarks.speed.measure import NoCases, set_timing_allocator

    r = ctx.recipe
    if ctx.device == "cpu":
        set_timing_allocator()
    args = argparse.Namespace(quick=r["quick"], device=ctx.device, repeats=r["repeats"],
                              lengths=r["lengths"], pyg_max_edges=r["pyg_max_edges"],
                              predictor="runs/quickstart/predictor")  # (absent: noted)
    try:
        lines, raw = MODULES[key].run(args)
    except NoCases:
        return dict(lines=[f"### {key}: no case of lengths {r['lengths']}", ""], raw=None)
    return dict(lines=lines, raw=raw)


def report(lines: List[Dict], recipe: Dict) -> List[str]:
    by = {l["key"]: l for l in lines}
    out = ["### GPU campaign: speed (`benchmarks.speed`, full sizes)", "",
           "Generated from the ledger; each section as `python -m benchmarks.speed "
           "--sections NAME --device cuda` writes it.", ""]
    for key in recipe["sections"]:
        l = by.get(key)
        if l is None:
            out += [f"#### {key}: pending", ""]
            continue
        out += [f"#### {key}: {md(l['device'])}, commit {md(l['commit'][:10])}, "
                f"{md(l['date'])}, torch {md(l['versions'].get('torch'))}", ""]
        out += [line.replace("### ", "##### ", 1) if line.startswith("### ") else line
                for line in no_html(f"speed {key}", l["metrics"]["lines"])]
    return out + [""]


assert profile.RESULTS == RESULTS  # (both blocks live in results/speed.md)
