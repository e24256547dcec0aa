"""Pixel-graph mode (paper Sec. 3.5): a graph predictor over the positions of images in
raster order, and the pixel context-prediction head of its pretraining objective."""
from __future__ import annotations

from operator import attrgetter
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from glomo_pyg.nn.decoder import IGNORE
from glomo_pyg.nn.emitter import ScoredEmitter
from glomo_pyg.nn.encoder import UnitEncoder
from glomo_pyg.nn.scorer import GraphScorer, resolve_head_channels
from glomo_pyg.ordering import RasterOrder, check_direction
from glomo_pyg.pixels import IMAGENET_MEAN, IMAGENET_STD
from glomo_pyg.sequences import SequenceBatch
from glomo_pyg.settings import check_int

MASK_TYPES = ("A", "B")


class MaskedConv2d(torch.nn.Conv2d):
    r"""A PixelCNN masked convolution (van den Oord et al., 2016): output position
    :math:`(r, c)` reads only inputs earlier in raster order, plus :math:`(r, c)` itself
    for mask ``'B'``. Odd square kernel, 'same' padding.

    Shapes:
        - **input:** :math:`(B, C_{in}, H, W)`
        - **output:** :math:`(B, C_{out}, H, W)`
    """

    mask: Tensor

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3,
                 mask_type: str = "B"):
        if mask_type not in MASK_TYPES or kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"mask_type must be one of {MASK_TYPES} and kernel_size odd and "
                             f"positive, got {mask_type!r} and {kernel_size}")
        super().__init__(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.mask_type = mask_type
        # the positions before the centre in raster order (and the centre itself for 'B')
        area = kernel_size * kernel_size
        mask = (torch.arange(area) < area // 2 + (mask_type == "B")).float()
        self.register_buffer("mask", mask.view(1, 1, kernel_size, kernel_size),
                             persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return self._conv_forward(x, self.weight * self.mask, self.bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", mask_type='{self.mask_type}'"


class PixelCNN(torch.nn.Module):
    r"""The key or query network of :class:`PixelGraphPredictor`: a masked convolution
    ``'A'`` then ``num_layers - 1`` residual ``'B'`` blocks ``x + ReLU(LayerNorm(conv(x)))``:
    position :math:`p` depends only on pixels strictly before :math:`p` in raster order.

    Shapes:
        - **input:** :math:`(B, C, H, W)`
        - **output:** :math:`(B, C, H, W)`
    """

    def __init__(self, channels: int, num_layers: int = 3, kernel_size: int = 3,
                 dropout: float = 0.0):
        super().__init__()
        # at least the first layer, mask 'A', which hides each pixel from itself
        num_layers = check_int("num_layers", num_layers)
        self.channels, self.kernel_size, self.dropout = channels, kernel_size, dropout
        self.convs = torch.nn.ModuleList(
            MaskedConv2d(channels, channels, kernel_size, "A" if l == 0 else "B")
            for l in range(num_layers))
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(channels) for _ in range(num_layers))

    def reset_parameters(self):
        for module in (*self.convs, *self.norms):
            module.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        for l, (conv, norm) in enumerate(zip(self.convs, self.norms)):
            h = F.relu(norm(conv(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2))
            h = F.dropout(h, self.dropout, self.training)
            x = h if l == 0 else x + h  # no residual around 'A': x itself is the pixel
        return x

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.channels}, num_layers={len(self.convs)}, "
                f"kernel_size={self.kernel_size})")


class PixelGraphPredictor(ScoredEmitter):
    r"""The GLoMo graph predictor :math:`g` for images (paper Sec. 3.5): emits stacks
    of sparse weighted graphs over the :math:`H \times W` positions of each image.

    Units are the uint8 pixels in raster order (:func:`glomo_pyg.pixels.image_units`);
    two :class:`PixelCNN` s give the keys and queries of :class:`GraphScorer` (paper
    Eq. 1). The backward predictor runs on the image rotated by 180 degrees.

    Args:
        height, width (int): image size. in_channels (int): colour channels.
        hidden_channels (int): CNN width. cnn_layers (int): masked convolutions per
            network. kernel_size (int): odd convolution size.
        position (str, optional): ``'grid'``: a learned term of the (row, column)
            offset (see :class:`GraphScorer`).
        pixel_mean, pixel_std (sequence of float): per-channel statistics on a
            [0, 1] scale (default: ImageNet's).
        others: as in :class:`GraphPredictor` (``dropout``: in the CNNs).

    Shapes:
        - **input:** uint8 pixels :math:`(N, C)` of whole images, batch vector
          :math:`(N)` (every image exactly :math:`HW` units)
        - **output:** :class:`~glomo_pyg.LatentGraphs` over the :math:`N` units
    """

    def __init__(self, height: int = 32, width: int = 32, in_channels: int = 3,
                 hidden_channels: int = 128, num_layers: int = 3, heads: int = 8,
                 head_channels: Optional[int] = None, direction: str = "forward",
                 include_self: bool = False, sparse: bool = True, cnn_layers: int = 3,
                 kernel_size: int = 3, bias: str = "scalar", position: Optional[str] = None,
                 position_frequencies: int = 8, position_period: float = 64.0,
                 pixel_mean: Sequence[float] = IMAGENET_MEAN,
                 pixel_std: Sequence[float] = IMAGENET_STD, dropout: float = 0.0,
                 block_size: int = 1 << 22):
        super().__init__()
        self.raster = RasterOrder(direction, height, width, include_self)  # checks the size
        if position not in (None, "grid") or height * width < 2:
            raise ValueError(f"position must be None or 'grid' for images, and images need at "
                             f"least two pixels, got {position!r} and {height}x{width}")
        head_channels = resolve_head_channels(hidden_channels, heads, head_channels)
        self.height, self.width, self.direction = height, width, direction
        self.hidden_channels = hidden_channels
        self.encoder = UnitEncoder(hidden_channels, in_channels=in_channels,
                                   pixel_mean=pixel_mean, pixel_std=pixel_std)
        self.key_cnn = PixelCNN(hidden_channels, cnn_layers, kernel_size, dropout)
        self.query_cnn = PixelCNN(hidden_channels, cnn_layers, kernel_size, dropout)
        self.scorer = GraphScorer(hidden_channels, num_layers, heads, head_channels, bias, sparse,
                                  direction, include_self, block_size, position,
                                  position_frequencies, position_period,
                                  grid_width=width if position == "grid" else None)

    order = property(attrgetter("raster"), doc="The raster order of the units.")

    def resized(self, height: int, width: int) -> "PixelGraphPredictor":
        """The same predictor (same weights, which do not depend on the image size) for
        ``height x width`` images."""
        out = type(self).from_config(dict(self.config(), height=height, width=width))
        out.load_state_dict(self.state_dict())
        return out.train(self.training).set_layout(self.layout)

    def states(self, x: Tensor, sequences: SequenceBatch) -> Tuple[Tensor, Tensor]:
        """Padded ``[B, HW, C]`` key and query states in raster order."""
        t = self.raster.num_units  # every sequence one whole image (sizes only: no device sync)
        if sequences.max_len != t or sequences.num_nodes != sequences.num_sequences * t:
            raise ValueError(f"pixel graphs need whole {self.height}x{self.width} images: every "
                             f"image must have exactly {t} units in the batch (got "
                             f"{sequences.num_nodes} units in {sequences.num_sequences} images, "
                             f"longest {sequences.max_len})")
        b, h, w = sequences.num_sequences, self.height, self.width
        img = self.encoder.encode(x).view(b, h, w, -1).permute(0, 3, 1, 2)
        backward = self.direction == "backward"
        if backward:  # the backward graphs are the forward graphs of the rotated image
            img = img.flip(2, 3)
        out = [cnn(img) for cnn in (self.key_cnn, self.query_cnn)]
        if backward:
            out = [s.flip(2, 3) for s in out]
        return tuple(s.permute(0, 2, 3, 1).reshape(b, h * w, -1) for s in out)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.height}x{self.width}, in_channels="
                f"{self.encoder.in_channels}, hidden_channels={self.hidden_channels}, "
                f"num_layers={self.num_layers}, heads={self.heads}, "
                f"direction='{self.direction}', sparse={self.scorer.sparse})")


