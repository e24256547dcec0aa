"""Training loop for :class:`~glomo_pyg.GlomoResNet` image classifiers (paper Sec. 3.5):
one recipe for every variant, the best validation epoch kept, an atomic checkpoint per
epoch (docs/images.md)."""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Optional, Tuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from glomo_pyg.data.images import augment
from glomo_pyg.nn.resnet import GlomoResNet
from glomo_pyg.pixels import image_units
from glomo_pyg.settings import check_settings, setting
from glomo_pyg.training.checkpoints import atomic_save


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
    flip: bool = setting(True, doc="random horizontal flips")
    label_smoothing: float = setting(0.0, low=0, high=1, high_open=True)
    eval_batch_size: int = setting(512, low=1)

    def validate(self) -> None:
        """Every setting by its rule; :class:`ValueError` naming it."""
        check_settings(self)


@torch.no_grad()
def precompute_propagations(model: GlomoResNet, images: Tensor, batch_size: int = 64,
                            dtype: torch.dtype = torch.float16,
                            device: Optional[torch.device] = None) -> Tensor:
    """The transfer stage's :meth:`~glomo_pyg.GlomoTransfer.propagations` of each image,
    ``[n, D, K, H W, C]`` in ``dtype`` on the CPU; the same output as computing them in
    every step when the predictor is frozen and there are no random crops."""
    if model.transfer is None or model.transfer.graph == "none":
        raise ValueError("precomputed propagations need a transfer stage with graphs")
    device = device or next(model.parameters()).device
    out = []
    for start in range(0, len(images), batch_size):
        chunk = images[start:start + batch_size].to(device)
        h = model.stage_input(chunk)
        x, batch = image_units(chunk)
        p = cast(Tensor, model.transfer.propagations(h, x, batch))  # [D, K, B HW, C]
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


def _check_inputs(model: GlomoResNet, train: Tuple[Tensor, Tensor], val: Tuple[Tensor, Tensor],
                  config: ImageTrainConfig, precomputed: bool) -> None:
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
    if config.crop_padding >= side or (precomputed and config.crop_padding):
        problem = (f"crop_padding {config.crop_padding} must be below the image side {side}, "
                   "and 0 with precomputed propagations (they cannot follow random crops; "
                   "flips are fine)")
    elif math.isclose(config.warmup_fraction * config.epochs * steps, 1.0):
        # torch's one-cycle schedule divides by (warm-up steps - 1): zero here
        problem = (f"{config.epochs} epochs x {steps} steps with warmup_fraction "
                   f"{config.warmup_fraction} give a warm-up of exactly one step, which the "
                   "one-cycle schedule cannot take; change epochs, batch_size or "
                   "warmup_fraction")
    else:
        return
    raise ValueError(problem)


_PROGRESS = ("epoch", "best_val", "best_epoch", "val_curve", "epoch_seconds", "best_state")


def _resume(checkpoint: str, recipe: Dict, model: GlomoResNet, optimizer, schedule,
            gen: torch.Generator, state: Dict, log: Callable) -> None:
    """Continue from an epoch checkpoint written with the same recipe for this model."""
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    if "recipe" not in saved:
        log(f"warning: {checkpoint} does not record its recipe (an older file); resumed "
            "unchecked")
    refusal = None
    if saved.get("recipe", recipe) != recipe:  # its optimiser schedule and data order differ
        refusal = (f"was written by a run with another recipe or training set "
                   f"({saved.get('recipe')}, now {recipe})")
    else:
        try:
            model.load_state_dict(saved["model"])
        except RuntimeError as err:
            refusal = f"does not fit this model: {err}"
    if refusal:
        raise ValueError(f"{checkpoint} {refusal}; delete it to start this run afresh")
    optimizer.load_state_dict(saved["optimizer"])
    schedule.load_state_dict(saved["schedule"])
    gen.set_state(saved["generator"])
    state.update({k: saved[k] for k in _PROGRESS})
    log(f"resumed at epoch {state['epoch']} from {checkpoint}")


def _train_epoch(model: GlomoResNet, train: Tuple[Tensor, Tensor], config: ImageTrainConfig,
                 optimizer, schedule, gen: torch.Generator, device: torch.device,
                 train_propagations: Optional[Tuple[Tensor, Tensor]]) -> float:
    """One epoch in a seeded order; the mean training loss."""
    images, labels = train
    model.train()
    order = torch.randperm(len(images), generator=gen)
    total = 0.0
    for index in order.split(config.batch_size):
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
        with torch.autocast("cuda", torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(x, propagated=prop)
            loss = F.cross_entropy(logits.float(), y, label_smoothing=config.label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        total += float(loss.detach()) * len(index)
    return total / len(images)


def train_image_classifier(model: GlomoResNet, train: Tuple[Tensor, Tensor],
                           val: Tuple[Tensor, Tensor], config: ImageTrainConfig, *,
                           seed: int = 0, device=None, checkpoint: Optional[str] = None,
                           train_propagations: Optional[Tuple[Tensor, Tensor]] = None,
                           val_propagations: Optional[Tensor] = None,
                           log: Callable = print) -> Dict:
    """Train ``model`` on ``train = (images, labels)`` with ``config``'s recipe, validate
    after every epoch, and return ``dict(best_val, best_epoch, val_curve, epoch_seconds,
    state)`` with ``state`` the best epoch's weights (loaded into ``model`` too).

    Args:
        train_propagations: :func:`precompute_propagations` of the training images and of
            ``images.flip(3)`` (needs ``crop_padding=0``).
        checkpoint: a file for an atomic per-epoch checkpoint; an existing one is resumed.
    """
    _check_inputs(model, train, val, config, train_propagations is not None)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.to(device)
    if device.type == "cuda":
        model.resnet.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                                momentum=config.momentum, nesterov=True,
                                weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(  # one-cycle: warm-up, then linear decay
        optimizer, max_lr=config.lr, pct_start=config.warmup_fraction, anneal_strategy="linear",
        total_steps=config.epochs * math.ceil(len(train[0]) / config.batch_size),
        div_factor=25.0, final_div_factor=1e3)
    gen = torch.Generator().manual_seed(seed)
    state: Dict[str, Any] = dict(epoch=0, best_val=-1.0, best_epoch=-1, val_curve=[],
                                 epoch_seconds=[], best_state=None)
    recipe = dict(asdict(config), train_images=len(train[0]))
    recipe.pop("eval_batch_size")  # (does not change training)
    if checkpoint and os.path.exists(checkpoint):
        _resume(checkpoint, recipe, model, optimizer, schedule, gen, state, log)
    for epoch in range(state["epoch"], config.epochs):
        start = time.time()
        loss = _train_epoch(model, train, config, optimizer, schedule, gen, device,
                            train_propagations)
        if device.type == "cuda":
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
            atomic_save(dict(recipe=recipe, model=model.state_dict(),
                             optimizer=optimizer.state_dict(), schedule=schedule.state_dict(),
                             generator=gen.get_state(), **{k: state[k] for k in _PROGRESS}),
                        checkpoint)
        log(f"epoch {epoch + 1}/{config.epochs}: train loss {loss:.4f}, validation "
            f"{acc:.4f}, {seconds:.1f} s")
    model.load_state_dict(state["best_state"])
    return dict(state=state["best_state"], **{k: state[k] for k in _PROGRESS[1:5]})
