"""Every architecture setting of the graph predictors and the pretraining model, declared
once (:class:`ModelSettings`) with its rule and default: constructors, ``glomo pretrain``
and :func:`~glomo_pyg.load_pretrained` check values with the same rules and words."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple, Type

from glomo_pyg.io.pretrained import MAX_VOCABULARY
from glomo_pyg.nn.layout import LAYOUTS
from glomo_pyg.pixels import IMAGENET_MEAN, IMAGENET_STD
from glomo_pyg.settings import Rule, rules, setting

MAX_STRING = 256  # characters of a string setting (a saved config's are read from files)
MAX_LOCAL_CONTEXT = 64  # nearest units a layer may read directly (local_context)
MAX_SIDE = 1 << 16  # channels, pixels per side
MAX_DEPTH = 1024  # layers, heads


@dataclass
class ModelSettings:
    """The architecture settings, with the text model's defaults (:meth:`Glomo.text
    <glomo_pyg.Glomo.text>`; the image model's are :data:`IMAGE_DEFAULTS`)."""

    # what the data fix
    num_tokens: Optional[int] = setting(None, low=1, high=MAX_VOCABULARY,
                                        doc="token types (text; set from the vocabulary)")
    padding_idx: Optional[int] = setting(None, low=-MAX_VOCABULARY, high=MAX_VOCABULARY - 1,
                                         doc="the padding token's id, if any")
    height: int = setting(32, low=1, high=MAX_SIDE, doc="image rows (pixels)")
    width: int = setting(32, low=1, high=MAX_SIDE, doc="image columns (pixels)")
    in_channels: Optional[int] = setting(3, low=1, high=MAX_SIDE, doc="colour planes")
    grid_width: Optional[int] = setting(None, low=1, high=MAX_SIDE,
                                        doc="pixel graphs: the raster's width")
    pixel_mean: Optional[Sequence[float]] = setting(None, max_length=1 << 16,
                                                    doc="per-plane mean the pixels are "
                                                        "normalised with")
    pixel_std: Optional[Sequence[float]] = setting(None, max_length=1 << 16,
                                                   doc="per-plane standard deviation")
    # the graph predictor (paper Sec. 2.1)
    hidden_channels: int = setting(512, low=1, high=MAX_SIDE, doc="width of every layer")
    num_layers: int = setting(3, low=1, high=MAX_DEPTH, doc="graph layers L")
    heads: int = setting(8, low=1, high=MAX_DEPTH, doc="graphs per layer H")
    head_channels: Optional[int] = setting(None, low=1, high=MAX_SIDE,
                                           doc="key/query width per head (default: "
                                               "hidden_channels / heads)")
    cnn_layers: int = setting(4, low=0, high=MAX_DEPTH,
                              doc="convolutions of the predictor's encoder")
    kernel_size: int = setting(3, low=1, high=MAX_DEPTH - 1, doc="their kernel width")
    norm: Optional[str] = setting("layer", max_length=MAX_STRING,
                                  doc="normalisation of the encoder's layers")
    bias: str = setting("scalar", max_length=MAX_STRING, doc="the score's bias term")
    direction: str = setting("forward", max_length=MAX_STRING,
                             doc="'forward' or 'backward' graphs")
    include_self: bool = setting(False, doc="whether i = j edges are allowed")
    sparse: bool = setting(True, doc="squared ReLU (paper Eq. 1); false: softmax")
    position: Optional[str] = setting(None, max_length=MAX_STRING,
                                      doc="a learned distance term ('relative', 'grid')")
    position_frequencies: int = setting(16, low=1, high=4096,
                                        doc="frequencies of the distance term")
    position_period: float = setting(512.0, low=2,
                                     doc="longest period of the distance term (units)")
    block_size: int = setting(1 << 22, low=1, high=1 << 34,
                              doc="scores per block while emitting (memory bound)")
    dropout: float = setting(0.0, low=0, high=1, high_open=True, doc="dropout probability")
    # the feature predictor and the pretraining model (paper Sec. 2.1, Eq. 3)
    update: str = setting("gru", max_length=MAX_STRING, doc="the paper's v: 'gru' or 'residual'")
    decouple: bool = setting(True, saved=False,
                             doc="separate graph and feature predictors (false: the "
                                 "'-decouple' ablation)")
    pooled_context: bool = setting(False, saved="optional",
                                   doc="add the mean of each unit's allowed sources")
    local_context: int = setting(0, saved="optional", low=0, high=MAX_LOCAL_CONTEXT,
                                 doc="nearest units each layer reads directly")
    context_length: int = setting(3, saved=False, low=1, high=MAX_SIDE,
                                  doc="future units each position predicts (D)")
    num_positions: int = setting(20, saved=False, low=1, high=MAX_SIDE, doc="position embeddings")
    decoder_layers: int = setting(2, saved=False, low=1, high=MAX_DEPTH,
                                  doc="GRU layers of the decoder")
    objective: str = setting("unit", saved=False, choices=("unit", "sequence"),
                             doc="what the decoder predicts from: the unit's own feature or "
                                 "the mean of its prefix (suffix)")
    bidirectional: bool = setting(True, saved=False, doc="forward and backward graphs")
    keep_alive: float = setting(0.0, saved=False, low=0,
                                doc="weight of the dead-head penalty")
    keep_alive_margin: float = setting(0.1, saved=False, low=0, low_open=True,
                                       doc="its margin")
    entropy_penalty: float = setting(0.0, saved=False, low=0,
                                     doc="weight of the column-entropy penalty")
    layout: str = setting("sparse", saved=False, choices=LAYOUTS,
                          doc="graph layout at run time (not saved)")


MODEL_RULES: Dict[str, Rule] = rules(ModelSettings)
#: The defaults of the text model (``Glomo.text``, :class:`GraphPredictor`).
TEXT_DEFAULTS = ModelSettings()
#: The defaults of the pixel model (``Glomo.image``, :class:`PixelGraphPredictor`): the text
#: model's but for these.
IMAGE_DEFAULTS = ModelSettings(hidden_channels=128, cnn_layers=3, num_positions=64,
                               position_frequencies=8, position_period=64.0,
                               pixel_mean=IMAGENET_MEAN, pixel_std=IMAGENET_STD)


def saved_settings(settings: type = ModelSettings,
                   which: Tuple[Any, ...] = (True, "optional")) -> Tuple[str, ...]:
    """The settings of the dataclass ``settings`` (:class:`ModelSettings` or a subclass)
    whose ``saved`` is in ``which``: by default every one a saved emitter config may hold;
    ``which=("optional",)``: those that files written before they existed lack (loaded
    with their defaults)."""
    return tuple(f.name for f in dataclasses.fields(settings)
                 if f.metadata.get("saved", True) in which)


#: The settings a saved emitter config may hold: the constructor arguments of the
#: registered emitters (tests/test_pretrained_io.py checks that every one is here).
SAVED_SETTINGS: Tuple[str, ...] = saved_settings()


def check_model_setting(name: str, value: Any, error: Type[Exception] = ValueError,
                        key: Optional[str] = None, settings: type = ModelSettings,
                        **how) -> Any:
    """``value`` checked (and normalised) by the rule of setting ``name`` of ``settings``
    (:class:`ModelSettings` or a subclass declaring more); ``error`` names ``key``
    (default: ``name``); ``how``: :meth:`~glomo_pyg.settings.Rule.check`'s options."""
    return rules(settings)[name].check(name if key is None else key, value, error, **how)
