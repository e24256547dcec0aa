"""Momentum contrast (MoCo; He et al., CVPR 2020): unsupervised pretraining of an
:class:`~glomo_pyg.nn.image_encoder.ImageEncoder`, the feature-transfer counterpart of the
pixel graphs (both learn from the same unlabelled images).

A query encoder :math:`f_q` and a key encoder :math:`f_k` see two augmented views of each
image; :math:`f_k`'s parameters are an exponential moving average of :math:`f_q`'s,
:math:`\\theta_k \\leftarrow m \\theta_k + (1 - m) \\theta_q`; the loss is InfoNCE against
the positive key and a queue of the last :math:`K` keys (the negatives)."""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import os
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from glomo_pyg.atomic_files import atomic_write, write_json
from glomo_pyg.logs import job_output, warn_log_argument
from glomo_pyg.nn.image_encoder import ImageEncoder
from glomo_pyg.pixels import check_images
from glomo_pyg.settings import check_int
from glomo_pyg.training.checkpoints import atomic_save

logger = logging.getLogger(__name__)

CHECKPOINT = "moco.ckpt"
ENCODER_WEIGHTS = "encoder.safetensors"
ENCODER_CONFIG = "encoder.json"
#: MocoConfig fields that do not change what is trained
RUN_ONLY_SETTINGS = ("threads", "checkpoint_every", "log_every", "max_seconds")


def info_nce(query: Tensor, key: Tensor, queue: Tensor, temperature: float) -> Tensor:
    r"""InfoNCE with one positive and the queue's negatives (MoCo Eq. 1):

    .. math::
        \mathcal{L} = -\frac{1}{B} \sum_b \log \frac{\exp(q_b \cdot k_b / \tau)}
        {\exp(q_b \cdot k_b / \tau) + \sum_{j=1}^{K} \exp(q_b \cdot n_j / \tau)}

    Shapes: query, key ``[B, d]`` (unit-normalised); queue ``[K, d]``; returns a scalar.
    """
    positive = (query * key).sum(-1, keepdim=True)
    logits = torch.cat([positive, query @ queue.t()], 1) / temperature
    return F.cross_entropy(logits, logits.new_zeros(logits.size(0), dtype=torch.long))


def random_views(images: Tensor, generator: Optional[torch.Generator] = None,
                 scale: Tuple[float, float] = (0.2, 1.0), jitter: float = 0.4,
                 jitter_probability: float = 0.8, gray_probability: float = 0.2) -> Tensor:
    """Augmentations after MoCo v2's, for small images and batched: a random resized crop
    (area fraction in ``scale``, aspect ratio in [3/4, 4/3], each side at most the
    image's; bilinear, back to the input size, reflected at the borders), a horizontal
    flip for half of the images, a colour jitter (with ``jitter_probability``) of
    brightness, then contrast, then saturation by factors in ``[1 - jitter, 1 + jitter]``
    (no hue; clamped to [0, 1] once, at the end) and grey scale (with
    ``gray_probability``). uint8 ``[B, C, H, W]`` in and out (the models normalise
    inside); the random numbers come from ``generator`` (CPU)."""
    check_images(images)
    b, c, h, w = images.shape

    def uniform(low: float, high: float) -> Tensor:
        return torch.empty(b).uniform_(low, high, generator=generator)

    area, ratio = uniform(*scale), uniform(math.log(3 / 4), math.log(4 / 3)).exp()
    width, height = (area * ratio).sqrt().clamp(max=1), (area / ratio).sqrt().clamp(max=1)
    cx, cy = (uniform(-1, 1) * (1 - width), uniform(-1, 1) * (1 - height))
    sign = torch.where(uniform(0, 1) < 0.5, -1.0, 1.0)
    theta = torch.zeros(b, 2, 3)
    theta[:, 0, 0], theta[:, 0, 2] = width * sign, cx
    theta[:, 1, 1], theta[:, 1, 2] = height, cy
    theta = theta.to(images.device)
    grid = F.affine_grid(theta, (b, c, h, w), align_corners=False)  # type: ignore[arg-type]
    x = F.grid_sample(images.float() / 255, grid, mode="bilinear", padding_mode="reflection",
                      align_corners=False)
    factors = [uniform(1 - jitter, 1 + jitter).to(x.device).view(b, 1, 1, 1) for _ in range(3)]
    jittered = x * factors[0]
    mean = _gray(jittered).mean((2, 3), keepdim=True)
    jittered = (jittered - mean) * factors[1] + mean
    gray = _gray(jittered)
    jittered = ((jittered - gray) * factors[2] + gray).clamp(0, 1)
    x = torch.where((uniform(0, 1) < jitter_probability).to(x.device).view(b, 1, 1, 1),
                    jittered, x)
    x = torch.where((uniform(0, 1) < gray_probability).to(x.device).view(b, 1, 1, 1),
                    _gray(x).expand_as(x), x)
    return (x * 255).round().to(torch.uint8)


