"""The paper's text-classification setting (Sec. 4.1, IMDB): word vectors -> BiGRU/BiLSTM
-> self-attention -> pooling -> classifier, with GLoMo graphs added at the embeddings
and/or after the first recurrent layer."""
from __future__ import annotations

import numbers
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from glomo_pyg.graphs import DirectionalGraphs, LatentGraphs
from glomo_pyg.graphs.storage import EdgeStorage
from glomo_pyg.nn.pretrained import PretrainedGraphPredictor
from glomo_pyg.nn.transfer import GRAPHS, GlomoTransfer
from glomo_pyg.sequences import SequenceBatch, sequence_batch

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

    ``rnn_layers=0`` (not in the paper) maps the features straight to the self-attention,
    so word order is seen only through the graphs. Variants:

    * ``predictor=None`` (or ``places=()``): the feature-only baseline, no graphs;
    * ``places=('embedding',)``: GLoMo on the word vectors (paper Table 1);
    * ``places=('rnn',)`` or both: GLoMo on the first RNN layer's states;
    * ``graph='uniform'``: the same model with uniform graphs (Table 2);
    * ``graph='adjacent'``: graphs of the neighbouring word only, which the mixture
      chains to the nearest ``L`` words per direction (a control, not in the paper:
      does a learned graph transfer more than locality?);
    * a predictor pretrained under an ablation gives that ablation's row.

    Graphs are computed once per batch from the token ids and reused at every place; for
    a fixed set of documents :class:`TextGraphCache` computes them once, to pass to
    :meth:`forward` as ``graphs`` (same logits and gradients).

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
        if embedding.dim() != 2 or not embedding.dtype.is_floating_point or \
                embedding.size(0) < 1 or embedding.size(1) < 1 or \
                not bool(torch.isfinite(embedding).all()):  # NaN logits otherwise, silently
            raise ValueError(f"embedding must be a float [V, d] matrix without NaN or Inf, got "
                             f"{tuple(embedding.shape)} {embedding.dtype}")
        vocab = embedding.size(0)

        def integer(value, low: int) -> bool:
            return not isinstance(value, bool) and isinstance(value, int) and value >= low

        # (argument, value, whether it is sound, what it must be)
        for name, value, ok, must in (
                ("places", places, set(places) <= set(PLACES), f"be among {PLACES}"),
                ("rnn", rnn, rnn in RNNS, f"be one of {RNNS}"),
                ("graph", graph, graph in GRAPHS, f"be one of {GRAPHS}"),
                ("num_classes", num_classes, integer(num_classes, 2), "be an integer >= 2"),
                ("rnn_layers", rnn_layers, integer(rnn_layers, 0), "be an integer >= 0"),
                ("rnn_layers", rnn_layers, "rnn" not in places or integer(rnn_layers, 2),
                 "be >= 2: graphs after the first RNN layer need rnn_layers >= 2"),
                ("hidden_channels", hidden_channels, integer(hidden_channels, 1),
                 "be an integer >= 1"),
                ("attention_heads", attention_heads, integer(attention_heads, 1),
                 "be an integer >= 1"),
                ("attention_heads", attention_heads,
                 not (integer(hidden_channels, 1) and integer(attention_heads, 1)) or
                 not (2 * hidden_channels) % attention_heads,
                 f"divide the BiRNN's width: 2 x hidden_channels must be divisible by "
                 f"attention_heads"),
                ("dropout", dropout, 0.0 <= dropout < 1.0, "lie in [0, 1)"),
                ("predictor", predictor, predictor is None or predictor.num_tokens == vocab,
                 f"read the classifier's vocabulary ({vocab} rows of embedding), not features "
                 f"or another vocabulary"),
                ("padding_idx", padding_idx,
                 padding_idx is None or integer(padding_idx, -vocab) and padding_idx < vocab,
                 f"be a row of the embedding, in [0, {vocab}) (or negative from the end)")):
            if not ok:
                raise ValueError(f"{name} must {must}, got {value!r}")
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

    @property
    def transfer(self) -> Optional[GlomoTransfer]:
        """The first :class:`GlomoTransfer` (the one whose graphs every place shares),
        ``None`` for the feature-only baseline."""
        return self.glomo_embedding or self.glomo_rnn

    def _given_graphs(self, graphs: DirectionalGraphs, seqs: SequenceBatch) -> DirectionalGraphs:
        """Graphs passed to :meth:`forward`, checked against the batch they must cover
        (graphs of other reviews with the same number of tokens would mix features
        across the wrong reviews without any error)."""
        transfer = self.transfer
        if not isinstance(graphs, tuple) or len(graphs) != 2 or \
                any(g is not None and not isinstance(g, LatentGraphs) for g in graphs):
            raise TypeError(f"graphs must be DirectionalGraphs (forward, backward), got "
                            f"{type(graphs).__name__}")
        present = tuple(d for d, g in zip(("forward", "backward"), graphs) if g is not None)
        wanted = () if transfer is None or transfer.graph == "none" else \
            tuple(transfer.predictor.directions)
        other = next((g for g in graphs if g is not None and (
            g.num_nodes != seqs.num_nodes or g.device != seqs.ptr.device or
            not torch.equal(g.ptr, seqs.ptr))), None)
        if present != wanted or other is not None:
            raise ValueError(
                f"graphs hold the directions {present}, the classifier mixes {wanted} (none: "
                f"predictor=None, places=() or graph='none' mixes no graphs: do not pass "
                f"graphs)" if present != wanted else
                f"graphs cover {other.num_nodes} units on {other.device}, x has "
                f"{seqs.num_nodes} on {seqs.ptr.device}: they were computed for other reviews "
                f"than this batch's")
        return DirectionalGraphs(*graphs)

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                graphs: Optional[DirectionalGraphs] = None) -> Tensor:
        """``graphs``: this batch's graphs computed beforehand (:class:`TextGraphCache`),
        used instead of running the predictor; they must cover the same reviews in the
        same order (checked: one device sync)."""
        vocab = self.embedding.num_embeddings
        # (the integer types an embedding indexes with, as in Glomo)
        ids = isinstance(x, Tensor) and x.dtype in (torch.int64, torch.int32) and x.dim() == 1
        low, high = torch.stack(torch.aminmax(x)).tolist() if ids and x.numel() else (0, 0)
        if not ids or low < 0 or high >= vocab:
            raise ValueError(f"x must be flat int64 or int32 token ids [N]: token ids must lie "
                             f"in [0, {vocab}), got " + (f"{x.dtype} of shape {tuple(x.shape)}, "
                                                         f"values in [{low}, {high}]"
                                                         if isinstance(x, Tensor)
                                                         else type(x).__name__))
        seqs = sequence_batch(x.size(0), batch, x.device)
        if seqs.num_sequences == 0 or min(seqs.sizes) < 1:
            raise ValueError("every sequence needs at least one token")
        # one set of graphs per batch, shared by both places (None for graph='none',
        # which needs none)
        transfer = self.transfer
        if graphs is not None:
            graphs = self._given_graphs(graphs, seqs)
        elif transfer is not None:
            graphs = transfer.graphs(x, seqs.batch, num_nodes=x.size(0))
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
                   if (transfer := self.transfer) is not None and
                   transfer.max_distance is not None else "") + ")")


