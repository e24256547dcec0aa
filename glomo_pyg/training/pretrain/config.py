"""The settings of ``glomo pretrain``: :class:`PretrainConfig` (``corpus``, ``model``,
``train`` sections from YAML and ``--set`` overrides), each value checked at the door with
an error naming its dotted key."""
from __future__ import annotations

import dataclasses
import math
import os
import reprlib
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional


from glomo_pyg.data.corpora import IMAGE_FORMATS, TEXT_FORMATS
from glomo_pyg.data.text import SPECIALS
from glomo_pyg.io.pretrained import CONFIG_RULES, MAX_VOCABULARY
from glomo_pyg.nn.feature_predictor import MAX_LOCAL_CONTEXT
from glomo_pyg.nn.glomo import EMBEDDING_PARTS
from glomo_pyg.threads import MAX_THREADS
from glomo_pyg.training.pretraining import OPTIMIZERS



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


def short_repr(value: Any) -> str:
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
        fail = ValueError(f"{key} must be {self.describe()}, got {short_repr(value)}")
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
            raise ValueError(f"{key} must be {self.describe()}, got {short_repr(value)}")
        return value


def _accelerators():
    from lightning.pytorch.accelerators import AcceleratorRegistry

    return ("auto", "gpu", *sorted(AcceleratorRegistry.available_accelerators()))


def _strategies():
    from lightning.pytorch.strategies import StrategyRegistry

    return ("auto", *StrategyRegistry.available_strategies())


# Lightning's precision settings that pretraining supports (Lightning keeps its own list
# private; transformer-engine needs NVIDIA's extra package). Whether the chosen device can
# run one is checked when the trainer is built.
PRECISIONS = ("64-true", "32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed",
              "64", "32", "16", "bf16")


def _precisions():
    return PRECISIONS


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
                         f"{name}.{_EXAMPLE[name]}), got {short_repr(section)}")
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
                             f"corpus, model and train, got {short_repr(data)}")
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
            raise ValueError(f"output_dir must be a folder path, got {short_repr(self.output_dir)}")
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
                             f"model.hidden_channels), got {short_repr(self.model)}")
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
                             f"section but the value {short_repr(node)}")
    node[keys[-1]] = value
