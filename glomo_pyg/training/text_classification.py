"""Downstream text classification with Lightning, selected on a validation split."""
from __future__ import annotations

import copy
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Union, cast

import lightning.pytorch as pl
import torch
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader

from glomo_pyg.data.text import WordVocabulary, tokenize
from glomo_pyg.nn.text_classifier import GlomoTextClassifier
from glomo_pyg.settings import Rule
from glomo_pyg.training.utils import quiet_lightning
from glomo_pyg.transforms.text_cache import TextGraphCache

# each training and validation document's row in the graph cache (a name PyG's collation
# neither offsets, as '*index*', nor reads as a batch vector, '*batch*')
CACHE_ROW = "graph_cache_row"


def encode_documents(texts: Sequence[str], labels: Sequence[int], vocabulary: WordVocabulary,
                     max_length: Optional[int] = None, lower: bool = True) -> List[Data]:
    """One :class:`~torch_geometric.data.Data` per document: ``x`` its token ids (the first
    ``max_length`` tokens; an empty document becomes one ``<unk>``) and ``y`` its label."""
    if len(texts) != len(labels):
        raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
    return [Data(x=vocabulary.encode(tokenize(text, lower)[:max_length] or ["<unk>"]),
                 y=torch.tensor([int(label)])) for text, label in zip(texts, labels)]


class TextClassification(pl.LightningModule):
    """Cross-entropy training of a classifier ``model(x, batch) -> logits`` with Adam on
    its trainable parameters; logs ``train_loss``, ``val_acc``, ``test_acc``. With
    ``graph_cache``, batches whose documents carry their cache row (``graph_cache_row``)
    get their graphs from it; others run the predictor, in float32 like the cache."""

    def __init__(self, model: torch.nn.Module, lr: float = 1e-3, weight_decay: float = 0.0,
                 graph_cache: Optional[TextGraphCache] = None):
        super().__init__()
        self.model, self.lr, self.weight_decay, self.graph_cache = model, lr, weight_decay, \
            graph_cache

    def forward(self, x, batch, graphs=None):
        return self.model(x, batch) if graphs is None else self.model(x, batch, graphs=graphs)

    def _logits(self, data):
        graphs, rows = None, getattr(data, CACHE_ROW, None)
        if self.graph_cache is not None and rows is not None:
            graphs = self.graph_cache.graphs(rows, device=data.x.device)
        elif self.graph_cache is not None:
            # documents outside the cache (the test set): float32, as the cached graphs
            with torch.autocast(data.x.device.type, enabled=False):
                graphs = self.model.transfer.graphs(data.x, data.batch,
                                                    num_nodes=data.x.size(0))
        return self(data.x, data.batch, graphs)

    def training_step(self, data, batch_idx):
        loss = torch.nn.functional.cross_entropy(self._logits(data), data.y)
        if not torch.isfinite(loss):  # stop instead of recording a NaN run as a result
            raise FloatingPointError(f"the training loss is {loss.item()} at step "
                                     f"{self.global_step}: non-finite features (word vectors "
                                     "too large?) or a learning rate too high")
        self.log("train_loss", loss, batch_size=int(data.num_graphs), prog_bar=True,
                 on_step=True, on_epoch=True)
        return loss

    def _accuracy(self, data, stage):
        correct = (self._logits(data).argmax(-1) == data.y).float().mean()
        self.log(f"{stage}_acc", correct, batch_size=int(data.num_graphs), prog_bar=True)

    def validation_step(self, data, batch_idx):
        self._accuracy(data, "val")

    def test_step(self, data, batch_idx):
        self._accuracy(data, "test")

    def configure_optimizers(self):
        params = [p for p in self.model.parameters() if p.requires_grad]
        return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)


@dataclass
class ClassificationResult:
    val_acc: float
    test_acc: float
    best_epoch: int
    seconds: float
    val_history: List[float] = field(default_factory=list)  # validation accuracy per epoch
    loss_history: List[float] = field(default_factory=list)  # mean training loss per epoch


class _History(pl.Callback):
    def __init__(self):
        self.val, self.loss = [], []

    def on_validation_epoch_end(self, trainer, module):
        if not trainer.sanity_checking and "val_acc" in trainer.callback_metrics:
            self.val.append(float(trainer.callback_metrics["val_acc"]))

    def on_train_epoch_end(self, trainer, module):
        if "train_loss_epoch" in trainer.callback_metrics:
            self.loss.append(float(trainer.callback_metrics["train_loss_epoch"]))


def cache_documents(model: GlomoTextClassifier, train: List[Data], val: List[Data],
                    batch_size: int = 64, device=None,
                    weight_dtype: torch.dtype = torch.float32) -> TextGraphCache:
    """:func:`train_and_test`'s ``graph_cache``: the graphs of ``train + val``."""
    return TextGraphCache.compute(model, [d.x for d in list(train) + list(val)], batch_size,
                                  device, weight_dtype)


