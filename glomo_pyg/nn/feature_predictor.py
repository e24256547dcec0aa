"""The feature predictor f of GLoMo (paper Eq. 2)."""
from __future__ import annotations

import operator
from operator import attrgetter
from typing import Optional, Sequence, Tuple, TypeVar, cast

import torch
from torch import Tensor

from glomo_pyg.graphs import EdgeStorage, LatentGraphs
from glomo_pyg.nn.config import ConfigurableModule
from glomo_pyg.nn.conv import GlomoConv
from glomo_pyg.nn.emitter import EmitResult, GraphEmitter
from glomo_pyg.nn.encoder import UnitEncoder
from glomo_pyg.nn.scorer import GraphScorer, resolve_head_channels
from glomo_pyg.nn.settings import check_model_setting
from glomo_pyg.sequences import SequenceBatch, sequence_batch

_F = TypeVar("_F", bound="FeaturePredictor")

def context_mean(x: Tensor, sequences: SequenceBatch, direction: str,
                 include_self: bool = False) -> Tensor:
    """Mean of ``x`` ``[N, C]`` over each unit's allowed sources, zero where there are none:
    a running sum along each padded sequence, so no unit's result depends on a unit it may
    not see, not even through rounding."""
    padded = sequences.to_padded(x)  # [B, T, C], zero at padding
    if direction == "backward":
        padded = padded.flip(1)  # padding first: it adds zeros
    total = padded.cumsum(1)
    if not include_self:
        total = torch.nn.functional.pad(total[:, :-1], (0, 0, 1, 0))
    if direction == "backward":
        total = total.flip(1)
    before = sequences.position if direction == "forward" else \
        sequences.lengths[sequences.batch] - sequences.position - 1
    count = before + int(include_self)
    return sequences.to_flat(total) / count.clamp_min(1).unsqueeze(1).to(x.dtype)


def nearest_sources(x: Tensor, sequences: SequenceBatch, direction: str, k: int) -> Tensor:
    """Features ``[N, k * C]`` of each unit's ``k`` nearest other units on its allowed side,
    nearest first, zero where the sequence has none."""
    padded = sequences.to_padded(x)  # [B, T, C], zero at padding (after each sequence)
    steps, forward = padded.size(1), direction == "forward"
    zeros = torch.nn.functional.pad(padded, (0, 0, k, 0) if forward else (0, 0, 0, k))
    starts = [k - d if forward else d for d in range(1, k + 1)]
    return sequences.to_flat(torch.cat([zeros[:, s:s + steps] for s in starts], -1))


