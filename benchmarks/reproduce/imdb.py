"""Reproduce the IMDB rows of paper Tables 1-2, end to end, with one command.

    python -m benchmarks.reproduce.imdb --data-dir ~/.cache/glomo-data [--reduced]

``--data-dir`` holds ``aclImdb/`` in the official layout (build it with
``python ../shared/data/build.py imdb DIR``, or use the official download). Stages, each
cached in ``--output-dir`` (default ``runs/imdb-full`` / ``runs/imdb-reduced``) so an
interrupted reproduction continues where it stopped:

1. word vectors: word2vec trained on the unlabelled + training reviews (no test text),
   written in the GloVe text format: the "transfer feature only" features;
2. graph predictors: ``glomo pretrain`` on the same reviews with the shipped
   configuration (``configs/imdb-cpu.yaml`` reduced, ``configs/imdb-gpu.yaml`` full), once
   as it is and once per ablation the chosen variants need (``no-sparse``,
   ``no-hierarchical``, ``no-sequence``, ``no-decouple``, ``no-unit-level``: the paper's
   ``-sparse`` ... rows); ``--predictor DIR`` uses an already trained predictor instead;
3. TF-IDF baseline (``tfidf.json``): word 1-2-gram TF-IDF + logistic regression on the
   same training reviews, cut to the same number of the project's tokens; C chosen on the
   same validation reviews, evaluated once on the same test reviews: the score a user
   would get without any neural model;
4. downstream (``downstream.json``, one entry per ``variant/seed/lr=...``, beside the
   settings and input digests (word vectors, vocabulary) they were made with: a cache
   made with others is refused, not reported under the new settings. Each run also
   records what its variant reads from the predictor (the weights for learned graphs,
   the graphs' shape for uniform ones, the architecture for untrained ones, nothing for
   the baseline): a new ``--predictor`` retrains only the runs that depend on it):
   ``GlomoTextClassifier`` (word vectors -> BiGRU -> self-attention -> pooling -> MLP;
   ``--rnn-layers 0``: no BiGRU, so word order reaches the model only through graphs;
   ``--max-distance N``: graphs keep only edges of at most N units, see
   :meth:`glomo_pyg.LatentGraphs.within`; ``--mixing conditioned``: mixture weights per
   word, from its features, instead of one free weight per graph component; every run
   that mixes graphs records the mixture weights it learned, see :func:`mixture_weights`).
   Per variant, seed 0 is trained at every learning rate of the grid (``--lrs``) and only
   validated; the rate with the best validation accuracy is kept, seed 0's model at that
   rate is evaluated once on the test reviews, and the other seeds are trained at that
   rate. With ``--lr-seeds N`` seeds 0 .. N-1 are each trained at every rate, the rate
   with the best mean validation accuracy over them is kept, and their models at that
   rate are evaluated on test: one seed's validation can choose a rate that is worse on
   the others (run 13 in ``benchmarks/results/imdb.md``). ``--seeds N`` reports seeds
   0 .. N-1; with ``--first-seed K`` seeds K .. K+N-1 (the rate is still chosen on the
   search seeds above, so a block from K = ``--lr-seeds`` on is disjoint from that
   choice: fresh seeds fixed before they run, as in run 18). In every run the epoch with
   the best accuracy on a held-out part of the 25k training reviews is the one evaluated
   on test;
5. ``benchmarks/results/imdb.md``: mean ± std over seeds beside the TF-IDF baseline and
   the paper's numbers, the validation accuracy behind each learning-rate choice, and
   paired differences per seed (every variant - baseline; GLoMo on embeddings and on
   RNN states - uniform graph, and - untrained graphs when variant ``untrained``, the
   same predictor at its initial weights, runs, - adjacent-word graphs when variant
   ``adjacent`` runs; each ablation - GLoMo on embeddings) with 95% Student-t confidence
   intervals: all variants use the same seeds, so the seed-to-seed variation they share
   cancels in the difference.

``--reduced`` is the CPU configuration: the CPU pretraining recipe, 100-d word vectors,
reviews cut to 128 tokens, 4,000 training / 1,000 validation reviews and a fixed random
5,000 of the 25,000 test reviews, 6 epochs, learning rates 1e-3 and 2e-3, variants
baseline, GLoMo and uniform graph, 5 seeds. On 2 cores its downstream runs took 85 min
as two processes of 1 thread each (run 5 in ``benchmarks/results/imdb.md``), plus about
25 min of pretraining unless ``--predictor`` is given. Its numbers are not a
reproduction of the paper's; the full configuration (the default, for a GPU) is.

Every option, the ``--predictor`` and the reviews are checked before the long stages;
bad input and damaged caches stop with one line naming them (``GLOMO_TRACEBACK=1``
shows the traceback).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import pickle  # (only its error type: checkpoints are loaded with weights_only=True)
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from benchmarks.common import (
    as_script,
    cached_runs,
    check_common_arguments,
    file_digest,
    read_cache,
    run_reporting_errors,
    text_digest,
    write_runs,
)
from benchmarks.statistics import mean_sd, paired_difference
from glomo_pyg.nn.mixer import MIXINGS

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "configs")
# Paper Tables 1-2, IMDB test accuracy (%), GloVe features.
PAPER = {"baseline": 88.51, "glomo": 89.16, "uniform": 88.57, "no-sparse": 88.96,
         "no-hierarchical": 88.71, "no-unit-level": 88.49, "no-sequence": 88.96}
# What each variant changes: the predictor's pretraining (model settings) and where /
# which graphs the classifier uses. The paper's "-sparse" row is variant "no-sparse", etc.
# (keep_alive is for squared-ReLU graphs of a separate predictor: off where those go.)
ABLATIONS = {"no-sparse": dict(sparse=False, keep_alive=0.0), "no-hierarchical": dict(num_layers=1),
             "no-sequence": dict(context_length=1),
             "no-decouple": dict(decouple=False, keep_alive=0.0),
             "no-unit-level": dict(objective="sequence")}
VARIANTS = {
    "baseline": dict(predictor=None),
    "glomo": dict(predictor="default", places=("embedding",)),
    "glomo-rnn": dict(predictor="default", places=("rnn",)),
    "uniform": dict(predictor="default", places=("embedding",), graph="uniform"),
    # graphs of the neighbouring word (chained: the nearest L words): do the learned
    # graphs transfer more than locality? (not in the paper)
    "adjacent": dict(predictor="default", places=("embedding",), graph="adjacent"),
    # the same predictor with its initial weights: do the pretrained graphs beat graphs of
    # the same architecture that never learned? (not in the paper)
    "untrained": dict(predictor="default", places=("embedding",), weights="untrained"),
    **{name: dict(predictor=name, places=("embedding",)) for name in ABLATIONS},
}
LABELS = {"baseline": "feature only (word vectors)", "glomo": "GLoMo on embeddings",
          "glomo-rnn": "GLoMo on RNN states", "uniform": "uniform graph",
          "adjacent": "adjacent-word graph",
          "untrained": "untrained graphs",
          **{name: f"GLoMo, predictor -{name[3:]}" for name in ABLATIONS}}
# torch seed of the untrained predictor's initial weights (as `glomo syntax`'s baseline)
UNTRAINED_SEED = 0
TFIDF_LABEL = "TF-IDF (1-2-gram) + logistic regression"
# inverse regularisation strengths tried on validation
TFIDF_CS = (0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
@dataclasses.dataclass
class Setup:
    """One configuration of the reproduction."""

    corpus_documents: int | None  # word vectors: the first N of the unlabelled + training
    # reviews (in the even unsup/pos/neg spread of `glomo pretrain`); None: all 75,000
    vector_dim: int
    vector_epochs: int
    review_length: int
    train_reviews: int | None  # None: all 25k minus validation
    validation_reviews: int
    test_reviews: int | None  # None: all 25k
    hidden: int
    epochs: int
    batch_size: int
    lrs: tuple  # learning rates tried with seed 0 of each variant, chosen on validation
    variants: tuple
    seeds: int
    rnn_layers: int = 2  # of the classifier; 0: none, word order only through graphs
    # longest edge kept in the graphs (None: all): a predictor with a learned distance
    # term pretrained on shorter windows than the reviews has no scores it learned beyond
    max_distance: Optional[int] = None
    # the mixture weights over graph components (GraphMixer): 'free' logits (ELMo's
    # ScalarMix) or 'conditioned' on each word's features (the reference implementation)
    mixing: str = "free"
    # seeds 0 .. lr_seeds - 1 are each trained at every rate; the best mean validation
    # accuracy over them chooses the rate (1: seed 0 alone, the default)
    lr_seeds: int = 1
    # the reported seeds are first_seed .. first_seed + seeds - 1 (--first-seed): a block
    # from lr_seeds on is disjoint from the rate search, e.g. fresh seeds fixed in advance
    first_seed: int = 0
    # pretraining: a `glomo pretrain` configuration in configs/, or (the smoke test only)
    # the settings below
    config: Optional[str] = None
    vocabulary: int = 0
    pretrain_length: int = 0
    model: Optional[Dict] = None
    pretrain_steps: int = 0
    pretrain_batch: int = 0
    warmup: int = 0


FULL = Setup(config="imdb-gpu.yaml", corpus_documents=None, vector_dim=300, vector_epochs=5,
             review_length=400, train_reviews=None, validation_reviews=2500, test_reviews=None,
             hidden=150, epochs=6, batch_size=32, lrs=(5e-4, 1e-3, 2e-3),
             variants=tuple(VARIANTS), seeds=5)
# Word vectors from all 75k reviews (about 2 min of word2vec on 2 cores): with the 20k
# reviews of the pretraining corpus and 3 epochs the feature-only baseline stayed below
# TF-IDF (validation 77.9% against 80.3% in run 4 of benchmarks/results/imdb.md).
# 6 epochs: at 3, 11 of run 3's 15 final runs chose their last epoch. Rates: the grid of
# runs 3-5; the learned- and uniform-graph models already failed some seeds at 2e-3.
REDUCED = Setup(config="imdb-cpu.yaml", corpus_documents=None, vector_dim=100,
                vector_epochs=5, review_length=128, train_reviews=4000,
                validation_reviews=1000, test_reviews=5000, hidden=64, epochs=6,
                batch_size=32, lrs=(1e-3, 2e-3), variants=("baseline", "glomo", "uniform"),
                seeds=5)
# A seconds-long run over a tiny corpus: the test suite's end-to-end check of this script.
SMOKE = Setup(corpus_documents=None, vocabulary=200, pretrain_length=16,
              model=dict(hidden_channels=8, num_layers=1, heads=2, cnn_layers=1,
                         context_length=2, num_positions=2),
              pretrain_steps=2, pretrain_batch=4, warmup=1, vector_dim=4, vector_epochs=1,
              review_length=16, train_reviews=None, validation_reviews=2, test_reviews=None,
              hidden=4, epochs=1, batch_size=4, lrs=(1e-3, 1e-2),
              variants=("baseline", "glomo", "uniform"), seeds=2)


def log(*args):
    print(time.strftime("[%H:%M:%S]"), *args, flush=True)


RUN_FIELDS = {"val_acc": float, "best_epoch": int, "seconds": float, "lr": float}


def check_runs(runs: Dict, path: str) -> None:
    """Every cached run entry holds the fields the tables read."""
    for key, entry in runs.items():
        ok = isinstance(entry, dict) and all(
            isinstance(entry.get(f), (int, float)) and not isinstance(entry.get(f), bool)
            for f in RUN_FIELDS) and (entry.get("test_acc") is None or
                                      isinstance(entry.get("test_acc"), (int, float)))
        if ok and "mixture" in entry and not valid_mixture(entry["mixture"]):
            raise ValueError(f"{path}: run {key!r} has a damaged mixture record; delete the "
                             "file to recompute")
        if not ok:
            raise ValueError(f"{path}: run {key!r} is damaged (needs {sorted(RUN_FIELDS)} and "
                             "test_acc); delete the file to recompute")


def check_arguments(args) -> None:
    """Every option checked before any work (word vectors and pretraining take long)."""
    check_common_arguments(args, (args.results,))
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    if args.lrs is not None:
        bad = [lr for lr in args.lrs if not math.isfinite(lr) or lr <= 0]
        if bad:
            raise ValueError(f"--lrs must be finite positive numbers, got {bad}")
        keys = [f"{lr:g}" for lr in args.lrs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"--lrs holds rates that are equal to 6 digits ({keys}); runs are "
                             "cached by that key")
    if getattr(args, "lr_seeds", None) is not None and args.lr_seeds < 1:
        raise ValueError(f"--lr-seeds must be >= 1, got {args.lr_seeds}")
    if getattr(args, "first_seed", None) is not None and args.first_seed < 0:
        raise ValueError(f"--first-seed must be >= 0, got {args.first_seed}")
    if getattr(args, "rnn_layers", None) is not None and args.rnn_layers < 0:
        raise ValueError(f"--rnn-layers must be >= 0, got {args.rnn_layers}")
    if getattr(args, "max_distance", None) is not None and args.max_distance < 1:
        raise ValueError(f"--max-distance must be >= 1 (units), got {args.max_distance}")


def word_vectors(args, setup: Setup, out: str):
    from glomo_pyg.data import read_word_vectors, tokenize, train_word_vectors, write_word_vectors
    from glomo_pyg.training.pretrain.config import CorpusConfig
    from glomo_pyg.training.pretrain.corpus import iter_documents

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
    words, vectors = read_word_vectors(path)
    if vectors.shape[1] != setup.vector_dim:
        raise ValueError(f"{path} holds {vectors.shape[1]}-d vectors, this configuration uses "
                         f"{setup.vector_dim}-d ones; delete it or use another --output-dir")
    return words, vectors


def pretrain_settings(args, setup: Setup, folder: str, name: str) -> Dict:
    """``glomo pretrain`` settings of predictor ``name``: the shipped configuration
    (``configs/imdb-cpu.yaml`` reduced, ``configs/imdb-gpu.yaml`` full) with the
    ablation's model switches, or the smoke test's tiny settings."""
    if setup.config is None:
        return dict(
            output_dir=folder,
            corpus=dict(path=args.data_dir, format="aclimdb", min_count=1,
                        max_size=setup.vocabulary, max_length=setup.pretrain_length,
                        max_documents=setup.corpus_documents, min_length=4,
                        validation_fraction=0.01),
            model=dict(setup.model, **ABLATIONS.get(name, {})),
            train=dict(batch_size=setup.pretrain_batch, max_steps=setup.pretrain_steps,
                       graph_warmup_steps=setup.warmup, lr=1e-3, checkpoint_every=200,
                       validate_every=max(200, setup.pretrain_steps // 4), log_every=20,
                       graph_stats_every=100, progress_bar=False, accelerator=args.accelerator))
    import yaml

    with open(os.path.join(CONFIGS, setup.config)) as fh:
        data = yaml.safe_load(fh)
    data["output_dir"] = folder
    data["corpus"]["path"] = args.data_dir
    data["model"].update(ABLATIONS.get(name, {}))
    data["train"].update(accelerator=args.accelerator, progress_bar=False)
    return data


def pretrain(args, setup: Setup, out: str, name: str):
    from glomo_pyg.logs import lines_to, logging_to
    from glomo_pyg.training import PretrainConfig, run_pretraining

    folder = os.path.join(out, "pretrain", name)
    config = PretrainConfig.from_dict(pretrain_settings(args, setup, folder, name))
    steps = config.train.max_steps
    summary_path = os.path.join(folder, "pretrain.json")
    if os.path.exists(summary_path):
        summary = read_cache(summary_path, "pretraining summary")
        if summary.get("steps") == steps:
            return os.path.join(folder, "predictor"), summary
    log(f"pretraining predictor '{name}' ({steps} steps) in {folder}")
    with logging_to(lines_to(log), propagate=False):  # (the library's lines, as log's)
        summary = run_pretraining(config, resume=True)
    return os.path.join(folder, "predictor"), summary


def review_splits(args, setup: Setup) -> Tuple[List, List, List]:
    """The training, validation and test reviews (``Review`` records) every model uses."""
    from glomo_pyg.data import read_aclimdb
    from glomo_pyg.training.text_classification import split_train_validation

    train = read_aclimdb(args.data_dir, "train")
    test = read_aclimdb(args.data_dir, "test")
    for name, items in (("train", train), ("test", test)):
        if {r.label for r in items} != {0, 1}:
            raise ValueError(f"{args.data_dir}: the {name} reviews must hold both labels "
                             f"(found {len(items)} reviews, labels "
                             f"{sorted({r.label for r in items})})")
    train_part, val_part = split_train_validation(train, setup.validation_reviews, seed=0)
    if setup.train_reviews is not None:
        train_part = train_part[:setup.train_reviews]
    if setup.test_reviews is not None:
        order = torch.randperm(len(test), generator=torch.Generator().manual_seed(1)).tolist()
        test = [test[k] for k in order[:setup.test_reviews]]
    return train_part, val_part, test


def reviews(splits, setup: Setup, vocabulary):
    from glomo_pyg.data import WordVocabulary
    from glomo_pyg.training.text_classification import encode_documents

    vocab = WordVocabulary(vocabulary)
    return tuple(encode_documents([r.text for r in rs], [r.label for r in rs], vocab,
                                  setup.review_length) for rs in splits)


def tfidf_baseline(train: Tuple[Sequence[str], Sequence[int]],
                   val: Tuple[Sequence[str], Sequence[int]],
                   test: Tuple[Sequence[str], Sequence[int]], max_length: int | None = None,
                   cs: Sequence[float] = TFIDF_CS, min_df: int = 2) -> Dict:
    """Word 1-2-gram TF-IDF + logistic regression, the non-neural baseline: fitted on
    ``train`` (texts, labels) once per C in ``cs``, the C with the best accuracy on ``val``
    kept (the first on ties) and evaluated once on ``test``. Texts are cut to their first
    ``max_length`` tokens of :func:`glomo_pyg.data.tokenize`, the tokens the neural models
    see. Returns ``C``, ``val_acc``, ``test_acc``, ``val_by_C`` ([C, accuracy] pairs),
    ``features`` and ``seconds``."""
    import numpy as np
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    from glomo_pyg.data import tokenize

    start = time.time()
    # the project's tokens joined by spaces and split on whitespace again: no second
    # tokenizer decides what a word is (tokenize already lower-cases)
    def cut(texts):
        return [" ".join(tokenize(t)[:max_length]) for t in texts]

    vectorizer = TfidfVectorizer(ngram_range=(1, 2), token_pattern=r"\S+", lowercase=False,
                                 min_df=min_df, sublinear_tf=True, dtype=np.float32)
    x_train = vectorizer.fit_transform(cut(train[0]))
    x_val = vectorizer.transform(cut(val[0]))
    fitted, val_by_c = {}, {}
    for c in cs:
        fitted[c] = LogisticRegression(C=c, solver="liblinear", max_iter=1000).fit(
            x_train, list(train[1]))
        val_by_c[c] = float(fitted[c].score(x_val, list(val[1])))
    best = max(cs, key=val_by_c.get)
    test_acc = float(fitted[best].score(vectorizer.transform(cut(test[0])), list(test[1])))
    return dict(C=best, val_acc=val_by_c[best], test_acc=test_acc,
                val_by_C=[[c, val_by_c[c]] for c in cs], features=len(vectorizer.vocabulary_),
                seconds=time.time() - start)


def tfidf(setup: Setup, out: str, splits) -> Dict:
    """:func:`tfidf_baseline` on the reproduction's reviews, cached in ``tfidf.json``."""
    path = os.path.join(out, "tfidf.json")
    config = dict(cs=list(TFIDF_CS), review_length=setup.review_length,
                  reviews=[len(rs) for rs in splits])
    if os.path.exists(path):
        result = read_cache(path, "TF-IDF baseline")
        if result.get("config") == config:
            return result
    pairs = [([r.text for r in rs], [r.label for r in rs]) for rs in splits]
    result = dict(tfidf_baseline(*pairs, max_length=setup.review_length), config=config)
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    return result


