"""Which sources a unit's graph column may draw from: the one allowed-sources rule
(:class:`UnitOrder`), asked by every place that needs it. :class:`SequenceOrder` is the
1-D order of text (paper Sec. 2.1), :class:`RasterOrder` that of an image grid."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Tuple

import torch
from torch import Tensor

from glomo_pyg.settings import check_int

DIRECTIONS = ("forward", "backward")


def check_direction(direction) -> None:
    """The one check of a graph direction: ``'forward'`` or ``'backward'``."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")


class UnitOrder(ABC):
    """The allowed (source, target) pairs of one direction's graphs, and distances between
    units, by position ``0..T-1``; subclasses implement :meth:`allowed` and :meth:`distance`."""

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
        """The integer distance a window cuts by (:meth:`LatentGraphs.within`): a window
        of ``d`` keeps the pairs ``d + 1`` consecutive units hold."""
        return (target - source).abs()

    def longest_window_distance(self, max_len: int) -> int:
        """The largest :meth:`window_distance` within sequences of ``max_len`` units."""
        return max_len - 1

    def block_mask(self, j0: int, j1: int, i0: int, i1: int, lengths: Tensor) -> Tensor:
        """``[B, j1 - j0, i1 - i0]`` allowed (target ``j``, source ``i``) pairs of targets
        ``j0..j1-1`` and sources ``i0..i1-1``, false at padding."""
        device = lengths.device
        j = torch.arange(j0, j1, device=device).view(1, -1, 1)
        i = torch.arange(i0, i1, device=device).view(1, 1, -1)
        length = lengths.view(-1, 1, 1)
        return self.allowed(j, i) & (j < length) & (i < length)

    def num_sources(self, position: Tensor, length: Tensor) -> Tensor:
        """Allowed sources of each unit from its ``position`` and sequence ``length``."""
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

    def _fields(self) -> dict:
        return dict(direction=self.direction, include_self=self.include_self)

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash((type(self).__name__, *self._fields().values()))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._fields().items())
        return f"{type(self).__name__}({args})"


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
        starts = torch.cumsum(count, 0) - count
        offset = torch.arange(tgt.numel(), device=ptr.device) - starts[tgt]
        return first[tgt] + offset, tgt


class RasterOrder(SequenceOrder):
    r"""The raster order of an ``height x width`` image grid (paper Sec. 3.5): unit
    :math:`p = r \cdot W + c` is the pixel in row :math:`r`, column :math:`c`. The
    allowed pairs are those of :class:`SequenceOrder` over raster positions (forward:
    every row above and the pixels to the left); the distance is Euclidean on the grid."""

    def __init__(self, direction: str, height: int, width: int, include_self: bool = False):
        super().__init__(direction, include_self)
        self.height, self.width = check_int("height", height), check_int("width", width)

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
        """The larger of the row and column offsets: a window of ``d`` keeps the pairs
        a ``(d + 1) x (d + 1)`` crop holds."""
        dy, dx = self.offsets(target, source)
        return torch.maximum(dy.abs(), dx.abs())

    def longest_window_distance(self, max_len: int) -> int:
        """The largest :meth:`window_distance` between two pixels of the grid."""
        return max(self.height, self.width) - 1

    def _fields(self) -> dict:
        return dict(direction=self.direction, height=self.height, width=self.width,
                    include_self=self.include_self)
