"""Which sources a unit's graph column may draw from: the one allowed-sources rule.

Every place that needs the rule (the emission kernels' masks, uniform graphs, graph
density, the uniform baselines of recovery, syntax and health statistics) asks a
:class:`UnitOrder` instead of writing it out. :class:`SequenceOrder` is the 1-D order
of text (paper Sec. 2.1: forward graphs link each unit to earlier ones, backward graphs
to later ones). A 2-D order over an image grid (e.g. raster order over ``H x W`` pixels
with Euclidean distances) is one more subclass.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional, Tuple

import torch
from torch import Tensor

DIRECTIONS = ("forward", "backward")


def check_count(name: str, value, high: Optional[int] = None) -> None:
    """A positive integer (not a bool), at most ``high`` when given."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or \
            (high is not None and value > high):
        raise ValueError(f"{name} must be " + ("a positive integer" if high is None else
                                               f"an integer in [1, {high}]")
                         + f", got {value!r}")


def check_direction(direction) -> None:
    """The one check of a graph direction: ``'forward'`` or ``'backward'``."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")


class UnitOrder(ABC):
    """The allowed (source, target) pairs of one direction's graphs over a batch of
    variable-length unit sequences, and distances between units.

    Units are addressed by their position ``0..T-1`` in their sequence (for a grid, the
    position in the order's linearisation). Subclasses implement :meth:`allowed` and
    :meth:`distance`; the counting helpers follow from them but may be overridden with
    closed forms.
    """

    def __init__(self, direction: str, include_self: bool = False):
        check_direction(direction)
        self.direction, self.include_self = direction, bool(include_self)

    @abstractmethod
    def allowed(self, target: Tensor, source: Tensor) -> Tensor:
        """Boolean mask, broadcast over ``target`` and ``source`` positions: may
        ``source`` feed ``target`` (both inside the same sequence)?"""

    @abstractmethod
    def distance(self, target: Tensor, source: Tensor) -> Tensor:
        """Non-negative distance between units, broadcast like :meth:`allowed`."""

    def window_distance(self, target: Tensor, source: Tensor) -> Tensor:
        """The integer distance a window cuts by (:meth:`LatentGraphs.within`), broadcast
        like :meth:`allowed`: a window of ``d`` keeps the pairs that a stretch of
        ``d + 1`` consecutive units can hold."""
        return (target - source).abs()

    def longest_window_distance(self, max_len: int) -> int:
        """The largest :meth:`window_distance` within sequences of ``max_len`` units."""
        return max_len - 1

    def block_mask(self, j0: int, j1: int, i0: int, i1: int, lengths: Tensor) -> Tensor:
        """``[B, j1 - j0, i1 - i0]`` allowed (target ``j``, source ``i``) pairs of a block
        of targets ``j0..j1-1`` and sources ``i0..i1-1``, false at padding."""
        device = lengths.device
        j = torch.arange(j0, j1, device=device).view(1, -1, 1)
        i = torch.arange(i0, i1, device=device).view(1, 1, -1)
        length = lengths.view(-1, 1, 1)
        return self.allowed(j, i) & (j < length) & (i < length)

    def num_sources(self, position: Tensor, length: Tensor) -> Tensor:
        """Allowed sources of each unit, from its ``position`` and its sequence's
        ``length`` (elementwise)."""
        t = int(length.max()) if length.numel() else 0
        i = torch.arange(t, device=position.device).view(1, -1)
        ok = self.allowed(position.view(-1, 1), i) & (i < length.view(-1, 1))
        return ok.sum(1)

    def num_pairs(self, lengths: Tensor) -> Tensor:
        """Allowed (source, target) pairs of each sequence, ``[B]`` float64."""
        out = []
        for n in lengths.tolist():
            pos = torch.arange(n, device=lengths.device)
            out.append(float(self.num_sources(pos, torch.full_like(pos, n)).sum()))
        return torch.tensor(out, dtype=torch.float64, device=lengths.device)

    def pairs(self, ptr: Tensor) -> Tuple[Tensor, Tensor]:
        """Flat ``(source, target)`` ids of every allowed pair of the batch whose
        sequences start at ``ptr``, sorted by (target, source)."""
        lengths = ptr[1:] - ptr[:-1]
        src, tgt = [], []
        for b, n in enumerate(lengths.tolist()):
            pos = torch.arange(n, device=ptr.device)
            j, i = self.allowed(pos.view(-1, 1), pos.view(1, -1)).nonzero(as_tuple=True)
            src.append(i + ptr[b])
            tgt.append(j + ptr[b])
        empty = ptr.new_empty(0)
        return (torch.cat(src) if src else empty), (torch.cat(tgt) if tgt else empty)

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and \
            (self.direction, self.include_self) == (other.direction, other.include_self)

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.direction, self.include_self))

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(direction='{self.direction}', "
                f"include_self={self.include_self})")


class SequenceOrder(UnitOrder):
    r"""The order of a 1-D sequence: forward graphs allow sources :math:`i < j`,
    backward graphs :math:`i > j` (:math:`=` too with ``include_self``); the distance
    is :math:`|i - j|`. Counts have closed forms."""

    def allowed(self, target: Tensor, source: Tensor) -> Tensor:
        if self.direction == "forward":
            return source <= target if self.include_self else source < target
        return source >= target if self.include_self else source > target

    def distance(self, target: Tensor, source: Tensor) -> Tensor:
        return (target - source).abs()

    def num_sources(self, position: Tensor, length: Tensor) -> Tensor:
        extra = int(self.include_self)
        if self.direction == "forward":
            return position + extra
        return length - position - 1 + extra

    def num_pairs(self, lengths: Tensor) -> Tensor:
        n = lengths.double()
        return n * (n + 1) / 2 if self.include_self else n * (n - 1) / 2

    def pairs(self, ptr: Tensor) -> Tuple[Tensor, Tensor]:
        lengths = ptr[1:] - ptr[:-1]
        batch = torch.repeat_interleave(torch.arange(lengths.numel(), device=ptr.device), lengths)
        node = torch.arange(batch.numel(), device=ptr.device)
        pos = node - ptr[batch]
        count = self.num_sources(pos, lengths[batch])
        # first allowed source of each target; its sources are consecutive from there
        first = node - pos if self.direction == "forward" else node + 1 - int(self.include_self)
        tgt = torch.repeat_interleave(node, count)
        offset = torch.arange(tgt.numel(), device=ptr.device) - (torch.cumsum(count, 0) - count)[tgt]
        return first[tgt] + offset, tgt


class RasterOrder(SequenceOrder):
    r"""The raster order of an ``height x width`` image grid (paper Sec. 3.5): unit
    :math:`p = r \cdot W + c` is the pixel in row :math:`r`, column :math:`c`. Forward
    graphs allow sources earlier in raster order (every row above, and the pixels to
    the left in the same row), backward graphs later ones: the forward order of the
    image rotated by 180 degrees, mapped back. The allowed pairs are those of the 1-D
    :class:`SequenceOrder` over raster positions (so every kernel and layout applies
    unchanged); the distance is Euclidean on the grid, so the 4-neighbourhood is the set
    of units at distance 1."""

    def __init__(self, direction: str, height: int, width: int, include_self: bool = False):
        super().__init__(direction, include_self)
        check_count("height", height)
        check_count("width", width)
        self.height, self.width = height, width

    @property
    def num_units(self) -> int:
        return self.height * self.width

    def offsets(self, target: Tensor, source: Tensor) -> Tuple[Tensor, Tensor]:
        """Signed (row, column) offsets ``target - source``."""
        dy = torch.div(target, self.width, rounding_mode="floor") - \
            torch.div(source, self.width, rounding_mode="floor")
        return dy, target % self.width - source % self.width

    def distance(self, target: Tensor, source: Tensor) -> Tensor:
        dy, dx = self.offsets(target, source)
        return (dx * dx + dy * dy).double().sqrt()

    def window_distance(self, target: Tensor, source: Tensor) -> Tensor:
        """The larger of the row and column offsets: a window of ``d`` keeps exactly
        the pairs that a ``(d + 1) x (d + 1)`` crop can hold (e.g. ``d = 15`` for a
        predictor pretrained on 16 x 16 crops)."""
        dy, dx = self.offsets(target, source)
        return torch.maximum(dy.abs(), dx.abs())

    def longest_window_distance(self, max_len: int) -> int:
        """The largest :meth:`window_distance` between two pixels of the grid."""
        return max(self.height, self.width) - 1

    def __eq__(self, other) -> bool:
        return super().__eq__(other) and (self.height, self.width) == (other.height, other.width)

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.direction, self.include_self, self.height,
                     self.width))

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(direction='{self.direction}', height={self.height}, "
                f"width={self.width}, include_self={self.include_self})")
