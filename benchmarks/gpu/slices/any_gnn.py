"""``any-gnn-imdb`` and ``any-gnn-cifar10`` (repeatable): ``benchmarks/any_gnn.py`` on the
GPU, after the paper's own results. A stock PyG GNN (``RelationalGNN``: residual
``GraphConv`` layers, one per relation) trained over GLoMo's learned graphs
(``glomo_pyg.transforms.GlomoGraphs``, a released predictor's layers and heads merged by
their mean, the top ``top_k`` sources per target and direction kept) and over fixed
graphs, one recipe and paired seeds per task, at ``benchmarks.any_gnn``'s full
configuration (``FULL``; ``python -m benchmarks.any_gnn --full`` with one learning rate):

- IMDB (``any-gnn-imdb``): release ``imdb-text-cpu`` (committed, so these runs wait for
  no pretraining), all 22,500 / 2,500 / 25,000 reviews of up to 400 tokens; graphs
  ``glomo`` and ``chain``. The uniform graph is left out: it is
  :math:`T(T - 1)` edges per review (159,600 at 400 tokens, about 2 MB stored per
  review), some 100 GB for the 50,000 reviews, over the GPU machine's memory and disk.
- CIFAR-10 (``any-gnn-cifar10``): release ``imagenet32-pixel`` at 32x32, the 45,000 /
  5,000 / 10,000 images; graphs ``glomo``, ``grid`` (8 neighbours) and ``chain``. The
  uniform graph is left out: 1M edges per image.

Two slices rather than one: a call carries at most 64 MiB, and the IMDB and CIFAR-10
archives together (54 MiB) with the tree (13 MiB) are over it; each task's slice carries
its own archive. Both live here (:func:`slice_for`); their blocks share
``results/any_gnn.md``. Each waits (``schedule.NEEDS``) while the paper's slice of its
task has pending runs.

One key per run, ``TASK/GRAPH/seedN``, seeds 0-4 (``KEY_FIELDS``: more seeds or graphs
keep the recorded runs). Keys run graph by graph (all seeds of ``glomo``, then the next
graph): a call makes one graph's datasets (a ``GraphsDataset`` in the call's work folder,
fixed graphs included) and every key of that graph in the call reuses them; at most one
graph's datasets are held at a time (CIFAR-10's GLoMo graphs are ~28 GB in memory). The
learning rate is fixed (1e-3, the smaller of ``benchmarks.any_gnn``'s ``--lrs``): a call
has no time for the search. Each run's test accuracy is that of its best validation
epoch.
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import time
import types
from typing import Dict, List, Optional, Tuple

from benchmarks.gpu import data
from benchmarks.gpu.report import md
from benchmarks.gpu.slices.common import release_folder, release_sha256

RESULTS = "any_gnn.md"
KEYS_PER_PROCESS = None  # one process per call: data and graphs made once
KEY_FIELDS = ("graphs", "seeds")  # more seeds or graphs keep the recorded runs
TASKS = ("imdb", "cifar10")
SLICE_NAMES = {task: f"any-gnn-{task}" for task in TASKS}
ARCHIVES_OF = {"imdb": (data.IMDB,), "cifar10": (data.CIFAR,)}
RELEASES = {"imdb": "imdb-text-cpu", "cifar10": "imagenet32-pixel"}
DRY_RELEASES = {"imdb": "imdb-text-cpu", "cifar10": "imagenet32-pixel-cpu"}  # small, committed
# a graph name is the stock GNN's; ``pick-NAME`` is PickConv over it; ``learned`` is the
# graph the model learns itself (benchmarks.any_gnn.TaskLearnedGraphs). Grouped by graph,
# so a call makes each graph's datasets once.
GRAPHS = {"imdb": ("glomo", "pick-glomo", "chain", "pick-chain", "learned", "pick-learned"),
          "cifar10": ("glomo", "pick-glomo", "grid", "pick-grid", "chain", "learned",
                      "pick-learned")}
PICK = "pick-"
LEFT_OUT = {"imdb": "uniform (T(T - 1) edges per review: ~100 GB for the 50,000 reviews "
                    "at 400 tokens)",
            "cifar10": "uniform (1M edges per 32x32 image)"}
LR = 1e-3

# Estimates of an H100 call (not measured on a GPU yet; the ledger's timings replace
# them in estimate_seconds): both tasks train at batch 32, so a step is bound by the
# PyG collation and transfer on the CPU and the small kernels' launches, not by the GPU.
# IMDB: 704 steps an epoch at ~7 ms plus ~100 us per review to slice it out of the
# dataset, 12 epochs ~85 s, validation every epoch, the 25,000 test reviews at each
# better epoch (~8 s each, about 6 times). CIFAR-10: 1,407 steps an epoch of 32 images
# (32,768 pixels; GLoMo ~524k edges, the grid ~260k, the chain ~65k) at ~11 / 8 / 6 ms.
RUN_S = {("imdb", "glomo"): 140.0, ("imdb", "chain"): 110.0,
         ("cifar10", "glomo"): 225.0, ("cifar10", "grid"): 165.0, ("cifar10", "chain"): 125.0}
# a graph's datasets, made once per call: GLoMo runs the predictor over every sample
# (50,000 reviews; 60,000 images at ~1,000 a second) and writes and reads its cache
GRAPHS_S = {("imdb", "glomo"): 120.0, ("imdb", "chain"): 30.0,
            ("cifar10", "glomo"): 180.0, ("cifar10", "grid"): 90.0, ("cifar10", "chain"): 45.0}
DATA_S = {"imdb": 60.0, "cifar10": 20.0}  # reading and encoding the samples, once per call


def task_recipe(task: str, dry_run: bool) -> Dict:
    """Every setting a run of ``task`` depends on: ``benchmarks.any_gnn.FULL`` (toy sizes
    for the CPU dry run)."""
    from benchmarks.any_gnn import CIFAR_FULL, FULL

    if task not in TASKS:
        raise ValueError(f"any-gnn has the tasks {', '.join(TASKS)}, not {task!r}")
    release = (DRY_RELEASES if dry_run else RELEASES)[task]
    sizes = dict(train=FULL.train, validation=FULL.validation, test=FULL.test,
                 length=FULL.review_length) if task == "imdb" else \
        dict(CIFAR_FULL, side=FULL.image_side)
    r = dict(task=task, predictor=dict(release=release, sha256=release_sha256(release)),
             data=dict(sizes, validation_seed=0, test_seed=1),
             graph=dict(merge="mean", top_k=FULL.top_k),
             model=dict(name="RelationalGNN", layers=2, dropout=0.2, hidden=FULL.hidden),
             train=dict(epochs=FULL.epochs, batch=FULL.batch_size, lr=LR, optimizer="adam"),
             graphs=list(GRAPHS[task]), seeds=5)
    if dry_run:  # the toy archives (40 training samples, 20 or 40 test): seconds on a CPU
        toy = {"length": 16} if task == "imdb" else {"side": 8}
        r.update(data=dict(r["data"], validation=8, **toy),
                 graph=dict(r["graph"], top_k=4), model=dict(r["model"], hidden=8),
                 train=dict(r["train"], epochs=1, batch=8), seeds=1)
    return r


def keys(recipe: Dict) -> List[str]:
    """``TASK/GRAPH/seedN``, graph by graph (a call makes one graph's datasets)."""
    if blocked(recipe):
        return []
    return [f"{recipe['task']}/{g}/seed{s}" for g in recipe["graphs"]
            for s in range(recipe["seeds"])]


def blocked(recipe: Dict) -> Optional[str]:
    if recipe["predictor"].get("sha256"):
        return None
    return f"needs the release pretrained/{recipe['predictor']['release']}"


def _graph(key: str) -> str:
    return key.split("/")[1]


def variant(graph: str) -> Tuple[str, str]:
    """``(model, graph its datasets hold)`` of a recipe's graph name."""
    return ("pick", graph[len(PICK):]) if graph.startswith(PICK) else ("graphconv", graph)


def _dry(recipe: Dict) -> bool:
    return recipe["train"]["epochs"] < 3


def min_seconds(key: str, recipe: Dict) -> float:
    """A run's time (an estimate: :data:`RUN_S`), plus its graph's datasets and the
    samples when this process has not made them yet."""
    if _dry(recipe):
        return 5.0
    task, graph = recipe["task"], _graph(key)
    seconds = RUN_S.get((task, graph), max(RUN_S.values()))
    if _STATE.get("graph") != variant(graph)[1]:
        seconds += GRAPHS_S.get((task, graph), max(GRAPHS_S.values()))
    if "raw" not in _STATE:
        seconds += DATA_S[task]
    return seconds


def estimate_seconds(keys: List[str], recipe: Dict, recorded: List[Dict]) -> float:
    """``keys`` in one process: the samples once, each graph's datasets once and each
    run, each timed as the slowest recorded (of that graph) with 10% to spare, else by
    :data:`DATA_S`, :data:`GRAPHS_S` and :data:`RUN_S`."""
    if _dry(recipe):
        return 5.0 * len(keys)
    task = recipe["task"]

    def slowest(graph: Optional[str], field: str, prior: float) -> float:
        values = [l["metrics"].get(field) for l in recorded
                  if graph is None or _graph(l["key"]) == graph]
        values = [v for v in values if isinstance(v, (int, float)) and v > 0]
        return 1.1 * max(values) if values else prior

    graphs = {_graph(k) for k in keys}
    return slowest(None, "data_s", DATA_S[task]) + \
        sum(slowest(g, "graphs_s", GRAPHS_S.get((task, g), 180.0)) for g in graphs) + \
        sum(slowest(_graph(k), "train_s", RUN_S.get((task, _graph(k)), 225.0)) for k in keys)


# ----------------------------------------------------------------------------- runs

_STATE: Dict = {}  # per process: the samples, the graph transforms, one graph's datasets


def _setup(recipe: Dict):
    from benchmarks.any_gnn import Setup

    d, t = recipe["data"], recipe["train"]
    return Setup(train=d["train"], validation=d["validation"], test=d["test"],
                 review_length=d.get("length", 0), image_side=d.get("side", 0),
                 epochs=t["epochs"], hidden=recipe["model"]["hidden"], batch_size=t["batch"],
                 top_k=recipe["graph"]["top_k"])


def cifar_samples(data_dir: str, recipe: Dict) -> Dict[str, list]:
    """``benchmarks.any_gnn.cifar_splits`` at the recipe's sizes, seeds and side."""
    from benchmarks.any_gnn import cifar_splits

    d = recipe["data"]
    return cifar_splits(data_dir, d, d["side"], d["validation_seed"], d["test_seed"])


def _args(ctx) -> argparse.Namespace:
    folder = release_folder(ctx.recipe["predictor"])
    return argparse.Namespace(device=ctx.device, text_predictor=folder,
                              pixel_predictor=folder, image_graphs=[], data_dir=ctx.data_dir,
                              full=not ctx.dry_run)


def _samples(ctx) -> Dict:
    """The samples and the graph transforms, made once per process."""
    if "raw" not in _STATE:
        from benchmarks.any_gnn import graph_variants, imdb_samples

        r, start = ctx.recipe, time.time()
        if (r["data"]["validation_seed"], r["data"]["test_seed"]) != (0, 1):
            raise ValueError("benchmarks.any_gnn splits with seeds 0 (validation) and 1 (test)")
        args, setup = _args(ctx), _setup(r)
        variants = graph_variants(r["task"], args, setup)
        from benchmarks.any_gnn import LEARNED

        missing = [g for g in {variant(n)[1] for n in r["graphs"]} - {LEARNED}
                   if g not in variants]
        if missing:
            raise ValueError(f"benchmarks.any_gnn.graph_variants offers no {missing} for "
                             f"{r['task']} (it has {', '.join(variants)})")
        raw = imdb_samples(args, setup, variants["glomo"].predictor.vocabulary) \
            if r["task"] == "imdb" else cifar_samples(ctx.data_dir, r)
        _STATE.update(raw=raw, variants=variants, data_s=round(time.time() - start, 3),
                      num_tokens=variants["glomo"].predictor.num_tokens
                      if r["task"] == "imdb" else None)
        ctx.log(f"{r['task']}: {' / '.join(str(len(v)) for v in raw.values())} samples in "
                f"{_STATE['data_s']} s")
    return _STATE


def _drop_graph(ctx) -> None:
    """Free the datasets of the graph held (memory and its cache folder on disk)."""
    if "splits" in _STATE:
        _STATE.pop("splits")
        shutil.rmtree(_STATE.pop("folder"), ignore_errors=True)
        _STATE.pop("graph", None)
        gc.collect()


def _datasets(ctx, graph: str) -> Tuple[Dict, Dict, float]:
    """``graph``'s datasets, made on its first key in this process (the samples and edges
    of ``benchmarks.any_gnn.run_task``'s), what they hold, and the seconds this key spent
    making them."""
    from benchmarks.any_gnn import LEARNED, FixedGraphSamples, TaskLearnedGraphs, pixel_features
    from glomo_pyg.transforms import GraphsDataset

    state = _samples(ctx)
    if state.get("graph") == graph:
        return state["splits"], state["info"], 0.0
    _drop_graph(ctx)
    task, start = ctx.recipe["task"], time.time()
    # (what a failed key of another graph left on disk goes too: one graph's cache at a time)
    shutil.rmtree(os.path.join(ctx.work, "any-gnn", task), ignore_errors=True)
    folder = os.path.join(ctx.work, "any-gnn", task, graph)
    if graph == LEARNED:  # no graph on the samples: the model learns its own
        transform = TaskLearnedGraphs(task, _setup(ctx.recipe))
        splits = {k: FixedGraphSamples(v, None, task) for k, v in state["raw"].items()}
        edges = transform.edges_per_sample(state["raw"]["train"], ctx.recipe["graph"]["top_k"])
    else:
        transform = state["variants"][graph]
        splits = {split: GraphsDataset(os.path.join(folder, split), samples, transform)
                  for split, samples in state["raw"].items()}
        if task == "cifar10":
            splits = {k: [pixel_features(d) for d in v] for k, v in splits.items()}
        edges = sum(int(d.edge_index.size(1)) for d in splits["train"]) / len(splits["train"])
    seconds = round(time.time() - start, 3)
    info = dict(edges_per_sample=round(edges, 1), relations=list(transform.relations),
                graph_key=transform.cache_key, samples=[len(splits[k]) for k in
                                                        ("train", "validation", "test")])
    state.update(graph=graph, splits=splits, info=info, folder=folder)
    ctx.log(f"{task}/{graph}: {edges:.0f} edges per sample, datasets in {seconds} s")
    return splits, info, seconds


def run_key(key: str, ctx) -> Dict:
    from benchmarks.any_gnn import LEARNED, TaskLearnedGraphs, train_run

    task, graph, seed = key.split("/")
    if task != ctx.recipe["task"] or graph not in ctx.recipe["graphs"]:
        raise ValueError(f"{key} is not a key of {SLICE_NAMES.get(ctx.recipe['task'])}")
    seed = int(seed[len("seed"):])
    r = ctx.recipe
    data_s = 0.0 if "raw" in _STATE else None
    model, base = variant(graph)
    splits, info, graphs_s = _datasets(ctx, base)
    if data_s is None:
        data_s = _STATE["data_s"]
    orders = TaskLearnedGraphs(task, _setup(r)).orders() if base == LEARNED else None
    result = train_run(task, splits, len(info["relations"]), _setup(r), seed,
                       r["train"]["lr"], ctx.device, _STATE["num_tokens"], conv=model,
                       learn_orders=orders)
    ctx.log(f"{key}: test {result['test']:.4f} (validation {result['validation']:.4f} at "
            f"epoch {result['epoch'] + 1}); {result['seconds']} s")
    return dict(test_acc=result["test"], val_acc=result["validation"],
                best_epoch=result["epoch"], train_s=result["seconds"], graphs_s=graphs_s,
                data_s=data_s, **info)


# ----------------------------------------------------------------------------- report

TITLES = {"imdb": "IMDB", "cifar10": "CIFAR-10"}




def _test_accuracies(lines: List[Dict]) -> Dict[str, Dict[int, float]]:
    """Test accuracy in % of each recorded run, by graph and seed."""
    acc: Dict[str, Dict[int, float]] = {}
    for l in lines:
        _, graph, seed = l["key"].split("/")
        acc.setdefault(graph, {})[int(seed[len("seed"):])] = 100 * l["metrics"]["test_acc"]
    return acc


def _intro_lines(lines: List[Dict], recipe: Dict) -> List[str]:
    """The section's title and the paragraph on the runs, model, training and graphs."""
    task, d, t = recipe["task"], recipe["data"], recipe["train"]
    devices = sorted({md(l["device"]) for l in lines})
    unit = f"reviews of up to {d['length']} tokens" if task == "imdb" else \
        f"{d['side']}x{d['side']} images"
    sizes = next((l["metrics"].get("samples") for l in lines if l["metrics"].get("samples")),
                 None)
    return [f"### GPU campaign: a stock PyG GNN over GLoMo's and fixed graphs, "
            f"{TITLES[task]} (`{SLICE_NAMES[task]}`)", "",
            f"Generated from the ledger: {len(lines)} runs"
            + (f" on {', '.join(devices)}" if devices else "") + ". "
            f"`RelationalGNN` (`benchmarks/any_gnn.py`, its full configuration): "
            f"{recipe['model']['layers']} residual layers of one `GraphConv` per relation "
            f"(forward, backward), hidden {recipe['model']['hidden']}, mean+max pooling; Adam "
            f"{t['lr']:g} (fixed, no search), batch {t['batch']}, {t['epochs']} epochs, the "
            f"best validation epoch evaluated once on test; `pick-GRAPH`: the same with "
            f"`PickConv` (relative-position edge embeddings); `learned`: the graph the model "
            f"learns per sample (`GraphLearning`, PICK's). GLoMo's graphs: release "
            f"`{md(recipe['predictor']['release'])}` (SHA-256 "
            f"{md(str(recipe['predictor'].get('sha256'))[:12])}), layers and heads merged by "
            f"their {recipe['graph']['merge']}, top {recipe['graph']['top_k']} sources per "
            f"target and direction. "
            + (f"{' / '.join(f'{n:,}' for n in sizes)} train / validation / test {unit}."
               if sizes else f"Train / validation / test {unit}.")
            + f" Left out: {LEFT_OUT[task]}.", ""]


def _graph_rows(lines: List[Dict], recipe: Dict) -> List[str]:
    """The table of every graph of the recipe (``pending`` where none is recorded)."""
    from benchmarks.statistics import mean_sd

    runs = {l["key"]: l for l in lines}
    out = ["| graph | seeds done | test accuracy (mean ± sd) | validation | edges per sample | "
           "s per run |", "|---|---|---|---|---|---|"]
    for graph in recipe["graphs"]:
        mine = [runs[k] for k in sorted(runs) if _graph(k) == graph]
        if not mine:
            out.append(f"| {graph} | 0 | pending | | | |")
            continue
        m, sd = mean_sd([100 * l["metrics"]["test_acc"] for l in mine])
        val = sum(100 * l["metrics"]["val_acc"] for l in mine) / len(mine)
        seconds = sum(l["metrics"]["train_s"] for l in mine) / len(mine)
        out.append(f"| {graph} | {len(mine)} of {recipe['seeds']} | {m:.2f}"
                   + (f" ± {sd:.2f}" if len(mine) > 1 else "") + f" | {val:.2f} | "
                   f"{mine[0]['metrics']['edges_per_sample']:.0f} | {seconds:.0f} |")
    return out


def _paired_rows(lines: List[Dict], recipe: Dict) -> List[str]:
    """The table of the paired differences GLoMo − each fixed graph over their common seeds."""
    from benchmarks.statistics import paired_difference

    acc = _test_accuracies(lines)
    out = ["| paired difference (test, points) | mean | 95% t interval | seeds | "
           "excludes 0 |", "|---|---|---|---|---|"]
    for graph in recipe["graphs"]:
        model, base = variant(graph)
        if base == "glomo":
            continue
        name = "glomo" if model == "graphconv" else PICK + "glomo"  # the same model's GLoMo
        glomo, other = acc.get(name, {}), acc.get(graph, {})
        label = f"{name} − {graph}" if model == "pick" else f"GLoMo − {graph}"
        seeds = sorted(set(glomo) & set(other))
        if not seeds:
            out.append(f"| {label} | pending | | 0 | |")
            continue
        m, lo, hi, n = paired_difference([glomo[s] for s in seeds], [other[s] for s in seeds])
        if n < 2:
            out.append(f"| {label} | {m:+.2f} | (one pair) | 1 | |")
            continue
        verdict = "yes, GLoMo better" if lo > 0 else "yes, GLoMo worse" if hi < 0 else "no"
        out.append(f"| {label} | {m:+.2f} | [{lo:+.2f}, {hi:+.2f}] | {n} | {verdict} |")
    return out


def report(lines: List[Dict], recipe: Dict) -> List[str]:
    """The task's table (every graph of the recipe; ``pending`` where none is recorded)
    and the paired differences GLoMo − each fixed graph over their common seeds."""
    return (_intro_lines(lines, recipe) + _graph_rows(lines, recipe) + [""]
            + _paired_rows(lines, recipe) + [""])


# ----------------------------------------------------------------------------- slices

def _task_slice(task: str) -> types.ModuleType:
    mod = types.ModuleType(f"{__name__}[{task}]", f"``{SLICE_NAMES[task]}``: {__doc__}")
    mod.__dict__.update(
        TASK=task, ARCHIVES=ARCHIVES_OF[task], RESULTS=RESULTS, KEY_FIELDS=KEY_FIELDS,
        KEYS_PER_PROCESS=KEYS_PER_PROCESS, recipe=lambda dry_run: task_recipe(task, dry_run),
        keys=keys, blocked=blocked, min_seconds=min_seconds,
        estimate_seconds=estimate_seconds, run_key=run_key, report=report)
    return mod


SLICES = {SLICE_NAMES[task]: _task_slice(task) for task in TASKS}


def slice_for(name: str) -> types.ModuleType:
    """The slice ``name`` of this module (``campaign.slice_module`` asks)."""
    if name not in SLICES:
        raise ValueError(f"benchmarks.gpu.slices.any_gnn holds the slices "
                         f"{', '.join(SLICES)}, not {name!r}")
    return SLICES[name]
