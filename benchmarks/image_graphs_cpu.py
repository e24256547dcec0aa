"""Graphs of whole image data sets on a CPU: the released pixel predictors' emission,
``GlomoGraphs`` top-k transforms and ``GlomoTransfer`` forwards, this tree against another
commit's code, side by side in one run.

    python -m benchmarks.image_graphs_cpu [--against REV] [--repeats 3] [--threads 2]

Every case runs in its own process per code version (this tree, and ``REV`` checked out
with ``git worktree`` into a temporary folder), the versions alternating case by case: a
warm-up call on a few samples, then ``--repeats`` timed calls (median). Random 32x32
uint8 images (``image_data``), and for text 400-token reviews; glibc keeps freed memory
(``glomo_pyg.allocator.keep_freed_memory``, as the ``glomo`` command sets it). Besides
images/s and the ratio to ``REV`` it prints the arithmetic per image (:func:`flop_estimate`: the
predictor's convolutions and projections, the scores of every allowed pair, and for
transfer the propagated values) and the GFLOP/s that makes, and the peak resident memory
of ``GlomoGraphs`` over one 256-image batch. Appends to
``benchmarks/results/image_graphs_cpu.md``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

import torch

from benchmarks.common import hardware

RESULTS = os.path.join(os.path.dirname(__file__), "results", "image_graphs_cpu.md")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What one worker process times; only public API that older versions have too.
WORKER = r"""
import json, resource, statistics, sys, time, torch
from torch_geometric.data import Data
from glomo_pyg import GlomoTransfer, PretrainedGraphPredictor
from glomo_pyg.allocator import keep_freed_memory
from glomo_pyg.transforms import GlomoGraphs, image_data
keep_freed_memory()  # (as `glomo` does: large blocks are not returned and faulted in again)
release, case, n, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
p = PretrainedGraphPredictor.from_pretrained(release).eval()
g = torch.Generator().manual_seed(0)
text = p.num_tokens is not None
if text:
    samples = [Data(x=torch.randint(4, p.num_tokens, (400,), generator=g)) for _ in range(n)]
else:
    samples = [image_data(i) for i in
               torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)]
x = torch.cat([d.x.reshape(d.x.size(0), -1) for d in samples])
x = x.view(-1) if text else x
batch = torch.arange(n).repeat_interleave(samples[0].x.size(0))
if case.startswith("GlomoGraphs"):
    t = GlomoGraphs(p, device="cpu", **eval("dict" + case[len("GlomoGraphs"):]))
    run = lambda k: t(samples[:k])
elif case.startswith("GlomoTransfer"):
    layout = case.split("'")[1]
    tr = GlomoTransfer(p.set_layout(layout), 32).eval()
    h = torch.randn(x.size(0), 32, generator=g)
    size = samples[0].x.size(0)
    def run(k):
        with torch.no_grad():
            return tr(h[:k * size], x[:k * size], batch[:k * size])
else:  # the predictor's own emission, sparse layout (every layer's edges)
    def run(k):
        with torch.no_grad():
            return p(x[:k * samples[0].x.size(0)], batch[:k * samples[0].x.size(0)],
                     layout="sparse")
run(min(n, 2))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
seconds = []
for _ in range(repeats):
    start = time.perf_counter()
    run(n)
    seconds.append(time.perf_counter() - start)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps(dict(seconds=seconds, grew_mib=(peak - before) / 1024)))
