"""The paper's text-classification setting (Sec. 4.1, IMDB): word vectors -> BiGRU/BiLSTM
-> self-attention -> pooling -> classifier, with GLoMo graphs added at the embeddings
and/or after the first recurrent layer."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from glomo_pyg.nn.pretrained import PretrainedGraphPredictor
from glomo_pyg.nn.transfer import GRAPHS, GlomoTransfer
from glomo_pyg.sequences import sequence_batch

PLACES = ("embedding", "rnn")
RNNS = ("gru", "lstm")


class GlomoTextClassifier(torch.nn.Module):
    r"""Sequence classifier of the paper's IMDB experiments, one code path for every
    variant.

    .. math::
        E = \mathrm{emb}(x) \;\to\; [E ; \mathrm{gate}(E, M E)]^{\text{(embedding)}}
        \;\to\; \mathrm{BiRNN}_1 \;\to\; [R ; \mathrm{gate}(R, M R)]^{\text{(rnn)}}
        \;\to\; \mathrm{BiRNN}_{2..} \;\to\; \mathrm{SelfAttn} \;\to\;
        [\max ; \mathrm{mean}] \;\to\; \mathrm{MLP}

    Every baseline of the paper has the self-attention layer. With ``rnn_layers=0``
    (not a model of the paper) the features go through a linear map straight to the
    self-attention, which reads no word order: the model then sees order only through
    the graphs, a setting where transferred graphs add what the model cannot compute
    itself. Variants:

    * ``predictor=None`` (or ``places=()``): the feature-only baseline, no graphs;
    * ``places=('embedding',)``: GLoMo on the word vectors (paper Table 1);
    * ``places=('rnn',)`` or both: GLoMo on the first RNN layer's states;
    * ``graph='uniform'``: the same model with uniform graphs (Table 2);
    * ``graph='adjacent'``: graphs of the neighbouring word only, which the mixture
      chains to the nearest ``L`` words per direction (a control, not in the paper:
      does a learned graph transfer more than locality?);
    * a predictor pretrained under an ablation gives that ablation's row.

    Graphs are computed once per batch from the token ids (the predictor shares the
    classifier's vocabulary) and reused at every place.

    Args:
        embedding (Tensor): ``[V, d]`` initial word vectors (e.g. from
            :func:`~glomo_pyg.data.embedding_matrix`); row ``padding_idx`` is padding.
        num_classes (int): output classes.
        predictor (PretrainedGraphPredictor, optional): frozen graph predictor over the
            same vocabulary.
        places (sequence of str): where graphs are added: ``'embedding'``, ``'rnn'``.
        graph (str): ``'learned'``, ``'uniform'``, ``'adjacent'`` or ``'none'`` (see
            :class:`GlomoTransfer`).
        hidden_channels (int): RNN width per direction (the attention's width is twice
            it). rnn (str): ``'gru'`` or ``'lstm'`` (unused when ``rnn_layers=0``).
        rnn_layers (int): recurrent layers (>= 2 when graphs go after the first; 0: none,
            see above).
        attention_heads (int): heads of the self-attention layer.
        freeze_embedding (bool): keep the word vectors fixed (the "transfer feature" is
            used as is). dropout (float): on embeddings, RNN outputs (or the linear map
            that replaces them) and the classifier.
        mixing (str): mixture weights of :class:`GlomoTransfer`.
        max_distance (int, optional): the longest edge kept in the graphs (see
            :class:`GlomoTransfer`); default: no limit.

    Shapes:
        - **input:** token ids :math:`(N)` (flat, int64 or int32), sorted ``batch`` :math:`(N)`
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
        bad = [p for p in places if p not in PLACES]
        if bad:
            raise ValueError(f"places must be among {PLACES}, got {bad}")
        if rnn not in RNNS:
            raise ValueError(f"rnn must be one of {RNNS}, got {rnn!r}")
        if graph not in GRAPHS:
            raise ValueError(f"graph must be one of {GRAPHS}, got {graph!r}")
        for name, value, low in (("num_classes", num_classes, 2), ("rnn_layers", rnn_layers, 0),
                                 ("hidden_channels", hidden_channels, 1),
                                 ("attention_heads", attention_heads, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if (2 * hidden_channels) % attention_heads:  # the BiRNN's 2 x hidden feeds attention
            raise ValueError(f"2 x hidden_channels ({2 * hidden_channels}) must be divisible by "
                             f"attention_heads ({attention_heads})")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout!r}")
        if "rnn" in places and rnn_layers < 2:
            raise ValueError("graphs after the first RNN layer need rnn_layers >= 2")
        if embedding.dim() != 2 or not embedding.dtype.is_floating_point or \
                embedding.size(0) < 1 or embedding.size(1) < 1:
            raise ValueError(f"embedding must be a float [V, d] matrix, got "
                             f"{tuple(embedding.shape)} {embedding.dtype}")
        if not bool(torch.isfinite(embedding).all()):  # NaN logits otherwise, silently
            raise ValueError("embedding holds NaN or Inf values")
        if predictor is not None and predictor.num_tokens is None:
            raise ValueError("the predictor reads features, not token ids: a text classifier "
                             "needs a predictor pretrained on its vocabulary")
        if predictor is not None and predictor.num_tokens != embedding.size(0):
            raise ValueError(f"the predictor's vocabulary ({predictor.num_tokens} tokens) must "
                             f"be the classifier's ({embedding.size(0)} rows of embedding)")
        vocab = embedding.size(0)
        if padding_idx is not None and (isinstance(padding_idx, bool) or
                                        not isinstance(padding_idx, int) or
                                        not -vocab <= padding_idx < vocab):
            raise ValueError(f"padding_idx must be a row of the embedding, in [0, {vocab}) (or "
                             f"negative from the end), got {padding_idx!r}")
        self.places, self.graph_kind, self.num_classes = places, graph, num_classes
        self.rnn_kind, self.padding_idx = rnn, padding_idx
        self.embedding = torch.nn.Embedding.from_pretrained(
            embedding.float(), freeze=freeze_embedding, padding_idx=padding_idx)
        d = embedding.size(1)
        self.glomo_embedding = GlomoTransfer(predictor, d, graph=graph, mixing=mixing,
                                             max_distance=max_distance) \
            if "embedding" in places else None
        width = self.glomo_embedding.out_channels if self.glomo_embedding is not None else d
        cell = torch.nn.GRU if rnn == "gru" else torch.nn.LSTM
        self.rnns = torch.nn.ModuleList()
        self.glomo_rnn = GlomoTransfer(predictor, 2 * hidden_channels, graph=graph,
                                       mixing=mixing, max_distance=max_distance) \
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

    @property
    def predictor(self) -> Optional[PretrainedGraphPredictor]:
        for module in (self.glomo_embedding, self.glomo_rnn):
            if module is not None:
                return module.predictor
        return None

    def _rnn(self, rnn, flat: Tensor, seqs) -> Tensor:
        padded = seqs.to_padded(flat)
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            padded, seqs.lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = rnn(packed)
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True,
                                                        total_length=seqs.max_len)
        return seqs.to_flat(out)

    def forward(self, x: Tensor, batch: Optional[Tensor] = None) -> Tensor:
        if not isinstance(x, Tensor) or x.dtype not in (torch.int64, torch.int32) or \
                x.dim() != 1:  # (the integer types an embedding indexes with, as in Glomo)
            raise ValueError("x must be flat int64 or int32 token ids [N], got "
                             + (f"{x.dtype} of shape {tuple(x.shape)}" if isinstance(x, Tensor)
                                else type(x).__name__))
        if x.numel() and (int(x.min()) < 0 or int(x.max()) >= self.embedding.num_embeddings):
            raise ValueError(f"token ids must lie in [0, {self.embedding.num_embeddings}), got "
                             f"[{int(x.min())}, {int(x.max())}]")
        seqs = sequence_batch(x.size(0), batch, x.device)
        if seqs.num_sequences == 0 or int(seqs.lengths.min()) < 1:
            raise ValueError("every sequence needs at least one token")
        # one set of graphs per batch, shared by both places (None for graph='none',
        # which needs none)
        transfer = self.glomo_embedding or self.glomo_rnn
        graphs = transfer.graphs(x, seqs.batch, num_nodes=x.size(0)) \
            if transfer is not None else None
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
        neg = torch.finfo(padded.dtype).min
        pooled_max = padded.masked_fill(~mask.unsqueeze(-1), neg).amax(1)
        pooled_mean = (padded * mask.unsqueeze(-1)).sum(1) / seqs.lengths.unsqueeze(-1)
        return self.classifier(self.dropout(torch.cat([pooled_max, pooled_mean], -1)))

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(vocab={self.embedding.num_embeddings}, "
                f"classes={self.num_classes}, "
                f"rnn={f'{self.rnn_kind}x{len(self.rnns)}' if self.rnns else 'none'}, "
                f"places={self.places}, graph='{self.graph_kind}'"
                + (f", max_distance={transfer.max_distance}"
                   if (transfer := self.glomo_embedding or self.glomo_rnn) is not None and
                   transfer.max_distance is not None else "") + ")")
