"""Training of :class:`~glomo_pyg.GlomoResNet` image classifiers (paper Sec. 3.5) with
Lightning, as text classification and pretraining train: one recipe for every variant,
the best validation epoch kept, atomic checkpoints, an exact resume and the library's
interrupt handling (docs/images.md)."""
from __future__ import annotations

import hashlib
import logging
import math
import os
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union, cast

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor

from glomo_pyg.data.images import augment
from glomo_pyg.logs import job_output, warn_log_argument
from glomo_pyg.nn.resnet import GlomoResNet
from glomo_pyg.pixels import image_units
from glomo_pyg.settings import check_settings, setting
from glomo_pyg.training.checkpoints import (
    CHECKPOINT_KEY,
    AtomicCheckpointIO,
    CheckpointError,
    CheckpointMismatchError,
    check_checkpoint_matches,
    read_checkpoint,
)
from glomo_pyg.training.interrupts import GracefulInterrupt, TrainingInterrupted, interruptible
from glomo_pyg.training.pretrain.callbacks import RandomStateCheckpoint, RunRecord
from glomo_pyg.training.pretrain.corpus import image_fingerprint
from glomo_pyg.training.utils import checked_lightning, default_precision, quiet_lightning

logger = logging.getLogger(__name__)

Split = Tuple[Tensor, Tensor]  # uint8 images [n, C, H, W], labels [n]
#: The :attr:`RunRecord.settings` version of these checkpoints (2: the momentum is the
#: recipe's, constant; version 1's schedule cycled it, so its checkpoints do not resume).
RECORD_VERSION = 2


@dataclass
class ImageTrainConfig:
    """The recipe of :func:`train_image_classifier`."""

    epochs: int = setting(20, low=1)
    batch_size: int = setting(256, low=1)
    lr: float = setting(0.2, low=0, low_open=True, doc="peak of the one-cycle schedule")
    weight_decay: float = setting(5e-4, low=0)
    momentum: float = setting(0.9, low=0, high=1, high_open=True)
    warmup_fraction: float = setting(0.25, low=0, high=1, low_open=True, high_open=True,
                                     doc="share of the steps spent warming up")
    crop_padding: int = setting(4, low=0, doc="pixels padded before random crops (0: flips "
                                             "only)")
    crop_target: str = setting("pixels", choices=("pixels", "stage"),
                               doc="what the crops cut: the pixels (reflection padding) or the "
                                   "input stage's output H' (zero padding; works with "
                                   "precomputed propagations)")
    flip: bool = setting(True, doc="random horizontal flips")
    label_smoothing: float = setting(0.0, low=0, high=1, high_open=True)
    eval_batch_size: int = setting(512, low=1)

    def validate(self) -> None:
        """Every setting by its rule; :class:`ValueError` naming it."""
        check_settings(self)


@torch.no_grad()
def precompute_propagations(model: GlomoResNet, images: Tensor, batch_size: int = 64,
                            dtype: torch.dtype = torch.float16,
                            device: Optional[torch.device] = None,
                            storage: Union[str, torch.device, None] = "cpu",
                            autocast: bool = True) -> Tensor:
    """The transfer stage's :meth:`~glomo_pyg.GlomoTransfer.propagations` of each image,
    ``[n, D, K, H W, C]`` in ``dtype``: the same output as computing them in every step
    when the predictor is frozen and the pixels do not change (flips: pass those of
    ``images.flip(3)`` too, as the graphs are directional; crops: ``crop_target='stage'``).

    Args:
        device: where they are computed (default: the model's).
        storage: where they are kept: the CPU (default), or ``None`` for ``device``, where
            training reads a batch's rows without a host-to-device copy per step (they
            take ``n x D x K x H W x C`` elements: about 590 KB an image for a 3-layer x
            8-head predictor at 32x32 in float16).
        autocast: computed in bf16 autocast on a GPU (as :func:`evaluate` and bf16-mixed
            training run the predictor); ``False``: in float32.
    """
    if model.transfer is None or model.transfer.graph == "none":
        raise ValueError("precomputed propagations need a transfer stage with graphs")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    out: Optional[Tensor] = None
    for start in range(0, len(images), batch_size):
        chunk = images[start:start + batch_size].to(device)
        with torch.autocast("cuda", torch.bfloat16, enabled=autocast and device.type == "cuda"):
            x, batch = image_units(chunk)
            p = cast(Tensor, model.transfer.propagations(model.stage_input(chunk), x, batch))
        d, k, _, c = p.shape  # [D, K, B HW, C]
        p = p.view(d, k, len(chunk), -1, c).permute(2, 0, 1, 3, 4)
        if out is None:  # (one tensor, written chunk by chunk: a cat would hold it twice)
            out = torch.empty((len(images), *p.shape[1:]), dtype=dtype,
                              device=device if storage is None else storage)
        out[start:start + len(chunk)] = p
    if out is None:
        raise ValueError("no images to precompute the propagations of")
    return out


