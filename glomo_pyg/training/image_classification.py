"""Training loop for :class:`~glomo_pyg.GlomoResNet` image classifiers (paper Sec. 3.5).

One recipe for every variant (baseline, GLoMo, uniform graph): SGD with Nesterov momentum,
a one-cycle learning-rate schedule, weight decay, random crops (reflection padding) and
horizontal flips applied to the uint8 pixels before any graph is computed, bf16 autocast
and channels-last memory on a GPU. The epoch with the best validation accuracy is kept.
Each epoch ends with an atomic checkpoint, so an interrupted run (e.g. a GPU allocation
that ended) resumes at the next epoch with the same result.

When the transfer stage's input is fixed data (the normalised pixels), its graph
propagations can be precomputed once per image and orientation
(:func:`precompute_propagations`): the output is the same, and an epoch then costs about
what the baseline's does. Random crops change the pixels each epoch, so they are not
combined with precomputed propagations (flips are: both orientations are stored).
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from glomo_pyg.atomic_files import atomic_write
from glomo_pyg.data.images import augment
from glomo_pyg.nn.resnet import GlomoResNet
from glomo_pyg.pixels import image_units
from glomo_pyg.settings import check_settings, setting


@dataclass
class ImageTrainConfig:
    """The recipe of :func:`train_image_classifier` (SGD with Nesterov momentum, a
    one-cycle schedule, random crops and flips)."""

    epochs: int = setting(20, low=1)
    batch_size: int = setting(256, low=1)
    lr: float = setting(0.2, low=0, low_open=True, doc="peak of the one-cycle schedule")
    weight_decay: float = setting(5e-4, low=0)
    momentum: float = setting(0.9, low=0, high=1, high_open=True)
    warmup_fraction: float = setting(0.25, low=0, high=1, low_open=True, high_open=True,
                                     doc="share of the steps spent warming up")
    crop_padding: int = setting(4, low=0, doc="pixels padded before random crops (0: flips "
                                             "only)")
    flip: bool = setting(True, doc="random horizontal flips")
    label_smoothing: float = setting(0.0, low=0, high=1, high_open=True)
    eval_batch_size: int = setting(512, low=1)

    def validate(self) -> None:
        """Every setting by its declared rule; :class:`ValueError` naming it."""
        check_settings(self)


@torch.no_grad()
def precompute_propagations(model: GlomoResNet, images: Tensor, batch_size: int = 64,
                            dtype: torch.dtype = torch.float16,
                            device: Optional[torch.device] = None) -> Tensor:
    """The transfer stage's :meth:`~glomo_pyg.GlomoTransfer.propagations` of each image,
    ``[n, D, K, H W, C]`` in ``dtype`` on the CPU (graphs from the frozen predictor)."""
    if model.transfer is None or model.transfer.graph == "none":
        raise ValueError("precomputed propagations need a transfer stage with graphs")
    device = device or next(model.parameters()).device
    out = []
    for start in range(0, len(images), batch_size):
        chunk = images[start:start + batch_size].to(device)
        h = model.stage_input(chunk)
        x, batch = image_units(chunk)
        p = model.transfer.propagations(h, x, batch)  # [D, K, B HW, C]
        d, k, _, c = p.shape
        out.append(p.view(d, k, len(chunk), -1, c).permute(2, 0, 1, 3, 4).to("cpu", dtype))
    return torch.cat(out)


def _batch_propagations(cache: Tensor, index: Tensor, device) -> Tensor:
    p = cache[index].to(device, torch.float32)  # [B, D, K, HW, C]
    b, d, k, t, c = p.shape
    return p.permute(1, 2, 0, 3, 4).reshape(d, k, b * t, c)


@torch.no_grad()
def evaluate(model: GlomoResNet, images: Tensor, labels: Tensor, batch_size: int = 512,
             propagations: Optional[Tensor] = None, device=None) -> float:
    """Accuracy of ``model`` (eval mode) on uint8 ``images``."""
    device = device or next(model.parameters()).device
    model.eval()
    correct = 0
    for start in range(0, len(images), batch_size):
        index = torch.arange(start, min(start + batch_size, len(images)))
        x = images[index].to(device)
        prop = _batch_propagations(propagations, index, device) \
            if propagations is not None else None
        with torch.autocast("cuda", torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(x, propagated=prop)
        correct += int((logits.argmax(-1).cpu() == labels[index]).sum())
    return correct / len(images)


def _save_atomic(obj, path: str) -> None:
    with atomic_write(path, "wb") as fh:
        torch.save(obj, fh)


def train_image_classifier(model: GlomoResNet, train: Tuple[Tensor, Tensor],
                           val: Tuple[Tensor, Tensor], config: ImageTrainConfig, *,
                           seed: int = 0, device=None, checkpoint: Optional[str] = None,
                           train_propagations: Optional[Tuple[Tensor, Tensor]] = None,
                           val_propagations: Optional[Tensor] = None,
                           log: Callable = print) -> Dict:
    """Train ``model`` on ``train = (images, labels)`` with ``config``'s recipe, validate
    after every epoch, and return ``dict(best_val, best_epoch, val_curve, epoch_seconds,
    state)`` with ``state`` the best epoch's weights (loaded into ``model`` too).

    ``train_propagations``: precomputed propagations of the training images as they are
    and mirrored (:func:`precompute_propagations` of ``images`` and of
    ``images.flip(3)``), which needs ``crop_padding=0``. ``checkpoint``: a file for an
    atomic per-epoch checkpoint; an existing one is resumed."""
    config.validate()
    for name, (x, y) in (("train", train), ("val", val)):
        if x.dim() != 4 or x.dtype != torch.uint8 or y.dim() != 1 or len(y) != len(x):
            raise ValueError(f"{name} must be (uint8 images [n, C, H, W], labels [n]), got "
                             f"{x.dtype} {tuple(x.shape)} and {tuple(y.shape)}")
        if len(x) == 0:
            raise ValueError(f"the {name} split is empty")
    classes = model.resnet.fc.out_features if hasattr(model.resnet, "fc") else None
    for name, y in (("train", train[1]), ("val", val[1])):
        if int(y.min()) < 0 or (classes is not None and int(y.max()) >= classes):
            raise ValueError(f"{name} labels lie in [{int(y.min())}, {int(y.max())}], the "
                             f"model has {classes} classes")
    if config.crop_padding >= min(train[0].shape[2:]):
        raise ValueError(f"crop_padding {config.crop_padding} must be below the image side "
                         f"{min(train[0].shape[2:])}")
    if train_propagations is not None and config.crop_padding:
        raise ValueError("precomputed propagations cannot follow random crops: set "
                         "crop_padding=0 (flips are fine)")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    cuda = device.type == "cuda"
    model.to(device)
    if cuda:
        model.resnet.to(memory_format=torch.channels_last)
    images, labels = train
    n = len(images)
    steps_per_epoch = math.ceil(n / config.batch_size)
    if math.isclose(config.warmup_fraction * config.epochs * steps_per_epoch, 1.0):
        # torch's one-cycle schedule divides by (warm-up steps - 1): zero here
        raise ValueError(f"{config.epochs} epochs x {steps_per_epoch} steps with "
                         f"warmup_fraction {config.warmup_fraction} give a warm-up of exactly "
                         "one step, which the one-cycle schedule cannot take; change epochs, "
                         "batch_size or warmup_fraction")
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, nesterov=True,
                                weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=config.lr, total_steps=config.epochs * steps_per_epoch,
        pct_start=config.warmup_fraction, anneal_strategy="linear", div_factor=25.0,
        final_div_factor=1e3)
    gen = torch.Generator().manual_seed(seed)
    state = dict(epoch=0, best_val=-1.0, best_epoch=-1, val_curve=[], epoch_seconds=[],
                 best_state=None)
    recipe = dict(asdict(config), train_images=n)
    recipe.pop("eval_batch_size")  # (does not change training)
    if checkpoint and os.path.exists(checkpoint):
        saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
        if "recipe" not in saved:
            log(f"warning: {checkpoint} does not record its recipe (an older file); resumed "
                "unchecked")
        elif saved["recipe"] != recipe:  # its optimiser schedule and data order differ
            raise ValueError(f"{checkpoint} was written by a run with another recipe or "
                             f"training set ({saved.get('recipe')}, now {recipe}); delete it "
                             "to start this run afresh")
        try:
            model.load_state_dict(saved["model"])
        except RuntimeError as err:
            raise ValueError(f"{checkpoint} does not fit this model: {err}") from None
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        gen.set_state(saved["generator"])
        state.update({k: saved[k] for k in ("epoch", "best_val", "best_epoch", "val_curve",
                                            "epoch_seconds", "best_state")})
        log(f"resumed at epoch {state['epoch']} from {checkpoint}")
    for epoch in range(state["epoch"], config.epochs):
        model.train()
        start = time.time()
        order = torch.randperm(n, generator=gen)
        total, seen = 0.0, 0
        for step in range(steps_per_epoch):
            index = order[step * config.batch_size:(step + 1) * config.batch_size]
            x = images[index]
            prop = None
            if train_propagations is not None:
                flip = (torch.rand(len(index), generator=gen) < 0.5) if config.flip else \
                    torch.zeros(len(index), dtype=torch.bool)
                x = torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)
                plain = _batch_propagations(train_propagations[0], index, device)
                mirrored = _batch_propagations(train_propagations[1], index, device)
                units = flip.repeat_interleave(x.size(2) * x.size(3)).to(device)
                prop = torch.where(units.view(1, 1, -1, 1), mirrored, plain)
            else:
                x = augment(x, gen, flip=config.flip, crop_padding=config.crop_padding)
            x, y = x.to(device, non_blocking=True), labels[index].to(device, non_blocking=True)
            with torch.autocast("cuda", torch.bfloat16, enabled=cuda):
                logits = model(x, propagated=prop)
                loss = F.cross_entropy(logits.float(), y, label_smoothing=config.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total += float(loss.detach()) * len(index)
            seen += len(index)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.time() - start
        acc = evaluate(model, val[0], val[1], config.eval_batch_size, val_propagations, device)
        state["val_curve"].append(acc)
        state["epoch_seconds"].append(seconds)
        if acc > state["best_val"]:
            state["best_val"], state["best_epoch"] = acc, epoch
            state["best_state"] = {k: v.detach().cpu().clone() for k, v in
                                   model.state_dict().items()}
        state["epoch"] = epoch + 1
        if checkpoint:
            _save_atomic(dict(recipe=recipe, model=model.state_dict(),
                              optimizer=optimizer.state_dict(),
                              schedule=schedule.state_dict(), generator=gen.get_state(),
                              **{k: state[k] for k in ("epoch", "best_val", "best_epoch",
                                                       "val_curve", "epoch_seconds",
                                                       "best_state")}), checkpoint)
        log(f"epoch {epoch + 1}/{config.epochs}: train loss {total / seen:.4f}, validation "
            f"{acc:.4f}, {seconds:.1f} s")
    model.load_state_dict(state["best_state"])
    return dict(best_val=state["best_val"], best_epoch=state["best_epoch"],
                val_curve=state["val_curve"], epoch_seconds=state["epoch_seconds"],
                state=state["best_state"])
