"""The Lightning module of unsupervised GLoMo pretraining."""
from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, cast

import lightning.pytorch as pl
import torch

from glomo_pyg.nn.glomo import Glomo
from glomo_pyg.nn.settings import IMAGE_DEFAULTS, TEXT_DEFAULTS, ModelSettings
from glomo_pyg.settings import Rule, rules
from glomo_pyg.training.pretrain.config import TrainConfig

_T, _I = TEXT_DEFAULTS, IMAGE_DEFAULTS
_FACTORIES: Dict[str, Callable[..., Glomo]] = {"text": Glomo.text, "image": Glomo.image}
# the model settings each modality's factory takes
_ARGUMENTS = {m: tuple(inspect.signature(f).parameters) for m, f in _FACTORIES.items()}
# settings whose declared default depends on the modality: the constructor's None is it
BY_MODALITY = tuple(f.name for f in dataclasses.fields(ModelSettings)
                    if getattr(_T, f.name) != getattr(_I, f.name))
#: The constructor arguments of :class:`GlomoPretraining` that describe its model.
MODEL_ARGUMENTS = ("modality", *dict.fromkeys(_ARGUMENTS["text"] + _ARGUMENTS["image"]),
                   "layout")


def model_settings(hparams: Mapping[str, Any]) -> Dict[str, Any]:
    """Every argument of :meth:`Glomo.text <glomo_pyg.Glomo.text>` (or :meth:`Glomo.image
    <glomo_pyg.Glomo.image>`) that a :class:`GlomoPretraining` module of the
    hyperparameters ``hparams`` builds its model with: an absent one, and ``None`` for a
    setting whose default depends on the modality, is the modality's declared default.
    ``hparams`` may be a checkpoint's ``hyper_parameters``, also one of glomo_pyg 0.7 or
    earlier (whose model settings are in ``model_kwargs``)."""
    old = hparams.get("model_kwargs")
    given = old if isinstance(old, Mapping) else hparams
    modality = given.get("modality", "text")
    defaults = IMAGE_DEFAULTS if modality == "image" else TEXT_DEFAULTS
    out = {}
    for name in _ARGUMENTS["image" if modality == "image" else "text"]:
        value = given.get(name)
        if value is None and (name not in given or name in BY_MODALITY):
            value = getattr(defaults, name)
        out[name] = value
    return out


def recorded_model_settings(hparams: Any) -> Optional[Dict[str, Any]]:
    """:func:`model_settings` of a checkpoint's ``hyper_parameters``, or ``None`` where
    they record no model (a checkpoint of another module)."""
    if not isinstance(hparams, Mapping) or not ("modality" in hparams or
                                                isinstance(hparams.get("model_kwargs"), Mapping)):
        return None
    return model_settings(hparams)


