"""The Lightning module of unsupervised GLoMo pretraining."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import lightning.pytorch as pl
import torch

from glomo_pyg.nn.glomo import Glomo
from glomo_pyg.settings import Rule, rules
from glomo_pyg.training.pretrain.config import TrainConfig


class GlomoPretraining(pl.LightningModule):
    """Trains a :class:`~glomo_pyg.Glomo` model on PyG token batches (``x`` token ids and
    a sorted ``batch`` vector). The graph predictor is frozen for the first
    ``graph_warmup_steps`` steps, then learns at ``graph_lr_scale`` times the learning
    rate (docs/training.md, "Why: squared-ReLU graphs can collapse under Adam").

    Args:
        model_kwargs: arguments of :meth:`Glomo.text <glomo_pyg.Glomo.text>` (or, with
            ``modality='image'``, of :meth:`Glomo.image <glomo_pyg.Glomo.image>`: batches
            of whole images' uint8 pixels), plus optionally ``layout``.
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
    """

    def __init__(self, model_kwargs: Dict[str, Any], lr: float = 3e-3, graph_lr_scale: float = 1.0,
                 graph_warmup_steps: int = 200, weight_decay: float = 0.0,
                 optimizer: str = "adam", momentum: float = 0.0, flip: bool = True,
                 image_size: Optional[Tuple[int, int]] = None):
        super().__init__()
        train = rules(TrainConfig)  # the rules glomo pretrain reads these with
        for name, value in (("lr", lr), ("graph_lr_scale", graph_lr_scale),
                            ("graph_warmup_steps", graph_warmup_steps),
                            ("weight_decay", weight_decay), ("optimizer", optimizer),
                            ("momentum", momentum)):
            train[name].check(name, value, typed=True)
        modality = Rule(str, choices=("text", "image")).check(
            "modality", model_kwargs.get("modality", "text"))
        self.save_hyperparameters()
        kwargs = {k: v for k, v in model_kwargs.items() if k not in ("layout", "modality")}
        self.modality = modality
        self.model = Glomo.text(**kwargs) if self.modality == "text" else Glomo.image(**kwargs)
        self.flip = bool(flip) and self.modality == "image"
        self.crop_size = (kwargs.get("height", 32), kwargs.get("width", 32))
        self.image_size = tuple(image_size) if image_size is not None else self.crop_size
        if self.modality == "image" and (self.crop_size[0] > self.image_size[0] or
                                         self.crop_size[1] > self.image_size[1]):
            raise ValueError(f"the crop size {self.crop_size} (the model's height and width, "
                             f"corpus.crop) is larger than the {self.image_size} images")
        if model_kwargs.get("layout") is not None:
            self.model.set_layout(model_kwargs["layout"])

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
