"""The paper's text-classification setting (Sec. 4.1, IMDB), with GLoMo graphs added at
the embeddings and/or after the first recurrent layer."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple, cast

import torch
from torch import Tensor

from glomo_pyg.graphs import DirectionalGraphs, LatentGraphs
from glomo_pyg.nn.pretrained import PretrainedGraphPredictor
from glomo_pyg.nn.resets import reset_children
from glomo_pyg.nn.transfer import GRAPHS, GlomoTransfer
from glomo_pyg.ordering import DIRECTIONS
from glomo_pyg.sequences import SequenceBatch, sequence_batch

PLACES = ("embedding", "rnn")
RNNS = ("gru", "lstm")


class GlomoTextClassifier(torch.nn.Module):
    r"""Sequence classifier of the paper's IMDB experiments, one code path for every
    variant (docs/text.md).

    .. math::
        E = \mathrm{emb}(x) \;\to\; [E ; \mathrm{gate}(E, M E)]^{\text{(embedding)}}
        \;\to\; \mathrm{BiRNN}_1 \;\to\; [R ; \mathrm{gate}(R, M R)]^{\text{(rnn)}}
        \;\to\; \mathrm{BiRNN}_{2..} \;\to\; \mathrm{SelfAttn} \;\to\;
        [\max ; \mathrm{mean}] \;\to\; \mathrm{MLP}

    ``predictor=None`` or ``places=()`` is the feature-only baseline. Both places share
    the batch's graphs; :class:`TextGraphCache` computes them once for fixed documents.

    Args:
        embedding (Tensor): ``[V, d]`` initial word vectors; row ``padding_idx`` is padding.
        num_classes (int): output classes.
        predictor (PretrainedGraphPredictor, optional): frozen graph predictor over the
            same vocabulary.
        places (sequence of str): where graphs are added: ``'embedding'``, ``'rnn'``.
        graph, mixing, max_distance: of :class:`GlomoTransfer`.
        hidden_channels (int): RNN width per direction.
        rnn (str): ``'gru'`` or ``'lstm'``.
        rnn_layers (int): recurrent layers (>= 2 with ``'rnn'`` in places; 0: none).
        attention_heads (int): heads of the self-attention layer.
        freeze_embedding (bool): keep the word vectors fixed.
        dropout (float): dropout probability of every layer (embedding, RNN, attention,
            classifier).

    Shapes:
        - **input:** token ids :math:`(N)` (flat, int64 or int32), sorted ``batch`` :math:`(N)`,
          optionally precomputed ``graphs`` over the same :math:`N` units
          (:class:`~glomo_pyg.DirectionalGraphs`, e.g. from :meth:`TextGraphCache.graphs`)
        - **output:** logits :math:`(B, \text{num\_classes})`
    """

    def __init__(self, embedding: Tensor, num_classes: int = 2,
                 predictor: Optional[PretrainedGraphPredictor] = None,
                 places: Sequence[str] = ("embedding",), graph: str = "learned",
                 hidden_channels: int = 128, rnn: str = "gru", rnn_layers: int = 2,
                 attention_heads: int = 4, freeze_embedding: bool = True, dropout: float = 0.2,
                 mixing: str = "free", padding_idx: int = 0,
                 max_distance: Optional[int] = None):
        super().__init__()
        places = tuple(places) if predictor is not None else ()
        self._check_arguments(embedding, num_classes, predictor, places, graph,
                              hidden_channels, rnn, rnn_layers, attention_heads, dropout,
                              padding_idx)
        self.places, self.graph_kind, self.num_classes = places, graph, num_classes
        self.rnn_kind, self.padding_idx = rnn, padding_idx
        self.embedding = torch.nn.Embedding.from_pretrained(
            embedding.float(), freeze=freeze_embedding, padding_idx=padding_idx)
        # trainable word vectors are reset to the given ones (not part of the state dict)
        self.register_buffer("_given_embedding", None if freeze_embedding else
                             embedding.detach().float().clone(), persistent=False)
        d = embedding.size(1)
        mix: Dict[str, Any] = dict(graph=graph, mixing=mixing, max_distance=max_distance)
        given = cast(PretrainedGraphPredictor, predictor)  # (places is () without one)
        self.glomo_embedding = GlomoTransfer(given, d, **mix) if "embedding" in places \
            else None
        width = self.glomo_embedding.out_channels if self.glomo_embedding is not None else d
        cell = torch.nn.GRU if rnn == "gru" else torch.nn.LSTM
        self.rnns = torch.nn.ModuleList()
        self.glomo_rnn = GlomoTransfer(given, 2 * hidden_channels, **mix) \
            if "rnn" in places else None
        for layer in range(rnn_layers):
            self.rnns.append(cell(width, hidden_channels, batch_first=True, bidirectional=True))
            width = 2 * hidden_channels
            if layer == 0 and self.glomo_rnn is not None:
                width = self.glomo_rnn.out_channels
        # without RNN: the (fused) features mapped to the attention's width
        self.projection = torch.nn.Linear(width, 2 * hidden_channels) if rnn_layers == 0 \
            else None
        self.attention = torch.nn.MultiheadAttention(2 * hidden_channels, attention_heads,
                                                     dropout=dropout, batch_first=True)
        self.attention_norm = torch.nn.LayerNorm(2 * hidden_channels)
        self.dropout = torch.nn.Dropout(dropout)
        self.classifier = torch.nn.Sequential(
            torch.nn.Linear(4 * hidden_channels, hidden_channels), torch.nn.ReLU(),
            torch.nn.Dropout(dropout), torch.nn.Linear(hidden_channels, num_classes))

    def reset_parameters(self):
        """Re-initialise every trained part; the word vectors return to the given ones and
        the frozen graph predictor is kept (:meth:`GlomoTransfer.reset_parameters`)."""
        reset_children(self, keep=[self.embedding])
        if self._given_embedding is not None:
            with torch.no_grad():
                self.embedding.weight.copy_(self._given_embedding)

    @staticmethod
    def _check_arguments(embedding: Tensor, num_classes: int,
                         predictor: Optional[PretrainedGraphPredictor], places: Tuple[str, ...],
                         graph: str, hidden_channels: int, rnn: str, rnn_layers: int,
                         attention_heads: int, dropout: float, padding_idx: int) -> None:
        """``ValueError`` naming the first of the constructor's arguments that is invalid."""
        # NaN or Inf in the word vectors would give NaN logits, silently
        matrix = isinstance(embedding, Tensor) and embedding.dim() == 2 and \
            embedding.dtype.is_floating_point and embedding.numel() > 0 and \
            bool(torch.isfinite(embedding).all())
        vocab = embedding.size(0) if matrix else 0

        def integer(value, low: int) -> bool:
            return not isinstance(value, bool) and isinstance(value, int) and value >= low

        for name, value, ok, must in (
                ("embedding", (tuple(embedding.shape), embedding.dtype)
                 if isinstance(embedding, Tensor) else type(embedding).__name__, matrix,
                 "be a float [V, d] matrix without NaN or Inf"),
                ("places", places, set(places) <= set(PLACES), f"be among {PLACES}"),
                ("rnn", rnn, rnn in RNNS, f"be one of {RNNS}"),
                ("graph", graph, graph in GRAPHS, f"be one of {GRAPHS}"),
                ("num_classes", num_classes, integer(num_classes, 2), "be an integer >= 2"),
                ("rnn_layers", rnn_layers, integer(rnn_layers, 2 if "rnn" in places else 0),
                 "be an integer >= 0, and >= 2 for graphs after the first RNN layer "
                 "(places 'rnn' needs rnn_layers >= 2)"),
                ("hidden_channels", hidden_channels, integer(hidden_channels, 1),
                 "be an integer >= 1"),
                ("attention_heads", attention_heads, integer(attention_heads, 1) and
                 not (integer(hidden_channels, 1) and (2 * hidden_channels) % attention_heads),
                 "be an integer >= 1 that divides the BiRNN's width (2 x hidden_channels "
                 "must be divisible by attention_heads)"),
                ("dropout", dropout, 0.0 <= dropout < 1.0, "lie in [0, 1)"),
                ("predictor", predictor, predictor is None or predictor.num_tokens == vocab,
                 f"read the classifier's vocabulary ({vocab} rows of embedding), not features "
                 f"or another vocabulary"),
                ("padding_idx", padding_idx,
                 padding_idx is None or integer(padding_idx, -vocab) and padding_idx < vocab,
                 f"be a row of the embedding, in [0, {vocab}) (or negative from the end)")):
            if not ok:
                raise ValueError(f"{name} must {must}, got {value!r}")

    @property
    def predictor(self) -> Optional[PretrainedGraphPredictor]:
        return None if self.transfer is None else self.transfer.predictor

    def _rnn(self, rnn, flat: Tensor, seqs) -> Tensor:
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            seqs.to_padded(flat), seqs.lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = rnn(packed)
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True,
                                                        total_length=seqs.max_len)
        return seqs.to_flat(out)

    @property
    def transfer(self) -> Optional[GlomoTransfer]:
        """The :class:`GlomoTransfer` whose graphs every place shares (``None``: no graphs)."""
        return self.glomo_embedding or self.glomo_rnn

    def _given_graphs(self, graphs: DirectionalGraphs, seqs: SequenceBatch) -> DirectionalGraphs:
        """Graphs passed to :meth:`forward`, checked against the batch they must cover."""
        if not isinstance(graphs, tuple) or len(graphs) != 2 or \
                any(g is not None and not isinstance(g, LatentGraphs) for g in graphs):
            raise TypeError(f"graphs must be DirectionalGraphs (forward, backward), got "
                            f"{type(graphs).__name__}")
        present = tuple(d for d, g in zip(DIRECTIONS, graphs) if g is not None)
        wanted = () if self.transfer is None or self.transfer.graph == "none" else \
            tuple(self.transfer.predictor.directions)
        other = next((g for g in graphs if g is not None and (
            g.num_nodes != seqs.num_nodes or g.device != seqs.ptr.device or
            not torch.equal(g.ptr, seqs.ptr))), None)
        if present != wanted or other is not None:
            raise ValueError(
                f"graphs hold the directions {present}, the classifier mixes {wanted} (none: "
                f"predictor=None, places=() or graph='none' mixes no graphs: do not pass)"
                if present != wanted else
                f"graphs cover {cast(LatentGraphs, other).num_nodes} units on "
                f"{cast(LatentGraphs, other).device}, x has {seqs.num_nodes} on "
                f"{seqs.ptr.device}: they were computed for other reviews than this batch's")
        return DirectionalGraphs(*graphs)

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                graphs: Optional[DirectionalGraphs] = None) -> Tensor:
        """``graphs``: this batch's graphs computed beforehand (:class:`TextGraphCache`),
        for the same reviews in the same order (checked: one device sync)."""
        vocab = self.embedding.num_embeddings
        ids = isinstance(x, Tensor) and x.dtype in (torch.int64, torch.int32) and x.dim() == 1
        low, high = torch.stack(torch.aminmax(x)).tolist() if ids and x.numel() else (0, 0)
        # (an empty x is refused by sequence_batch; empty sequences would pool to NaN)
        seqs = sequence_batch(x.size(0), batch, x.device) if ids else None
        if not ids or low < 0 or high >= vocab or min(cast(SequenceBatch, seqs).sizes) < 1:
            got = f"{x.dtype} of shape {tuple(x.shape)}" if isinstance(x, Tensor) else \
                type(x).__name__
            if ids:
                got += f", values in [{low}, {high}], shortest sequence " \
                    f"{min(cast(SequenceBatch, seqs).sizes)}"
            raise ValueError(f"x must be flat int64 or int32 token ids [N], at least one per "
                             f"sequence: token ids must lie in [0, {vocab}), got {got}")
        assert seqs is not None  # (ids)
        if graphs is not None:
            graphs = self._given_graphs(graphs, seqs)
        elif self.transfer is not None:
            graphs = self.transfer.graphs(x, seqs.batch, num_nodes=x.size(0))
        h = self.dropout(self.embedding(x))
        if self.glomo_embedding is not None:
            h = self.glomo_embedding(h, graphs=graphs)
        for layer, rnn in enumerate(self.rnns):
            h = self.dropout(self._rnn(rnn, h, seqs))
            if layer == 0 and self.glomo_rnn is not None:
                h = self.glomo_rnn(h, graphs=graphs)
        if self.projection is not None:
            h = self.dropout(torch.relu(self.projection(h)))
        padded, mask = seqs.to_padded(h), seqs.mask
        attended, _ = self.attention(padded, padded, padded, key_padding_mask=~mask,
                                     need_weights=False)
        padded = self.attention_norm(padded + attended)
        pooled_max = padded.masked_fill(~mask.unsqueeze(-1), torch.finfo(padded.dtype).min).amax(1)
        pooled_mean = (padded * mask.unsqueeze(-1)).sum(1) / seqs.lengths.unsqueeze(-1)
        return self.classifier(self.dropout(torch.cat([pooled_max, pooled_mean], -1)))

    def __repr__(self) -> str:
        t = self.transfer
        return (f"{self.__class__.__name__}(vocab={self.embedding.num_embeddings}, "
                f"classes={self.num_classes}, "
                f"rnn={f'{self.rnn_kind}x{len(self.rnns)}' if self.rnns else 'none'}, "
                f"places={self.places}, graph='{self.graph_kind}'"
                + ("" if t is None or t.max_distance is None else
                   f", max_distance={t.max_distance}") + ")")
