"""The feature predictor f of GLoMo (paper Eq. 2)."""
from __future__ import annotations

import operator
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from glomo_pyg.graphs import EdgeStorage, LatentGraphs
from glomo_pyg.nn.config import ConfigurableModule
from glomo_pyg.nn.conv import GlomoConv
from glomo_pyg.nn.emitter import EmitResult, GraphEmitter
from glomo_pyg.nn.encoder import UnitEncoder
from glomo_pyg.nn.scorer import GraphScorer, check_layout, resolve_head_channels
from glomo_pyg.nn.settings import check_model_setting
from glomo_pyg.sequences import SequenceBatch, sequence_batch


def context_mean(x: Tensor, sequences: SequenceBatch, direction: str,
                 include_self: bool = False) -> Tensor:
    """Mean of ``x`` ``[N, C]`` over each unit's allowed sources (the earlier units of
    its sequence going forward, the later ones going backward; itself too with
    ``include_self``), zero where there are none. A running sum along each padded
    sequence, so no unit's result depends on a unit it may not see, not even through
    rounding (the gradient of a difference of global prefix sums would be)."""
    padded = sequences.to_padded(x)  # [B, T, C], zero at padding
    if direction == "backward":
        padded = padded.flip(1)  # padding first: it adds zeros
    total = padded.cumsum(1)
    if not include_self:
        total = torch.nn.functional.pad(total[:, :-1], (0, 0, 1, 0))
    if direction == "backward":
        total = total.flip(1)
    extra = int(include_self)
    length = sequences.lengths[sequences.batch]
    count = sequences.position + extra if direction == "forward" else \
        length - sequences.position - 1 + extra
    return sequences.to_flat(total) / count.clamp_min(1).unsqueeze(1).to(x.dtype)


def nearest_sources(x: Tensor, sequences: SequenceBatch, direction: str, k: int) -> Tensor:
    """Features ``[N, k * C]`` of each unit's ``k`` nearest other units on its allowed side
    (units ``j-1 .. j-k`` going forward, ``j+1 .. j+k`` going backward), nearest first,
    zero where the sequence has none."""
    padded = sequences.to_padded(x)  # [B, T, C], zero at padding
    steps = padded.size(1)
    parts = []
    for d in range(1, k + 1):
        shifted = torch.zeros_like(padded)
        if d < steps:  # padding sits after each sequence, so shifts pull in zeros
            if direction == "forward":
                shifted[:, d:] = padded[:, :steps - d]
            else:
                shifted[:, :steps - d] = padded[:, d:]
        parts.append(shifted)
    return sequences.to_flat(torch.cat(parts, -1))