def comparisons(variants: Sequence[str]) -> List[Tuple[str, str]]:
    """The paired comparisons reported, as ``(variant, reference)``: every variant
    against the feature-only baseline, and each learned graph (GLoMo on embeddings, on
    RNN states) against the uniform graph (which mixes the embeddings), the adjacent-word
    graph and the untrained predictor's graphs, when those run; and each ablation against
    GLoMo on embeddings, the setting it ablates (paper Table 2), when that runs."""
    pairs = [(v, "baseline") for v in variants if v != "baseline"]
    for reference in ("uniform", "adjacent", "untrained"):
        if reference in variants:
            pairs += [(v, reference) for v in ("glomo", "glomo-rnn") if v in variants]
    if "glomo" in variants:
        pairs += [(v, "glomo") for v in variants if v in ABLATIONS]
    return pairs


def reported_seeds(setup: Setup) -> range:
    """The seeds whose test accuracies are reported (``--first-seed``, ``--seeds``)."""
    return range(setup.first_seed, setup.first_seed + setup.seeds)


def run_key(variant: str, seed: int, lr: float) -> str:
    return f"{variant}/{seed}/lr={lr:g}"


def run_inputs(variant: str, predictors: Dict[str, str], loaded: Dict,
               max_distance: Optional[int] = None, mixing: str = "free") -> Dict[str, object]:
    """What a run of ``variant`` reads from its predictor, as digests: the weights file
    for learned graphs; for uniform and adjacent-word graphs only what shapes them
    (directions, layers, heads, self-loops: the predictor is never run); for untrained graphs the
    architecture (the saved config) and the seed of the initial weights; nothing for the
    feature-only baseline. A new predictor therefore retrains only the runs that depend
    on it. ``max_distance`` (``--max-distance``), when set, is recorded for every variant
    whose graphs it shortens (not the adjacent-word graphs: their edges span 1 unit).
    ``mixing`` (``--mixing``), when not the default ``'free'``, is recorded for every
    variant that mixes graphs, so runs cached before the option stay valid."""
    found = _predictor_inputs(variant, predictors, loaded)
    if max_distance is not None and found and VARIANTS[variant].get("graph") != "adjacent":
        found["max_distance"] = max_distance
    if mixing != "free" and found:
        found["mixing"] = mixing
    return found


