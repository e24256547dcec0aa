"""Emission side by side against the emission kernel of an earlier git revision.

    python -m benchmarks.speed.compare_emission --baseline REV [--output PATH]

Loads ``glomo_pyg/nn/functional.py`` as of ``REV`` (``git show``) next to the current one
and times ``latent_graph_edges`` forward and forward+backward for both in one process,
interleaved, on the emission benchmark's inputs (B=4, 8 heads, head size 64). Reports
the better median of two interleaved rounds per side and the ratio current / baseline.
Appends a section to PATH (default benchmarks/results/speed.md).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import subprocess
import sys
import tempfile

import torch

from benchmarks.common import append_results, hardware
from benchmarks.speed.emission import inputs
from benchmarks.speed.measure import median_ms, set_timing_allocator
from glomo_pyg.nn import functional as current


def load_revision(rev: str):
    source = subprocess.run(["git", "show", f"{rev}:glomo_pyg/nn/functional.py"],
                            check=True, capture_output=True, text=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(source)
    spec = importlib.util.spec_from_file_location("functional_baseline", fh.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare against")
    parser.add_argument("--output", default="benchmarks/results/speed.md")
    args = parser.parse_args(argv)
    set_timing_allocator()
    baseline = load_revision(args.baseline)
    rev = subprocess.run(["git", "rev-parse", "--short", args.baseline], check=True,
                         capture_output=True, text=True).stdout.strip()
    command = " ".join(["python -m benchmarks.speed.compare_emission",
                        *(sys.argv[1:] if argv is None else argv)])
    lines = [f"\n## {datetime.date.today().isoformat()}: emission blocks, current vs {rev}, cpu",
             "", f"- command: `{command}`", f"- hardware: {hardware()}; torch {torch.__version__}",
             "- B=4, 8 heads, head size 64; ms, better median of two interleaved rounds", "",
             f"| T | density | {rev} fwd | current fwd | ratio | {rev} fwd+bwd | current fwd+bwd "
             "| ratio |", "|---|---|---|---|---|---|---|---|"]
    for t in (64, 128, 256, 512):
        for d in (0.01, 0.1, 0.5, 1.0):
            k, q, lengths, ptr = inputs(4, t, d, "cpu")
            kg, qg = k.clone().requires_grad_(), q.clone().requires_grad_()
            best = {}
            for _ in range(2):
                for name, mod in (("base", baseline), ("cur", current)):
                    fwd = median_ms(lambda: mod.latent_graph_edges(kg, qg, lengths, ptr), 5, "cpu")
                    fb = median_ms(lambda: mod.latent_graph_edges(kg, qg, lengths, ptr)[1].sum()
                                   .backward(), 3, "cpu")
                    old = best.get(name, (float("inf"), float("inf")))
                    best[name] = (min(fwd, old[0]), min(fb, old[1]))
            (bf, bfb), (cf, cfb) = best["base"], best["cur"]
            lines.append(f"| {t} | {d} | {bf:.1f} | {cf:.1f} | {cf / bf:.2f} | {bfb:.1f} | "
                         f"{cfb:.1f} | {cfb / bfb:.2f} |")
            print(lines[-1], flush=True)
    print(append_results(args.output, lines))


if __name__ == "__main__":
    main()