"""

CASES = [("imagenet32-pixel-cpu", 32, "predictor(x, batch), sparse"),
         ("imagenet32-pixel-cpu", 32, "GlomoGraphs(merge='mean', top_k=8)"),
         ("imagenet32-pixel-cpu", 32, "GlomoGraphs(top_k=8)"),
         ("imagenet32-pixel-cpu", 32, "GlomoTransfer(p, 32), layout='fused'"),
         ("imagenet32-pixel-cpu", 16, "GlomoTransfer(p, 32), layout='sparse'"),
         ("imagenet32-pixel", 16, "predictor(x, batch), sparse"),
         ("imagenet32-pixel", 32, "GlomoGraphs(merge='mean', top_k=8)"),
         ("imagenet32-pixel", 16, "GlomoGraphs(top_k=8)"),
         ("imagenet32-pixel", 16, "GlomoTransfer(p, 32), layout='fused'"),
         ("imagenet32-pixel", 8, "GlomoTransfer(p, 32), layout='sparse'"),
         ("imdb-text-cpu", 32, "GlomoGraphs(merge='mean', top_k=8)"),
         ("imdb-text-cpu", 32, "GlomoTransfer(p, 32), layout='fused'")]


def flop_estimate(release: str, case: str, units: int, channels: int = 32) -> float:
    """Multiply-adds x 2 per sample: convolutions, key/query projections and the scores of
    every allowed (source, target) pair with the augmented keys' width (computed once in
    every layout); for transfer also the propagated values (the first layer's
    ``channels``, later layers' twice that: the features and the chain). Elementwise work
    (normalisation, pruning) is not counted."""
    from glomo_pyg import PretrainedGraphPredictor

    p = PretrainedGraphPredictor.from_pretrained(release)
    total = 0.0
    pairs = units * (units - 1) / 2
    for d in p.directions:
        e = p.predictor(d)
        cfg = e.config()
        c = cfg["hidden_channels"]
        convs = 2 * cfg["cnn_layers"] * c * c * cfg["kernel_size"] ** (2 if "height" in cfg else 1)
        s = e.scorer
        width = s.heads * s.head_channels
        augmented = s.head_channels + 1 + (0 if s.position_coef is None else
                                           2 * s.position_coef.size(-1))
        total += 2 * units * (convs + 2 * s.num_layers * c * width)
        total += 2 * s.num_layers * s.heads * pairs * augmented  # (once, in every layout)
        if case.startswith("GlomoTransfer"):
            total += 2 * s.heads * pairs * channels * (1 + 2 * (s.num_layers - 1))
    return total


def run_case(release: str, case: str, n: int, repeats: int, code: str, threads: int) -> Dict:
    env = dict(os.environ, PYTHONPATH=code, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, "-c", WORKER, release, case, str(n), str(repeats)],
                         capture_output=True, text=True, cwd=code, env=env, timeout=3600)
    if out.returncode:
        raise RuntimeError(f"{release} {case} in {code}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def worktree(rev: str, folder: str) -> str:
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", folder, rev],
                   check=True, capture_output=True)
    return folder


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", default=None, help="a commit to time side by side")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=None, help="cases whose name has these")
    parser.add_argument("--results", default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    against = None
    if args.against:
        against = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", args.against],
                                 capture_output=True, text=True, check=True).stdout.strip()
    lines = [f"## {datetime.date.today()}: `python -m benchmarks.image_graphs_cpu "
             f"{' '.join(sys.argv[1:] if argv is None else argv)}`", "",
             f"{hardware()}; torch {torch.__version__}; this tree at {head}"
             + (" (with its changes)" if subprocess.run(
                 ["git", "-C", ROOT, "diff", "--quiet", "HEAD"]).returncode else "")
             + (f", against {against}" if against else "") + ".", "",
             "| predictor | what | samples | samples/s" + (f" | {against} samples/s | ratio"
                                                        if against else "")
             + " | GFLOP per sample | GFLOP/s |", "|---|---|---|---" + ("|---|---" if against
                                                                         else "") + "|---|---|"]
    cases = [c for c in CASES if not args.only or any(o in c[0] + c[2] for o in args.only)]
    with tempfile.TemporaryDirectory() as tmp:
        old = worktree(args.against, os.path.join(tmp, "against")) if against else None
        try:
            for release, n, case in cases:
                units = 400 if release.startswith("imdb") else 1024
                new = run_case(release, case, n, args.repeats, ROOT, args.threads)
                rate = n / statistics.median(new["seconds"])
                row = f"| `{release}` | `{case}` | {n} | {rate:.1f}"
                if old:
                    prev = run_case(release, case, n, args.repeats, old, args.threads)
                    before = n / statistics.median(prev["seconds"])
                    row += f" | {before:.1f} | {rate / before:.2f}"
                flops = flop_estimate(release, case, units)
                row += f" | {flops / 1e9:.2f} | {flops * rate / 1e9:.0f} |"
                print(row, flush=True)
                lines.append(row)
        finally:
            if old:
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", old],
                               capture_output=True)
    lines += ["", "Peak resident memory of `GlomoGraphs(merge='mean', top_k=8)` over one batch "
              "of 256 images (growth after a warm-up call, this tree):", ""]
    for release in ("imagenet32-pixel-cpu", "imagenet32-pixel"):
        if args.only and not any(o in release for o in args.only):
            continue
        r = run_case(release, "GlomoGraphs(merge='mean', top_k=8, batch_size=256)", 256, 1,
                     ROOT, args.threads)
        lines.append(f"- `{release}`: {r['grew_mib']:.0f} MiB in {r['seconds'][0]:.1f} s "
                     f"({256 / r['seconds'][0]:.1f} images/s)")
        print(lines[-1], flush=True)
    with open(args.results, "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
