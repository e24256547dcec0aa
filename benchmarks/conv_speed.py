"""GlomoConv aggregation speed against the alternatives, side by side in one run.

    python -m benchmarks.conv_speed [--quick] [--device cpu|cuda] [--output PATH]

For causal graphs over B sequences of T units with H heads and C channels, at a given
density (fraction of allowed (source, target) pairs that carry an edge), times:

* ``glomo``: GlomoConv (one CSR spmm over all heads, custom backward);
* ``pyg``: the same layer with ``fused=False`` (PyG's gather/scatter ``propagate``);
* ``dense``: the dense reference, ``A @ X`` with ``A`` ``[B, H, T, T]``;
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` at the same sizes
  (what a user would otherwise write; it also computes the scores).

Forward, and forward + backward (gradients for features and weights). Median of repeats;
ratios are other / glomo (> 1: glomo faster). Appends a markdown table with the command,
hardware and date to PATH (default benchmarks/results/conv_speed.md).
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time

import torch
import torch_geometric

from benchmarks.common import append_results, hardware
from glomo_pyg import GlomoConv


def _causal_graph(b: int, h: int, t: int, density: float, generator: torch.Generator):
    """Random causal graph, edges sorted by (head, target); column-normalised weights."""
    keep = torch.rand(b, h, t, t, generator=generator) < density
    keep &= torch.ones(t, t, dtype=torch.bool).tril(-1)  # [.., target j, source i], i < j
    bb, hh, j, i = keep.nonzero(as_tuple=True)
    order = torch.argsort((hh * b + bb) * t + j, stable=True)
    bb, hh, j, i = bb[order], hh[order], j[order], i[order]
    weight = torch.rand(bb.numel(), generator=generator) + 0.1
    return torch.stack([bb * t + i, bb * t + j]), weight, hh


def _time(fn, repeats: int, device: str) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def bench_case(b, h, t, c, density, device, repeats):
    g = torch.Generator().manual_seed(0)
    edge_index, weight, head = _causal_graph(b, h, t, density, g)
    edge_index, weight, head = edge_index.to(device), weight.to(device), head.to(device)
    x = torch.randn(b * t, c, device=device, requires_grad=True)
    w = weight.clone().requires_grad_()
    dense = torch.zeros(b, h, t, t, device=device)
    dense[edge_index[1] // t, head, edge_index[1] % t, edge_index[0] % t] = weight
    dense.requires_grad_()
    xd = x.detach().view(b, t, h, c // h).transpose(1, 2).contiguous().requires_grad_()
    q = torch.randn(b, h, t, c // h, device=device, requires_grad=True)
    k = torch.randn(b, h, t, c // h, device=device, requires_grad=True)
    fused, unfused = GlomoConv(c, heads=h).to(device), GlomoConv(c, heads=h, fused=False).to(device)
    runs = {
        "glomo": lambda: fused(x, edge_index, w, head),
        "pyg": lambda: unfused(x, edge_index, w, head),
        "dense": lambda: dense @ xd,
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, xd, is_causal=True),
    }
    out = {"edges": edge_index.size(1)}
    for name, fn in runs.items():
        out[f"{name}_fwd"] = _time(lambda: fn().sum(), repeats, device)
        out[f"{name}_fwdbwd"] = _time(lambda: fn().sum().backward(), repeats, device)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sweep (CPU, ~1 minute)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", default="benchmarks/results/conv_speed.md")
    args = parser.parse_args(argv)
    if args.quick:
        cases = [(4, 8, t, 256, d) for t in (128, 256) for d in (0.01, 0.1, 0.5)]
    else:
        cases = [(16, 8, t, 512, d) for t in (128, 256, 512, 1024) for d in (0.01, 0.1, 0.5, 1.0)]
    lines = [f"\n## {datetime.date.today().isoformat()}, {args.device}",
             "", f"- command: `python -m benchmarks.conv_speed {' '.join(sys.argv[1:])}`".rstrip(),
             f"- hardware: {hardware(args.device)}; torch {torch.__version__}, "
             f"PyG {torch_geometric.__version__}",
             "- times: median ms; ratio = other / glomo (> 1 means glomo is faster)", "",
             "| B | H | T | C | density | edges | glomo fwd | pyg fwd (x) | dense fwd (x) "
             "| sdpa fwd (x) | glomo fwd+bwd | pyg (x) | dense (x) | sdpa (x) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for b, h, t, c, d in cases:
        r = bench_case(b, h, t, c, d, args.device, args.repeats)
        f, fb = r["glomo_fwd"], r["glomo_fwdbwd"]
        lines.append(
            f"| {b} | {h} | {t} | {c} | {d} | {r['edges']} | {f:.2f} | "
            f"{r['pyg_fwd']:.2f} ({r['pyg_fwd'] / f:.1f}) | "
            f"{r['dense_fwd']:.2f} ({r['dense_fwd'] / f:.1f}) | "
            f"{r['sdpa_fwd']:.2f} ({r['sdpa_fwd'] / f:.1f}) | {fb:.2f} | "
            f"{r['pyg_fwdbwd'] / fb:.1f} | "
            f"{r['dense_fwdbwd'] / fb:.1f} | {r['sdpa_fwdbwd'] / fb:.1f} |")
        print(lines[-1], flush=True)
    print(append_results(args.output, lines))


if __name__ == "__main__":
    main()
