"""``cuda-tests``: the test suite's CUDA-only tests (marked ``cuda``) in the files that
were marked after the profile's recipe was recorded, one key per file: today
``tests/test_compile.py`` (inductor on CUDA over batches of changing size, ``dynamic=True``
and automatic dynamic shapes, tensors and ``EdgeIndex``) and
``tests/test_image_classification.py`` (precomputed propagations kept on the GPU).
``files`` only enumerates keys (``KEY_FIELDS``), so a newly marked file adds a key and
keeps every recorded one; the profile's own ``cuda-tests`` key keeps running the files it
always ran.
"""
from __future__ import annotations

from typing import Dict, List

from benchmarks.gpu.report import md
from benchmarks.gpu.slices import profile

ARCHIVES = ()
RESULTS = "speed.md"
KEY_FIELDS = ("files",)
FILES = ("tests/test_compile.py", "tests/test_image_classification.py")


def recipe(dry_run: bool) -> Dict:
    # the same files in the dry run: on a CPU every test of theirs marked cuda skips
    return dict(files=list(FILES), marker="cuda")


def keys(recipe: Dict) -> List[str]:
    return list(recipe["files"])


def min_seconds(key: str, recipe: Dict) -> float:
    return 90.0


def run_key(key: str, ctx) -> Dict:
    if key not in ctx.recipe["files"]:
        raise ValueError(f"cuda-tests has no run {key!r}")
    return profile.cuda_tests(["-m", ctx.recipe["marker"], key], ctx)


def report(lines: List[Dict], recipe: Dict) -> List[str]:
    by = {l["key"]: l for l in lines}
    out = ["### GPU campaign: cuda-tests (the suite's CUDA-only tests, by file)", "",
           "Generated from the ledger; each file as `python -m pytest -m cuda FILE` runs it "
           "on the GPU machine (the profile's `cuda-tests` row covers "
           f"{', '.join(f'`{f}`' for f in profile.CUDA_TEST_FILES)}).", "",
           "| file | device | commit | date | passed | failed | skipped |",
           "|---|---|---|---|---|---|---|"]
    for key in recipe["files"]:
        l = by.get(key)
        if l is None:
            out.append(f"| `{key}` | pending | | | | | |")
            continue
        m = l["metrics"]
        out.append(f"| `{key}` | {md(l['device'])} | {md(l['commit'][:10])} | "
                   f"{md(l['date'][:10])} | {md(m.get('passed'))} | "
                   f"{m.get('failures', 0) + m.get('errors', 0)} | {md(m.get('skipped'))} |")
    return out + [""]


assert profile.RESULTS == RESULTS  # (the profile's block and this one share results/speed.md)
