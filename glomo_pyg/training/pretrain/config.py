"""The settings of ``glomo pretrain``, each checked with an error naming its dotted key."""
from __future__ import annotations

import dataclasses
import inspect
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from glomo_pyg.data.corpora import IMAGE_FORMATS, TEXT_FORMATS
from glomo_pyg.data.text import SPECIALS
from glomo_pyg.nn.glomo import EMBEDDING_PARTS, Glomo
from glomo_pyg.nn.settings import IMAGE_DEFAULTS, MAX_VOCABULARY, TEXT_DEFAULTS, check_model_setting
from glomo_pyg.settings import (
    THREADS,
    DevicesRule,
    check_settings,
    from_mapping,
    set_by_path,
    setting,
    short_repr,
)

OPTIMIZERS = ("adam", "sgd")

__all__ = ["CorpusConfig", "TrainConfig", "PretrainConfig", "set_by_path", "short_repr",
           "PRECISIONS", "CORPUS_FORMATS", "LOGGERS", "INIT_VECTORS_PARTS", "model_defaults"]

CORPUS_FORMATS = TEXT_FORMATS + IMAGE_FORMATS
LOGGERS = ("csv", "tensorboard")
# train.init_vectors_parts: the embeddings (Glomo.set_token_embeddings) each value sets
INIT_VECTORS_PARTS = {"both": EMBEDDING_PARTS, "graph": ("graph",), "features": ("features",)}


def _accelerators():
    """'auto', 'gpu' and the accelerators Lightning registers ('cpu', 'cuda', 'mps', ...)"""
    from lightning.pytorch.accelerators import AcceleratorRegistry

    return ("auto", "gpu", *sorted(AcceleratorRegistry.available_accelerators()))


def _strategies():
    """'auto' and the strategies Lightning registers ('ddp', 'deepspeed', ...)"""
    from lightning.pytorch.strategies import StrategyRegistry

    return ("auto", *StrategyRegistry.available_strategies())


# Lightning's precision settings that pretraining supports (Lightning's list is private;
# transformer-engine needs NVIDIA's extra package)
PRECISIONS = ("64-true", "32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed",
              "64", "32", "16", "bf16")


@dataclass
class CorpusConfig:
    """Where the documents come from and how they become training sequences."""

    path: Optional[str] = setting(None, doc="text file or folder, a CSV/TSV/JSON-lines file "
                                            "(with column), the aclImdb folder, or an image "
                                            "folder")
    format: str = setting("text", choices=CORPUS_FORMATS,
                          doc="'text', 'aclimdb' (train/unsup + train/{pos,neg}, no test), or "
                              "images: 'cifar10' (cifar-10-batches-py, training batches) or "
                              "'imagenet32' (Downsampled-ImageNet batches)")
    one_per_line: bool = setting(False, doc="text: one document per line instead of per file")
    column: Optional[str] = setting(None, doc="text: the column (CSV, TSV) or field (JSON "
                                              "lines) holding each record's text, a "
                                              "document per record")
    lower: bool = setting(True, doc="text: lower-case every token")
    min_count: int = setting(3, low=1, doc="text: occurrences a word needs to get an id")
    max_size: Optional[int] = setting(30000, low=len(SPECIALS) + 1, high=MAX_VOCABULARY,
                                      note="the special tokens included",
                                      doc="text: largest vocabulary")
    max_length: int = setting(128, low=2, doc="units per training sequence")
    min_length: int = setting(8, low=2, doc="shortest training sequence")
    max_documents: Optional[int] = setting(None, low=1, doc="an even spread of this many "
                                                            "documents (reduced runs)")
    validation_fraction: float = setting(0.01, low=0, high=1, high_open=True,
                                         doc="documents held out for validation")
    shard_tokens: int = setting(1 << 26, low=1, doc="tokens per shard of the token cache")
    max_images: Optional[int] = setting(None, low=2, doc="images: an even spread of this many "
                                                         "(reduced runs)")
    flip: bool = setting(True, doc="images: random horizontal flips while training")
    crop: Optional[int] = setting(None, low=2, note="pixels per side",
                                  doc="images: pretrain on random crops of this side (the "
                                      "predictor, convolutional and with offset-only position "
                                      "terms, is saved for the full image size); cheaper per "
                                      "image")