def _gray(x: Tensor) -> Tensor:
    """ITU-R 601 luma of RGB ``[B, 3, H, W]`` (the mean of other channel counts)."""
    if x.size(1) != 3:
        return x.mean(1, keepdim=True)
    return (0.299 * x[:, :1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:])


class MoCo(torch.nn.Module):
    r"""The query encoder (an :class:`ImageEncoder` and a two-layer projection head), its
    momentum copy and the queue of negative keys.

    Args:
        encoder (ImageEncoder): the encoder to pretrain (the query side; copied for keys).
        dim (int): width of the projected, unit-normalised embeddings. (default: ``128``)
        queue_size (int): :math:`K`, negatives kept. (default: ``4096``)
        momentum (float): :math:`m` of the key encoder's moving average. (default: ``0.99``)
        temperature (float): :math:`\tau`. (default: ``0.07``)

    Shapes:
        - **input:** two views, uint8 :math:`(B, C, H, W)` each
        - **output:** the InfoNCE loss (a scalar)
    """

    queue: Tensor
    queue_ptr: Tensor

    def __init__(self, encoder: ImageEncoder, dim: int = 128, queue_size: int = 4096,
                 momentum: float = 0.99, temperature: float = 0.07):
        super().__init__()
        if not isinstance(encoder, ImageEncoder):
            raise TypeError(f"encoder must be an ImageEncoder, got {type(encoder).__name__}")
        check_int("dim", dim)
        check_int("queue_size", queue_size)
        if not 0 <= momentum < 1 or not temperature > 0:
            raise ValueError(f"momentum must lie in [0, 1) and temperature be > 0, got "
                             f"momentum={momentum!r}, temperature={temperature!r}")
        self.dim, self.queue_size = dim, queue_size
        self.momentum, self.temperature = float(momentum), float(temperature)
        width = encoder.out_channels
        self.query = torch.nn.Sequential(encoder, torch.nn.Linear(width, width),
                                         torch.nn.ReLU(inplace=True), torch.nn.Linear(width, dim))
        self.key = copy.deepcopy(self.query).requires_grad_(False)
        self.register_buffer("queue", torch.empty(queue_size, dim))
        self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long))
        self.reset_queue()

    @property
    def encoder(self) -> ImageEncoder:
        return cast(ImageEncoder, self.query[0])

    def reset_queue(self, generator: Optional[torch.Generator] = None) -> None:
        """Random unit vectors (MoCo's initial negatives)."""
        noise = torch.randn(self.queue_size, self.dim, generator=generator)
        self.queue.copy_(F.normalize(noise, dim=1))
        self.queue_ptr.zero_()

    @torch.no_grad()
    def momentum_update(self) -> None:
        r""":math:`\theta_k \leftarrow m \theta_k + (1 - m) \theta_q` for every parameter."""
        for k, q in zip(self.key.parameters(), self.query.parameters()):
            k.mul_(self.momentum).add_(q.detach(), alpha=1 - self.momentum)

    @torch.no_grad()
    def enqueue(self, keys: Tensor) -> None:
        """Put ``keys`` ``[B, d]`` in the queue in place of the oldest (a ring buffer: the
        queue read from ``queue_ptr`` on holds the last :math:`K` keys, oldest first)."""
        keys = keys[-self.queue_size:]
        rows = (self.queue_ptr + torch.arange(keys.size(0), device=keys.device)) % self.queue_size
        self.queue[rows] = keys.to(self.queue.dtype)
        self.queue_ptr.copy_((self.queue_ptr + keys.size(0)) % self.queue_size)

    def ordered_queue(self) -> Tensor:
        """The queued keys oldest first."""
        p = int(self.queue_ptr)
        return torch.cat([self.queue[p:], self.queue[:p]])

    def forward(self, view_query: Tensor, view_key: Tensor) -> Tensor:
        q = F.normalize(self.query(view_query), dim=1)
        with torch.no_grad():
            self.momentum_update()  # (MoCo's order: the key encoder moves, then encodes)
            k = F.normalize(self.key(view_key), dim=1)
        loss = info_nce(q, k, self.queue.clone(), self.temperature)
        self.enqueue(k)
        return loss