class FeaturePredictor(ConfigurableModule):
    r"""Propagates unit features along the graphs of a graph predictor:

    .. math::
        F^0 = \mathrm{emb}(x), \qquad
        f^l_j = v\Big(\sum_i G^l_{ij} f^{l-1}_i,\; f^{l-1}_j\Big), \quad l = 1..L

    one :class:`GlomoConv` per layer (multi-head: head :math:`h` aggregates
    the :math:`h`-th chunk of the channels with :math:`G^{l,h}`).

    With ``decouple=False`` (the "-decouple" ablation of paper Table 2) the
    graphs are not given but computed from the network's own states, layer by
    layer, self-attention style: :math:`G^l` is scored from :math:`F^{l-1}`.

    Args:
        num_tokens / in_channels: input kind, as for :class:`GraphPredictor`.
        hidden_channels (int): feature width, divisible by ``heads``.
        num_layers (int): number of graph layers :math:`L`.
        heads (int): graphs per layer.
        update (str): ``'gru'`` or ``'residual'`` (see :class:`GlomoConv`).
        decouple (bool): graphs come from a separate predictor (the paper).
            ``False`` makes this module score its own graphs.
        pixel_mean, pixel_std: per-channel statistics for uint8 pixel input
            (see :class:`UnitEncoder`).
        pooled_context (bool): an extension of the paper: every layer also adds
            :math:`W_l \bar f^{l-1}_j`, the mean of :math:`f^{l-1}` over the target's
            allowed sources, through a zero-initialised linear map (docs/training.md).
            (default: :obj:`False`)
        local_context (int): an extension of the paper: every layer also adds
            :math:`W_l [f^{l-1}_{j-1}; \dots; f^{l-1}_{j-k}]`, the target's :math:`k`
            nearest units on its allowed side, through a zero-initialised linear map
            (docs/training.md). (default: :obj:`0`)
        scorer_kwargs: options of the internal :class:`GraphScorer` when
            ``decouple=False`` (``direction``, ``sparse``, ``bias``, ...).

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
        self.dropout = dropout
        self.decouple = decouple
        self.scorer = None
        if not decouple:
            scorer_kwargs["head_channels"] = resolve_head_channels(
                hidden_channels, heads, scorer_kwargs.get("head_channels"))
            self.scorer = GraphScorer(hidden_channels, num_layers, heads, **scorer_kwargs)

    @property
    def embedding(self) -> Optional[torch.nn.Embedding]:
        return self.encoder.embedding

    def reset_parameters(self):
        self.encoder.reset_parameters()
        for conv in self.convs:
            conv.reset_parameters()
        for lin in [*(self.pooled or ()), *(self.local or ())]:
            torch.nn.init.zeros_(lin.weight)  # untrained: the paper's network
        if self.scorer is not None:
            self.scorer.reset_parameters()

    layout: str = "sparse"  # of the graphs a decouple=False scorer emits (run time)

    def set_layout(self, layout: str) -> "FeaturePredictor":
        """Layout of the graphs the ``decouple=False`` scorer emits (not saved)."""
        check_layout(layout)
        self.layout = layout
        return self

    def forward(self, x: Tensor, graphs: Optional[LatentGraphs] = None,
                batch: Optional[Tensor] = None) -> Tuple[Tensor, LatentGraphs]:
        self.encoder.check(x)
        sequences = sequence_batch(x.size(0), batch, x.device)
        if graphs is not None:
            if not isinstance(graphs, LatentGraphs):
                raise TypeError(f"graphs must be LatentGraphs, got {type(graphs).__name__}")
            if graphs.device != x.device or not torch.equal(graphs.ptr, sequences.ptr):
                raise ValueError(f"graphs were emitted for another batch layout (ptr differs) "
                                 f"or device (graphs on {graphs.device}, x on {x.device})")
        return self.from_sequences(x, sequences, graphs)

    def from_sequences(self, x: Tensor, sequences: SequenceBatch,
                       graphs: Optional[LatentGraphs] = None,
                       layout: Optional[str] = None) -> Tuple[Tensor, LatentGraphs]:
        """Top-layer features and the graphs used, for an already validated batch."""
        shape = None if graphs is None else (graphs.num_layers, graphs.num_heads, graphs.num_nodes)
        if shape != ((self.num_layers, self.heads, x.size(0)) if self.decouple else None):
            raise ValueError(f"this FeaturePredictor propagates along given graphs of "
                             f"{self.num_layers} layers x {self.heads} heads over the "
                             f"{x.size(0)} units of x (pass graphs=GraphPredictor(...)(x, "
                             f"batch); decouple=False computes its own graphs: do not pass "
                             f"graphs); got (layers, heads, units) = {shape}")
        f = torch.nn.functional.dropout(self.encoder.encode(x), self.dropout, self.training)
        emitted = []
        for l, conv in enumerate(self.convs):
            if self.scorer is not None:  # graph layer l scored from F^{l-1}
                padded = sequences.to_padded(f)
                emitted.append(self.scorer.emit(padded, padded, sequences, layout or self.layout,
                                                [l]))
                layer, index = emitted[-1], 0
            else:
                layer, index = graphs, l
            out = conv.propagate_graphs(f, layer, index)
            if self.pooled is not None:
                out = out + self.pooled[l](context_mean(f, sequences, layer.direction,
                                                        layer.include_self))
            if self.local is not None:
                out = out + self.local[l](nearest_sources(f, sequences, layer.direction,
                                                          self.local_context))
            f = torch.nn.functional.dropout(out, self.dropout, self.training)
        if self.scorer is not None:
            meta = dict(direction=self.scorer.direction, sequences=sequences,
                        include_self=self.scorer.include_self)
            storages = [g.storages[0] for g in emitted]
            if len({type(s) for s in storages}) > 1:  # 'auto' chose per layer: edges for all
                storages = [EdgeStorage(*g.layer(0)) for g in emitted]
            graphs = LatentGraphs.from_storage(storages, num_heads=self.heads, **meta)
        return f, graphs

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.encoder!r}, hidden_channels="
                f"{self.hidden_channels}, num_layers={self.num_layers}, heads={self.heads}, "
                f"decouple={self.decouple})")


class FeatureGraphEmitter(FeaturePredictor, GraphEmitter):
    r"""The graphs of the "-decouple" ablation (paper Table 2) as a graph emitter: a
    :class:`FeaturePredictor` with ``decouple=False``, whose graph layer :math:`l` is
    scored from its own features :math:`F^{l-1}`. It is both the feature predictor
    that :class:`~glomo_pyg.Glomo` trains in that ablation and the emitter that
    transfer uses afterwards (:meth:`emit` runs the network and keeps the graphs).

    Args: as :class:`FeaturePredictor`, without ``decouple``; ``scorer_kwargs``
    (``direction``, ``sparse``, ``bias``, ``include_self``, ...) go to the scorer.

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

    @property
    def direction(self) -> str:
        return self.scorer.direction

    @property
    def include_self(self) -> bool:
        return self.scorer.include_self

    def emit(self, x: Tensor, sequences: SequenceBatch, layout: Optional[str] = None,
             return_column_max: bool = False) -> EmitResult:
        if return_column_max:
            raise ValueError("the keep-alive penalty applies to decoupled graph predictors")
        return self.from_sequences(x, sequences, layout=layout)[1]

    forward = GraphEmitter.forward