@dataclass
class TrainConfig:
    """Optimisation and the Lightning trainer."""

    batch_size: int = setting(32, low=1, high=1 << 24, doc="sequences (images) per step")
    max_steps: int = setting(10000, low=1, doc="optimiser steps")
    lr: float = setting(1e-3, low=0, low_open=True, doc="learning rate")
    graph_lr_scale: float = setting(1.0, low=0, doc="the graph predictor's lr, relative")
    graph_warmup_steps: int = setting(500, low=0, doc="steps before the graph predictor learns "
                                                      "at full rate")
    weight_decay: float = setting(0.0, low=0)
    optimizer: str = setting("adam", choices=OPTIMIZERS,
                             doc="'adam' or 'sgd' (the reference code: lr 8, momentum 0.2, "
                                 "clip 0.25)")
    momentum: float = setting(0.0, low=0, high=1, high_open=True, doc="SGD only")
    grad_clip: float = setting(1.0, low=0, note="0: no clipping",
                               doc="largest gradient norm")
    seed: int = setting(0, low=0, high=2**32 - 1)
    accelerator: str = setting("auto", choices=_accelerators)
    devices: Any = setting("auto", rule=DevicesRule())
    num_nodes: int = setting(1, low=1)
    strategy: str = setting("auto", choices=_strategies,
                            doc="'ddp' for several devices or nodes")
    precision: Optional[str] = setting(None, choices=lambda: PRECISIONS,
                                       doc="default: 'bf16-mixed' on GPU, '32-true' on CPU")
    num_workers: int = setting(0, low=0, doc="data loader processes")
    threads: int = setting(0, rule=THREADS,
                           doc="torch CPU threads; set to the cores you really have")
    checkpoint_every: int = setting(1000, low=1)
    validate_every: int = setting(1000, low=1)
    log_every: int = setting(50, low=1)
    graph_stats_every: int = setting(200, low=1)
    logger: str = setting("csv", choices=LOGGERS)
    progress_bar: bool = setting(True)
    syntax_treebank: Optional[str] = setting(
        None, doc="optional syntax monitoring: a CoNLL-U/CoNLL-X file (not the split you "
                  "report on)")
    syntax_sentences: int = setting(500, low=1)
    syntax_every: int = setting(500, low=1)
    init_vectors: Optional[str] = setting(
        None, doc="word vectors every token embedding starts from, rescaled to the "
                  "embeddings' initial scale (text only): a GloVe/word2vec text file "
                  "model.hidden_channels wide, or 'word2vec' to train them first on the "
                  "corpus's documents (<output>/word_vectors.txt)")
    init_vectors_parts: str = setting(
        "both", choices=tuple(INIT_VECTORS_PARTS),
        doc="which embeddings start from them: 'both', 'graph' (g's only) or 'features' "
            "(f's only, which the decoders share); one part alone is an ablation")


def _model_parameters(images: bool) -> Tuple[str, ...]:
    factory = Glomo.image if images else Glomo.text
    return tuple(name for name in inspect.signature(factory).parameters
                 if name not in _FIXED[images])


# what the data set: the images' size, or the vocabulary
_FIXED = {True: ("height", "width", "in_channels", "num_tokens", "modality"),
          False: ("num_tokens", "padding_idx")}
# the model settings --print-config shows; the rest take their defaults unshown
_SHOWN = ("hidden_channels", "num_layers", "heads", "cnn_layers", "context_length",
          "num_positions")


def model_defaults(images: bool = False) -> Dict[str, Any]:
    """The main ``model`` settings of a new configuration, with their defaults."""
    defaults, parameters = IMAGE_DEFAULTS if images else TEXT_DEFAULTS, _model_parameters(images)
    return {k: getattr(defaults, k) for k in _SHOWN if k in parameters}