def _predictor_inputs(variant: str, predictors: Dict[str, str], loaded: Dict) -> Dict:
    name = VARIANTS[variant]["predictor"]
    if name is None:
        return {}
    if VARIANTS[variant].get("weights") == "untrained":  # the architecture, not weights
        with open(os.path.join(predictors[name], "config.json")) as fh:  # checked on load
            directions = json.load(fh)["directions"]  # (the file also names the weights)
        return {"untrained_graphs": text_digest(json.dumps(
            dict(directions=directions, seed=UNTRAINED_SEED), sort_keys=True))}
    kind = VARIANTS[variant].get("graph")
    if kind in ("uniform", "adjacent"):
        p = loaded[name]
        shape = dict(directions=list(p.directions), num_layers=p.num_layers, heads=p.heads,
                     include_self=p.include_self)
        return {f"{kind}_graphs": text_digest(json.dumps(shape, sort_keys=True))}
    return {"weights": file_digest(os.path.join(predictors[name], "model.safetensors"))}


def stale_runs(runs: Dict, inputs: Dict[str, Dict[str, str]]) -> Dict[str, int]:
    """Drop from ``runs`` the runs of the variants in ``inputs`` that were made with other
    predictor inputs; returns how many were dropped, by variant. Runs that record no
    inputs (caches written before runs recorded them) stay, unless ``--max-distance`` or
    ``--mixing`` asks for other graphs than those caches were made with; runs of other
    variants stay."""
    dropped: Dict[str, int] = {}
    for key in list(runs):
        variant = key.split("/", 1)[0]
        recorded = runs[key].get("inputs") if isinstance(runs[key], dict) else None
        if variant not in inputs:
            continue
        if recorded != inputs[variant] and (
                recorded is not None or {"max_distance", "mixing"} & set(inputs[variant])):
            del runs[key]
            dropped[variant] = dropped.get(variant, 0) + 1
    return dropped


