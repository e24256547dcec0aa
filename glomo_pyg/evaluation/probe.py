r"""Per-sample features for a linear probe: the units' features :math:`H` and their
propagations :math:`M H` along each graph and hierarchical product of a frozen
predictor (as :class:`~glomo_pyg.GlomoTransfer` computes them, without its gate),
pooled over each sample's units.

The pooling matters: a global mean of :math:`H G` is
:math:`\frac{1}{T} \sum_i (\sum_j G_{ij}) h_i`, a reweighted mean of :math:`H`, so a
mean-only probe can hardly see what a graph adds. A max over units responds to
combinations (a negation next to its word), and for images a coarse grid of regions
keeps where they are."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, cast

import torch
from torch import Tensor
from torch_geometric.utils import scatter

from glomo_pyg.graphs import DirectionalGraphs, LatentGraphs
from glomo_pyg.nn.mixer import GraphMixer
from glomo_pyg.nn.transfer import GlomoTransfer
from glomo_pyg.ordering import RasterOrder
from glomo_pyg.sequences import check_features, sequence_batch
from glomo_pyg.settings import check_int
from glomo_pyg.transforms.fixed import GridGraphs

POOLINGS = ("mean", "max")
HEADS = ("each", "mean")


def _check_poolings(poolings: Sequence[str]) -> Tuple[str, ...]:
    poolings = tuple(poolings) if not isinstance(poolings, str) else (poolings,)
    if not poolings or len(set(poolings)) != len(poolings) or \
            any(p not in POOLINGS for p in poolings):
        raise ValueError(f"poolings must be distinct values of {POOLINGS}, got {poolings!r}")
    return poolings


def pool_units(x: Tensor, batch: Tensor, num_samples: Optional[int] = None,
               poolings: Sequence[str] = POOLINGS,
               regions: Optional[Tuple[int, int, int, int]] = None) -> Tensor:
    r"""Pools the features of each sample's units: ``[B, P * R * C]`` in (pooling,
    region, channel) order, so the mean-only features are the first :math:`R C`
    columns.

    ``regions = (height, width, rows, cols)``: the units are the pixels of
    ``height x width`` images in raster order, pooled over a ``rows x cols`` grid of
    regions (pixel :math:`(r, c)` falls in region
    :math:`(\lfloor r \cdot rows / height \rfloor, \lfloor c \cdot cols / width \rfloor)`);
    ``None``: over all of a sample's units (:math:`R = 1`).

    Shapes: ``x`` :math:`(N, C)`, ``batch`` :math:`(N)` sorted.
    """
    poolings = _check_poolings(poolings)
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ValueError(f"x must be [N, C] unit features, got {tuple(getattr(x, 'shape', ()))}")
    sequences = sequence_batch(x.size(0), batch, x.device)
    b = sequences.num_sequences if num_samples is None else \
        check_int("num_samples", num_samples, sequences.num_sequences)
    group, r = sequences.batch, 1
    if regions is not None:
        if not isinstance(regions, (tuple, list)) or len(regions) != 4:
            raise ValueError(f"regions must be (height, width, rows, cols), got {regions!r}")
        height, width, rows, cols = (check_int(n, v) for n, v in
                                     zip(("height", "width", "rows", "cols"), regions))
        if rows > height or cols > width or bool((sequences.lengths != height * width).any()):
            raise ValueError(f"regions {rows}x{cols} need whole {height}x{width} images of at "
                             f"least that many rows and columns")
        p = sequences.position
        region = (p // width * rows // height) * cols + (p % width) * cols // width
        group, r = group * (rows * cols) + region, rows * cols
    pooled = [scatter(x, group, 0, dim_size=b * r, reduce=p).view(b, r * x.size(1))
              for p in poolings]
    return torch.cat(pooled, 1)


def unit_features(transfer: GlomoTransfer, h: Tensor, x: Optional[Tensor] = None,
                  batch: Optional[Tensor] = None, graphs: Optional[DirectionalGraphs] = None,
                  heads: str = "each") -> Tensor:
    r"""``[H ; M_1 H ; ... ; M_K H]`` per unit, :math:`(N, (1 + D K) C)`: :math:`H` and
    its propagation along every component of ``transfer``'s mixer (per direction, the
    graphs :math:`G^{l,h}` and products :math:`\Lambda^{l,h}`, in
    :meth:`~glomo_pyg.GraphMixer.components` order), unweighted and without the gate.
    ``graph='none'`` gives :math:`H` alone.

    ``heads='mean'``: the graphs averaged over the heads of each layer
    (:meth:`~glomo_pyg.LatentGraphs.mean_heads`) and their products instead, one
    component per (kind, layer): :math:`K / \text{heads}` components at a fraction of the
    cost for many-headed predictors."""
    if heads not in HEADS:
        raise ValueError(f"heads must be one of {HEADS}, got {heads!r}")
    check_features(h, transfer.in_channels, name="h")
    if transfer.graph == "none":
        return h
    if heads == "each":
        # (checks x and graphs; not None: graph is not 'none')
        propagated = cast(Tensor, transfer.propagations(h, x, batch, graphs))
    else:
        mixer = transfer.mixer
        if graphs is None:
            graphs = cast(DirectionalGraphs, transfer.graphs(x, batch, num_nodes=h.size(0)))
        elif x is not None or not isinstance(graphs, tuple) or len(graphs) != 2:
            raise ValueError("pass either x (graphs are computed from it) or graphs, "
                             "DirectionalGraphs (forward, backward), not both")
        merged = [None if g is None else g.mean_heads() for g in graphs]
        one_head = GraphMixer(mixer.in_channels, mixer.num_layers, 1, mixer.directions,
                              propagation=mixer.propagation, layers=mixer.layers)
        propagated = one_head.propagations(h, merged)
    return torch.cat([h, propagated.permute(2, 0, 1, 3).reshape(h.size(0), -1)], 1)


def probe_features(transfer: GlomoTransfer, h: Tensor, batch: Tensor,
                   x: Optional[Tensor] = None, graphs: Optional[DirectionalGraphs] = None,
                   poolings: Sequence[str] = POOLINGS,
                   regions: Optional[Tuple[int, int, int, int]] = None,
                   heads: str = "each", num_samples: Optional[int] = None) -> Tensor:
    """:func:`pool_units` of :func:`unit_features`: ``[B, P * R * (1 + D K') C]``, in
    (pooling, region, part, channel) order, part 0 being :math:`H`."""
    check_features(h, transfer.in_channels, name="h")
    _check_poolings(poolings)
    units = unit_features(transfer, h, x, batch, graphs, heads)
    return pool_units(units, batch, num_samples, poolings, regions)


def grid_graphs(ptr: Tensor, height: int, width: int, *, num_layers: int, num_heads: int,
                direction: str) -> LatentGraphs:
    """The 8-neighbour pixel grid (:class:`~glomo_pyg.transforms.GridGraphs`: each
    target's weights ``1 / its neighbours`` before it, forward, or after it, backward)
    as latent graphs over ``height x width`` images, the same for every layer and head:
    the local fixed baseline of an image probe."""
    lengths = ptr[1:] - ptr[:-1]
    if bool((lengths != height * width).any()):
        raise ValueError(f"grid graphs need whole {height}x{width} images, got lengths "
                         f"{sorted(set(lengths.tolist()))}")
    src, tgt, weight = GridGraphs(height, width).direction_edges(height * width, direction)
    offsets = ptr[:-1].repeat_interleave(src.numel())
    src, tgt = src.repeat(lengths.numel()) + offsets, tgt.repeat(lengths.numel()) + offsets
    edges = torch.stack([src, tgt]).repeat(1, num_heads)
    head = torch.arange(num_heads).repeat_interleave(src.numel())
    weight = weight.float().repeat(lengths.numel() * num_heads)
    graphs = LatentGraphs([edges] * num_layers, [weight] * num_layers, [head] * num_layers,
                          num_heads=num_heads, direction=direction, ptr=ptr)
    return graphs.with_order(RasterOrder(direction, height, width))
