"""Release a predictor trained on the CPU by one of the shipped recipes, with its model
card and measured quality (the GPU campaign's slices release theirs at ``ingest``).

    python -m benchmarks.release_cpu text --run runs/imdb-cpu --data-dir DATA --commit REV
    python -m benchmarks.release_cpu pixels --run runs/cifar10-cpu --data-dir DATA --commit REV

``--run``: the ``output_dir`` of ``glomo pretrain`` (its ``config.json``, ``pretrain.json``
and ``predictor/``); ``--commit``: the commit that trained it. Quality, measured here:
text, the graphs against gold dependency trees of UD English-EWT dev (the graph chosen on
EWT train) beside previous/next-word, uniform and untrained baselines (``glomo
syntax``); pixels, the weight on a pixel's 4-neighbourhood against uniform and untrained
graphs on 64 images of the pretraining's own validation split, and dead heads.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

import torch

from benchmarks.common import hardware, run_reporting_errors

COMMANDS = {
    "text": "glomo pretrain --config configs/imdb-cpu.yaml --set corpus.path=DATA/aclImdb "
            "--set train.syntax_treebank=DATA/ud-english-ewt/en_ewt-ud-train.conllu "
            "--output-dir RUN",
    "pixels": "glomo pretrain --config configs/cifar10-cpu.yaml "
              "--set corpus.path=DATA/imagenet32 --output-dir RUN",
}
NAMES = {"text": "imdb-text-cpu", "pixels": "imagenet32-pixel-cpu"}


def _read(path: str):
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def ewt_comparison(predictor, ewt: str, select: int = 2000):
    """``glomo syntax`` for a release's card: the predictor against the gold trees of UD
    English-EWT dev (the folder ``ewt``), the graph per direction chosen on the first
    ``select`` train sentences. Returns the comparison and the numbers of dev and
    selection sentences."""
    from glomo_pyg.analysis import compare_with_syntax, read_treebank

    dev = read_treebank(os.path.join(ewt, "en_ewt-ud-dev.conllu"))
    train = read_treebank(os.path.join(ewt, "en_ewt-ud-train.conllu"), max_sentences=select)
    return compare_with_syntax(predictor, dev, train), len(dev), len(train)


def ewt_heading(dev: int, select: int) -> str:
    """The sentence that introduces a card's EWT table."""
    return (f"Graphs against the gold dependency trees of UD English-EWT dev ({dev:,} "
            f"sentences; the graph chosen on {select:,} EWT train sentences; undirected "
            "attachment of each target's heaviest source, punctuation excluded; `glomo "
            "syntax`)")


def text_quality(predictor, data_dir: str) -> str:
    result, dev, select = ewt_comparison(predictor, os.path.join(data_dir, "ud-english-ewt"))
    return (ewt_heading(dev, select) + ":\n\n```text\n" + result.format().strip()
            + "\n```")


def pixel_quality(predictor, run: str) -> str:
    from benchmarks.gpu.slices.pixel_pretrain import quality_lines
    from benchmarks.reproduce.cifar10 import pixel_graph_check
    from glomo_pyg.analysis import untrained_copy
    from glomo_pyg.training.pretrain.config import CorpusConfig
    from glomo_pyg.training.pretrain.data import ImagePretrainingData, load_pretraining_images

    config, summary = (_read(os.path.join(run, "config.json")),
                       _read(os.path.join(run, "pretrain.json")))
    images = load_pretraining_images(CorpusConfig(**config["corpus"]))
    split = ImagePretrainingData(images, 1, config["corpus"]["validation_fraction"],
                                 config["train"]["seed"])
    split.setup("fit")  # (the split is drawn there, as in the run)
    sample = images[torch.as_tensor(split.val_ids[:64])]
    predictor = predictor.eval().set_layout("auto")
    untrained = untrained_copy(predictor).eval()
    metrics = dict(summary=summary,
                   seconds_per_step=round(summary["seconds"] / summary["steps"], 3),
                   stopped_by="max_steps", check_images=len(sample), check_device="CPU",
                   check=dict(learned=pixel_graph_check(predictor, sample),
                              untrained=pixel_graph_check(untrained, sample)))
    return "\n".join(quality_lines(metrics))


