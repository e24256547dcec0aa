"""Batch size and precision for the GPU campaign's ``imdb`` slice, chosen on validation.

    python -m benchmarks.imdb_batch_precision --data-dir ~/.cache/glomo-data \\
        [--train 2000 --val 1000 --length 128 --epochs 2 --dim 100] [--out FILE.json]

The paper's IMDB model (:class:`~glomo_pyg.GlomoTextClassifier`, BiGRU x 2 of width 150,
self-attention, pooling, MLP) with GLoMo graphs at the word vectors (the ``glomo``
variant, the released CPU text predictor ``pretrained/imdb-text-cpu``, ``max_distance``
63 as in the slice), trained by ``train_and_test`` once per ``--configs`` entry (batch
size, precision and optionally learning rate; by default the learning rate is
``--lr`` at batch 32 scaled by the square root of the batch ratio), the same seed and
data for all. The graphs come from one
:class:`~glomo_pyg.transforms.TextGraphCache` of the training and validation
reviews (computed once, as the slice does). A reduced size that fits a 2-core CPU:
``--train`` training and ``--val`` validation reviews of at most ``--length`` tokens,
from the slice's split of the 25,000 labelled training reviews (2,500 held out, seed 0);
``--dim``-d word2vec vectors trained on that split's 22,500 training reviews. Only
validation accuracy is read: the test reviews are not touched (the test split
``train_and_test`` needs is the validation split again, and is not reported).

Prints a markdown table (best validation accuracy, per-epoch validation accuracy and
training loss, seconds on this machine) and writes the rows to ``--out`` after each run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from typing import Dict, List

import torch

# batch 32 in float32 (the reference) first, then the candidates the GPU would run
# fastest, so that a run stopped early has the comparisons that matter
CONFIGS = ("32:32-true", "128:bf16-mixed", "64:bf16-mixed", "128:32-true", "32:bf16-mixed",
           "64:32-true")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", required=True, help="folder holding aclImdb/")
    ap.add_argument("--predictor", default="pretrained/imdb-text-cpu")
    ap.add_argument("--max-distance", type=int, default=63)
    ap.add_argument("--train", type=int, default=2000, help="training reviews")
    ap.add_argument("--val", type=int, default=1000, help="validation reviews")
    ap.add_argument("--length", type=int, default=128, help="tokens per review, at most")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--dim", type=int, default=100, help="word2vec dimensions")
    ap.add_argument("--hidden", type=int, default=150, help="BiGRU width per direction")
    ap.add_argument("--lr", type=float, default=1e-3, help="the learning rate at batch 32")
    ap.add_argument("--lr-scaling", choices=("none", "sqrt"), default="sqrt",
                    help="sqrt: lr x sqrt(batch / 32) (Adam's usual rule for larger batches)")
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="BATCH:PRECISION[:LR] runs, in order (LR overrides the scaling)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="JSON file for the rows")
    return ap.parse_args(argv)


def load(args) -> Dict:
    """The split, the word vectors and the predictor, as the slice builds them (reduced)."""
    from glomo_pyg import PretrainedGraphPredictor
    from glomo_pyg.data import (
        WordVocabulary,
        embedding_matrix,
        read_aclimdb,
        tokenize,
        train_word_vectors,
    )
    from glomo_pyg.training.text_classification import encode_documents, split_train_validation

    predictor = PretrainedGraphPredictor.from_pretrained(args.predictor)
    labelled = read_aclimdb(os.path.join(args.data_dir, "aclImdb"), "train")
    part, held_out = split_train_validation(labelled, 2500, 0)  # the slice's split
    words, vectors = train_word_vectors([tokenize(r.text) for r in part], dim=args.dim,
                                        min_count=3, epochs=5, workers=args.threads, seed=0)
    embedding, coverage = embedding_matrix(predictor.vocabulary, words, vectors, seed=0)
    random.Random(args.seed).shuffle(part)  # which --train reviews: seeded
    vocab = WordVocabulary(predictor.vocabulary)

    def encode(reviews):
        return encode_documents([r.text for r in reviews], [r.label for r in reviews], vocab,
                                args.length)

    return dict(predictor=predictor, embedding=embedding, coverage=coverage,
                train=encode(part[:args.train]), val=encode(held_out[:args.val]))


def run(args) -> List[Dict]:
    from glomo_pyg import GlomoTextClassifier
    from glomo_pyg.training.text_classification import cache_documents, train_and_test

    torch.set_num_threads(args.threads)
    d = load(args)

    def model(seed: int):
        torch.manual_seed(seed)
        return GlomoTextClassifier(d["embedding"], predictor=d["predictor"],
                                   places=("embedding",), max_distance=args.max_distance,
                                   hidden_channels=args.hidden, rnn_layers=2)

    start = time.time()
    cache = cache_documents(model(args.seed), d["train"], d["val"])
    print(f"graph cache: {cache.nbytes / 2**20:.0f} MiB for "
          f"{len(d['train']) + len(d['val'])} reviews in {time.time() - start:.0f} s; "
          f"word vectors cover {d['coverage']:.1%} of the vocabulary", flush=True)
    print("| batch | precision | lr | best val acc % | val acc % per epoch | train loss per "
          "epoch | seconds |\n|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for config in args.configs.split(","):
        batch, precision, *lr = config.split(":")
        batch = int(batch)
        lr = float(lr[0]) if lr else args.lr * ((batch / 32) ** 0.5
                                                if args.lr_scaling == "sqrt" else 1.0)
        r = train_and_test(model(args.seed), d["train"], d["val"], d["val"],
                           epochs=args.epochs, batch_size=batch, lr=lr, seed=args.seed,
                           accelerator="cpu", precision=precision, graph_cache=cache)
        rows.append(dict(batch=batch, precision=precision, lr=lr, val_acc=r.val_acc,
                         best_epoch=r.best_epoch, val_history=r.val_history,
                         loss_history=r.loss_history, seconds=r.seconds))
        print(row_line(rows[-1]), flush=True)
        if args.out:  # after every run: a stopped comparison keeps what it measured
            with open(args.out, "w", encoding="utf-8") as fh:
                json.dump(dict(args=vars(args), rows=rows), fh, indent=1)
    return rows


def row_line(r: Dict) -> str:
    return (f"| {r['batch']} | {r['precision']} | {r['lr']:.2g} | {100 * r['val_acc']:.2f} | "
            f"{' / '.join(f'{100 * v:.2f}' for v in r['val_history'])} | "
            f"{' / '.join(f'{v:.3f}' for v in r['loss_history'])} | {r['seconds']:.0f} |")


def main(argv=None):
    args = parse_args(argv)
    print(f"{platform.processor() or platform.machine()}, {args.threads} threads, torch "
          f"{torch.__version__}; {args.train} / {args.val} reviews of <= {args.length} tokens, "
          f"{args.epochs} epochs, lr {args.lr:g} at batch 32 ({args.lr_scaling} scaling), "
          f"seed {args.seed}", flush=True)
    run(args)


if __name__ == "__main__":
    main()
