"""Aggregation: GlomoConv in both layouts vs the dense reference, PyG and SDPA."""
from __future__ import annotations

import os

import torch

from benchmarks.speed.measure import cases_of, median_ms, peak_mib
from glomo_pyg import GlomoConv, LatentGraphs
from glomo_pyg.nn import layout as layout_rules

HEADS, WIDTH = 8, 512


def causal_graph(b: int, t: int, density: float, generator: torch.Generator) -> LatentGraphs:
    """Random causal graphs (every sequence of length t) with column-normalised
    weights, as emitted graphs are: edges sorted by (head, target, source)."""
    scores = torch.rand(b, HEADS, t, t, generator=generator)  # [b, h, j, i]
    keep = (scores < density) & torch.ones(t, t, dtype=torch.bool).tril(-1)
    weight = torch.where(keep, scores + 0.1, torch.zeros(()))
    total = weight.sum(-1, keepdim=True)
    weight = torch.where(total > 0, weight / total.clamp_min(1e-12), torch.zeros(()))
    ptr = torch.arange(b + 1) * t
    return LatentGraphs.from_dense([weight.transpose(-1, -2).contiguous()], direction="forward",
                                   ptr=ptr).to_sparse()


def bench_case(b: int, t: int, density: float, device: str, repeats: int, pyg_max_edges: int):
    g = causal_graph(b, t, density, torch.Generator().manual_seed(0)).to(device)
    ei, w, eh = g.layer(0)
    edges = ei.size(1)
    block = g.dense_layer(0).detach().clone()
    batch = g.batch
    w = w.detach().clone().requires_grad_()
    blk = block.clone().requires_grad_()
    x = torch.randn(b * t, WIDTH, device=device, requires_grad=True)
    xh = x.detach().view(b, t, HEADS, -1).transpose(1, 2).contiguous().requires_grad_()
    q = torch.randn(b, HEADS, t, WIDTH // HEADS, device=device, requires_grad=True)
    k = torch.randn_like(q, requires_grad=True)
    conv = GlomoConv(WIDTH, HEADS).to(device)
    unfused = GlomoConv(WIDTH, HEADS, fused=False).to(device)
    runs = {
        "sparse": lambda: conv(x, ei, w, eh),
        "dense": lambda: conv.forward_dense(x, blk, batch),
        "ref": lambda: blk.transpose(-1, -2) @ xh,
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, xh, is_causal=True),
    }
    if edges <= pyg_max_edges:
        runs["pyg"] = lambda: unfused(x, ei, w, eh)
    out = dict(B=b, T=t, density=density, edges=edges, nodes=b * t)
    for name, fn in runs.items():
        out[f"{name}_fwd"] = median_ms(lambda: fn().sum(), repeats, device)
        out[f"{name}_fwdbwd"] = median_ms(lambda: fn().sum().backward(), repeats, device)
    x.grad = w.grad = None
    out["sparse_peak_mib"] = peak_mib(lambda: conv(x, ei, w, eh).sum().backward(), device)
    out["budget_mib"] = (edges * 12 + 3 * b * t * WIDTH * 4) / 2**20
    x.grad = blk.grad = None
    out["dense_peak_mib"] = peak_mib(lambda: conv.forward_dense(x, blk, batch).sum().backward(),
                                     device)
    return out


def crossover(rows, t: int) -> float:
    """Smallest swept density from which on the dense layout is at least as fast as the
    sparse one (forward+backward); 1.01 if it never is."""
    mine = sorted((r for r in rows if r["T"] == t), key=lambda r: r["density"])
    best = 1.01
    for r in reversed(mine):
        if r["dense_fwdbwd"] <= r["sparse_fwdbwd"]:
            best = r["density"]
        else:
            break
    return best




