"""``glomo pretrain``: GLoMo pretraining on a real text corpus or image set with Lightning.

One configuration (YAML file and/or command-line overrides, :class:`PretrainConfig`)
drives the whole run:

1. **Corpus** (once per output folder): documents are read (a text file or folder, or
   the aclImdb layout), tokenised (:func:`~glomo_pyg.data.tokenize`), a vocabulary is
   built (``min_count``/``max_size``) and the corpus is written as memory-mapped token
   shards (``<output>/tokens``). Later runs and resumed runs reuse them.
2. **Training**: :class:`~glomo_pyg.training.GlomoPretraining` under a Lightning
   ``Trainer`` (progress bar, bf16 autocast on GPU, DDP over devices and nodes through
   Lightning's own strategy), CSV or TensorBoard logs with graph statistics
   (:class:`~glomo_pyg.training.GraphStatistics`), periodic and final checkpoints
   (``<output>/checkpoints``, written atomically: temporary file, fsync, rename).
   ``resume=True`` continues from the newest usable checkpoint (``last.ckpt``, or a
   newer periodic one when a kill came between the two) exactly where it stopped:
   weights, optimiser, schedule, step, random state, and the position inside the
   epoch's data order. Checkpoints are loaded with ``weights_only=True`` (nothing
   unpickled); a damaged one is named (and an older usable one taken instead, with a
   warning), one of another model or corpus is refused (every checkpoint records the
   run's settings and a corpus fingerprint: vocabulary, counts and token hash). SIGTERM
   or SIGINT while training finishes the step, writes ``last.ckpt`` and stops with
   :class:`~glomo_pyg.training.interrupts.TrainingInterrupted` (``glomo pretrain``
   exits with 143 or 130).
3. **Result**: the pretrained graph predictor with its vocabulary,
   ``save_pretrained(<output>/predictor)``.

Images (``corpus.format: cifar10`` or ``imagenet32``, paper Sec. 3.5) skip step 1: the
uint8 images are read from their pickle batches (:mod:`glomo_pyg.data.images`, never
unpickling anything but plain data) and every image is one sequence of pixel units;
``model`` then holds the options of :meth:`Glomo.image <glomo_pyg.Glomo.image>`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import reprlib
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import lightning.pytorch as pl
import numpy as np
import torch

from glomo_pyg.atomic_files import atomic_write
from glomo_pyg.data.aclimdb import read_aclimdb
from glomo_pyg.data.text import (SPECIALS, TextDataError, WordVocabulary, read_text_documents,
                                 tokenize)
from glomo_pyg.data.tokens import (ResumableLoader, ResumableSampler, TokenWindows,
                                   read_shard_index, write_token_shards)
from glomo_pyg.io.memory import physical_memory
from glomo_pyg.io.pretrained import CONFIG_RULES, MAX_VOCABULARY
from glomo_pyg.nn.feature_predictor import MAX_LOCAL_CONTEXT
from glomo_pyg.nn.glomo import EMBEDDING_PARTS
from glomo_pyg.threads import MAX_THREADS
from glomo_pyg.training.checkpoints import (CHECKPOINT_KEY, AtomicCheckpointIO,
                                            CheckpointMismatchError, check_checkpoint_matches,
                                            find_resume_checkpoint, newest_checkpoint_file,
                                            stale_temporary_files)
from glomo_pyg.training.graph_statistics import GraphStatistics
from glomo_pyg.training.interrupts import GracefulInterrupt, TrainingInterrupted
from glomo_pyg.training.pretraining import OPTIMIZERS, GlomoPretraining
from glomo_pyg.training.utils import quiet_lightning

TEXT_FORMATS = ("text", "aclimdb")
IMAGE_FORMATS = ("cifar10", "imagenet32")
CORPUS_FORMATS = TEXT_FORMATS + IMAGE_FORMATS
LOGGERS = ("csv", "tensorboard")
# train.init_vectors_parts: the embeddings (Glomo.set_token_embeddings) each value sets
INIT_VECTORS_PARTS = {"both": EMBEDDING_PARTS, "graph": ("graph",), "features": ("features",)}


@dataclass
class CorpusConfig:
    """Where the documents come from and how they become training sequences."""

    path: Optional[str] = None  # text file or folder, the aclImdb folder, or an image folder
    # 'text', 'aclimdb' (train/unsup + train/{pos,neg}, no test), or images: 'cifar10'
    # (cifar-10-batches-py, training batches) or 'imagenet32' (Downsampled-ImageNet batches)
    format: str = "text"
    one_per_line: bool = False  # text: one document per line instead of per file
    lower: bool = True
    min_count: int = 3
    max_size: Optional[int] = 30000
    max_length: int = 128
    min_length: int = 8
    max_documents: Optional[int] = None  # an even spread of this many documents (reduced runs)
    validation_fraction: float = 0.01
    shard_tokens: int = 1 << 26
    max_images: Optional[int] = None  # images: an even spread of this many (reduced runs)
    flip: bool = True  # images: random horizontal flips while training
    # images: pretrain on random crops of this side (the predictor, convolutional and with
    # offset-only position terms, is saved for the full image size); cheaper per image
    crop: Optional[int] = None


@dataclass
class TrainConfig:
    """Optimisation and the Lightning trainer."""

    batch_size: int = 32
    max_steps: int = 10000
    lr: float = 1e-3
    graph_lr_scale: float = 1.0
    graph_warmup_steps: int = 500
    weight_decay: float = 0.0
    optimizer: str = "adam"  # or 'sgd' (the reference code: lr 8, momentum 0.2, clip 0.25)
    momentum: float = 0.0  # SGD only
    grad_clip: float = 1.0
    seed: int = 0
    accelerator: str = "auto"
    devices: Any = "auto"
    num_nodes: int = 1
    strategy: str = "auto"  # 'ddp' for several devices or nodes
    precision: Optional[str] = None  # default: 'bf16-mixed' on GPU, '32-true' on CPU
    num_workers: int = 0
    threads: int = 0  # torch CPU threads (0: torch's default); set to the cores you really have
    checkpoint_every: int = 1000
    validate_every: int = 1000
    log_every: int = 50
    graph_stats_every: int = 200
    logger: str = "csv"
    progress_bar: bool = True
    # optional syntax monitoring: a CoNLL-U/CoNLL-X file (not the split you report on)
    syntax_treebank: Optional[str] = None
    syntax_sentences: int = 500
    syntax_every: int = 500
    # optional word vectors that every token embedding starts from, rescaled to the
    # embeddings' initial scale (text only): a GloVe/word2vec text file
    # model.hidden_channels wide, or 'word2vec' to train them first on the corpus's
    # documents (<output>/word_vectors.txt)
    init_vectors: Optional[str] = None
    # which embeddings start from them: 'both', 'graph' (g's only) or 'features' (f's
    # only, which the decoders share); one part alone is an ablation
    init_vectors_parts: str = "both"


_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxlevel = \
    80, 80, 6, 6, 3


def _short(value: Any) -> str:
    """A bounded repr for error messages: a hostile value (a YAML alias bomb, say)
    must not make the message itself huge."""
    return _SHORT.repr(value)


def _number_from_text(value: str) -> Optional[float]:
    """``'1e-3'`` as 1e-3: YAML 1.1 reads exponents without a dot as strings."""
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if value.strip().lower() not in ("nan", "inf", "-inf", "+inf",
                                                   "infinity", "-infinity") else None


class _Rule:
    """What one setting may hold: ``kind`` int, float, bool or str (an int, or a number
    written as text such as ``1e-3``, is accepted where a float is expected), optionally
    None, a range, or a set of choices. Floats must be finite."""

    def __init__(self, kind: type, low=None, high=None, low_open: bool = False,
                 high_open: bool = False, optional: bool = False, choices=None,
                 note: str = ""):
        self.kind, self.low, self.high = kind, low, high
        self.low_open, self.high_open, self.optional = low_open, high_open, optional
        self.choices, self.note = choices, note

    def describe(self) -> str:
        if self.choices is not None:
            text = "one of " + ", ".join(repr(c) for c in self._choices())
        elif self.kind is bool:
            text = "true or false"
        elif self.kind is str:
            text = "a string"
        else:
            noun = "integer" if self.kind is int else "number"
            low, high = self.low, self.high
            if high is None and low == 0 and self.low_open:
                text = f"a positive {noun}"
            elif high is None and low == 1 and self.kind is int:
                text = "a positive integer"
            elif high is None and low == 0:
                text = f"a non-negative {noun}"
            elif high is None and low is not None:
                text = f"an {noun} >= {low}" if noun == "integer" else f"a number >= {low}"
            elif low is not None:
                text = (f"a{'n' if noun == 'integer' else ''} {noun} in "
                        f"{'(' if self.low_open else '['}{low}, {high}"
                        f"{')' if self.high_open else ']'}")
            else:
                text = f"a{'n' if noun == 'integer' else ''} {noun}"
        if self.optional:
            text += " or null"
        return text + (f" ({self.note})" if self.note else "")

    def _choices(self):
        return self.choices() if callable(self.choices) else self.choices

    def check(self, key: str, value):
        if value is None and self.optional:
            return None
        if self.kind is str and self.choices is None and isinstance(value, os.PathLike):
            value = os.fspath(value)
        fail = ValueError(f"{key} must be {self.describe()}, got {_short(value)}")
        if self.choices is not None:
            if isinstance(value, int) and not isinstance(value, bool) and \
                    str(value) in self._choices():
                value = str(value)  # precision: 32
            if not isinstance(value, str) or value not in self._choices():
                raise fail
            return value
        if self.kind is bool or self.kind is str:
            if not isinstance(value, self.kind):
                raise fail
            return value
        if self.kind is float and isinstance(value, str):
            value = _number_from_text(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail
        if self.kind is int and not isinstance(value, int):
            raise fail
        if isinstance(value, float) and not math.isfinite(value):
            raise fail
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            raise fail
        if self.high is not None and (value > self.high or
                                      (self.high_open and value == self.high)):
            raise fail
        return float(value) if self.kind is float else value


class _Devices(_Rule):
    """Lightning's ``devices``: 'auto', a count, -1 (all), '0,1' or a list of indices."""

    def __init__(self):
        super().__init__(str)

    def describe(self) -> str:
        return ("'auto', a positive integer (a device count), -1 (all devices), a list of "
                "device indices or a string such as '0,1'")

    def check(self, key: str, value):
        ok = (isinstance(value, str) and value.strip() != "") or \
            (isinstance(value, int) and not isinstance(value, bool) and
             (value >= 1 or value == -1)) or \
            (isinstance(value, list) and value and
             all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value))
        if not ok:
            raise ValueError(f"{key} must be {self.describe()}, got {_short(value)}")
        return value