def crop_maps(maps: Tensor, corners: Tensor, padding: int) -> Tensor:
    """Random crops of ``maps`` ``[B, C, H, W]`` zero-padded by ``padding`` on each side:
    image ``b``'s crop starts at row and column ``corners[b]`` (each in ``[0, 2 padding]``)
    of its padded map, so it is the map moved by ``padding - corners[b]`` pixels with zero
    fill (one gather for the batch, no loop over images)."""
    if padding == 0:
        return maps
    b, _, h, w = maps.shape
    corners = corners.to(maps.device)
    padded = F.pad(maps, (padding, padding, padding, padding))
    rows = torch.arange(h, device=maps.device).view(1, h) + corners[:, :1]  # [B, H]
    cols = torch.arange(w, device=maps.device).view(1, w) + corners[:, 1:]  # [B, W]
    index = torch.arange(b, device=maps.device).view(b, 1, 1)
    out = padded.permute(0, 2, 3, 1)[index, rows.view(b, h, 1), cols.view(b, 1, w)]
    return out.permute(0, 3, 1, 2)


def _stage_propagations(p: Tensor) -> Tensor:
    """Per-image propagations ``[B, D, K, HW, C]`` as the stage reads them, float32
    ``[D, K, B HW, C]``."""
    b, d, k, t, c = p.shape
    return p.float().permute(1, 2, 0, 3, 4).reshape(d, k, b * t, c)


