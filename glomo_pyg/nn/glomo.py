"""The GLoMo pretraining model: graph and feature predictors and context decoders for
both directions (paper Sec. 2.1)."""
from __future__ import annotations

import copy
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Union,
    cast,
)

import torch
from torch import Tensor

from glomo_pyg.graphs import DIRECTION_KEYS as _KEY
from glomo_pyg.graphs import DirectionalGraphs, LatentGraphs
from glomo_pyg.nn.decoder import IGNORE, ContextDecoder
from glomo_pyg.nn.emitter import GraphEmitter, ScoredEmitter
from glomo_pyg.nn.encoder import UnitEncoder
from glomo_pyg.nn.feature_predictor import FeatureGraphEmitter, FeaturePredictor
from glomo_pyg.nn.graph_predictor import GraphPredictor
from glomo_pyg.nn.pretrained import PretrainedGraphPredictor
from glomo_pyg.nn.resets import reset_children
from glomo_pyg.nn.scorer import resolve_head_channels
from glomo_pyg.nn.settings import IMAGE_DEFAULTS as _I
from glomo_pyg.nn.settings import TEXT_DEFAULTS as _T
from glomo_pyg.nn.settings import check_model_setting
from glomo_pyg.ordering import DIRECTIONS
from glomo_pyg.sequences import SequenceBatch, sequence_batch

if TYPE_CHECKING:
    from glomo_pyg.nn.pixel import PixelContextHead

EMBEDDING_PARTS = ("graph", "features")  # set_token_embeddings: g's and f's embeddings


class GlomoOutput(NamedTuple):
    """Loss to minimise and detached metrics (per direction and averaged)."""

    loss: Tensor
    metrics: Dict[str, Tensor]


