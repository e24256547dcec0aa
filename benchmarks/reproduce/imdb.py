"""Reproduce the IMDB rows of paper Tables 1-2, end to end, with one command.

    python -m benchmarks.reproduce.imdb --data-dir ~/.cache/glomo-data [--reduced]

``--data-dir`` holds ``aclImdb/`` in the official layout (build it with
``python ../shared/data/build.py imdb DIR``, or use the official download). Stages, each
cached in ``--output-dir`` (default ``runs/imdb-full`` / ``runs/imdb-reduced``) so an
interrupted reproduction continues where it stopped:

1. word vectors: word2vec trained on the unlabelled + training reviews (no test text),
   written in the GloVe text format: the "transfer feature only" features;
2. graph predictors: ``glomo pretrain`` on the same reviews, once with the default
   settings and once per ablation the chosen variants need (``no-sparse``,
   ``no-hierarchical``, ``no-sequence``, ``no-decouple``, ``no-unit-level``: the paper's
   ``-sparse`` ... rows);
3. downstream: ``GlomoTextClassifier`` (word vectors -> BiGRU -> self-attention ->
   pooling -> MLP) for every variant and seed; the epoch with the best accuracy on a
   held-out part of the 25k training reviews is evaluated once on the test reviews;
4. ``benchmarks/results/imdb.md``: mean ± std over seeds beside the paper's numbers.

``--reduced`` is the CPU configuration (about an hour on 2 cores): a smaller corpus,
model and vocabulary, reviews cut to 128 tokens, 4,000 training / 1,000 validation
reviews and a fixed random 5,000 of the 25,000 test reviews, variants baseline, GLoMo
and uniform graph. Its numbers are not a reproduction of the paper's; the full
configuration (the default, for a GPU) is.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time
from typing import Dict, List

import torch

# Paper Tables 1-2, IMDB test accuracy (%), GloVe features.
PAPER = {"baseline": 88.51, "glomo": 89.16, "uniform": 88.57, "no-sparse": 88.96,
         "no-hierarchical": 88.71, "no-unit-level": 88.49, "no-sequence": 88.96}
# What each variant changes: the predictor's pretraining (model settings) and where /
# which graphs the classifier uses. The paper's "-sparse" row is variant "no-sparse", etc.
ABLATIONS = {"no-sparse": dict(sparse=False), "no-hierarchical": dict(num_layers=1),
             "no-sequence": dict(context_length=1), "no-decouple": dict(decouple=False),
             "no-unit-level": dict(objective="sequence")}
VARIANTS = {
    "baseline": dict(predictor=None),
    "glomo": dict(predictor="default", places=("embedding",)),
    "glomo-rnn": dict(predictor="default", places=("rnn",)),
    "uniform": dict(predictor="default", places=("embedding",), graph="uniform"),
    **{name: dict(predictor=name, places=("embedding",)) for name in ABLATIONS},
}
LABELS = {"baseline": "feature only (word vectors)", "glomo": "GLoMo on embeddings",
          "glomo-rnn": "GLoMo on RNN states", "uniform": "uniform graph",
          **{name: f"GLoMo, predictor -{name[3:]}" for name in ABLATIONS}}


@dataclasses.dataclass
class Setup:
    """One configuration of the reproduction."""

    corpus_documents: int | None
    vocabulary: int
    pretrain_length: int
    model: Dict
    pretrain_steps: int
    pretrain_batch: int
    warmup: int
    vector_dim: int
    vector_epochs: int
    review_length: int
    train_reviews: int | None  # None: all 25k minus validation
    validation_reviews: int
    test_reviews: int | None  # None: all 25k
    hidden: int
    epochs: int
    batch_size: int
    lr: float
    variants: tuple
    seeds: int


FULL = Setup(corpus_documents=None, vocabulary=30000, pretrain_length=128,
             model=dict(hidden_channels=256, num_layers=3, heads=8, cnn_layers=4,
                        context_length=3, num_positions=20),
             pretrain_steps=20000, pretrain_batch=32, warmup=1000, vector_dim=300,
             vector_epochs=5, review_length=400, train_reviews=None, validation_reviews=2500,
             test_reviews=None, hidden=150, epochs=6, batch_size=32, lr=1e-3,
             variants=tuple(VARIANTS), seeds=5)
REDUCED = Setup(corpus_documents=20000, vocabulary=10000, pretrain_length=64,
                model=dict(hidden_channels=96, num_layers=2, heads=4, cnn_layers=2,
                           context_length=3, num_positions=10),
                pretrain_steps=800, pretrain_batch=32, warmup=100, vector_dim=100,
                vector_epochs=3, review_length=128, train_reviews=4000,
                validation_reviews=1000, test_reviews=5000, hidden=64, epochs=3,
                batch_size=32, lr=2e-3, variants=("baseline", "glomo", "uniform"), seeds=3)
# A seconds-long run over a tiny corpus: the test suite's end-to-end check of this script.
SMOKE = Setup(corpus_documents=None, vocabulary=200, pretrain_length=16,
              model=dict(hidden_channels=8, num_layers=1, heads=2, cnn_layers=1,
                         context_length=2, num_positions=2),
              pretrain_steps=2, pretrain_batch=4, warmup=1, vector_dim=4, vector_epochs=1,
              review_length=16, train_reviews=None, validation_reviews=2, test_reviews=None,
              hidden=4, epochs=1, batch_size=4, lr=1e-3,
              variants=("baseline", "glomo", "uniform"), seeds=2)


def log(*args):
    print(time.strftime("[%H:%M:%S]"), *args, flush=True)


def word_vectors(args, setup: Setup, out: str):
    from glomo_pyg.data import read_word_vectors, tokenize, train_word_vectors, write_word_vectors
    from glomo_pyg.training.text_pretraining import CorpusConfig, iter_documents

    path = os.path.join(out, "word_vectors.txt")
    if not os.path.exists(path):
        start = time.time()
        corpus = CorpusConfig(path=args.data_dir, format="aclimdb",
                              max_documents=setup.corpus_documents)
        docs = [tokenize(d) for d in iter_documents(corpus)]
        words, vectors = train_word_vectors(docs, dim=setup.vector_dim,
                                            min_count=1 if args.smoke else 3,
                                            epochs=setup.vector_epochs, workers=args.workers,
                                            seed=0)
        write_word_vectors(path, words, vectors)
        log(f"word vectors: {len(words)} x {setup.vector_dim} from {len(docs)} reviews "
            f"({time.time() - start:.0f} s)")
    return read_word_vectors(path)


def pretrain(args, setup: Setup, out: str, name: str):
    from glomo_pyg.training import PretrainConfig, run_pretraining

    folder = os.path.join(out, "pretrain", name)
    model = dict(setup.model, **ABLATIONS.get(name, {}))
    config = PretrainConfig.from_dict(dict(
        output_dir=folder,
        corpus=dict(path=args.data_dir, format="aclimdb", min_count=1 if args.smoke else 3,
                    max_size=setup.vocabulary, max_length=setup.pretrain_length,
                    max_documents=setup.corpus_documents,
                    min_length=4 if args.smoke else 8, validation_fraction=0.01),
        model=model,
        train=dict(batch_size=setup.pretrain_batch, max_steps=setup.pretrain_steps,
                   graph_warmup_steps=setup.warmup, lr=1e-3, checkpoint_every=200,
                   validate_every=max(200, setup.pretrain_steps // 4), log_every=20,
                   graph_stats_every=100, progress_bar=False, accelerator=args.accelerator)))
    summary_path = os.path.join(folder, "pretrain.json")
    if os.path.exists(summary_path):
        with open(summary_path) as fh:
            summary = json.load(fh)
        if summary.get("steps") == setup.pretrain_steps:
            return os.path.join(folder, "predictor"), summary
    log(f"pretraining predictor '{name}' ({setup.pretrain_steps} steps) in {folder}")
    summary = run_pretraining(config, resume=True, log=log)
    return os.path.join(folder, "predictor"), summary


def reviews(args, setup: Setup, vocabulary):
    from glomo_pyg.data import WordVocabulary, read_aclimdb
    from glomo_pyg.training.text_classification import encode_documents, split_train_validation

    vocab = WordVocabulary(vocabulary)
    train = read_aclimdb(args.data_dir, "train")
    test = read_aclimdb(args.data_dir, "test")
    encode = lambda rs: encode_documents([r.text for r in rs], [r.label for r in rs], vocab,
                                         setup.review_length)
    train_part, val_part = split_train_validation(train, setup.validation_reviews, seed=0)
    if setup.train_reviews is not None:
        train_part = train_part[:setup.train_reviews]
    if setup.test_reviews is not None:
        order = torch.randperm(len(test), generator=torch.Generator().manual_seed(1)).tolist()
        test = [test[k] for k in order[:setup.test_reviews]]
    return encode(train_part), encode(val_part), encode(test)


def graph_profile(predictor, data, reviews: int = 256) -> Dict[str, List[float]]:
    """Forward-graph statistics per layer on the first test reviews, for the predictor's
    graphs and for uniform graphs over the same reviews (the reference a learned graph
    should differ from): density, weight-averaged edge distance, and the weight the
    graphs put on the previous 1 and 2 units."""
    from torch_geometric.loader import DataLoader

    from glomo_pyg import LatentGraphs
    from glomo_pyg.training import graph_statistics

    sums: Dict[str, List[float]] = {}
    batches = 0
    with torch.no_grad():
        for batch in DataLoader(data[:reviews], batch_size=32):
            learned = predictor(batch.x, batch.batch).forward
            uniform = LatentGraphs.uniform(learned.ptr, num_layers=learned.num_layers,
                                           num_heads=learned.num_heads, direction="forward")
            for kind, graphs in (("learned", learned), ("uniform", uniform)):
                stats = graph_statistics(graphs)
                for l in range(graphs.num_layers):
                    ei, w, _ = graphs.layer(l)
                    dist = ei[1] - ei[0]
                    columns = max(1, int((graphs.lengths - 1).clamp(min=0).sum()) *
                                  graphs.num_heads)
                    for name, value in (
                            ("density", stats[f"layer{l}/density"]),
                            ("distance", stats[f"layer{l}/distance"]),
                            ("weight_prev1", float(w[dist == 1].sum()) / columns),
                            ("weight_prev2", float(w[dist <= 2].sum()) / columns)):
                        key = f"{kind}/{name}"
                        sums.setdefault(key, [0.0] * graphs.num_layers)[l] += value
            batches += 1
    return {k: [v / batches for v in vals] for k, vals in sums.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="folder holding aclImdb/")
    parser.add_argument("--reduced", action="store_true", help="the CPU configuration")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)  # tests only
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=None)
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--workers", type=int, default=2, help="word2vec threads")
    parser.add_argument("--results", default="benchmarks/results/imdb.md")
    args = parser.parse_args(argv)
    setup = dataclasses.replace(SMOKE if args.smoke else REDUCED if args.reduced else FULL)
    if args.seeds:
        setup.seeds = args.seeds
    if args.variants:
        setup.variants = tuple(args.variants)
    mode = "smoke" if args.smoke else "reduced" if args.reduced else "full"
    out = args.output_dir or f"runs/imdb-{mode}"
    os.makedirs(out, exist_ok=True)
    command = "python -m benchmarks.reproduce.imdb " + " ".join(sys.argv[1:] if argv is None
                                                                 else argv)
    start = time.time()
    words, vectors = word_vectors(args, setup, out)
    predictors, pretrain_summaries = {}, {}
    needed = sorted({VARIANTS[v]["predictor"] for v in setup.variants} - {None})
    for name in needed:
        predictors[name], pretrain_summaries[name] = pretrain(args, setup, out, name)
    from glomo_pyg import GlomoTextClassifier, PretrainedGraphPredictor
    from glomo_pyg.data import embedding_matrix
    from glomo_pyg.training.text_classification import train_and_test

    loaded = {name: PretrainedGraphPredictor.from_pretrained(path)
              for name, path in predictors.items()}
    vocabulary = next(iter(loaded.values())).vocabulary if loaded else None
    if vocabulary is None:
        raise SystemExit("the baseline alone needs a vocabulary: include a GLoMo variant")
    if any(p.vocabulary != vocabulary for p in loaded.values()):
        raise SystemExit("predictors were pretrained with different vocabularies")
    embedding, coverage = embedding_matrix(vocabulary, words, vectors, seed=0)
    train, val, test = reviews(args, setup, vocabulary)
    log(f"reviews: {len(train)} train / {len(val)} validation / {len(test)} test, cut to "
        f"{setup.review_length} tokens; word vectors cover {coverage:.1%} of the vocabulary")
    runs_path = os.path.join(out, "downstream.json")
    runs = json.load(open(runs_path)) if os.path.exists(runs_path) else {}
    for seed in range(setup.seeds):
        for variant in setup.variants:
            key = f"{variant}/{seed}"
            if key in runs:
                continue
            spec = dict(VARIANTS[variant])
            predictor = loaded.get(spec.pop("predictor"))
            torch.manual_seed(seed)
            model = GlomoTextClassifier(embedding, predictor=predictor, hidden_channels=setup.hidden,
                                        **spec)
            result = train_and_test(model, train, val, test, epochs=setup.epochs,
                                    batch_size=setup.batch_size, lr=setup.lr, seed=seed,
                                    accelerator=args.accelerator)
            runs[key] = dataclasses.asdict(result)
            log(f"{variant} seed {seed}: val {result.val_acc:.4f} (epoch {result.best_epoch}), "
                f"test {result.test_acc:.4f}, {result.seconds:.0f} s")
            with open(runs_path + ".tmp", "w") as fh:
                json.dump(runs, fh, indent=1)
            os.replace(runs_path + ".tmp", runs_path)
    profiles = {name: graph_profile(p, test) for name, p in loaded.items()}
    write_results(args, setup, command, runs, pretrain_summaries, profiles, coverage,
                  len(train), len(val), len(test), time.time() - start)


def write_results(args, setup, command, runs, pretrain_summaries, profiles, coverage,
                  n_train, n_val, n_test, seconds):
    from benchmarks.common import append_results, hardware

    device = "cuda" if args.accelerator != "cpu" and torch.cuda.is_available() else "cpu"
    kind = ("smoke test" if args.smoke else
            "reduced CPU configuration, not a reproduction" if args.reduced else
            "full configuration")
    lines = [f"\n## {datetime.date.today().isoformat()}: IMDB, {kind}", "",
             f"- command: `{command}`",
             f"- hardware: {hardware(device)}; torch {torch.__version__}",
             f"- total time: {seconds / 60:.0f} min (stages cached in the output folder are "
             "not re-run)"]
    for name, s in pretrain_summaries.items():
        lines.append(f"- predictor `{name}`: {s['steps']} steps on {s['tokens']:,} corpus tokens "
                     f"(training sequences), vocabulary {s['vocabulary']}, "
                     f"{s['seconds'] / 60:.1f} min, final validation loss {s['val_loss']:.3f}")
    lines += ["", "Forward graphs on the first 256 test reviews, per layer (learned / uniform "
              "over the same allowed sources): density; weight-averaged edge distance; share "
              "of each target's weight on the previous unit, and on the previous two units.", "",
              "| predictor | layer | density | distance | weight on t-1 | weight on t-1, t-2 |",
              "|---|---|---|---|---|---|"]
    for name, prof in profiles.items():
        for l in range(len(prof["learned/density"])):
            cell = lambda key: f"{prof['learned/' + key][l]:.3f} / {prof['uniform/' + key][l]:.3f}"
            lines.append(f"| `{name}` | {l} | {cell('density')} | {cell('distance')} | "
                         f"{cell('weight_prev1')} | {cell('weight_prev2')} |")
    lines.append("")
    lines += [f"- downstream: {n_train} training / {n_val} validation / {n_test} test reviews "
              f"(cut to {setup.review_length} tokens), {setup.epochs} epochs, best validation "
              f"epoch evaluated on test; word vectors {setup.vector_dim}-d word2vec, "
              f"{coverage:.1%} of the vocabulary covered", "",
              "| variant | test accuracy % (mean ± std) | seeds | paper | mean downstream s |",
              "|---|---|---|---|---|"]
    for variant in setup.variants:
        mine = [r for k, r in runs.items() if k.split("/")[0] == variant]
        if not mine:
            continue
        acc = torch.tensor([r["test_acc"] for r in mine], dtype=torch.float64) * 100
        std = float(acc.std()) if len(mine) > 1 else float("nan")
        paper = PAPER.get(variant)
        lines.append(f"| {LABELS[variant]} | {float(acc.mean()):.2f} ± {std:.2f} | {len(mine)} | "
                     f"{paper if paper is not None else '-'} | "
                     f"{sum(r['seconds'] for r in mine) / len(mine):.0f} |")
    lines.append("")
    print(append_results(args.results, lines))


if __name__ == "__main__":
    main()
