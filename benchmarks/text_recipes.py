"""Pretraining recipes on real text, compared by what their graphs learn.

    python -m benchmarks.text_recipes --data-dir ~/.cache/glomo-data [--recipes NAME ...]

Every recipe is ``glomo pretrain`` on IMDB reviews (the unlabelled and training reviews,
an even spread of 20,000 documents, vocabulary 10,000, sequences of 64 tokens) with the
CPU base configuration below and a few settings changed. While it trains, the graphs are
scored every ``--syntax-every`` steps against gold trees of a sample of UD English-EWT
*train* (``SyntaxMonitor``), and their per-head health is logged (``GraphStatisticsCallback``).
Each recipe writes ``<output>/<recipe>/curves.json`` (loss, syntax and health learning
curves); ``--report`` prints one line per recipe from those files. EWT dev is not used
here: the recipe chosen from these curves is evaluated on dev by ``glomo syntax``.

The token shards are built once (``<output>/corpus``) and linked into every recipe.
Set the thread count with ``--threads`` (1 per run when two runs share 2 cores).
"""
from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import time
from typing import Any, Dict, List

BASE: Dict[str, Any] = dict(
    corpus=dict(format="aclimdb", min_count=3, max_size=10000, max_length=64, min_length=8,
                max_documents=20000, validation_fraction=0.01),
    model=dict(hidden_channels=96, num_layers=2, heads=4, cnn_layers=2, context_length=3,
               num_positions=10),
    train=dict(batch_size=32, max_steps=800, lr=1e-3, graph_warmup_steps=100,
               checkpoint_every=200, validate_every=400, log_every=20, graph_stats_every=50,
               progress_bar=False, syntax_sentences=300, syntax_every=100),
)
# name -> dotted overrides of BASE
RECIPES: Dict[str, Dict[str, Any]] = {
    "base": {},
    "relpos": {"model.position": "relative"},
    "relpos-allpos": {"model.position": "relative", "model.num_positions": 64},
    "relpos-nowarmup": {"model.position": "relative", "train.graph_warmup_steps": 0},
    "relpos-threshold": {"model.position": "relative", "model.bias": "threshold"},
    "relpos-glr3": {"model.position": "relative", "train.graph_lr_scale": 3.0},
    "relpos-lr3": {"model.position": "relative", "train.lr": 3e-3},
    "relpos-lr3-allpos": {"model.position": "relative", "train.lr": 3e-3,
                          "model.num_positions": 64},
    "allpos": {"model.num_positions": 64},
    # configs/imdb-cpu.yaml (run with --steps 3000)
    "cpu-recipe": {"model.position": "relative", "model.keep_alive": 0.05, "train.lr": 0.01,
                   "train.graph_warmup_steps": 200},
    "sgd-reference": {"train.optimizer": "sgd", "train.lr": 8.0, "train.momentum": 0.2,
                      "train.grad_clip": 0.25, "train.graph_warmup_steps": 0},
}


def config_for(name: str, args) -> Dict[str, Any]:
    from glomo_pyg.training.pretrain.config import set_by_path

    data = copy.deepcopy(BASE)
    data["corpus"]["path"] = os.path.join(args.data_dir, "aclImdb")
    data["train"]["syntax_treebank"] = os.path.join(args.data_dir, "ud-english-ewt",
                                                    "en_ewt-ud-train.conllu")
    data["train"]["syntax_every"] = args.syntax_every
    data["train"]["max_steps"] = args.steps
    data["train"]["accelerator"] = "cpu"
    for key, value in RECIPES[name].items():
        set_by_path(data, key, value)
    data["output_dir"] = os.path.join(args.output_dir, name)
    return data