def _accelerators():
    from lightning.pytorch.accelerators import AcceleratorRegistry

    return ("auto", "gpu", *sorted(AcceleratorRegistry.available_accelerators()))


def _strategies():
    from lightning.pytorch.strategies import StrategyRegistry

    return ("auto", *StrategyRegistry.available_strategies())


def _precisions():
    from typing import get_args

    from lightning.fabric.connector import _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS

    return (*get_args(_PRECISION_INPUT_STR), *get_args(_PRECISION_INPUT_STR_ALIAS))


def _layouts():
    from glomo_pyg.nn.layout import LAYOUTS

    return LAYOUTS


_POSITIVE = _Rule(int, low=1)
_RULES: Dict[str, Dict[str, _Rule]] = dict(
    corpus=dict(
        path=_Rule(str, optional=True), format=_Rule(str, choices=CORPUS_FORMATS),
        one_per_line=_Rule(bool), lower=_Rule(bool), min_count=_POSITIVE,
        max_size=_Rule(int, low=len(SPECIALS) + 1, high=MAX_VOCABULARY, optional=True,
                       note="the special tokens included"), max_length=_Rule(int, low=2),
        min_length=_Rule(int, low=2), max_documents=_Rule(int, low=1, optional=True),
        validation_fraction=_Rule(float, low=0, high=1, high_open=True),
        shard_tokens=_POSITIVE, max_images=_Rule(int, low=2, optional=True),
        flip=_Rule(bool), crop=_Rule(int, low=2, optional=True, note="pixels per side")),
    train=dict(
        batch_size=_Rule(int, low=1, high=1 << 24), max_steps=_POSITIVE,
        lr=_Rule(float, low=0, low_open=True),
        graph_lr_scale=_Rule(float, low=0), graph_warmup_steps=_Rule(int, low=0),
        weight_decay=_Rule(float, low=0), optimizer=_Rule(str, choices=OPTIMIZERS),
        momentum=_Rule(float, low=0, high=1, high_open=True),
        grad_clip=_Rule(float, low=0, note="0: no clipping"),
        seed=_Rule(int, low=0, high=2**32 - 1), accelerator=_Rule(str, choices=_accelerators),
        devices=_Devices(), num_nodes=_POSITIVE, strategy=_Rule(str, choices=_strategies),
        precision=_Rule(str, optional=True, choices=_precisions),
        num_workers=_Rule(int, low=0), threads=_Rule(int, low=0, high=MAX_THREADS,
                                                      note="0: torch's default"),
        checkpoint_every=_POSITIVE, validate_every=_POSITIVE, log_every=_POSITIVE,
        graph_stats_every=_POSITIVE, logger=_Rule(str, choices=LOGGERS),
        progress_bar=_Rule(bool), syntax_treebank=_Rule(str, optional=True),
        syntax_sentences=_POSITIVE, syntax_every=_POSITIVE,
        init_vectors=_Rule(str, optional=True),
        init_vectors_parts=_Rule(str, choices=INIT_VECTORS_PARTS)))

# Model settings: the arguments of Glomo.text / Glomo.image with these extra rules;
# the rest are checked by type (from the signature) and by building the model once.
_MODEL_RULES = dict(
    hidden_channels=_POSITIVE, num_layers=_POSITIVE, heads=_POSITIVE,
    head_channels=_Rule(int, low=1, optional=True), context_length=_POSITIVE,
    num_positions=_POSITIVE, decoder_layers=_POSITIVE, cnn_layers=_Rule(int, low=0),
    kernel_size=_POSITIVE, dropout=_Rule(float, low=0, high=1, high_open=True),
    block_size=_POSITIVE, position_frequencies=_POSITIVE,
    position_period=_Rule(float, low=0, low_open=True), keep_alive=_Rule(float, low=0),
    keep_alive_margin=_Rule(float, low=0), entropy_penalty=_Rule(float, low=0),
    local_context=_Rule(int, low=0, high=MAX_LOCAL_CONTEXT), layout=_Rule(str, choices=_layouts))
_ANNOTATION_RULES = {"int": _Rule(int), "float": _Rule(float), "bool": _Rule(bool),
                     "str": _Rule(str), "Optional[int]": _Rule(int, optional=True),
                     "Optional[str]": _Rule(str, optional=True),
                     "Optional[float]": _Rule(float, optional=True)}


def _model_parameters(images: bool) -> Dict[str, str]:
    import inspect

    from glomo_pyg.nn.glomo import Glomo

    factory = Glomo.image if images else Glomo.text
    fixed = ("height", "width", "in_channels") if images else ("num_tokens", "padding_idx")
    return {name: str(p.annotation) for name, p in inspect.signature(factory).parameters.items()
            if name not in fixed}


