"""Do stock PyG GNNs gain from GLoMo's graphs? The same model, hyperparameters and seeds
over GLoMo's graphs (``glomo_pyg.transforms.GlomoGraphs``) and over fixed graphs
(chain, uniform, 8-neighbour grid) on IMDB and CIFAR-10.

    python -m benchmarks.any_gnn --data-dir ~/.cache/glomo-data [--task imdb|cifar10|all]
                                 [--full] [--device cuda]

The model (:class:`RelationalGNN`): units embedded (token embeddings; pixels normalised
with their row and column), two residual layers each summing one ``GraphConv`` per
relation (PyG's weighted-sum layer, so edge weights matter), mean + max pooling, a linear
classifier. The default graphs have two relations, ``forward`` and ``backward`` (GLoMo's
layers and heads merged by their mean, then the ``top_k`` heaviest sources per target
kept); on images ``--image-graphs`` adds GLoMo unmerged (``glomo-heads``: one relation per
direction, layer and head), the grid with one relation per neighbour offset
(``grid-offsets``) and the uniform graph. Fixed graphs are attached to each batch as it
is drawn; learned ones are made once and cached (``GraphsDataset``).
Per task the learning rate is chosen on the validation split: seed 0 at every rate of
``--lrs`` over every graph, the rate with the best mean validation accuracy kept; seeds
0..N-1 then run at it and the epoch with the best validation accuracy is evaluated on
test. Paired differences (same seed, so same initialisation and batch order) with 95%
Student-t intervals go to ``benchmarks/results/any_gnn.md``.

Default (reduced, CPU): IMDB 2,000 / 500 / 2,000 reviews (train / validation / a fixed
random test part) of up to 128 tokens, released ``imdb-text-cpu``; CIFAR-10 3,000 / 500 /
2,000 images average-pooled to 16x16 (the size of the released ``imagenet32-pixel-cpu``'s
pretraining crops), 8 epochs. ``--full``: all reviews (22.5k / 2.5k / 25k, 400 tokens),
all CIFAR-10 at 32x32 (45k / 5k / 10k) with ``--pixel-predictor imagenet32-pixel``, for a
GPU; uniform graphs are left out there (``T (T - 1)`` edges per sample, 160k per review
and 1M per image, each batch's sparse products too slow). Runs are cached in ``--work``
(one JSON entry per run), so an interrupted run resumes.
"""
from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import datetime
import json
import os
import sys
import time
import warnings
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GraphConv, global_max_pool, global_mean_pool

from benchmarks.common import hardware
from benchmarks.statistics import paired_difference
from glomo_pyg.atomic_files import atomic_write
from glomo_pyg.pixels import IMAGENET_MEAN, IMAGENET_STD, normalize
from glomo_pyg.transforms import (
    ChainGraphs,
    FixedGraphs,
    GlomoGraphs,
    GraphsDataset,
    GridGraphs,
    UniformGraphs,
    UnitGraphs,
    image_data,
)

warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
RESULTS = os.path.join(os.path.dirname(__file__), "results", "any_gnn.md")


@dataclasses.dataclass
class Setup:
    train: Optional[int]
    validation: int
    test: Optional[int]
    review_length: int
    image_side: int
    epochs: int
    hidden: int = 64
    batch_size: int = 32
    top_k: int = 8
    heads_top_k: int = 4  # per relation, for the unmerged variant (16 relations)


REDUCED = Setup(train=2000, validation=500, test=2000, review_length=128, image_side=16,
                epochs=8)
FULL = Setup(train=None, validation=2500, test=None, review_length=400, image_side=32,
             epochs=12)
CIFAR_REDUCED = dict(train=3000, validation=500, test=2000)
CIFAR_FULL = dict(train=None, validation=5000, test=None)


