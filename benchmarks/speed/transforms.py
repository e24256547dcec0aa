"""``GlomoGraphs`` top-k transforms of 32x32 images with the ``imagenet32-pixel`` release
(3 layers x 8 heads, both directions): images/s and peak memory of one batch."""
from __future__ import annotations

import torch

from benchmarks.speed.measure import median_ms, peak_mib
from glomo_pyg import PretrainedGraphPredictor
from glomo_pyg.transforms import GlomoGraphs, image_data

CONFIGS = {"merge='mean', top_k=8": dict(merge="mean", top_k=8), "top_k=8": dict(top_k=8)}


def run(args):
    batch = 8 if args.quick else 256
    p = PretrainedGraphPredictor.from_pretrained("imagenet32-pixel")
    g = torch.Generator().manual_seed(0)
    samples = [image_data(i) for i in
               torch.randint(0, 256, (batch, 3, 32, 32), dtype=torch.uint8, generator=g)]
    rows = []
    for label, config in CONFIGS.items():
        t = GlomoGraphs(p, device=args.device, batch_size=batch, **config)
        fn = lambda: t(samples)  # noqa: E731
        ms = median_ms(fn, max(1, args.repeats // 2), args.device)
        rows.append(dict(config=label, images=batch, ms=ms, images_per_s=batch / ms * 1e3,
                         peak_mib=peak_mib(fn, args.device)))
        print(f"transforms {label}: {rows[-1]['images_per_s']:.1f} images/s", flush=True)
    lines = ["### GlomoGraphs on 32x32 images", "",
             f"`GlomoGraphs(imagenet32-pixel, ...)` on {batch} random 32x32 images in one "
             f"call (median of timed calls after a warm-up).", "",
             "| configuration | images | ms | images/s | peak MiB |", "|---|---|---|---|---|"]
    lines += [f"| `{r['config']}` | {r['images']} | {r['ms']:.0f} | {r['images_per_s']:.1f} | "
              f"{r['peak_mib']:.0f} |" for r in rows]
    return lines + [""], dict(rows=rows)