def link_corpus(shared: str, folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    for item in ("tokens", "vocabulary.json", "corpus.json"):
        target = os.path.join(folder, item)
        if not os.path.lexists(target):
            os.symlink(os.path.abspath(os.path.join(shared, item)), target)


def read_curves(folder: str) -> Dict[str, List]:
    """Learning curves from the CSV log: ``{metric: [(step, value), ...]}``."""
    logs = os.path.join(folder, "logs")
    out: Dict[str, List] = {}
    if not os.path.isdir(logs):
        return out
    for version in sorted(os.listdir(logs)):
        path = os.path.join(logs, version, "metrics.csv")
        if not os.path.exists(path):
            continue
        with open(path) as fh:
            for row in csv.DictReader(fh):
                step = int(row.get("step") or 0)
                for key, value in row.items():
                    if key != "step" and value not in ("", None):
                        out.setdefault(key, []).append((step, float(value)))
    return out


def summarise(curves: Dict[str, List], direction: str = "forward") -> Dict[str, Any]:
    """Last values: loss, syntax scores, dead heads and mean adjacent weight."""
    def last(key):
        return curves[key][-1][1] if key in curves else None

    heads = sorted({k.rsplit("/", 1)[0] for k in curves
                    if k.startswith(f"health/{direction}/layer") and k.endswith("/empty")})
    adjacent = [last(h + "/adjacent") for h in heads]
    return dict(
        step=curves["train_loss"][-1][0] if "train_loss" in curves else None,
        train_loss=last("train_loss"), val_loss=last("val_loss"),
        syntax_best=last(f"syntax/{direction}/best"),
        syntax_layers=[last(k) for k in sorted(curves)
                       if k.startswith(f"syntax/{direction}/layer")],
        syntax_adjacent=last(f"syntax/{direction}/previous_word" if direction == "forward"
                             else f"syntax/{direction}/next_word"),
        syntax_uniform=last(f"syntax/{direction}/uniform"),
        dead_heads=last(f"health/{direction}/dead_heads"),
        max_empty=max((last(h + "/empty") for h in heads), default=None),
        adjacent=sum(adjacent) / len(adjacent) if adjacent else None,
        uniform_adjacent=last(f"health/{direction}/uniform_adjacent"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default="~/.cache/glomo-data",
                        help="folder with aclImdb/ and ud-english-ewt/ (../shared/data/build.py)")
    parser.add_argument("--output-dir", default="runs/text-recipes")
    parser.add_argument("--recipes", nargs="+", default=["base", "relpos"],
                        choices=sorted(RECIPES))
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--syntax-every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report", action="store_true", help="only print the summaries")
    args = parser.parse_args(argv)
    args.data_dir = os.path.expanduser(args.data_dir)

    import torch

    from glomo_pyg.logs import line_handler, logging_to
    from glomo_pyg.training.pretrain.config import CorpusConfig, PretrainConfig
    from glomo_pyg.training.pretrain.corpus import prepare_corpus
    from glomo_pyg.training.pretrain.run import run_pretraining
    torch.set_num_threads(args.threads)
    if not args.report:
        shared = os.path.join(args.output_dir, "corpus")
        corpus = dict(BASE["corpus"], path=os.path.join(args.data_dir, "aclImdb"))
        with logging_to(line_handler()):  # (what it made, as before)
            prepare_corpus(CorpusConfig(**corpus), shared)
    for name in args.recipes:
        folder = os.path.join(args.output_dir, name)
        if not args.report:
            config = PretrainConfig.from_dict(config_for(name, args))
            link_corpus(os.path.join(args.output_dir, "corpus"), folder)
            start = time.time()
            run_pretraining(config, resume=True)
            seconds = time.time() - start
            curves = read_curves(folder)
            with open(os.path.join(folder, "curves.json"), "w") as fh:
                json.dump(dict(recipe=name, overrides=RECIPES[name], seconds=round(seconds, 1),
                               threads=args.threads, curves=curves), fh)
        path = os.path.join(folder, "curves.json")
        if os.path.exists(path):
            with open(path) as fh:
                curves = json.load(fh)["curves"]
            for direction in ("forward", "backward"):
                print(name, direction, json.dumps(summarise(curves, direction)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
