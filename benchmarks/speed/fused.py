"""The fused layout (FlexAttention) against the sparse and dense layouts and a
hand-written FlexAttention call, for one graph layer: score (paper Eq. 1), normalise and
aggregate (Eq. 2), forward only (FlexAttention has no CPU backward; on a GPU the
forward+backward is timed too).

Keys, queries and values are random Gaussians, 8 heads of dimension 32, full-length
sequences, values of width 32 per head. ``sparse`` = ``latent_graph_edges`` +
``head_propagate``; ``dense`` = ``latent_graph_dense`` + ``dense_head_propagate``;
``fused`` = ``LatentGraphs`` in the fused layout, ``propagate``; ``flex`` = what a user
would write by hand: ``create_block_mask`` with a causal ``mask_mod`` and the
squared-ReLU ``score_mod``, compiled ``flex_attention`` (the compile cache is reset per
case). Compilation is excluded (one warm-up call per case). Peak memory of the fused path
at long T shows it stays O(B H T d): the dense ``T x T`` of one head alone would be
``4 T^2`` bytes.
"""
from __future__ import annotations

import torch

from benchmarks.speed.measure import cases_of, median_ms, peak_mib
from glomo_pyg import LatentGraphs
from glomo_pyg.kernels import (
    dense_head_propagate,
    head_propagate,
    latent_graph_dense,
    latent_graph_edges,
)
from glomo_pyg.sequences import SequenceBatch

HEADS, DIM, WIDTH = 8, 32, 32


def _inputs(b, t, device, requires_grad=False):
    torch.manual_seed(0)
    k = torch.randn(b, HEADS, t, DIM, device=device, requires_grad=requires_grad)
    q = torch.randn(b, HEADS, t, DIM, device=device, requires_grad=requires_grad)
    x = torch.randn(HEADS, b * t, WIDTH, device=device, requires_grad=requires_grad)
    lengths = torch.full((b,), t, device=device)
    ptr = torch.arange(b + 1, device=device) * t
    return k, q, x, lengths, ptr


def _hand_written(k, q, x, t):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    b = k.size(0)
    mask = create_block_mask(lambda b_, h, qi, ki: ki < qi, b, 1, t, t, device=k.device.type)
    values = x.view(HEADS, b, t, WIDTH).transpose(0, 1).contiguous()

    def score(s, b_, h, qi, ki):
        return torch.where(s > 0, 2.0 * torch.log(s), -float("inf"))

    return lambda: compiled(q, k, values, score_mod=score, block_mask=mask, scale=1.0)


def bench_case(b, t, device, repeats, dense_max_t, sparse_max_t):
    # a clean compile cache per case: the hand-written call compiles per static shape and
    # would otherwise hit torch's recompilation limit (then FlexAttention runs eagerly)
    torch._dynamo.reset()
    out = dict(B=b, T=t)
    k, q, x, lengths, ptr = _inputs(b, t, device)
    seqs = SequenceBatch.from_ptr(ptr)
    with torch.no_grad():
        graphs = LatentGraphs.from_trusted_fused([(k, q)], direction="forward", sequences=seqs)
        fns = {"fused": lambda: graphs.propagate(x, 0), "flex": _hand_written(k, q, x, t)}
        if t <= sparse_max_t:
            fns["sparse"] = lambda: head_propagate(x, *latent_graph_edges(k, q, lengths, ptr),
                                                   num_heads=HEADS)
        if t <= dense_max_t:
            fns["dense"] = lambda: dense_head_propagate(
                x, latent_graph_dense(k, q, lengths), seqs.ptr, seqs.position, seqs.batch)
        for name, fn in fns.items():
            out[f"{name}_ms"] = median_ms(fn, repeats, device)
        out["fused_peak_mib"] = peak_mib(fns["fused"], device)
        if "sparse" in fns and "dense" in fns:
            ref = fns["sparse"]()
            out["max_diff"] = float((fns["fused"]() - ref).abs().max())
    out["inputs_mib"] = (2 * b * HEADS * t * DIM + 2 * HEADS * b * t * WIDTH) * 4 / 2**20
    if device == "cuda":  # forward + backward
        k, q, x, lengths, ptr = _inputs(b, t, device, requires_grad=True)
        graphs = LatentGraphs.from_trusted_fused([(k, q)], direction="forward",
                                             sequences=SequenceBatch.from_ptr(ptr))
        out["fused_fwd_bwd_ms"] = median_ms(lambda: graphs.propagate(x, 0).sum().backward(),
                                            repeats, device)
        if t <= dense_max_t:
            out["dense_fwd_bwd_ms"] = median_ms(lambda: dense_head_propagate(
                x, latent_graph_dense(k, q, lengths), seqs.ptr, seqs.position,
                seqs.batch).sum().backward(), repeats, device)
    return out


def run(args):
    if args.quick:
        cases = [(32, 128), (16, 256), (8, 512), (4, 1024), (2, 2048), (1, 8192)]
        dense_max_t, sparse_max_t = 1024, 1024
    else:
        cases = [(64, 64), (32, 128), (16, 256), (8, 512), (4, 1024), (2, 2048), (1, 8192)]
        dense_max_t, sparse_max_t = 2048, 2048
    rows = []
    cases = cases_of(args, cases, lambda c: c[1])
    for b, t in cases:
        rows.append(bench_case(b, t, args.device, args.repeats, dense_max_t, sparse_max_t))
        print(f"fused B={b} T={t}: " + ", ".join(f"{k} {v:.1f}" for k, v in rows[-1].items()
                                                  if k.endswith("_ms")), flush=True)
    lines = ["### Fused layout (FlexAttention), one graph layer", "",
             "Score, normalise (squared ReLU) and aggregate, forward, 8 heads of dim 32, "
             "values of width 32 per head, full-length sequences. ms per call; "
             "fused / flex = the library's fused layout against a hand-written "
             "FlexAttention call (the wrapper's cost); best / fused = the better of the "
             "sparse and dense layouts against the fused one (speed-up). Peak: extra memory "
             "of one fused call against its inputs (q, k, values, output).", "",
             "| B | T | sparse ms | dense ms | fused ms | flex ms | fused / flex | "
             "best / fused | fused peak MiB (inputs MiB) | max diff vs sparse |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        best = min([r[k] for k in ("sparse_ms", "dense_ms") if k in r], default=None)
        cell = lambda key: f"{r[key]:.1f}" if key in r else "-"  # noqa: E731
        lines.append(
            f"| {r['B']} | {r['T']} | {cell('sparse_ms')} | {cell('dense_ms')} | "
            f"{r['fused_ms']:.1f} | {r['flex_ms']:.1f} | {r['fused_ms'] / r['flex_ms']:.2f} | "
            + (f"{best / r['fused_ms']:.1f}x" if best else "-") +
            f" | {r['fused_peak_mib']:.0f} ({r['inputs_mib']:.0f}) | "
            + (f"{r['max_diff']:.1e}" if "max_diff" in r else "-") + " |")
    if any("fused_fwd_bwd_ms" in r for r in rows):
        lines += ["", "Forward + backward (GPU): fused / dense ms", ""]
        lines += [f"- B={r['B']} T={r['T']}: fused {r['fused_fwd_bwd_ms']:.1f} ms, dense "
                  + (f"{r['dense_fwd_bwd_ms']:.1f} ms" if "dense_fwd_bwd_ms" in r else "-")
                  for r in rows]
    lines.append("")
    return lines, rows