def run(args) -> None:
    from glomo_pyg import PretrainedGraphPredictor
    from glomo_pyg.io.releases import releases_root
    from glomo_pyg.publish import write_release

    if args.threads:
        torch.set_num_threads(args.threads)
    config = _read(os.path.join(args.run, "config.json"))
    summary = _read(os.path.join(args.run, "pretrain.json"))
    predictor = PretrainedGraphPredictor.from_pretrained(os.path.join(args.run, "predictor"))
    name = args.name or NAMES[args.modality]
    m, t, c = config["model"], config["train"], config["corpus"]
    if args.modality == "text":
        quality = text_quality(predictor, args.data_dir)
        summary_line = (f"Text graphs for English (IMDB reviews, {len(predictor.vocabulary)}-word "
                        f"lower-cased vocabulary): {m['num_layers']} layers x {m['heads']} heads x "
                        "2 directions; a CPU release of the shipped recipe.")
        data = (f"IMDB (Maas et al., 2011): an even spread of {c.get('max_documents')} of the "
                "unlabelled and labelled training reviews (the test reviews unseen), "
                f"{summary.get('tokens')} tokens in windows of {c['max_length']}.")
        recipe = (f"`configs/imdb-cpu.yaml`: width {m['hidden_channels']}, {m['num_layers']} "
                  f"layers x {m['heads']} heads, D={m['context_length']}, "
                  f"{m['num_positions']} predicted positions per window, relative position "
                  f"term, keep-alive {m['keep_alive']}; SGD lr {t['lr']} momentum "
                  f"{t['momentum']}, clip {t['grad_clip']}, batch {t['batch_size']}, "
                  f"{summary['steps']} steps, graph warm-up {t['graph_warmup_steps']}, "
                  f"embeddings from word2vec on the same documents; seed {t['seed']}. Trained "
                  f"on windows of {c['max_length']} tokens: for longer inputs pass "
                  f"`max_distance={c['max_length'] - 1}` to `GlomoTransfer`.")
    else:
        quality = pixel_quality(predictor, args.run)
        size = predictor.trained_size
        summary_line = (f"Pixel graphs for 32x32 RGB images: {m['num_layers']} layers x "
                        f"{m['heads']} heads x 2 directions; a CPU release of the reduced "
                        "recipe.")  # (the data: its own section, the card's one account)
        data = (f"Tiny ImageNet training images box-downsampled to 32x32 (JPEG quality 90): "
                f"an even spread of {summary.get('images')} of the 100,000 (labels unused), "
                f"random {size[0]}x{size[1]} crops.")
        recipe = (f"`configs/cifar10-cpu.yaml`: width {m['hidden_channels']}, "
                  f"{m['num_layers']} layers x {m['heads']} heads, {m['num_positions']} "
                  f"predicted pixels per crop, grid position term, keep-alive "
                  f"{m['keep_alive']}; Adam lr {t['lr']}, batch {t['batch_size']}, "
                  f"{summary['steps']} steps, graph warm-up {t['graph_warmup_steps']}; seed "
                  f"{t['seed']}. Trained on {size[0]}x{size[1]} crops and saved for 32x32: "
                  f"pass `max_distance={size[0] - 1}` to `GlomoTransfer` to keep only the "
                  "offsets a crop held.")
    card = dict(name=name, modality=args.modality, release="CPU release (reduced recipe, "
                "not the paper's scale; GPU releases come from the GPU campaign)",
                summary=summary_line, data=data, recipe=recipe,
                hardware=f"{hardware('cpu').split(',')[0]}, {t.get('threads') or 'default'} "
                         f"torch threads (train.threads); torch {torch.__version__}",
                command=COMMANDS[args.modality] + "\npython -m benchmarks.release_cpu " +
                shlex.join(sys.argv[1:] if args.argv is None else args.argv),
                commit=args.commit,
                training_time=f"{summary['seconds']} s for {summary['steps']} steps"
                              + (f" ({args.time_note})" if args.time_note else ""),
                quality=quality)
    path = write_release(predictor, os.path.join(args.releases_root or str(releases_root()),
                                                 name), card)
    print(f"released {path}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modality", choices=("text", "pixels"))
    parser.add_argument("--run", required=True, help="the glomo pretrain output_dir")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--commit", required=True, help="the commit that trained it")
    parser.add_argument("--name")
    parser.add_argument("--releases-root")
    parser.add_argument("--time-note", help="e.g. what shared the machine while it trained")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    args.argv = argv
    run_reporting_errors("benchmarks.release_cpu", run, args)


if __name__ == "__main__":
    main()