def upgrade_cache(path: str, settings: Dict, predictors: Dict[str, str], loaded: Dict,
                  log=print) -> None:
    """Rewrite a ``downstream.json`` of the earlier format, whose settings held the digests
    of every predictor's weights, in the current one when those are the predictors used
    now: each run then records the inputs its variant reads. Caches made with other
    predictors are left as they are (and refused, naming ``predictors``)."""
    if not os.path.exists(path):
        return
    cached = read_cache(path, "cached runs")
    old = cached.get("settings")
    if not isinstance(old, dict) or "predictors" not in old or \
            not isinstance(cached.get("runs"), dict):
        return
    digests = {name: file_digest(os.path.join(folder, "model.safetensors"))
               for name, folder in sorted(predictors.items())}
    if old["predictors"] != digests or \
            {k: v for k, v in old.items() if k != "predictors"} != \
            {k: v for k, v in settings.items() if k != "vocabulary"}:
        return
    runs = {}
    for key, entry in cached["runs"].items():
        variant = key.split("/", 1)[0]
        if isinstance(entry, dict) and variant in VARIANTS and \
                VARIANTS[variant]["predictor"] in (None, *predictors):
            entry = dict(entry, inputs=run_inputs(variant, predictors, loaded))
        runs[key] = entry
    write_runs(path, settings, runs)
    log(f"{path}: upgraded to per-run predictor inputs ({len(runs)} runs kept)")


