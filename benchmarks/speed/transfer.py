"""One transfer forward (GlomoTransfer: frozen predictor, mixer, gate), per layout."""
from __future__ import annotations

import torch

from benchmarks.speed.measure import cases_of, median_ms, peak_mib
from glomo_pyg import GlomoTransfer, GraphPredictor, PixelGraphPredictor, PretrainedGraphPredictor
from glomo_pyg.nn.resnet import CifarResNet


def predictor(layout, kind, hidden=256):
    torch.manual_seed(0)
    if kind == "image":  # the full CIFAR configuration: 3 layers x 8 heads, width 128
        parts = (PixelGraphPredictor(32, 32, hidden_channels=128, num_layers=3, heads=8,
                                     direction=d, position="grid")
                 for d in ("forward", "backward"))
    else:
        parts = (GraphPredictor(num_tokens=1000, hidden_channels=hidden, num_layers=3, heads=8,
                                direction=d) for d in ("forward", "backward"))
    return PretrainedGraphPredictor(*parts).set_layout(layout)


def resnet_step_ms(b, device, repeats):
    """One ResNet-18 (width 64) training step (forward, backward, SGD) on b CIFAR images:
    what the transfer stage is compared with."""
    torch.manual_seed(0)
    cuda = str(device).startswith("cuda")
    net = CifarResNet(18, 64, 6).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    x = torch.randn(b, 6, 32, 32, device=device)
    y = torch.randint(0, 10, (b,), device=device)
    if cuda:  # channels-last only on a GPU (its CPU backward stalls)
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)

    def step():
        with torch.autocast("cuda", torch.bfloat16, enabled=cuda):
            loss = torch.nn.functional.cross_entropy(net(x).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return median_ms(step, repeats, device)


def bench_case(kind, b, t, d, device, repeats):
    out = dict(kind=kind, B=b, T=t, d=d)
    batch = torch.arange(b, device=device).repeat_interleave(t)
    if kind == "text":
        x = torch.randint(0, 1000, (b * t,), device=device)
    else:  # uint8 pixels of 32x32 images in raster order
        x = torch.randint(0, 256, (b * t, 3), device=device, dtype=torch.uint8)
    h = torch.randn(b * t, d, device=device)
    layouts = ("sparse", "dense", "fused", "auto")
    if kind == "image" and b > 16:  # sparse (1.6G edges at B=128): minutes per call
        layouts = ("fused", "auto") if str(device) == "cpu" else ("dense", "fused", "auto")
    for layout in ("sparse", "dense", "fused", "auto"):
        if layout not in layouts:
            out[f"{layout}_ms"] = out[f"{layout}_peak_mib"] = out[f"{layout}_graphs_ms"] = \
                float("nan")
            continue
        p = predictor(layout, kind).to(device)
        transfer = GlomoTransfer(p, in_channels=d).to(device)
        fn = lambda: transfer(h, x, batch)  # noqa: E731
        out[f"{layout}_ms"] = median_ms(fn, repeats, device)
        out[f"{layout}_peak_mib"] = peak_mib(fn, device)
        if layout != "fused" and "density" not in out:
            graphs = transfer.graphs(x, batch)
            out["density"] = sum(graphs.forward.density()) / graphs.forward.num_layers
        with torch.no_grad():
            graphs_only = lambda: transfer.graphs(x, batch)  # noqa: E731
            out[f"{layout}_graphs_ms"] = median_ms(graphs_only, repeats, device)
    out.setdefault("density", float("nan"))
    if kind == "image":
        out["resnet_step_ms"] = resnet_step_ms(b, device, repeats)
    return out


def run(args):
    if args.quick:
        cases = [("text", 8, 128, 300), ("text", 4, 256, 300), ("text", 2, 512, 300),
                 ("image", 2, 1024, 3)]
    else:
        cases = [("text", 32, 128, 300), ("text", 32, 256, 300), ("text", 32, 512, 300),
                 ("image", 128, 1024, 3)]
    rows = []
    cases = cases_of(args, cases, lambda c: c[2])
    for kind, b, t, d in cases:
        rows.append(bench_case(kind, b, t, d, args.device, max(2, args.repeats // 2)))
        r = rows[-1]
        print(f"transfer {kind} B={b} T={t}: sparse {r['sparse_ms']:.0f} ms, dense "
              f"{r['dense_ms']:.0f} ms, fused {r['fused_ms']:.0f} ms", flush=True)
    lines = ["### Transfer forward", "",
             "`GlomoTransfer` (frozen predictor of width 256, 3 layers x 8 heads, both "
             "directions; mixer with G and Lambda; gate) on features of width d, at "
             "initialisation. `image`: 32x32 uint8 images (1024 units in raster order), the "
             "pixel-graph predictor of the full CIFAR configuration (width 128, 3 layers x 8 "
             "heads = 24 graphs, both directions, grid position term) and d = 3 (the "
             "normalised pixels); on CPU at B=128 only fused and auto are timed (sparse and "
             "dense take minutes per call). ms per forward; graphs = the predictor alone; "
             "ratio = layout / sparse. ResNet step: one ResNet-18 (width 64) training step "
             "on the same images; stage / step = the best layout's transfer forward against "
             "it (target on a GPU: <= 0.25).", "",
             "| kind | B | T | d | density | sparse ms (graphs) | dense ms (ratio) "
             "| fused ms (ratio) | auto ms (ratio) | peak MiB sparse / dense / fused / auto "
             "| ResNet step ms | stage / step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["sparse_ms"]
        measured = [r[k + "_ms"] for k in ("sparse", "dense", "fused", "auto")
                    if r[k + "_ms"] == r[k + "_ms"]]
        lines.append(
            f"| {r['kind']} | {r['B']} | {r['T']} | {r['d']} | {r['density']:.2f} | {s:.0f} "
            f"({r['sparse_graphs_ms']:.0f}) | {r['dense_ms']:.0f} ({r['dense_ms'] / s:.2f}) | "
            f"{r['fused_ms']:.0f} ({r['fused_ms'] / s:.2f}) | "
            f"{r['auto_ms']:.0f} ({r['auto_ms'] / s:.2f}) | {r['sparse_peak_mib']:.0f} / "
            f"{r['dense_peak_mib']:.0f} / {r['fused_peak_mib']:.0f} / {r['auto_peak_mib']:.0f} | "
            + (f"{r['resnet_step_ms']:.0f} | "
               f"{min(measured) / r['resnet_step_ms']:.2f} |"
               if "resnet_step_ms" in r else "- | - |"))
    lines.append("")
    return lines, dict(rows=rows)
