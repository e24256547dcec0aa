"""Images as units (paper Sec. 3.5): the pixels of uint8 ``[B, C, H, W]`` images in
raster order, ``x`` ``[N, C]`` raw values and ``batch`` the image of each unit."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

# Per-channel mean and standard deviation of ImageNet RGB pixels on a [0, 1] scale.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _check_uint8(t, name: str) -> None:
    if not isinstance(t, Tensor) or t.dtype != torch.uint8:
        raise TypeError(f"{name} must be a torch.Tensor of uint8 pixel values (0-255), got "
                        f"{getattr(t, 'dtype', type(t).__name__)}; normalisation happens "
                        f"inside the model (see image_units)")


def check_images(images: Tensor, channels: Optional[int] = None,
                 size: Optional[Tuple[int, int]] = None, name: str = "images") -> None:
    """``images`` must be a uint8 ``[B, C, H, W]`` tensor (of ``channels`` channels and
    ``size = (H, W)`` when given), with ``B >= 1`` and at least two pixels."""
    _check_uint8(images, name)
    shape = tuple(images.shape)
    if len(shape) != 4 or shape[0] < 1 or shape[2] * shape[3] < 2 or \
            channels not in (None, shape[1]) or size not in (None, tuple(shape[2:])):
        raise ValueError(f"{name} must be [B, C, H, W] (at least one image of at least two "
                         f"pixels" + (f", {channels} channels" if channels is not None else "")
                         + (f", must be {size[0]}x{size[1]}" if size is not None else "")
                         + f"), got {shape}")


def check_pixels(x: Tensor, channels: int, name: str = "x") -> None:
    """Pixel units: a uint8 ``[N, channels]`` tensor."""
    _check_uint8(x, name)
    if x.dim() != 2 or x.size(1) != channels:
        raise ValueError(f"{name} must have shape [N, {channels}] (pixels x channels), got "
                         f"{tuple(x.shape)}")


def image_units(images: Tensor) -> Tuple[Tensor, Tensor]:
    """``(x, batch)``: the ``[B H W, C]`` pixels of uint8 ``[B, C, H, W]`` images in raster
    order, and the image of each."""
    check_images(images)
    b, c, h, w = images.shape
    x = images.permute(0, 2, 3, 1).reshape(b * h * w, c)
    batch = torch.arange(b, device=images.device).repeat_interleave(h * w)
    return x, batch


def unit_images(x: Tensor, height: int, width: int) -> Tensor:
    """Inverse of :func:`image_units`: ``[N, C]`` units back to ``[B, C, H, W]``."""
    if x.dim() != 2 or x.size(0) % (height * width):
        raise ValueError(f"{tuple(x.shape)} units are not whole {height}x{width} images")
    return x.view(-1, height, width, x.size(1)).permute(0, 3, 1, 2)


def normalize(x: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """Float pixels ``(x / 255 - mean) / std`` per channel (the last dim, or dim 1 of
    ``[B, C, H, W]`` images)."""
    m = torch.tensor(mean, dtype=torch.float32, device=x.device)
    s = torch.tensor(std, dtype=torch.float32, device=x.device)
    if x.dim() == 4:
        m, s = m.view(1, -1, 1, 1), s.view(1, -1, 1, 1)
    return (x.float() / 255.0 - m) / s


def check_statistics(mean: Sequence[float], std: Sequence[float],
                     channels: Optional[int]) -> None:
    """Per-channel statistics: ``channels`` finite means and positive finite stds."""
    ok = len(mean) == len(std) == channels and all(
        isinstance(v, (int, float)) and float("-inf") < v < float("inf") for v in mean) and \
        all(isinstance(v, (int, float)) and 0 < v < float("inf") for v in std)
    if not ok:
        raise ValueError(f"pixel_mean and pixel_std need {channels} finite values each (std > "
                         f"0), got {list(mean)!r} and {list(std)!r}")
