"""ImageEncoder: a small CNN whose first stage keeps the input resolution, so that its
feature map lines up with the pixel graphs (one feature vector per pixel)."""
from __future__ import annotations

from typing import Sequence, Tuple

import torch
from torch import Tensor

from glomo_pyg.nn.config import ConfigurableModule
from glomo_pyg.pixels import IMAGENET_MEAN, IMAGENET_STD, check_images, check_statistics, normalize
from glomo_pyg.settings import check_int


def _conv_block(c_in: int, c_out: int, stride: int, groups: int) -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
        torch.nn.GroupNorm(min(groups, c_out), c_out), torch.nn.ReLU(inplace=True))


class ImageEncoder(ConfigurableModule):
    r"""A three-stage CNN over uint8 images (normalised per channel inside, as the pixel
    predictors do):

    .. math::
        F_1 = S_1(x) \in \mathbb{R}^{c_1 \times H \times W}, \quad
        F_2 = S_2(F_1) \in \mathbb{R}^{c_2 \times H/2 \times W/2}, \quad
        F_3 = S_3(F_2), \quad \mathbf{z} = \mathrm{mean}_{\text{pixels}}(F_3)

    Each stage is two :math:`3 \times 3` convolutions with GroupNorm and ReLU; stages 2
    and 3 halve the resolution with their first convolution. Stage 1 keeps it, so
    :meth:`feature_map` gives one :math:`c_1`-vector per pixel: the features :math:`H`
    of the pixel units, in the raster order of :func:`glomo_pyg.pixels.image_units`.
    GroupNorm, not BatchNorm: its output for an image does not depend on the rest of the
    batch, which contrastive pretraining (MoCo) needs and which keeps frozen features
    deterministic.

    Args:
        in_channels (int): channels of the images. (default: ``3``)
        channels (sequence of int): widths :math:`(c_1, c_2, c_3)`. (default: ``(32, 64, 128)``)
        groups (int): GroupNorm groups (at most the width). (default: ``8``)
        pixel_mean, pixel_std (sequence of float): per-channel statistics on a [0, 1]
            scale. (default: ImageNet's)

    Shapes:
        - **input:** uint8 images :math:`(B, C, H, W)`
        - **output:** :math:`(B, c_3)` (:meth:`forward`), :math:`(B, c_1, H, W)`
          (:meth:`feature_map`)
    """

    def __init__(self, in_channels: int = 3, channels: Sequence[int] = (32, 64, 128),
                 groups: int = 8, pixel_mean: Sequence[float] = IMAGENET_MEAN,
                 pixel_std: Sequence[float] = IMAGENET_STD):
        super().__init__()
        check_int("in_channels", in_channels)
        check_int("groups", groups)
        channels = tuple(channels) if isinstance(channels, (list, tuple)) else ()
        if len(channels) != 3:
            raise ValueError(f"channels must hold three widths (one per stage), got {channels}")
        for c in channels:
            check_int("channels", c)
        check_statistics(list(pixel_mean), list(pixel_std), in_channels)
        self.in_channels, self.channels, self.groups = in_channels, channels, groups
        self.pixel_mean, self.pixel_std = tuple(pixel_mean), tuple(pixel_std)
        c1, c2, c3 = channels
        self.stages = torch.nn.ModuleList([
            torch.nn.Sequential(_conv_block(in_channels, c1, 1, groups),
                                _conv_block(c1, c1, 1, groups)),
            torch.nn.Sequential(_conv_block(c1, c2, 2, groups), _conv_block(c2, c2, 1, groups)),
            torch.nn.Sequential(_conv_block(c2, c3, 2, groups), _conv_block(c3, c3, 1, groups)),
        ])
        self.reset_parameters()

    @property
    def out_channels(self) -> int:
        return self.channels[-1]

    def reset_parameters(self):
        for module in self.modules():
            if isinstance(module, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
            elif isinstance(module, torch.nn.GroupNorm):
                module.reset_parameters()

    def _normalised(self, images: Tensor) -> Tensor:
        check_images(images, self.in_channels)
        weight = self.stages[0][0][0].weight  # type: ignore[index]  # (Sequential's items)
        return normalize(images, self.pixel_mean, self.pixel_std).to(weight.dtype)

    def stage_maps(self, images: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """The three stages' feature maps."""
        f1 = self.stages[0](self._normalised(images))
        f2 = self.stages[1](f1)
        return f1, f2, self.stages[2](f2)

    def feature_map(self, images: Tensor) -> Tensor:
        """Stage 1's map, :math:`(B, c_1, H, W)`: one feature vector per pixel."""
        return self.stages[0](self._normalised(images))

    def forward(self, images: Tensor) -> Tensor:
        return self.stage_maps(images)[-1].mean((2, 3))

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, channels={list(self.channels)})"
