"""Fixed-structure graphs under the interface of :class:`~glomo_pyg.transforms.GlomoGraphs`
(by default one relation per direction, as when merged), so that a comparison changes
only the graph:
adjacent units (:class:`ChainGraphs`), every allowed source alike (:class:`UniformGraphs`)
and the 8-neighbour pixel grid (:class:`GridGraphs`)."""
from __future__ import annotations

from abc import abstractmethod
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple, cast

import torch
from torch import Tensor
from torch_geometric.data import Data

from glomo_pyg.ordering import DIRECTIONS
from glomo_pyg.settings import check_int
from glomo_pyg.transforms.base import SampleEdges, UnitGraphs, check_directions

#: The bytes of built edges a fixed graph keeps for the lengths it saw last (least recently
#: used first out; the one just built is always kept): a text dataset has hundreds of
#: lengths, and UniformGraphs' edges of each are O(T^2) (28 bytes per edge), which an
#: unbounded cache held all at once (3 GB for 700 lengths whose largest sample is 13 MB).
BUILT_BYTES = 1 << 26


class FixedGraphs(UnitGraphs):
    r"""Base of the fixed graphs: by default relation ``r`` is direction ``directions[r]``
    (forward: sources before the target in the units' order; backward: after), each
    target's incoming weights in a relation sum to 1 (as GLoMo's, paper Eq. 1). Edges
    depend only on the number of units: those of the lengths seen last are kept (up to
    :data:`BUILT_BYTES`) and not built again. A sample whose edges would exceed
    :data:`~glomo_pyg.transforms.base.MAX_SAMPLE_EDGES` is refused before any is made.

    Args:
        directions: ``'forward'`` and/or ``'backward'`` (default: both).
        self_loops, symmetric, as_edge_index, hetero, relation_columns: as
            :class:`UnitGraphs` (weights are already normalised: there is no
            ``renormalize``).
    """

    def __init__(self, directions: Optional[Sequence[str]] = None, *,
                 self_loops: bool = False, symmetric: bool = False,
                 as_edge_index: bool = False, hetero: bool = False,
                 relation_columns: bool = False):
        super().__init__(self_loops=self_loops, symmetric=symmetric,
                         as_edge_index=as_edge_index, hetero=hetero,
                         relation_columns=relation_columns)
        self.directions = check_directions(directions, DIRECTIONS)
        self._built: "OrderedDict[int, SampleEdges]" = OrderedDict()  # (least recent first)

    @property
    def relations(self) -> List[str]:
        return list(self.directions)

    def key_parts(self) -> Dict[str, Any]:
        return dict(transform=type(self).__name__, directions=list(self.directions),
                    **self.edge_key_parts())

    def options(self) -> Dict[str, Any]:
        options = super().options()
        del options["renormalize"]  # (not an option here)
        return dict(directions=self.directions, **options)

    @abstractmethod
    def direction_edges(self, num_units: int, direction: str) -> Tuple[Tensor, Tensor, Tensor]:
        """``(source, target, weight)`` of one direction, sorted by (target, source)."""

    @abstractmethod
    def direction_count(self, num_units: int) -> int:
        """How many edges one direction has over ``num_units`` units (computed, not built:
        the size check runs before any allocation)."""

    #: How :meth:`direction_count` grows, for the size error.
    count_rule = ""

    def check_sample(self, data: Data, index: int) -> None:
        super().check_sample(data, index)
        n = data.x.size(0)
        self.check_units(n, index)
        self.check_edge_count(index, n, len(self.directions) * self.direction_count(n),
                              f"{type(self).__name__}: {self.count_rule} per direction, "
                              f"{len(self.directions)} direction(s)")

    def check_units(self, num_units: int, index: int) -> None:
        """Refuse sample ``index`` unless this graph is made for ``num_units`` units."""

    def relation_edges(self, num_units: int) -> List[Tuple[Tensor, Tensor, Tensor]]:
        """``(source, target, weight)`` of each relation, in :attr:`relations` order, each
        sorted by (target, source)."""
        return [self.direction_edges(num_units, d) for d in self.directions]

    def _edges(self, num_units: int) -> SampleEdges:
        if num_units in self._built:
            self._built.move_to_end(num_units)
            return self._built[num_units]
        parts = self.relation_edges(num_units)
        relation = torch.cat([torch.full_like(p[0], r) for r, p in enumerate(parts)])
        src, tgt, weight = (torch.cat(t) for t in zip(*parts))
        edges = (torch.stack([src, tgt]), weight.float(), relation)
        self._built[num_units] = edges
        self._evict()
        return edges

    def _evict(self) -> None:
        """Drop the least recently used lengths' edges until those kept fit in
        :data:`BUILT_BYTES` (the latest always stays)."""
        held = sum(built_bytes(e) for e in self._built.values())
        while held > BUILT_BYTES and len(self._built) > 1:
            held -= built_bytes(self._built.popitem(last=False)[1])

    def sample_edges(self, samples: List[Data]) -> List[SampleEdges]:
        out = []
        for data in samples:
            edge_index, weight, relation = self._edges(data.x.size(0))
            device = data.x.device
            # (copies: a caller editing one sample's edges must not edit the next one's)
            out.append(cast(SampleEdges, tuple(t.to(device, copy=True)
                                               for t in (edge_index, weight, relation))))
        return out


