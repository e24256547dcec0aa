"""``imdb`` (repeatable): paper Table 1's IMDB rows with a released text predictor (the
GPU release ``imdb-text`` once ``text-pretrain`` has made it, else the CPU release
``imdb-text-cpu``; the recipe names the one it uses, by digest): the
paper's model (word vectors -> 2-layer BiGRU -> self-attention -> pooling -> MLP,
:class:`~glomo_pyg.GlomoTextClassifier`) on the full downstream data (22,500 / 2,500
training / validation reviews, the 25,000 test reviews, 400 tokens), without graphs
(``baseline``: word vectors only), with GLoMo graphs at the embeddings (``glomo``) and
with uniform graphs (``uniform``); the same recipe and seeds for every variant, keys
interleaved by seed so every call adds complete pairs.

The word vectors (300-d word2vec on the unlabelled and training reviews, the test
reviews unseen, as ``benchmarks.reproduce.imdb``'s full configuration) are trained on the
CPU machine by ``prepare`` (the GPU machine has no gensim) and carried as the
classifier's float16 embedding matrix over the predictor's vocabulary. One learning rate
(1e-3, the rate the CPU runs chose for the paper's model) instead of a search per variant:
a call has no time for a grid. The epoch with the best validation accuracy is evaluated
once on test.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from typing import Dict, List, Optional

import numpy as np
import torch

from benchmarks.gpu import data

ARCHIVES = (data.IMDB,)
RESULTS = "imdb.md"
KEYS_PER_PROCESS = None  # the reviews are read and encoded once per call
# the text releases, best first: the recipe uses the first one present, so the GPU
# release (text-pretrain runs before this slice) replaces the CPU one when it exists
RELEASES = ("imdb-text", "imdb-text-cpu")
VARIANTS = {"baseline": dict(), "glomo": dict(places=("embedding",)),
            "uniform": dict(places=("embedding",), graph="uniform")}
PAPER = {"baseline": 88.51, "glomo": 89.16, "uniform": 88.57}
TARGET = 0.65  # GLoMo - baseline, points (paper: +0.65)


def _release() -> Dict:
    """The first of :data:`RELEASES` present: its name, weights' digest and the window
    length it was trained on (``sha256`` None when there is none)."""
    from benchmarks.gpu.files import read_json, sha256
    from glomo_pyg.io.releases import releases_root

    for name in RELEASES:
        folder = os.path.join(str(releases_root()), name)
        if os.path.isfile(os.path.join(folder, "model.safetensors")):
            trained = read_json(os.path.join(folder, "config.json"),
                                f"release {name}'s config").get("trained_length")
            return dict(release=name, sha256=sha256(os.path.join(folder, "model.safetensors")),
                        trained_length=trained)
    return dict(release=RELEASES[-1], sha256=None, trained_length=None)


def recipe(dry_run: bool) -> Dict:
    release = _release()
    r = dict(predictor=release,
             vectors=dict(dim=300, window=5, min_count=3, epochs=5, seed=0),
             reviews=dict(length=400, validation=2500, split_seed=0),
             model=dict(hidden_channels=150, rnn_layers=2),
             # the predictor's distance term was trained on windows of trained_length
             # tokens: longer distances share the longest one's term
             max_distance=(release["trained_length"] or 64) - 1,
             train=dict(epochs=6, batch=32, lr=1e-3, precision="32-true"),
             variants=list(VARIANTS), seeds=10)
    if dry_run:
        r.update(vectors=dict(r["vectors"], dim=8, min_count=1, epochs=1),
                 reviews=dict(r["reviews"], length=16, validation=4),
                 model=dict(hidden_channels=4, rnn_layers=2),
                 train=dict(r["train"], epochs=1, batch=4), seeds=1)
    return r


def keys(recipe: Dict) -> List[str]:
    if not recipe["predictor"].get("sha256"):
        return []
    return [f"{v}/seed{s}" for s in range(recipe["seeds"]) for v in recipe["variants"]]


def blocked(recipe: Dict) -> Optional[str]:
    return None if recipe["predictor"].get("sha256") else \
        f"needs one of the releases {', '.join(f'pretrained/{n}' for n in RELEASES)}"


def min_seconds(key: str, recipe: Dict) -> float:
    return 5.0 if recipe["train"]["epochs"] < 3 else 150.0


def _predictor(recipe: Dict):
    from benchmarks.gpu.files import sha256
    from glomo_pyg import PretrainedGraphPredictor
    from glomo_pyg.io.releases import release_path

    folder = release_path(recipe["predictor"]["release"])
    if sha256(os.path.join(folder, "model.safetensors")) != recipe["predictor"]["sha256"]:
        raise ValueError(f"{folder} is not the release the recipe names")
    return PretrainedGraphPredictor.from_pretrained(folder)


def prepare_extra(folder: str, archives: List[str], recipe: Dict, log) -> None:
    """The classifier's embedding matrix (``embedding.npy``, float16, over the
    predictor's vocabulary) from word2vec on the unlabelled and training reviews."""
    from glomo_pyg.data import embedding_matrix, read_aclimdb, tokenize, train_word_vectors

    v = recipe["vectors"]
    with tempfile.TemporaryDirectory() as tmp:
        built = data.build([a for a in archives if os.path.basename(a) == data.IMDB], tmp,
                           log)[data.IMDB]
        docs = [tokenize(r.text) for r in read_aclimdb(built, "train", ("unsup", "pos", "neg"))]
    words, vectors = train_word_vectors(docs, dim=v["dim"], window=v["window"],
                                        min_count=v["min_count"], epochs=v["epochs"],
                                        workers=2, seed=v["seed"])
    weight, coverage = embedding_matrix(_predictor(recipe).vocabulary, words, vectors, seed=0)
    np.save(os.path.join(folder, "embedding.npy"), weight.numpy().astype(np.float16),
            allow_pickle=False)
    with open(os.path.join(folder, "embedding.json"), "w", encoding="utf-8") as fh:
        json.dump(dict(coverage=coverage, words=len(words), documents=len(docs)), fh)
    log(f"word vectors: {len(words)} x {v['dim']} from {len(docs)} reviews; "
        f"{coverage:.1%} of the predictor's vocabulary")