class ImageBatches:
    """The batches of a split held in memory, as ``dict(images, labels)`` (plus
    ``propagated``, ``[B, D, K, HW, C]``, with precomputed propagations, and
    ``crop_corners``, ``[B, 2]``, with crops of the stage's output for
    :func:`crop_maps`).

    With a ``generator`` (training) every epoch draws a random order, then each batch's
    flips and crops, from that one generator (the draws of glomo_pyg's earlier loop, so
    a seed gives the same data); :meth:`state` and :meth:`restore` carry it and the
    position in the epoch across a resume. Without one, the images in order.

    Args:
        crop_target: ``'pixels'``: crops of the images (:func:`~glomo_pyg.data.images.
            augment`); ``'stage'``: corners of crops of the stage's output, which the
            training step cuts.
        propagations: ``(plain, mirrored)``: :func:`precompute_propagations` of the images
            and of the flipped images (``mirrored`` may be None without flips), on any
            device (a batch's rows are gathered there).
    """

    def __init__(self, images: Tensor, labels: Tensor, batch_size: int,
                 generator: Optional[torch.Generator] = None, flip: bool = False,
                 crop_padding: int = 0,
                 propagations: Optional[Tuple[Tensor, Optional[Tensor]]] = None,
                 crop_target: str = "pixels"):
        self.images, self.labels, self.batch_size = images, labels, batch_size
        self.generator, self.flip, self.crop_padding = generator, flip, crop_padding
        self.propagations, self.crop_target = propagations, crop_target
        self._order: Optional[Tensor] = None  # this epoch's, drawn at its first batch
        self._order_state: Optional[Tensor] = None  # the generator before that draw
        self._position = 0  # batches of this epoch delivered

    def __len__(self) -> int:
        return math.ceil(len(self.images) / self.batch_size)

    def __iter__(self) -> Iterator[Dict[str, Tensor]]:
        # (a generator function: Lightning may create an iterator it never reads, and an
        # unread one must not draw an epoch's order)
        if self.generator is None:
            for start in range(0, len(self.images), self.batch_size):
                yield self._batch(torch.arange(start, min(start + self.batch_size,
                                                          len(self.images))))
            return
        if self._order is None or self._position >= len(self):  # a new epoch
            self._order_state = self.generator.get_state()
            self._order = torch.randperm(len(self.images), generator=self.generator)
            self._position = 0
        for index in self._order.split(self.batch_size)[self._position:]:
            batch = self._augmented(index)
            self._position += 1
            yield batch

    @staticmethod
    def _rows(tensor: Tensor, index: Tensor) -> Tensor:
        """``tensor[index]`` on the tensor's device, the index sent there without waiting
        for the device (a blocking copy would stall it every step)."""
        return tensor[index.to(tensor.device, non_blocking=True)]

    def _batch(self, index: Tensor) -> Dict[str, Tensor]:
        out = dict(images=self.images[index], labels=self.labels[index])
        if self.propagations is not None:
            out["propagated"] = self._rows(self.propagations[0], index)
        return out

    def _augmented(self, index: Tensor) -> Dict[str, Tensor]:
        stage_crops = self.crop_target == "stage" and self.crop_padding > 0
        if self.propagations is None and not stage_crops:
            images = augment(self.images[index], self.generator, flip=self.flip,
                             crop_padding=self.crop_padding)
            return dict(images=images, labels=self.labels[index])
        # the pixels stay whole: flips only, a flipped image takes the mirrored image's
        # propagations; crops (of the stage's output) are drawn as corners
        flip = torch.rand(len(index), generator=self.generator) < 0.5 if self.flip else \
            torch.zeros(len(index), dtype=torch.bool)
        images = self.images[index]
        out = dict(images=torch.where(flip.view(-1, 1, 1, 1).to(images.device), images.flip(3),
                                      images), labels=self.labels[index])
        if self.propagations is not None:
            plain, mirrored = self.propagations
            out["propagated"] = self._rows(plain, index)
            if mirrored is not None and self.flip:
                flipped = flip.view(-1, 1, 1, 1, 1).to(plain.device, non_blocking=True)
                out["propagated"] = torch.where(flipped, self._rows(mirrored, index),
                                                out["propagated"])
        if stage_crops:
            out["crop_corners"] = torch.randint(0, 2 * self.crop_padding + 1, (len(index), 2),
                                                generator=self.generator)
        return out

    def state(self) -> Dict[str, Any]:
        """The generator and the position in the epoch (empty without a generator)."""
        if self.generator is None:
            return {}
        return dict(generator=self.generator.get_state(), order_generator=self._order_state,
                    position=self._position)

    def restore(self, state: Dict[str, Any]) -> None:
        """Continue from a :meth:`state`: mid-epoch, the same order's remaining batches."""
        if self.generator is None or not state:
            return
        self._position = int(state["position"])
        self._order = None
        if state["order_generator"] is not None:  # (redrawn: the state is the smaller)
            self.generator.set_state(state["order_generator"])
            self._order = torch.randperm(len(self.images), generator=self.generator)
        self._order_state = state["order_generator"]
        self.generator.set_state(state["generator"])


