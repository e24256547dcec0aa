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
instead of a search per variant: a call has no time for a grid. The epoch with the best
validation accuracy is evaluated once on test.

Speed (the target: one run in at most 30 s on an H100): the frozen predictor's graphs of
the training and validation reviews are computed once per call, per variant with graphs,
and kept on the GPU (:class:`~glomo_pyg.transforms.TextGraphCache`, float16
weights): every seed of a variant reuses them, and no training or validation step runs
the predictor (the same graphs, hence the same model; the propagations themselves cannot
be cached: dropout masks the word vectors before the graphs mix them). The test reviews,
read once per run, go through the predictor (in float32, as for the cache). Batch 128 in
bf16-mixed with Adam at 2e-3 (1e-3 x sqrt(128 / 32)), chosen on validation at a reduced
size on the CPU (``benchmarks/imdb_batch_precision.py``; ``benchmarks/results/imdb.md``,
"the GPU campaign's imdb runs: graphs computed once, batch and precision chosen on
validation", which also lists every change from the paper's training setup).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Dict, List, Optional

import numpy as np
import torch

from benchmarks.gpu import data
from benchmarks.gpu.report import md

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
KEY_FIELDS = ("seeds", "variants")  # more seeds keep the recorded runs


def _release() -> Dict:
    """The first of :data:`RELEASES` present: its name, weights' digest, the window
    length it was trained on and its graphs (layers, heads: what a run's time depends
    on; ``sha256`` None when there is none)."""
    from benchmarks.gpu.files import read_json, sha256
    from glomo_pyg.io.releases import releases_root

    for name in RELEASES:
        folder = os.path.join(str(releases_root()), name)
        if os.path.isfile(os.path.join(folder, "model.safetensors")):
            config = read_json(os.path.join(folder, "config.json"), f"release {name}'s config")
            first = next(iter(config["directions"].values()))["config"]
            return dict(release=name, sha256=sha256(os.path.join(folder, "model.safetensors")),
                        trained_length=config.get("trained_length"),
                        graphs=[first["num_layers"], first["heads"]])
    return dict(release=RELEASES[-1], sha256=None, trained_length=None, graphs=None)


def recipe(dry_run: bool) -> Dict:
    release = _release()
    r = dict(predictor=release,
             vectors=dict(dim=300, window=5, min_count=3, epochs=5, seed=0),
             reviews=dict(length=400, validation=2500, split_seed=0),
             model=dict(hidden_channels=150, rnn_layers=2),
             # the predictor's distance term was trained on windows of trained_length
             # tokens: longer distances share the longest one's term
             max_distance=(release["trained_length"] or 64) - 1,
             train=dict(epochs=6, batch=128, lr=2e-3, precision="bf16-mixed"),
             # the graphs of the training and validation reviews, computed once per call
             # (batch: reviews per predictor call) and stored with float16 weights
             precompute=dict(graphs=True, weight_dtype="float16", batch=64),
             variants=list(VARIANTS), seeds=10)
    if dry_run:
        r.update(vectors=dict(r["vectors"], dim=8, min_count=1, epochs=1),
                 reviews=dict(r["reviews"], length=16, validation=4),
                 model=dict(hidden_channels=4, rnn_layers=2),
                 train=dict(r["train"], epochs=1, batch=4, precision="32-true"),
                 precompute=dict(r["precompute"], batch=4), seeds=1)
    return r


def keys(recipe: Dict) -> List[str]:
    if not recipe["predictor"].get("sha256"):
        return []
    return [f"{v}/seed{s}" for s in range(recipe["seeds"]) for v in recipe["variants"]]


def blocked(recipe: Dict) -> Optional[str]:
    return None if recipe["predictor"].get("sha256") else \
        f"needs one of the releases {', '.join(f'pretrained/{n}' for n in RELEASES)}"


def _graph_work(recipe: Dict) -> float:
    """The mixture's sparse products per step relative to the CPU release's (2 layers x 4
    heads, window 63): products per direction (2L - 1: L direct, L - 1 chained) x heads
    x edges per target (the window, at a similar density)."""
    layers, heads = recipe["predictor"].get("graphs") or (2, 4)
    window = min(recipe["max_distance"] + 1, recipe["reviews"]["length"])
    return (2 * layers - 1) * heads * window / (3 * 4 * 64)


def min_seconds(key: str, recipe: Dict) -> float:
    """An estimate of one run on an H100 (not measured on a GPU yet), plus, for learned
    graphs, their cache (only the first key of the variant in a call computes it).

    Per training step of 128 reviews (~30,000 tokens, padded to 400): the cuDNN BiGRU x 2,
    400 recurrent steps forward and about twice that backward at a few microseconds each,
    ~12 ms; attention, gate, pooling and optimiser ~2 ms; the PyG collation on the CPU
    (measured: 6 ms for 128 reviews on the 2-core CPU machine, under load), the cache's
    gathers and Lightning ~6 ms: ~20 ms, 176 steps ~3.5 s an epoch, validation ~0.3 s;
    6 epochs, the 25,000 test reviews once and the Trainer's start: ~27 s. Learned graphs
    add the mixture's sparse products of 300 float32 channels, 6 of ~1.7M edges a step
    with the CPU release, ~5 ms (~1 s an epoch) times :func:`_graph_work` (~6.7 for a
    3 x 8 release with window 127), and their cache: 25,000 reviews through the
    predictor once, ~5 s plus ~2 s per unit of graph work. CPU release: 27 s (baseline),
    28 s (uniform), 40 s (GLoMo, with the cache); a 3 x 8 release: GLoMo ~79 s."""
    if recipe["train"]["epochs"] < 3:
        return 5.0
    variant = VARIANTS.get(key.split("/")[0], {})
    if not variant:
        return 27.0
    if variant.get("graph", "learned") != "learned":
        return 28.0  # uniform graphs: prefix means, O(N)
    work = _graph_work(recipe)
    return 28.0 + 5.0 * work + ((5.0 + 2.0 * work) if recipe["precompute"]["graphs"] else 0.0)


def _predictor(recipe: Dict):
    from benchmarks.gpu.slices.common import release_folder
    from glomo_pyg import PretrainedGraphPredictor

    return PretrainedGraphPredictor.from_pretrained(release_folder(recipe["predictor"]))


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
        from glomo_pyg.training.text_classification import encode_documents, split_train_validation

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


# the share of the GPU's free memory a graph cache may take (training needs the rest)
CACHE_MEMORY_SHARE = 0.5
CACHE_SAMPLE = 256  # reviews whose cache sizes the whole one


def _graph_cache(ctx, variant: str, model):
    """The variant's graph cache of the training and validation reviews, computed on its
    first key in this call and kept on the device for the next ones, the seconds this key
    spent on it, and how its graphs were made (``'none'`` for the baseline, ``'cache'``
    or ``'on the fly'``: a cache
    that would not fit in :data:`CACHE_MEMORY_SHARE` of the GPU's free memory, sized from
    the first reviews' cache, is not built; the predictor then runs per batch)."""
    from glomo_pyg.training.text_classification import cache_documents
    from glomo_pyg.transforms import TextGraphCache

    p, d = ctx.recipe["precompute"], _STATE
    if not VARIANTS[variant]:
        return None, 0.0, "none"
    if not p["graphs"]:
        return None, 0.0, "on the fly"
    caches = d.setdefault("caches", {})
    if variant in caches:
        return caches[variant], 0.0, "cache" if caches[variant] is not None else "on the fly"
    start, model = time.time(), model.to(ctx.device)
    kw = dict(batch_size=p["batch"], device=ctx.device,
              weight_dtype=getattr(torch, p["weight_dtype"]))
    reviews = d["train"] + d["val"]
    if ctx.device == "cuda":
        sample = TextGraphCache.compute(model, [r.x for r in reviews[:CACHE_SAMPLE]], **kw)
        need = sample.nbytes / sample.tokens.numel() * sum(r.x.numel() for r in reviews)
        free = torch.cuda.mem_get_info()[0]
        del sample
        if need > CACHE_MEMORY_SHARE * free:
            ctx.log(f"{variant}: graph cache of ~{need / 2**30:.1f} GiB would not fit in "
                    f"{CACHE_MEMORY_SHARE:.0%} of {free / 2**30:.1f} GiB free: graphs on the fly")
            caches[variant] = None
            return None, time.time() - start, "on the fly"
    caches[variant] = cache_documents(model, d["train"], d["val"], **kw)
    seconds = time.time() - start
    ctx.log(f"{variant}: graph cache of {len(reviews)} reviews, "
            f"{caches[variant].nbytes / 2**20:.0f} MiB, in {seconds:.1f} s")
    return caches[variant], seconds, "cache"


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
    cache, cache_s, graphs = _graph_cache(ctx, variant, model)
    result = train_and_test(model, d["train"], d["val"], d["test"], epochs=r["train"]["epochs"],
                            batch_size=r["train"]["batch"], lr=r["train"]["lr"], seed=seed,
                            accelerator="gpu" if ctx.device == "cuda" else "cpu",
                            precision=r["train"]["precision"], graph_cache=cache)
    ctx.log(f"{key}: test {result.test_acc:.4f} (validation {result.val_acc:.4f} at epoch "
            f"{result.best_epoch}); {result.seconds:.0f} s")
    return dict(test_acc=result.test_acc, val_acc=result.val_acc, best_epoch=result.best_epoch,
                train_s=result.seconds, val_history=result.val_history,
                loss_history=result.loss_history, graphs=graphs, graph_cache_s=cache_s,
                graph_cache_bytes=cache.nbytes if cache is not None else 0,
                reviews=[len(d[k]) for k in ("train", "val", "test")])


def report(lines: List[Dict], recipe: Dict) -> List[str]:
    from benchmarks.statistics import mean_sd, paired_difference

    t = recipe["train"]
    acc = {v: {int(l["key"].rsplit("seed", 1)[1]): 100 * l["metrics"]["test_acc"]
               for l in lines if l["key"].startswith(f"{v}/")} for v in VARIANTS}
    out = ["### GPU campaign: IMDB with the paper's model (full downstream data)", "",
           f"Generated from the ledger: {len(lines)} runs on "
           f"{', '.join(sorted({md(l['device']) for l in lines}))}. Predictor: release "
           f"`{recipe['predictor']['release']}` (`max_distance` {recipe['max_distance']}). "
           f"{' / '.join(f'{n:,}' for n in lines[0]['metrics']['reviews'])} train / "
           f"validation / test reviews of at most {recipe['reviews']['length']} tokens; "
           f"{recipe['vectors']['dim']}-d word2vec vectors; BiGRU x "
           f"{recipe['model']['rnn_layers']} of width {recipe['model']['hidden_channels']}; "
           f"{t['epochs']} epochs, batch {t['batch']}, {t['precision']}, Adam {t['lr']:g}; the "
           "best validation epoch evaluated once on test."
           + (f" The training and validation reviews' graphs computed once per call "
              f"({recipe['precompute']['weight_dtype']} weights)."
              if recipe.get("precompute", {}).get("graphs") else ""), "",
           "| model | paper | test accuracy (mean ± std) | seeds |", "|---|---|---|---|"]
    for v, by_seed in acc.items():
        if not by_seed:
            continue
        values = list(by_seed.values())
        m, sd = mean_sd(values)
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
