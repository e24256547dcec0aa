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
is drawn; GLoMo's are made once and cached (``GraphsDataset``). ``learned``: the graph
the model learns itself per sample (PICK's ``glomo_pyg.nn.GraphLearning``, in the two
directions' orders, top ``top_k`` per target, its loss added to the task's); ``--models
pick`` runs the same comparison with ``glomo_pyg.nn.PickConv`` (pairwise messages and
relative-position edge embeddings) instead of ``GraphConv``, over ``--pick-graphs``.
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
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GraphConv, global_max_pool, global_mean_pool

from benchmarks.common import hardware
from benchmarks.statistics import mean_sd, paired_difference
from glomo_pyg.atomic_files import atomic_write
from glomo_pyg.nn import GraphLearning, PickConv, relative_positions
from glomo_pyg.ordering import DIRECTIONS, RasterOrder, SequenceOrder, UnitOrder
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


@dataclasses.dataclass(frozen=True)
class Learning:
    r"""The task-learned graph (``learned``: ``glomo_pyg.nn.GraphLearning``, PICK's), fixed
    before the runs: learned from the embedding projected to ``width`` and normalised (so
    :math:`\lVert v_i - v_j \rVert^2 \le 4` and :math:`L_{GL}` cannot overflow), PICK's
    ``eta`` and ``gamma``, :math:`L_{GL}` added to the task's loss with ``weight``."""

    width: int = 16
    eta: float = 1.0
    gamma: float = 1.0
    weight: float = 0.01


LEARNING = Learning()
LEARNED = "learned"
MODELS = ("graphconv", "pick")


class RelationalGNN(torch.nn.Module):
    r"""Embedding, ``layers`` residual relational layers
    :math:`h \leftarrow h + \mathrm{ReLU}(\sum_r \mathrm{conv}_r(h, G_r))`, mean and
    max pooling, a linear classifier. ``conv='graphconv'``: PyG's ``GraphConv``;
    ``'pick'``: :class:`~glomo_pyg.nn.PickConv`, its first layer's edge embeddings from
    the units' relative positions (scaled by ``position_scale``), the next layer's from
    the previous. With ``learn_orders`` the graphs :math:`G_r` are learned from the
    embedding, one :class:`~glomo_pyg.nn.GraphLearning` per order (the batch's own
    graphs are not read); otherwise they are the batch's, by ``edge_type``.

    Shapes:
        - **input:** a ``Batch`` with ``x``, ``batch`` (and ``edge_index``,
          ``edge_weight``, ``edge_type`` unless learned; ``pos`` for images with ``pick``)
        - **output:** logits :math:`(B, \text{classes})` and the graph-learning loss
          (0 unless learned)
    """

    def __init__(self, num_relations: int, hidden: int, classes: int,
                 num_tokens: Optional[int] = None, in_channels: Optional[int] = None,
                 layers: int = 2, dropout: float = 0.2, conv: str = "graphconv",
                 learn_orders: Optional[Sequence[UnitOrder]] = None,
                 learning: Learning = LEARNING, top_k: int = 8, position_scale: float = 1.0):
        super().__init__()
        self.embed = torch.nn.Embedding(num_tokens, hidden) if num_tokens is not None else \
            torch.nn.Linear(in_channels, hidden)
        self.conv, self.num_relations, self.position_scale = conv, num_relations, position_scale
        self.learn_in = self.learners = None
        if learn_orders is not None:
            self.learn_in = torch.nn.Linear(hidden, learning.width)
            self.learners = torch.nn.ModuleList(
                GraphLearning(learning.width, order, top_k=top_k, eta=learning.eta,
                              gamma=learning.gamma) for order in learn_orders)
        position_dim = 2 if num_tokens is not None else 3  # offsets and the distance

        def make(layer: int) -> torch.nn.Module:
            if conv == "pick":
                return PickConv(hidden, hidden, edge_dim=position_dim if layer == 0 else None)
            return GraphConv(hidden, hidden)

        self.convs = torch.nn.ModuleList(
            torch.nn.ModuleList(make(layer) for _ in range(num_relations))
            for layer in range(layers))
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(hidden) for _ in range(layers))
        self.dropout = dropout
        self.out = torch.nn.Linear(2 * hidden, classes)

    def forward(self, data) -> Tuple[Tensor, Tensor]:
        h = self.embed(data.x)
        graphs, graph_loss = self.relations(data, h)
        attrs = [self.positions(data, g[0]) for g in graphs] if self.conv == "pick" else None
        for convs, norm in zip(self.convs, self.norms):
            if attrs is not None:
                outs = [conv(h, *g, a) for conv, g, a in zip(convs, graphs, attrs)]
                mixed, attrs = sum(o[0] for o in outs), [o[1] for o in outs]
            else:
                mixed = sum(conv(h, *g) for conv, g in zip(convs, graphs))
            h = norm(h + F.dropout(F.relu(mixed), self.dropout, self.training))
        pooled = torch.cat([global_mean_pool(h, data.batch), global_max_pool(h, data.batch)], 1)
        return self.out(F.dropout(pooled, self.dropout, self.training)), graph_loss

    def relations(self, data, h: Tensor) -> Tuple[List[Tuple[Tensor, ...]], Tensor]:
        """Each relation's graph as the conv's arguments, and the graph-learning loss."""
        if self.learners is not None:
            assert self.learn_in is not None
            features = F.normalize(self.learn_in(h), dim=-1)
            learned = [learner(features, data.batch) for learner in self.learners]
            return [(g.edge_index, g.edge_weight) for g in learned], \
                torch.stack([g.loss for g in learned]).sum()
        relations = range(self.num_relations)
        if self.conv == "graphconv":  # one sparse product per relation
            return [(relation_adjacency(data, r),) for r in relations], h.new_zeros(())
        return [relation_edges(data, r) for r in relations], h.new_zeros(())

    def positions(self, data, edge_index: Tensor) -> Tensor:
        """Relative positions of the edges' units: in the sequence, or (row, column)."""
        pos = data.pos if getattr(data, "pos", None) is not None else \
            torch.arange(data.num_nodes, device=edge_index.device) - data.ptr[data.batch]
        return relative_positions(edge_index, pos, self.position_scale)