class ImageClassification(pl.LightningModule):
    """Cross-entropy training of a :class:`~glomo_pyg.GlomoResNet` with ``config``'s
    recipe: SGD with constant Nesterov momentum on its trainable parameters, the
    one-cycle learning rate stepped every optimizer step over ``total_steps``; batches are
    :class:`ImageBatches`'. Logs ``train_loss`` and ``val_acc`` (kept in
    :attr:`val_acc`, exact, as well). An epoch whose training loss was not finite sets
    :attr:`diverged` and logs ``val_acc`` NaN, so its weights are never the best
    epoch's."""

    def __init__(self, model: GlomoResNet, config: ImageTrainConfig, total_steps: int):
        super().__init__()
        self.model, self.config, self.total_steps = model, config, total_steps
        self.val_acc: Optional[float] = None
        self.diverged = False
        self._correct: Union[int, Tensor] = 0
        self._seen = 0
        self._finite: Union[bool, Tensor] = True  # this epoch's losses so far

    def forward(self, images: Tensor, propagated: Optional[Tensor] = None) -> Tensor:
        return self.model(images, propagated=propagated)

    def _logits(self, batch: Dict[str, Tensor]) -> Tensor:
        propagated = batch.get("propagated")
        h = self.model.stage(batch["images"], None if propagated is None else
                             _stage_propagations(propagated))
        if "crop_corners" in batch:  # crops of H' (config.crop_target 'stage')
            h = crop_maps(h, batch["crop_corners"], self.config.crop_padding)
        return self.model.classify(h)

    def on_fit_start(self) -> None:
        if self.device.type == "cuda":  # the fast layout of cuDNN's convolutions
            self.model.resnet.to(memory_format=torch.channels_last)  # type: ignore[call-overload]

    def on_train_epoch_start(self) -> None:
        self._finite = True

    def training_step(self, batch: Dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = F.cross_entropy(self._logits(batch).float(), batch["labels"],
                               label_smoothing=self.config.label_smoothing)
        # (a tensor: read once an epoch, not a device synchronisation per step)
        self._finite = torch.isfinite(loss.detach()) & self._finite
        self.log("train_loss", loss, batch_size=len(batch["labels"]), prog_bar=True)
        return loss

    def on_validation_epoch_start(self) -> None:
        self._correct, self._seen = 0, 0

    def validation_step(self, batch: Dict[str, Tensor], batch_idx: int) -> None:
        # counted, not averaged: the accuracy is exact, whatever the batch sizes (a tensor
        # sum, read once at the end: no device synchronisation per batch)
        self._correct = (self._logits(batch).argmax(-1) == batch["labels"]).sum() + \
            self._correct
        self._seen += len(batch["labels"])

    def on_validation_epoch_end(self) -> None:
        self.val_acc = int(self._correct) / max(self._seen, 1)
        self.diverged = not bool(self._finite)
        # (ModelCheckpoint never keeps a NaN epoch, save the first one)
        self.log("val_acc", math.nan if self.diverged else self.val_acc, prog_bar=True)

    def configure_optimizers(self) -> Any:
        c = self.config
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(params, lr=c.lr, momentum=c.momentum, nesterov=True,
                                    weight_decay=c.weight_decay)
        schedule = torch.optim.lr_scheduler.OneCycleLR(  # warm-up, then linear decay
            optimizer, max_lr=c.lr, pct_start=c.warmup_fraction, anneal_strategy="linear",
            total_steps=self.total_steps, div_factor=25.0, final_div_factor=1e3,
            cycle_momentum=False)  # (cycling would replace the recipe's momentum)
        return dict(optimizer=optimizer,
                    lr_scheduler=dict(scheduler=schedule, interval="step", frequency=1))


class EpochHistory(pl.Callback):
    """Each epoch's validation accuracy, mean training loss and training seconds
    (validation apart), logged and kept across resumes (its state is checkpointed, that
    of a part-done epoch too). An epoch whose training loss was not finite
    (:attr:`ImageClassification.diverged`) ends the training: :attr:`diverged_at_epoch`
    (1-based) names it, and a resumed run trains no further."""

    def __init__(self, epochs: int):
        self.epochs = epochs
        self.val_curve: List[float] = []
        self.train_loss: List[float] = []
        self.epoch_seconds: List[float] = []
        self.diverged_at_epoch: Optional[int] = None
        self._loss: Union[float, Tensor] = 0.0  # this epoch's so far, summed over images
        self._images, self._seconds = 0, 0.0
        self._started: Optional[float] = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._started = time.time()  # (a run resumed mid-epoch has no epoch start)
        if self.diverged_at_epoch is not None:
            trainer.should_stop = True

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._loss, self._images, self._seconds = 0.0, 0, 0.0
        self._started = time.time()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Dict[str, Tensor], batch_idx: int) -> None:
        # (a tensor sum: no device synchronisation per step)
        self._loss = self._loss + outputs["loss"].detach().float() * len(batch["labels"])
        self._images += len(batch["labels"])

    def _elapsed(self) -> float:
        return self._seconds + (time.time() - self._started if self._started else 0.0)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        self._seconds, self._started = self._elapsed(), None

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        module = cast(ImageClassification, pl_module)
        loss = float(self._loss) / max(self._images, 1)
        self.val_curve.append(cast(float, module.val_acc))
        self.train_loss.append(loss)
        self.epoch_seconds.append(self._seconds)
        logger.info("epoch %d/%d: train loss %.4f, validation %.4f, %.1f s",
                    len(self.val_curve), self.epochs, loss, module.val_acc, self._seconds)
        if module.diverged and self.diverged_at_epoch is None:
            self.diverged_at_epoch = len(self.val_curve)
            trainer.should_stop = True  # (the weights are lost: the best epoch is kept)
            logger.warning("the training loss diverged in epoch %d: training stops, the best "
                           "validation epoch before it is kept", self.diverged_at_epoch)

    def state_dict(self) -> Dict[str, Any]:
        return dict(val_curve=self.val_curve, train_loss=self.train_loss,
                    epoch_seconds=self.epoch_seconds, loss=float(self._loss),
                    images=self._images, seconds=self._elapsed(),
                    diverged_at_epoch=self.diverged_at_epoch)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.val_curve = list(state_dict["val_curve"])
        self.train_loss = list(state_dict["train_loss"])
        self.epoch_seconds = list(state_dict["epoch_seconds"])
        self._loss, self._images = state_dict["loss"], state_dict["images"]
        self._seconds = state_dict["seconds"]
        self.diverged_at_epoch = state_dict.get("diverged_at_epoch")


