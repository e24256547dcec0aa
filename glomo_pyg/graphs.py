"""The one graph object of the library: a stack of latent graphs over a batch."""
from __future__ import annotations

from typing import Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from glomo_pyg.sequences import SequenceBatch

LayerEdges = Tuple[Tensor, Tensor, Tensor]


class LatentGraphs:
    r"""Sparse weighted graphs emitted by a :class:`~glomo_pyg.GraphPredictor`.

    For every graph layer ``l`` the edges of all heads and all sequences of the
    batch are stored together:

    * ``edge_index[l]``: ``[2, E_l]`` int64, row 0 the source ``i``, row 1 the
      target ``j``, as flat node ids ``0..N-1`` (PyG's ``source_to_target``);
    * ``edge_weight[l]``: ``[E_l]``, :math:`G^{l,h}_{ij} > 0`;
    * ``edge_head[l]``: ``[E_l]`` head id of each edge.

    Edges are sorted by ``(head, target, source)``, so a CSR adjacency needs no
    sort. Per (layer, head, target) the incoming weights sum to 1, or the
    target has no incoming edge. No edge touches padding or crosses sequences.

    Two layouts hold the same graphs (:attr:`layout`): ``'sparse'``, the pruned
    edge lists above, and ``'dense'`` (:meth:`from_dense`), one padded
    ``[B, H, T, T]`` block per layer with ``[b, h, i, j] = G_ij``, which is
    faster to aggregate over short sequences and dense graphs.
    :meth:`to_sparse` / :meth:`to_dense_layout` convert; the layers of
    glomo_pyg accept both and give the same results. Export and analysis
    (``edge_index``, :meth:`layer`, :meth:`to_networkx`, ...) always see
    sparse edges, converted on demand.

    Args:
        edge_index, edge_weight, edge_head: one tensor per layer.
        num_heads: heads per layer.
        direction: ``'forward'`` (sources precede targets) or ``'backward'``.
        ptr: ``[B + 1]`` offsets of the sequences in the flat node order.
        include_self: whether ``i = j`` edges were allowed.
    """

    def __init__(self, edge_index: List[Tensor], edge_weight: List[Tensor], edge_head: List[Tensor],
                 *, num_heads: int, direction: str, ptr: Tensor, include_self: bool = False):
        if not (len(edge_index) == len(edge_weight) == len(edge_head)):
            raise ValueError("edge_index, edge_weight and edge_head need one entry per layer each")
        if direction not in ("forward", "backward"):
            raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")
        for l, (ei, ew, eh) in enumerate(zip(edge_index, edge_weight, edge_head)):
            if ei.dim() != 2 or ei.size(0) != 2 or ew.shape != (ei.size(1),) or eh.shape != ew.shape:
                raise ValueError(f"layer {l}: expected edge_index [2, E], edge_weight [E], "
                                 f"edge_head [E]; got {tuple(ei.shape)}, {tuple(ew.shape)}, "
                                 f"{tuple(eh.shape)}")
        self._edges: Optional[List[LayerEdges]] = list(zip(edge_index, edge_weight, edge_head))
        self._dense: Optional[List[Tensor]] = None
        self.num_heads = int(num_heads)
        self.direction = direction
        self.include_self = include_self
        self.sequences = SequenceBatch.from_ptr(ptr)

    @classmethod
    def from_dense(cls, dense: Union[Tensor, Sequence[Tensor]], *, direction: str, ptr: Tensor,
                   include_self: bool = False) -> "LatentGraphs":
        """Graphs in the dense layout: one ``[B, H, T, T]`` block per layer with
        ``[b, h, i, j] = G_ij`` (``T`` the longest sequence), zero at padding and
        at absent edges. ``dense`` is a list of blocks or an ``[L, B, H, T, T]``
        tensor."""
        blocks = list(dense.unbind(0)) if isinstance(dense, Tensor) else list(dense)
        if not blocks:
            raise ValueError("dense graphs need at least one layer")
        seqs = SequenceBatch.from_ptr(ptr)
        shape = blocks[0].shape
        for l, block in enumerate(blocks):
            if not isinstance(block, Tensor) or not block.dtype.is_floating_point or \
                    block.dim() != 4 or block.shape != shape or \
                    block.shape[0] != seqs.num_sequences or \
                    block.shape[2:] != (seqs.max_len, seqs.max_len):
                raise ValueError(f"layer {l}: dense graphs must be float [B, H, T, T] with B = "
                                 f"{seqs.num_sequences}, T = {seqs.max_len}, the same for every "
                                 f"layer; got {tuple(getattr(block, 'shape', ()))}")
        graphs = cls([], [], [], num_heads=shape[1], direction=direction, ptr=ptr,
                     include_self=include_self)
        graphs._edges, graphs._dense = None, blocks
        return graphs

    # --- storage ------------------------------------------------------------------
    @property
    def layout(self) -> str:
        """``'sparse'`` (pruned edge lists) or ``'dense'`` (per-sequence blocks)."""
        return "dense" if self._dense is not None else "sparse"

    def _sparse_edges(self) -> List[LayerEdges]:
        if self._edges is None:  # dense layout: converted once, on demand (export, analysis)
            self._edges = [self._block_to_edges(block) for block in self._dense]
        return self._edges

    def _block_to_edges(self, block: Tensor) -> LayerEdges:
        # (h, b, j, i) order = (head, flat target, source) order, as emitted graphs are sorted
        h, b, j, i = (block.transpose(-1, -2).transpose(0, 1) != 0).nonzero(as_tuple=True)
        offset = self.ptr[b]
        return torch.stack([offset + i, offset + j]), block[b, h, i, j], h

    @property
    def edge_index(self) -> List[Tensor]:
        return [e[0] for e in self._sparse_edges()]

    @property
    def edge_weight(self) -> List[Tensor]:
        return [e[1] for e in self._sparse_edges()]

    @property
    def edge_head(self) -> List[Tensor]:
        return [e[2] for e in self._sparse_edges()]

    def dense_layer(self, l: int) -> Tensor:
        """``[B, H, T, T]`` block of layer ``l`` (``[b, h, i, j] = G_ij``), converted
        from the edges in the sparse layout (differentiable either way)."""
        if self._dense is not None:
            return self._dense[l]
        return self.to_dense(layer=l)

    def to_sparse(self) -> "LatentGraphs":
        """The same graphs in the sparse layout (``self`` if already sparse)."""
        if self.layout == "sparse":
            return self
        return LatentGraphs(self.edge_index, self.edge_weight, self.edge_head,
                            num_heads=self.num_heads, direction=self.direction, ptr=self.ptr,
                            include_self=self.include_self)

    def to_dense_layout(self) -> "LatentGraphs":
        """The same graphs in the dense layout (``self`` if already dense)."""
        if self.layout == "dense":
            return self
        return LatentGraphs.from_dense([self.dense_layer(l) for l in range(self.num_layers)],
                                       direction=self.direction, ptr=self.ptr,
                                       include_self=self.include_self)

    @classmethod
    def uniform(cls, ptr: Tensor, *, num_layers: int, num_heads: int, direction: str,
                include_self: bool = False) -> "LatentGraphs":
        """The uniform baseline: every allowed source of a target gets the same weight
        (``1 / number of allowed sources``), the same graph for every layer and head.
        Same layout and conventions as emitted graphs (a target with no allowed
        source, e.g. the first unit going forward, gets no edge)."""
        if direction not in ("forward", "backward"):
            raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")
        if num_layers < 1 or num_heads < 1:
            raise ValueError("num_layers and num_heads must be positive")
        seqs = SequenceBatch.from_ptr(ptr)
        pos, length = seqs.position, seqs.lengths[seqs.batch]
        node = torch.arange(seqs.num_nodes, device=ptr.device)
        extra = int(include_self)
        if direction == "forward":  # sources ptr[b] .. j - 1 (or .. j)
            count, first = pos + extra, node - pos
        else:  # sources j + 1 .. end (or j ..)
            count, first = length - pos - 1 + extra, node + 1 - extra
        tgt = torch.repeat_interleave(node, count)
        offset = torch.arange(tgt.numel(), device=ptr.device) - (torch.cumsum(count, 0) - count)[tgt]
        src = first[tgt] + offset
        weight = (1.0 / count.clamp(min=1).double()).float()[tgt]
        edges = torch.stack([src, tgt]).repeat(1, num_heads)
        heads = torch.arange(num_heads, device=ptr.device).repeat_interleave(tgt.numel())
        weight = weight.repeat(num_heads)
        return cls([edges] * num_layers, [weight] * num_layers, [heads] * num_layers,
                   num_heads=num_heads, direction=direction, ptr=ptr, include_self=include_self)

    # --- layout -------------------------------------------------------------------
    @property
    def ptr(self) -> Tensor:
        return self.sequences.ptr

    @property
    def batch(self) -> Tensor:
        return self.sequences.batch

    @property
    def lengths(self) -> Tensor:
        return self.sequences.lengths

    @property
    def num_layers(self) -> int:
        return len(self._dense) if self._dense is not None else len(self._edges)

    @property
    def num_nodes(self) -> int:
        return self.sequences.num_nodes

    @property
    def num_sequences(self) -> int:
        return self.sequences.num_sequences

    @property
    def num_edges(self) -> List[int]:
        if self._dense is not None and self._edges is None:
            return [int(torch.count_nonzero(block)) for block in self._dense]
        return [ei.size(1) for ei in self.edge_index]

    @property
    def device(self) -> torch.device:
        return self.ptr.device

    def layer(self, l: int) -> LayerEdges:
        """``(edge_index, edge_weight, edge_head)`` of graph layer ``l`` (converted from
        the dense blocks in the dense layout)."""
        return self._sparse_edges()[l]

    def __iter__(self) -> Iterator[LayerEdges]:
        return (self.layer(l) for l in range(self.num_layers))

    def density(self) -> List[float]:
        """Fraction of allowed (source, target) pairs that carry an edge, per layer."""
        n = self.lengths.double()
        pairs = (n * (n + 1) / 2) if self.include_self else (n * (n - 1) / 2)
        total = float(pairs.sum()) * self.num_heads
        return [e / total if total else 0.0 for e in self.num_edges]

    # --- conversion ---------------------------------------------------------------
    def _map(self, fn) -> "LatentGraphs":
        if self._dense is not None:
            return LatentGraphs.from_dense([fn(t) for t in self._dense], direction=self.direction,
                                           ptr=fn(self.ptr), include_self=self.include_self)
        return LatentGraphs([fn(t) for t in self.edge_index], [fn(t) for t in self.edge_weight],
                            [fn(t) for t in self.edge_head], num_heads=self.num_heads,
                            direction=self.direction, ptr=fn(self.ptr), include_self=self.include_self)

    def to(self, device: Union[str, torch.device]) -> "LatentGraphs":
        return self._map(lambda t: t.to(device))

    def detach(self) -> "LatentGraphs":
        return self._map(lambda t: t.detach())

    def to_dense(self, layer: Optional[int] = None) -> Tensor:
        """Dense affinities ``[L, B, H, T_max, T_max]`` with ``[l, b, h, i, j] = G_ij``.

        Zero at padding and at pruned pairs. Differentiable w.r.t. the edge
        weights. With ``layer`` given, returns that layer's ``[B, H, T, T]``.
        """
        layers = range(self.num_layers) if layer is None else [layer]
        if self._dense is not None:
            out = [self._dense[l] for l in layers]
            return out[0] if layer is not None else torch.stack(out)
        b_, t_ = self.num_sequences, self.sequences.max_len
        out = []
        for l in layers:
            (src, tgt), w, h = self.layer(l)
            seq = self.batch[tgt]
            dense = w.new_zeros(b_, self.num_heads, t_, t_)
            out.append(dense.index_put((seq, h, src - self.ptr[seq], tgt - self.ptr[seq]), w))
        return out[0] if layer is not None else torch.stack(out)

    # --- analysis -----------------------------------------------------------------
    def _sample_edges(self, sample: int, layer: int, head: Optional[int] = None):
        """Local (source, target, head, weight) of one sequence's edges in one layer."""
        if not 0 <= sample < self.num_sequences:
            raise ValueError(f"sample must lie in [0, {self.num_sequences}), got {sample}")
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must lie in [0, {self.num_layers}), got {layer}")
        if head is not None and not 0 <= head < self.num_heads:
            raise ValueError(f"head must lie in [0, {self.num_heads}), got {head}")
        (src, tgt), weight, heads = self.layer(layer)
        lo, hi = int(self.ptr[sample]), int(self.ptr[sample + 1])
        keep = (tgt >= lo) & (tgt < hi)
        if head is not None:
            keep &= heads == head
        return src[keep] - lo, tgt[keep] - lo, heads[keep], weight[keep].detach()

    def to_networkx(self, sample: int, layer: Optional[int] = None, head: Optional[int] = None,
                    labels: Optional[Sequence] = None):
        """One sequence's graphs as a networkx graph.

        Nodes are the positions ``0..T-1`` of sequence ``sample``, with attributes
        ``position`` and, if ``labels`` (one per unit, e.g. token strings) is given,
        ``label``. Edges run source -> target with attribute ``weight``. With both
        ``layer`` and ``head`` given the result is a ``networkx.DiGraph``; otherwise a
        ``networkx.MultiDiGraph`` whose edge keys are ``(layer, head)`` over the
        unspecified layers and/or heads.
        """
        import networkx as nx

        length = int(self.lengths[sample]) if 0 <= sample < self.num_sequences else 0
        if labels is not None and len(labels) != length:
            raise ValueError(f"labels must have one entry per unit of sample {sample} "
                             f"({length}), got {len(labels)}")
        single = layer is not None and head is not None
        graph = nx.DiGraph() if single else nx.MultiDiGraph()
        layers = [layer] if layer is not None else list(range(self.num_layers))
        for l in layers:
            src, tgt, heads, weight = self._sample_edges(sample, l, head)
            for i, j, h, w in zip(src.tolist(), tgt.tolist(), heads.tolist(), weight.tolist()):
                if single:
                    graph.add_edge(i, j, weight=w)
                else:
                    graph.add_edge(i, j, key=(l, h), weight=w, layer=l, head=h)
        for t in range(length):
            graph.add_node(t, position=t, **({"label": labels[t]} if labels is not None else {}))
        return graph

    def adjacency(self, sample: int, layer: int, head: int) -> Tensor:
        """``G`` of one sequence, layer and head as a sparse COO ``[T, T]`` (``[i, j] = G_ij``)."""
        src, tgt, _, weight = self._sample_edges(sample, layer, head)
        t = int(self.lengths[sample])
        return torch.sparse_coo_tensor(torch.stack([src, tgt]), weight, (t, t)).coalesce()

    def hierarchical(self, sample: int, layer: int, head: int) -> Tensor:
        r"""Explicit :math:`\Lambda^l = G^1 G^2 \cdots G^l` of one sequence and head, as a
        sparse ``[T, T]`` (sparse-sparse products). For analysis only: transfer
        computes :math:`H\Lambda^l` by chained propagation and never forms it."""
        out = self.adjacency(sample, 0, head)
        for l in range(1, layer + 1):
            out = torch.sparse.mm(out, self.adjacency(sample, l, head)).coalesce()
        return out

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(layers={self.num_layers}, heads={self.num_heads}, "
                f"direction='{self.direction}', layout='{self.layout}', "
                f"sequences={self.num_sequences}, nodes={self.num_nodes}, edges={self.num_edges})")