def relation_edges(data, relation: int) -> Tuple[Tensor, Tensor]:
    """Relation ``relation``'s ``(edge_index, edge_weight)``."""
    keep = data.edge_type == relation
    return data.edge_index[:, keep], data.edge_weight[keep]


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
    """Model input of an image sample: normalised RGB and the row and column in [0, 1];
    its graph (if any) and its ``pos`` kept."""
    side = int(data.pos.max()) + 1
    rgb = normalize(data.x, IMAGENET_MEAN, IMAGENET_STD)
    graph = {k: data[k] for k in ("edge_index", "edge_weight", "edge_type") if k in data}
    return Data(x=torch.cat([rgb, data.pos.float() / max(side - 1, 1)], 1), y=data.y,
                pos=data.pos, **graph)


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


class TaskLearnedGraphs:
    """The ``learned`` variant: no graph on the samples, the model learns one per sample
    and relation (:class:`Learning`) in the orders of GLoMo's two directions."""

    relations = DIRECTIONS

    def __init__(self, task: str, setup: Setup, learning: Learning = LEARNING):
        self.task, self.side, self.top_k, self.learning = task, setup.image_side, \
            setup.top_k, learning
        self.cache_key = self.key(learning)

    def key(self, learning: Learning) -> str:
        """The run cache's name of this graph learned with ``learning``."""
        return (f"learned-w{learning.width}-eta{learning.eta:g}-gamma"
                f"{learning.gamma:g}-weight{learning.weight:g}-k{self.top_k}")

    def orders(self) -> List[UnitOrder]:
        if self.task == "imdb":
            return [SequenceOrder(d) for d in DIRECTIONS]
        return [RasterOrder(d, self.side, self.side) for d in DIRECTIONS]

    def edges_per_sample(self, samples: Sequence[Data], top_k: int) -> float:
        """Mean edges the learner keeps per sample: ``top_k`` sources per target, fewer
        where the order allows fewer."""
        total = 0
        for data in samples:
            n = data.num_nodes
            for order in self.orders():
                pos = torch.arange(n)
                total += int(order.num_sources(pos, torch.full_like(pos, n)).clamp(
                    max=top_k).sum())
        return total / max(len(samples), 1)


