"""Throughput of ``glomo_pyg.transforms.GlomoGraphs`` against the predictor's own batched
emission, and what a dataset's cache saves.

    python -m benchmarks.transform_speed [--device cpu|cuda] [--repeats 5] [--quick]

For each released predictor and sample size, the same samples (``--batch`` per predictor
call) are timed as:

- **emission**: ``predictor(x, batch, layout=...)`` on the concatenated units, with every
  layer's edges materialised (``layout='sparse'``: ``graphs.layer(l)``; ``'dense'``:
  ``graphs.to_dense()``): what a user calling the predictor directly gets;
- **transform**: ``GlomoGraphs(...)(list of Data)``, i.e. emission plus relation
  selection, merging, pruning and one ``Data`` per sample with its edges.

Rounds alternate between the two (median of ``--repeats``, after one warm-up round; glibc
keeps freed memory, as ``glomo`` sets it);
the ratio is emission time / transform time (the transform's throughput as a fraction
of the predictor's; the target is >= 0.8 against the faster emission layout). Then a
``GraphsDataset`` of the samples is built once and loaded again (cache hit).
Results go to ``benchmarks/results/transform_speed.md``.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Sequence

import torch
from torch_geometric.data import Data

from benchmarks.common import hardware
from glomo_pyg import PretrainedGraphPredictor
from glomo_pyg.allocator import keep_freed_memory
from glomo_pyg.transforms import GlomoGraphs, GraphsDataset, image_data

RESULTS = os.path.join(os.path.dirname(__file__), "results", "transform_speed.md")
CONFIGS = {"all relations": {}, "merge='mean', top_k=8": dict(merge="mean", top_k=8),
           "top_k=8": dict(top_k=8), "products, merge='sum'": dict(products=True, merge="sum")}


def sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: str) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def text_samples(n: int, vocabulary: int, longest: int) -> List[Data]:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(longest // 2, longest + 1, (n,), generator=g)
    return [Data(x=torch.randint(4, vocabulary, (int(t),), generator=g)) for t in lengths]


def image_samples(n: int, side: int) -> List[Data]:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 3, side, side), generator=g, dtype=torch.uint8)
    return [image_data(i) for i in images]


def emission(predictor: PretrainedGraphPredictor, samples: List[Data], batch: int,
             layout: str, device: str) -> Callable[[], None]:
    """Emit ``samples`` ``batch`` at a time in ``layout``, every layer's edges made."""
    chunks = []
    for start in range(0, len(samples), batch):
        part = samples[start:start + batch]
        x = torch.cat([d.x for d in part]).to(device)
        sizes = torch.tensor([d.x.size(0) for d in part])
        chunks.append((x, torch.repeat_interleave(torch.arange(len(part)), sizes).to(device)))

    def run() -> None:
        with torch.no_grad():
            for x, b in chunks:
                graphs = predictor(x, b, layout=layout)
                for g in graphs:
                    if layout == "dense":
                        g.to_dense()
                    else:
                        [g.layer(l) for l in range(g.num_layers)]
    return run


def measure(name: str, predictor: PretrainedGraphPredictor, samples: List[Data], args,
            image_size=None, configs: Sequence[str] = tuple(CONFIGS)) -> List[str]:
    lines = [f"### {name}: {len(samples)} samples, up to {max(d.x.size(0) for d in samples)} "
             f"units, {args.batch} per call", "",
             "| what | median s | samples/s | transform / faster emission |", "|---|---|---|---|"]
    if image_size is not None:
        predictor = predictor.resized(*image_size)
    predictor = predictor.to(args.device).eval()
    runs: Dict[str, Callable[[], object]] = {
        f"emission, layout='{lay}'": emission(predictor, samples, args.batch, lay, args.device)
        for lay in ("sparse", "dense")}
    for label in configs:
        transform = GlomoGraphs(predictor, batch_size=args.batch, device=args.device,
                                **CONFIGS[label])
        runs[f"GlomoGraphs({label})"] = lambda t=transform: t(samples)
    times: Dict[str, List[float]] = {k: [] for k in runs}
    for round_ in range(args.repeats + 1):
        for key, fn in runs.items():
            seconds = timed(fn, args.device)
            if round_:  # (round 0 warms up)
                times[key].append(seconds)
    medians = {k: statistics.median(v) for k, v in times.items()}
    fastest = min(medians[k] for k in medians if k.startswith("emission"))
    for key, seconds in medians.items():
        ratio = "" if key.startswith("emission") else f"{fastest / seconds:.2f}"
        lines.append(f"| {key} | {seconds:.3f} | {len(samples) / seconds:.0f} | {ratio} |")
    with tempfile.TemporaryDirectory() as root:
        transform = GlomoGraphs(predictor, batch_size=args.batch, device=args.device,
                                merge="mean", top_k=8)
        built = timed(lambda: GraphsDataset(root, samples, transform), args.device)
        loaded = timed(lambda: GraphsDataset(root, samples, transform), args.device)
    lines += ["", f"`GraphsDataset` (merge='mean', top_k=8): built in {built:.2f} s, loaded "
              f"from its cache in {loaded:.2f} s (the predictor not called).", ""]
    print("\n".join(lines), flush=True)
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    parser.add_argument("--results", default=RESULTS)
    args = parser.parse_args(argv)
    keep_freed_memory()  # (as `glomo` does: no page-fault storm from the large blocks)
    n = 64 if args.quick else 256
    text = PretrainedGraphPredictor.from_pretrained("imdb-text-cpu")
    pixels = PretrainedGraphPredictor.from_pretrained("imagenet32-pixel-cpu")
    lines = [f"## {datetime.date.today()}: `python -m benchmarks.transform_speed "
             f"{' '.join(sys.argv[1:] if argv is None else argv)}`", "",
             f"{hardware(args.device)}; torch {torch.__version__}.", ""]
    lines += measure("imdb-text-cpu, token ids", text,
                     text_samples(n, text.num_tokens, 128), args)
    lines += measure("imagenet32-pixel-cpu, 16x16 images", pixels, image_samples(n, 16), args,
                     image_size=(16, 16))
    if not args.quick:
        # (unpruned, every relation of a 32x32 image is ~8M edges: left out)
        # 16 images per call: the dense emission of 64 would pass the predictor's bound
        lines += measure("imagenet32-pixel-cpu, 32x32 images", pixels, image_samples(n // 4, 32),
                         argparse.Namespace(**dict(vars(args), batch=16)),
                         configs=("merge='mean', top_k=8", "top_k=8"))
    with open(args.results, "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
