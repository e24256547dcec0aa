"""What several slices share: the configs they read, CIFAR images, predictors."""
from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

import torch
import yaml

from benchmarks.gpu.runner import ROOT


def config(name: str) -> Dict:
    """A YAML config of ``configs/`` as a mapping (part of the recipes that use it)."""
    with open(os.path.join(ROOT, "configs", name), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def release_sha256(name: str) -> Optional[str]:
    """SHA-256 of the release ``name``'s weights in the releases folder (None: absent),
    which the recipes that use it record."""
    from benchmarks.gpu.files import sha256
    from glomo_pyg.io.releases import releases_root

    path = os.path.join(str(releases_root()), name, "model.safetensors")
    return sha256(path) if os.path.isfile(path) else None


def release_folder(predictor: Dict) -> str:
    """The folder of the release a recipe's ``predictor`` names, refused unless its
    weights have the recipe's ``sha256``."""
    from benchmarks.gpu.files import sha256
    from glomo_pyg.io.releases import release_path

    folder = str(release_path(predictor["release"]))
    if sha256(os.path.join(folder, "model.safetensors")) != predictor["sha256"]:
        raise ValueError(f"{folder} is not the release the recipe names")
    return folder


def cifar(data_dir: str, split: str = "train", side: int = 32) -> Tuple[torch.Tensor, torch.Tensor]:
    """CIFAR-10 images and labels; ``side`` < 32 keeps the top-left ``side`` x ``side``
    pixels (the dry run's toy sizes)."""
    from glomo_pyg.data.images import load_cifar10

    images, labels = load_cifar10(os.path.join(data_dir, "cifar-10-batches-py"), split)
    return images[..., :side, :side].contiguous(), labels


def pixel_units(images: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """uint8 ``[B, C, H, W]`` images as pixel units ``[B H W, C]`` and their batch vector."""
    b, c, h, w = images.shape
    x = images.permute(0, 2, 3, 1).reshape(-1, c)
    return x, torch.arange(b, device=images.device).repeat_interleave(h * w)


def untrained_pixel_predictor(model: Dict, side: int = 32, seed: int = 0):
    """An untrained pixel predictor of the config's model settings, for timing (its
    graphs' sparsity is that of initialisation, not of a trained predictor)."""
    from glomo_pyg import Glomo

    kwargs = {k: v for k, v in model.items() if k != "layout"}
    torch.manual_seed(seed)
    return Glomo.image(in_channels=3, height=side, width=side, **kwargs).to_pretrained()
