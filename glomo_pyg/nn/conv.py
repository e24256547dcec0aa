"""GlomoConv: per-head weighted aggregation along latent graphs (paper Eq. 2)."""
from __future__ import annotations

import numbers
import weakref
from typing import Any, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn.aggr import MultiAggregation
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.typing import Adj, OptTensor, SparseTensor
from torch_geometric.utils import is_sparse

from glomo_pyg.graphs import LatentGraphs
from glomo_pyg.kernels import (
    check_dense_graph_values,
    check_graph_values,
    checked_edge_index,
    dense_head_propagate,
    head_blocked_index,
    interleaved_index,
    is_compiling,
    spmm_unchecked,
)
from glomo_pyg.sequences import SequenceBatch, check_dtype, sequence_batch

UPDATES = (None, "gru", "residual")
FUSED_AGGRS = ("add", "sum")  # what the one-spmm product computes


class HeadGraph(NamedTuple):
    """A multi-head graph as one graph over ``N H`` nodes: head ``h``'s copy of node ``v``
    at ``v H + h`` (a view of ``x``) or, when ``blocked``, at ``h N + v`` (no sort, but
    ``x`` is copied). ``perm`` puts the user's edges in ``edge_index``'s order."""

    edge_index: Tensor
    perm: Optional[Tensor]
    heads: int
    blocked: bool

    def features(self, x: Tensor) -> Tensor:
        n, c = x.size(0), x.size(1) // self.heads
        if self.blocked:
            return x.view(n, self.heads, c).transpose(0, 1).reshape(self.heads * n, c)
        return x.view(n * self.heads, c)

    def output(self, out: Tensor, n: int) -> Tensor:
        c = out.size(1)
        if self.blocked:
            out = out.view(self.heads, n, c).transpose(0, 1)
        return out.reshape(n, self.heads * c)


def _ref(t: Optional[Tensor]):
    """``(weakref, version)`` of ``t``, ``None`` for no tensor, ``False`` when ``t`` cannot
    be tracked (inference-mode tensors keep no version)."""
    if t is None:
        return None
    if t.is_inference():
        return False
    return weakref.ref(t), t._version


def _same(ref, t: Optional[Tensor]) -> bool:
    if ref is None or t is None:
        return ref is None and t is None
    return ref is not False and ref[0]() is t and ref[1] == t._version


class CheckedGraph(NamedTuple):
    """A user's graph as its first call checked and indexed it: the graph over ``N H``
    nodes, the host-side facts it holds for (nodes, fused, edges) and, for a sparse
    adjacency, its weights in the graph's order."""

    graph: HeadGraph
    facts: Tuple[int, bool, int]
    weights: Optional[Tensor]
    given: tuple = ()  # (edge_weight, edge_head) as (weakref, version): EdgeIndex only

    def holds(self, facts: tuple, edge_weight: OptTensor, edge_head: OptTensor) -> bool:
        return self.facts == facts and _same(self.given[0], edge_weight) and \
            _same(self.given[1], edge_head)


# the attribute of an EdgeIndex that keeps what GlomoConv checked of it (an EdgeIndex is
# immutable by PyG's contract, and keeps its CSR pointers the same way)
CHECKED_ATTRIBUTE = "_glomo_checked"


