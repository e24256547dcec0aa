"""One training step of the CPU recipe's model, per malloc setting and graph layout.

    python -m benchmarks.cpu_recipe_step [--config configs/imdb-cpu.yaml] [--threads 2]
                                         [--steps 20] [--rounds 2] [--results FILE]

The model of ``--config`` (its ``model`` section; vocabulary ``corpus.max_size``, windows
of ``corpus.max_length`` tokens, ``train.batch_size`` of them) takes SGD steps with the
config's learning rate, momentum and global-norm clip on random tokens, from its
initialisation. Each case runs in its own process, because the malloc setting is
process-wide:

* malloc ``system``: glibc as it comes (``GLOMO_MALLOC=system``); ``keep``: freed memory
  kept for reuse (:func:`glomo_pyg.allocator.keep_freed_memory`, what ``glomo`` does);
* layout ``sparse`` or ``auto`` (dense blocks when the graphs are dense enough).

Reports seconds per step (median over ``--steps`` after 3 warm-up steps), minor page faults
and kernel (system) CPU time per step, and each case's speed relative to system/sparse.
Cases alternate for ``--rounds`` rounds, so drift in the machine's speed spreads over all
of them. Appends a section to ``--results`` (default
``benchmarks/results/cpu_recipe_step.md``; ``''``: print only).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

from benchmarks.common import append_results, hardware

CASES = (("system", "sparse"), ("keep", "sparse"), ("system", "auto"), ("keep", "auto"))

# the child: one case, prints one JSON line
CHILD = r"""
import json, resource, statistics, sys, time
import torch, yaml
from glomo_pyg import Glomo
from glomo_pyg.allocator import keep_freed_memory
config_path, layout, threads, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
applied = keep_freed_memory()
torch.set_num_threads(threads)
with open(config_path) as fh:
    config = yaml.safe_load(fh)
model_kwargs = {k: v for k, v in config["model"].items() if k != "layout"}
vocab = config["corpus"]["max_size"]
torch.manual_seed(0)
model = Glomo.text(num_tokens=vocab, padding_idx=0, **model_kwargs).set_layout(layout)
train = config["train"]
opt = torch.optim.SGD(model.parameters(), lr=train["lr"], momentum=train.get("momentum", 0.0))
b, t = train["batch_size"], config["corpus"]["max_length"]
x = torch.randint(1, vocab, (b * t,))
batch = torch.arange(b).repeat_interleave(t)
def step():
    opt.zero_grad()
    model(x, batch).loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), train.get("grad_clip") or float("inf"))
    opt.step()
for _ in range(3):
    step()
times = []
usage = resource.getrusage(resource.RUSAGE_SELF)
for _ in range(steps):
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
after = resource.getrusage(resource.RUSAGE_SELF)
with torch.no_grad():
    density = float(model(x, batch).metrics["forward/density"])
print(json.dumps(dict(applied=applied, s_per_step=statistics.median(times),
                      faults_per_step=(after.ru_minflt - usage.ru_minflt) / steps,
                      sys_s_per_step=(after.ru_stime - usage.ru_stime) / steps,
                      density=density)))
"""


def run_case(args, malloc: str, layout: str) -> dict:
    env = dict(os.environ, GLOMO_MALLOC=malloc, OMP_NUM_THREADS=str(args.threads))
    out = subprocess.run([sys.executable, "-c", CHILD, args.config, layout, str(args.threads),
                          str(args.steps)], env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"case {malloc}/{layout} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/imdb-cpu.yaml")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--results", default="benchmarks/results/cpu_recipe_step.md")
    args = parser.parse_args(argv)
    if min(args.threads, args.steps, args.rounds) < 1:
        raise SystemExit("--threads, --steps and --rounds must be >= 1")
    if not os.path.isfile(args.config):
        raise SystemExit(f"--config {args.config}: no such file")
    results = {case: [] for case in CASES}
    for r in range(args.rounds):
        for case in CASES:
            results[case].append(run_case(args, *case))
            m = results[case][-1]
            print(f"round {r + 1}, malloc {case[0]}, layout {case[1]}: "
                  f"{m['s_per_step']:.3f} s/step, {m['faults_per_step']:.0f} faults/step, "
                  f"{m['sys_s_per_step']:.3f} s kernel/step (malloc setting applied: "
                  f"{m['applied']})", flush=True)
    median = {case: {k: statistics.median(m[k] for m in runs)
                     for k in ("s_per_step", "faults_per_step", "sys_s_per_step", "density")}
              for case, runs in results.items()}
    base = median[CASES[0]]["s_per_step"]
    command = " ".join(["python -m benchmarks.cpu_recipe_step",
                        *(sys.argv[1:] if argv is None else argv)])
    import torch

    torch.set_num_threads(args.threads)  # so hardware() names the children's thread count
    lines = [f"## {datetime.date.today().isoformat()}: {args.config}, {args.threads} "
             f"thread(s)", "", f"    {command}", "",
             f"- hardware: {hardware()}, torch {torch.__version__}",
             f"- {args.steps} timed steps per case (median), {args.rounds} rounds of the four "
             f"cases in turn (median over rounds); forward graph density at initialisation "
             f"{median[CASES[0]]['density']:.2f}", "",
             "| malloc | layout | s/step | per round | speed vs system/sparse | "
             "minor faults/step | kernel CPU s/step |", "|---|---|---|---|---|---|---|"]
    for case in CASES:
        m = median[case]
        rounds = ", ".join(f"{r['s_per_step']:.3f}" for r in results[case])
        lines.append(f"| {case[0]} | {case[1]} | {m['s_per_step']:.3f} | {rounds} | "
                     f"{base / m['s_per_step']:.2f}x | {m['faults_per_step']:.0f} | "
                     f"{m['sys_s_per_step']:.3f} |")
    lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.results:
        header = [] if os.path.exists(args.results) else [
            "# A training step of the CPU recipe: malloc setting and graph layout", "",
            "Written by `python -m benchmarks.cpu_recipe_step` (its docstring has the "
            "method).", ""]
        append_results(args.results, header + lines)


if __name__ == "__main__":
    main()
