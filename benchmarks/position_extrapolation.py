"""Where a predictor's learned distance term puts weight beyond its pretraining window.

    python -m benchmarks.position_extrapolation --predictor runs/imdb-cpu/predictor \\
        --data-dir ~/.cache/glomo-data [--window 64] [--length 128] [--reviews 256]
        [--results FILE]
    python -m benchmarks.position_extrapolation \\
        --predictor runs/cifar10-reduced/pretrain/predictor \\
        --data-dir ~/.cache/glomo-data [--window 16] [--images 16]

``position='relative'`` (an extension of the paper) adds a learned function of the
distance ``j - i`` to the graph scores. Pretraining on windows of ``--window`` tokens shows
it distances up to ``window - 1`` only (default: the predictor's recorded
``trained_length``); a downstream model that feeds longer sequences
(IMDB reviews of ``--length`` tokens) gets scores extrapolated beyond. This script
measures, on the first ``--reviews`` IMDB test reviews cut to ``--length`` tokens:

* the learned distance term per (direction, layer, head) at distances inside and beyond
  the window;
* each head's share of incoming weight on sources in the window's outer half
  (``window / 2`` to ``window - 1`` units away) and beyond it (``window`` or more), over
  targets with edges, beside uniform graphs' share over the same sources
  (:func:`glomo_pyg.analysis.dataset_statistics`);
* the same for the targets' weights after :meth:`glomo_pyg.LatentGraphs.within` (``window
  - 1``), the fix: nothing beyond by construction, and how much of the outer half stays.

For a pixel predictor (``position='grid'``) pretrained on crops of ``--window`` pixels per
side (default: its recorded ``trained_size``) and applied to whole CIFAR-10 test images
(``--images`` of them, from ``cifar-10-batches-py/``), the same questions with the larger
of the row and column offsets as the distance: the learned term at offsets along a row
and along a column, and each head's share of weight at offsets in the window's outer
half and beyond it, on centre crops of the window's size (what pretraining saw), on the
whole images, on uniform graphs, and after ``within(window - 1)``.

Appends a section to ``--results`` (default
``benchmarks/results/position_extrapolation.md``; ``''``: print only).
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
from typing import List

import torch

from benchmarks.common import append_results, hardware, run_reporting_errors

DISTANCES = (1, 2, 4, 8, 16, 32, 48)


def distance_terms(predictor, window: int, length: int) -> List[str]:
    """Table rows: the learned distance term of every head at distances inside the window
    and beyond it (up to ``length - 1``)."""
    beyond = sorted({window - 1, window, *range(window + window // 4, length, window // 4),
                     length - 1})
    shown = [d for d in DISTANCES if d < window - 1] + [d for d in beyond if d < length]
    rows = ["| direction | layer | head | " + " | ".join(
                f"**{d}**" if d >= window else str(d) for d in shown) + " |",
            "|---|---|---|" + "---|" * len(shown)]
    for direction in predictor.directions:
        scorer = predictor.predictor(direction).scorer
        sign = 1 if direction == "forward" else -1  # j - i of the allowed sources
        with torch.no_grad():
            for layer in range(scorer.num_layers):
                term = scorer.relative_bias(layer, sign * torch.tensor(shown))
                for head in range(scorer.heads):
                    rows.append(f"| {direction} | {layer} | {head} | " + " | ".join(
                        f"{float(v):+.2f}" for v in term[head]) + " |")
    return rows


def weight_shares(predictor, data, window: int) -> List[str]:
    from glomo_pyg import DirectionalGraphs
    from glomo_pyg.analysis import dataset_statistics

    edges = (1, window // 2, window)  # bins [1, w/2), [w/2, w), [w, inf)
    plain = dataset_statistics(predictor, data, edges=edges)

    def windowed(x, batch):
        return DirectionalGraphs(*(None if g is None else g.within(window - 1)
                                   for g in predictor(x, batch)))
    cut = dataset_statistics(windowed, data, edges=edges)
    rows = [f"| direction | layer | head | learned: {window // 2}-{window - 1} | learned: "
            f"{window}+ | uniform: {window // 2}-{window - 1} | uniform: {window}+ | within "
            f"{window - 1}: {window // 2}-{window - 1} |", "|---|---|---|---|---|---|---|---|"]
    for r, c in zip(plain.rows, cut.rows):
        # histogram bins: [0], [1, w/2), [w/2, w), [w, inf)
        rows.append(f"| {r.direction} | {r.layer} | {r.head} | {r.histogram[2]:.3f} | "
                    f"**{r.histogram[3]:.3f}** | {r.uniform_histogram[2]:.3f} | "
                    f"{r.uniform_histogram[3]:.3f} | {c.histogram[2]:.3f} |")
    return rows


def offset_shares(graphs, window: int) -> torch.Tensor:
    """``[L, H, 2]``: per layer and head, the share of incoming weight at offsets in
    ``[window // 2, window)`` and at ``window`` or more (the larger of the row and column
    offsets), averaged over images, over all targets with edges."""
    order = graphs.order
    t = order.num_units
    pos = torch.arange(t)
    reach = order.window_distance(pos.view(1, -1), pos.view(-1, 1))  # [i, j]
    bins = [(reach >= window // 2) & (reach < window), reach >= window]
    out = []
    for layer in range(graphs.num_layers):
        dense = graphs.to_dense(layer)  # [B, H, T(i), T(j)]
        total = dense.sum((0, 2, 3))
        out.append(torch.stack([(dense * m).sum((0, 2, 3)) / total for m in bins], -1))
    return torch.stack(out)


def pixel_sections(predictor, images: torch.Tensor, window: int) -> List[str]:
    """The grid term per head along rows and columns, and the weight shares by offset."""
    from glomo_pyg import LatentGraphs
    from glomo_pyg.pixels import image_units

    height, width = images.shape[2:]
    shown = sorted({1, 2, window // 2, window - 1, window, (window + height) // 2, height - 1})
    rows = ["| direction | layer | head | axis | " + " | ".join(
                f"**{d}**" if d >= window else str(d) for d in shown) + " |",
            "|---|---|---|---|" + "---|" * len(shown)]
    for direction in predictor.directions:
        scorer = predictor.predictor(direction).scorer
        sign = 1 if direction == "forward" else -1  # the allowed sources' target - source
        with torch.no_grad():
            for layer in range(scorer.num_layers):
                d = sign * torch.tensor(shown)
                zero = torch.zeros_like(d)
                for axis, offsets in (("rows", torch.stack([d, zero], -1)),
                                      ("columns", torch.stack([zero, d], -1))):
                    term = scorer.relative_bias(layer, offsets)
                    for head in range(scorer.heads):
                        rows.append(f"| {direction} | {layer} | {head} | {axis} | " + " | ".join(
                            f"{float(v):+.2f}" for v in term[head]) + " |")
    top = (height - window) // 2
    crops = images[:, :, top:top + window, top:top + window].contiguous()
    small = predictor.resized(window, window)
    with torch.no_grad():
        on_crops = small(*image_units(crops))
        whole = predictor(*image_units(images))
    shares = ["| direction | layer | head | crops: " + f"{window // 2}-{window - 1} | whole: "
              f"{window // 2}-{window - 1} | whole: {window}+ | uniform: {window // 2}-"
              f"{window - 1} | uniform: {window}+ | within {window - 1}: {window // 2}-"
              f"{window - 1} |", "|---|---|---|---|---|---|---|---|---|"]
    for direction in predictor.directions:
        g, c = getattr(whole, direction), getattr(on_crops, direction)
        uniform = LatentGraphs.uniform(g.ptr[:2], num_layers=1, num_heads=1,  # one image
                                       direction=direction, include_self=g.include_self,
                                       order=g.order)
        plain, crop, cut = (offset_shares(x, window) for x in (g, c, g.within(window - 1)))
        flat = offset_shares(uniform, window)[0, 0]
        for layer in range(g.num_layers):
            for head in range(g.num_heads):
                shares.append(
                    f"| {direction} | {layer} | {head} | {crop[layer, head, 0]:.3f} | "
                    f"{plain[layer, head, 0]:.3f} | **{plain[layer, head, 1]:.3f}** | "
                    f"{flat[0]:.3f} | {flat[1]:.3f} | {cut[layer, head, 0]:.3f} |")
    return ["The learned offset term per head at row offsets (same column) and column "
            "offsets (same row); bold: offsets the pretraining crops never held:", "", *rows,
            "", f"Share of each head's incoming weight by offset (the larger of the row and "
            f"column offsets), over all targets with edges: on centre {window}x{window} crops "
            f"(what pretraining saw), on the whole {height}x{width} images, on uniform graphs "
            f"over the whole images, and after `LatentGraphs.within({window - 1})`:", "",
            *shares, ""]


def run_pixels(args, predictor) -> None:
    from glomo_pyg.data.images import load_cifar10

    positions = {predictor.predictor(d).scorer.position for d in predictor.directions}
    if positions != {"grid"}:
        raise ValueError(f"{args.predictor} has no learned offset term (position "
                         f"{sorted(map(str, positions))}): nothing extrapolates")
    if args.window is None:
        if predictor.trained_size is None:
            raise ValueError(f"{args.predictor} does not record its training image size "
                             "(saved before it was recorded): pass --window (the crop side)")
        args.window = min(predictor.trained_size)
    images, _ = load_cifar10(os.path.join(args.data_dir, "cifar-10-batches-py"), "test")
    side = min(images.shape[2:])
    if not 2 <= args.window < side or args.images < 1:
        raise ValueError(f"need 2 <= --window < {side} (the CIFAR image side) and --images "
                         f">= 1, got {args.window}, {args.images}")
    chosen = torch.randperm(len(images), generator=torch.Generator().manual_seed(1))
    images = images[chosen[:args.images]]
    predictor = predictor.resized(*images.shape[2:]).set_layout("dense")
    command = "python -m benchmarks.position_extrapolation " + " ".join(sys.argv[1:])
    lines = [f"## {datetime.date.today()}: `{args.predictor}`, {args.window}x{args.window} "
             f"crops, whole {images.shape[2]}x{images.shape[3]} CIFAR-10 images", "",
             f"- command: `{command}`", f"- hardware: {hardware()}; torch {torch.__version__}",
             f"- {len(images)} CIFAR-10 test images (a fixed random sample)", "",
             *pixel_sections(predictor, images, args.window)]
    if args.results:
        append_results(args.results, lines)
    print("\n".join(lines))


def run(args) -> None:
    from glomo_pyg import PretrainedGraphPredictor
    from glomo_pyg.data import WordVocabulary, read_aclimdb
    from glomo_pyg.ordering import RasterOrder
    from glomo_pyg.training.text_classification import encode_documents

    torch.manual_seed(0)
    predictor = PretrainedGraphPredictor.from_pretrained(args.predictor).eval()
    if isinstance(predictor.predictor(predictor.directions[0]).order, RasterOrder):
        return run_pixels(args, predictor)
    if args.window is None:
        if predictor.trained_length is None:
            raise ValueError(f"{args.predictor} does not record its training length (saved "
                             "before it was recorded): pass --window")
        args.window = predictor.trained_length
    if args.window < 2 or args.length <= args.window or args.reviews < 1:
        raise ValueError(f"need --window >= 2, --length > --window and --reviews >= 1, got "
                         f"{args.window}, {args.length}, {args.reviews}")
    if predictor.vocabulary is None:
        raise ValueError(f"{args.predictor} reads features, not words")
    positions = {predictor.predictor(d).scorer.position for d in predictor.directions}
    if positions != {"relative"}:
        raise ValueError(f"{args.predictor} has no learned distance term (position "
                         f"{sorted(map(str, positions))}): nothing extrapolates")
    reviews = read_aclimdb(args.data_dir, "test")
    order = torch.randperm(len(reviews), generator=torch.Generator().manual_seed(1)).tolist()
    chosen = [reviews[k] for k in order[:args.reviews]]
    data = [d.x for d in encode_documents([r.text for r in chosen], [r.label for r in chosen],
                                          WordVocabulary(predictor.vocabulary), args.length)]
    longer = sum(int(x.numel() > args.window) for x in data)
    command = "python -m benchmarks.position_extrapolation " + " ".join(sys.argv[1:])
    lines = [f"## {datetime.date.today()}: `{args.predictor}`, window {args.window}, "
             f"reviews cut to {args.length} tokens", "",
             f"- command: `{command}`", f"- hardware: {hardware()}; torch {torch.__version__}",
             f"- {len(data)} IMDB test reviews (a fixed random sample), {longer} of them longer "
             f"than the window; mean length {sum(x.numel() for x in data) / len(data):.1f}", "",
             "The learned distance term per head (bold: distances the pretraining windows "
             "never held):", "", *distance_terms(predictor, args.window, args.length), "",
             "Share of each head's incoming weight by source distance, averaged over targets "
             "with edges (all targets, including those with no source beyond the window); "
             f"last column: after `LatentGraphs.within({args.window - 1})`:", "",
             *weight_shares(predictor, data, args.window), ""]
    text = "\n".join(lines) + "\n"
    if args.results:
        append_results(args.results, lines)
    print(text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--predictor", required=True, help="a saved text or pixel predictor")
    parser.add_argument("--data-dir", required=True,
                        help="folder holding aclImdb/ (text) or cifar-10-batches-py/ (pixels)")
    parser.add_argument("--window", type=int, default=None,
                        help="tokens per pretraining sequence (corpus.max_length), or pixels "
                             "per pretraining crop side (corpus.crop); default: the "
                             "predictor's recorded trained_length or trained_size")
    parser.add_argument("--images", type=int, default=16, help="CIFAR-10 test images")
    parser.add_argument("--length", type=int, default=128, help="tokens per review")
    parser.add_argument("--reviews", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--results", default=os.path.join(
        "benchmarks", "results", "position_extrapolation.md"))
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    run_reporting_errors("benchmarks.position_extrapolation", run, args)


if __name__ == "__main__":
    main()