class FixedGraphSamples(collections.abc.Sequence):
    """Samples whose fixed graph (the same for every sample of a size) is attached on
    access instead of stored: the uniform graph of 5,500 16x16 images would take 10 GB.
    ``graphs=None``: none (the model learns its own)."""

    def __init__(self, samples: Sequence[Data], graphs: Optional[FixedGraphs], task: str):
        self.samples, self.graphs, self.task = samples, graphs, task

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Data:
        data = self.samples[index]
        data = data if self.graphs is None else self.graphs(data)
        return pixel_features(data) if self.task == "cifar10" else data


# ----------------------------------------------------------------------------- runs

def evaluate(model, loader, device) -> float:
    model.eval()
    right = total = 0
    with torch.no_grad():
        for batch in loader:
            batch = batch.to(device)
            right += int((model(batch)[0].argmax(-1) == batch.y).sum())
            total += batch.num_graphs
    return right / total


def train_run(task: str, splits: Dict[str, Sequence[Data]], num_relations: int, setup: Setup,
              seed: int, lr: float, device: str, num_tokens: Optional[int],
              conv: str = "graphconv", learn_orders: Optional[Sequence[UnitOrder]] = None,
              learning: Learning = LEARNING) -> Dict:
    """One model trained ``setup.epochs`` epochs; test accuracy at its best validation
    epoch. ``learn_orders``: the model learns its graphs (loss + ``learning.weight``
    :math:`L_{GL}`)."""
    torch.manual_seed(seed)
    classes = 2 if task == "imdb" else 10
    scale = setup.review_length if task == "imdb" else setup.image_side
    model = RelationalGNN(num_relations, setup.hidden, classes, num_tokens=num_tokens,
                          in_channels=None if num_tokens else 5, conv=conv,
                          learn_orders=learn_orders, learning=learning, top_k=setup.top_k,
                          position_scale=float(scale)).to(device)
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
            logits, graph_loss = model(batch)
            (F.cross_entropy(logits, batch.y) + learning.weight * graph_loss).backward()
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


def task_datasets(task: str, args, setup: Setup, raw: Dict[str, List[Data]],
                  variants: Dict) -> Tuple[Dict, Dict]:
    """Each graph's splits (fixed graphs attached on access, GLoMo's cached, none for the
    task-learned graph) and what they hold."""
    graphs_info, datasets = {}, {}
    for name, graphs in variants.items():
        start = time.perf_counter()
        if isinstance(graphs, (FixedGraphs, TaskLearnedGraphs)):
            fixed = graphs if isinstance(graphs, FixedGraphs) else None
            splits = {k: FixedGraphSamples(v, fixed, task) for k, v in raw.items()}
        else:
            splits = {split: GraphsDataset(os.path.join(args.work, task, name, split), samples,
                                           graphs) for split, samples in raw.items()}
            if task == "cifar10":
                splits = {k: [pixel_features(d) for d in v] for k, v in splits.items()}
        datasets[name] = splits
        train = splits["train"]
        edges = graphs.edges_per_sample(raw["train"], setup.top_k) \
            if isinstance(graphs, TaskLearnedGraphs) else \
            sum(int(train[i].edge_index.size(1)) for i in range(len(train))) / len(train)
        graphs_info[name] = dict(relations=graphs.relations, edges_per_sample=round(edges, 1),
                                 learned=not isinstance(graphs, FixedGraphs),
                                 pretrained=name.startswith("glomo"), key=graphs.cache_key,
                                 seconds=round(time.perf_counter() - start, 1))
        log(f"{task}/{name}: {edges:.0f} edges per sample, "
            f"{time.perf_counter() - start:.1f} s to make or load")
    return datasets, graphs_info


def model_graphs(task: str, args, variants: Dict) -> Dict[str, List[str]]:
    """The graphs each model of ``args.models`` runs over: the stock GNN over every
    graph, ``PickConv`` over ``args.pick_graphs`` (default GLoMo's, the local fixed one
    and the task-learned one)."""
    local = "chain" if task == "imdb" else "grid"
    pick = args.pick_graphs or ["glomo", local, LEARNED]
    return {m: list(variants) if m == "graphconv" else [g for g in pick if g in variants]
            for m in args.models}