class BatchOrder(pl.Callback):
    """Checkpoints the training :class:`ImageBatches`' generator and position. (Lightning
    restores a loader's own state only on a resume mid-epoch; the generator carries over
    epochs.)"""

    def __init__(self, batches: ImageBatches):
        self.batches = batches

    def state_dict(self) -> Dict[str, Any]:
        return self.batches.state()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.batches.restore(state_dict)


class EpochCheckpoint(pl.Callback):
    """Writes the run's resume checkpoint ``path`` at the end of every epoch, after its
    validation (through the trainer's checkpoint IO: atomic)."""

    def __init__(self, path: str):
        self.path = path

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        trainer.save_checkpoint(self.path)


class _Interrupt(GracefulInterrupt):
    """:class:`~glomo_pyg.training.interrupts.GracefulInterrupt`, which stops at the end
    of the epoch, its checkpoint written, rather than between the epoch's last batch and
    its validation (a resume from there would skip that validation); a run without a
    checkpoint file (nothing could resume) stops writing none."""

    def on_train_batch_end(self, trainer: pl.Trainer, *args) -> None:
        if self.signum is None or trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            return
        if self.checkpoint_path:
            super().on_train_batch_end(trainer, *args)  # (writes the checkpoint, raises)
        raise TrainingInterrupted(self.signum, trainer.global_step, None)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # (a signal in the last batch or the validation: EpochCheckpoint has written it)
        if self.signum is not None:
            raise TrainingInterrupted(self.signum, trainer.global_step,
                                      self.checkpoint_path or None)


def _check_inputs(model: GlomoResNet, train: Split, val: Split, config: ImageTrainConfig,
                  precomputed: bool) -> None:
    config.validate()
    classes = model.resnet.fc.out_features if hasattr(model.resnet, "fc") else None
    for name, (x, y) in (("train", train), ("val", val)):
        shaped = x.dim() == 4 and x.dtype == torch.uint8 and y.dim() == 1 and \
            len(y) == len(x) > 0
        low, high = (int(y.min()), int(y.max())) if shaped else (0, 0)
        if not shaped or low < 0 or (classes is not None and high >= classes):
            raise ValueError(f"{name} must be a non-empty split (uint8 images [n, C, H, W], "
                             f"labels [n] in [0, {classes}): the model has {classes} classes), "
                             f"got {x.dtype} {tuple(x.shape)} and labels {tuple(y.shape)}"
                             + (f" in [{low}, {high}]" if shaped else ""))
    side, steps = min(train[0].shape[2:]), math.ceil(len(train[0]) / config.batch_size)
    if config.crop_padding >= side or (precomputed and config.crop_padding and
                                       config.crop_target == "pixels"):
        problem = (f"crop_padding {config.crop_padding} must be below the image side {side}, "
                   "and 0 with precomputed propagations unless crop_target is 'stage' (they "
                   "cannot follow random crops of the pixels; flips are fine)")
    elif math.isclose(config.warmup_fraction * config.epochs * steps, 1.0):
        # torch's one-cycle schedule divides by (warm-up steps - 1): zero here
        problem = (f"{config.epochs} epochs x {steps} steps with warmup_fraction "
                   f"{config.warmup_fraction} give a warm-up of exactly one step, which the "
                   "one-cycle schedule cannot take; change epochs, batch_size or "
                   "warmup_fraction")
    else:
        return
    raise ValueError(problem)