_STATE: Dict = {}


def _data(ctx) -> Dict:
    if not _STATE:
        from glomo_pyg.data import WordVocabulary, read_aclimdb
        from glomo_pyg.training.text_classification import (encode_documents,
                                                            split_train_validation)

        r = ctx.recipe
        predictor = _predictor(r)
        root = os.path.join(ctx.data_dir, "aclImdb")
        train = read_aclimdb(root, "train")
        test = read_aclimdb(root, "test")
        part, val = split_train_validation(train, r["reviews"]["validation"],
                                           r["reviews"]["split_seed"])
        vocab = WordVocabulary(predictor.vocabulary)
        embedding = np.load(os.path.join(ctx.extra, "embedding.npy"), allow_pickle=False)
        if embedding.shape[0] != len(predictor.vocabulary):
            raise ValueError("the carried embedding is not over the predictor's vocabulary")
        _STATE.update(predictor=predictor, embedding=torch.from_numpy(embedding).float(),
                      **{name: encode_documents([x.text for x in rs], [x.label for x in rs],
                                                vocab, r["reviews"]["length"])
                         for name, rs in (("train", part), ("val", val), ("test", test))})
    return _STATE


def run_key(key: str, ctx) -> Dict:
    from glomo_pyg import GlomoTextClassifier
    from glomo_pyg.training.text_classification import train_and_test

    variant, seed = key.split("/")
    seed = int(seed[len("seed"):])
    r, d = ctx.recipe, _data(ctx)
    torch.manual_seed(seed)
    model = GlomoTextClassifier(d["embedding"], predictor=d["predictor"] if VARIANTS[variant]
                                else None, max_distance=r["max_distance"],
                                **r["model"], **VARIANTS[variant])
    result = train_and_test(model, d["train"], d["val"], d["test"], epochs=r["train"]["epochs"],
                            batch_size=r["train"]["batch"], lr=r["train"]["lr"], seed=seed,
                            accelerator="gpu" if ctx.device == "cuda" else "cpu",
                            precision=r["train"]["precision"])
    ctx.log(f"{key}: test {result.test_acc:.4f} (validation {result.val_acc:.4f} at epoch "
            f"{result.best_epoch}); {result.seconds:.0f} s")
    return dict(test_acc=result.test_acc, val_acc=result.val_acc, best_epoch=result.best_epoch,
                train_s=result.seconds, val_history=result.val_history,
                loss_history=result.loss_history,
                reviews=[len(d[k]) for k in ("train", "val", "test")])


def report(lines: List[Dict], recipe: Dict) -> List[str]:
    from benchmarks.reproduce.imdb import paired_difference

    t = recipe["train"]
    acc = {v: {int(l["key"].rsplit("seed", 1)[1]): 100 * l["metrics"]["test_acc"]
               for l in lines if l["key"].startswith(f"{v}/")} for v in VARIANTS}
    out = ["### GPU campaign: IMDB with the paper's model (full downstream data)", "",
           f"Generated from the ledger: {len(lines)} runs on "
           f"{', '.join(sorted({l['device'] for l in lines}))}. Predictor: release "
           f"`{recipe['predictor']['release']}` (`max_distance` {recipe['max_distance']}). "
           f"{' / '.join(f'{n:,}' for n in lines[0]['metrics']['reviews'])} train / "
           f"validation / test reviews of at most {recipe['reviews']['length']} tokens; "
           f"{recipe['vectors']['dim']}-d word2vec vectors; BiGRU x "
           f"{recipe['model']['rnn_layers']} of width {recipe['model']['hidden_channels']}; "
           f"{t['epochs']} epochs, batch {t['batch']}, Adam {t['lr']:g}; the best validation "
           "epoch evaluated once on test.", "",
           "| model | paper | test accuracy (mean ± std) | seeds |", "|---|---|---|---|"]
    for v, by_seed in acc.items():
        if not by_seed:
            continue
        values = list(by_seed.values())
        m = sum(values) / len(values)
        sd = math.sqrt(sum((x - m) ** 2 for x in values) / (len(values) - 1)) \
            if len(values) > 1 else float("nan")
        out.append(f"| {v} | {PAPER[v]} | {m:.2f}" + (f" ± {sd:.2f}" if len(values) > 1 else "")
                   + f" | {len(values)} |")
    out.append("")
    for a, b in (("glomo", "baseline"), ("glomo", "uniform"), ("uniform", "baseline")):
        seeds = sorted(set(acc[a]) & set(acc[b]))
        if not seeds:
            continue
        m, lo, hi, n = paired_difference([acc[a][s] for s in seeds], [acc[b][s] for s in seeds])
        out.append(f"- {a} − {b}: {m:+.2f} points"
                   + (f" [{lo:+.2f}, {hi:+.2f}]" if n > 1 else "")
                   + f" (paired over {n} seeds, 95% t interval)")
        if (a, b) == ("glomo", "baseline") and n >= 5:
            out.append(f"  target >= +{TARGET}: {'met' if m >= TARGET and lo > 0 else 'not met'}")
        if (a, b) == ("glomo", "uniform") and n >= 5:
            out.append(f"  target GLoMo > uniform: {'met' if lo > 0 else 'not met'}")
    return out + [""]