def _check_model_settings(model: Dict[str, Any], images: bool) -> None:
    params = _model_parameters(images)
    allowed = set(params) | {"layout"}
    bad = [k for k in model if k not in allowed]
    if bad:
        raise ValueError(f"unknown model settings {sorted(map(str, bad))} for "
                         f"{'images' if images else 'text'}; allowed: {sorted(allowed)}")
    for key, value in model.items():
        rule = _MODEL_RULES.get(key) or _ANNOTATION_RULES.get(params.get(key, ""))
        if key in _MODEL_RULES and params.get(key, "").startswith("Optional"):
            rule = _Rule(rule.kind, rule.low, rule.high, rule.low_open, rule.high_open,
                         True, rule.choices)
        if rule is not None:
            model[key] = rule.check(f"model.{key}", value)
        kind, low, high = CONFIG_RULES.get(key, ("", None, None))
        value = model[key]
        if kind.rstrip("?") in ("int", "float") and value is not None and not (
                (low is None or value >= low) and (high is None or value <= high)):
            # the run would end with a predictor that load_pretrained refuses
            raise ValueError(f"model.{key} is {value}, outside [{low}, {high}], the range a "
                             "saved predictor may hold")


def _section(data: Mapping[str, Any], name: str) -> Dict[str, Any]:
    section = data.get(name)
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ValueError(f"{name} must be a mapping of {name} settings (e.g. "
                         f"{name}.{_EXAMPLE[name]}), got {_short(section)}")
    return dict(section)


_EXAMPLE = dict(corpus="path", train="max_steps", model="hidden_channels")


IMAGE_MODEL_DEFAULTS = dict(hidden_channels=128, num_layers=3, heads=8, cnn_layers=3,
                            num_positions=64)


@dataclass
class PretrainConfig:
    output_dir: str = "runs/pretrain"
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    model: Dict[str, Any] = field(default_factory=lambda: dict(
        hidden_channels=256, num_layers=3, heads=8, cnn_layers=4, context_length=3,
        num_positions=20))
    train: TrainConfig = field(default_factory=TrainConfig)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "PretrainConfig":
        """Settings from a mapping (a YAML file's), checked: unknown keys, values of the
        wrong type or out of range raise :class:`ValueError` naming the dotted key."""
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ValueError("the configuration must be a mapping with the sections "
                             f"corpus, model and train, got {_short(data)}")
        data = dict(data)
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown configuration keys {sorted(map(str, unknown))}; "
                             "expected output_dir, corpus, model, train")
        out = cls()
        if "output_dir" in data:
            out.output_dir = data["output_dir"]
            if isinstance(out.output_dir, os.PathLike):
                out.output_dir = os.fspath(out.output_dir)
        for name, kind in (("corpus", CorpusConfig), ("train", TrainConfig)):
            section = _section(data, name)
            allowed = {f.name for f in dataclasses.fields(kind)}
            bad = set(section) - allowed
            if bad:
                raise ValueError(f"unknown {name} settings {sorted(map(str, bad))}; allowed: "
                                 f"{sorted(allowed)}")
            setattr(out, name, dataclasses.replace(getattr(out, name), **section))
        if isinstance(out.corpus.format, str) and out.corpus.format in IMAGE_FORMATS:
            out.model = dict(IMAGE_MODEL_DEFAULTS)  # Glomo.image's options, not the text ones
        if "model" in data:
            out.model = dict(out.model, **_section(data, "model"))
        out.validate()
        return out

    def validate(self) -> None:
        """Check every setting (types, ranges, choices); raises :class:`ValueError`
        naming the dotted key. Numbers given as integers where a float is expected are
        converted."""
        if not isinstance(self.output_dir, str) or not self.output_dir.strip():
            raise ValueError(f"output_dir must be a folder path, got {_short(self.output_dir)}")
        for name in ("corpus", "train"):
            section = getattr(self, name)
            for f in dataclasses.fields(section):
                value = getattr(section, f.name)
                rule = _RULES[name][f.name]
                setattr(section, f.name, rule.check(f"{name}.{f.name}", value))
        c = self.corpus
        if c.min_length > c.max_length:
            raise ValueError(f"corpus.min_length ({c.min_length}) must not exceed "
                             f"corpus.max_length ({c.max_length})")
        if not isinstance(self.model, dict):
            raise ValueError(f"model must be a mapping of model settings (e.g. "
                             f"model.hidden_channels), got {_short(self.model)}")
        images = c.format in IMAGE_FORMATS
        if images:
            for key in ("height", "width", "in_channels", "num_tokens", "modality"):
                if key in self.model:
                    raise ValueError(f"model.{key} is set from the images; remove it")
        else:
            for key in ("num_tokens", "padding_idx"):
                if key in self.model:
                    raise ValueError(f"model.{key} is set from the vocabulary; remove it")
        if images and self.train.init_vectors is not None:
            raise ValueError("train.init_vectors initialises token embeddings; pixel models "
                             "have none (remove it)")
        if self.train.init_vectors_parts != "both":
            if self.train.init_vectors is None:
                raise ValueError("train.init_vectors_parts chooses the embeddings that start "
                                 "from train.init_vectors, which is not set")
            if self.model.get("decouple", True) is False:
                raise ValueError("train.init_vectors_parts: with model.decouple=false the "
                                 "graphs come from f itself, so only 'both' applies")
        _check_model_settings(self.model, images)
        context = self.model.get("context_length", 3)
        if not images and isinstance(context, int) and context >= c.max_length:
            raise ValueError(f"model.context_length ({context}) must be below "
                             f"corpus.max_length ({c.max_length}): each position predicts "
                             "the next context_length tokens of its sequence")

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def set_by_path(data: Dict[str, Any], dotted: str, value: Any) -> None:
    """``set_by_path(cfg, 'train.lr', 0.01)``: a command-line override of a nested key."""
    keys = dotted.split(".")
    if not dotted or any(not k for k in keys):
        raise ValueError(f"{dotted!r} is not a setting name (e.g. train.max_steps)")
    node = data
    for depth, key in enumerate(keys[:-1]):
        if node.get(key) is None:
            node[key] = {}
        node = node[key]
        if not isinstance(node, dict):
            raise ValueError(f"cannot set {dotted}: {'.'.join(keys[:depth + 1])} is not a "
                             f"section but the value {_short(node)}")
    node[keys[-1]] = value


