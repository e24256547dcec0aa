"""Where a text predictor's learned distance term puts weight beyond its pretraining window.

    python -m benchmarks.position_extrapolation --predictor runs/imdb-cpu/predictor \\
        --data-dir ~/.cache/glomo-data [--window 64] [--length 128] [--reviews 256]
        [--results FILE]

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


def run(args) -> None:
    from glomo_pyg import PretrainedGraphPredictor
    from glomo_pyg.data import WordVocabulary, read_aclimdb
    from glomo_pyg.training.text_classification import encode_documents

    torch.manual_seed(0)
    predictor = PretrainedGraphPredictor.from_pretrained(args.predictor).eval()
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
    parser.add_argument("--predictor", required=True, help="a saved text predictor")
    parser.add_argument("--data-dir", required=True, help="folder holding aclImdb/")
    parser.add_argument("--window", type=int, default=None,
                        help="tokens per pretraining sequence (corpus.max_length; default: "
                             "the predictor's recorded trained_length)")
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
