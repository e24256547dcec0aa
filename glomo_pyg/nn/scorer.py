"""The scorer of paper Eq. 1: per-layer, per-head keys and queries, the bias forms and
the normalisation that turns scores into sparse graphs, shared by every graph emitter."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple, cast

import torch
from torch import Tensor

from glomo_pyg import flex, kernels
from glomo_pyg.graphs import LatentGraphs
from glomo_pyg.kernels import (
    bounded_keys_queries,
    check_graph_size,
    column_max_scores,
    latent_graph_dense,
    latent_graph_edges,
)
from glomo_pyg.nn.layout import auto_layout, settle_auto, unfused_layout
from glomo_pyg.nn.settings import check_model_setting
from glomo_pyg.ordering import DIRECTIONS
from glomo_pyg.sequences import SequenceBatch

BIASES = ("scalar", "threshold")


def _joined(parts: List[Tensor]) -> Tensor:
    """``torch.cat`` along the last dimension of ``[B, H, T, D_i]`` (the first) and parts
    broadcast to its leading dimensions (a scalar: one column), written slice by slice
    into one new tensor: on a CPU about twice as fast as concatenating the expanded parts,
    and differentiable alike."""
    first = parts[0]
    widths = [first.size(-1)] + [p.size(-1) if p.dim() else 1 for p in parts[1:]]
    out = first.new_empty(*first.shape[:-1], sum(widths))
    start = 0
    for part, width in zip(parts, widths):
        out[..., start:start + width] = part.unsqueeze(-1) if part.dim() == 0 else part
        start += width
    return out
POSITIONS = (None, "relative", "grid")


def relative_frequencies(num: int, period: float) -> Tensor:
    """``num`` angular frequencies spaced geometrically from :math:`\\pi` (a sign flip
    between adjacent units) down to :math:`2\\pi / \\text{period}`."""
    if num == 1:
        return torch.tensor([math.pi], dtype=torch.float64)
    ratio = (2.0 / period) ** (torch.arange(num, dtype=torch.float64) / (num - 1))
    return math.pi * ratio  # float64: angles of long sequences stay exact


def resolve_head_channels(hidden_channels: int, heads: int, head_channels: Optional[int]) -> int:
    """``head_channels`` or, when ``None``, ``hidden_channels // heads`` (which must divide)."""
    if head_channels is not None:
        return head_channels
    if heads <= 0 or hidden_channels % heads:
        raise ValueError(f"hidden_channels ({hidden_channels}) is not divisible by heads "
                         f"({heads}); pass head_channels explicitly")
    return hidden_channels // heads


