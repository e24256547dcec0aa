"""One pretraining step of Glomo (forward, backward, Adam), tokens per second, per layout."""
from __future__ import annotations

import torch

from benchmarks.speed.measure import cases_of, median_ms, peak_mib
from glomo_pyg import Glomo


def bench_case(b, t, hidden, device, repeats):
    out = dict(B=b, T=t, hidden=hidden)
    x = torch.randint(0, 1000, (b * t,), device=device)
    batch = torch.arange(b, device=device).repeat_interleave(t)
    # fused trains only where FlexAttention has a backward (GPU); on CPU it falls back
    for layout in ("sparse", "dense", "auto") + (("fused",) if device == "cuda" else ()):
        torch.manual_seed(0)
        model = Glomo.text(num_tokens=1000, hidden_channels=hidden, num_layers=3, heads=8,
                           num_positions=20).set_layout(layout).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad()
            model(x, batch).loss.backward()
            opt.step()
        ms = median_ms(step, repeats, device)
        out[f"{layout}_ms"] = ms
        out[f"{layout}_tokens_per_s"] = b * t / ms * 1e3
        out[f"{layout}_peak_mib"] = peak_mib(step, device)
        if layout in ("sparse", "dense"):  # fused graphs hold no edges to count (auto: fused)
            with torch.no_grad():
                out["density"] = float(model(x, batch).metrics["forward/density"])
    return out


def run(args):
    cases = [(8, 64, 128), (8, 128, 128)] if args.quick else [(32, 128, 512), (32, 256, 512),
                                                              (16, 512, 512)]
    if args.device == "cuda" and not args.quick:  # the fused layout's target length
        cases.append((8, 1024, 512))
    rows = []
    cases = cases_of(args, cases, lambda c: c[1])
    for b, t, hidden in cases:
        rows.append(bench_case(b, t, hidden, args.device, max(2, args.repeats // 2)))
        r = rows[-1]
        print(f"pretraining B={b} T={t}: sparse {r['sparse_tokens_per_s']:.0f} tok/s, dense "
              f"{r['dense_tokens_per_s']:.0f} tok/s"
              + (f", fused {r['fused_tokens_per_s']:.0f} tok/s" if "fused_ms" in r else ""),
              flush=True)
    fused = any("fused_ms" in r for r in rows)
    lines = ["### Pretraining step", "",
             "`Glomo` (3 graph layers x 8 heads, both directions, D=3, 20 positions per "
             "sequence, GRU updates), one Adam step on random tokens (vocabulary 1000) at "
             "initialisation; tokens per second; ratio = layout / sparse.", "",
             "| B | T | width | forward density | sparse tok/s | dense tok/s (ratio) "
             "| auto tok/s (ratio) | peak MiB sparse / dense / auto |"
             + (" fused tok/s (ratio; x dense) | fused peak MiB |" if fused else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|---|" if fused else "")]
    for r in rows:
        s = r["sparse_tokens_per_s"]
        lines.append(
            f"| {r['B']} | {r['T']} | {r['hidden']} | {r['density']:.2f} | {s:.0f} | "
            f"{r['dense_tokens_per_s']:.0f} ({r['dense_tokens_per_s'] / s:.2f}) | "
            f"{r['auto_tokens_per_s']:.0f} ({r['auto_tokens_per_s'] / s:.2f}) | "
            f"{r['sparse_peak_mib']:.0f} / {r['dense_peak_mib']:.0f} / {r['auto_peak_mib']:.0f} |"
            + (f" {r['fused_tokens_per_s']:.0f} ({r['fused_tokens_per_s'] / s:.2f}; "
               f"{r['dense_ms'] / r['fused_ms']:.2f}x) | {r['fused_peak_mib']:.0f} |"
               if fused else ""))
    lines.append("")
    return lines, dict(rows=rows)