def run_task(task: str, args, setup: Setup, runs: Dict, runs_path: str) -> Dict:
    variants: Dict = dict(graph_variants(task, args, setup))
    glomo = variants["glomo"]
    variants[LEARNED] = TaskLearnedGraphs(task, setup, dataclasses.replace(
        LEARNING, weight=args.learned_weights[0]))
    if args.graphs is not None:  # (GLoMo's predictor is kept: its vocabulary encodes text)
        variants = {n: g for n, g in variants.items() if n in args.graphs}
    raw = imdb_samples(args, setup, glomo.predictor.vocabulary) if task == "imdb" else \
        cifar_samples(args, setup)
    if args.limit is not None:
        raw = {k: v[:args.limit] for k, v in raw.items()}
    datasets, graphs_info = task_datasets(task, args, setup, raw, variants)
    info: Dict = dict(sizes={k: len(v) for k, v in raw.items()}, graphs=graphs_info)
    num_tokens = glomo.predictor.num_tokens if task == "imdb" else None

    def run(model: str, name: str, seed: int, lr: float, weight: Optional[float] = None
            ) -> Dict:
        """One cached run; ``weight``: the learned graph's L_GL weight, if not the first."""
        graphs, learning = variants[name], LEARNING
        graph_key = graphs_info[name]["key"]
        if isinstance(graphs, TaskLearnedGraphs):
            learning = graphs.learning if weight is None else \
                dataclasses.replace(graphs.learning, weight=weight)
            graph_key = graphs.key(learning)
        prefix = f"{task}/{name}" if model == "graphconv" else f"{task}/{model}/{name}"
        key = (f"{prefix}/seed={seed}/lr={lr:g}/epochs={setup.epochs}/"
               f"hidden={setup.hidden}/n={info['sizes']['train']}/{graph_key}")
        if key not in runs:
            orders = graphs.orders() if isinstance(graphs, TaskLearnedGraphs) else None
            runs[key] = train_run(task, datasets[name], len(graphs.relations), setup, seed,
                                  lr, args.device, num_tokens, conv=model, learn_orders=orders,
                                  learning=learning)
            save_runs(runs_path, runs)
            log(f"{key}: {runs[key]}")
        return runs[key]

    models = {}
    for model, names in model_graphs(task, args, variants).items():
        search = {lr: sum(run(model, n, 0, lr)["validation"] for n in names) / len(names)
                  for lr in args.lrs}
        lr = max(args.lrs, key=lambda r: search[r])
        # the learned graph's L_GL weight, at the rate chosen (seed 0, validation)
        weights = {w: run(model, LEARNED, 0, lr, w)["validation"]
                   for w in args.learned_weights} if LEARNED in names else {}
        weight = max(args.learned_weights, key=lambda w: weights[w]) if weights else None
        models[model] = dict(search=search, lr=lr, learned_weights=weights,
                             learned_weight=weight, final={
                                 n: [run(model, n, seed, lr, weight if n == LEARNED else None)
                                     for seed in range(args.seeds)] for n in names})
    return dict(info, models=models)


