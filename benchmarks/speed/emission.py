"""Emission: scores -> pruned, normalised, target-sorted edges, against computing the
dense normalised G alone (what any implementation must at least do)."""
from __future__ import annotations

import statistics

import torch

from benchmarks.speed.measure import cases_of, median_ms, peak_mib
from glomo_pyg.nn.functional import latent_graph_dense, latent_graph_edges

HEADS, HEAD_DIM = 8, 64


def inputs(b: int, t: int, density: float, device: str):
    """Random per-head keys/queries whose scores are positive for about ``density`` of
    the pairs: scores ~ N(bias, 64), the bias folded in as an extra key/query column."""
    g = torch.Generator().manual_seed(0)
    std = HEAD_DIM ** 0.5
    bias = std * statistics.NormalDist().inv_cdf(min(max(density, 1e-4), 1 - 1e-4))
    k = torch.randn(b, HEADS, t, HEAD_DIM, generator=g)
    q = torch.randn(b, HEADS, t, HEAD_DIM, generator=g)
    k = torch.cat([k, torch.ones(b, HEADS, t, 1)], -1).to(device)
    q = torch.cat([q, torch.full((b, HEADS, t, 1), bias)], -1).to(device)
    lengths = torch.full((b,), t, device=device)
    ptr = torch.arange(b + 1, device=device) * t
    return k, q, lengths, ptr


def bench_case(b, t, density, device, repeats):
    k, q, lengths, ptr = inputs(b, t, density, device)
    kg, qg = k.clone().requires_grad_(), q.clone().requires_grad_()
    edges = lambda: latent_graph_edges(kg, qg, lengths, ptr)  # noqa: E731
    dense = lambda: latent_graph_dense(kg, qg, lengths)  # noqa: E731
    ei, w, _ = edges()
    allowed = b * HEADS * t * (t - 1) / 2
    out = dict(B=b, T=t, target_density=density, density=w.numel() / allowed, edges=w.numel())
    out["edges_fwd"] = median_ms(lambda: edges(), repeats, device)
    out["dense_fwd"] = median_ms(lambda: dense(), repeats, device)
    out["edges_fwdbwd"] = median_ms(lambda: edges()[1].sum().backward(), repeats, device)
    out["dense_fwdbwd"] = median_ms(lambda: dense().sum().backward(), repeats, device)
    out["edges_peak_mib"] = peak_mib(lambda: edges()[1].sum().backward(), device)
    out["dense_peak_mib"] = peak_mib(lambda: dense().sum().backward(), device)
    return out


def run(args):
    lengths = tuple(cases_of(args, (64, 128, 256, 512) if args.quick else
                             (64, 128, 256, 512, 1024, 2048), lambda t: t))
    b = 4 if args.quick else 16
    rows = []
    for t in lengths:
        for d in (0.01, 0.1, 0.5, 1.0):
            rows.append(bench_case(b, t, d, args.device, args.repeats))
            r = rows[-1]
            print(f"emission T={t} density={r['density']:.3f}: edges {r['edges_fwd']:.1f} ms, "
                  f"dense G {r['dense_fwd']:.1f} ms", flush=True)
    lines = ["### Emission", "",
             f"B={b}, 8 heads, head size 64 (+1 bias column); density set through the bias. "
             "`edges`: `latent_graph_edges` (blockwise score, normalise, prune, emit sorted "
             "edges; custom backward recomputing blocks); `dense G`: `latent_graph_dense` "
             "(scores and normalisation only, plain autograd). Ratio = edges / dense G "
             "(target: forward <= 1.5).", "",
             "| T | density | edges | edges fwd | dense G fwd | ratio | edges fb | dense G fb "
             "| ratio | edges peak MiB | dense G peak MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['T']} | {r['density']:.3f} | {r['edges']} | {r['edges_fwd']:.1f} | "
            f"{r['dense_fwd']:.1f} | {r['edges_fwd'] / r['dense_fwd']:.2f} | "
            f"{r['edges_fwdbwd']:.1f} | {r['dense_fwdbwd']:.1f} | "
            f"{r['edges_fwdbwd'] / r['dense_fwdbwd']:.2f} | {r['edges_peak_mib']:.0f} | "
            f"{r['dense_peak_mib']:.0f} |")
    worst = max(r["edges_fwd"] / r["dense_fwd"] for r in rows)
    lines += ["", f"Worst forward ratio {worst:.2f} (target <= 1.5: "
              f"{'met' if worst <= 1.5 else 'not met'}).", ""]
    return lines, dict(rows=rows)