def _check_propagations(train: Split, val: Split,
                        train_propagations: Optional[Tuple[Tensor, Optional[Tensor]]],
                        val_propagations: Optional[Tensor]) -> None:
    """One row of precomputed propagations per image (a mismatch would pair images with
    other images' propagations, or fail mid-epoch)."""
    given = [("train_propagations", t, len(train[0])) for t in train_propagations or ()] + \
        [("val_propagations", val_propagations, len(val[0]))]
    for name, tensor, n in given:
        if tensor is not None and (tensor.dim() != 5 or len(tensor) != n):
            raise ValueError(f"{name} must be precompute_propagations' [n, D, K, HW, C] for "
                             f"the split's {n} images, got {tuple(tensor.shape)}")


def best_checkpoint_path(checkpoint: str) -> str:
    """Where a run with the resume ``checkpoint`` keeps its best validation epoch's
    weights: ``run.ckpt`` -> ``run.best.ckpt``."""
    return os.path.splitext(checkpoint)[0] + ".best.ckpt"


def _data_record(train: Split, val: Split) -> Dict[str, Any]:
    """What identifies the splits a checkpoint was trained and selected on."""
    def split(images: Tensor, labels: Tensor) -> Dict[str, Any]:
        digest = hashlib.sha256(labels.contiguous().numpy().tobytes()).hexdigest()
        return dict(image_fingerprint(images), labels_sha256=digest)

    return dict(train=split(*train), val=split(*val))


def _run_settings(config: ImageTrainConfig, seed: int, precomputed: bool) -> Dict[str, Any]:
    settings = dict(asdict(config), seed=seed, precomputed=precomputed,
                    version=RECORD_VERSION)
    settings.pop("eval_batch_size")  # (does not change training)
    return settings


def _check_resume(path: str, module: ImageClassification, settings: Dict[str, Any],
                  data: Dict[str, Any]) -> None:
    """Refuse a checkpoint of another recipe, seed, data or model."""
    try:
        contents = read_checkpoint(path)
    except CheckpointError as err:
        raise type(err)(f"cannot resume from {path}: {err}; delete it to start this run "
                        "afresh") from None
    record = contents.get(CHECKPOINT_KEY) or {}
    before = dict(record.get("settings") or {}, **(record.get("corpus") or {}))
    now = dict(settings, **data)
    changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
    if changed:  # its optimiser schedule, data order or selection differ
        raise CheckpointMismatchError(
            f"{path} was written by a run with another recipe or training set (changed: "
            f"{', '.join(changed)}); delete it to start this run afresh")
    check_checkpoint_matches(contents, path, module)
    for state in (contents.get("callbacks") or {}).values():  # the best epoch's weights
        best = state.get("best_model_path") if isinstance(state, dict) else None
        if best and not os.path.isfile(best):
            raise CheckpointError(f"cannot resume from {path}: the best epoch's weights it "
                                  f"refers to, {best}, are missing; delete it to start this "
                                  "run afresh")


def _accelerator(device, accelerator: str, devices: Any) -> Tuple[str, Any]:
    """Lightning's ``accelerator`` and ``devices`` for an explicit torch ``device``."""
    if device is None:
        return accelerator, devices
    device = torch.device(device)
    if device.type == "cpu":
        return "cpu", 1
    return device.type, [device.index] if device.index is not None else 1