def _read_json(path: str, advice: str) -> Any:
    """A JSON file of the run folder; a damaged one raises ValueError naming it."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is damaged (not valid JSON: {err}); {advice}") from None


def _write_json(path: str, data: Any) -> None:
    """Write ``data`` as JSON, atomically."""
    with atomic_write(path) as fh:
        json.dump(data, fh, indent=1)


# --- corpus ------------------------------------------------------------------------------
def _all_documents(corpus: CorpusConfig) -> Iterator[str]:
    if corpus.path is None:
        raise ValueError("corpus.path is not set: a text file or folder, or the aclImdb folder")
    path = os.path.expanduser(corpus.path)
    if corpus.format == "aclimdb":
        # unlabelled and labelled training reviews; the test reviews stay unseen
        return (r.text for r in read_aclimdb(path, "train", ("unsup", "pos", "neg")))
    return read_text_documents(path, one_per_line=corpus.one_per_line)


def iter_documents(corpus: CorpusConfig) -> Iterator[str]:
    """The corpus's documents; with ``max_documents`` (= M of N), the documents at
    positions ``floor(k * N / M)``, spread evenly over the whole corpus (so a reduced
    aclImdb run sees unlabelled, positive and negative reviews in their proportions,
    not just the first folder)."""
    if corpus.max_documents is None:
        yield from _all_documents(corpus)
        return
    if corpus.max_documents < 1:
        raise ValueError(f"corpus.max_documents must be >= 1, got {corpus.max_documents}")
    total = sum(1 for _ in _all_documents(corpus))
    take = min(total, corpus.max_documents)
    wanted = iter([k * total // take for k in range(take)])
    nxt = next(wanted, None)
    for k, doc in enumerate(_all_documents(corpus)):
        if k == nxt:
            yield doc
            nxt = next(wanted, None)
            if nxt is None:
                return


# corpus settings added after runs were first saved, with the behaviour those runs had
_ADDED_CORPUS_SETTINGS = dict(max_images=None, flip=True, crop=None)


def _with_corpus_defaults(saved: Dict[str, Any], keys) -> Dict[str, Any]:
    """Saved corpus settings completed with the settings added since, among ``keys``: a
    run saved before e.g. ``crop`` existed was prepared without a crop. Any other missing
    key still counts as a difference."""
    return {**{k: v for k, v in _ADDED_CORPUS_SETTINGS.items() if k in keys}, **saved}


def prepare_corpus(corpus: CorpusConfig, folder: str, log=print):
    """Vocabulary and token shards in ``folder`` (built once: two passes over the
    documents, counting then encoding; reused when present and built from the same
    corpus settings)."""
    os.makedirs(folder, exist_ok=True)
    vocab_path, shards, meta_path = (os.path.join(folder, "vocabulary.json"),
                                     os.path.join(folder, "tokens"),
                                     os.path.join(folder, "corpus.json"))
    settings = {k: v for k, v in dataclasses.asdict(corpus).items()
                if k not in ("max_length", "min_length", "validation_fraction")}
    if os.path.exists(meta_path) and os.path.exists(vocab_path) and os.path.isdir(shards):
        built = _read_json(meta_path, f"delete it and {shards} to rebuild the corpus (a "
                                      "run resumed on a rebuilt corpus is checked against "
                                      "its checkpoint's corpus fingerprint)")
        if not isinstance(built, dict):
            raise ValueError(f"{meta_path} is damaged (not a corpus description); delete it "
                             f"and {shards} to rebuild the corpus")
        saved = built.get("settings")
        if not isinstance(saved, dict) or _with_corpus_defaults(saved, settings) != settings:
            raise ValueError(f"{folder} holds a corpus built with other settings "
                             f"({built.get('settings')}); use another output_dir")
        read_shard_index(shards)
        return WordVocabulary.load(vocab_path), shards
    start = time.time()
    counts: Counter = Counter()
    num_docs = 0
    for doc in iter_documents(corpus):
        counts.update(tokenize(doc, corpus.lower))
        num_docs += 1
    if not num_docs:
        raise ValueError(f"{corpus.path}: no documents")
    vocab = WordVocabulary.build(counts, corpus.min_count, corpus.max_size)
    if len(vocab) <= len(SPECIALS):
        raise ValueError(f"{corpus.path}: no word occurs corpus.min_count={corpus.min_count} "
                         f"times in {num_docs} documents ({len(counts)} distinct words): the "
                         "vocabulary would hold only the special tokens; lower min_count or "
                         "use a larger corpus")
    log(f"corpus: {num_docs} documents, {sum(counts.values())} tokens, {len(counts)} distinct; "
        f"vocabulary {len(vocab)} (min_count {corpus.min_count}, max_size {corpus.max_size})")
    if os.path.isdir(shards):
        import shutil
        shutil.rmtree(shards)  # left by an interrupted preparation (no corpus.json yet)
    index = write_token_shards((vocab.encode(tokenize(d, corpus.lower)).numpy()
                                for d in iter_documents(corpus)),
                               shards, len(vocab), corpus.shard_tokens)
    vocab.save(vocab_path)
    unknown = sum(c for w, c in counts.items() if w not in vocab)
    meta = dict(settings=settings, documents=num_docs, tokens=index["num_tokens"],
                unknown_fraction=unknown / max(1, sum(counts.values())),
                seconds=round(time.time() - start, 1))
    _write_json(meta_path, meta)  # written last: marks the corpus complete
    log(f"token shards: {index['num_tokens']} tokens in {len(index['shards'])} shard(s), "
        f"{meta['unknown_fraction']:.2%} unknown, {meta['seconds']} s")
    return vocab, shards


def _sha256_files(paths: List[str]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 24), b""):
                digest.update(chunk)
    return digest.hexdigest()


def corpus_fingerprint(vocab: WordVocabulary, shards: str) -> Dict[str, Any]:
    """What identifies a prepared text corpus: the vocabulary (its size and a hash of its
    words in id order), the document and token counts, and a hash of the token shards.
    Recorded in every checkpoint; a resumed run refuses a corpus that differs (its ids
    would mean other words, or its sequences would be others)."""
    index = read_shard_index(shards)
    files = [os.path.join(shards, shard[key]) for shard in index["shards"]
             for key in ("tokens", "docs")]
    words = json.dumps(vocab.tokens(), ensure_ascii=False).encode("utf-8")
    return dict(vocabulary=len(vocab), vocabulary_sha256=hashlib.sha256(words).hexdigest(),
                documents=int(index["num_documents"]), tokens=int(index["num_tokens"]),
                tokens_sha256=_sha256_files(files))


def image_fingerprint(images: torch.Tensor, sample: int = 4096) -> Dict[str, Any]:
    """What identifies an image corpus: count, shape, and a hash of an even spread of up
    to ``sample`` images."""
    step = max(1, len(images) // sample)
    data = images[::step].contiguous().numpy().tobytes()
    return dict(images=len(images), shape=list(images.shape[1:]),
                sample_sha256=hashlib.sha256(data).hexdigest())


def _check_fingerprint(contents: Dict[str, Any], path: str, current: Dict[str, Any],
                       where: str, log) -> None:
    stored = (contents.get(CHECKPOINT_KEY) or {}).get("corpus")
    if stored is None:
        log(f"note: {path} records no corpus fingerprint (written by an older glomo_pyg); "
            "the corpus cannot be checked against it")
        return
    if stored == current:
        return
    diff = []
    for key in sorted(set(stored) | set(current)):
        old, new = stored.get(key), current.get(key)
        if old != new:
            diff.append(f"{key} changed" if key.endswith("sha256") else
                        f"{key} {old!r} -> {new!r}")
    ids = ", so its token ids would mean other words" if any(
        k.startswith("vocabulary") and stored.get(k) != current.get(k) for k in current) else ""
    raise CheckpointMismatchError(
        f"the corpus changed since {path} was written ({', '.join(diff)}): {where} no "
        f"longer holds the data the run was trained on{ids}. Restore the original corpus "
        "(and its tokens folder) to resume, or start a new run in another output_dir")


class _RunRecord(pl.Callback):
    """Writes the corpus fingerprint and the run's settings into every checkpoint
    (``checkpoint['glomo']``), so that a resume is checked against the checkpoint itself,
    whatever became of ``config.json``."""

    def __init__(self, fingerprint: Dict[str, Any], settings: Dict[str, Any]):
        self.fingerprint, self.settings = fingerprint, settings

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: Dict[str, Any]) -> None:
        checkpoint[CHECKPOINT_KEY] = dict(version=2, corpus=self.fingerprint,
                                          settings=self.settings)


def _ignore_interrupts(worker_id: int) -> None:
    """Data-loader workers leave Ctrl+C to the training process, which stops cleanly."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _split(count: int, validation_fraction: float, seed: int, unit: str):
    """A seeded (validation, sorted training) split of ``range(count)``; warns when the
    validation share leaves training the smaller part."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = int(count * validation_fraction)
    if n_val > count - n_val:
        warnings.warn(f"corpus.validation_fraction {validation_fraction} keeps only "
                      f"{count - n_val} of {count} {unit} for training", RuntimeWarning,
                      stacklevel=3)
    return order[:n_val], sorted(order[n_val:])


class TextPretrainingData(pl.LightningDataModule):
    """Training and validation sequences from token shards; the training loader is a
    :class:`~glomo_pyg.data.ResumableLoader` split across the trainer's ranks."""

    def __init__(self, shards: str, max_length: int, min_length: int, batch_size: int,
                 validation_fraction: float, seed: int, num_workers: int = 0):
        super().__init__()
        self.windows = TokenWindows.from_shards(shards, max_length, min_length)
        if len(self.windows) < 2:
            raise ValueError(f"{shards}: fewer than 2 training sequences of >= {min_length} "
                             "tokens; use a larger corpus or a smaller corpus.min_length")
        self.val_ids, self.train_ids = _split(len(self.windows), validation_fraction, seed,
                                              "sequences")
        self.batch_size, self.seed, self.num_workers = batch_size, seed, num_workers

    def train_dataloader(self):
        world = self.trainer.world_size if self.trainer is not None else 1
        rank = self.trainer.global_rank if self.trainer is not None else 0
        data = torch.utils.data.Subset(self.windows, self.train_ids)
        sampler = ResumableSampler(len(data), shuffle=True, seed=self.seed,
                                   num_replicas=world, rank=rank)
        return ResumableLoader(data, self.batch_size, sampler, num_workers=self.num_workers,
                               **self._worker_options())

    def _worker_options(self) -> Dict[str, Any]:
        return dict(worker_init_fn=_ignore_interrupts) if self.num_workers else {}

    def val_dataloader(self):
        from torch_geometric.loader import DataLoader

        if not self.val_ids:
            return []
        return DataLoader(torch.utils.data.Subset(self.windows, self.val_ids),
                          batch_size=self.batch_size, num_workers=self.num_workers,
                          generator=torch.Generator().manual_seed(self.seed),
                          **self._worker_options())