@dataclasses.dataclass
class MocoConfig:
    """A MoCo pretraining run (``configs/moco-imagenet32-cpu.yaml``)."""

    channels: Sequence[int] = (32, 64, 128)
    dim: int = 128
    queue_size: int = 4096
    momentum: float = 0.99
    temperature: float = 0.07
    batch_size: int = 256
    lr: float = 0.06  # SGD with momentum 0.9, cosine decay over max_steps
    weight_decay: float = 5e-4
    max_steps: int = 1000
    max_seconds: Optional[float] = None  # stop early (the schedule still spans max_steps)
    crop_scale: Sequence[float] = (0.2, 1.0)
    seed: int = 0
    threads: Optional[int] = None
    checkpoint_every: int = 100
    log_every: int = 20

    def __post_init__(self):
        for name in ("dim", "queue_size", "batch_size", "max_steps", "checkpoint_every",
                     "log_every"):
            check_int(name, getattr(self, name))
        check_int("seed", self.seed, 0)
        check_int("threads", self.threads, optional=True)
        scale = tuple(self.crop_scale)
        if len(scale) != 2 or not 0 < scale[0] <= scale[1] <= 1:
            raise ValueError(f"crop_scale must be (low, high) with 0 < low <= high <= 1, got "
                             f"{self.crop_scale!r}")
        if not self.lr > 0 or not self.weight_decay >= 0 or (
                self.max_seconds is not None and not self.max_seconds > 0):
            raise ValueError(f"lr and max_seconds must be > 0 and weight_decay >= 0, got "
                             f"lr={self.lr!r}, weight_decay={self.weight_decay!r}, "
                             f"max_seconds={self.max_seconds!r}")
        self.channels, self.crop_scale = tuple(self.channels), scale

    @classmethod
    def from_dict(cls, data: Dict) -> "MocoConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known) if isinstance(data, dict) else ["(not a mapping)"]
        if unknown:
            raise ValueError(f"unknown MoCo settings {unknown}; known: {sorted(known)}")
        return cls(**data)

    def to_dict(self) -> Dict:
        return {k: list(v) if isinstance(v, tuple) else v
                for k, v in dataclasses.asdict(self).items()}

    def result_settings(self) -> Dict:
        """The settings the trained encoder depends on (not threads, logging, checkpoint
        spacing or the time guard): a run resumes only under the same ones."""
        return {k: v for k, v in self.to_dict().items() if k not in RUN_ONLY_SETTINGS}


def build_moco(config: MocoConfig) -> MoCo:
    torch.manual_seed(config.seed)
    model = MoCo(ImageEncoder(channels=config.channels), config.dim, config.queue_size,
                 config.momentum, config.temperature)
    model.reset_queue(torch.Generator().manual_seed(config.seed))
    return model


def _learning_rate(config: MocoConfig, step: int) -> float:
    return config.lr * 0.5 * (1 + math.cos(math.pi * step / config.max_steps))


def _batch_indices(n: int, batch_size: int, seed: int, step: int) -> Tensor:
    """The images of ``step``: epoch ``e`` is a permutation seeded by ``(seed, e)`` cut into
    whole batches, so a resumed run sees the same batches."""
    per_epoch = n // batch_size
    epoch, k = divmod(step, per_epoch)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100003 + epoch))
    return order[k * batch_size:(k + 1) * batch_size]


def _resume(path: str, config: MocoConfig, model: MoCo, optimizer: torch.optim.Optimizer,
            augment_generator: torch.Generator) -> Tuple[int, float, List[float]]:
    """``(step, seconds, losses)`` of the checkpoint ``path``, whose states are loaded."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    saved = {k: v for k, v in state.get("config", {}).items() if k not in RUN_ONLY_SETTINGS}
    if saved != config.result_settings():
        raise ValueError(f"{path} was written by a run with other settings; use another "
                         "folder or delete it")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    augment_generator.set_state(state["generator"])
    step, seconds, losses = state["step"], state["seconds"], state["losses"]
    logger.info(f"moco: resumed at step {step} ({seconds:.0f} s)")
    return step, seconds, losses


def _train_step(model: MoCo, optimizer: torch.optim.Optimizer, images: Tensor,
                config: MocoConfig, step: int, augment_generator: torch.Generator) -> Tensor:
    """The loss of ``step``'s batch, after one optimiser step on it."""
    batch = images[_batch_indices(images.size(0), config.batch_size, config.seed, step)]
    views = [random_views(batch, augment_generator,
                          cast(Tuple[float, float], config.crop_scale))  # (checked: a pair)
             for _ in range(2)]
    for group in optimizer.param_groups:
        group["lr"] = _learning_rate(config, step)
    loss = model(*views)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss


def pretrain_moco(images: Tensor, config: MocoConfig, folder: str,
                  log: Optional[Callable[[str], None]] = None) -> Dict:
    """MoCo on uint8 ``[N, C, H, W]`` ``images``; resumes from ``folder/moco.ckpt``
    (written atomically every ``checkpoint_every`` steps and at the end, loaded with
    ``weights_only=True``). Writes the encoder to ``folder/encoder.safetensors`` and
    ``encoder.json`` (its config and the run's summary); returns the summary.

    Its progress lines are INFO records of this module's logger, printed on standard
    output where the application set up no logging (:func:`glomo_pyg.logs.job_output`);
    ``log`` is deprecated: a callable that receives them instead."""
    if log is not None:
        warn_log_argument("pretrain_moco")
    with job_output(log):
        return _pretrain_moco(images, config, folder)


def _pretrain_moco(images: Tensor, config: MocoConfig, folder: str) -> Dict:
    check_images(images)
    if images.size(0) < config.batch_size:
        raise ValueError(f"MoCo needs at least batch_size={config.batch_size} images, got "
                         f"{images.size(0)}")
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    os.makedirs(folder, exist_ok=True)
    model = build_moco(config)
    optimizer = torch.optim.SGD(model.query.parameters(), lr=config.lr, momentum=0.9,
                                weight_decay=config.weight_decay)
    augment_generator = torch.Generator().manual_seed(config.seed + 1)
    step, seconds = 0, 0.0
    losses: List[float] = []
    path = os.path.join(folder, CHECKPOINT)
    if os.path.exists(path):
        step, seconds, losses = _resume(path, config, model, optimizer, augment_generator)

    def save() -> None:
        atomic_save(dict(config=config.to_dict(), model=model.state_dict(),
                         optimizer=optimizer.state_dict(), generator=augment_generator.get_state(),
                         step=step, seconds=seconds, losses=losses), path)

    model.train()
    start = time.perf_counter() - seconds
    while step < config.max_steps and (config.max_seconds is None or seconds < config.max_seconds):
        loss = _train_step(model, optimizer, images, config, step, augment_generator)
        step, seconds = step + 1, time.perf_counter() - start
        losses.append(loss.item())
        if step % config.log_every == 0:
            recent = losses[-config.log_every:]
            logger.info(f"moco: step {step}/{config.max_steps} loss "
                        f"{sum(recent) / len(recent):.3f} ({seconds:.0f} s, "
                        f"{seconds / step:.2f} s/step)")
        if step % config.checkpoint_every == 0:
            save()
    save()
    summary = dict(steps=step, seconds=round(seconds, 1), images=int(images.size(0)),
                   final_loss=sum(losses[-50:]) / max(1, len(losses[-50:])),
                   config=config.to_dict())
    save_encoder(model.encoder, folder, summary)
    return summary


def save_encoder(encoder: ImageEncoder, folder: str, summary: Optional[Dict] = None) -> None:
    """The encoder's weights (safetensors) and config (JSON) in ``folder``."""
    from safetensors.torch import save

    state = {k: v.contiguous() for k, v in encoder.state_dict().items()}
    with atomic_write(os.path.join(folder, ENCODER_WEIGHTS), "wb", encoding=None) as fh:
        fh.write(save(state))
    write_json(os.path.join(folder, ENCODER_CONFIG),
               dict(encoder=encoder.config(), summary=summary or {}))


def load_encoder(folder: str) -> Tuple[ImageEncoder, Dict]:
    """The encoder :func:`save_encoder` wrote (eval mode) and its run's summary."""
    from safetensors.torch import load_file

    with open(os.path.join(folder, ENCODER_CONFIG), encoding="utf-8") as fh:
        saved = json.load(fh)
    if not isinstance(saved, dict) or not isinstance(saved.get("encoder"), dict):
        raise ValueError(f"{folder}/{ENCODER_CONFIG} is not an encoder config")
    encoder = ImageEncoder.from_config(saved["encoder"])
    encoder.load_state_dict(load_file(os.path.join(folder, ENCODER_WEIGHTS)))
    return encoder.eval(), saved.get("summary", {})