_POSITIVE_INT, _POSITIVE = Rule(int, low=1), Rule(float, low=0, low_open=True)


def _graph_cache(model: torch.nn.Module, graph_cache: Union[None, bool, TextGraphCache],
                 train: List[Data], val: List[Data]) -> Optional[TextGraphCache]:
    """``graph_cache`` as a cache checked against ``model`` and the documents, or None."""
    if graph_cache is None or graph_cache is False:
        return None
    if not isinstance(model, GlomoTextClassifier) or not (
            graph_cache is True or isinstance(graph_cache, TextGraphCache)):
        raise TypeError(f"graph_cache must be None, a bool or a TextGraphCache (from "
                        f"cache_documents), and a graph_cache needs a GlomoTextClassifier; "
                        f"got {type(graph_cache).__name__} for a {type(model).__name__}")
    if graph_cache is True:
        graph_cache = cache_documents(model, train, val)
    graph_cache.check_model(model)
    graph_cache.check_documents([d.x for d in list(train) + list(val)])
    return graph_cache


def train_and_test(model: torch.nn.Module, train: List[Data], val: List[Data], test: List[Data],
                   epochs: int = 5, batch_size: int = 32, lr: float = 1e-3, seed: int = 0,
                   accelerator: str = "auto", precision: str = "32-true",
                   progress_bar: bool = False,
                   graph_cache: Union[None, bool, TextGraphCache] = None
                   ) -> ClassificationResult:
    """Train for ``epochs``, keep the epoch with the best validation accuracy, and
    evaluate that one once on ``test``; a non-finite training loss raises
    :class:`FloatingPointError`.

    Args:
        graph_cache: for a :class:`~glomo_pyg.GlomoTextClassifier`, the graphs of
            ``train`` and ``val`` computed once instead of at every step, with the same
            results: ``True`` computes them here, or pass :func:`cache_documents`'s cache.
    """
    from lightning.pytorch.callbacks import ModelCheckpoint

    for name, value, rule in (("epochs", epochs, _POSITIVE_INT),
                              ("batch_size", batch_size, _POSITIVE_INT), ("lr", lr, _POSITIVE)):
        rule.check(name, value, typed=True)
    for name, items in (("train", train), ("val", val), ("test", test)):
        if len(items) == 0:
            raise ValueError(f"the {name} split is empty")
    start = time.time()
    graph_cache = _graph_cache(model, graph_cache, train, val)
    if graph_cache is not None:  # shallow copies of the documents, with their cache row
        rows = [copy.copy(d) for d in [*train, *val]]
        for k, d in enumerate(rows):
            d[CACHE_ROW] = torch.tensor([k])
        train, val = rows[:len(train)], rows[len(train):]
    pl.seed_everything(seed, workers=True, verbose=False)
    module = TextClassification(model, lr, graph_cache=graph_cache)
    gen = torch.Generator().manual_seed(seed)
    loaders = dict(train=DataLoader(train, batch_size=batch_size, shuffle=True, generator=gen),
                   val=DataLoader(val, batch_size=batch_size), test=DataLoader(test, batch_size))
    with tempfile.TemporaryDirectory() as tmp, quiet_lightning():
        best = ModelCheckpoint(dirpath=tmp, monitor="val_acc", mode="max", save_top_k=1,
                               filename="best-{epoch}", save_weights_only=True)
        history = _History()
        trainer = pl.Trainer(max_epochs=epochs, accelerator=accelerator,
                             precision=cast(Any, precision),  # (Lightning checks the name)
                             logger=False, callbacks=[best, history],
                             enable_progress_bar=progress_bar, enable_model_summary=False,
                             num_sanity_val_steps=0, deterministic=False)
        trainer.fit(module, loaders["train"], loaders["val"])
        module.load_state_dict(torch.load(best.best_model_path, weights_only=True)["state_dict"])
        test_metrics = trainer.test(module, loaders["test"], verbose=False)[0]
        best_epoch = int(os.path.basename(best.best_model_path).split("=")[1].split(".")[0])
    # (a score: validation ran, and monitored val_acc)
    return ClassificationResult(val_acc=float(cast(torch.Tensor, best.best_model_score)),
                                test_acc=test_metrics["test_acc"], best_epoch=best_epoch,
                                seconds=time.time() - start, val_history=history.val,
                                loss_history=history.loss)


def split_train_validation(items: Sequence, validation: int, seed: int = 0):
    """A seeded random hold-out of ``validation`` items (model selection only)."""
    validation = Rule(int, low=1, high=len(items) - 1).check("validation", validation,
                                                             typed=True)
    order = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed)).tolist()
    return [items[k] for k in order[validation:]], [items[k] for k in order[:validation]]