def load_pretraining_images(corpus: CorpusConfig) -> torch.Tensor:
    """The uint8 ``[n, C, H, W]`` training images of an image corpus (labels unused),
    an even spread of ``max_images`` of them when set."""
    from glomo_pyg.data.images import load_cifar10, load_imagenet32

    if corpus.path is None:
        raise ValueError("corpus.path is not set: the cifar-10-batches-py or imagenet32 folder")
    path = os.path.expanduser(corpus.path)
    images = load_cifar10(path, "train")[0] if corpus.format == "cifar10" else \
        load_imagenet32(path)[0]
    if corpus.max_images is not None and corpus.max_images < len(images):
        take = corpus.max_images
        images = images[torch.arange(take) * len(images) // take]
    return images


class ImageUnits(torch.utils.data.Dataset):
    """Each image as a PyG ``Data`` whose ``x`` is its ``[H W, C]`` uint8 pixel units."""

    def __init__(self, images: torch.Tensor):
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        from torch_geometric.data import Data

        img = self.images[i]
        return Data(x=img.permute(1, 2, 0).reshape(-1, img.size(0)))


class ImagePretrainingData(TextPretrainingData):
    """Training and validation images (a seeded split), batched as pixel units."""

    def __init__(self, images: torch.Tensor, batch_size: int, validation_fraction: float,
                 seed: int, num_workers: int = 0):
        pl.LightningDataModule.__init__(self)
        self.windows = ImageUnits(images)
        self.val_ids, self.train_ids = _split(len(images), validation_fraction, seed, "images")
        self.batch_size, self.seed, self.num_workers = batch_size, seed, num_workers


class _FinalCheckpoint(pl.Callback):
    """Writes ``last.ckpt`` at the last step when it falls between the periodic
    checkpoints, from inside the training loop (as the periodic ones are written), so
    that it holds the data position and a resumed run continues exactly."""

    def __init__(self, path: str, every: int):
        self.path, self.every = path, every

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step >= trainer.max_steps and step % self.every:
            trainer.save_checkpoint(self.path)


class _RandomState(pl.Callback):
    """Saves and restores every random generator training uses (Python, NumPy, torch CPU
    and CUDA) in the checkpoint, so a resumed run draws the same positions."""

    def state_dict(self) -> Dict[str, Any]:
        state = dict(python=list(random.getstate()[1]), python_version=random.getstate()[0],
                     python_gauss=random.getstate()[2], numpy=np.random.get_state()[1].tolist(),
                     numpy_pos=int(np.random.get_state()[2]), torch=torch.get_rng_state())
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        random.setstate((state["python_version"], tuple(state["python"]), state["python_gauss"]))
        np.random.set_state(("MT19937", np.asarray(state["numpy"], dtype=np.uint32),
                             state["numpy_pos"], 0, 0.0))
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


def _precision(train: TrainConfig) -> str:
    if train.precision:
        return train.precision
    gpu = train.accelerator in ("gpu", "cuda") or (train.accelerator == "auto" and
                                                   torch.cuda.is_available())
    return "bf16-mixed" if gpu else "32-true"


def build_trainer(config: PretrainConfig, extra_callbacks: Optional[List[pl.Callback]] = None
                  ) -> pl.Trainer:
    from lightning.pytorch.callbacks import ModelCheckpoint

    t = config.train
    checkpoints = ModelCheckpoint(dirpath=os.path.join(config.output_dir, "checkpoints"),
                                  filename="step{step}", auto_insert_metric_name=False,
                                  every_n_train_steps=t.checkpoint_every, save_top_k=-1,
                                  save_last=True, enable_version_counter=False)
    # (no version counter: a resumed run rewrites last.ckpt and step<N>.ckpt of the same
    # state, never 'last-v1.ckpt' beside a damaged 'last.ckpt')
    callbacks = [checkpoints, GraphStatistics(t.graph_stats_every), _RandomState(),
                 _FinalCheckpoint(os.path.join(config.output_dir, "checkpoints", "last.ckpt"),
                                  t.checkpoint_every), *(extra_callbacks or [])]
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    try:
        if t.logger == "tensorboard":
            from lightning.pytorch.loggers import TensorBoardLogger
            logger = TensorBoardLogger(config.output_dir, name="logs")
        else:
            from lightning.pytorch.loggers import CSVLogger
            logger = CSVLogger(config.output_dir, name="logs")
        return pl.Trainer(max_steps=t.max_steps, accelerator=t.accelerator, devices=t.devices,
                          num_nodes=t.num_nodes, strategy=t.strategy, precision=_precision(t),
                          gradient_clip_val=t.grad_clip or None, logger=logger,
                          callbacks=callbacks, log_every_n_steps=t.log_every,
                          val_check_interval=t.validate_every, check_val_every_n_epoch=None,
                          enable_progress_bar=t.progress_bar, enable_model_summary=False,
                          use_distributed_sampler=False, default_root_dir=config.output_dir,
                          plugins=[AtomicCheckpointIO()])
    except (MisconfigurationException, TypeError, ImportError) as err:
        # (ImportError: e.g. a logger, accelerator or precision plugin whose package is
        # missing; TypeError: devices Lightning cannot parse for the accelerator)
        raise ValueError(f"train settings (logger {t.logger!r}, accelerator {t.accelerator!r}, devices "
                         f"{t.devices!r}, strategy {t.strategy!r}, precision "
                         f"{_precision(t)!r}): {err}") from None


def last_checkpoint(output_dir: str) -> Optional[str]:
    """The run's newest checkpoint file by name (``last.ckpt``, else the largest
    ``step<N>.ckpt``), or None: whether there is anything to resume (nothing is read;
    :func:`run_pretraining` picks the newest *usable* one)."""
    return newest_checkpoint_file(os.path.join(output_dir, "checkpoints"))


def is_launcher_child() -> bool:
    """True in the processes Lightning's DDP launcher starts besides the first (they run
    this same command again)."""
    return int(os.environ.get("LOCAL_RANK", 0)) > 0 or int(os.environ.get("NODE_RANK", 0)) > 0


def _check_model_builds(config: PretrainConfig) -> None:
    """Build the model once, on the meta device, so that bad model settings (including
    widths whose weights would not fit in memory) fail before the corpus is prepared
    (which can take long)."""
    c = config.corpus
    if c.format in IMAGE_FORMATS:
        side = c.crop or 32
        kwargs = dict(config.model, modality="image", in_channels=3, height=side, width=side)
    else:  # (the vocabulary is not read yet; max_size is only its cap)
        kwargs = dict(config.model, num_tokens=8, padding_idx=0)
    try:
        with torch.device("meta"):  # shapes only: no memory, however wide the settings
            module = GlomoPretraining(kwargs)
    except (TypeError, ValueError) as err:
        raise ValueError(f"model settings {_short(config.model)}: {_first_line(err)}") from None
    except RuntimeError as err:  # e.g. a weight's element count overflows
        raise ValueError(f"model settings {_short(config.model)} cannot be built: "
                         f"{_first_line(err)}") from None
    size = sum(p.numel() * p.element_size() for p in module.parameters())
    memory = physical_memory()
    if memory is not None and size > memory:
        raise ValueError(f"model settings {_short(config.model)} give "
                         f"{sum(p.numel() for p in module.parameters()):,} parameters "
                         f"({size / 2**30:.1f} GiB), more than this machine's memory "
                         f"({memory / 2**30:.1f} GiB); lower hidden_channels or num_layers")


def _first_line(err: BaseException, limit: int = 300) -> str:
    """An exception's first line, bounded (torch's can carry C++ stack frames)."""
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:limit]