class GlomoConv(MessagePassing):
    r"""The GLoMo propagation layer: mixes node features along weighted graphs, one per
    head (paper Eq. 2).

    The ``channels`` of :math:`\mathbf{x}` are split into ``heads`` equal chunks
    :math:`\mathbf{x}^{(h)}`; head :math:`h` aggregates its chunk along the edges of
    head :math:`h` (with ``aggr='sum'``, the paper's):

    .. math::
        \mathbf{c}_j^{(h)} = \bigoplus_{i \,:\, (i \to j) \in \mathcal{E}_h}
        G^{(h)}_{ij} \, \mathbf{x}_i^{(h)}, \qquad
        \mathbf{c}_j = \big\Vert_{h=1}^{H} \mathbf{c}_j^{(h)}

    followed by the update :math:`v`:

    * ``update=None``: :math:`\mathbf{x}'_j = \mathbf{c}_j`;
    * ``update='residual'``: :math:`\mathbf{x}'_j = \mathbf{x}_j + \mathbf{W}\mathbf{c}_j`;
    * ``update='gru'``: :math:`\mathbf{x}'_j = \mathrm{GRU}([\mathbf{c}_j \odot
      \mathbf{x}_j \,\Vert\, \mathbf{c}_j], \mathbf{x}_j)` (the reference
      implementation's cell input).

    The heads run as one graph over ``N H`` nodes through PyG's :meth:`propagate`, so
    ``aggr``, hooks and :class:`~torch_geometric.explain.Explainer` behave as for PyG's
    layers; ``aggr='sum'`` with ``fused=True`` takes :meth:`message_and_aggregate` (one
    CSR spmm, no ``[E, C]`` messages).

    A user-given graph is checked at each call (``ValueError`` for node ids, heads or
    weights out of range: one device sync) and indexed over ``N H`` nodes. Where it is
    the same every call, say so and pay once, as with PyG's ``GCNConv(cached=True)``:
    ``cached=True`` keeps the first call's checked index for every later call (no check,
    no host-device sync; weights are taken anew each call, with their gradients), or give
    an :class:`~torch_geometric.EdgeIndex`, which keeps what was checked of it with its
    own pointers (checked again for other weights or heads, or for ones edited in place).

    Args:
        channels (int): node feature size, divisible by ``heads``.
        heads (int, optional): number of graphs per call. (default: :obj:`1`)
        update (str, optional): ``None``, ``'residual'`` or ``'gru'``. (default: :obj:`None`)
        fused (bool, optional): with ``aggr='sum'``, the one-spmm product; ``False``
            routes through PyG's gather/scatter (same numbers). (default: :obj:`True`)
        cached (bool, optional): reuse the graph of the first call for every later call
            (for a fixed graph, e.g. transductive learning; :meth:`reset_parameters`
            forgets it). Later calls must give graphs of the same size; their edges are
            not read again. (default: :obj:`False`)
        aggr (str or Aggregation, optional): the aggregation of each head's messages,
            not one that changes the width. (default: :obj:`"sum"`)
        **kwargs (optional): additional arguments of
            :class:`torch_geometric.nn.conv.MessagePassing`.

    Shapes:
        - **input:**
          node features :math:`(|\mathcal{V}|, C)`,
          edge indices :math:`(2, |\mathcal{E}|)` (row 0 source, row 1 target; a plain
          tensor or an :class:`~torch_geometric.EdgeIndex`) *or* a sparse adjacency
          ``adj_t`` (:obj:`torch.sparse` or :class:`torch_sparse.SparseTensor`) of shape
          :math:`(|\mathcal{V}|, |\mathcal{V}|)` (shared by all heads) or, for
          :obj:`torch.sparse`, :math:`(H, |\mathcal{V}|, |\mathcal{V}|)`, indexed
          ``[head, target, source]`` as PyG's transposed adjacencies are,
          edge weights :math:`(|\mathcal{E}|)` (default all ones),
          edge heads :math:`(|\mathcal{E}|)` (default: every edge feeds every head)
        - **output:** node features :math:`(|\mathcal{V}|, C)`
    """

    SUPPORTS_FUSED_EDGE_INDEX = True

    def __init__(self, channels: int, heads: int = 1, update: Optional[str] = None,
                 fused: bool = True, aggr: Any = "sum", cached: bool = False, **kwargs):
        if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
                   for v in (channels, heads)):
            raise TypeError(f"channels and heads must be integers, got {channels!r} and "
                            f"{heads!r}")
        channels, heads = int(channels), int(heads)
        wrong = []
        if channels <= 0 or heads <= 0 or channels % heads:
            wrong.append(f"channels ({channels}) must be a positive multiple of heads ({heads})")
        if update not in UPDATES:
            wrong.append(f"update must be one of {UPDATES}, got {update!r}")
        if isinstance(aggr, (list, tuple, MultiAggregation)):
            wrong.append(f"aggr={aggr!r} changes the width (each head aggregates into its "
                         f"own channels: use one aggregation)")
        if wrong:
            raise ValueError("; ".join(wrong))
        super().__init__(aggr=aggr, node_dim=0, **kwargs)
        self.channels, self.heads, self.update_kind = channels, heads, update
        self.fused, self.cached = fused, bool(cached)
        self.fuse = bool(fused) and self.aggr in FUSED_AGGRS
        self._cached_graph: Optional[CheckedGraph] = None
        self._cached_sequences: Optional[SequenceBatch] = None
        self._cached_weights: Optional[Tuple[Tensor, int, Tensor]] = None
        self.gru = torch.nn.GRUCell(2 * channels, channels) if update == "gru" else None
        self.lin = torch.nn.Linear(channels, channels) if update == "residual" else None
        self.reset_parameters()

    def reset_parameters(self):
        super().reset_parameters()
        self._cached_graph = self._cached_sequences = None
        self._cached_weights = None
        for update in (self.gru, self.lin):
            if update is not None:
                update.reset_parameters()

    def forward(self, x: Tensor, edge_index: Adj, edge_weight: OptTensor = None,
                edge_head: OptTensor = None) -> Tensor:
        graph, edge_weight = self._head_graph(x, edge_index, edge_weight, edge_head)
        out = self.propagate(graph.edge_index, x=graph.features(x), edge_weight=edge_weight)
        return self._update(x, graph.output(out, x.size(0)))

    def _check_input(self, edge_index: Any, size: Any) -> List[Optional[int]]:
        # PyG reads an EdgeIndex's sizes (``num_rows``: a SymInt under dynamic shapes,
        # which Dynamo cannot trace). While compiling, the graph propagate gets is the one
        # :meth:`_index` built from input checked at the door, square over the rows of
        # the features it is given: PyG then takes the size from them.
        if is_compiling() and isinstance(edge_index, EdgeIndex):
            return [None, None]
        return super()._check_input(edge_index, size)

    def message(self, x_j: Tensor, edge_weight: Tensor) -> Tensor:
        return edge_weight.view(-1, 1).to(x_j.dtype) * x_j

    def message_and_aggregate(self, edge_index: EdgeIndex, x: Tensor,
                              edge_weight: Tensor) -> Tensor:
        # edge_index is sorted by target (the CSR rows of A = G^T); the EdgeIndex keeps
        # its pointers, so a graph given again does not rebuild them
        cols, rows = edge_index.as_tensor()
        row_ptr = None if is_compiling() else edge_index.get_indptr()
        return spmm_unchecked(rows, cols, edge_weight, x, x.size(0), row_ptr)

    def forward_dense(self, x: Tensor, adj: Tensor, batch: OptTensor = None) -> Tensor:
        """The dense layout: blocks ``adj`` ``[B, H, T, T]`` (or ``[B, T, T]``, one graph
        for all channels) with ``[b, h, i, j] = G_ij``, for the sequences of ``batch``.
        ``adj`` must be finite, as edge weights must (``ValueError`` otherwise; one device
        sync, which ``cached=True`` pays on the first call only, as for edge weights);
        feature values are not checked."""
        self._check_x(x)
        trusted = self.cached and self._cached_sequences is not None  # (as edge weights are)
        seqs = self._sequences(x, batch)
        block = adj.unsqueeze(1) if isinstance(adj, Tensor) and adj.dim() == 3 else adj
        heads = 1 if adj.dim() == 3 else self.heads
        want = (seqs.num_sequences, heads, seqs.max_len, seqs.max_len)
        if not isinstance(adj, Tensor) or not adj.is_floating_point() or \
                tuple(block.shape) != want:
            raise ValueError(f"adj: dense graph blocks must have shape [B, H, T, T] = "
                             f"{list(want)} (or [B, T, T]) for this batch and a "
                             f"floating-point dtype, got "
                             f"{tuple(adj.shape) if isinstance(adj, Tensor) else type(adj)}")
        if not trusted:  # the rule for edge weights: finite
            check_dense_graph_values(block)
        n = x.size(0)
        if n == seqs.num_sequences * seqs.max_len:  # no padding: stay in [B, T, H, c]
            xb = x.view(seqs.num_sequences, seqs.max_len, heads, -1).transpose(1, 2)
            out = (block.transpose(-1, -2).to(x.dtype) @ xb).transpose(1, 2)
        else:
            xb = x.view(n, heads, -1).transpose(0, 1)
            out = dense_head_propagate(xb, block, seqs.ptr, seqs.position,
                                       seqs.batch).transpose(0, 1)
        return self._update(x, out.reshape(n, -1))

    def propagate_graphs(self, x: Tensor, graphs: LatentGraphs, layer: int) -> Tensor:
        """Aggregate (sum) along layer ``layer`` of ``graphs`` (validated when built: no
        host synchronisation here), then update."""
        if not isinstance(graphs, LatentGraphs):
            raise TypeError(f"graphs must be LatentGraphs (e.g. a predictor's forward graphs), "
                            f"got {type(graphs).__name__}")
        self._check_x(x)
        n = x.size(0)
        if graphs.num_heads != self.heads or graphs.num_nodes != n:
            raise ValueError(f"graphs have {graphs.num_heads} heads over {graphs.num_nodes} "
                             f"units; this layer needs {self.heads} heads over {n}")
        xb = x.view(n, self.heads, self.channels // self.heads).transpose(0, 1)
        c = graphs.propagate(xb, layer)
        return self._update(x, c.transpose(0, 1).reshape(n, self.channels))

    def _update(self, x: Tensor, c: Tensor) -> Tensor:
        if self.gru is not None:
            return self.gru(torch.cat([c * x, c], dim=-1), x)
        if self.lin is not None:
            return x + self.lin(c)
        return c

    def _head_graph(self, x: Tensor, edge_index: Adj, edge_weight: OptTensor,
                    edge_head: OptTensor) -> Tuple[HeadGraph, Tensor]:
        """The user's graph over ``N H`` nodes, checked (once where it may be reused), and
        its weights in that graph's order."""
        self._check_x(x)
        n = x.size(0)
        fused = self.fuse and not self.explain  # Explainer's masks follow the user's order
        if self._cached_graph is not None:
            return self._from_cache(x, edge_weight, fused)
        given = (edge_index, edge_weight, edge_head)
        sparse = is_sparse(edge_index)
        if sparse:
            edge_index, edge_weight, edge_head = self._sparse_edges(edge_index, edge_weight,
                                                                    edge_head, n)
        else:
            self._check_edges(x, edge_index, edge_weight, edge_head)
            edge_index = edge_index.long() if edge_index.numel() == 0 else edge_index
        if edge_weight is None:
            edge_weight = x.new_ones(edge_index.size(1))
        if is_compiling():  # the check inside the compiled code, on its tensors
            edge_index = checked_edge_index(x, edge_index, given[1] if not sparse else
                                            edge_weight, edge_head, self.heads)
            graph = self._index(edge_index, edge_head, n, fused, blocked=True)
            return graph, edge_weight if graph.perm is None else edge_weight[graph.perm]
        checked = self._checked(given, sparse, edge_index, edge_weight, edge_head, n, fused)
        if checked.weights is not None:
            return checked.graph, checked.weights
        perm = checked.graph.perm
        ordered = perm is not None and given[1] is not None  # (ones need no order)
        return checked.graph, edge_weight[perm] if ordered else edge_weight

    def _checked(self, given: tuple, sparse: bool, edge_index: Tensor, edge_weight: Tensor,
                 edge_head: OptTensor, num_nodes: int, fused: bool) -> CheckedGraph:
        """``given`` checked and indexed, or what an EdgeIndex given again keeps of it. A
        graph seen once is indexed head-blocked (no sort); one that will be reused is
        worth the one sort of the copy-free interleaved index."""
        facts = (num_nodes, fused, edge_index.size(1))  # host-side facts, no tensor
        keeper = given[0] if isinstance(given[0], EdgeIndex) else None
        kept = getattr(keeper, CHECKED_ATTRIBUTE, None)
        if kept is not None and kept.holds(facts, given[1], given[2]):
            return kept
        check_graph_values(edge_index, edge_weight if sparse else given[1], edge_head,
                           num_nodes, self.heads)
        reused = self.cached or keeper is not None
        graph = self._index(edge_index, edge_head, num_nodes, fused, blocked=not reused)
        weights = None
        if sparse and not (torch.is_grad_enabled() and edge_weight.requires_grad):
            weights = edge_weight if graph.perm is None else edge_weight[graph.perm]
        checked = CheckedGraph(graph, facts, weights, (_ref(given[1]), _ref(given[2])))
        if self.cached:
            self._cached_graph = checked._replace(given=())
        elif keeper is not None and False not in checked.given:
            setattr(keeper, CHECKED_ATTRIBUTE, checked)
        return checked

    def _from_cache(self, x: Tensor, edge_weight: OptTensor,
                    fused: bool) -> Tuple[HeadGraph, Tensor]:
        """``cached=True`` after the first call: its graph, with this call's weights."""
        cached = self._cached_graph
        assert cached is not None  # (the caller's test)
        nodes, was_fused, edges = cached.facts
        if (x.size(0), fused) != (nodes, was_fused):
            raise ValueError(f"cached=True: this layer keeps the graph of its first call, "
                             f"over {nodes} nodes; got {x.size(0)} nodes (another graph: "
                             f"reset_parameters() first, or cached=False)")
        if cached.weights is not None:
            return cached.graph, cached.weights
        if edge_weight is None:
            return cached.graph, x.new_ones(edges)
        if not isinstance(edge_weight, Tensor) or edge_weight.shape != (edges,) or \
                not edge_weight.is_floating_point() or edge_weight.device != x.device:
            raise ValueError(f"cached=True: edge_weight must be a floating-point tensor of "
                             f"the cached graph's {edges} edges on x's device, got "
                             + (f"{edge_weight.dtype} {tuple(edge_weight.shape)}"
                                if isinstance(edge_weight, Tensor) else
                                type(edge_weight).__name__))
        return cached.graph, self._ordered_weights(edge_weight, cached.graph.perm)

    def _ordered_weights(self, edge_weight: Tensor, perm: Optional[Tensor]) -> Tensor:
        """``edge_weight`` in the cached graph's order; the same unchanged tensor given
        again without gradients reuses its last reordering (the layer holds that tensor,
        so its identity cannot pass to another)."""
        if perm is None:
            return edge_weight
        if (torch.is_grad_enabled() and edge_weight.requires_grad) or edge_weight.is_inference():
            return edge_weight[perm]  # (with its autograd graph, or no version to compare)
        kept = self._cached_weights
        if kept is not None and kept[0] is edge_weight and kept[1] == edge_weight._version:
            return kept[2]
        ordered = edge_weight[perm]
        self._cached_weights = (edge_weight, edge_weight._version, ordered)
        return ordered

    def _index(self, edge_index: Tensor, edge_head: OptTensor, n: int, fused: bool,
               blocked: bool) -> HeadGraph:
        heads = 1 if edge_head is None else self.heads  # None: one graph for all channels
        head = torch.zeros_like(edge_index[0]) if edge_head is None else edge_head
        if not fused:  # PyG's gather/scatter takes the edges in any order, as given
            flat = torch.stack([edge_index[0] * heads + head, edge_index[1] * heads + head])
            return HeadGraph(flat, None, heads, False)
        if blocked:
            rows, cols, perm = head_blocked_index(edge_index, head, n, False, heads)
        else:
            rows, cols, perm = interleaved_index(edge_index, head, n, heads)
        size = n * heads
        index = EdgeIndex(torch.stack([cols, rows]), sparse_size=(size, size),
                          sort_order="col")
        return HeadGraph(index, perm, heads, blocked)

    def _sparse_edges(self, adj_t, edge_weight: OptTensor, edge_head: OptTensor, n: int
                      ) -> Tuple[Tensor, Tensor, OptTensor]:
        if isinstance(adj_t, SparseTensor):
            adj_t = adj_t.to_torch_sparse_coo_tensor()
        extra = edge_weight is not None or edge_head is not None
        if extra or adj_t.dim() not in (2, 3) or adj_t.shape[-2:] != (n, n) or \
                (adj_t.dim() == 3 and adj_t.size(0) != self.heads):
            raise ValueError(f"a sparse adjacency must be [N, N] or [H, N, N] with N = {n} "
                             f"and H = heads = {self.heads} and holds its own weights and "
                             f"heads (do not pass edge_weight or edge_head), got "
                             f"{tuple(adj_t.shape)}" + (" with them" if extra else ""))
        coo = adj_t.to_sparse_coo().coalesce()  # sorted by (head, target, source)
        idx, val = coo.indices(), coo.values()
        head = idx[0] if adj_t.dim() == 3 else None
        return torch.stack([idx[-1], idx[-2]]), val, head

    def _sequences(self, x: Tensor, batch: OptTensor) -> SequenceBatch:
        """The sequences of a PyG ``batch`` vector (with ``cached=True``: the first call's,
        for calls over as many nodes)."""
        cached = self._cached_sequences
        if cached is not None and cached.num_nodes == x.size(0) and \
                cached.ptr.device == x.device:
            return cached
        seqs = sequence_batch(x.size(0), batch, x.device)
        if self.cached:
            self._cached_sequences = seqs
        return seqs

    def _check_x(self, x: Tensor) -> None:
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor [N, {self.channels}], got "
                            + (f"dtype {x.dtype}" if isinstance(x, Tensor) else type(x).__name__))
        if x.dim() != 2 or x.size(1) != self.channels:
            raise ValueError(f"x must have shape [N, {self.channels}], got {tuple(x.shape)}")
        params = self.gru if self.gru is not None else self.lin
        if params is not None:  # the update meets the parameters (host-side, no sync)
            check_dtype(x, next(params.parameters()).dtype,
                        owner=f"GlomoConv(update={self.update_kind!r})'s parameters")

    @staticmethod
    def _check_edges(x: Tensor, edge_index: Tensor, edge_weight: OptTensor,
                     edge_head: OptTensor) -> None:
        """Types, shapes and devices: host-side facts, known while tracing too."""
        if not isinstance(edge_index, Tensor) or (edge_index.dtype != torch.long and
                                                  edge_index.numel()):
            raise TypeError(f"edge_index must be an int64 tensor [2, E] or a sparse adjacency "
                            f"(dense graph blocks: forward_dense), got "
                            f"{getattr(edge_index, 'dtype', type(edge_index).__name__)}")
        if edge_index.dim() != 2 or edge_index.size(0) != 2 or edge_index.device != x.device:
            raise ValueError(f"edge_index must have shape [2, E] and be on x's device "
                             f"({x.device}), got {tuple(edge_index.shape)} on {edge_index.device}")
        e = edge_index.size(1)
        for name, t, kind in (("edge_weight", edge_weight, "a floating-point"),
                              ("edge_head", edge_head, "an int64")):
            if t is None:
                continue
            typed = isinstance(t, Tensor) and (t.dtype == torch.long if name == "edge_head"
                                               else t.is_floating_point())
            if not typed or t.shape != (e,) or t.device != x.device:
                got = f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, Tensor) \
                    else type(t).__name__
                error = TypeError if not typed else ValueError
                raise error(f"{name} must be {kind} tensor of shape [E] = [{e}] on x's "
                                 f"device ({x.device}), got {got}")

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.channels}, heads={self.heads}, "
                f"update={self.update_kind!r}, aggr={self.aggr!r})")
