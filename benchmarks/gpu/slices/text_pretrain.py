"""``text-pretrain``: text-graph pretraining on every IMDB training review (the 50,000
unlabelled and 25,000 labelled ones; the test reviews unseen) with
``configs/imdb-gpu-release.yaml`` to a wall-clock budget; its predictor becomes the
release ``imdb-text``.

``configs/imdb-gpu.yaml`` (width 256, 30,000 words: 19.3M parameters, 37 MiB in float16)
cannot be released (at most 6 MiB of weights), so the slice runs the same recipe resized:
width 112, a 10,000-word vocabulary (that of the CPU release ``imdb-text-cpu``), 3 layers
x 8 heads, 128-token windows, SGD at the authors' setting, graph warm-up 500 steps.

One key, ``pretrain``: ``glomo pretrain``'s own loop (Lightning, bf16-mixed) stopped
cleanly at the call's deadline or at ``max_steps``; the call returns the predictor in
float16 and the pretraining summary.

Word vectors: the recipe's ``train.init_vectors: word2vec`` trains them with gensim, which
the GPU machine lacks. ``prepare`` does on the CPU machine what that setting does
(:func:`~glomo_pyg.training.pretrain.vectors.train_init_vectors` on the same corpus
settings and seed), keeps the vectors of the pretraining vocabulary (built as the run
builds it) and carries them in float16 (``init_vectors.npy``, ``init_vectors.json``); the
run writes them as a GloVe text file and starts the embeddings from it.

The graphs are checked at ingest, on the CPU, from the project's data folder: against the
gold trees of UD English-EWT dev, the graph chosen per direction on 2,000 EWT train
sentences, beside the untrained predictor and the adjacent-word baselines (``glomo
syntax``; the table of the ``imdb-text-cpu`` model card).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Dict, List

import numpy as np

from benchmarks.gpu import data
from benchmarks.gpu.report import md
from benchmarks.gpu.runner import finite
from benchmarks.gpu.slices.common import config

# the slice's own check of recorded metrics, which ingest reads as mod.check_metrics
from benchmarks.gpu.slices.pretraining import (
    card_command,
    check_graph_steps,
    check_metrics,  # noqa: F401
    check_predictor,
    hardware,
    metrics,
    pretrain_to_deadline,
    steady_step_lines,
    stopped_by,
)
from benchmarks.gpu.slices.pretraining import salvage as salvage_pretraining

ARCHIVES = (data.IMDB,)
INGEST_ARCHIVES = (data.EWT,)  # read at ingest from the project's data folder, not carried
RESULTS = "imdb.md"
RELEASE = "imdb-text"
CONFIG = "imdb-gpu-release.yaml"
RETURNED_FILES = 4  # manifest.json, run.log, predictor/config.json, predictor/model.safetensors
WHOLE_CALL = True   # trains until the call's deadline: it never shares a call
MIN_GRAPH_STEPS = 500  # steps past the warm-up a released predictor's graphs trained
VECTORS, WORDS = "init_vectors.npy", "init_vectors.json"


def recipe(dry_run: bool) -> Dict:
    cfg = config(CONFIG)
    train = dict(cfg["train"], progress_bar=False)
    train.pop("accelerator", None)
    source = train.pop("init_vectors")  # trained by prepare, carried (no gensim there)
    r = dict(config=CONFIG, corpus=dict(cfg["corpus"], path=None), model=cfg["model"],
             train=train, train_seconds=None, seed=0,
             vectors=dict(source=source, carried="float16"),
             syntax=dict(select_sentences=2000))
    if dry_run:
        r["model"] = dict(r["model"], hidden_channels=8, num_layers=1, heads=2, cnn_layers=1,
                          num_positions=4)
        r["corpus"] = dict(r["corpus"], max_size=60, min_count=1, max_length=16, min_length=4,
                           validation_fraction=0.1)
        r["train"] = dict(train, batch_size=4, max_steps=4, graph_warmup_steps=1,
                          checkpoint_every=2, validate_every=2, graph_stats_every=2,
                          log_every=1, num_workers=0)
        r.update(train_seconds=60, syntax=dict(select_sentences=10))
    return r


def keys(recipe: Dict) -> List[str]:
    return ["pretrain"]


def min_seconds(key: str, recipe: Dict) -> float:
    return 20.0 if recipe["train"]["max_steps"] < 10 else 300.0


def _corpus(recipe: Dict, path: str):
    from glomo_pyg.settings import from_mapping
    from glomo_pyg.training.pretrain.config import CorpusConfig

    return from_mapping(CorpusConfig, dict(recipe["corpus"], path=path), "corpus")


def prepare_extra(folder: str, archives: List[str], recipe: Dict, log) -> None:
    """The initial word vectors of the pretraining vocabulary, as ``train.init_vectors:
    word2vec`` would train them: ``init_vectors.npy`` (float16, one row per word) and
    ``init_vectors.json`` (the words, in the rows' order, and what they came from)."""
    from glomo_pyg.data.word_vectors import read_word_vectors
    from glomo_pyg.logs import lines_to, logging_to
    from glomo_pyg.training.pretrain.corpus import prepare_corpus
    from glomo_pyg.training.pretrain.vectors import train_init_vectors

    dim = recipe["model"]["hidden_channels"]
    with tempfile.TemporaryDirectory(prefix="glomo-vectors-") as tmp:
        built = data.build([a for a in archives if os.path.basename(a) == data.IMDB], tmp,
                           log)[data.IMDB]
        corpus = _corpus(recipe, built)
        start = time.time()
        with logging_to(lines_to(log)):  # (their lines, as log's)
            vocab, _ = prepare_corpus(corpus, os.path.join(tmp, "corpus"))
            path = train_init_vectors(corpus, dim, tmp, recipe["seed"], workers=2)
        words, vectors = read_word_vectors(path, vocabulary=vocab.tokens())
    if not words:
        raise ValueError("the word vectors hold none of the pretraining vocabulary")
    np.save(os.path.join(folder, VECTORS), vectors.astype(np.float16), allow_pickle=False)
    with open(os.path.join(folder, WORDS), "w", encoding="utf-8") as fh:
        json.dump(dict(words=words, vocabulary=len(vocab), dim=dim,
                       seconds=round(time.time() - start, 1)), fh)
    log(f"word vectors: {len(words)} of the {len(vocab)} vocabulary words x {dim}, carried "
        f"in float16 ({time.time() - start:.0f} s)")


def run_key(key: str, ctx) -> Dict:
    from glomo_pyg.data.word_vectors import write_word_vectors

    r = ctx.recipe
    with open(os.path.join(ctx.extra, WORDS), encoding="utf-8") as fh:
        words = json.load(fh)["words"]
    vectors = np.load(os.path.join(ctx.extra, VECTORS), allow_pickle=False)
    path = os.path.join(ctx.work, "init_vectors.txt")
    write_word_vectors(path, words, vectors.astype(np.float32))
    settings = dict(output_dir=os.path.join(ctx.work, "pretrain"), corpus=dict(
        r["corpus"], path=os.path.join(ctx.data_dir, "aclImdb")), model=r["model"],
        train=dict(r["train"], seed=r["seed"], init_vectors=path,
                   accelerator="gpu" if ctx.device == "cuda" else "cpu"))
    summary, stop = pretrain_to_deadline(settings, ctx, r["train_seconds"])
    return metrics(summary, r, **stop)


def salvage(failure: Dict, manifest: Dict) -> Dict:
    """The metrics of a ``pretrain`` key that was killed after its predictor came back
    (:func:`~benchmarks.gpu.slices.pretraining.salvage`)."""
    return salvage_pretraining("text-pretrain", failure, manifest)


def syntax_check(predictor_dir: str, recipe: Dict, shared_data: str, log=print) -> Dict:
    """``glomo syntax`` on the CPU: the predictor in ``predictor_dir`` against UD
    English-EWT dev, the graph per direction chosen on the first train sentences."""
    from benchmarks.release_cpu import ewt_comparison
    from glomo_pyg import PretrainedGraphPredictor

    archive = os.path.join(shared_data, data.EWT)
    if not os.path.isfile(archive):
        raise ValueError(f"{archive} is missing: the graphs are scored against its trees "
                         "(--shared-data: the project's data folder)")
    predictor = PretrainedGraphPredictor.from_pretrained(predictor_dir).eval()
    with tempfile.TemporaryDirectory(prefix="glomo-check-") as tmp:
        ewt = data.build([archive], tmp, log=log)[data.EWT]
        start = time.time()
        result, dev, select = ewt_comparison(predictor, ewt,
                                             recipe["syntax"]["select_sentences"])
    log(f"syntax check: {dev} EWT dev sentences on the CPU in {time.time() - start:.0f} s")
    scores = {}
    for d, s in result.evaluation.directions.items():
        layer, head = result.chosen[d]
        untrained = result.untrained.directions[d] if result.untrained else None
        scores[d] = dict(chosen=[layer, head],
                         chosen_undirected=float(s.per_graph["undirected"][layer, head]),
                         layers_undirected=[float(v) for v in s.per_layer["undirected"]],
                         untrained_chosen_undirected=None if untrained is None else
                         float(untrained.per_graph["undirected"][layer, head]),
                         baselines={k: float(v["undirected"]) for k, v in s.baselines.items()})
    return dict(syntax=scores, syntax_text=result.format().strip(),
                syntax_sentences=dict(dev=dev, select=select))


def quality_lines(metrics: Dict) -> List[str]:
    """A run's pretraining figures and its syntax table (results file and model card)."""
    from benchmarks.release_cpu import ewt_heading

    s = metrics["summary"]
    val = s.get("val_loss")
    loss = ("not returned (the run was killed after saving its predictor)" if
            metrics.get("salvaged") else "n/a" if val is None else f"{val:.3f} nats per token")
    lines = [f"- {s.get('steps')} steps in {s.get('seconds')} s of training "
             f"({metrics['seconds_per_step']} s/step, validation included; stopped by "
             f"{metrics['stopped_by']}); final validation loss {loss}"
             + (f"; {s['tokens']:,} tokens, vocabulary {s['vocabulary']:,}" if "tokens" in s
                else "")
             + (f"; initial word vectors for {s['init_vectors_found']:.1%} of it"
                if "init_vectors_found" in s else "")] + steady_step_lines(metrics)
    if "syntax" not in metrics:
        return lines + ["", "(No syntax check is recorded for this run.)"]
    n = metrics["syntax_sentences"]
    return lines + ["", ewt_heading(n["dev"], n["select"]) + ", measured on the CPU at "
                    "ingest:", "", "```text", metrics["syntax_text"], "```"]


def _run_line(l: Dict, released: bool) -> str:
    return (f"Run {md(l['run'])} (recipe {md(l['recipe'])}) on {md(l['device'])} (commit "
            f"{md(l['commit'][:10])}, {md(l['date'])}; torch {md(l['versions'].get('torch'))}, "
            f"CUDA {md(l['versions'].get('cuda'))})"
            + (f"; released as `pretrained/{RELEASE}`" if released else "")
            + (" (salvaged: the key was killed after its predictor was saved, so its "
               "metrics come from the log)" if l["metrics"].get("salvaged") else "") + ":")


def report(lines: List[Dict], recipe: Dict) -> List[str]:
    out = ["### GPU campaign: text-graph pretraining (IMDB, `configs/" + CONFIG + "`)", ""]
    for l in lines:
        out += [_run_line(l, True), ""] + quality_lines(l["metrics"]) + [""]
    return out


def report_earlier(lines: List[Dict]) -> List[str]:
    out = []
    for l in lines:
        out += [_run_line(l, False), ""] + quality_lines(l["metrics"]) + [""]
    return out


def ingest(lines: List[Dict], folder: str, manifest: Dict, releases_root, log,
           shared_data: str) -> None:
    from glomo_pyg import PretrainedGraphPredictor
    from glomo_pyg.io.releases import releases_root as default_root
    from glomo_pyg.publish import write_release

    (line,) = lines
    metrics = line["metrics"]
    check_graph_steps(metrics, manifest, MIN_GRAPH_STEPS,
                      "size the recipe's graph_warmup_steps from its seconds per step")
    predictor_dir = os.path.join(folder, "predictor")  # (ingest's private copy)
    check_predictor(predictor_dir, "text")
    recipe = manifest["recipe"]
    # always measured here (a returned folder carries no verdict: the manifest's schema
    # refuses one); recorded in the ledger line, which ingest writes after
    metrics.update(finite(syntax_check(predictor_dir, recipe, shared_data, log)))
    m, c, t = recipe["model"], recipe["corpus"], recipe["train"]
    words = len(PretrainedGraphPredictor.from_pretrained(predictor_dir).vocabulary)
    card = dict(
        name=RELEASE, modality="text", release="GPU release",
        summary=f"Text graphs for English (IMDB reviews, {words}-word lower-cased "
                f"vocabulary): {m['num_layers']} layers x {m['heads']} heads x 2 directions; "
                "the full text configuration on a GPU.",  # (the data: its own section)
        hardware=hardware(manifest),
        data="IMDB (Maas et al., 2011): the 50,000 unlabelled and 25,000 labelled training "
             f"reviews (the test reviews unseen; 1% of the windows held out for validation), "
             f"in windows of {c['max_length']} tokens"
             + (f"; {metrics['summary']['tokens']:,} tokens" if "tokens" in metrics["summary"]
                else "") + ".",
        recipe=f"`configs/{CONFIG}`: width {m['hidden_channels']}, {m['num_layers']} layers x "
               f"{m['heads']} heads, {m['cnn_layers']} CNN layers, D={m['context_length']}, "
               f"{m['num_positions']} predicted positions per window, {m['position']} position "
               f"term, keep-alive {m['keep_alive']}; SGD lr {t['lr']} momentum "
               f"{t['momentum']}, clip {t['grad_clip']}, batch {t['batch_size']}, graph "
               f"warm-up {t['graph_warmup_steps']} steps, embeddings from word2vec on the same "
               f"reviews, bf16-mixed; {stopped_by(metrics)} after "
               f"{metrics['summary']['seconds']:.0f} s of training, at step {metrics['steps']} "
               f"of {t['max_steps']}; seed {recipe['seed']}. Trained on windows of "
               f"{c['max_length']} tokens: for longer inputs pass `max_distance="
               f"{c['max_length'] - 1}` to `GlomoTransfer`.",
        command=card_command("text-pretrain", bool(metrics.get("salvaged"))),
        commit=line["commit"],
        training_time=f"{metrics['summary'].get('seconds')} s of training "
                      f"({metrics['steps']} steps), {line['seconds']} s in all",
        quality="\n".join(quality_lines(metrics)))
    root = releases_root or str(default_root())
    path = write_release(predictor_dir, os.path.join(root, RELEASE), card)
    log(f"released {path}")
