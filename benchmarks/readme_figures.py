"""Figures of the README and docs/analysis.md, from saved predictors.

    python -m benchmarks.readme_figures --text-predictor runs/imdb-cpu/predictor \
        --pixel-predictor runs/cifar10-reduced/pretrain/predictor \
        --cifar ~/.cache/glomo-data/cifar-10-batches-py --output docs/figures

Writes ``text_graphs_{forward,backward}.png`` (paper Fig. 3 style: the graphs of
one sentence, every layer and head) and ``pixel_graphs.png`` (paper Fig. 4 style:
the incoming weights of the centre pixel of a CIFAR-10 test image), plus ``figures.json`` with
what each figure was made from (entries of figures not made again are kept).
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from glomo_pyg.atomic_files import atomic_write

SENTENCE = "The acting was wonderful , but the story made no sense to me ."


def _parse_args(argv) -> argparse.Namespace:
    """The command line: the predictors, the sentence and image drawn, the output folder."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text-predictor", required=True)
    parser.add_argument("--pixel-predictor")
    parser.add_argument("--cifar", help="cifar-10-batches-py folder (for the pixel figure)")
    parser.add_argument("--image", type=int, default=3, help="CIFAR-10 test image index")
    parser.add_argument("--sentence", default=SENTENCE)
    parser.add_argument("--output", default="docs/figures")
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args(argv)


def _text_figures(args) -> dict:
    """Draw the sentence's graphs of each direction; what each figure was made from."""
    from glomo_pyg.analysis import plot_graph_heatmaps, save_figure
    from glomo_pyg.data.text import UNK, tokenize
    from glomo_pyg.nn.pretrained import PretrainedGraphPredictor

    made = {}
    predictor = PretrainedGraphPredictor.from_pretrained(args.text_predictor)
    tokens = tokenize(args.sentence)
    with torch.no_grad():
        graphs = predictor(predictor.encode(tokens, unknown=UNK))
    from matplotlib.figure import Figure  # noqa: F401  (matplotlib must be importable)
    for direction in predictor.directions:
        fig = plot_graph_heatmaps(getattr(graphs, direction), 0, labels=tokens,
                                  title=f"{direction} graphs of one sentence "
                                        f"({os.path.normpath(args.text_predictor)})")
        paths = save_figure(fig, os.path.join(args.output, f"text_graphs_{direction}"),
                            formats=("png",))
        made[f"text_graphs_{direction}"] = dict(predictor=args.text_predictor,
                                                sentence=args.sentence, files=paths)
    return made


def _pixel_figure(args) -> dict:
    """Draw the centre pixel's incoming weights of a CIFAR-10 test image; what it was made of."""
    from glomo_pyg.analysis import plot_pixel_weights, save_figure
    from glomo_pyg.data.images import load_cifar10
    from glomo_pyg.nn.pretrained import PretrainedGraphPredictor
    from glomo_pyg.pixels import image_units

    pixel = PretrainedGraphPredictor.from_pretrained(args.pixel_predictor)
    images, labels = load_cifar10(args.cifar, "test")
    image = images[args.image]
    with torch.no_grad():
        graphs = pixel(*image_units(image.unsqueeze(0)))
    h, w = image.shape[1:]
    fig = plot_pixel_weights(graphs, image, [(h // 2, w // 2)],
                             title=f"incoming weights of the centre pixel, CIFAR-10 test "
                                   f"image {args.image} "
                                   f"({os.path.normpath(args.pixel_predictor)})")
    paths = save_figure(fig, os.path.join(args.output, "pixel_graphs"), formats=("png",))
    return {"pixel_graphs": dict(predictor=args.pixel_predictor, image=args.image,
                                 label=int(labels[args.image]), files=paths)}


def _record(output: str, made: dict) -> None:
    """Update ``figures.json`` with ``made``, keeping the entries of figures not made again."""
    record = os.path.join(output, "figures.json")
    kept = {}  # what the figures not made this time (e.g. no --pixel-predictor) came from
    if os.path.exists(record):
        try:
            with open(record) as fh:
                kept = json.load(fh)
        except (OSError, ValueError) as err:
            print(f"warning: {record} is unreadable ({err}); writing it anew")
        if not isinstance(kept, dict):
            kept = {}
    kept.update(made)  # (in the file's order)
    with atomic_write(record) as fh:
        json.dump(kept, fh, indent=1)


def main(argv=None) -> int:
    args = _parse_args(argv)
    torch.set_num_threads(args.threads)
    os.makedirs(args.output, exist_ok=True)
    made = _text_figures(args)
    if args.pixel_predictor and args.cifar:
        made.update(_pixel_figure(args))
    _record(args.output, made)
    for name, info in made.items():
        print(name, "->", ", ".join(info["files"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