def built_bytes(edges: SampleEdges) -> int:
    """The bytes ``edges``' tensors hold."""
    return sum(t.element_size() * t.numel() for t in edges)


class ChainGraphs(FixedGraphs):
    """Each unit's neighbour in the sequence: source ``t - 1`` (forward) or ``t + 1``
    (backward) of target ``t``, weight 1 (for raster-ordered pixels: the previous or
    next pixel in raster order, across row ends)."""

    count_rule = "T - 1"

    def direction_count(self, num_units: int) -> int:
        return max(num_units - 1, 0)

    def direction_edges(self, num_units: int, direction: str):
        tgt = torch.arange(1, num_units) if direction == "forward" else \
            torch.arange(num_units - 1)
        src = tgt - 1 if direction == "forward" else tgt + 1
        return src, tgt, torch.ones(tgt.numel())


class UniformGraphs(FixedGraphs):
    r"""Every allowed source alike: target ``j`` gets weight :math:`1 / j` from each of
    the :math:`j` units before it (forward) or :math:`1 / (T - 1 - j)` from each after
    it (backward), the paper's uniform baseline as edges (:math:`O(T^2)` of them: 2,048
    units in one direction, 1,448 in both, fill
    :data:`~glomo_pyg.transforms.base.MAX_SAMPLE_EDGES`)."""

    count_rule = "T (T - 1) / 2"

    def direction_count(self, num_units: int) -> int:
        return num_units * (num_units - 1) // 2

    def direction_edges(self, num_units: int, direction: str):
        i, j = torch.triu_indices(num_units, num_units, offset=1)  # i < j
        if direction == "forward":
            src, tgt = i, j
            count = tgt
        else:
            src, tgt = j, i
            count = num_units - 1 - tgt
        order = torch.argsort(tgt * num_units + src)
        src, tgt, count = src[order], tgt[order], count[order]
        return src, tgt, 1.0 / count.double()


#: The grid's neighbour offsets (row, column) per direction, in raster order's sense:
#: forward sources come before the target, backward ones after it.
GRID_OFFSETS = {"forward": (("up-left", (-1, -1)), ("up", (-1, 0)), ("up-right", (-1, 1)),
                            ("left", (0, -1))),
                "backward": (("down-right", (1, 1)), ("down", (1, 0)), ("down-left", (1, -1)),
                             ("right", (0, 1)))}
GRID_RELATIONS = ("direction", "offset")


