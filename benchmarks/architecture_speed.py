"""No slowdown from a refactor: one pretraining step and one transfer forward, timed for
the current tree and a baseline commit side by side in one run.

    python -m benchmarks.architecture_speed --baseline 7983d46 [--rounds 5] [--threads 1]

The baseline commit is checked out into a temporary git worktree. Each round runs one
subprocess per tree (alternating, so drift in machine load hits both alike) that imports
glomo_pyg from that tree and reports the median time of each operation; the table gives
the median over rounds and the ratio current / baseline. Appends to
``benchmarks/results/architecture.md``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run inside each tree's interpreter; only the public API both versions share (the model
# constructor changed from Glomo(...) to Glomo.text(...)).
MEASURE = r'''
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
from glomo_pyg import Glomo, GlomoTransfer
build = getattr(Glomo, "text", Glomo)

def median_ms(fn, repeats):
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return times[len(times) // 2]

out = {}
torch.manual_seed(0)
b, t = 16, 64
x = torch.randint(0, 1000, (b * t,))
batch = torch.arange(b).repeat_interleave(t)
model = build(num_tokens=1000, hidden_channels=128, num_layers=3, heads=8, cnn_layers=2,
              num_positions=20).train()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
def step():
    opt.zero_grad()
    model(x, batch).loss.backward()
    opt.step()
out["pretraining step (B=16, T=64, width 128, 2 x 3 x 8 graphs)"] = median_ms(step, 15)

# transfer with an untrained predictor: its graphs are dense (every allowed pair has an
# edge), the heaviest case for the mixer (the trained one above prunes almost all edges)
torch.manual_seed(0)
fresh = build(num_tokens=1000, hidden_channels=128, num_layers=3, heads=8, cnn_layers=2).eval()
predictor = fresh.to_pretrained()
b, t = 16, 128
x = torch.randint(0, 1000, (b * t,))
batch = torch.arange(b).repeat_interleave(t)
h = torch.randn(b * t, 128)
transfer = GlomoTransfer(predictor, in_channels=128).eval()
with torch.no_grad():
    out["transfer forward (B=16, T=128, d=128, dense untrained graphs, emitted in the call)"] = \
        median_ms(lambda: transfer(h, x, batch), 15)
    graphs = transfer.graphs(x, batch)
    out["transfer forward, the same graphs given (mixer + gate only)"] = \
        median_ms(lambda: transfer(h, graphs=graphs), 15)
print(json.dumps(out))
'''


def run_tree(tree: str, threads: int) -> dict:
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS=str(threads))
    result = subprocess.run([sys.executable, "-c", MEASURE, str(threads)], env=env, cwd=tree,
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git commit to compare against")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--results", default=os.path.join(ROOT, "benchmarks", "results",
                                                          "architecture.md"))
    args = parser.parse_args(argv)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        old = os.path.join(tmp, "baseline")
        subprocess.run(["git", "worktree", "add", "--detach", old, args.baseline], cwd=ROOT,
                       check=True, capture_output=True)
        try:
            rounds = {"baseline": [], "current": []}
            for r in range(args.rounds):
                for name, tree in (("baseline", old), ("current", ROOT))[::1 if r % 2 else -1]:
                    rounds[name].append(run_tree(tree, args.threads))
                    print(f"round {r + 1} {name}: {rounds[name][-1]}", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", old], cwd=ROOT,
                           capture_output=True)
    lines = [f"\n## {datetime.date.today()}: current tree ({head}, uncommitted changes "
             f"included) vs {args.baseline}",
             "",
             f"- command: `python -m benchmarks.architecture_speed --baseline {args.baseline} "
             f"--rounds {args.rounds} --threads {args.threads}`",
             f"- hardware: {platform.processor() or platform.machine()}, {args.threads} torch "
             f"thread(s), CPU; median over {args.rounds} alternating rounds of each round's "
             "median of 15 repeats",
             "", "| operation | baseline ms | current ms | current / baseline |",
             "|---|---|---|---|"]
    for key in rounds["current"][0]:
        a = statistics.median(r[key] for r in rounds["baseline"])
        b = statistics.median(r[key] for r in rounds["current"])
        ratios = sorted(c[key] / o[key] for c, o in zip(rounds["current"], rounds["baseline"]))
        lines.append(f"| {key} | {a:.1f} | {b:.1f} | {b / a:.3f} (per round "
                     f"{ratios[0]:.2f}-{ratios[-1]:.2f}) |")
    text = "\n".join(lines) + "\n"
    print(text)
    new = not os.path.exists(args.results)
    with open(args.results, "a") as fh:
        if new:
            fh.write("# Refactors against their baseline (no slowdown)\n\nWritten by "
                     "`python -m benchmarks.architecture_speed`.\n")
        fh.write(text)


if __name__ == "__main__":
    main()