def check_model_section(model: Dict[str, Any], images: bool) -> None:
    """Check the ``model`` section: arguments of ``Glomo.text`` / ``Glomo.image``."""
    allowed = set(_model_parameters(images)) | {"layout"}
    bad = [k for k in model if k not in allowed]
    if bad:
        fixed = [k for k in bad if k in _FIXED[images]]
        raise ValueError(f"model.{fixed[0]} is set from the "
                         f"{'images' if images else 'vocabulary'}; remove it" if fixed else
                         f"unknown model settings {sorted(map(str, bad))} for "
                         f"{'images' if images else 'text'}; allowed: {sorted(allowed)}")
    for key, value in model.items():
        model[key] = check_model_setting(key, value, key=f"model.{key}")


_EXAMPLE = dict(corpus="path", train="max_steps", model="hidden_channels")


def _section(section: Any, name: str) -> Dict[str, Any]:
    """A section's settings as a dict (None: empty); anything but a mapping is refused."""
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ValueError(f"{name} must be a mapping of {name} settings (e.g. "
                         f"{name}.{_EXAMPLE[name]}), got {short_repr(section)}")
    return dict(section)


@dataclass
class PretrainConfig:
    output_dir: str = "runs/pretrain"
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    model: Dict[str, Any] = field(default_factory=model_defaults)
    train: TrainConfig = field(default_factory=TrainConfig)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "PretrainConfig":
        """Settings from a mapping (a YAML file's), checked as :meth:`validate` does."""
        data = {} if data is None else data
        unknown = sorted(str(k) for k in data if k not in {f.name for f in
                                                           dataclasses.fields(cls)}) \
            if isinstance(data, Mapping) else []
        if unknown or not isinstance(data, Mapping):
            raise ValueError(f"unknown configuration keys {unknown}; expected output_dir, "
                             "corpus, model, train" if unknown else "the configuration must "
                             f"be a mapping with the sections corpus, model and train, got "
                             f"{short_repr(data)}")
        out = cls()
        out.output_dir = data.get("output_dir", out.output_dir)
        if isinstance(out.output_dir, os.PathLike):
            out.output_dir = os.fspath(out.output_dir)
        for name, kind in (("corpus", CorpusConfig), ("train", TrainConfig)):
            setattr(out, name, from_mapping(kind, _section(data.get(name), name), name))
        if isinstance(out.corpus.format, str) and out.corpus.format in IMAGE_FORMATS:
            out.model = model_defaults(images=True)
        out.model = {**out.model, **_section(data.get("model"), "model")}
        out.validate()
        return out

    def validate(self) -> None:
        """Check every setting; :class:`ValueError` names the dotted key."""
        if not isinstance(self.output_dir, str) or not self.output_dir.strip():
            raise ValueError(f"output_dir must be a folder path, got {short_repr(self.output_dir)}")
        for name in ("corpus", "train"):
            check_settings(getattr(self, name), name)
        c, t = self.corpus, self.train
        images = c.format in IMAGE_FORMATS
        self.model = _section(self.model, "model")
        check_model_section(self.model, images)
        vectors = ("train.init_vectors initialises token embeddings; pixel models have none "
                   "(remove it)" if images and t.init_vectors is not None else
                   "train.init_vectors_parts chooses the embeddings that start from "
                   "train.init_vectors, which is not set"
                   if t.init_vectors_parts != "both" and t.init_vectors is None else
                   "train.init_vectors_parts: with model.decouple=false the graphs come from "
                   "f itself, so only 'both' applies"
                   if t.init_vectors_parts != "both" and self.model.get("decouple") is False
                   else None)
        if vectors:
            raise ValueError(vectors)
        if c.column is not None and (c.format != "text" or not c.column.strip()):
            raise ValueError("corpus.column names the column of a CSV, TSV or JSON-lines "
                             f"file (corpus.format 'text'), got {short_repr(c.column)} with "
                             f"corpus.format {c.format!r}")
        context = None if images else self.model.get("context_length",
                                                     TEXT_DEFAULTS.context_length)
        if c.min_length > c.max_length or (context is not None and context >= c.max_length):
            raise ValueError(f"corpus.min_length ({c.min_length}) must not exceed "
                             f"corpus.max_length ({c.max_length})" + (
                                 "" if context is None else
                                 f", and model.context_length ({context}) must be below "
                                 "corpus.max_length: each position predicts the next "
                                 "context_length tokens of its sequence"))

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)