class Glomo(torch.nn.Module):
    r"""Unsupervised GLoMo pretraining by context prediction (paper Sec. 2.1, Eq. 3).

    Per direction, a graph emitter :math:`g` emits graphs, a :class:`FeaturePredictor`
    :math:`f` propagates embeddings along them (paper Eq. 2), and a context head
    initialised with :math:`f^L_t` predicts the next (forward) or previous (backward)
    :math:`D` units at ``num_positions`` sampled positions per sequence (all in eval
    mode). The loss is the mean of the directions' cross-entropies. :meth:`text` and
    :meth:`image` build the paper's models; the ablations of paper Table 2 are switches
    of :meth:`text` (docs/design.md).

    Args:
        feature_predictors (mapping): direction (``'forward'``, ``'backward'``) ->
            :class:`FeaturePredictor`.
        context_heads (mapping): direction -> context head (:class:`ContextDecoder`,
            :class:`PixelContextHead`, or a module with their ``targets``, ``loss`` and
            ``context_length``).
        emitters (mapping, optional): direction -> graph emitter; ``None`` when the
            feature predictors score their own graphs (``decouple=False``).
        num_positions (int): positions sampled per sequence while training.
            (default: :obj:`20`)
        objective (str): ``'unit'`` or ``'sequence'``. (default: :obj:`'unit'`)
        keep_alive (float): weight :math:`\lambda` of a keep-alive penalty (an
            extension, docs/training.md): while training, the loss gains :math:`\lambda`
            times the mean over layers, heads and targets of
            :math:`\max(0, \delta - \max_i s_{ij})`. (default: :obj:`0.`)
        keep_alive_margin (float): :math:`\delta`. (default: :obj:`0.1`)
        entropy_penalty (float): weight :math:`\mu` of a sharpness penalty (an
            extension, docs/training.md): while training, the loss gains :math:`\mu`
            times the mean normalised entropy of the targets' incoming weights
            (:meth:`LatentGraphs.column_entropy`). (default: :obj:`0.`)

    Shapes:
        - **input:** token ids :math:`(N)`, sorted batch vector :math:`(N)`
        - **output:** :class:`GlomoOutput` (scalar loss, metrics)
    """

    def __init__(self, feature_predictors: Mapping[str, FeaturePredictor],
                 context_heads: Mapping[str, Union[ContextDecoder, PixelContextHead]],
                 emitters: Optional[Mapping[str, GraphEmitter]] = None, *,
                 num_positions: int = _T.num_positions, objective: str = _T.objective,
                 keep_alive: float = _T.keep_alive,
                 keep_alive_margin: float = _T.keep_alive_margin,
                 entropy_penalty: float = _T.entropy_penalty):
        super().__init__()
        directions = tuple(d for d in DIRECTIONS if d in feature_predictors)
        if not directions or set(feature_predictors) - set(DIRECTIONS) or \
                set(context_heads) != set(directions) or \
                (emitters is not None and set(emitters) != set(directions)):
            raise ValueError(f"feature_predictors must map a non-empty subset of {DIRECTIONS} "
                             f"to feature predictors, and context_heads must cover the same "
                             f"directions (emitters too); got {sorted(feature_predictors)}, "
                             f"{sorted(context_heads)}"
                             + (f", {sorted(emitters)}" if emitters is not None else ""))
        num_positions, objective, keep_alive, keep_alive_margin, entropy_penalty = (
            check_model_setting(name, value) for name, value in (
                ("num_positions", num_positions), ("objective", objective),
                ("keep_alive", keep_alive), ("keep_alive_margin", keep_alive_margin),
                ("entropy_penalty", entropy_penalty)))
        for d in directions:
            fp = feature_predictors[d]
            g = fp if emitters is None else emitters[d]
            if not isinstance(fp, FeaturePredictor) or \
                    (emitters is not None and not isinstance(g, GraphEmitter)):
                raise TypeError(f"the {d} feature predictor must be a FeaturePredictor and its "
                                f"emitter a GraphEmitter, got {type(fp).__name__} and "
                                f"{type(g).__name__}")
            if not isinstance(g, GraphEmitter) or \
                    (g.num_layers, g.heads, g.direction) != (fp.num_layers, fp.heads, d):
                got = f"{g.num_layers} layers x {g.heads} heads built for direction " \
                    f"{g.direction!r}" if isinstance(g, GraphEmitter) else type(g).__name__
                raise ValueError(f"the {d} emitter must be a GraphEmitter for direction {d!r} "
                                 f"with its feature predictor's {fp.num_layers} layers x "
                                 f"{fp.heads} heads, got {got}" + (
                                     "; without emitters the feature predictors must score "
                                     "their own graphs (FeatureGraphEmitter, decouple=False)"
                                     if emitters is None else ""))
        if keep_alive and (emitters is None or
                           not all(cast(ScoredEmitter, emitters[d]).scorer.sparse
                                   for d in directions)):
            raise ValueError("keep_alive applies to the squared-ReLU graphs (sparse=True) of a "
                             "graph predictor g (decouple=True); softmax graphs have no empty "
                             "columns")
        self.keep_alive, self.keep_alive_margin = keep_alive, keep_alive_margin
        self.entropy_penalty = entropy_penalty
        self.num_positions, self.objective = num_positions, objective
        self.directions = directions
        self.decouple = emitters is not None
        self.num_tokens = feature_predictors[directions[0]].encoder.num_tokens
        self.context_length = context_heads[directions[0]].context_length
        self.graph_predictors = torch.nn.ModuleDict(
            {_KEY[d]: emitters[d] for d in directions} if emitters is not None else {})
        self.feature_predictors = torch.nn.ModuleDict({_KEY[d]: feature_predictors[d]
                                                       for d in directions})
        self.decoders = torch.nn.ModuleDict({_KEY[d]: context_heads[d] for d in directions})

    def reset_parameters(self):
        """Re-initialise every part (graph predictors, feature predictors, context heads);
        word vectors given with :meth:`set_token_embeddings` must be set again."""
        reset_children(self)

    @classmethod
    def text(cls, num_tokens: int, hidden_channels: int = _T.hidden_channels,
             num_layers: int = _T.num_layers, heads: int = _T.heads,
             head_channels: Optional[int] = _T.head_channels,
             context_length: int = _T.context_length, num_positions: int = _T.num_positions,
             update: str = _T.update, decoder_layers: int = _T.decoder_layers,
             cnn_layers: int = _T.cnn_layers, kernel_size: int = _T.kernel_size,
             norm: Optional[str] = _T.norm, bias: str = _T.bias,
             include_self: bool = _T.include_self, sparse: bool = _T.sparse,
             decouple: bool = _T.decouple, objective: str = _T.objective,
             bidirectional: bool = _T.bidirectional, dropout: float = _T.dropout,
             padding_idx: Optional[int] = _T.padding_idx, block_size: int = _T.block_size,
             position: Optional[str] = _T.position,
             position_frequencies: int = _T.position_frequencies,
             position_period: float = _T.position_period, keep_alive: float = _T.keep_alive,
             keep_alive_margin: float = _T.keep_alive_margin,
             entropy_penalty: float = _T.entropy_penalty, pooled_context: bool = _T.pooled_context,
             local_context: int = _T.local_context) -> "Glomo":
        r"""The paper's text model over a vocabulary of ``num_tokens`` token ids.

        Per direction: a :class:`GraphPredictor` (paper Eq. 1), a
        :class:`FeaturePredictor` and a :class:`ContextDecoder` tied to its embedding.

        Args:
            hidden_channels (int): width of embeddings, CNNs and features.
            context_length (int): :math:`D`.
            update (str): ``'gru'`` or ``'residual'``.
            bidirectional (bool): train the backward network too.
            decouple (bool): ``False`` is the "-decouple" ablation.
            pooled_context (bool), local_context (int): extensions of :math:`f`, see
                :class:`FeaturePredictor`.

        Others as in :class:`GraphPredictor`, :class:`ContextDecoder` and
        :class:`Glomo`; defaults: :data:`~glomo_pyg.nn.settings.TEXT_DEFAULTS`.
        """
        check_model_setting("decoder_layers", decoder_layers)
        head_channels = resolve_head_channels(hidden_channels, heads, head_channels)
        directions = ("forward", "backward") if bidirectional else ("forward",)
        scorer: Dict[str, Any] = dict(
            head_channels=head_channels, include_self=include_self, sparse=sparse, bias=bias,
            block_size=block_size, position=position,
            position_frequencies=position_frequencies, position_period=position_period)
        shared: Dict[str, Any] = dict(
            num_tokens=num_tokens, hidden_channels=hidden_channels, num_layers=num_layers,
            heads=heads, padding_idx=padding_idx, dropout=dropout)
        f_kwargs: Dict[str, Any] = dict(shared, update=update, pooled_context=pooled_context,
                                        local_context=local_context)
        emitters, features, decoders = {}, {}, {}
        for d in directions:
            if decouple:
                emitters[d] = GraphPredictor(direction=d, cnn_layers=cnn_layers,
                                             kernel_size=kernel_size, norm=norm, **shared, **scorer)
                features[d] = FeaturePredictor(decouple=True, **f_kwargs)
            else:
                features[d] = FeatureGraphEmitter(direction=d, **f_kwargs, **scorer)
            decoders[d] = ContextDecoder(features[d].embedding, hidden_channels, context_length,
                                         decoder_layers, dropout)
        return cls(features, decoders, emitters if decouple else None,
                   num_positions=num_positions, objective=objective, keep_alive=keep_alive,
                   keep_alive_margin=keep_alive_margin, entropy_penalty=entropy_penalty)

    @classmethod
    def image(cls, height: int = _I.height, width: int = _I.width,
              in_channels: int = cast(int, _I.in_channels),
              hidden_channels: int = _I.hidden_channels,
              num_layers: int = _I.num_layers, heads: int = _I.heads,
              head_channels: Optional[int] = _I.head_channels,
              num_positions: int = _I.num_positions, update: str = _I.update,
              cnn_layers: int = _I.cnn_layers, kernel_size: int = _I.kernel_size,
              bias: str = _I.bias, include_self: bool = _I.include_self, sparse: bool = _I.sparse,
              bidirectional: bool = _I.bidirectional, dropout: float = _I.dropout,
              position: Optional[str] = _I.position,
              position_frequencies: int = _I.position_frequencies,
              position_period: float = _I.position_period,
              pixel_mean: Sequence[float] = cast(Sequence[float], _I.pixel_mean),
              pixel_std: Sequence[float] = cast(Sequence[float], _I.pixel_std),
              keep_alive: float = _I.keep_alive,
              keep_alive_margin: float = _I.keep_alive_margin,
              entropy_penalty: float = _I.entropy_penalty) -> "Glomo":
        r"""The pixel model of paper Sec. 3.5 over ``height x width`` images with
        ``in_channels`` uint8 channels (units from :func:`glomo_pyg.pixels.image_units`).

        Per direction: a :class:`PixelGraphPredictor`, a :class:`FeaturePredictor` over
        the normalised pixels, and a :class:`PixelContextHead`.

        Args:
            position (str, optional): ``'grid'``: a learned (row, column) offset term
                in the graph scores (an extension, see :class:`GraphScorer`).
            pixel_mean, pixel_std: per-channel statistics on a [0, 1] scale.

        Others as in :meth:`text`, :class:`PixelGraphPredictor` and :class:`Glomo`;
        defaults: :data:`~glomo_pyg.nn.settings.IMAGE_DEFAULTS`.
        """
        from glomo_pyg.nn.pixel import PixelContextHead, PixelGraphPredictor

        head_channels = resolve_head_channels(hidden_channels, heads, head_channels)
        directions = ("forward", "backward") if bidirectional else ("forward",)
        emitters, features, heads_ = {}, {}, {}
        stats: Dict[str, Any] = dict(pixel_mean=list(pixel_mean), pixel_std=list(pixel_std))
        for d in directions:
            emitters[d] = PixelGraphPredictor(
                height, width, in_channels, hidden_channels, num_layers, heads, head_channels,
                direction=d, include_self=include_self, sparse=sparse, cnn_layers=cnn_layers,
                kernel_size=kernel_size, bias=bias, position=position,
                position_frequencies=position_frequencies, position_period=position_period,
                dropout=dropout, **stats)
            features[d] = FeaturePredictor(
                in_channels=in_channels, hidden_channels=hidden_channels, num_layers=num_layers,
                heads=heads, update=update, decouple=True, dropout=dropout, **stats)
            heads_[d] = PixelContextHead(hidden_channels, height, width, in_channels, d)
        return cls(features, heads_, emitters, num_positions=num_positions, objective="unit",
                   keep_alive=keep_alive, keep_alive_margin=keep_alive_margin,
                   entropy_penalty=entropy_penalty)

    def emitter(self, direction: str) -> GraphEmitter:
        """The module that emits ``direction``'s graphs."""
        self._check_direction(direction)
        parts = self.graph_predictors if self.decouple else self.feature_predictors
        return cast(GraphEmitter, parts[_KEY[direction]])

    def set_layout(self, layout: str) -> "Glomo":
        """Emit graphs in ``layout`` from now on (same graphs; not part of the model)."""
        for d in self.directions:
            self.emitter(d).set_layout(layout)
        return self

    @torch.no_grad()
    def set_token_embeddings(self, weight: Tensor,
                             parts: Sequence[str] = EMBEDDING_PARTS) -> "Glomo":
        """Copy ``weight`` (``[num_tokens, hidden_channels]``, e.g. word vectors) into the
        token embeddings of ``parts`` in every direction: ``'graph'`` (g's) and
        ``'features'`` (f's, shared with the decoders). Padding rows stay zero."""
        if isinstance(parts, str) or not isinstance(parts, Sequence) or not parts or \
                any(p not in EMBEDDING_PARTS for p in parts) or len(set(parts)) != len(parts) \
                or (not self.decouple and len(parts) != len(EMBEDDING_PARTS)):
            raise ValueError(f"parts must be a non-empty sequence of distinct names from "
                             f"{EMBEDDING_PARTS} (with decouple=False the graphs come from f "
                             f"itself, so g has no embedding of its own: both), got {parts!r}")
        owners = ([self.graph_predictors] if "graph" in parts else []) + \
            ([self.feature_predictors] if "features" in parts else [])
        embeddings = [m.embedding for owner in owners for m in owner.modules()
                      if isinstance(m, UnitEncoder) and m.embedding is not None]
        if not embeddings:
            raise ValueError("this model reads features, not token ids: it has no token "
                             "embeddings to set")
        shape, target = tuple(embeddings[0].weight.shape), embeddings[0].weight.dtype
        valid = isinstance(weight, Tensor) and weight.is_floating_point() and \
            tuple(weight.shape) == shape and weight.layout == torch.strided and not weight.is_meta
        # finite as the embeddings will hold it: 1e300 in float64 is finite, not in float32
        if not valid or not torch.isfinite(weight.to(target)).all():
            got = "non-finite values" if valid else type(weight).__name__ if \
                not isinstance(weight, Tensor) else \
                f"{tuple(weight.shape)} {weight.dtype} {weight.layout} on {weight.device}"
            raise ValueError(f"weight must be a dense floating-point tensor of shape {shape} "
                             f"(num_tokens, hidden_channels), not on the meta device, with no "
                             f"NaN or infinite values and none beyond the range of the "
                             f"embeddings' {target}; got {got}")
        for embedding in embeddings:
            embedding.weight.copy_(weight)
            if embedding.padding_idx is not None:
                embedding.weight[embedding.padding_idx].zero_()
        return self

    def to_pretrained(self, vocabulary: Optional[Sequence[str]] = None,
                      trained_length: Optional[int] = None,
                      trained_size: Optional[Sequence[int]] = None,
                      lowercase: Optional[bool] = None) -> PretrainedGraphPredictor:
        """A copy of the graph-emitting parts as a :class:`PretrainedGraphPredictor` in
        eval mode (the paper discards :math:`f`); ``trained_length`` / ``trained_size``:
        the longest training sequence / the training images' (height, width);
        ``lowercase``: whether the vocabulary was built from lower-cased text."""
        parts = {d: copy.deepcopy(self.emitter(d)) for d in self.directions}
        return PretrainedGraphPredictor(parts.get("forward"), parts.get("backward"),
                                        vocabulary, trained_length, trained_size,
                                        lowercase).eval()

    def graph_parameters(self):
        """Parameters that only shape the graphs (g's, or the scorers with
        ``decouple=False``)."""
        for d in self.directions:
            emitter = self.emitter(d)
            yield from (emitter.parameters() if self.decouple else emitter.scorer.parameters())

    def graphs(self, x: Tensor, batch: Optional[Tensor] = None) -> DirectionalGraphs:
        """Forward and backward :class:`LatentGraphs` for the units ``x``."""
        sequences = self._sequences(x, batch)
        out = {d: cast(LatentGraphs, self.emitter(d).emit(x, sequences))
               for d in self.directions}
        return DirectionalGraphs(out.get("forward"), out.get("backward"))

    def features(self, x: Tensor, batch: Optional[Tensor] = None, direction: str = "forward"):
        """Top-layer features :math:`f^L` ``[N, C]`` and the graphs they used."""
        self._check_direction(direction)
        sequences = self._sequences(x, batch)
        return self._features(x, sequences, direction)[:2]

    def forward(self, x: Tensor, batch: Optional[Tensor] = None) -> GlomoOutput:
        sequences = self._sequences(x, batch)
        losses, metrics = [], {}
        for d in self.directions:
            f, graphs, column_max = self._features(x, sequences, d, self.training and
                                                   self.keep_alive > 0)
            positions = self._positions(sequences, d)
            if positions.numel() == 0:
                raise ValueError("nothing to predict: every sequence in the batch has length 1 "
                                 "(context prediction needs at least two units per sequence)")
            head = cast("Union[ContextDecoder, PixelContextHead]", self.decoders[_KEY[d]])
            targets = head.targets(x, sequences, positions, d)
            state = f if self.objective == "unit" else self._pooled(f, sequences, d)
            loss, correct = head.loss(state[positions], targets)
            total = loss
            if self.training and self.entropy_penalty > 0:
                entropy = graphs.column_entropy()
                entropy = entropy[~entropy.isnan()]  # targets with edges, >= 2 sources
                if entropy.numel():
                    metrics[f"{d}/column_entropy"] = entropy.detach().mean()
                    total = total + self.entropy_penalty * entropy.mean()
            if column_max is not None:
                m = torch.stack(column_max)  # [L, B, H, T]
                real = torch.isfinite(m)  # targets with allowed sources
                penalty = (self.keep_alive_margin - m[real]).clamp_min(0).mean()
                metrics[f"{d}/keep_alive"] = penalty.detach()
                metrics[f"{d}/empty_columns"] = (m[real] <= 0).float().mean()
                total = total + self.keep_alive * penalty
            losses.append(total)
            metrics[f"{d}/loss"] = loss.detach()
            metrics[f"{d}/accuracy"] = correct / (targets != IGNORE).sum()
            if graphs.layout != "fused":  # fused graphs hold no edges to count
                metrics[f"{d}/density"] = torch.tensor(sum(graphs.density()) /
                                                       graphs.num_layers)
        loss = torch.stack(losses).mean()
        metrics["loss"] = loss.detach()
        return GlomoOutput(loss, metrics)

    def _check_direction(self, direction: str) -> None:
        if direction not in self.directions:
            raise ValueError(f"direction must be one of {self.directions}, got {direction!r}")

    def _sequences(self, x: Tensor, batch: Optional[Tensor]) -> SequenceBatch:
        cast(FeaturePredictor, self.feature_predictors[_KEY[self.directions[0]]]).encoder.check(x)
        return sequence_batch(x.size(0), batch, x.device)

    def _features(self, x: Tensor, sequences: SequenceBatch, direction: str,
                  column_max: bool = False):
        """``(f^L, graphs, column maxima or None)`` of one direction."""
        graphs: Optional[LatentGraphs] = None
        maxima: Optional[List[Tensor]] = None
        if self.decouple:
            out = cast(GraphEmitter, self.graph_predictors[_KEY[direction]]).emit(
                x, sequences, return_column_max=column_max)
            graphs, maxima = cast("Tuple[LatentGraphs, Optional[List[Tensor]]]",
                                  out if column_max else (out, None))
        f, graphs = cast(FeaturePredictor, self.feature_predictors[_KEY[direction]]
                         ).from_sequences(x, sequences, graphs)
        return f, graphs, maxima

    def _positions(self, sequences: SequenceBatch, direction: str) -> Tensor:
        """Flat ids of positions with context ahead (training: ``num_positions`` per sequence)."""
        pos, length = sequences.position, sequences.lengths[sequences.batch]
        eligible = pos < length - 1 if direction == "forward" else pos > 0
        if not self.training:
            return eligible.nonzero().view(-1)
        # Random rank within each sequence: sort by (sequence, eligible first, random).
        noise = torch.rand(pos.shape, device=pos.device)
        key = sequences.batch.double() + torch.where(eligible, noise, noise.new_full((), 1.5)) / 2
        order = torch.argsort(key)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel(), device=order.device)
        rank = rank - sequences.ptr[sequences.batch]
        return (eligible & (rank < self.num_positions)).nonzero().view(-1)

    @staticmethod
    def _pooled(f: Tensor, sequences: SequenceBatch, direction: str) -> Tensor:
        """Mean of ``f`` over each position's prefix (forward) or suffix (backward)."""
        csum = torch.cat([f.new_zeros(1, f.size(1)), f.cumsum(0)])
        n = torch.arange(f.size(0), device=f.device)
        start = sequences.ptr[sequences.batch]
        if direction == "forward":
            total, count = csum[n + 1] - csum[start], sequences.position + 1
        else:
            length = sequences.lengths[sequences.batch]
            total, count = csum[start + length] - csum[n], length - sequences.position
        return total / count.view(-1, 1).to(f.dtype)

    def __repr__(self) -> str:
        fp = self.feature_predictors[_KEY[self.directions[0]]]
        return (f"{self.__class__.__name__}(num_tokens={self.num_tokens}, hidden_channels="
                f"{fp.hidden_channels}, num_layers={fp.num_layers}, heads={fp.heads}, "
                f"directions={self.directions}, context_length={self.context_length}, "
                f"objective='{self.objective}', decouple={self.decouple})")
