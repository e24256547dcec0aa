"""CIFAR ResNets (He et al., 2016) with an optional GLoMo input stage (paper Sec. 3.5)."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from glomo_pyg.nn.resets import reset_children
from glomo_pyg.nn.transfer import GlomoTransfer
from glomo_pyg.pixels import check_images, check_statistics, image_units, normalize

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)  # of the CIFAR-10 training images, [0, 1] scale
DEPTHS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}


class BasicBlock(torch.nn.Module):
    """Two 3x3 convolutions with BatchNorm and an identity (or 1x1) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(out_channels)
        self.conv2 = torch.nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(out_channels)
        self.shortcut = torch.nn.Sequential(
            torch.nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
            torch.nn.BatchNorm2d(out_channels)) \
            if stride != 1 or in_channels != out_channels else None

    def reset_parameters(self) -> None:
        reset_children(self)

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + (x if self.shortcut is None else self.shortcut(x)))


class CifarResNet(torch.nn.Module):
    r"""ResNet-18/34 for 32x32 images: a 3x3 stem without max-pooling, four stages of
    :class:`BasicBlock` s (1, 2, 4, 8 x ``width`` channels), average pooling, a linear map.

    Args:
        depth (int): 18 or 34. width (int): channels of the first stage (64: standard).
        in_channels (int): input channels. num_classes (int): outputs.

    Shapes:
        - **input:** :math:`(B, C_{in}, H, W)` float
        - **output:** :math:`(B, \text{num\_classes})` logits
    """

    def __init__(self, depth: int = 18, width: int = 64, in_channels: int = 3,
                 num_classes: int = 10):
        super().__init__()
        if depth not in DEPTHS or min(width, in_channels, num_classes) < 1:
            raise ValueError(f"depth must be one of {sorted(DEPTHS)} and width, in_channels and "
                             f"num_classes positive, got {depth!r}, {width}, {in_channels}, "
                             f"{num_classes}")
        self.depth, self.width, self.in_channels = depth, width, in_channels
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(in_channels, width, 3, 1, 1, bias=False),
            torch.nn.BatchNorm2d(width), torch.nn.ReLU(inplace=True))
        blocks, channels = [], width
        for stage, n in enumerate(DEPTHS[depth]):
            out = width * 2 ** stage
            for i in range(n):
                blocks.append(BasicBlock(channels, out, 2 if stage and i == 0 else 1))
                channels = out
        self.blocks = torch.nn.Sequential(*blocks)
        self.fc = torch.nn.Linear(channels, num_classes)

    def reset_parameters(self) -> None:
        reset_children(self)

    def forward(self, x: Tensor) -> Tensor:
        out = self.blocks(self.stem(x))  # torch names a wrong channel count or rank
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(depth={self.depth}, width={self.width}, "
                f"in_channels={self.in_channels}, num_classes={self.fc.out_features})")


class GlomoResNet(torch.nn.Module):
    r"""A CIFAR ResNet whose input is the GLoMo-augmented pixels of paper Sec. 3.5:

    .. math::
        H' = [H ;\; \mathrm{gate}(H, M_{fw} H, M_{bw} H)]

    with :math:`H` the normalised pixels mixed by :class:`GlomoTransfer` along a frozen
    pixel-graph predictor's graphs; without a ``transfer`` the ResNet reads :math:`H`.

    Args:
        transfer (GlomoTransfer, optional): the input stage, reading the pixel channels.
        depth, width, num_classes: of the :class:`CifarResNet`. pixel_mean, pixel_std:
            per-channel statistics for :math:`H`.

    Shapes:
        - **input:** uint8 images :math:`(B, 3, H, W)`; optionally ``propagated``, the
          transfer stage's precomputed :meth:`GlomoTransfer.propagations` for these
          images (``[D, K, B H W, 3]``)
        - **output:** :math:`(B, \text{num\_classes})` logits
    """

    def __init__(self, transfer: Optional[GlomoTransfer] = None, depth: int = 18,
                 width: int = 64, num_classes: int = 10,
                 pixel_mean: Sequence[float] = CIFAR10_MEAN,
                 pixel_std: Sequence[float] = CIFAR10_STD):
        super().__init__()
        check_statistics(pixel_mean, pixel_std, len(pixel_mean))
        if transfer is not None and transfer.in_channels != len(pixel_mean):
            raise ValueError(f"the transfer stage must read the {len(pixel_mean)} pixel "
                             f"channels, it reads {transfer.in_channels}")
        self.transfer = transfer
        self.pixel_mean, self.pixel_std = tuple(pixel_mean), tuple(pixel_std)
        channels = transfer.out_channels if transfer is not None else len(pixel_mean)
        self.resnet = CifarResNet(depth, width, channels, num_classes)

    def reset_parameters(self) -> None:
        """Re-initialise the ResNet (its BatchNorm statistics too) and the input stage's
        own weights; the stage's frozen pixel-graph predictor is kept
        (:meth:`GlomoTransfer.reset_parameters`)."""
        reset_children(self)

    @property
    def image_size(self) -> Optional[tuple]:
        """``(H, W)`` the input stage's pixel predictor was built for (``None``: any)."""
        if self.transfer is None:
            return None
        return self.transfer.predictor.image_size

    def stage_input(self, images: Tensor) -> Tensor:
        """:math:`H` as ``[B H W, C]`` float units (raster order)."""
        h = normalize(images, self.pixel_mean, self.pixel_std)  # [B, C, H, W]
        return h.permute(0, 2, 3, 1).reshape(-1, h.size(1))

    def stage(self, images: Tensor, propagated: Optional[Tensor] = None) -> Tensor:
        """The input stage's output :math:`H'` as a ``[B, C', H, W]`` float map: what the
        ResNet reads (training recipes may transform it before :attr:`resnet`)."""
        check_images(images, channels=len(self.pixel_mean), size=self.image_size)
        b, _, height, width = images.shape
        if self.transfer is None:
            return normalize(images, self.pixel_mean, self.pixel_std)
        h = self.stage_input(images)
        if propagated is None and self.transfer.graph == "learned":
            x, batch = image_units(images)
            out = self.transfer(h, x, batch)
        else:
            batch = torch.arange(b, device=images.device).repeat_interleave(height * width)
            out = self.transfer(h, batch=batch, propagated=propagated)
        return out.view(b, height, width, -1).permute(0, 3, 1, 2)

    def classify(self, stage: Tensor) -> Tensor:
        """The ResNet's logits for a :meth:`stage` output."""
        # channels-last is the fast layout on a GPU; on CPU torch's backward for it can be
        # orders of magnitude slower (measured), so plain contiguous there
        fmt = torch.channels_last if stage.is_cuda else torch.contiguous_format
        return self.resnet(stage.contiguous(memory_format=fmt))

    def forward(self, images: Tensor, propagated: Optional[Tensor] = None) -> Tensor:
        return self.classify(self.stage(images, propagated))

    def __repr__(self) -> str:
        t = self.transfer
        stage = "none" if t is None else (
            f"GlomoTransfer(graph='{t.graph}'"
            + (f", max_distance={t.max_distance}" if t.max_distance is not None else "") + ")")
        return f"{self.__class__.__name__}({self.resnet!r}, input_stage={stage})"