# (Lightning's own environment reads the node rank from NODE_RANK, GROUP_RANK or RANK)
_CLUSTER_ENVIRONMENTS = (("MASTER_ADDR", "NODE_RANK"), ("MASTER_ADDR", "GROUP_RANK"),
                         ("MASTER_ADDR", "RANK"), ("SLURM_NTASKS",), ("TORCHELASTIC_RUN_ID",),
                         ("OMPI_COMM_WORLD_SIZE",), ("PMI_SIZE",), ("LSB_JOBID",))


def _check_trainer_builds(config: PretrainConfig) -> None:
    """Build the trainer once before the corpus is prepared (which can take long), so that
    bad train settings fail first; refuse what would hang or fail at the first step."""
    t = config.train
    if t.num_nodes > 1 and not any(all(k in os.environ for k in keys)
                                   for keys in _CLUSTER_ENVIRONMENTS):
        raise ValueError(f"train.num_nodes is {t.num_nodes}, but no cluster environment is set "
                         "(MASTER_ADDR with NODE_RANK, GROUP_RANK or RANK; SLURM, torchrun, MPI "
                         "or LSF): started on "
                         "one machine, the run would wait for the other nodes indefinitely")
    from lightning.pytorch.accelerators import CPUAccelerator

    with quiet_lightning():
        trainer = build_trainer(config)
    if isinstance(trainer.accelerator, CPUAccelerator) and trainer.precision == "16-true":
        raise ValueError("train.precision '16-true' is not supported on the CPU (float16 "
                         "training diverges there); use '32-true' or 'bf16-mixed'")


def _embedding_width(model: Dict[str, Any]) -> int:
    """The token embeddings' width of the text model built from ``model`` settings."""
    import inspect

    from glomo_pyg.nn.glomo import Glomo

    default = inspect.signature(Glomo.text).parameters["hidden_channels"].default
    return model.get("hidden_channels", default)


def _check_init_vectors(config: PretrainConfig) -> None:
    """Refuse ``train.init_vectors`` before the corpus is prepared when the file is
    missing, unreadable or of another width than the embeddings."""
    from glomo_pyg.data.word_vectors import read_word_vectors

    path = os.path.expanduser(config.train.init_vectors)
    try:
        words, vectors = read_word_vectors(path, max_words=1)
    except (OSError, TextDataError) as err:
        raise ValueError(f"train.init_vectors: {err}") from None
    if not words:
        raise ValueError(f"train.init_vectors: {path} holds no vectors")
    width = _embedding_width(config.model)
    if vectors.shape[1] != width:
        raise ValueError(f"train.init_vectors: {path} holds {vectors.shape[1]}-d vectors, but "
                         f"the token embeddings are model.hidden_channels = {width} wide; "
                         f"train vectors of that width (glomo word-vectors --dim {width})")


TRAIN_VECTORS = "word2vec"  # train.init_vectors: train them on the corpus first


def train_init_vectors(corpus: CorpusConfig, dim: int, out: str, seed: int = 0,
                       workers: int = 1, log=print) -> str:
    """``train.init_vectors: word2vec``: word2vec vectors ``dim`` wide (gensim CBOW, window
    5, 5 epochs, words seen ``corpus.min_count`` times) trained on the corpus's documents,
    tokenised as the pretraining corpus is, written to ``<out>/word_vectors.txt`` (GloVe
    text format, atomically). A file already there is reused when it has that width.
    Returns its path."""
    from glomo_pyg.data.word_vectors import (read_word_vectors, train_word_vectors,
                                             write_word_vectors)

    path = os.path.join(out, "word_vectors.txt")
    if os.path.exists(path):
        try:
            words, vectors = read_word_vectors(path, max_words=1)
        except (OSError, TextDataError):
            words = []
        if words and vectors.shape[1] == dim:
            log(f"word vectors: reusing {path}")
            return path
        log(f"word vectors: {path} is unreadable or of another width; training them again")
    start = time.time()
    docs = [d for d in (tokenize(doc, corpus.lower) for doc in iter_documents(corpus)) if d]
    words, vectors = train_word_vectors(docs, dim=dim, min_count=corpus.min_count,
                                        workers=workers, seed=seed)
    write_word_vectors(path, words, vectors)
    log(f"word vectors: {len(words)} x {dim} from {len(docs)} documents "
        f"({sum(map(len, docs))} tokens, {time.time() - start:.0f} s), written to {path}")
    return path


def initial_token_embeddings(path: str, vocabulary: List[str], dim: int,
                             seed: int = 0) -> Tuple[torch.Tensor, float]:
    """``train.init_vectors``: the ``[len(vocabulary), dim]`` weights that every token
    embedding of a text model starts from, and the share of the vocabulary the file has.

    Words the file has take its vector, the others small random vectors and ``<pad>``
    zeros (:func:`~glomo_pyg.data.word_vectors.embedding_matrix`, drawn with ``seed``).
    The matrix is then rescaled to the embeddings' own initial scale (std
    ``dim ** -0.5``, :class:`~glomo_pyg.nn.UnitEncoder`): the layers after the embeddings
    were initialised for inputs of that size, so only the directions (which words are
    alike) come from the file. An extension: the paper learns its embeddings from
    random initial values."""
    from glomo_pyg.data.word_vectors import embedding_matrix, read_word_vectors

    try:
        words, vectors = read_word_vectors(os.path.expanduser(path), vocabulary=vocabulary)
    except (OSError, TextDataError) as err:
        raise ValueError(f"train.init_vectors: {err}") from None
    if not words:
        raise ValueError(f"train.init_vectors: {path} has a vector for none of the "
                         f"{len(vocabulary)} vocabulary words (another language or "
                         "tokenisation?)")
    if vectors.shape[1] != dim:
        raise ValueError(f"train.init_vectors: {path} holds {vectors.shape[1]}-d vectors, "
                         f"the token embeddings are {dim} wide")
    if not np.any(vectors):  # no directions to take
        raise ValueError(f"train.init_vectors: every vector of {path} is zero")
    try:
        weight, found = embedding_matrix(vocabulary, words, vectors, seed=seed)
    except ValueError as err:
        raise ValueError(f"train.init_vectors: {path}: {err}") from None
    std = float(weight.double().std()) if weight.numel() > 1 else 0.0
    if not std > 0:  # (equal vectors and one word alike: nothing to rescale to)
        raise ValueError(f"train.init_vectors: the embeddings made from {path} do not vary "
                         "(every value equal): they carry no directions to start from")
    return (weight.double() * (dim ** -0.5 / std)).float(), found