def trainable_state(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """The state that training changes: everything but the frozen parameters (word
    vectors, predictor), which are rebuilt identically, so a checkpoint stays small."""
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    return {k: v.detach().cpu() for k, v in model.state_dict().items() if k not in frozen}


def evaluate_accuracy(model: torch.nn.Module, data, batch_size: int, accelerator: str) -> float:
    """Accuracy of ``model`` (eval mode) on ``data``."""
    from torch_geometric.loader import DataLoader

    device = "cuda" if accelerator != "cpu" and torch.cuda.is_available() else "cpu"
    model = model.to(device).eval()
    correct = total = 0
    with torch.no_grad():
        for batch in DataLoader(data, batch_size=batch_size):
            batch = batch.to(device)
            correct += int((model(batch.x, batch.batch).argmax(-1) == batch.y).sum())
            total += int(batch.num_graphs)
    model.cpu()
    return correct / total


def mixture_weights(model: torch.nn.Module, data, reviews: int = 256
                    ) -> Dict[str, Dict[str, Dict[str, object]]]:
    """What a trained classifier's graph mixtures learned, per graph place (``embedding``,
    ``rnn``) and direction, over the words of the first ``reviews`` reviews of ``data``:
    ``weights``, the mean weight on each graph component (``GraphMixer.components()``
    order); ``largest`` and ``effective``, the mean over words of each word's largest weight
    and of its effective number of components ``exp(entropy)``. Free weights are the same
    for every word; conditioned ones are computed from the features each mixer reads in a
    forward pass in eval mode (captured by a pre-hook on each ``GlomoTransfer``), as at test
    time. Per-word ``effective`` near K (the number of components) means no preference
    between the graphs; near 1, one component per word."""
    from torch_geometric.loader import DataLoader

    places = {place: transfer for place, transfer in
              (("embedding", getattr(model, "glomo_embedding", None)),
               ("rnn", getattr(model, "glomo_rnn", None))) if transfer is not None}
    if not places:
        return {}
    features: Dict[str, torch.Tensor] = {}
    hooks = [transfer.register_forward_pre_hook(
        lambda module, args, kwargs, place=place: features.__setitem__(
            place, args[0] if args else kwargs["h"]), with_kwargs=True)
        for place, transfer in places.items()]
    sums: Dict[str, List[torch.Tensor]] = {}
    words = 0
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for batch in DataLoader(data[:reviews], batch_size=32):
                features.clear()
                model(batch.x.to(device), batch.batch.to(device))
                for place, transfer in places.items():
                    w = transfer.mixer.mixture_weights(features[place]).double()
                    if w.dim() == 2:  # free: one set for every word
                        w = w.unsqueeze(1).expand(-1, features[place].size(0), -1)
                    entropy = -(w * w.clamp(min=1e-300).log()).sum(-1)  # [D, N]
                    parts = (w.sum(1), w.amax(-1).sum(1), entropy.exp().sum(1))
                    sums[place] = [a + b for a, b in zip(sums[place], parts)] \
                        if place in sums else list(parts)
                words += batch.x.numel()
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    return {place: {direction: dict(weights=(weights[d] / words).tolist(),
                                    largest=float(largest[d] / words),
                                    effective=float(effective[d] / words))
                    for d, direction in enumerate(places[place].mixer.directions)}
            for place, (weights, largest, effective) in sums.items()}


def mixture_summary(weights: Sequence[float]) -> Tuple[List[int], float, float]:
    """The components holding the largest weight (every one within 1e-6 of it: components
    that propagate alike, such as ``('graph', 0, h)`` and ``('hierarchical', 0, h)``, or
    the heads of uniform graphs, keep equal free weights), that weight, and the effective
    number of components ``exp(entropy)`` (K for equal weights, 1 for one component)."""
    w = torch.tensor(weights, dtype=torch.float64)
    top = float(w.max())
    entropy = float(-(w * w.clamp(min=1e-300).log()).sum())
    return (w >= top - 1e-6).nonzero().flatten().tolist(), top, math.exp(entropy)


def valid_mixture(record) -> bool:
    """A run's ``mixture`` record as :func:`mixture_weights` writes it."""
    def number(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    if not isinstance(record, dict):
        return False
    for directions in record.values():
        if not isinstance(directions, dict) or not directions:
            return False
        for entry in directions.values():
            if not isinstance(entry, dict) or not number(entry.get("largest")) or \
                    not number(entry.get("effective")):
                return False
            weights = entry.get("weights")
            if not isinstance(weights, list) or not weights or \
                    not all(number(x) for x in weights):
                return False
    return True


def graph_profile(predictor, data, reviews: int = 256,
                  max_distance: Optional[int] = None) -> Dict[str, List[float]]:
    """Forward-graph statistics per layer on the first test reviews, for the predictor's
    graphs and for uniform graphs over the same reviews (the reference a learned graph
    should differ from): density, weight-averaged edge distance, and the weight the
    graphs put on the previous 1 and 2 units; with ``max_distance``, of both graphs
    within that window, as the classifiers use them."""
    from torch_geometric.loader import DataLoader

    from glomo_pyg import LatentGraphs
    from glomo_pyg.analysis import graph_statistics

    sums: Dict[str, List[float]] = {}
    batches = 0
    with torch.no_grad():
        for batch in DataLoader(data[:reviews], batch_size=32):
            learned = predictor(batch.x, batch.batch).forward
            uniform = LatentGraphs.uniform(learned.ptr, num_layers=learned.num_layers,
                                           num_heads=learned.num_heads, direction="forward")
            if max_distance is not None:
                learned, uniform = learned.within(max_distance), uniform.within(max_distance)
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
    parser.add_argument("--epochs", type=int, default=None,
                        help="downstream epochs (the best validation epoch is kept)")
    parser.add_argument("--lrs", type=float, nargs="+", default=None,
                        help="learning rates tried with seed 0 (and the other --lr-seeds), "
                             "chosen on validation")
    parser.add_argument("--lr-seeds", type=int, default=None,
                        help="choose each variant's rate on the mean validation accuracy of "
                             "seeds 0 .. N-1, each trained at every rate (default 1: seed 0 "
                             "alone; one seed's validation can pick a rate that is worse on "
                             "the others)")
    parser.add_argument("--first-seed", type=int, default=None,
                        help="report seeds K .. K + --seeds - 1 (default 0). The learning "
                             "rate is still chosen on seeds 0 .. --lr-seeds - 1, so from "
                             "K = --lr-seeds on the reported seeds are disjoint from that "
                             "choice: a block of fresh seeds fixed in advance")
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=None)
    parser.add_argument("--rnn-layers", type=int, default=None,
                        help="recurrent layers of the classifier (default 2); 0: none, the "
                             "model then reads word order only through the graphs")
    parser.add_argument("--max-distance", type=int, default=None,
                        help="keep only graph edges of at most this many units, e.g. the "
                             "predictor's pretraining window - 1 (63 for configs/imdb-cpu.yaml):"
                             " beyond it a learned distance term was never trained")
    parser.add_argument("--mixing", choices=MIXINGS, default=None,
                        help="mixture weights over the graph components: 'free' (default: "
                             "one learned weight per component) or 'conditioned' on each "
                             "word's features (the reference implementation)")
    parser.add_argument("--predictor", default=None,
                        help="use this saved predictor (e.g. runs/imdb-cpu/predictor from "
                             "glomo pretrain --config configs/imdb-cpu.yaml) as the 'default' "
                             "predictor instead of pretraining one")
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--workers", type=int, default=2, help="word2vec threads")
    parser.add_argument("--results", default="benchmarks/results/imdb.md")
    args = parser.parse_args(argv)
    run_reporting_errors("benchmarks.reproduce.imdb", run, args, argv)


def setup_for(args) -> Setup:
    """The configuration ``args`` pick (smoke, reduced or full) with their overrides."""
    setup = dataclasses.replace(SMOKE if args.smoke else REDUCED if args.reduced else FULL)
    check_arguments(args)
    if args.seeds is not None:
        setup.seeds = args.seeds
    if args.epochs is not None:
        setup.epochs = args.epochs
    if args.lrs:
        setup.lrs = tuple(args.lrs)
    if getattr(args, "lr_seeds", None) is not None:
        setup.lr_seeds = args.lr_seeds
    if getattr(args, "first_seed", None) is not None:
        setup.first_seed = args.first_seed
    from lightning.fabric.utilities.seed import max_seed_value

    if setup.first_seed + setup.seeds - 1 > max_seed_value:
        raise ValueError(f"--first-seed {setup.first_seed} with --seeds {setup.seeds} goes "
                         f"past seed {max_seed_value}, the largest Lightning's seed_everything "
                         "takes")
    if setup.first_seed == 0 and setup.lr_seeds > setup.seeds:
        raise ValueError(f"--lr-seeds ({setup.lr_seeds}) must be at most --seeds "
                         f"({setup.seeds}): the rate is chosen on seeds that are then reported")
    if args.variants:
        setup.variants = tuple(dict.fromkeys(args.variants))  # each once, in order
    if args.rnn_layers is not None:
        setup.rnn_layers = args.rnn_layers
    if getattr(args, "max_distance", None) is not None:
        setup.max_distance = args.max_distance
    if getattr(args, "mixing", None) is not None:
        setup.mixing = args.mixing
    if setup.rnn_layers < 2 and "glomo-rnn" in setup.variants:
        raise ValueError(f"variant glomo-rnn puts graphs after the first of at least 2 RNN "
                         f"layers; --rnn-layers is {setup.rnn_layers} (choose --variants "
                         "without it)")
    return setup


def given_predictor(args):
    """The predictor of ``--predictor`` (checked before the long stages), or None."""
    from glomo_pyg import PretrainedGraphPredictor

    if not args.predictor:
        return None
    given = PretrainedGraphPredictor.from_pretrained(args.predictor)
    if given.vocabulary is None:
        raise ValueError(f"--predictor {args.predictor} reads pixels or features, not "
                         "words: IMDB needs a text predictor (glomo pretrain on text)")
    return given


def load_predictors(args, setup: Setup, out: str, given) -> Tuple:
    """The predictors the variants need (``given``, cached, or pretrained here), their
    pretraining summaries, the loaded predictors, their untrained copies and the
    vocabulary."""
    from glomo_pyg import PretrainedGraphPredictor
    from glomo_pyg.analysis import untrained_copy

    predictors, pretrain_summaries = {}, {}
    needed = sorted({VARIANTS[v]["predictor"] for v in setup.variants} - {None})
    for name in needed:
        if name == "default" and args.predictor:
            predictors[name] = args.predictor
            summary_path = os.path.join(os.path.dirname(os.path.abspath(args.predictor)),
                                        "pretrain.json")  # written by glomo pretrain
            if os.path.exists(summary_path):
                pretrain_summaries[name] = read_cache(summary_path, "pretraining summary")
            continue
        predictors[name], pretrain_summaries[name] = pretrain(args, setup, out, name)
    loaded = {name: given if name == "default" and given is not None else
              PretrainedGraphPredictor.from_pretrained(path) for name, path in predictors.items()}
    untrained = {VARIANTS[v]["predictor"]: untrained_copy(loaded[VARIANTS[v]["predictor"]],
                                                          seed=UNTRAINED_SEED)
                 for v in setup.variants if VARIANTS[v].get("weights") == "untrained"}
    vocabulary = next(iter(loaded.values())).vocabulary if loaded else None
    if vocabulary is None and given is not None:  # the baseline alone: its vocabulary
        vocabulary = given.vocabulary
    if vocabulary is None:
        raise ValueError("the baseline alone needs a vocabulary: include a GLoMo variant or "
                         "pass --predictor")
    if any(p.vocabulary != vocabulary for p in loaded.values()):
        raise ValueError("predictors were pretrained with different vocabularies")
    return predictors, pretrain_summaries, loaded, untrained, vocabulary


class Downstream:
    """The downstream runs of one reproduction: each trained once and cached in
    ``downstream.json`` (valid only for the inputs and settings that made it)."""

    def __init__(self, args, setup: Setup, out: str, data, embedding, predictors, loaded,
                 untrained, settings: Dict):
        self.args, self.setup, self.embedding = args, setup, embedding
        self.train, self.val, self.test = data
        self.loaded, self.untrained, self.settings = loaded, untrained, settings
        self.runs_path = os.path.join(out, "downstream.json")
        self.inputs = {v: run_inputs(v, predictors, loaded, setup.max_distance, setup.mixing)
                       for v in setup.variants}
        upgrade_cache(self.runs_path, settings, predictors, loaded, log)
        self.runs = cached_runs(self.runs_path, settings, log)
        check_runs(self.runs, self.runs_path)
        for variant, count in stale_runs(self.runs, self.inputs).items():
            log(f"{count} cached run(s) of {variant} were made with other graph inputs "
                "(another predictor, --max-distance or --mixing); training them again")
        self.checkpoints = os.path.join(out, "lr-search")
        os.makedirs(self.checkpoints, exist_ok=True)

    def build(self, variant: str, seed: int):
        from glomo_pyg import GlomoTextClassifier

        spec = dict(VARIANTS[variant])
        source = self.untrained if spec.pop("weights", None) == "untrained" else self.loaded
        predictor = source.get(spec.pop("predictor"))
        torch.manual_seed(seed)
        return GlomoTextClassifier(self.embedding, predictor=predictor,
                                   hidden_channels=self.setup.hidden,
                                   rnn_layers=self.setup.rnn_layers,
                                   max_distance=self.setup.max_distance,
                                   mixing=self.setup.mixing, **spec)

    def fit(self, variant: str, seed: int, lr: float, test_data):
        """One run: its cache entry and the model (left at its best validation epoch)."""
        from glomo_pyg.training.text_classification import train_and_test

        model = self.build(variant, seed)
        result = train_and_test(model, self.train, self.val, test_data, epochs=self.setup.epochs,
                                batch_size=self.setup.batch_size, lr=lr, seed=seed,
                                accelerator=self.args.accelerator)
        mixture = mixture_weights(model, self.val)
        return dict(dataclasses.asdict(result), lr=lr, inputs=self.inputs[variant],
                    **({"mixture": mixture} if mixture else {})), model

    def record(self, key: str, entry: Dict) -> None:
        self.runs[key] = entry
        test_text = "not evaluated" if entry["test_acc"] is None else f"{entry['test_acc']:.4f}"
        log(f"{key}: val {entry['val_acc']:.4f} (epoch {entry['best_epoch']}), "
            f"test {test_text}, {entry['seconds']:.0f} s")
        write_runs(self.runs_path, self.settings, self.runs)

    def checkpoint(self, variant: str, seed: int, lr: float) -> str:
        # (seed 0 keeps the name it had before seeds were numbered, so its interrupted
        # searches resume)
        return os.path.join(self.checkpoints, f"{variant}-{lr:g}.pt" if seed == 0 else
                            f"{variant}-{seed}-{lr:g}.pt")

    def choose_rate(self, variant: str) -> float:
        """The learning rate of ``variant``: seeds 0 .. lr_seeds - 1 at every rate,
        validation only. train_and_test always evaluates a test set; it gets the
        validation reviews, so the test reviews are seen only by the chosen rate's
        models, restored from their checkpoints afterwards."""
        setup, runs = self.setup, self.runs
        search_seeds = range(setup.lr_seeds)
        for seed in search_seeds:
            for lr in setup.lrs:
                key = run_key(variant, seed, lr)
                if key in runs:
                    continue
                entry, model = self.fit(variant, seed, lr, self.val)
                torch.save(trainable_state(model), self.checkpoint(variant, seed, lr))
                self.record(key, dict(entry, test_acc=None))
        chosen = max(setup.lrs, key=lambda lr: search_accuracy(runs, setup, variant, lr))
        for seed in search_seeds:
            key = run_key(variant, seed, chosen)
            if runs[key]["test_acc"] is None:
                self.record(key, self.tested(variant, seed, chosen, key))
        for seed in search_seeds:  # every search run of this variant is final now
            for lr in setup.lrs:
                if os.path.exists(self.checkpoint(variant, seed, lr)):
                    os.remove(self.checkpoint(variant, seed, lr))
        tried = ", ".join(f"{lr:g}: {search_accuracy(runs, setup, variant, lr):.4f}"
                          for lr in setup.lrs)
        log(f"{variant}: learning rate {chosen:g} chosen on validation ({tried})")
        return chosen

    def tested(self, variant: str, seed: int, lr: float, key: str) -> Dict:
        """A search run at the chosen rate, its checkpoint evaluated on test (trained
        again if the checkpoint is lost or damaged)."""
        path = self.checkpoint(variant, seed, lr)
        state = None
        if os.path.exists(path):
            try:
                state = torch.load(path, weights_only=True)
            except (RuntimeError, OSError, ValueError, EOFError, pickle.UnpicklingError) as err:
                log(f"{path} is damaged ({err}); training the run again")
        if state is None:  # checkpoint lost: train this run again, now with the test evaluation
            return self.fit(variant, seed, lr, self.test)[0]
        model = self.build(variant, seed)
        missing, unexpected = model.load_state_dict(state, strict=False)
        frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
        if unexpected or set(missing) - frozen:
            raise ValueError(f"{path} does not fit variant {variant}; delete it")
        return dict(self.runs[key], test_acc=evaluate_accuracy(
            model, self.test, self.setup.batch_size, self.args.accelerator))

    def run_all(self) -> Dict[str, float]:
        """Every variant at its chosen rate for every reported seed; the chosen rates."""
        chosen = {variant: self.choose_rate(variant) for variant in self.setup.variants}
        for seed in reported_seeds(self.setup):
            for variant in self.setup.variants:
                key = run_key(variant, seed, chosen[variant])
                # (the search seeds' runs at the chosen rate are tested above; a
                # validation-only run of an earlier, larger --lr-seeds has no test result
                # and no checkpoint left: trained again)
                if key not in self.runs or self.runs[key]["test_acc"] is None:
                    self.record(key, self.fit(variant, seed, chosen[variant], self.test)[0])
        return chosen


def run(args, argv=None) -> None:
    """The reproduction for parsed ``args`` (see :func:`main`)."""
    setup = setup_for(args)
    mode = "smoke" if args.smoke else "reduced" if args.reduced else "full"
    out = args.output_dir or f"runs/imdb-{mode}"
    os.makedirs(out, exist_ok=True)
    command = "python -m benchmarks.reproduce.imdb " + " ".join(sys.argv[1:] if argv is None
                                                                 else argv)
    start = time.time()
    from glomo_pyg.data import embedding_matrix

    given = given_predictor(args)
    splits = review_splits(args, setup)
    words, vectors = word_vectors(args, setup, out)
    predictors, pretrain_summaries, loaded, untrained, vocabulary = \
        load_predictors(args, setup, out, given)
    embedding, coverage = embedding_matrix(vocabulary, words, vectors, seed=0)
    train, val, test = reviews(splits, setup, vocabulary)
    log(f"reviews: {len(train)} train / {len(val)} validation / {len(test)} test, cut to "
        f"{setup.review_length} tokens; word vectors cover {coverage:.1%} of the vocabulary")
    baseline_tfidf = tfidf(setup, out, splits)
    log(f"{TFIDF_LABEL}: C {baseline_tfidf['C']:g} (validation "
        f"{baseline_tfidf['val_acc']:.4f}), test {baseline_tfidf['test_acc']:.4f}, "
        f"{baseline_tfidf['features']} features")
    # cached runs are valid only for the inputs and settings that made them: the shared
    # ones here, and per run the predictor files its variant reads (run_inputs)
    settings = dict(
        {f: getattr(setup, f) for f in ("vector_dim", "vector_epochs", "corpus_documents",
                                        "review_length", "train_reviews", "validation_reviews",
                                        "test_reviews", "hidden", "epochs", "batch_size")},
        # (recorded only when not the default 2, so caches made before the option stay valid)
        **({} if setup.rnn_layers == 2 else dict(rnn_layers=setup.rnn_layers)),
        reviews=[len(train), len(val), len(test)],
        word_vectors=file_digest(os.path.join(out, "word_vectors.txt")),
        vocabulary=text_digest(json.dumps(vocabulary)))
    downstream = Downstream(args, setup, out, (train, val, test), embedding, predictors, loaded,
                            untrained, settings)
    chosen = downstream.run_all()
    runs = downstream.runs
    for variant in setup.variants:  # the neural results beside the TF-IDF baseline
        acc = [runs[run_key(variant, s, chosen[variant])]["test_acc"]
               for s in reported_seeds(setup)]
        log(f"{LABELS[variant]}: test {sum(acc) / len(acc):.4f} over {len(acc)} seeds, "
            f"lr {chosen[variant]:g}")
    log(f"{TFIDF_LABEL}: test {baseline_tfidf['test_acc']:.4f}")
    profiles = {name: graph_profile(p, test, max_distance=setup.max_distance)
                for name, p in loaded.items()}
    profiles.update({f"{name}, untrained": graph_profile(p, test, max_distance=setup.max_distance)
                     for name, p in untrained.items()})
    write_results(args, setup, command, runs, chosen, baseline_tfidf, pretrain_summaries,
                  profiles, coverage, len(train), len(val), len(test), time.time() - start)


def search_accuracy(runs: Dict, setup: Setup, variant: str, lr: float) -> float:
    """Mean validation accuracy of ``variant`` at ``lr`` over the rate-search seeds."""
    return sum(runs[run_key(variant, s, lr)]["val_acc"]
               for s in range(setup.lr_seeds)) / setup.lr_seeds


def final_runs(runs: Dict, setup: Setup, variant: str, lr: float) -> Dict[int, Dict]:
    """The test-evaluated runs of ``variant`` at its chosen rate, by seed."""
    found = {s: runs.get(run_key(variant, s, lr)) for s in reported_seeds(setup)}
    return {s: r for s, r in found.items() if r is not None and r["test_acc"] is not None}


def mixture_lines(setup: Setup, final: Dict[str, Dict[int, Dict]]) -> List[str]:
    """The table of what the graph mixtures learned, over the final runs that recorded it
    (runs cached before the record have none)."""
    rows = []
    for variant in setup.variants:
        recorded = [r["mixture"] for r in final.get(variant, {}).values() if "mixture" in r]
        places = sorted({p for m in recorded for p in m})
        for place in places:
            directions = list(dict.fromkeys(d for m in recorded for d in m.get(place, {})))
            for direction in directions:
                entries = [m[place][direction] for m in recorded
                           if direction in m.get(place, {})]
                count = len(entries[0]["weights"])
                entries = [e for e in entries if len(e["weights"]) == count]
                mean = torch.tensor([e["weights"] for e in entries], dtype=torch.float64).mean(0)
                tops, top, _ = mixture_summary(mean.tolist())
                rows.append(
                    f"| {LABELS[variant]} | {place} | {direction} | {len(entries)} | "
                    f"{', '.join(map(str, tops))} ({top:.3f}) | "
                    f"{sum(e['largest'] for e in entries) / len(entries):.3f} "
                    f"(equal weights: {1 / count:.3f}) | "
                    f"{sum(e['effective'] for e in entries) / len(entries):.1f} of {count} |")
    if not rows:
        return []
    return ["", f"Mixture weights learned over the graph components (mixing `{setup.mixing}`; "
            "components numbered in `GraphMixer.components()` order, where `('graph', 0, h)` "
            "and `('hierarchical', 0, h)` propagate alike; means over seeds and over the "
            "words of 256 validation reviews): the components with the largest mean weight, "
            "and per word its largest weight and its effective number of components "
            "exp(entropy):", "",
            "| variant | place | direction | seeds | heaviest components (mean weight) | "
            "largest weight per word | effective components per word |",
            "|---|---|---|---|---|---|---|", *rows]


def _profile_lines(profiles: Dict) -> List[str]:
    """The table of the predictors' forward graphs against uniform ones."""
    lines = ["", "Forward graphs on the first 256 test reviews, per layer (learned / uniform "
             "over the same allowed sources): density; weight-averaged edge distance; share "
             "of each target's weight on the previous unit, and on the previous two units.", "",
             "| predictor | layer | density | distance | weight on t-1 | weight on t-1, t-2 |",
             "|---|---|---|---|---|---|"]
    for name, prof in profiles.items():
        for l in range(len(prof["learned/density"])):
            def cell(key):
                return f"{prof['learned/' + key][l]:.3f} / {prof['uniform/' + key][l]:.3f}"

            lines.append(f"| `{name}` | {l} | {cell('density')} | {cell('distance')} | "
                         f"{cell('weight_prev1')} | {cell('weight_prev2')} |")
    lines.append("")
    return lines


def _search_lines(setup: Setup, runs: Dict, chosen: Dict[str, float], searched: str
                  ) -> List[str]:
    """Validation accuracy of each variant at each learning rate, the chosen in bold."""
    lines = ["", f"Validation accuracy % ({searched}) at each learning rate (no test "
             "evaluation except at the chosen rate):", "",
             "| variant | " + " | ".join(f"lr {lr:g}" for lr in setup.lrs) + " |",
             "|---|" + "---|" * len(setup.lrs)]
    for variant in setup.variants:
        cells = [f"**{100 * search_accuracy(runs, setup, variant, lr):.2f}**" if lr ==
                 chosen[variant] else f"{100 * search_accuracy(runs, setup, variant, lr):.2f}"
                 for lr in setup.lrs]
        lines.append(f"| {LABELS[variant]} | " + " | ".join(cells) + " |")
    return lines


def _paired_lines(setup: Setup, final: Dict) -> List[str]:
    """Paired test-accuracy differences of the compared variants."""
    # same seeds, same data order per seed: pairing removes the variation the runs share
    rows = []
    for a, b in comparisons(setup.variants):
        if b not in final:
            continue
        seeds = sorted(set(final[a]) & set(final[b]))
        if not seeds:
            continue
        acc_a = [100 * final[a][s]["test_acc"] for s in seeds]
        acc_b = [100 * final[b][s]["test_acc"] for s in seeds]
        mean, low, high, n = paired_difference(acc_a, acc_b)
        interval = "-" if math.isnan(low) else f"[{low:+.2f}, {high:+.2f}]"
        rows.append(f"| {LABELS[a]} − {LABELS[b]} | {mean:+.2f} | {interval} | {n} | "
                    + ", ".join(f"{x - y:+.2f}" for x, y in zip(acc_a, acc_b)) + " |")
    if not rows:  # (a run of one variant has nothing to pair)
        return []
    return ["", "Paired test-accuracy differences, percentage points, over the seeds both "
            "variants ran (the same seeds for every variant), with a two-sided 95% Student-t "
            "confidence interval of the mean difference:", "",
            "| comparison | mean difference | 95% CI | seeds | per-seed differences |",
            "|---|---|---|---|---|", *rows]


def _header_lines(args, command: str, pretrain_summaries: Dict, seconds: float) -> List[str]:
    """The section's title, the command, hardware and time, and the predictors used."""
    from benchmarks.common import hardware

    device = "cuda" if args.accelerator != "cpu" and torch.cuda.is_available() else "cpu"
    kind = ("smoke test" if args.smoke else
            "reduced CPU configuration, not a reproduction" if args.reduced else
            "full configuration")
    lines = [f"\n## {datetime.date.today().isoformat()}: IMDB, {kind}", "",
             f"- command: `{command}`",
             f"- hardware: {hardware(device)}; torch {torch.__version__}",
             f"- total time: {seconds / 60:.0f} min (stages cached in the output folder are "
             "not re-run)"]
    if getattr(args, "predictor", None):
        lines.append(f"- predictor `default`: the saved predictor `{args.predictor}`")
    for name, s in pretrain_summaries.items():
        lines.append(f"- predictor `{name}`: {s['steps']} steps on {s['tokens']:,} corpus tokens "
                     f"(training sequences), vocabulary {s['vocabulary']}, "
                     f"{s['seconds'] / 60:.1f} min, final validation loss "
                     + (f"{s['val_loss']:.3f}" if s.get("val_loss") is not None else "(none)"))
    return lines


def _model_lines(setup: Setup) -> List[str]:
    """The downstream model and how its graphs are cut and mixed."""
    model = (f"word vectors -> BiGRU x {setup.rnn_layers}" if setup.rnn_layers else
             "word vectors -> linear map (no RNN: word order only through the graphs)")
    lines = [f"- downstream model: {model} -> self-attention -> max and mean pooling -> MLP"]
    if setup.max_distance is not None:
        lines.append(f"- graphs keep only edges of at most {setup.max_distance} units, each "
                     "target's weights renormalised (`--max-distance`; not the adjacent-word "
                     "graphs, whose edges span 1)")
    if setup.mixing != "free":
        lines.append(f"- mixture weights over the graph components: `{setup.mixing}` "
                     "(`--mixing`; per word, from its features)")
    return lines


def _searched(setup: Setup) -> str:
    """The seeds whose validation accuracy chooses the learning rate."""
    return "seed 0" if setup.lr_seeds == 1 else f"mean of seeds 0-{setup.lr_seeds - 1}"


def _protocol_lines(setup: Setup, baseline_tfidf: Dict, coverage: float, n_train: int,
                    n_val: int, n_test: int) -> List[str]:
    """The data, the learning-rate search, the reported seeds and the TF-IDF baseline."""
    rates = ", ".join(f"{lr:g}" for lr in setup.lrs)
    val_by_c = ", ".join(f"C {c:g}: {100 * a:.2f}" for c, a in baseline_tfidf["val_by_C"])
    return [f"- downstream: {n_train} training / {n_val} validation / {n_test} test reviews "
            f"(cut to {setup.review_length} tokens), {setup.epochs} epochs, best validation "
            f"epoch evaluated on test; word vectors {setup.vector_dim}-d word2vec, "
            f"{coverage:.1%} of the vocabulary covered",
            (f"- learning rate per variant: seed 0 trained at each of {rates} and validated "
             "only; the rate with the best validation accuracy is used for every seed, and "
             "only its seed-0 model is evaluated on test" if setup.lr_seeds == 1 else
             f"- learning rate per variant: seeds 0-{setup.lr_seeds - 1} each trained at each "
             f"of {rates} and validated only (`--lr-seeds {setup.lr_seeds}`); the rate with "
             "the best mean validation accuracy over them is used for every seed, and only "
             "their models at that rate are evaluated on test"),
            *([f"- reported seeds: {setup.first_seed}-{setup.first_seed + setup.seeds - 1} "
               f"(`--first-seed {setup.first_seed}`)"
               + ("; none of them was used to choose the learning rate"
                  if setup.first_seed >= setup.lr_seeds else "")]
              if setup.first_seed else []),
            f"- {TFIDF_LABEL}: the same reviews and tokens, {baseline_tfidf['features']:,} "
            f"features (n-grams in >= 2 training reviews, sublinear tf), validation accuracy "
            f"% per C: {val_by_c}", ""]


def _results_table(setup: Setup, runs: Dict, chosen: Dict[str, float], baseline_tfidf: Dict,
                   final: Dict[str, Dict[int, Dict]]) -> List[str]:
    """Test accuracy of the TF-IDF baseline and of each variant at its chosen rate."""
    lines = ["| variant | test accuracy % (mean ± std) | seeds | chosen on validation | "
             f"validation accuracy % ({_searched(setup)}) | paper | mean downstream s |",
             "|---|---|---|---|---|---|---|",
             f"| {TFIDF_LABEL} | {100 * baseline_tfidf['test_acc']:.2f} | - (deterministic) | "
             f"C = {baseline_tfidf['C']:g} | {100 * baseline_tfidf['val_acc']:.2f} | - | "
             f"{baseline_tfidf['seconds']:.0f} |"]
    for variant in setup.variants:
        mine = list(final[variant].values())
        if not mine:
            continue
        mean, std = mean_sd([100 * r["test_acc"] for r in mine])  # (one seed: std NaN)
        paper = PAPER.get(variant) if setup.rnn_layers == 2 else None  # (the paper's model)
        val0 = search_accuracy(runs, setup, variant, chosen[variant])
        lines.append(f"| {LABELS[variant]} | {mean:.2f} ± {std:.2f} | {len(mine)} | "
                     f"lr = {chosen[variant]:g} | {100 * val0:.2f} | "
                     f"{paper if paper is not None else '-'} | "
                     f"{sum(r['seconds'] for r in mine) / len(mine):.0f} |")
    return lines


def write_results(args, setup, command, runs, chosen, baseline_tfidf, pretrain_summaries,
                  profiles, coverage, n_train, n_val, n_test, seconds):
    """Append this run's section to ``args.results`` and print what ``append_results`` says."""
    from benchmarks.common import append_results

    lines = _header_lines(args, command, pretrain_summaries, seconds)
    lines += _profile_lines(profiles)
    lines += _model_lines(setup)
    lines += _protocol_lines(setup, baseline_tfidf, coverage, n_train, n_val, n_test)
    final = {v: final_runs(runs, setup, v, chosen[v]) for v in setup.variants}
    lines += _results_table(setup, runs, chosen, baseline_tfidf, final)
    lines += _search_lines(setup, runs, chosen, _searched(setup))
    lines += mixture_lines(setup, final)
    lines += _paired_lines(setup, final)
    lines.append("")
    print(append_results(args.results, lines))


if __name__ == "__main__":
    as_script(main)