# weight dtypes a cache may store: float32 is exact; the half types halve the memory
CACHE_WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DIRECTIONS = ("forward", "backward")


def _small_int_dtype(bound: int) -> torch.dtype:
    """The narrowest integer dtype that holds ``0 .. bound``."""
    for dtype, top in ((torch.uint8, 255), (torch.int16, 32767), (torch.int32, 2**31 - 1)):
        if bound <= top:
            return dtype
    return torch.int64


def _fingerprint(module: torch.nn.Module) -> Tuple:
    """What tells two predictors' weights apart (names, shapes and two sums per tensor),
    without keeping a copy of them."""
    return tuple((k, tuple(v.shape), float(v.double().sum()), float(v.double().abs().sum()))
                 for k, v in module.state_dict().items() if v.is_floating_point())


def _exclusive_cumsum(t: Tensor, dim: int = -1) -> Tensor:
    return t.cumsum(dim) - t


def _check_documents(documents, num_tokens: int) -> List[Tensor]:
    if isinstance(documents, (Tensor, str, bytes)) or not isinstance(documents, Sequence) or \
            not documents:
        raise TypeError("documents must be a non-empty sequence of 1-D token-id tensors, one "
                        f"per document, got {type(documents).__name__}")
    docs = list(documents)
    bad = next((k for k, doc in enumerate(docs) if not isinstance(doc, Tensor) or
                doc.dtype not in (torch.int64, torch.int32) or doc.dim() != 1 or
                doc.numel() < 1), None)
    low, high = (0, 0) if bad is not None else \
        torch.stack(torch.aminmax(torch.cat([d.cpu().long() for d in docs]))).tolist()
    if bad is not None or low < 0 or high >= num_tokens:
        doc = docs[bad] if bad is not None else None
        raise ValueError(
            f"token ids must lie in [0, {num_tokens}), got [{low}, {high}]" if bad is None else
            f"document {bad} must be a non-empty 1-D int64 or int32 tensor of token ids, got "
            + (f"{doc.dtype} of shape {tuple(doc.shape)}" if isinstance(doc, Tensor)
               else type(doc).__name__))
    return docs