class FeaturePredictor(ConfigurableModule):
    r"""Propagates unit features along the graphs of a graph predictor:

    .. math::
        F^0 = \mathrm{emb}(x), \qquad
        f^l_j = v\Big(\sum_i G^l_{ij} f^{l-1}_i,\; f^{l-1}_j\Big), \quad l = 1..L

    one :class:`GlomoConv` per layer. With ``decouple=False`` (the "-decouple" ablation
    of paper Table 2) :math:`G^l` is scored from the network's own :math:`F^{l-1}`.

    Args:
        num_tokens, in_channels, padding_idx, dropout: as for :class:`GraphPredictor`.
        hidden_channels (int): feature width, divisible by ``heads``.
        num_layers (int): graph layers :math:`L`. heads (int): graphs per layer.
        update (str): ``'gru'`` or ``'residual'`` (see :class:`GlomoConv`).
        decouple (bool): graphs come from a separate predictor (the paper).
        pixel_mean, pixel_std: statistics for uint8 pixel input (:class:`UnitEncoder`).
        pooled_context (bool): every layer also adds :math:`W_l \bar f^{l-1}_j`, the mean
            of :math:`f^{l-1}` over the allowed sources (docs/training.md).
        local_context (int): every layer also adds :math:`W_l [f^{l-1}_{j-1}; \dots;
            f^{l-1}_{j-k}]`, the :math:`k` nearest allowed units.
        scorer_kwargs: options of the :class:`GraphScorer` when ``decouple=False``.

    Shapes:
        - **input:** units :math:`(N)` or :math:`(N, F_{in})`, batch :math:`(N)`,
          graphs with :math:`L` layers (unless ``decouple=False``)
        - **output:** :math:`(N, C)` top-layer features, and the graphs used
    """

    def __init__(self, num_tokens: Optional[int] = None, in_channels: Optional[int] = None,
                 hidden_channels: int = 512, num_layers: int = 3, heads: int = 8,
                 update: str = "gru", decouple: bool = True, padding_idx: Optional[int] = None,
                 dropout: float = 0.0, pixel_mean: Optional[Sequence[float]] = None,
                 pixel_std: Optional[Sequence[float]] = None, pooled_context: bool = False,
                 local_context: int = 0, **scorer_kwargs):
        super().__init__()
        if update not in ("gru", "residual"):
            raise ValueError(f"update must be 'gru' or 'residual', got {update!r}")
        bools = ("bool", "bool_")  # numpy's too
        if type(pooled_context).__name__ not in bools or \
                type(local_context).__name__ in bools or \
                not hasattr(type(local_context), "__index__"):
            raise TypeError(f"pooled_context must be True or False and local_context must be "
                            f"an integer, got {pooled_context!r} and {local_context!r}")
        pooled_context = bool(pooled_context)
        # a plain int: config() is JSON
        local_context = check_model_setting("local_context", operator.index(local_context))
        if "layout" in scorer_kwargs:
            raise TypeError("layout is a run-time choice: use set_layout() or "
                            "from_sequences(..., layout=...)")
        self.hidden_channels, self.num_layers, self.heads = hidden_channels, num_layers, heads
        self.encoder = UnitEncoder(hidden_channels, num_tokens, in_channels, padding_idx,
                                   pixel_mean, pixel_std)
        self.convs = torch.nn.ModuleList(GlomoConv(hidden_channels, heads, update=update)
                                         for _ in range(num_layers))
        self.pooled = torch.nn.ModuleList(
            torch.nn.Linear(hidden_channels, hidden_channels, bias=False)
            for _ in range(num_layers)) if pooled_context else None
        self.local_context = local_context
        self.local = torch.nn.ModuleList(
            torch.nn.Linear(local_context * hidden_channels, hidden_channels, bias=False)
            for _ in range(num_layers)) if local_context else None
        for lin in [*(self.pooled or ()), *(self.local or ())]:
            torch.nn.init.zeros_(lin.weight)  # untrained: the paper's network
        self.dropout, self.decouple, self.scorer = dropout, decouple, None
        if not decouple:
            scorer_kwargs["head_channels"] = resolve_head_channels(
                hidden_channels, heads, scorer_kwargs.get("head_channels"))
            self.scorer = GraphScorer(hidden_channels, num_layers, heads, **scorer_kwargs)

    embedding = property(attrgetter("encoder.embedding"), doc="The token embedding, or None.")

    def reset_parameters(self):
        for module in (self.encoder, *self.convs, self.scorer):
            if module is not None:
                module.reset_parameters()
        for lin in [*(self.pooled or ()), *(self.local or ())]:
            torch.nn.init.zeros_(lin.weight)  # untrained: the paper's network

    layout: str = "sparse"  # of the graphs a decouple=False scorer emits (run time)

    def set_layout(self: _F, layout: str) -> _F:
        """Layout of the graphs the ``decouple=False`` scorer emits (not saved)."""
        check_model_setting("layout", layout)
        self.layout = layout
        return self

    def forward(self, x: Tensor, graphs: Optional[LatentGraphs] = None,
                batch: Optional[Tensor] = None) -> Tuple[Tensor, LatentGraphs]:
        self.encoder.check(x)
        sequences = sequence_batch(x.size(0), batch, x.device)
        given = isinstance(graphs, LatentGraphs)
        got = (graphs.num_layers, graphs.num_heads, graphs.num_nodes) \
            if isinstance(graphs, LatentGraphs) else \
            None if graphs is None else type(graphs).__name__
        if got != ((self.num_layers, self.heads, x.size(0)) if self.decouple else None) or \
                isinstance(graphs, LatentGraphs) and (
                    graphs.device != x.device or not torch.equal(graphs.ptr, sequences.ptr)):
            error = TypeError if graphs is not None and not given else ValueError
            raise error(f"this FeaturePredictor propagates along LatentGraphs of "
                             f"{self.num_layers} layers x {self.heads} heads emitted for this "
                             f"batch of x on {x.device} (pass graphs=GraphPredictor(...)(x, "
                             f"batch); decouple=False computes its own graphs: do not pass "
                             f"graphs); got (layers, heads, units) = {got}")
        return self.from_sequences(x, sequences, graphs)

    def from_sequences(self, x: Tensor, sequences: SequenceBatch,
                       graphs: Optional[LatentGraphs] = None,
                       layout: Optional[str] = None) -> Tuple[Tensor, LatentGraphs]:
        """Top-layer features and the graphs used, for an already validated batch and
        graphs (or none, with ``decouple=False``)."""
        f = torch.nn.functional.dropout(self.encoder.encode(x), self.dropout, self.training)
        emitted = []
        for l, conv in enumerate(self.convs):
            if self.scorer is not None:  # graph layer l scored from F^{l-1}
                padded = sequences.to_padded(f)
                emitted.append(self.scorer.emit(padded, padded, sequences, layout or self.layout,
                                                [l]))
                layer, index = emitted[-1], 0
            else:
                layer, index = cast(LatentGraphs, graphs), l
            out = cast(GlomoConv, conv).propagate_graphs(f, layer, index)
            if self.pooled is not None:
                out = out + self.pooled[l](context_mean(f, sequences, layer.direction,
                                                        layer.include_self))
            if self.local is not None:
                out = out + self.local[l](nearest_sources(f, sequences, layer.direction,
                                                          self.local_context))
            f = torch.nn.functional.dropout(out, self.dropout, self.training)
        if self.scorer is not None:
            storages = [g.storages[0] for g in emitted]
            if len({type(s) for s in storages}) > 1:  # 'auto' chose per layer: edges for all
                storages = [EdgeStorage(*g.layer(0)) for g in emitted]
            graphs = LatentGraphs.from_storage(storages, num_heads=self.heads, sequences=sequences,
                                               direction=self.scorer.direction,
                                               include_self=self.scorer.include_self)
        return f, cast(LatentGraphs, graphs)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.encoder!r}, hidden_channels="
                f"{self.hidden_channels}, num_layers={self.num_layers}, heads={self.heads}, "
                f"decouple={self.decouple})")