class GlomoPretraining(pl.LightningModule):
    """Trains a :class:`~glomo_pyg.Glomo` model on PyG token batches (``x`` token ids and
    a sorted ``batch`` vector). The graph predictor is frozen for the first
    ``graph_warmup_steps`` steps, then learns at ``graph_lr_scale`` times the learning
    rate (docs/training.md, "Why: squared-ReLU graphs can collapse under Adam").

    Every argument is typed, so that ``LightningCLI(GlomoPretraining, TextPretrainingData)``
    reads them from its command line or YAML (docs/training.md, "LightningCLI").

    Args:
        model_kwargs (dict, optional): deprecated: the model settings as one mapping (what
            glomo_pyg 0.7 took, and what its checkpoints record); pass them as the
            arguments below instead.
        modality (str): ``'text'`` (:meth:`Glomo.text <glomo_pyg.Glomo.text>`) or
            ``'image'`` (:meth:`Glomo.image <glomo_pyg.Glomo.image>`: batches of whole
            images' uint8 pixels). (default: :obj:`'text'`)
        num_tokens (int, optional): text: the vocabulary's size (required).
        hidden_channels (int, optional): the width of every layer; ``None`` (the
            default) is the modality's declared default
            (:data:`~glomo_pyg.nn.settings.TEXT_DEFAULTS`,
            :data:`~glomo_pyg.nn.settings.IMAGE_DEFAULTS`), as for ``cnn_layers``,
            ``num_positions``, ``position_frequencies``, ``position_period``,
            ``pixel_mean`` and ``pixel_std``.
        layout (str, optional): the graph layout at run time
            (:meth:`Glomo.set_layout <glomo_pyg.Glomo.set_layout>`). (default: the model's)
        lr (float): learning rate. (default: :obj:`3e-3`)
        graph_lr_scale (float): the graph predictor's lr factor. (default: :obj:`1.0`)
        graph_warmup_steps (int): steps the graph predictor is frozen. (default: :obj:`200`)
        weight_decay (float): weight decay. (default: :obj:`0.`)
        optimizer (str): ``'adam'`` or ``'sgd'``. (default: :obj:`'adam'`)
        momentum (float): SGD momentum. (default: :obj:`0.`)
        flip (bool): images only: random horizontal flips. (default: :obj:`True`)
        image_size (tuple, optional): images only: ``(H, W)`` of the batches' images when
            the model is built for smaller crops: random crops while training, centre crops
            otherwise. (default: the model's size)

    The other model settings are the factory's, with their declared defaults
    (:class:`~glomo_pyg.nn.settings.ModelSettings`); a setting that only the other
    modality's factory takes must keep its default (:class:`TypeError` otherwise).
    """

    def __init__(self, model_kwargs: Optional[Dict[str, Any]] = None, *,
                 modality: str = "text", num_tokens: Optional[int] = _T.num_tokens,
                 padding_idx: Optional[int] = _T.padding_idx, height: int = _I.height,
                 width: int = _I.width, in_channels: int = cast(int, _I.in_channels),
                 hidden_channels: Optional[int] = None, num_layers: int = _T.num_layers,
                 heads: int = _T.heads, head_channels: Optional[int] = _T.head_channels,
                 cnn_layers: Optional[int] = None, kernel_size: int = _T.kernel_size,
                 norm: Optional[str] = _T.norm, bias: str = _T.bias,
                 include_self: bool = _T.include_self, sparse: bool = _T.sparse,
                 position: Optional[str] = _T.position,
                 position_frequencies: Optional[int] = None,
                 position_period: Optional[float] = None, block_size: int = _T.block_size,
                 dropout: float = _T.dropout, update: str = _T.update,
                 decouple: bool = _T.decouple, pooled_context: bool = _T.pooled_context,
                 local_context: int = _T.local_context,
                 context_length: int = _T.context_length,
                 num_positions: Optional[int] = None, decoder_layers: int = _T.decoder_layers,
                 objective: str = _T.objective, bidirectional: bool = _T.bidirectional,
                 keep_alive: float = _T.keep_alive,
                 keep_alive_margin: float = _T.keep_alive_margin,
                 entropy_penalty: float = _T.entropy_penalty,
                 pixel_mean: Optional[Sequence[float]] = None,
                 pixel_std: Optional[Sequence[float]] = None, layout: Optional[str] = None,
                 lr: float = 3e-3, graph_lr_scale: float = 1.0, graph_warmup_steps: int = 200,
                 weight_decay: float = 0.0, optimizer: str = "adam", momentum: float = 0.0,
                 flip: bool = True, image_size: Optional[Tuple[int, int]] = None):
        super().__init__()
        self.save_hyperparameters(ignore=["model_kwargs"])  # (flat: what LightningCLI sets)
        if model_kwargs is not None:
            warnings.warn("GlomoPretraining(model_kwargs) is deprecated: pass the model "
                          "settings as keyword arguments (GlomoPretraining(**model_kwargs, "
                          "lr=...))", DeprecationWarning, stacklevel=2)
            self.save_hyperparameters(_with_model_kwargs(dict(self.hparams), model_kwargs))
        h = self.hparams
        train = rules(TrainConfig)  # the rules glomo pretrain reads these with
        for name in ("lr", "graph_lr_scale", "graph_warmup_steps", "weight_decay", "optimizer",
                     "momentum"):
            train[name].check(name, h[name], typed=True)
        self.modality = Rule(str, choices=("text", "image")).check("modality", h["modality"])
        _check_modality_settings(h, self.modality)
        #: The arguments the model was built with, every one spelled out.
        self.model_settings = model_settings(h)
        self.model = _FACTORIES[self.modality](**self.model_settings)
        self.flip = bool(h["flip"]) and self.modality == "image"
        self.crop_size = (h["height"], h["width"])
        size = h["image_size"]
        self.image_size = tuple(size) if size is not None else self.crop_size
        if self.modality == "image" and (self.crop_size[0] > self.image_size[0] or
                                         self.crop_size[1] > self.image_size[1]):
            raise ValueError(f"the crop size {self.crop_size} (the model's height and width, "
                             f"corpus.crop) is larger than the {self.image_size} images")
        if h["layout"] is not None:
            self.model.set_layout(h["layout"])

    def forward(self, x: torch.Tensor, batch: Optional[torch.Tensor] = None):
        return self.model(x, batch)

    def _augmented(self, x: torch.Tensor, batch: torch.Tensor, train: bool):
        """Whole images cut to the crop size (random while training, else centred), half of
        them mirrored while training; drawn from the global random stream checkpoints keep."""
        (h, w), (ch, cw) = self.image_size, self.crop_size
        if x.size(0) % (h * w) or (not self.flip and (h, w) == (ch, cw)):
            return x, batch  # not whole images: the model refuses them with a clear error
        img = x.view(-1, h, w, x.size(-1))
        b = img.size(0)
        if (h, w) != (ch, cw):
            if train:
                top = torch.randint(0, h - ch + 1, (b,)).tolist()
                left = torch.randint(0, w - cw + 1, (b,)).tolist()
            else:
                top, left = [(h - ch) // 2] * b, [(w - cw) // 2] * b
            img = torch.stack([img[i, t:t + ch, l:l + cw] for i, (t, l) in
                               enumerate(zip(top, left))])
            batch = torch.arange(b, device=x.device).repeat_interleave(ch * cw)
        if self.flip and train:
            mask = torch.rand(b, device=x.device) < 0.5
            img = torch.where(mask.view(-1, 1, 1, 1), img.flip(2), img)
        return img.reshape(-1, x.size(-1)), batch

    def model_input(self, data, train: bool = False):
        """``(x, batch)`` the model reads for a loader batch (images cropped, augmented)."""
        return self._augmented(data.x, data.batch, train) if self.modality == "image" else \
            (data.x, data.batch)

    def _step(self, data, stage: str) -> torch.Tensor:
        x, batch = self.model_input(data, stage == "train")
        out = self.model(x, batch)
        sync = stage != "train"  # epoch-level validation metrics: averaged over ranks
        self.log_dict({f"{stage}/{k}": v for k, v in out.metrics.items()},
                      batch_size=int(data.num_graphs), prog_bar=False, sync_dist=sync)
        self.log(f"{stage}_loss", out.loss.detach(), batch_size=int(data.num_graphs),
                 prog_bar=True, sync_dist=sync)
        return out.loss

    def training_step(self, data, batch_idx: int) -> torch.Tensor:
        return self._step(data, "train")

    def validation_step(self, data, batch_idx: int) -> torch.Tensor:
        return self._step(data, "val")

    def configure_optimizers(self):
        graph = list(self.model.graph_parameters())
        ids = {id(p) for p in graph}
        rest = [p for p in self.model.parameters() if id(p) not in ids]
        lr, warmup = self.hparams.lr, self.hparams.graph_warmup_steps
        groups = [dict(params=rest, lr=lr),
                  dict(params=graph, lr=lr * self.hparams.graph_lr_scale)]
        if self.hparams.get("optimizer", "adam") == "sgd":
            optimizer = torch.optim.SGD(groups, momentum=self.hparams.get("momentum", 0.0),
                                        weight_decay=self.hparams.weight_decay)
        else:
            optimizer = torch.optim.Adam(groups, weight_decay=self.hparams.weight_decay)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, [lambda step: 1.0, lambda step: float(step >= warmup)])
        return dict(optimizer=optimizer, lr_scheduler=dict(scheduler=schedule, interval="step"))


def _with_model_kwargs(arguments: Dict[str, Any], model_kwargs: Mapping[str, Any]
                       ) -> Dict[str, Any]:
    """The constructor's ``arguments`` with the deprecated ``model_kwargs`` mapping's."""
    unknown = sorted(set(model_kwargs) - set(MODEL_ARGUMENTS), key=str)
    if unknown:
        raise TypeError(f"model_kwargs: unknown model settings {unknown}")
    return {**arguments, **model_kwargs}


def _check_modality_settings(arguments: Mapping[str, Any], modality: str) -> None:
    """Refuse a setting that only the other modality's factory takes, set away from its
    default (this modality's model has no use for it), and a text model without
    ``num_tokens``."""
    defaults = inspect.signature(GlomoPretraining.__init__).parameters
    foreign = [k for k in MODEL_ARGUMENTS if k not in ("modality", "layout")
               and k not in _ARGUMENTS[modality] and arguments[k] != defaults[k].default]
    if foreign:
        raise TypeError(f"{', '.join(foreign)}: not a setting of the {modality} model "
                        f"(Glomo.{modality})")
    if modality == "text" and arguments["num_tokens"] is None:
        raise TypeError("num_tokens (the vocabulary's size) is required for a text model")