def log(*parts) -> None:
    print(datetime.datetime.now().strftime("%H:%M:%S"), *parts, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- report

MODEL_NAMES = {"graphconv": "stock GNN (`GraphConv`)", "pick": "`PickConv`"}


def intro_lines(args, setup: Setup, command: str, minutes: float) -> List[str]:
    return [f"## {datetime.date.today()}: {'full' if args.full else 'reduced CPU'} "
            f"configuration", "",
            f"`{command}` on {hardware(args.device)}, {minutes:.0f} min in all. Model: "
            f"`RelationalGNN` (benchmarks/any_gnn.py): 2 residual layers of one conv per "
            f"relation (`GraphConv`, or `PickConv` with relative-position edge embeddings), "
            f"hidden {setup.hidden}, mean+max pooling; Adam, batch {setup.batch_size}, "
            f"{setup.epochs} epochs, the test accuracy of the epoch with the best validation "
            f"accuracy. `glomo`, `chain`, `uniform`, `grid`: the relations forward and "
            f"backward, GLoMo's layers and heads merged by their mean, top {setup.top_k} "
            f"sources per target and direction; `glomo-heads`: one relation per direction, "
            f"layer and head, top {setup.heads_top_k} each; `grid-offsets`: one relation per "
            f"neighbour offset; `learned`: PICK's graph learning (`GraphLearning`) per "
            f"sample, in the two directions' orders, top {setup.top_k} per target, "
            f"features projected to {LEARNING.width} and normalised, eta {LEARNING.eta:g}, "
            f"gamma {LEARNING.gamma:g}, the L_GL weight chosen among "
            f"{', '.join(f'{w:g}' for w in args.learned_weights)}. Fixed graphs are attached "
            f"on access, GLoMo's cached.", ""]


def graph_table(result: Dict, model: Dict) -> List[str]:
    lines = ["| graph | relations | edges per sample | validation acc. | "
             "test acc. (mean ± sd) | seeds |", "|---|---|---|---|---|---|"]
    for name, rs in model["final"].items():
        mean, sd = mean_sd([r["test"] * 100 for r in rs])
        val = sum(r["validation"] for r in rs) / len(rs) * 100
        graph = result["graphs"][name]
        lines.append(f"| {name} | {len(graph['relations'])} | {graph['edges_per_sample']:.0f} | "
                     f"{val:.2f} | {mean:.2f} ± {sd:.2f} | {len(rs)} |")
    return lines


def paired_pairs(result: Dict, names: Sequence[str]) -> List[Tuple[str, str]]:
    """GLoMo's graphs against every other graph, the task-learned one against the fixed."""
    graphs = result["graphs"]
    pretrained = [n for n in names if graphs[n]["pretrained"]]
    pairs = [(g, n) for g in pretrained for n in names if n not in pretrained]
    return pairs + [(LEARNED, n) for n in names if LEARNED in names and not graphs[n]["learned"]]


def paired_table(result: Dict, model: Dict) -> List[str]:
    lines = ["| paired difference (test, points) | mean | 95% interval | excludes 0 |",
             "|---|---|---|---|"]
    tests = {name: [r["test"] * 100 for r in rs] for name, rs in model["final"].items()}
    for first, second in paired_pairs(result, list(tests)):
        mean, low, high, _ = paired_difference(tests[first], tests[second])
        verdict = f"yes, {first} better" if low > 0 else f"yes, {first} worse" if high < 0 \
            else "no (not significant)"
        lines.append(f"| {first} − {second} | {mean:+.2f} | [{low:+.2f}, {high:+.2f}] "
                     f"| {verdict} |")
    return lines


def report(tasks: Dict[str, Dict], args, setup: Setup, command: str, minutes: float) -> List[str]:
    lines = intro_lines(args, setup, command, minutes)
    for task, result in tasks.items():
        sizes = " / ".join(str(result["sizes"][k]) for k in ("train", "validation", "test"))
        lines += [f"### {task}", "", f"Samples (train / validation / test): {sizes}.", ""]
        for name, model in result["models"].items():
            search = ", ".join(f"{lr:g}: {v:.4f}" for lr, v in model["search"].items())
            lines += [f"**{MODEL_NAMES[name]}**: learning rate {model['lr']:g}, chosen on "
                      f"validation (seed 0, mean over graphs: {search}).", ""]
            if model.get("learned_weights"):
                tried = ", ".join(f"{w:g}: {v:.4f}" for w, v in model["learned_weights"].items())
                lines += [f"`learned`'s L_GL weight {model['learned_weight']:g}, chosen on "
                          f"validation at that rate (seed 0: {tried}).", ""]
            lines += graph_table(result, model) + [""] + paired_table(result, model) + [""]
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
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS,
                        help="'graphconv' (the stock GNN over every graph), 'pick' (PickConv)")
    parser.add_argument("--pick-graphs", nargs="+", default=None,
                        help="the graphs PickConv runs over (default: glomo, the local fixed "
                             "graph, learned)")
    parser.add_argument("--learned-weights", type=float, nargs="+", default=[LEARNING.weight],
                        help="L_GL weights of the learned graph, chosen on validation (seed 0, "
                             "at the learning rate chosen with the first)")
    parser.add_argument("--graphs", nargs="+", default=None,
                        help="run only these graphs (default: all of the task's)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--work", default=None, help="cache folder (default runs/any_gnn-...)")
    parser.add_argument("--results", default=RESULTS)
    parser.add_argument("--limit", type=int, default=None,
                        help="at most this many samples per split (a dry run)")
    args = parser.parse_args(argv)
    if args.seeds < 1 or not args.lrs or (args.epochs is not None and args.epochs < 1):
        parser.error("--seeds and --epochs must be >= 1 and --lrs non-empty")
    if any(not 0 <= w < float("inf") for w in args.learned_weights):
        parser.error(f"--learned-weights must be finite and >= 0, got {args.learned_weights}")
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
