"""The keep-alive penalty's column maxima, forward and backward, against plain autograd.

    python -m benchmarks.keep_alive_speed [--device cpu|cuda] [--repeats 3] [--results FILE]

The keep-alive penalty (``Glomo(keep_alive=...)``) needs, per target, the largest score
over its allowed sources, with a gradient. :func:`glomo_pyg.kernels.column_max_scores`
finds the maxima and their sources without autograd. It then recomputes only the arg-max
pairs' scores with autograd, in O(B H T D) memory. The reference is what a user would
write, and what the library did before: the masked ``[B, H, T, T]`` scores through
``amax``, which autograd keeps for the backward pass.

Both run side by side in one process per case (a fresh process, so that one case's freed
memory does not blur the next one's CPU peak), on the same random keys and queries. The
script reports the median time of forward plus backward, the peak memory and the ratios, and
checks that values and gradients agree. The results are appended to ``--results``
(default ``benchmarks/results/keep_alive_speed.md``; ``''``: print only).
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys

import torch

from benchmarks.common import append_results, hardware
from benchmarks.speed.measure import median_ms, peak_mib, set_timing_allocator
from glomo_pyg.kernels import column_max_scores

CASES = {"cpu": [(8, 8, 256, 17), (8, 8, 1024, 17), (2, 8, 4096, 17)],
         "cuda": [(64, 8, 1024, 17), (16, 8, 4096, 17)]}


def reference(key, query, lengths):
    """The masked dense scores through ``amax`` (forward direction, no self loops)."""
    t = key.size(2)
    pos = torch.arange(t, device=key.device)
    allowed = (pos.view(1, -1, 1) < pos.view(1, 1, -1)) & \
        (pos.view(1, 1, -1) < lengths.view(-1, 1, 1)) & \
        (pos.view(1, -1, 1) < lengths.view(-1, 1, 1))
    scores = key @ query.transpose(-1, -2)  # [B, H, i, j]
    return scores.masked_fill(~allowed.unsqueeze(1), float("-inf")).amax(2)


def bench_case(b, h, t, d, device, repeats):
    torch.manual_seed(0)
    k = torch.randn(b, h, t, d, device=device, requires_grad=True)
    q = torch.randn(b, h, t, d, device=device, requires_grad=True)
    lengths = torch.full((b,), t, device=device)
    fns = {"library": lambda: column_max_scores(k, q, lengths),
           "reference": lambda: reference(k, q, lengths)}
    out = dict(B=b, H=h, T=t, D=d)
    grads = {}
    for name, fn in fns.items():
        value = fn()
        finite = torch.isfinite(value)
        grads[name] = (value.detach(), *torch.autograd.grad(value[finite].sum(), (k, q)))

        def step(fn=fn):
            value = fn()
            value[torch.isfinite(value)].clamp(max=0.1).sum().backward()
        out[f"{name}_ms"] = median_ms(step, repeats, device)
        out[f"{name}_peak_mib"] = peak_mib(step, device)
    out["max_abs_diff"] = max(float((a - b).abs().nan_to_num().max())
                              for a, b in zip(grads["library"], grads["reference"]))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results", default="benchmarks/results/keep_alive_speed.md")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child: "B,H,T,D"
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.one:
        if args.device == "cpu":
            set_timing_allocator()
        print(json.dumps(bench_case(*map(int, args.one.split(",")), args.device,
                                    args.repeats)))
        return
    rows = []
    for case in CASES[args.device]:
        child = subprocess.run(
            [sys.executable, "-m", "benchmarks.keep_alive_speed", "--device", args.device,
             "--repeats", str(args.repeats), "--one", ",".join(map(str, case))],
            capture_output=True, text=True, check=True)
        rows.append(json.loads(child.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"B={r['B']} T={r['T']}: library {r['library_ms']:.0f} ms / "
              f"{r['library_peak_mib']:.0f} MiB, reference {r['reference_ms']:.0f} ms / "
              f"{r['reference_peak_mib']:.0f} MiB", flush=True)
    command = " ".join(["python -m benchmarks.keep_alive_speed",
                        *(sys.argv[1:] if argv is None else argv)])
    lines = [f"\n## {datetime.date.today().isoformat()}: {args.device}", "",
             f"- command: `{command}`",
             f"- hardware: {hardware(args.device)}; "
             f"torch {torch.__version__}",
             f"- forward + backward of each target's largest allowed score (forward "
             f"direction, full-length sequences), median of {args.repeats} (ms); peak "
             "memory above what was held before (MiB); ratio = reference / library", "",
             "| B | H | T | D | library ms | reference ms (ratio) | library MiB "
             "| reference MiB (ratio) | max abs diff (values, grads) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['B']} | {r['H']} | {r['T']} | {r['D']} | {r['library_ms']:.0f} | "
            f"{r['reference_ms']:.0f} ({r['reference_ms'] / r['library_ms']:.1f}x) | "
            f"{r['library_peak_mib']:.0f} | {r['reference_peak_mib']:.0f} "
            f"({r['reference_peak_mib'] / max(r['library_peak_mib'], 1e-9):.1f}x) | "
            f"{r['max_abs_diff']:.1e} |")
    text = "\n".join(lines) + "\n"
    if args.results:
        append_results(args.results, lines)
    print(text)


if __name__ == "__main__":
    main()