class TextGraphCache:
    r"""The graphs a :class:`GlomoTextClassifier` mixes its features along, computed
    once for a fixed list of documents (:meth:`compute`) and assembled for any batch of
    them (:meth:`graphs`), to be passed to the classifier's ``forward`` instead of
    running the frozen predictor every epoch.

    A document's graphs depend only on the frozen predictor, its token ids and
    ``max_distance`` (never on trained parameters, dropout or the other documents), so
    with ``float32`` weights cached graphs give the same logits and gradients. The
    propagations are not cached (dropout changes them every step). The predictor scores
    cached graphs in float32 even inside an autocast region.

    Each layer's edges are stored by (head, document, target, source) as per-edge
    distances :math:`|i - j|` (the smallest integer type that holds them) and weights
    (``weight_dtype``), plus per (head, token) edge counts; a batch's edge lists are
    rebuilt with gathers (:attr:`nbytes`). ``'uniform'`` and ``'adjacent'`` graphs are
    built per batch from the documents' lengths.

    Build it with :meth:`compute`, not with the constructor.

    Shapes:
        - **documents:** :math:`R` tensors of :math:`(T_r)` token ids
        - :meth:`graphs` ``(index)``: :math:`(B)` document ids ->
          :class:`~glomo_pyg.DirectionalGraphs` over the :math:`N = \sum_b T_{index_b}`
          units of those documents, concatenated in that order (a PyG batch of them)
    """

    def __init__(self, *, kind: str, lengths: Tensor, tokens: Tensor, directions: Sequence[str],
                 num_layers: int, heads: int, include_self: bool, orders: Dict,
                 max_distance: Optional[int], fingerprint: Optional[Tuple],
                 layers: Optional[Dict[str, List[Dict[str, Tensor]]]] = None):
        # (built by compute(); the fields are the cache's state)
        self.kind, self.directions = kind, tuple(directions)
        self.num_layers, self.heads, self.include_self = num_layers, heads, include_self
        self.orders, self.max_distance, self.fingerprint = orders, max_distance, fingerprint
        self.lengths = lengths.cpu()  # [R] (host: the checks of check_documents)
        self.tokens = tokens.cpu()  # [G] int32, the documents' tokens (ditto)
        self.layers = layers or {}
        device = next((l["weight"].device for d in self.layers.values() for l in d),
                      torch.device("cpu"))
        self._ptr = torch.cat([self.lengths.new_zeros(1), self.lengths.cumsum(0)]).to(device)
        self._lengths = self.lengths.to(device)

    @property
    def device(self) -> torch.device:
        return self._ptr.device

    @property
    def num_documents(self) -> int:
        return self.lengths.numel()

    @property
    def nbytes(self) -> int:
        """Bytes the stored graphs take (lengths and the tokens kept for checks apart)."""
        return sum(t.numel() * t.element_size() for d in self.layers.values() for l in d
                   for t in l.values())

    # --- construction ---------------------------------------------------------------
    @classmethod
    @torch.no_grad()
    def compute(cls, model: Union["GlomoTextClassifier", GlomoTransfer],
                documents: Sequence[Tensor], batch_size: int = 64,
                device: Optional[Union[str, torch.device]] = None,
                weight_dtype: torch.dtype = torch.float32) -> "TextGraphCache":
        r"""The graphs of every document of ``documents`` (see the class docstring).

        Args:
            model (GlomoTextClassifier or GlomoTransfer): whose graphs to compute (its
                predictor, ``graph`` and ``max_distance``).
            documents (sequence of Tensor): one 1-D tensor of token ids per document.
            batch_size (int): documents per predictor call (sorted by length).
            device (torch.device, optional): where the cache is kept and batches are
                assembled (default: the predictor's device).
            weight_dtype (torch.dtype): ``torch.float32`` (exact), ``torch.float16``
                (relative error at most :math:`2^{-11}`; weights below about
                :math:`6 \cdot 10^{-8}` become 0) or ``torch.bfloat16``.
        """
        transfer = cls._transfer(model)
        for name, value, ok, must in (
                ("batch_size", batch_size, not isinstance(batch_size, bool) and
                 isinstance(batch_size, numbers.Integral) and batch_size >= 1,
                 "be a positive integer"),
                ("weight_dtype", weight_dtype, weight_dtype in CACHE_WEIGHT_DTYPES,
                 f"be one of {CACHE_WEIGHT_DTYPES}")):
            if not ok:
                raise ValueError(f"{name} must {must}, got {value!r}")
        p = transfer.predictor
        docs = _check_documents(documents, p.num_tokens)
        source = next(p.parameters()).device
        device = torch.device(device) if device is not None else source
        lengths = torch.tensor([d.numel() for d in docs])
        tokens = torch.cat([d.cpu() for d in docs]).to(torch.int32)
        meta = dict(kind=transfer.graph, lengths=lengths, tokens=tokens,
                    directions=p.directions, num_layers=p.num_layers, heads=p.heads,
                    include_self=p.include_self,
                    orders={d: p.predictor(d).order for d in p.directions},
                    max_distance=transfer.max_distance, fingerprint=None)
        if transfer.graph != "learned":  # uniform / adjacent: built per batch, O(N)
            return cls(**meta, layers={})
        longest = int(lengths.max())
        window = longest if transfer.max_distance is None else \
            min(longest, transfer.max_distance + 1)
        small = _small_int_dtype(window)  # distances < window, counts <= window
        ptr = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        # each chunk's edges wait in host memory and are copied once into the final
        # tensors: the device never holds the cache twice (as a cat of the parts would)
        parts: Dict[str, List[List[Dict[str, Tensor]]]] = {d: [] for d in p.directions}
        starts = {d: [torch.empty(p.heads, len(docs), dtype=torch.long, device=device)
                      for _ in range(p.num_layers)] for d in p.directions}
        counts = {d: [torch.empty(p.heads, int(ptr[-1]), dtype=small, device=device)
                      for _ in range(p.num_layers)] for d in p.directions}
        stored = {d: [0] * p.num_layers for d in p.directions}  # edges so far per layer
        order = sorted(range(len(docs)), key=lambda k: -docs[k].numel())  # less padding
        for first in range(0, len(order), batch_size):
            chunk = torch.tensor(order[first:first + batch_size])
            x = torch.cat([docs[k] for k in chunk.tolist()]).to(source, torch.long)
            batch = torch.repeat_interleave(torch.arange(chunk.numel()), lengths[chunk])
            with torch.autocast(source.type, enabled=False):  # scored in float32
                graphs = transfer.graphs(x, batch.to(source), num_nodes=x.numel())
            # where the chunk's tokens sit among all documents' tokens
            seqs = sequence_batch(x.numel(), batch.to(device), device)
            token = (ptr[chunk].to(device))[seqs.batch] + seqs.position
            for d, g in zip(_DIRECTIONS, graphs):
                if g is None:
                    continue
                g = g.to_sparse()
                parts[d].append([])
                for l in range(p.num_layers):
                    edges = [t.to(device) for t in g.layer(l)]
                    parts[d][-1].append(cls._store_layer(edges, token, seqs, chunk, counts[d][l],
                                                         starts[d][l], stored[d][l], small,
                                                         weight_dtype))
                    stored[d][l] += edges[1].numel()
        layers = {d: [dict(count=counts[d][l], start=starts[d][l],
                           **{k: cls._joined([c[l][k] for c in parts[d]], device)
                              for k in ("distance", "weight")})
                      for l in range(p.num_layers)] for d in p.directions}
        meta["fingerprint"] = _fingerprint(p)
        return cls(**meta, layers=layers)

    @staticmethod
    def _store_layer(edges: List[Tensor], token: Tensor, seqs: SequenceBatch, chunk: Tensor,
                     count_out: Tensor, start_out: Tensor, stored: int, small: torch.dtype,
                     weight_dtype: torch.dtype) -> Dict[str, Tensor]:
        """Records one layer's edges of a chunk of documents: the incoming edges per
        (head, token) in ``count_out`` and where each (head, document) run starts in
        ``start_out``; returns the compact edges (host memory)."""
        (src, tgt), w, h = edges
        heads, n = count_out.size(0), seqs.num_nodes
        count = torch.bincount(h * n + tgt, minlength=heads * n).view(heads, n)
        count_out[:, token] = count.to(small)
        # edges are in (head, document, target, source) order: each (head, document) run
        # starts after the runs before it
        runs = torch.zeros(heads, chunk.numel(), dtype=torch.long, device=count.device)
        runs.index_add_(1, seqs.batch, count)
        start_out[:, chunk.to(count.device)] = \
            _exclusive_cumsum(runs.flatten()).view_as(runs) + stored
        return dict(distance=(tgt - src).abs().to("cpu", small), weight=w.to("cpu", weight_dtype))

    @staticmethod
    def _joined(parts: List[Tensor], device: torch.device) -> Tensor:
        """``torch.cat(parts).to(device)`` without a second copy on ``device``."""
        out = torch.empty(sum(t.numel() for t in parts), dtype=parts[0].dtype, device=device)
        at = 0
        for t in parts:
            out[at:at + t.numel()] = t
            at += t.numel()
        return out

    @staticmethod
    def _transfer(model) -> GlomoTransfer:
        if not isinstance(model, (GlomoTextClassifier, GlomoTransfer)):
            raise TypeError(f"model must be a GlomoTextClassifier or a GlomoTransfer, got "
                            f"{type(model).__name__}")
        transfer = model.transfer if isinstance(model, GlomoTextClassifier) else model
        if transfer is None or transfer.graph == "none" or transfer.predictor.num_tokens is None:
            raise ValueError("the model mixes no graphs over token ids (predictor=None, "
                             "places=(), graph='none' or a predictor that reads features): "
                             "there is nothing to precompute")
        return transfer

    # --- checks against a model and documents ---------------------------------------
    def check_model(self, model: Union["GlomoTextClassifier", GlomoTransfer]) -> None:
        """Raise :class:`ValueError` unless ``model`` would compute these graphs (same
        ``graph`` kind, ``max_distance``, graph shape and, for learned graphs, the same
        predictor weights)."""
        transfer = self._transfer(model)
        p = transfer.predictor
        mine = (self.kind, self.max_distance, self.directions, self.num_layers, self.heads,
                self.include_self)
        theirs = (transfer.graph, transfer.max_distance, tuple(p.directions), p.num_layers,
                  p.heads, p.include_self)
        if mine != theirs or self.kind == "learned" and _fingerprint(p) != self.fingerprint:
            raise ValueError(f"the graph cache holds (graph, max_distance, directions, layers, "
                             f"heads, include_self) = {mine}, the model uses {theirs}"
                             + (" (or the cache was computed with another predictor's weights)"
                                if mine == theirs else ""))

    def check_documents(self, documents: Sequence[Tensor]) -> None:
        """Raise :class:`ValueError` unless ``documents`` are the cached documents, in
        the same order (their lengths and token ids are compared)."""
        if len(documents) != self.num_documents or \
                not torch.equal(torch.tensor([d.numel() for d in documents]), self.lengths) or \
                not torch.equal(torch.cat([d.cpu() for d in documents]).to(torch.int32),
                                self.tokens):
            raise ValueError(f"the graph cache holds {self.num_documents} documents, got "
                             f"{len(documents)}: it was computed for other documents (their "
                             f"number, lengths or token ids differ)")

    # --- assembly -------------------------------------------------------------------
    def graphs(self, index: Union[Tensor, Sequence[int]],
               device: Optional[Union[str, torch.device]] = None) -> DirectionalGraphs:
        """The graphs of documents ``index``, in that order, over their concatenated
        tokens (what :meth:`GlomoTextClassifier.forward` computes for the PyG batch of
        those documents), on ``device`` (default: the cache's)."""
        index = self._check_index(index)
        lengths = self._lengths[index]
        ptr = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        seqs = SequenceBatch.from_ptr(ptr)
        out = []
        for d in _DIRECTIONS:
            if d not in self.directions:
                out.append(None)
            elif self.kind == "learned":
                out.append(self._assemble(d, index, seqs))
            else:
                build = LatentGraphs.uniform if self.kind == "uniform" else LatentGraphs.adjacent
                g = build(ptr, num_layers=self.num_layers, num_heads=self.heads, direction=d,
                          include_self=self.include_self, order=self.orders[d])
                out.append(g if self.max_distance is None else g.within(self.max_distance))
        graphs = DirectionalGraphs(*out)
        if device is not None and torch.device(device) != self.device:
            graphs = DirectionalGraphs(*(None if g is None else g.to(device) for g in graphs))
        return graphs

    def _check_index(self, index) -> Tensor:
        if not isinstance(index, Tensor):
            if isinstance(index, (str, bytes)) or not isinstance(index, Sequence) or \
                    not all(isinstance(i, numbers.Integral) and not isinstance(i, bool)
                            for i in index):
                raise TypeError(f"index must be a 1-D integer tensor or a sequence of ints, "
                                f"got {type(index).__name__}")
            index = torch.tensor(list(index), dtype=torch.long)
        ok = index.dtype in (torch.int64, torch.int32, torch.int16, torch.uint8) and \
            index.dim() == 1 and index.numel() >= 1
        index = index.to(self.device, torch.long)
        low, high = torch.stack(torch.aminmax(index)).tolist() if ok else (0, 0)
        if not ok or low < 0 or high >= self.num_documents:
            raise ValueError(f"index must be a non-empty 1-D integer tensor of document ids: "
                             f"document ids must lie in [0, {self.num_documents}), got "
                             f"{index.dtype} of shape {tuple(index.shape)}, values in "
                             f"[{low}, {high}]")
        return index

    def _assemble(self, direction: str, index: Tensor, seqs: SequenceBatch) -> LatentGraphs:
        n, heads = seqs.num_nodes, self.heads
        token = self._ptr[index][seqs.batch] + seqs.position  # [N] rows of the store
        first = seqs.ptr[:-1]
        storages = []
        for layer in self.layers[direction]:
            count = layer["count"][:, token].long()  # [H, N] edges into each unit
            before = _exclusive_cumsum(count)  # within the batch, per head
            # start of each (head, unit)'s edges in the store: its (head, document) run's
            # start, plus the edges of the document's earlier units
            start = layer["start"][:, index][:, seqs.batch] + before - \
                before[:, first][:, seqs.batch]
            count, start = count.flatten(), start.flatten()
            total = int(count.sum())
            gather = torch.repeat_interleave(start - _exclusive_cumsum(count), count,
                                             output_size=total) + \
                torch.arange(total, device=self.device)
            unit = torch.arange(n, device=self.device).repeat(heads)
            tgt = torch.repeat_interleave(unit, count, output_size=total)
            dist = layer["distance"][gather].long()
            src = tgt - dist if direction == "forward" else tgt + dist
            head = torch.repeat_interleave(torch.arange(heads, device=self.device),
                                           count.view(heads, n).sum(1), output_size=total)
            storages.append(EdgeStorage(torch.stack([src, tgt]),
                                        layer["weight"][gather].float(), head))
        return LatentGraphs.from_storage(storages, num_heads=heads, direction=direction,
                                         sequences=seqs, include_self=self.include_self,
                                         order=self.orders[direction])

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(documents={self.num_documents}, "
                f"graph='{self.kind}', directions={self.directions}, "
                f"layers={self.num_layers}, heads={self.heads}"
                + (f", max_distance={self.max_distance}" if self.max_distance is not None
                   else "") + f", nbytes={self.nbytes})")