def _read_syntax_treebank(t: TrainConfig):
    """The trees of ``train.syntax_treebank`` (read before the corpus is prepared)."""
    from glomo_pyg.analysis.treebank import TreebankFormatError, read_treebank

    path = os.path.expanduser(t.syntax_treebank)
    try:
        trees = read_treebank(path, max_sentences=t.syntax_sentences)
    except (OSError, TreebankFormatError) as err:
        raise ValueError(f"train.syntax_treebank: {err}") from None
    if not trees:
        raise ValueError(f"train.syntax_treebank: {path} holds no sentences")
    return trees


# train settings a resumed run must keep: the optimiser state and the data position
# in the checkpoint were made with them (Lightning restores the optimiser's own lr)
RESUME_FIXED_TRAIN = ("optimizer", "lr", "graph_lr_scale", "weight_decay", "momentum",
                      "batch_size", "seed")  # (the seed draws the validation split)
# model settings that change only the speed (the same graphs), so a resume may change them
RESUME_FREE_MODEL = ("layout",)


def _check_resume_settings(config: PretrainConfig, before: Any, source: str, out: str,
                           remedy: str = "") -> None:
    """Refuse to resume a run whose checkpoint was made with other model or corpus
    settings, or other train settings that its optimiser state and data position depend
    on. ``before`` is the settings mapping recorded in ``source`` (the checkpoint, or
    ``config.json`` for checkpoints written before checkpoints recorded them)."""
    if not isinstance(before, dict):
        raise ValueError(f"{source} is damaged (its settings are not a mapping){remedy}")
    now = config.to_dict()
    if isinstance(before.get("corpus"), dict):
        before = dict(before, corpus=_with_corpus_defaults(before["corpus"], now["corpus"]))
        # where the corpus lies may change (another machine): its fingerprint checks the
        # content; a text corpus's prepared tokens are tied to their path (corpus.json)
        before["corpus"] = dict(before["corpus"], path=now["corpus"]["path"])
    if isinstance(before.get("model"), dict):
        before = dict(before, model={k: v for k, v in before["model"].items()
                                     if k not in RESUME_FREE_MODEL})
    now = dict(now, model={k: v for k, v in now["model"].items() if k not in RESUME_FREE_MODEL})
    changed = [k for k in ("model", "corpus") if before.get(k) != now[k]]
    if changed:
        raise ValueError(f"{out}: the checkpoint was trained with other {' and '.join(changed)} "
                         f"settings ({source}); resume with the same ones (only "
                         "train settings such as max_steps, and model.layout, may change)")
    saved_train = before.get("train") if isinstance(before.get("train"), dict) else {}
    used = [k for k in RESUME_FIXED_TRAIN  # (Adam ignores momentum)
            if k != "momentum" or "sgd" in (saved_train.get("optimizer"), now["train"]["optimizer"])]
    fixed = [f"train.{k} {_short(saved_train[k])} -> {_short(now['train'][k])}"
             for k in used if k in saved_train and saved_train[k] != now["train"][k]]
    if fixed:
        raise ValueError(f"{out}: cannot resume with changed {', '.join(fixed)}: the "
                         "checkpoint's optimiser state and data position were made with the "
                         f"saved ones ({source}); start a new output_dir to change them")


def _metric(trainer: pl.Trainer, name: str) -> Optional[float]:
    """A logged metric as a float, or None (not NaN: the summary is strict JSON) when it
    was not logged, e.g. no validation ran."""
    value = trainer.callback_metrics.get(name)
    return float(value) if value is not None and math.isfinite(float(value)) else None