def window_offsets(direction: str, radius: int = 1) -> List[Tuple[int, int]]:
    """``(row, column)`` offsets of the positions after a pixel in raster order in the
    ``(2 r + 1)^2`` window around it (the 180-degree mirror for backward)."""
    out = [(dr, dc) for dr in range(0, radius + 1) for dc in range(-radius, radius + 1)
           if (dr, dc) > (0, 0)]
    return out if direction == "forward" else [(-dr, -dc) for dr, dc in out]


class PixelContextHead(torch.nn.Module):
    r"""The context head of the pixel objective (paper Sec. 3.5): from a pixel's top
    feature :math:`f^L_t`, predict the pixels of :func:`window_offsets`, each channel a
    256-way categorical (as in PixelRNN, van den Oord et al., 2016); the loss is the mean
    cross-entropy over the window pixels inside the image.

    Shapes:
        - **input:** states :math:`(P, C_{hid})`, targets :math:`(P, K, C)` (``-100``
          outside the image)
        - **output:** logits :math:`(P, K, C, 256)`
    """

    LEVELS = 256

    def __init__(self, hidden_channels: int, height: int, width: int, in_channels: int = 3,
                 direction: str = "forward", radius: int = 1):
        super().__init__()
        check_direction(direction)
        radius = check_int("radius", radius)
        self.height, self.width, self.in_channels = height, width, in_channels
        self.direction, self.radius = direction, radius
        self.offsets = window_offsets(direction, radius)
        self.context_length = len(self.offsets)
        self.hidden = torch.nn.Linear(hidden_channels, hidden_channels)
        self.out = torch.nn.Linear(hidden_channels,
                                   self.context_length * in_channels * self.LEVELS)

    def reset_parameters(self):
        self.hidden.reset_parameters()
        self.out.reset_parameters()

    def targets(self, x: Tensor, sequences: SequenceBatch, positions: Tensor,
                direction: str) -> Tensor:
        """``[P, K, C]`` values of the window pixels of ``positions`` (-100 outside)."""
        w = self.width
        pos = sequences.position[positions]
        row, col = torch.div(pos, w, rounding_mode="floor"), pos % w
        dr, dc = torch.tensor(self.offsets, device=x.device).unbind(1)
        r, c = row.view(-1, 1) + dr, col.view(-1, 1) + dc  # [P, K]
        valid = (r >= 0) & (r < self.height) & (c >= 0) & (c < w)
        flat = (positions.view(-1, 1) + dr * w + dc).clamp(0, x.size(0) - 1)
        values = x[flat].long()  # [P, K, C]
        return torch.where(valid.unsqueeze(-1), values, torch.full_like(values, IGNORE))

    def forward(self, state: Tensor) -> Tensor:
        h = F.relu(self.hidden(state))
        return self.out(h).view(-1, self.context_length, self.in_channels, self.LEVELS)

    def loss(self, state: Tensor, targets: Tensor):
        """Mean cross-entropy over real targets, and the number of exact argmax values."""
        logits = self(state)
        loss = F.cross_entropy(logits.flatten(0, 2), targets.flatten(), ignore_index=IGNORE)
        correct = ((logits.argmax(-1) == targets) & (targets != IGNORE)).sum()
        return loss, correct

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.height}x{self.width}, direction="
                f"'{self.direction}', neighbours={self.context_length}, "
                f"channels={self.in_channels})")