class GridGraphs(FixedGraphs):
    r"""The 8-neighbour pixel grid of ``height x width`` images in raster order: forward
    sources are the neighbours before the target (up-left, up, up-right, left), backward
    the four after it.

    With ``relations='direction'`` (the default) there is one relation per direction and
    each target's weights are ``1 / (neighbours it has there)``. With
    ``relations='offset'`` each neighbour offset is its own relation (``forward/up``,
    ``backward/down-left``, ...; 8 with both directions) of weight 1, so a relational
    layer gives each offset its own weights, as a :math:`3 \times 3` convolution does.

    Args:
        height, width: the image size; every sample must have ``height * width`` units.
        directions: as :class:`ChainGraphs`.
        relations: ``'direction'`` or ``'offset'``.
        self_loops, symmetric, as_edge_index, hetero, relation_columns: as
            :class:`FixedGraphs`.
    """

    def __init__(self, height: int, width: int, directions: Optional[Sequence[str]] = None,
                 relations: str = "direction", **edge_options: bool):
        # (plain ints: a numpy or torch integer would reach the cache key's JSON)
        height, width = check_int("height", height, 1), check_int("width", width, 1)
        if relations not in GRID_RELATIONS:
            raise ValueError(f"relations must be one of {GRID_RELATIONS}, got {relations!r}")
        super().__init__(directions, **edge_options)
        self.height, self.width, self.relation_mode = height, width, relations

    count_rule = "2 (H - 1) (W - 1) + (H - 1) W + H (W - 1)"

    def direction_count(self, num_units: int) -> int:
        h, w = self.height, self.width  # (one diagonal each way, the column and the row)
        return 2 * (h - 1) * (w - 1) + (h - 1) * w + h * (w - 1)

    @property
    def relations(self) -> List[str]:
        if self.relation_mode == "direction":
            return list(self.directions)
        return [f"{d}/{name}" for d in self.directions for name, _ in GRID_OFFSETS[d]]

    def key_parts(self) -> Dict[str, Any]:
        parts = dict(super().key_parts(), size=[self.height, self.width])
        if self.relation_mode != "direction":  # (the default's key predates the option)
            parts["relations"] = self.relation_mode
        return parts

    def options(self) -> Dict[str, Any]:
        return dict(height=self.height, width=self.width, relations=self.relation_mode,
                    **super().options())

    def check_units(self, num_units: int, index: int) -> None:
        if num_units != self.height * self.width:
            raise ValueError(f"sample {index}: data.x must hold the {self.height * self.width} "
                             f"pixels of one {self.height}x{self.width} image, got "
                             f"{num_units} units")

    def offset_edges(self, offset: Tuple[int, int]) -> Tuple[Tensor, Tensor]:
        """``(source, target)`` of every pixel and its neighbour at ``offset``, by target."""
        h, w = self.height, self.width
        rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        rows, cols = rows.reshape(-1), cols.reshape(-1)
        r, c = rows + offset[0], cols + offset[1]
        inside = (r >= 0) & (r < h) & (c >= 0) & (c < w)
        return (r * w + c)[inside], (rows * w + cols)[inside]

    def direction_edges(self, num_units: int, direction: str) -> Tuple[Tensor, Tensor, Tensor]:
        pairs = [self.offset_edges(offset) for _, offset in GRID_OFFSETS[direction]]
        src, tgt = (torch.cat(t) for t in zip(*pairs))
        order = torch.argsort(tgt * num_units + src)
        src, tgt = src[order], tgt[order]
        degree = torch.bincount(tgt, minlength=num_units)
        return src, tgt, 1.0 / degree[tgt].double()

    def relation_edges(self, num_units: int) -> List[Tuple[Tensor, Tensor, Tensor]]:
        if self.relation_mode == "direction":
            return super().relation_edges(num_units)
        pairs = [self.offset_edges(offset) for d in self.directions
                 for _, offset in GRID_OFFSETS[d]]
        return [(src, tgt, torch.ones(src.numel())) for src, tgt in pairs]