def _trainer(folder: str, epochs: int, accelerator: str, devices: Any, precision: str,
             callbacks: Sequence[pl.Callback], progress_bar: bool) -> pl.Trainer:
    def build() -> pl.Trainer:
        return pl.Trainer(max_epochs=epochs, accelerator=accelerator, devices=devices,
                          precision=cast(Any, precision),  # (Lightning checks the name)
                          logger=False, callbacks=list(callbacks),
                          enable_progress_bar=progress_bar, enable_model_summary=False,
                          num_sanity_val_steps=0, default_root_dir=folder,
                          plugins=[AtomicCheckpointIO()])

    trainer = checked_lightning(f"accelerator {accelerator!r}, devices {devices!r}, "
                                f"precision {precision!r}", build)
    if trainer.num_devices * trainer.num_nodes != 1:  # (in-memory batches are not sharded)
        raise ValueError(f"image classification trains on one device; devices {devices!r} "
                         f"gives {trainer.num_devices}")
    return trainer


def _fit(trainer: pl.Trainer, module: ImageClassification, batches: Tuple[ImageBatches, ...],
         ckpt: Optional[str], interrupt: GracefulInterrupt) -> None:
    """Trains ``module``; a signal's exit becomes :class:`TrainingInterrupted`."""
    with interruptible(trainer, interrupt), quiet_lightning(), warnings.catch_warnings():
        # (BatchOrder restores the batches' position: the loader is resumable)
        warnings.filterwarnings("ignore", ".*your dataloader is not resumable.*")
        trainer.fit(module, batches[0], batches[1], ckpt_path=ckpt, weights_only=True)


def train_image_classifier(model: GlomoResNet, train: Split, val: Split,
                           config: ImageTrainConfig, *, seed: int = 0, device=None,
                           checkpoint: Optional[str] = None,
                           train_propagations: Optional[Tuple[Tensor, Optional[Tensor]]] = None,
                           val_propagations: Optional[Tensor] = None,
                           accelerator: str = "auto", devices: Any = 1,
                           precision: Optional[str] = None, progress_bar: bool = False,
                           extra_callbacks: Optional[List[pl.Callback]] = None,
                           log: Optional[Callable[[str], None]] = None) -> Dict:
    """Train ``model`` on ``train = (images, labels)`` with ``config``'s recipe, validate
    after every epoch, and return ``dict(best_val, best_epoch, val_curve, train_loss,
    epoch_seconds, diverged_at_epoch, state)``: ``best_epoch`` 0-based, the lists one
    entry per epoch trained (``epoch_seconds``: training alone, validation apart),
    ``diverged_at_epoch`` the 1-based epoch whose training loss was not finite, where
    training stopped (else None), and ``state`` the best epoch's weights (loaded into
    ``model`` too, on the device it trained on).

    Args:
        device: a torch device to train on, instead of ``accelerator`` and ``devices``
            (Lightning's; one device); ``precision`` (Lightning's) is by default
            ``'bf16-mixed'`` on a GPU, ``'32-true'`` otherwise.
        checkpoint: the resume file, written atomically after every epoch and on SIGTERM
            or SIGINT (:class:`~glomo_pyg.training.interrupts.TrainingInterrupted`); an
            existing one is resumed, exactly. The best epoch's weights go to
            :func:`best_checkpoint_path` beside it.
        train_propagations: :func:`precompute_propagations` of the training images and of
            ``images.flip(3)`` (``None`` without flips; needs ``crop_padding=0`` or
            ``crop_target='stage'``). They, and ``val_propagations``, may be kept on the
            training device: a batch's rows are gathered there.
        log: deprecated: a callable receiving the progress lines, which are INFO records
            of this module's logger, printed on standard output where the application set
            up no logging (:func:`glomo_pyg.logs.job_output`).

    Raises:
        CheckpointError: ``checkpoint`` is damaged or of another recipe, seed, data or
            model (a :class:`ValueError`).
    """
    if log is not None:
        warn_log_argument("train_image_classifier")
    _check_inputs(model, train, val, config, train_propagations is not None)
    _check_propagations(train, val, train_propagations, val_propagations)
    accelerator, devices = _accelerator(device, accelerator, devices)
    precision = default_precision(precision, accelerator)
    steps = math.ceil(len(train[0]) / config.batch_size)
    module = ImageClassification(model, config, total_steps=config.epochs * steps)
    batches = (ImageBatches(*train, config.batch_size, torch.Generator().manual_seed(seed),
                            config.flip, config.crop_padding, train_propagations,
                            config.crop_target),
               ImageBatches(*val, config.eval_batch_size, propagations=None
                            if val_propagations is None else (val_propagations, None)))
    settings = _run_settings(config, seed, train_propagations is not None)
    data = _data_record(train, val)
    resume = checkpoint if checkpoint and os.path.exists(checkpoint) else None
    if resume:
        _check_resume(resume, module, settings, data)
    with job_output(log), tempfile.TemporaryDirectory(prefix="glomo-images-") as tmp:
        best_file = best_checkpoint_path(checkpoint or os.path.join(tmp, "run.ckpt"))
        return _train(module, batches, settings, data, best_file, checkpoint, resume,
                      (accelerator, devices, precision), progress_bar, extra_callbacks)