class RelationalGNN(torch.nn.Module):
    r"""Embedding, ``layers`` residual relational layers
    :math:`h \leftarrow h + \mathrm{ReLU}(\sum_r \mathrm{GraphConv}_r(h, G_r))`, mean and
    max pooling, a linear classifier.

    Shapes:
        - **input:** a ``Batch`` with ``x``, ``edge_index``, ``edge_weight``,
          ``edge_type``, ``batch``
        - **output:** logits :math:`(B, \text{classes})`
    """

    def __init__(self, num_relations: int, hidden: int, classes: int,
                 num_tokens: Optional[int] = None, in_channels: Optional[int] = None,
                 layers: int = 2, dropout: float = 0.2):
        super().__init__()
        self.embed = torch.nn.Embedding(num_tokens, hidden) if num_tokens is not None else \
            torch.nn.Linear(in_channels, hidden)
        self.convs = torch.nn.ModuleList(
            torch.nn.ModuleList(GraphConv(hidden, hidden) for _ in range(num_relations))
            for _ in range(layers))
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(hidden) for _ in range(layers))
        self.dropout = dropout
        self.out = torch.nn.Linear(2 * hidden, classes)

    def forward(self, data) -> Tensor:
        h = self.embed(data.x)
        adjacency = [relation_adjacency(data, r) for r in range(len(self.convs[0]))]
        for convs, norm in zip(self.convs, self.norms):
            mixed = sum(conv(h, adj) for conv, adj in zip(convs, adjacency))
            h = norm(h + F.dropout(F.relu(mixed), self.dropout, self.training))
        pooled = torch.cat([global_mean_pool(h, data.batch), global_max_pool(h, data.batch)], 1)
        return self.out(F.dropout(pooled, self.dropout, self.training))


def relation_adjacency(data, relation: int) -> Tensor:
    """Relation ``relation``'s edges as a sparse CSR ``[N, N]`` (row: target), which
    ``GraphConv`` multiplies in one sparse product instead of one message per edge. A
    batch of transformed samples holds each relation's edges sorted by target."""
    keep = data.edge_type == relation
    (src, tgt), weight = data.edge_index[:, keep], data.edge_weight[keep]
    n = data.num_nodes
    rows = torch.zeros(n + 1, dtype=torch.long, device=src.device)
    rows[1:] = torch.bincount(tgt, minlength=n).cumsum(0)
    return torch.sparse_csr_tensor(rows, src, weight, (n, n))


def pixel_features(data: Data) -> Data:
    """Model input of an image sample: normalised RGB and the row and column in [0, 1]."""
    side = int(data.pos.max()) + 1
    rgb = normalize(data.x, IMAGENET_MEAN, IMAGENET_STD)
    return Data(x=torch.cat([rgb, data.pos.float() / max(side - 1, 1)], 1), y=data.y,
                edge_index=data.edge_index, edge_weight=data.edge_weight,
                edge_type=data.edge_type)


# ----------------------------------------------------------------------------- data

def imdb_samples(args, setup: Setup, vocabulary: Sequence[str]) -> Dict[str, List[Data]]:
    from glomo_pyg.data import WordVocabulary, read_aclimdb
    from glomo_pyg.training.text_classification import encode_documents, split_train_validation

    train, val = split_train_validation(read_aclimdb(args.data_dir, "train"),
                                        setup.validation, seed=0)
    test = read_aclimdb(args.data_dir, "test")
    if setup.test is not None:
        order = torch.randperm(len(test), generator=torch.Generator().manual_seed(1)).tolist()
        test = [test[k] for k in order[:setup.test]]
    train = train[:setup.train] if setup.train is not None else train
    vocab = WordVocabulary(vocabulary)
    return {name: encode_documents([r.text for r in rs], [r.label for r in rs], vocab,
                                   setup.review_length)
            for name, rs in (("train", train), ("validation", val), ("test", test))}


def cifar_samples(args, setup: Setup) -> Dict[str, List[Data]]:
    sizes = CIFAR_FULL if args.full else CIFAR_REDUCED
    return cifar_splits(args.data_dir, sizes, setup.image_side)


