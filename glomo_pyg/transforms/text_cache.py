"""The graphs a :class:`~glomo_pyg.nn.GlomoTextClassifier` mixes its features along,
computed once for fixed documents and kept compactly in memory (docs/text.md,
"Precomputed graphs"), checked against the model by the predictor's fingerprint."""
from __future__ import annotations

import numbers
from typing import Dict, List, Optional, Sequence, Union, cast

import torch
from torch import Tensor

from glomo_pyg.devices import check_device
from glomo_pyg.graphs import DirectionalGraphs, LatentGraphs
from glomo_pyg.graphs.storage import EdgeStorage
from glomo_pyg.nn.text_classifier import GlomoTextClassifier
from glomo_pyg.nn.transfer import GlomoTransfer
from glomo_pyg.ordering import DIRECTIONS
from glomo_pyg.sequences import TOKEN_DTYPES, SequenceBatch, sequence_batch
from glomo_pyg.settings import check_int

CACHE_WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: How far above 1 a stored weight, or a token's total, may be rounded (bfloat16's step).
WEIGHT_SLACK = 2.0 ** -7
#: Edges checked at a time when a cache is made (what bounds the check's temporaries).
CHECK_EDGES = 1 << 22


def _check_documents(documents, num_tokens: int) -> List[Tensor]:
    """``documents`` as a list of 1-D token-id tensors, every id in ``[0, num_tokens)``.

    Raises:
        TypeError: ``documents`` not a non-empty sequence.
        ValueError: naming the first document that is not a non-empty 1-D int64 / int32
            tensor, or the range of ids beyond the predictor's vocabulary."""
    if isinstance(documents, (Tensor, str, bytes)) or not isinstance(documents, Sequence) or \
            not documents:
        raise TypeError("documents must be a non-empty sequence of 1-D token-id tensors, one "
                        f"per document, got {type(documents).__name__}")
    docs = list(documents)
    for k, doc in enumerate(docs):
        if not isinstance(doc, Tensor) or doc.dtype not in TOKEN_DTYPES or doc.dim() != 1 or \
                doc.numel() < 1:
            got = f"{doc.dtype} of shape {tuple(doc.shape)}" if isinstance(doc, Tensor) else \
                type(doc).__name__
            raise ValueError(f"document {k} must be a non-empty 1-D int64 or int32 tensor of "
                             f"token ids, got {got}")
    low, high = torch.stack(torch.aminmax(torch.cat([d.cpu().long() for d in docs]))).tolist()
    if low < 0 or high >= num_tokens:
        raise ValueError(f"token ids must lie in [0, {num_tokens}), got [{low}, {high}]")
    return docs