def _train(module: ImageClassification, batches: Tuple[ImageBatches, ImageBatches],
           settings: Dict[str, Any], data: Dict[str, Any], best_file: str,
           checkpoint: Optional[str], resume: Optional[str], hardware: Tuple[str, Any, str],
           progress_bar: bool, extra_callbacks: Optional[List[pl.Callback]]) -> Dict:
    """:func:`train_image_classifier`'s trainer, training and best epoch."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    folder, name = os.path.split(best_file)
    best = ModelCheckpoint(dirpath=folder, filename=name[:-len(".ckpt")], monitor="val_acc",
                           mode="max", save_top_k=1, save_weights_only=True,
                           auto_insert_metric_name=False, enable_version_counter=False,
                           save_on_train_epoch_end=False)  # (before EpochCheckpoint's)
    history = EpochHistory(module.config.epochs)
    interrupt = _Interrupt(checkpoint or "")
    callbacks = [*(extra_callbacks or []), history, BatchOrder(batches[0]),
                 RunRecord(data, settings), RandomStateCheckpoint(),
                 *([EpochCheckpoint(checkpoint)] if checkpoint else []), interrupt, best]
    accelerator, devices, precision = hardware
    trainer = _trainer(folder, module.config.epochs, accelerator, devices, precision,
                       callbacks, progress_bar)
    if resume:
        logger.info("resuming from %s", resume)
    _fit(trainer, module, batches, resume, interrupt)
    contents = read_checkpoint(best.best_model_path)
    module.load_state_dict(contents["state_dict"])
    best_epoch = int(contents["epoch"])
    del contents  # (memory-mapped)
    module.to(trainer.strategy.root_device)  # (Lightning's teardown moved it to the CPU)
    state = {k: v.detach().cpu().clone() for k, v in module.model.state_dict().items()}
    return dict(state=state, best_val=history.val_curve[best_epoch], best_epoch=best_epoch,
                val_curve=history.val_curve, train_loss=history.train_loss,
                epoch_seconds=history.epoch_seconds,
                diverged_at_epoch=history.diverged_at_epoch)


@torch.no_grad()
def evaluate(model: GlomoResNet, images: Tensor, labels: Tensor, batch_size: int = 512,
             propagations: Optional[Tensor] = None, device=None) -> float:
    """Accuracy of ``model`` (eval mode) on uint8 ``images``, whose batches go to ``device``
    (by default the model's), in bf16 autocast on a GPU."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.eval()
    correct = 0
    for start in range(0, len(images), batch_size):
        index = torch.arange(start, min(start + batch_size, len(images)))
        prop = _stage_propagations(propagations[index].to(device)) \
            if propagations is not None else None
        with torch.autocast("cuda", torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(images[index].to(device), propagated=prop)
        correct += int((logits.argmax(-1) == labels[index].to(device)).sum())
    return correct / len(images)