class GraphScorer(torch.nn.Module):
    r"""Per-layer, per-head projections and the normalisation of paper Eq. 1.

    For graph layer :math:`l` and head :math:`h`,
    :math:`k^{l,h}_i = W_k^{l,h} k_i`, :math:`q^{l,h}_j = W_q^{l,h} q_j` and

    .. math::
        s_{ij} = k^{l,h}_i \cdot q^{l,h}_j + b, \qquad
        G^{l,h}_{ij} = \frac{\mathrm{ReLU}(s_{ij})^2}{\sum_{i'} \mathrm{ReLU}(s_{i'j})^2}

    over the allowed sources (a softmax with ``sparse=False``). The bias is a learned
    scalar per layer (``bias='scalar'``, the paper) or a per-target threshold
    :math:`b_j = -(w_l \cdot q^{l,h}_j + c_l)` (``bias='threshold'``, the reference code).

    With ``position='relative'`` (an extension of the paper) every layer and head adds a
    learned function of the signed distance :math:`j - i`,

    .. math::
        s_{ij} \mathrel{+}= \sum_{m=1}^{M} a^{l,h}_m \cos(\omega_m (j - i))
        + c^{l,h}_m \sin(\omega_m (j - i)),

    over ``position_frequencies`` = :math:`M` frequencies (:func:`relative_frequencies`),
    zero at initialisation; choose ``position_period`` of at least twice the longest
    sequence. ``position='grid'``: the sum of two such series over the row and column
    offsets of an image in raster order (``grid_width`` columns).
    """

    frequencies: Optional[Tensor]

    def __init__(self, in_channels: int, num_layers: int, heads: int, head_channels: int,
                 bias: str = "scalar", sparse: bool = True, direction: str = "forward",
                 include_self: bool = False, block_size: int = 1 << 22,
                 position: Optional[str] = None, position_frequencies: int = 16,
                 position_period: float = 512.0, grid_width: Optional[int] = None):
        super().__init__()
        wrong = [f"{name} must be one of {allowed}, got {value!r}" for name, value, allowed in
                 (("bias", bias, BIASES), ("position", position, POSITIONS),
                  ("direction", direction, DIRECTIONS)) if value not in allowed]
        if (position == "grid") != (grid_width is not None) or (
                grid_width is not None and (not isinstance(grid_width, int) or grid_width < 1)) \
                or min(in_channels, num_layers, heads, head_channels) <= 0:
            wrong.append(f"in_channels, num_layers, heads and head_channels must be positive, "
                         f"and position='grid' needs grid_width, a positive integer (the "
                         f"image width), and only it takes one; got "
                         f"{(in_channels, num_layers, heads, head_channels)}, position="
                         f"{position!r}, grid_width={grid_width!r}")
        if wrong:
            raise ValueError("; ".join(wrong))
        # checked even without a distance term: what is saved must load
        check_model_setting("position_frequencies", position_frequencies)
        check_model_setting("position_period", position_period)
        self.num_layers, self.heads, self.head_channels = num_layers, heads, head_channels
        self.bias_kind, self.sparse, self.direction = bias, sparse, direction
        self.include_self, self.block_size = include_self, block_size
        self.position, self.grid_width = position, grid_width
        axes = 2 if position == "grid" else 1
        width = heads * head_channels
        self.key, self.query = (
            torch.nn.ModuleList(torch.nn.Linear(in_channels, width) for _ in range(num_layers))
            for _ in range(2))
        scalar = bias == "scalar"
        self.bias = torch.nn.Parameter(torch.zeros(num_layers)) if scalar else None
        self.threshold = None if scalar else torch.nn.ModuleList(
            torch.nn.Linear(head_channels, 1) for _ in range(num_layers))
        self.register_buffer("frequencies", None if position is None else relative_frequencies(
            int(position_frequencies), float(position_period)), persistent=False)
        self.position_coef = None if position is None else torch.nn.Parameter(
            torch.zeros(num_layers, heads, 2, axes * int(position_frequencies)))
        self.reset_parameters()

    def reset_parameters(self):
        for lin in (*self.key, *self.query, *(self.threshold or ())):
            lin.reset_parameters()
        for param in (self.bias, self.position_coef):
            if param is not None:
                torch.nn.init.zeros_(param)

    def relative_bias(self, layer: int, distance: Tensor) -> Tensor:
        """The learned position term of layer ``layer`` at signed distances ``j - i``:
        ``[H, *distance.shape]`` (zeros without a position term); with ``position='grid'``,
        ``[H, ...]`` at ``[..., 2]`` signed (row, column) offsets."""
        grid = self.position == "grid"
        if grid and distance.size(-1) != 2:
            raise ValueError("position='grid' takes [..., 2] (row, column) offsets")
        shape = distance.shape[:-1] if grid else distance.shape
        if self.position_coef is None:
            return distance.new_zeros((self.heads, *shape), dtype=torch.float32)
        assert self.frequencies is not None
        angle = distance.unsqueeze(-1).double() * self.frequencies.double()  # [..., (2,) M]
        if grid:
            angle = angle.flatten(-2)
            distance = distance[..., 0]
        a, c = self.position_coef[layer].unbind(1)  # [H, M] each
        view = (self.heads,) + (1,) * distance.dim() + (-1,)
        cos, sin = angle.cos().to(a.dtype), angle.sin().to(a.dtype)
        return (a.view(view) * cos + c.view(view) * sin).sum(-1)

    def _position_features(self, layer: int, t: int, like: Tensor) -> Tuple[Tensor, Tensor]:
        """Key ``[1, 1, T, 2M]`` and query ``[1, H, T, 2M]`` features: :meth:`relative_bias`."""
        assert self.frequencies is not None and self.position_coef is not None
        pos = torch.arange(t, device=like.device, dtype=torch.float64)
        if self.position == "grid":  # (row, column) of each raster position
            w = self.grid_width
            assert w is not None
            pos = torch.stack([torch.div(pos, w, rounding_mode="floor"), pos % w], -1)
        angle = (pos.unsqueeze(-1) * self.frequencies.double()).view(t, -1)  # [T, axes M]
        dtype = torch.promote_types(like.dtype, torch.float32)
        cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
        a, c = self.position_coef[layer].to(dtype).unbind(1)  # [H, M]
        a, c = a.unsqueeze(1), c.unsqueeze(1)  # [H, 1, M]
        # k_i . q_j = sum_m a cos(w (j - i)) + c sin(w (j - i))
        key = torch.cat([cos, sin], -1).unsqueeze(0).unsqueeze(0)
        query = torch.cat([a * cos + c * sin, a * sin - c * cos], -1).unsqueeze(0)
        return key.to(like.dtype), query.to(like.dtype)

    def augmented(self, layer: int, key_states: Tensor, query_states: Tensor,
                  detach_bias: bool = False) -> Tuple[Tensor, Tensor]:
        """Per-head ``[B, H, T, D + 1]`` keys and queries with the bias folded in:
        ``key_aug[i] . query_aug[j] = s_ij`` (``detach_bias``: no gradient to the bias)."""
        b, t, _ = key_states.shape
        k = self.key[layer](key_states).view(b, t, self.heads, -1).transpose(1, 2)
        q = self.query[layer](query_states).view(b, t, self.heads, -1).transpose(1, 2)
        if self.bias is not None:
            bias = self.bias[layer].detach() if detach_bias else self.bias[layer]
        else:
            assert self.threshold is not None
            thr = cast(torch.nn.Linear, self.threshold[layer])  # s = (k - w) . q - c
            k, bias = k - thr.weight.view(-1), -thr.bias
        # under autocast the projections are half precision but the folded bias and
        # threshold float32: score both in the wider dtype (the fused kernel needs one,
        # and it keeps thresholds exact)
        dtype = torch.promote_types(torch.promote_types(k.dtype, q.dtype), bias.dtype)
        k, q = k.to(dtype), q.to(dtype)
        keys, queries = [k, k.new_ones(())], [q, bias.to(dtype).view(-1, 1, 1)]
        if self.position_coef is not None:
            keys[2:], queries[2:] = self._position_features(layer, t, k)
        return _joined(keys), _joined(queries)

    def _edges(self, k: Tensor, q: Tensor, sequences: SequenceBatch):
        return latent_graph_edges(k, q, sequences.lengths, sequences.ptr,
                                  direction=self.direction, include_self=self.include_self,
                                  normalization="relu2" if self.sparse else "softmax",
                                  block_size=self.block_size, check=False, sizes=sequences.sizes)

    def dense(self, layer: int, key_states: Tensor, query_states: Tensor,
              sequences: SequenceBatch) -> Tensor:
        """Graph layer ``layer`` as dense ``[B, H, T, T]`` blocks (the dense layout)."""
        k, q = self.augmented(layer, key_states, query_states)
        return latent_graph_dense(k, q, sequences.lengths, direction=self.direction,
                                  include_self=self.include_self,
                                  normalization="relu2" if self.sparse else "softmax")

    def column_max(self, layer: int, key_states: Tensor, query_states: Tensor,
                   sequences: SequenceBatch) -> Tensor:
        """``[B, H, T]`` largest score of each target over its allowed sources
        (:func:`~glomo_pyg.kernels.column_max_scores`); no gradient reaches the shared scalar
        bias (raising it would flatten every head of the layer)."""
        k, q = self.augmented(layer, key_states, query_states, detach_bias=True)
        return column_max_scores(k, q, sequences.lengths, direction=self.direction,
                                 include_self=self.include_self, block_size=self.block_size)

    def emit(self, key_states: Tensor, query_states: Tensor, sequences: SequenceBatch,
             layout: str = "sparse", layers=None) -> LatentGraphs:
        """All (or the given) graph layers as :class:`LatentGraphs` in ``layout``, from trusted
        keys and queries (no device sync); ``ValueError`` before allocating anything for too
        large a batch (:data:`~glomo_pyg.kernels.MAX_GRAPH_PAIRS`; ``'auto'``: fused)."""
        check_model_setting("layout", layout)
        layers = range(self.num_layers) if layers is None else layers
        b, t, n = sequences.num_sequences, sequences.max_len, sequences.num_nodes
        meta: Dict[str, Any] = dict(direction=self.direction, sequences=sequences,
                                    include_self=self.include_self)
        normalization = "relu2" if self.sparse else "softmax"
        requested = layout
        if layout == "auto":
            layout = auto_layout(b, n, t, self.heads, self.include_self, key_states)
        if layout != "fused":
            check_graph_size("sparse" if requested == "auto" else layout, b, n, t, self.heads,
                             self.include_self)
        layers_kq = [self.augmented(l, key_states, query_states) for l in layers]
        if layout == "fused":
            for kq in layers_kq:  # propagation trusts them from here on
                flex.check_fusable(*kq)
            if self.sparse:  # exact rescaling: FlexAttention's 2 log(s) never sees s = inf
                layers_kq = [bounded_keys_queries(k, q) for k, q in layers_kq]
            # softmax: would bounded_keys_queries rescale some key or query? (one sync)
            if self.sparse or not bool(torch.stack([(c < 1).any() for kq in layers_kq
                                                    for c in kernels._safe_scales(*kq)]).any()):
                return LatentGraphs.from_trusted_fused(layers_kq, normalization=normalization,
                                                       **meta)
            if requested != "auto":
                raise ValueError("the graph scores of this batch could overflow float32 (keys "
                                 "and queries above 2**50), which the fused softmax layout "
                                 "cannot rescale; use layout='sparse' or 'dense'")
            layout = unfused_layout(b, self.heads, t)
            check_graph_size("sparse", b, n, t, self.heads, self.include_self)
        if layout == "sparse":
            edges = [self._edges(k, q, sequences) for k, q in layers_kq]
            return LatentGraphs.from_trusted_edges(*map(list, zip(*edges)), num_heads=self.heads,
                                                   **meta)
        graphs = LatentGraphs.from_trusted_dense(
            [latent_graph_dense(k, q, sequences.lengths, direction=self.direction,
                                include_self=self.include_self, normalization=normalization,
                                check=False) for k, q in layers_kq], **meta)
        return settle_auto(graphs) if requested == "auto" else graphs

    def forward(self, layer: int, key_states: Tensor, query_states: Tensor,
                sequences: SequenceBatch) -> Tuple[Tensor, Tensor, Tensor]:
        """Edges ``(edge_index, edge_weight, edge_head)`` of graph layer ``layer``
        from padded ``[B, T, C]`` states."""
        return self._edges(*self.augmented(layer, key_states, query_states), sequences)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(layers={self.num_layers}, heads={self.heads}, "
                f"head_channels={self.head_channels}, bias='{self.bias_kind}', "
                f"sparse={self.sparse}, direction='{self.direction}'"
                + (f", position='{self.position}'" if self.position else "") + ")")