def trained_case(path: str, device: str, repeats: int, batches: int = 4):
    """``GlomoConv`` over the graphs a trained predictor actually emits: the quickstart's
    saved predictor (``glomo quickstart``) on batches of 32 held-out corpus sequences
    (variable lengths, padding), its own width and heads; every layer and direction."""
    from torch_geometric.loader import DataLoader

    from glomo_pyg import PretrainedGraphPredictor
    from glomo_pyg.data import PlantedDependencyCorpus
    from glomo_pyg.training.quickstart import QuickstartConfig

    predictor = PretrainedGraphPredictor.from_pretrained(path, map_location=device)
    heads = predictor.heads
    corpus = PlantedDependencyCorpus(32 * batches, seed=12345, **QuickstartConfig().corpus)
    rows = []
    for data in DataLoader(corpus, batch_size=32):
        x, batch = data.x.to(device), data.batch.to(device)
        with torch.no_grad():
            graphs = predictor(x, batch)
        for direction in predictor.directions:
            g = getattr(graphs, direction)
            for l in range(g.num_layers):
                ei, w, eh = g.layer(l)
                blk = g.dense_layer(l).detach().clone().requires_grad_()
                w = w.detach().clone().requires_grad_()
                h = torch.randn(x.size(0), WIDTH, device=device, requires_grad=True)
                conv = GlomoConv(WIDTH, heads).to(device)
                unfused = GlomoConv(WIDTH, heads, fused=False).to(device)
                row = dict(direction=direction, layer=l, edges=ei.size(1),
                           density=g.density()[l], T=int(g.sequences.max_len))
                for name, fn in (("sparse", lambda: conv(h, ei, w, eh)),
                                 ("dense", lambda: conv.forward_dense(h, blk, batch)),
                                 ("pyg", lambda: unfused(h, ei, w, eh))):
                    row[f"{name}_fwdbwd"] = median_ms(lambda: fn().sum().backward(), repeats,
                                                      device)
                rows.append(row)
    def mean(key):
        return sum(r[key] for r in rows) / len(rows)

    summary = dict(cases=len(rows), heads=heads, density=mean("density"),
                   density_min=min(r["density"] for r in rows),
                   density_max=max(r["density"] for r in rows), edges=mean("edges"),
                   **{f"{k}_fwdbwd": mean(f"{k}_fwdbwd") for k in ("sparse", "dense", "pyg")})
    pick = layout_rules.choose_layout(32, heads, max(r["T"] for r in rows), summary["density"])
    lines = ["#### Graphs of a trained predictor", "",
             f"`{path}` (the quickstart's predictor, {heads} heads), {batches} batches of 32 "
             "held-out corpus sequences (length 16-32, padded), every layer and direction "
             f"({len(rows)} cases), features of width {WIDTH}; forward+backward, mean of the "
             "per-case medians (ms):", "",
             "| density (min-max) | edges | sparse | dense | pyg | dense / sparse | pyg / sparse "
             "| auto picks |", "|---|---|---|---|---|---|---|---|",
             f"| {summary['density']:.3f} ({summary['density_min']:.3f}-"
             f"{summary['density_max']:.3f}) | {summary['edges']:.0f} | "
             f"{summary['sparse_fwdbwd']:.2f} | {summary['dense_fwdbwd']:.2f} | "
             f"{summary['pyg_fwdbwd']:.2f} | "
             f"{summary['dense_fwdbwd'] / summary['sparse_fwdbwd']:.2f} | "
             f"{summary['pyg_fwdbwd'] / summary['sparse_fwdbwd']:.2f} | {pick} |", ""]
    return lines, dict(summary=summary, rows=rows)


def run(args):
    """Markdown lines and raw rows of the aggregation sweep."""
    densities = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0)
    lengths = tuple(cases_of(args, (64, 128, 256, 512) if args.quick else
                             (64, 128, 256, 512, 1024, 2048), lambda t: t))
    b = 4 if args.quick else 16
    rows = []
    for t in lengths:
        for d in densities:
            rows.append(bench_case(b, t, d, args.device, args.repeats, args.pyg_max_edges))
            r = rows[-1]
            print(f"T={t} density={d}: sparse {r['sparse_fwdbwd']:.1f} ms, dense "
                  f"{r['dense_fwdbwd']:.1f} ms (fwd+bwd)", flush=True)
    cross = {t: crossover(rows, t) for t in lengths}
    lines = ["### Aggregation", "",
             f"B={b}, 8 heads, width 512; median of {args.repeats} repeats (ms); "
             "ratio = other / sparse (> 1: sparse faster); fb = forward+backward",
             "",
             "| T | density | edges | sparse fwd | dense fwd | ref fwd | pyg fwd | sdpa fwd "
             "| sparse fb | dense fb | ref fb | pyg fb | sdpa fb | sparse peak / budget MiB "
             "| dense peak MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def ratio(r, name, kind):
        if f"{name}_{kind}" not in r:
            return "skipped"
        return f"{r[f'{name}_{kind}']:.1f} ({r[f'{name}_{kind}'] / r[f'sparse_{kind}']:.2f})"
    for r in rows:
        lines.append(
            f"| {r['T']} | {r['density']} | {r['edges']} | {r['sparse_fwd']:.1f} | "
            f"{ratio(r, 'dense', 'fwd')} | {ratio(r, 'ref', 'fwd')} | {ratio(r, 'pyg', 'fwd')} | "
            f"{ratio(r, 'sdpa', 'fwd')} | {r['sparse_fwdbwd']:.1f} | "
            f"{ratio(r, 'dense', 'fwdbwd')} | {ratio(r, 'ref', 'fwdbwd')} | "
            f"{ratio(r, 'pyg', 'fwdbwd')} | {ratio(r, 'sdpa', 'fwdbwd')} | "
            f"{r['sparse_peak_mib']:.0f} / {r['budget_mib']:.0f} | {r['dense_peak_mib']:.0f} |")
    lines += ["", "Crossover density (dense layout at least as fast as sparse, forward+backward, "
              "from this density up; 1.01 = never): "
              + ", ".join(f"T={t}: {c}" for t, c in cross.items()),
              "(as a `glomo_pyg/nn/layout.py` table: `CROSSOVER = ("
              + ", ".join(f"({t}, {min(c, 1.01)})" for t, c in cross.items()) + ")`)", ""]
    # auto: the layout the crossover table in glomo_pyg.nn.layout picks, vs the better one
    worst = 0.0
    for r in rows:
        pick = layout_rules.choose_layout(b, HEADS, r["T"], r["density"])
        best = min(r["sparse_fwdbwd"], r["dense_fwdbwd"])
        worst = max(worst, r[f"{pick}_fwdbwd"] / best)
    lines += [f"`layout='auto'` with the table in `glomo_pyg/nn/layout.py`: worst case "
              f"{worst:.2f}x the better layout (target <= 1.2x).", ""]
    raw = dict(rows=rows, crossover={str(t): c for t, c in cross.items()})
    if os.path.isdir(args.predictor):
        trained_lines, raw["trained"] = trained_case(args.predictor, args.device, args.repeats)
        lines += trained_lines
    else:
        lines += [f"(No trained predictor at `{args.predictor}`: run `glomo quickstart` first "
                  "to add the trained-graph case.)", ""]
    return lines, raw