class TextGraphCache:
    r"""The graphs a :class:`GlomoTextClassifier` mixes its features along, computed
    once for fixed documents (:meth:`compute`, not the constructor) and assembled for any
    batch of them (:meth:`graphs`), to pass to the classifier's ``forward``; with
    ``float32`` weights they give the same logits and gradients. Edges are stored as
    distances :math:`|i - j|` and weights, plus per (head, token) edge counts.

    Shapes:
        - **documents:** :math:`R` tensors of :math:`(T_r)` token ids
        - :meth:`graphs` ``(index)``: :math:`(B)` document ids ->
          :class:`~glomo_pyg.DirectionalGraphs` over the :math:`N = \sum_b T_{index_b}`
          units of those documents, concatenated in that order (a PyG batch of them)
    """

    def __init__(self, *, kind: str, lengths: Tensor, tokens: Tensor, directions: Sequence[str],
                 num_layers: int, heads: int, include_self: bool, orders: Dict,
                 max_distance: Optional[int], fingerprint: Optional[str],
                 layers: Optional[Dict[str, List[Dict[str, Tensor]]]] = None):
        self.kind, self.directions = kind, tuple(directions)
        self.num_layers, self.heads, self.include_self = num_layers, heads, include_self
        self.orders, self.max_distance, self.fingerprint = orders, max_distance, fingerprint
        self.lengths = lengths.cpu()  # [R], on the host for check_documents
        self.tokens = tokens.cpu()  # [G] int32, the documents' tokens
        self.layers = layers or {}
        device = next((l["weight"].device for d in self.layers.values() for l in d),
                      torch.device("cpu"))
        self._ptr = torch.cat([self.lengths.new_zeros(1), self.lengths.cumsum(0)]).to(device)
        self._lengths = self.lengths.to(device)
        for d, layers_of in self.layers.items():
            for l, layer in enumerate(layers_of):
                problem = self._layer_problem(d, layer)
                if problem is not None:
                    raise ValueError(f"graph cache, {d} layer {l}: {problem}; it is not what "
                                     "TextGraphCache.compute stores (compute it again)")

    def _layer_problem(self, direction: str, layer: Dict[str, Tensor]) -> Optional[str]:
        """What makes one stored layer unlike :meth:`compute`'s (``None``: nothing): the
        tensors' kinds and shapes; each (head, document) run of edges inside the store,
        the runs tiling it; each (head, token)'s edge count, distances and weights
        possible for that token (sources inside its document, in the direction and
        window, weights in [0, 1] summing to at most 1)."""
        heads, docs, units = self.heads, self.num_documents, int(self.lengths.sum())
        if set(layer) != {"count", "start", "distance", "weight"}:
            return f"entries {sorted(layer)}, not count, start, distance and weight"
        count, start, distance, weight = (layer[k] for k in ("count", "start", "distance",
                                                              "weight"))
        edges = distance.numel()
        if count.shape != (heads, units) or start.shape != (heads, docs) or \
                distance.shape != (edges,) or weight.shape != (edges,) or \
                count.is_floating_point() or distance.is_floating_point() or \
                start.dtype != torch.long or weight.dtype not in CACHE_WEIGHT_DTYPES or \
                len({t.device for t in (count, start, distance, weight)}) != 1:
            return "tensors of other dtypes, shapes or devices"
        # (a window's rescaled weights may round to just above 1)
        if not bool(torch.isfinite(weight).all()) or bool((weight < 0).any()) or \
                bool((weight > 1 + WEIGHT_SLACK).any()):
            return "weights outside [0, 1] (or not finite)"
        runs = self._runs_problem(count, start, edges)
        return runs if runs is not None else self._edges_problem(direction, layer)

    def _runs_problem(self, count: Tensor, start: Tensor, edges: int) -> Optional[str]:
        """Whether the (head, document) runs of edges tile ``[0, edges)`` exactly."""
        if bool((count < 0).any()):
            return "negative edge counts"
        doc = torch.repeat_interleave(torch.arange(self.num_documents, device=count.device),
                                      self._lengths.to(count.device))
        sizes = torch.zeros_like(start).index_add_(1, doc, count.long()).flatten()
        first = start.flatten()
        order = torch.argsort(sizes, stable=True)
        order = order[torch.argsort(first[order], stable=True)]  # by start, then size
        ends = first[order] + sizes[order]
        if int(sizes.sum()) != edges or (edges and int(first[order[0]]) != 0) or \
                not torch.equal(first[order[1:]], ends[:-1]):
            return f"edge counts and run starts that do not tile its {edges} edges"
        return None

    def _edges_problem(self, direction: str, layer: Dict[str, Tensor]) -> Optional[str]:
        """Whether every edge's distance is possible for its target, and each target's
        weights sum to at most 1 (so no edge is stored twice)."""
        count, start, distance, weight = (layer[k] for k in ("count", "start", "distance",
                                                              "weight"))
        device = count.device
        lengths, ptr = self._lengths.to(device), self._ptr.to(device)
        order = torch.argsort(start.flatten(), stable=True)  # runs in store order
        head, doc = order // self.num_documents, order % self.num_documents
        # each run's tokens, in store order (a run's edges go target by target)
        within = torch.arange(int(lengths[doc].sum()), device=device) - torch.repeat_interleave(
            torch.cumsum(lengths[doc], 0) - lengths[doc], lengths[doc])
        doc_of = torch.repeat_interleave(doc, lengths[doc])
        token = ptr[doc_of] + within
        sizes = count[torch.repeat_interleave(head, lengths[doc]), token].long()
        room = within if direction == "forward" else lengths[doc_of] - 1 - within
        if self.max_distance is not None:
            room = room.clamp_max(self.max_distance)
        low = 0 if self.include_self else 1
        if bool((sizes > room + 1 - low).any()):
            return "more edges into a token than it has sources"
        ends = sizes.cumsum(0)
        total = int(ends[-1]) if ends.numel() else 0
        steps = torch.arange(1, total // CHECK_EDGES + 1, device=device) * CHECK_EDGES
        bounds = torch.searchsorted(ends, steps, right=True).tolist()
        for lo, hi in zip([0] + bounds, bounds + [sizes.numel()]):  # (bounded temporaries)
            first, last = int(ends[lo - 1]) if lo else 0, int(ends[hi - 1]) if hi else 0
            if last == first:
                continue
            part = distance[first:last].long()
            if bool((part < low).any()) or bool(
                    (part > torch.repeat_interleave(room[lo:hi], sizes[lo:hi])).any()):
                return "distances that leave the document, the direction or the window"
            totals = torch.segment_reduce(weight[first:last].float(), "sum",
                                          lengths=sizes[lo:hi])
            if bool((totals > 1 + WEIGHT_SLACK).any()):
                return "a token's weights summing to more than 1"
        return None

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

    @classmethod
    @torch.no_grad()
    def compute(cls, model: Union[GlomoTextClassifier, GlomoTransfer],
                documents: Sequence[Tensor], batch_size: int = 64,
                device: Optional[Union[str, torch.device]] = None,
                weight_dtype: torch.dtype = torch.float32) -> "TextGraphCache":
        r"""The graphs of every document of ``documents``.

        Args:
            model (GlomoTextClassifier or GlomoTransfer): whose graphs to compute.
            documents (sequence of Tensor): one 1-D tensor of token ids per document.
            batch_size (int): documents per predictor call.
            device (torch.device, optional): where the cache is kept (default: predictor's).
            weight_dtype (torch.dtype): ``torch.float32`` (exact), ``torch.float16``
                (relative error at most :math:`2^{-11}`) or ``torch.bfloat16``.

        Raises:
            TypeError: a ``model`` of another kind, ``documents`` not a sequence.
            ValueError: a model that mixes no graphs over token ids, a ``batch_size`` that
                is not a positive integer, another ``weight_dtype``, or a document that is
                not token ids of the predictor's vocabulary (named by its index).
        """
        transfer = cls._transfer(model)
        batch_size = check_int("batch_size", batch_size)
        if weight_dtype not in CACHE_WEIGHT_DTYPES:
            raise ValueError(f"weight_dtype must be one of {CACHE_WEIGHT_DTYPES}, got "
                             f"{weight_dtype!r}")
        p = transfer.predictor
        docs = _check_documents(documents, p.num_tokens)
        source = next(p.parameters()).device
        device = check_device(device) if device is not None else source
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
        # the narrowest integer dtype for distances < window and counts <= window
        small = next(t for t in (torch.uint8, torch.int16, torch.int32, torch.int64)
                     if window <= torch.iinfo(t).max)
        ptr = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        store = cls._empty_store(p.directions, p.num_layers, p.heads, int(ptr[-1]), len(docs),
                                 small, device)
        order = sorted(range(len(docs)), key=lambda k: -docs[k].numel())  # less padding
        for first in range(0, len(order), batch_size):
            chunk = torch.tensor(order[first:first + batch_size])
            cls._store_chunk(transfer, docs, chunk, lengths, ptr, store, source, device, small,
                             weight_dtype)
        layers = {d: [dict(layer, distance=torch.cat(layer["distance"]).to(device),
                           weight=torch.cat(layer["weight"]).to(device)) for layer in store[d]]
                  for d in p.directions}
        return cls(**dict(meta, fingerprint=p.fingerprint()), layers=layers)

    @staticmethod
    def _empty_store(directions: Sequence[str], num_layers: int, heads: int, num_tokens: int,
                     num_documents: int, small: torch.dtype,
                     device: torch.device) -> Dict[str, List[Dict]]:
        """Per direction and layer, the store :meth:`_store_layer` fills, still empty."""
        # per layer: counts and run starts on the device, the edges on the host until the end
        # (then the device holds the cache once)
        return {d: [dict(count=torch.empty(heads, num_tokens, dtype=small, device=device),
                         start=torch.empty(heads, num_documents, dtype=torch.long,
                                           device=device),
                         distance=[], weight=[]) for _ in range(num_layers)]
                for d in directions}

    @classmethod
    def _store_chunk(cls, transfer: GlomoTransfer, docs: List[Tensor], chunk: Tensor,
                     lengths: Tensor, ptr: Tensor, store: Dict[str, List[Dict]],
                     source: torch.device, device: torch.device, small: torch.dtype,
                     weight_dtype: torch.dtype) -> None:
        """Adds the graphs of the documents ``chunk`` to ``store``, layer by layer."""
        x = torch.cat([docs[k] for k in chunk.tolist()]).to(source, torch.long)
        batch = torch.repeat_interleave(torch.arange(chunk.numel()), lengths[chunk])
        with torch.autocast(source.type, enabled=False):  # scored in float32
            graphs = cast(DirectionalGraphs,  # (learned graphs: never None)
                          transfer.graphs(x, batch.to(source), num_nodes=x.numel()))
        # where the chunk's tokens sit among all documents' tokens
        seqs = sequence_batch(x.numel(), batch.to(device), device)
        token = (ptr[chunk].to(device))[seqs.batch] + seqs.position
        for d, g in zip(DIRECTIONS, graphs):
            if g is not None:
                g = g.to_sparse()
                for l, layer in enumerate(store[d]):
                    cls._store_layer([t.to(device) for t in g.layer(l)], token, seqs, chunk,
                                     layer, small, weight_dtype)

    @staticmethod
    def _store_layer(edges: List[Tensor], token: Tensor, seqs: SequenceBatch, chunk: Tensor,
                     layer: Dict, small: torch.dtype, weight_dtype: torch.dtype) -> None:
        """Adds a chunk's edges of one layer to its ``store`` entry."""
        (src, tgt), w, h = edges
        heads, n = layer["count"].size(0), seqs.num_nodes
        count = torch.bincount(h * n + tgt, minlength=heads * n).view(heads, n)
        layer["count"][:, token] = count.to(small)
        # edges are in (head, document, target, source) order, after the earlier chunks'
        runs = torch.zeros(heads, chunk.numel(), dtype=torch.long, device=count.device)
        runs.index_add_(1, seqs.batch, count)
        stored = sum(t.numel() for t in layer["distance"])
        runs = runs.flatten()
        layer["start"][:, chunk.to(count.device)] = (runs.cumsum(0) - runs).view(heads, -1) + stored
        layer["distance"].append((tgt - src).abs().to("cpu", small))
        layer["weight"].append(w.to("cpu", weight_dtype))

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

    def check_model(self, model: Union[GlomoTextClassifier, GlomoTransfer]) -> None:
        """Raise :class:`ValueError` unless ``model`` would compute these graphs (same
        settings and, for learned graphs, the same predictor weights)."""
        transfer = self._transfer(model)
        p = transfer.predictor
        mine = (self.kind, self.max_distance, self.directions, self.num_layers, self.heads,
                self.include_self)
        theirs = (transfer.graph, transfer.max_distance, tuple(p.directions), p.num_layers,
                  p.heads, p.include_self)
        if mine != theirs or self.kind == "learned" and p.fingerprint() != self.fingerprint:
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

    def graphs(self, index: Union[Tensor, Sequence[int]],
               device: Optional[Union[str, torch.device]] = None) -> DirectionalGraphs:
        """The graphs of documents ``index`` over their concatenated tokens (a PyG batch
        of them), on ``device`` (default: the cache's)."""
        index = self._check_index(index)
        lengths = self._lengths[index]
        ptr = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        seqs = SequenceBatch.from_ptr(ptr)
        out: List[Optional[LatentGraphs]] = []
        for d in DIRECTIONS:
            if d not in self.directions:
                out.append(None)
            elif self.kind == "learned":
                out.append(self._assemble(d, index, seqs))
            else:
                build = LatentGraphs.uniform if self.kind == "uniform" else LatentGraphs.adjacent
                g = build(ptr, num_layers=self.num_layers, num_heads=self.heads, direction=d,
                          include_self=self.include_self, order=self.orders[d])
                out.append(g if self.max_distance is None else g.within(self.max_distance))
        if device is not None and torch.device(device) != self.device:
            out = [None if g is None else g.to(device) for g in out]
        return DirectionalGraphs(*out)

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
            before = count.cumsum(-1) - count  # within the batch, per head
            # start of each (head, unit)'s edges in the store: its (head, document) run's
            # start, plus the edges of the document's earlier units
            start = layer["start"][:, index][:, seqs.batch] + before - \
                before[:, first][:, seqs.batch]
            count, start = count.flatten(), start.flatten()
            total = int(count.sum())
            gather = torch.repeat_interleave(start - count.cumsum(0) + count, count,
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
