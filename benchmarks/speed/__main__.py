"""GLoMo speed and memory, side by side in one run, as ratios.

    python -m benchmarks.speed [--quick] [--sections aggregation emission pretraining transfer]
                               [--device cpu|cuda] [--repeats 5] [--lengths 1024 ...]

Sections (each module's docstring has the details):

* ``aggregation``: ``GlomoConv`` on sparse edges and on dense blocks, against the dense
  reference ``A @ X``, PyG's gather/scatter ``propagate`` and causal
  ``scaled_dot_product_attention``; density 1-100%; peak memory against the O(E + N d)
  budget; the crossover density ``layout='auto'`` uses, and ``auto`` against the better
  layout;
* ``emission``: pruned target-sorted edges against computing the dense normalised G alone;
* ``fused``: the fused layout (FlexAttention) against sparse, dense and a hand-written
  FlexAttention call, T = 64..8192, with its peak memory;
* ``pretraining``: one ``Glomo`` step (tokens/s) per layout;
* ``repeated``: ``GlomoConv`` given the same PyG graph every call (validated once) against
  fresh tensors, the dense per-head matmul and gather/scatter;
* ``transfer``: one ``GlomoTransfer`` forward for text (T=128..512) and 32x32 images
  (T=1024) per layout;
* ``transforms``: ``GlomoGraphs`` top-k transforms of 32x32 images with the
  ``imagenet32-pixel`` release (256 per call; 8 with ``--quick``).

Quick mode: CPU sizes, 3 repeats, about 3 minutes on 2 cores. Full mode: the GPU sizes
(B=16-128, T up to 2048, width 512). Appends a section to ``benchmarks/results/speed.md``
and the raw numbers, as the next entry of its ``runs`` list, to
``benchmarks/results/speed_<device>.json`` (one file per device), each section as soon as
it finishes (each case also prints a line as it finishes). ``--lengths`` keeps only the
cases of those sequence lengths; a section with none of them is skipped. On CPU the command
re-executes itself with a fixed glibc mmap threshold so that peak resident memory measures
tensors.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from typing import Dict, List

import torch
import torch_geometric

from benchmarks.common import append_results, hardware
from benchmarks.speed import (
    aggregation,
    emission,
    fused,
    pretraining,
    repeated,
    transfer,
    transforms,
)
from benchmarks.speed.measure import NoCases, set_timing_allocator

SECTIONS = {"aggregation": aggregation, "emission": emission, "fused": fused,
            "pretraining": pretraining, "repeated": repeated, "transfer": transfer,
            "transforms": transforms}


def read_runs(path: str) -> List[Dict]:
    """The runs recorded in ``path`` (none if it does not exist yet)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)["runs"]
    except FileNotFoundError:
        return []


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CPU sizes, a few minutes")
    parser.add_argument("--sections", nargs="+", choices=sorted(SECTIONS), default=list(SECTIONS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed repeats per case (default: 3 with --quick, else 5)")
    parser.add_argument("--pyg-max-edges", type=int, default=1_000_000)
    parser.add_argument("--predictor", default="runs/quickstart/predictor",
                        help="a saved predictor whose graphs give the trained-density case")
    parser.add_argument("--lengths", type=int, nargs="+", default=None,
                        help="run only the cases of these sequence lengths (e.g. 1024 on a "
                        "short GPU allocation)")
    parser.add_argument("--output", default="benchmarks/results/speed.md")
    parser.add_argument("--json", default=None, help="the raw results file this run is "
                        "appended to (default: next to --output)")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.lengths and min(args.lengths) < 1:
        parser.error("--lengths must be positive")
    if args.device == "cpu":
        set_timing_allocator()
    command = " ".join(["python -m benchmarks.speed", *(sys.argv[1:] if argv is None else argv)])
    lines = [f"\n## {datetime.date.today().isoformat()}: {', '.join(args.sections)}, "
             f"{args.device}{' (quick)' if args.quick else ''}", "",
             f"- command: `{command}`",
             f"- hardware: {hardware(args.device)}; torch {torch.__version__}, "
             f"PyG {torch_geometric.__version__}", ""]
    if args.lengths:
        lines[-1:] = [f"- only the cases of lengths {sorted(args.lengths)}", ""]
    path = args.json or args.output.rsplit(".", 1)[0] + f"_{args.device}.json"
    runs = read_runs(path)
    raw = dict(run=max((r["run"] for r in runs), default=0) + 1, command=command,
               date=datetime.date.today().isoformat(), hardware=hardware(args.device))
    runs.append(raw)
    lines[0] += f", run {raw['run']}"
    start = time.time()
    # Each finished section is written at once, so a run cut short (a time-limited GPU
    # allocation) keeps what it measured.
    print(append_results(args.output, lines))
    for name in args.sections:
        try:
            section_lines, section_raw = SECTIONS[name].run(args)
        except NoCases:
            print(append_results(args.output, [f"### {name}: no case of lengths "
                                                f"{sorted(args.lengths)}", ""]))
            continue
        print(append_results(args.output, section_lines))
        raw[name] = section_raw
        raw["seconds"] = round(time.time() - start, 1)
        with open(path, "w") as fh:
            json.dump(dict(runs=runs), fh, indent=1)
    raw["seconds"] = round(time.time() - start, 1)
    print(append_results(args.output, [f"Whole run: {raw['seconds'] / 60:.1f} min.", ""]))


if __name__ == "__main__":
    main()
