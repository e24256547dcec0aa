"""One transfer forward (GlomoTransfer: frozen predictor, mixer, gate), per layout."""
from __future__ import annotations

import torch

from benchmarks.speed.measure import median_ms, peak_mib
from glomo_pyg import GlomoTransfer, GraphPredictor, PretrainedGraphPredictor


def predictor(layout, num_tokens=None, in_channels=None, hidden=256):
    torch.manual_seed(0)
    return PretrainedGraphPredictor(*(
        GraphPredictor(num_tokens=num_tokens, in_channels=in_channels, hidden_channels=hidden,
                       num_layers=3, heads=8, direction=d)
        for d in ("forward", "backward"))).set_layout(layout)


def bench_case(kind, b, t, d, device, repeats):
    out = dict(kind=kind, B=b, T=t, d=d)
    batch = torch.arange(b, device=device).repeat_interleave(t)
    if kind == "text":
        x = torch.randint(0, 1000, (b * t,), device=device)
    else:  # pixels in raster order, their 3 channels as the predictor's input
        x = torch.rand(b * t, 3, device=device)
    h = torch.randn(b * t, d, device=device)
    for layout in ("sparse", "dense", "fused", "auto"):
        p = predictor(layout, num_tokens=1000 if kind == "text" else None,
                      in_channels=3 if kind != "text" else None).to(device)
        transfer = GlomoTransfer(p, in_channels=d).to(device)
        fn = lambda: transfer(h, x, batch)  # noqa: E731
        out[f"{layout}_ms"] = median_ms(fn, repeats, device)
        out[f"{layout}_peak_mib"] = peak_mib(fn, device)
        graphs = transfer.graphs(x, batch)
        out["density"] = sum(graphs.forward.density()) / graphs.forward.num_layers
        with torch.no_grad():
            graphs_only = lambda: transfer.graphs(x, batch)  # noqa: E731
            out[f"{layout}_graphs_ms"] = median_ms(graphs_only, repeats, device)
    return out


def run(args):
    if args.quick:
        cases = [("text", 8, 128, 300), ("text", 4, 256, 300), ("text", 2, 512, 300),
                 ("image", 2, 1024, 3)]
    else:
        cases = [("text", 32, 128, 300), ("text", 32, 256, 300), ("text", 32, 512, 300),
                 ("image", 128, 1024, 3)]
    rows = []
    for kind, b, t, d in cases:
        rows.append(bench_case(kind, b, t, d, args.device, max(2, args.repeats // 2)))
        r = rows[-1]
        print(f"transfer {kind} B={b} T={t}: sparse {r['sparse_ms']:.0f} ms, dense "
              f"{r['dense_ms']:.0f} ms", flush=True)
    lines = ["### Transfer forward", "",
             "`GlomoTransfer` (frozen predictor of width 256, 3 layers x 8 heads, both "
             "directions; mixer with G and Lambda; gate) on features of width d, at "
             "initialisation. `image`: 32x32 images as 1024 units in raster order with their "
             "3 channels as the predictor's input (a 1-D causal predictor over the raster "
             "sequence; the 2-D pixel mode is a later issue). ms per forward; graphs = "
             "the predictor alone; ratio = layout / sparse.", "",
             "| kind | B | T | d | density | sparse ms (graphs) | dense ms (ratio) "
             "| fused ms (ratio) | auto ms (ratio) | peak MiB sparse / dense / fused / auto |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["sparse_ms"]
        lines.append(
            f"| {r['kind']} | {r['B']} | {r['T']} | {r['d']} | {r['density']:.2f} | {s:.0f} "
            f"({r['sparse_graphs_ms']:.0f}) | {r['dense_ms']:.0f} ({r['dense_ms'] / s:.2f}) | "
            f"{r['fused_ms']:.0f} ({r['fused_ms'] / s:.2f}) | "
            f"{r['auto_ms']:.0f} ({r['auto_ms'] / s:.2f}) | {r['sparse_peak_mib']:.0f} / "
            f"{r['dense_peak_mib']:.0f} / {r['fused_peak_mib']:.0f} / {r['auto_peak_mib']:.0f} |")
    lines.append("")
    return lines, dict(rows=rows)