def run_pretraining(config: PretrainConfig, resume: bool = False,
                    extra_callbacks: Optional[List[pl.Callback]] = None, log=print,
                    prepare_only: bool = False) -> Dict[str, Any]:
    """Prepare the corpus, train, and save the predictor. Returns a summary (also written
    to ``<output>/pretrain.json``). ``prepare_only`` stops after the corpus (tokens and
    vocabulary): do that once before a multi-node run whose nodes share the folder.

    ``resume`` continues from the newest usable checkpoint of ``<output>/checkpoints``
    after checking it against the settings it records (model, corpus, and the train
    settings its optimiser state and data position depend on) and against the corpus
    (fingerprint).
    SIGTERM or SIGINT while training writes a checkpoint and raises
    :class:`~glomo_pyg.training.interrupts.TrainingInterrupted`."""
    from glomo_pyg.io.pretrained import save_pretrained

    config.validate()
    child = is_launcher_child()
    if child:
        log = lambda *args, **kwargs: None  # noqa: E731 (the first process reports)
    out = config.output_dir
    folder = os.path.join(out, "checkpoints")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"output_dir {out} is a file, not a folder")
    os.makedirs(out, exist_ok=True)
    existing = newest_checkpoint_file(folder)
    if not resume and existing is not None and not child:
        raise FileExistsError(f"{out} already holds a run ({existing}); pass --resume to "
                              "continue it or choose another output_dir")
    found = None
    if resume:
        if not child:
            for tmp in stale_temporary_files(folder):
                log(f"removing {tmp}: an unfinished checkpoint write of a killed run")
                os.unlink(tmp)
        found = find_resume_checkpoint(folder, log)
        if found is None:
            log(f"--resume: no checkpoint in {folder} yet; starting from scratch")
    ckpt, contents = found if found is not None else (None, None)
    start_step = int(contents.get("global_step", 0)) if contents is not None else 0
    if start_step > config.train.max_steps:
        raise ValueError(f"{ckpt} is at step {start_step}, past train.max_steps "
                         f"({config.train.max_steps}); raise max_steps to continue the run")
    saved_config = os.path.join(out, "config.json")
    recorded = (contents.get(CHECKPOINT_KEY) or {}).get("settings") if contents else None
    if recorded is not None:  # the checkpoint's own record: config.json is only a copy
        _check_resume_settings(config, recorded, ckpt, out)
    elif ckpt is not None and os.path.exists(saved_config):  # older checkpoints
        skip = ("delete it to skip this check (it is rewritten from the current settings; "
                "the checkpoint itself is still checked against the model and corpus)")
        _check_resume_settings(config, _read_json(saved_config, skip), saved_config, out,
                               remedy=f"; {skip}")
    if not child and ckpt is None:  # (resumed runs: once the checkpoint passed its checks)
        _write_json(saved_config, config.to_dict())
    _check_model_builds(config)
    if not prepare_only:  # (a corpus may be prepared on a machine without the cluster/GPU)
        _check_trainer_builds(config)
    c, t = config.corpus, config.train
    if t.graph_warmup_steps and t.graph_warmup_steps >= t.max_steps:
        message = (f"train.graph_warmup_steps ({t.graph_warmup_steps}) >= train.max_steps "
                   f"({t.max_steps}): the graph predictor is frozen during the warm-up, so "
                   "the saved graphs will be those of its random initialisation")
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        log(f"warning: {message}")
    images = c.format in IMAGE_FORMATS
    trees = _read_syntax_treebank(t) if t.syntax_treebank and not images and \
        not prepare_only else None
    if t.init_vectors not in (None, TRAIN_VECTORS) and ckpt is None and not prepare_only:
        _check_init_vectors(config)
    if images:
        vocab, pixels = None, load_pretraining_images(c)
        log(f"images: {len(pixels)} of {tuple(pixels.shape[1:])} from {c.path}")
        if prepare_only:
            return dict(images=len(pixels))
        fingerprint, where = image_fingerprint(pixels), f"corpus.path ({c.path})"
    else:
        vocab, shards = prepare_corpus(config.corpus, out, log)
        if len(vocab) > MAX_VOCABULARY:  # the saved predictor could not be loaded
            raise ValueError(f"the corpus has {len(vocab)} distinct tokens, more than a saved "
                             f"predictor may hold ({MAX_VOCABULARY}): set corpus.max_size")
        if prepare_only:
            return dict(vocabulary=len(vocab), tokens=read_shard_index(shards)["num_tokens"])
        fingerprint = corpus_fingerprint(vocab, shards)
        where = f"the corpus ({c.path}, prepared in {shards})"
    threads = torch.get_num_threads()  # restored on return: no lasting side effect
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    try:
        pl.seed_everything(config.train.seed, workers=True, verbose=False)
        if images:
            data = ImagePretrainingData(pixels, t.batch_size, c.validation_fraction, t.seed,
                                        t.num_workers)
            full = (pixels.size(2), pixels.size(3))
            if c.crop is not None and c.crop > min(full):
                raise ValueError(f"corpus.crop {c.crop} is larger than the {full} images")
            crop = (c.crop, c.crop) if c.crop is not None else full
            model_kwargs = dict(config.model, modality="image", in_channels=pixels.size(1),
                                height=crop[0], width=crop[1])
        else:
            data = TextPretrainingData(shards, c.max_length, c.min_length, t.batch_size,
                                       c.validation_fraction, t.seed, t.num_workers)
            model_kwargs = dict(config.model, num_tokens=len(vocab), padding_idx=vocab.pad_id)
        module = GlomoPretraining(model_kwargs, lr=t.lr, graph_lr_scale=t.graph_lr_scale,
                                  graph_warmup_steps=t.graph_warmup_steps,
                                  weight_decay=t.weight_decay, optimizer=t.optimizer,
                                  momentum=t.momentum, flip=c.flip,
                                  image_size=full if images else None)
        found_vectors = None
        if t.init_vectors is not None and ckpt is None:  # (a resumed run has its weights)
            # (every process of a multi-process run trains its own vectors, written
            # atomically; DDP starts all of them from the first process's weights)
            width = _embedding_width(model_kwargs)
            source = t.init_vectors if t.init_vectors != TRAIN_VECTORS else \
                train_init_vectors(c, width, out, t.seed, max(1, torch.get_num_threads()), log)
            weight, found_vectors = initial_token_embeddings(source, vocab.tokens(), width,
                                                             t.seed)
            parts = INIT_VECTORS_PARTS[t.init_vectors_parts]
            module.model.set_token_embeddings(weight, parts)
            only = {"graph": "; g's only", "features": "; f's only"}.get(
                t.init_vectors_parts, "")
            log(f"token embeddings start from {source} ({found_vectors:.1%} of the "
                f"vocabulary found{only})")
        if contents is not None:
            _check_fingerprint(contents, ckpt, fingerprint, where, log)
            check_checkpoint_matches(contents, ckpt, module, model_kwargs,
                                     ignore=RESUME_FREE_MODEL)
            contents = found = None  # let go of the memory-mapped file
            if not child:
                _write_json(saved_config, config.to_dict())
        extra_callbacks = list(extra_callbacks or [])
        if trees is not None:
            from glomo_pyg.training.syntax_monitor import SyntaxMonitor

            monitor = SyntaxMonitor(trees, vocab.tokens(), t.syntax_every, lower=c.lower)
            try:  # refused now rather than when the first score is due
                monitor.check(module.model)
            except ValueError as err:
                raise ValueError(f"train.syntax_treebank: {err}") from None
            extra_callbacks.append(monitor)
        interrupt = GracefulInterrupt(os.path.join(folder, "last.ckpt"), quiet=child)
        record = _RunRecord(fingerprint, config.to_dict())
        with quiet_lightning():
            trainer = build_trainer(config, [*extra_callbacks, record, interrupt])
        log(f"trainer: {type(trainer.accelerator).__name__}, {trainer.num_devices} device(s) x "
            f"{trainer.num_nodes} node(s), {type(trainer.strategy).__name__}, precision "
            f"{trainer.precision}")
        unit = "images" if images else f"sequences of <= {c.max_length} tokens"
        log(f"pretraining: {len(data.train_ids)} training / {len(data.val_ids)} validation "
            f"{unit}, {t.max_steps} steps of {t.batch_size}"
            + (f", resuming from {ckpt}" if ckpt else ""))
        start = time.time()
        interrupt.install()
        try:
            with warnings.catch_warnings(), quiet_lightning():
                warnings.filterwarnings("ignore", ".*does not have many workers.*")
                warnings.filterwarnings("ignore", ".*isinstance.treespec, LeafSpec.*")
                warnings.filterwarnings("ignore",
                                        ".*Checkpoint directory .* exists and is not empty.*")
                warnings.filterwarnings("ignore", ".*Total length of .* across ranks is zero.*")
                trainer.fit(module, datamodule=data, ckpt_path=ckpt, weights_only=True)
        except SystemExit:
            # Lightning ends with sys.exit(1) after a KeyboardInterrupt (here: a second
            # signal, which stops at once), and with its SIGTERMException (a signal during
            # its sanity-check validation, before training)
            if interrupt.signum is None:
                raise
            detail = " (sent twice: stop at once)" if interrupt.count > 1 else ""
            raise TrainingInterrupted(interrupt.signum, trainer.global_step, None,
                                      detail) from None
        finally:
            interrupt.restore()
        summary_path = os.path.join(out, "pretrain.json")
        if trainer.global_step == start_step and ckpt is not None and \
                os.path.exists(summary_path) and os.path.isdir(os.path.join(out, "predictor")):
            saved = _read_json(summary_path, "delete it; it is rewritten by a run that trains")
            if isinstance(saved, dict) and saved.get("steps") == trainer.global_step:
                log(f"{ckpt} is already at train.max_steps ({t.max_steps}): nothing to train")
                return saved
            # (else the summary and predictor are from an earlier end: saved again below)
        seconds = time.time() - start
        size = dict(images=len(pixels)) if images else dict(tokens=data.windows.num_tokens,
                                                             vocabulary=len(vocab))
        summary = dict(steps=trainer.global_step, seconds=round(seconds, 1), **size,
                       train_loss=_metric(trainer, "train_loss"),
                       val_loss=_metric(trainer, "val_loss"))
        if found_vectors is not None:
            summary["init_vectors_found"] = round(found_vectors, 4)
        if trainer.is_global_zero:
            predictor = module.model.cpu().to_pretrained(
                vocab.tokens() if vocab else None,
                trained_length=None if images else c.max_length,
                trained_size=crop if images else None)
            if images and crop != full:  # trained on crops: the same weights at full size
                predictor = predictor.resized(*full)
            save_pretrained(predictor, os.path.join(out, "predictor"))
            _write_json(summary_path, summary)
            log(f"done: {summary['steps']} steps in {seconds:.0f} s; predictor saved to "
                f"{os.path.join(out, 'predictor')}")
        return summary
    finally:
        torch.set_num_threads(threads)