def cifar_splits(data_dir: str, sizes: Dict[str, Optional[int]], side: int,
                 validation_seed: int = 0, test_seed: int = 1) -> Dict[str, List[Data]]:
    """CIFAR-10 as image samples: ``sizes['validation']`` training images (a seeded
    permutation) for validation, then up to ``sizes['train']`` for training, a seeded part
    of ``sizes['test']`` test images (``None``: all); average-pooled to ``side``."""
    from glomo_pyg.data.images import load_cifar10

    root = os.path.join(data_dir, "cifar-10-batches-py")
    images, labels = load_cifar10(root, "train")
    test_images, test_labels = load_cifar10(root, "test")
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(validation_seed))
    val, train = order[:sizes["validation"]], order[sizes["validation"]:]
    train = train[:sizes["train"]] if sizes["train"] is not None else train
    test = torch.randperm(len(test_images), generator=torch.Generator().manual_seed(test_seed))
    test = test[:sizes["test"]] if sizes["test"] is not None else test

    def data(imgs: Tensor, ys: Tensor) -> List[Data]:
        if side != imgs.shape[-1]:
            imgs = F.avg_pool2d(imgs.float(), imgs.shape[-1] // side).round().to(torch.uint8)
        return [image_data(i, y=y.view(1)) for i, y in zip(imgs, ys)]

    return {"train": data(images[train], labels[train]),
            "validation": data(images[val], labels[val]),
            "test": data(test_images[test], test_labels[test])}


IMAGE_EXTRAS = ("uniform", "glomo-heads", "grid-offsets")


def graph_variants(task: str, args, setup: Setup) -> Dict[str, UnitGraphs]:
    """The graphs compared on ``task``; the learned ones (names ``glomo...``) first."""
    device = args.device
    if task == "imdb":
        glomo = GlomoGraphs(args.text_predictor, merge="mean", top_k=setup.top_k,
                            device=device)
        variants = {"glomo": glomo, "chain": ChainGraphs()}
        if not args.full:  # (at 400 tokens, 160k edges per review: too slow to train on)
            variants["uniform"] = UniformGraphs()
        return variants
    side = setup.image_side
    glomo = GlomoGraphs(args.pixel_predictor, merge="mean", top_k=setup.top_k,
                        image_size=(side, side), device=device)
    variants = {"glomo": glomo}
    if "glomo-heads" in args.image_graphs:  # one relation per direction, layer and head
        variants["glomo-heads"] = GlomoGraphs(args.pixel_predictor, top_k=setup.heads_top_k,
                                              image_size=(side, side), device=device)
    variants.update(grid=GridGraphs(side, side), chain=ChainGraphs())
    if "grid-offsets" in args.image_graphs:  # one relation per neighbour offset
        variants["grid-offsets"] = GridGraphs(side, side, relations="offset")
    if "uniform" in args.image_graphs:
        variants["uniform"] = UniformGraphs()
    return variants


class FixedGraphSamples(collections.abc.Sequence):
    """Samples whose fixed graph (the same for every sample of a size) is attached on
    access instead of stored: the uniform graph of 5,500 16x16 images would take 10 GB."""

    def __init__(self, samples: Sequence[Data], graphs: FixedGraphs, task: str):
        self.samples, self.graphs, self.task = samples, graphs, task

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Data:
        data = self.graphs(self.samples[index])
        return pixel_features(data) if self.task == "cifar10" else data


# ----------------------------------------------------------------------------- runs

def evaluate(model, loader, device) -> float:
    model.eval()
    right = total = 0
    with torch.no_grad():
        for batch in loader:
            batch = batch.to(device)
            right += int((model(batch).argmax(-1) == batch.y).sum())
            total += batch.num_graphs
    return right / total


def train_run(task: str, splits: Dict[str, Sequence[Data]], num_relations: int, setup: Setup,
              seed: int, lr: float, device: str, num_tokens: Optional[int]) -> Dict:
    """One model trained ``setup.epochs`` epochs; test accuracy at its best validation epoch."""
    torch.manual_seed(seed)
    classes = 2 if task == "imdb" else 10
    model = RelationalGNN(num_relations, setup.hidden, classes,
                          num_tokens=num_tokens, in_channels=None if num_tokens else 5).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    loaders = {name: DataLoader(splits[name], batch_size=setup.batch_size, shuffle=name == "train",
                                generator=generator if name == "train" else None)
               for name in ("train", "validation", "test")}
    best, start = None, time.perf_counter()
    for epoch in range(setup.epochs):
        model.train()
        for batch in loaders["train"]:
            batch = batch.to(device)
            optimizer.zero_grad()
            F.cross_entropy(model(batch), batch.y).backward()
            optimizer.step()
        val = evaluate(model, loaders["validation"], device)
        if best is None or val > best["validation"]:
            best = dict(epoch=epoch, validation=val, test=evaluate(model, loaders["test"], device))
    return dict(best, seconds=round(time.perf_counter() - start, 1))


def load_runs(path: str) -> Dict:
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def save_runs(path: str, runs: Dict) -> None:
    with atomic_write(path) as fh:
        json.dump(runs, fh, indent=1, sort_keys=True)


def run_task(task: str, args, setup: Setup, runs: Dict, runs_path: str) -> Dict:
    variants = graph_variants(task, args, setup)
    glomo = variants["glomo"]
    raw = imdb_samples(args, setup, glomo.predictor.vocabulary) if task == "imdb" else \
        cifar_samples(args, setup)
    if args.limit is not None:
        raw = {k: v[:args.limit] for k, v in raw.items()}
    info: Dict = dict(sizes={k: len(v) for k, v in raw.items()}, graphs={})
    datasets = {}
    for name, graphs in variants.items():
        start = time.perf_counter()
        if isinstance(graphs, FixedGraphs):
            splits = {k: FixedGraphSamples(v, graphs, task) for k, v in raw.items()}
        else:
            splits = {split: GraphsDataset(os.path.join(args.work, task, name, split), samples,
                                           graphs) for split, samples in raw.items()}
            if task == "cifar10":
                splits = {k: [pixel_features(d) for d in v] for k, v in splits.items()}
        datasets[name] = splits
        edges = sum(int(splits["train"][i].edge_index.size(1))
                    for i in range(len(splits["train"]))) / len(splits["train"])
        info["graphs"][name] = dict(relations=graphs.relations, edges_per_sample=round(edges, 1),
                                    learned=not isinstance(graphs, FixedGraphs),
                                    key=graphs.cache_key,
                                    seconds=round(time.perf_counter() - start, 1))
        log(f"{task}/{name}: {edges:.0f} edges per sample, "
            f"{time.perf_counter() - start:.1f} s to make or load")
    num_tokens = glomo.predictor.num_tokens if task == "imdb" else None

    def run(name: str, seed: int, lr: float) -> Dict:
        key = (f"{task}/{name}/seed={seed}/lr={lr:g}/epochs={setup.epochs}/"
               f"hidden={setup.hidden}/n={info['sizes']['train']}/{info['graphs'][name]['key']}")
        if key not in runs:
            runs[key] = train_run(task, datasets[name], len(variants[name].relations), setup,
                                  seed, lr, args.device, num_tokens)
            save_runs(runs_path, runs)
            log(f"{key}: {runs[key]}")
        return runs[key]

    search = {lr: sum(run(n, 0, lr)["validation"] for n in variants) / len(variants)
              for lr in args.lrs}
    lr = max(args.lrs, key=lambda r: search[r])
    final = {n: [run(n, seed, lr) for seed in range(args.seeds)] for n in variants}
    return dict(info, search=search, lr=lr, final=final)


def log(*parts) -> None:
    print(datetime.datetime.now().strftime("%H:%M:%S"), *parts, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- report

def report(tasks: Dict[str, Dict], args, setup: Setup, command: str, minutes: float) -> List[str]:
    lines = [f"## {datetime.date.today()}: {'full' if args.full else 'reduced CPU'} "
             f"configuration", "",
             f"`{command}` on {hardware(args.device)}, {minutes:.0f} min in all. Model: "
             f"`RelationalGNN` (benchmarks/any_gnn.py): 2 residual layers of one `GraphConv` "
             f"per relation, hidden {setup.hidden}, mean+max pooling; Adam, batch "
             f"{setup.batch_size}, {setup.epochs} epochs, the test accuracy of the epoch "
             f"with the best validation accuracy. `glomo`, `chain`, `uniform`, `grid`: the "
             f"relations forward and backward, GLoMo's layers and heads merged by their mean, "
             f"top {setup.top_k} sources per target and direction; `glomo-heads`: one relation "
             f"per direction, layer and head, top {setup.heads_top_k} each; `grid-offsets`: one "
             f"relation per neighbour offset. Fixed graphs are attached on access, learned ones "
             f"cached.", ""]
    for task, result in tasks.items():
        lines += [f"### {task}", "",
                  f"Samples (train / validation / test): "
                  f"{' / '.join(str(result['sizes'][k]) for k in ('train', 'validation', 'test'))}."
                  f" Learning rate {result['lr']:g}, chosen on validation (seed 0, mean over "
                  f"graphs: " + ", ".join(f"{lr:g}: {v:.4f}" for lr, v in result['search'].items())
                  + ").", "",
                  "| graph | relations | edges per sample | validation acc. | "
                  "test acc. (mean ± sd) | seeds |", "|---|---|---|---|---|---|"]
        for name, rs in result["final"].items():
            tests = [r["test"] * 100 for r in rs]
            mean = sum(tests) / len(tests)
            sd = (sum((t - mean) ** 2 for t in tests) / max(len(tests) - 1, 1)) ** 0.5
            val = sum(r["validation"] for r in rs) / len(rs) * 100
            graph = result['graphs'][name]
            lines.append(f"| {name} | {len(graph['relations'])} | "
                         f"{graph['edges_per_sample']:.0f} | "
                         f"{val:.2f} | {mean:.2f} ± {sd:.2f} | {len(rs)} |")
        lines += ["", "| paired difference (test, points) | mean | 95% interval | excludes 0 |",
                  "|---|---|---|---|"]
        tests = {name: [r["test"] * 100 for r in rs] for name, rs in result["final"].items()}
        learned = [n for n in tests if result["graphs"][n]["learned"]]
        for glomo in learned:
            for name in (n for n in tests if n not in learned):
                mean, low, high, _ = paired_difference(tests[glomo], tests[name])
                verdict = "yes, GLoMo better" if low > 0 else "yes, GLoMo worse" if high < 0 \
                    else "no (not significant)"
                lines.append(f"| {glomo} − {name} | {mean:+.2f} | [{low:+.2f}, {high:+.2f}] "
                             f"| {verdict} |")
        lines.append("")
    return lines


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--task", choices=("imdb", "cifar10", "all"), default="all")
    parser.add_argument("--full", action="store_true", help="the full configuration (GPU)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-3])
    parser.add_argument("--epochs", type=int, default=None, help="override the setup's")
    parser.add_argument("--text-predictor", default="imdb-text-cpu")
    parser.add_argument("--pixel-predictor", default=None,
                        help="default: imagenet32-pixel-cpu (reduced), imagenet32-pixel (full)")
    parser.add_argument("--image-graphs", nargs="*", default=[], choices=IMAGE_EXTRAS,
                        help="more graphs on images: 'uniform' (O(T^2) edges), 'glomo-heads' "
                             "(GLoMo unmerged: one relation per direction, layer and head), "
                             "'grid-offsets' (the grid with one relation per neighbour)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--work", default=None, help="cache folder (default runs/any_gnn-...)")
    parser.add_argument("--results", default=RESULTS)
    parser.add_argument("--limit", type=int, default=None,
                        help="at most this many samples per split (a dry run)")
    args = parser.parse_args(argv)
    if args.seeds < 1 or not args.lrs or (args.epochs is not None and args.epochs < 1):
        parser.error("--seeds and --epochs must be >= 1 and --lrs non-empty")
    if not os.path.isdir(args.data_dir):
        parser.error(f"--data-dir {args.data_dir} is not a folder")
    args.pixel_predictor = args.pixel_predictor or \
        ("imagenet32-pixel" if args.full else "imagenet32-pixel-cpu")
    args.work = args.work or os.path.join("runs", f"any_gnn-{'full' if args.full else 'reduced'}")
    return args


def main(argv=None) -> None:
    args = parse(argv)
    setup = dataclasses.replace(FULL if args.full else REDUCED)
    if args.epochs is not None:
        setup.epochs = args.epochs
    os.makedirs(args.work, exist_ok=True)
    runs_path = os.path.join(args.work, "runs.json")
    runs, start = load_runs(runs_path), time.perf_counter()
    tasks = {t: run_task(t, args, setup, runs, runs_path)
             for t in (("imdb", "cifar10") if args.task == "all" else (args.task,))}
    command = "python -m benchmarks.any_gnn " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = report(tasks, args, setup, command, (time.perf_counter() - start) / 60)
    with open(args.results, "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