class FeatureGraphEmitter(FeaturePredictor, GraphEmitter):
    r"""The graphs of the "-decouple" ablation (paper Table 2) as a graph emitter: a
    :class:`FeaturePredictor` with ``decouple=False``, both the feature predictor
    :class:`~glomo_pyg.Glomo` trains and the emitter transfer uses. Args: as
    :class:`FeaturePredictor`, without ``decouple``.

    Shapes:
        - **input:** units :math:`(N)` or :math:`(N, F_{in})`, batch :math:`(N)`
        - **output:** :class:`~glomo_pyg.LatentGraphs` (``forward``)
    """

    def __init__(self, num_tokens: Optional[int] = None, in_channels: Optional[int] = None,
                 hidden_channels: int = 512, num_layers: int = 3, heads: int = 8,
                 update: str = "gru", padding_idx: Optional[int] = None, dropout: float = 0.0,
                 pooled_context: bool = False, local_context: int = 0, **scorer_kwargs):
        if "decouple" in scorer_kwargs:
            raise TypeError("FeatureGraphEmitter always scores its own graphs (decouple=False)")
        super().__init__(num_tokens, in_channels, hidden_channels, num_layers, heads, update,
                         decouple=False, padding_idx=padding_idx, dropout=dropout,
                         pooled_context=pooled_context, local_context=local_context,
                         **scorer_kwargs)

    direction = property(attrgetter("scorer.direction"), doc="Direction of the graphs.")
    include_self = property(attrgetter("scorer.include_self"), doc="Whether i = j edges exist.")

    def emit(self, x: Tensor, sequences: SequenceBatch, layout: Optional[str] = None,
             return_column_max: bool = False) -> EmitResult:
        if return_column_max:
            raise ValueError("the keep-alive penalty applies to decoupled graph predictors")
        return self.from_sequences(x, sequences, layout=layout)[1]

    # (LatentGraphs, not FeaturePredictor's (features, graphs): deliberately incompatible)
    forward = GraphEmitter.forward  # type: ignore[assignment]
