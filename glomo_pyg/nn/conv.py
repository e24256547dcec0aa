"""GlomoConv: per-head weighted aggregation along latent graphs (paper Eq. 2)."""
from __future__ import annotations

import operator
import weakref
from typing import Optional, Tuple

import torch
from torch import Tensor
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.utils import is_torch_sparse_tensor

import warnings

from glomo_pyg.graphs import LatentGraphs
from glomo_pyg.kernels import (check_graph_values, checked_edge_index, dense_head_propagate,
                               head_blocked_index, interleaved_index, is_compiling,
                               spmm_unchecked)
from glomo_pyg.sequences import check_dtype, sequence_batch

UPDATES = (None, "gru", "residual")


class _Seen:
    """What a :class:`GlomoConv` remembers of the last graph given to :meth:`forward`
    (PyG's pattern: the same ``edge_index`` every step): weak references to its tensors
    with their version counters, and the index built from it. A tensor
    matches when it is the same object at the same version: torch bumps the version on
    every in-place write, so an edited graph is checked again. (Writes that bypass torch,
    e.g. through a numpy array sharing the memory, are not seen: give a new tensor.)"""

    __slots__ = ("index_refs", "weight_ref", "index", "sorted_weight")

    def __init__(self, index_refs, weight_ref, index, sorted_weight=None):
        self.index_refs, self.weight_ref, self.index = index_refs, weight_ref, index
        # the weights in the index's order, kept only where no autograd graph hangs on them
        self.sorted_weight = sorted_weight

    @staticmethod
    def ref(t: Optional[Tensor]):
        """``(weakref, version)`` of ``t``; ``None`` for no tensor; ``False`` when ``t``
        cannot be tracked (an inference-mode tensor keeps no version counter)."""
        if t is None:
            return None
        if t.is_inference():
            return False
        return weakref.ref(t), t._version

    @staticmethod
    def same(ref, t: Optional[Tensor]) -> bool:
        if ref is None or t is None:
            return ref is None and t is None
        return ref is not False and ref[0]() is t and ref[1] == t._version


# one entry per layer, dropped with it (not a module attribute: weak references do not
# deep-copy or pickle)
_SEEN: "weakref.WeakKeyDictionary[GlomoConv, _Seen]" = weakref.WeakKeyDictionary()


class GlomoConv(MessagePassing):
    r"""The GLoMo propagation layer: mixes node features along weighted graphs,
    one graph per head (paper Eq. 2).

    The ``channels`` of :math:`\mathbf{x}` are split into ``heads`` equal
    chunks :math:`\mathbf{x}^{(h)}`; head :math:`h` aggregates its chunk along
    the edges of head :math:`h`:

    .. math::
        \mathbf{c}_j^{(h)} = \sum_{i \,:\, (i \to j) \in \mathcal{E}_h}
        G^{(h)}_{ij} \, \mathbf{x}_i^{(h)}, \qquad
        \mathbf{c}_j = \big\Vert_{h=1}^{H} \mathbf{c}_j^{(h)}

    followed by the update :math:`v`:

    * ``update=None``: :math:`\mathbf{x}'_j = \mathbf{c}_j`;
    * ``update='residual'``: :math:`\mathbf{x}'_j = \mathbf{x}_j + \mathbf{W}\mathbf{c}_j`;
    * ``update='gru'``: :math:`\mathbf{x}'_j = \mathrm{GRU}([\mathbf{c}_j \odot
      \mathbf{x}_j \,\Vert\, \mathbf{c}_j], \mathbf{x}_j)` (the reference
      implementation's cell input).

    In matrix form the aggregation is ``A @ X`` per head with ``A = G^T``. It
    runs as one CSR spmm over all heads (``fused=True``), never forming the
    ``[E, channels]`` message tensor; gradients reach ``x`` and
    ``edge_weight``. ``fused=False`` routes through PyG's generic
    gather/scatter ``propagate`` instead (same numbers; for comparison).
    Edges may come in any order (they are sorted by target when needed, also
    under ``torch.compile``). Input is validated at the door: ids in range, NaN or
    Inf in ``x`` or ``edge_weight`` refused (``ValueError``), with one device sync for
    all of it; under ``torch.compile`` the same check runs inside the compiled code (an
    opaque operator, :func:`~glomo_pyg.kernels.checked_edge_index`), so a hostile graph
    raises the same error and is never read out of bounds. A graph is validated and
    indexed once: given again (the same ``edge_index``, ``edge_head`` and
    ``edge_weight`` tensors, unchanged, as in the usual PyG loop over a fixed graph) only
    ``x`` is checked, and the product reads ``x`` without copying it. "Unchanged" is
    PyG's ``EdgeIndex`` contract: torch's version counter, which every in-place write
    through torch bumps (a write through a numpy array sharing the memory is not seen:
    give a new tensor after one). With an update, ``x`` must have the
    parameters' dtype unless autocast is on. Empty input (no nodes, no edges) gives
    an empty or zero aggregation.

    Three entry points take the graphs in their three forms: :meth:`forward`
    (PyG edges or a ``torch.sparse`` adjacency), :meth:`forward_dense` (dense
    per-sequence blocks) and :meth:`propagate_graphs` (one layer of
    :class:`~glomo_pyg.LatentGraphs`, in either layout).

    Args:
        channels (int): node feature size, divisible by ``heads``.
        heads (int, optional): number of graphs per call. (default: :obj:`1`)
        update (str, optional): ``None``, ``'residual'`` or ``'gru'``.
            (default: :obj:`None`)
        fused (bool, optional): use the spmm path. (default: :obj:`True`)
        **kwargs (optional): additional arguments of
            :class:`torch_geometric.nn.conv.MessagePassing`.

    Shapes:
        - **input:**
          node features :math:`(|\mathcal{V}|, C)`,
          edge indices :math:`(2, |\mathcal{E}|)` (row 0 source, row 1 target)
          *or* a :obj:`torch.sparse` adjacency ``adj_t`` of shape
          :math:`(|\mathcal{V}|, |\mathcal{V}|)` (shared by all heads) or
          :math:`(H, |\mathcal{V}|, |\mathcal{V}|)`, indexed ``[head, target, source]``
          as PyG's transposed sparse adjacencies are,
          edge weights :math:`(|\mathcal{E}|)` (default all ones),
          edge heads :math:`(|\mathcal{E}|)` (default: every edge feeds every head)
        - **output:** node features :math:`(|\mathcal{V}|, C)`
    """

    def __init__(self, channels: int, heads: int = 1, update: Optional[str] = None,
                 fused: bool = True, **kwargs):
        kwargs.setdefault("aggr", "add")
        super().__init__(node_dim=0, **kwargs)
        try:
            if isinstance(channels, bool) or isinstance(heads, bool):
                raise TypeError
            channels, heads = operator.index(channels), operator.index(heads)
        except TypeError:
            raise TypeError(f"channels and heads must be integers, got {channels!r} and "
                            f"{heads!r}") from None
        if channels <= 0 or heads <= 0 or channels % heads:
            raise ValueError(f"channels ({channels}) must be a positive multiple of heads ({heads})")
        if update not in UPDATES:
            raise ValueError(f"update must be one of {UPDATES}, got {update!r}")
        self.channels = channels
        self.heads = heads
        self.update_kind = update
        self.fused = fused
        self.gru = torch.nn.GRUCell(2 * channels, channels) if update == "gru" else None
        self.lin = torch.nn.Linear(channels, channels) if update == "residual" else None
        self.reset_parameters()

    def reset_parameters(self):
        super().reset_parameters()
        if self.gru is not None:
            self.gru.reset_parameters()
        if self.lin is not None:
            self.lin.reset_parameters()

    def forward(self, x: Tensor, edge_index: Tensor, edge_weight: Optional[Tensor] = None,
                edge_head: Optional[Tensor] = None, batch: Optional[Tensor] = None) -> Tensor:
        if isinstance(edge_index, Tensor) and edge_index.is_floating_point() and \
                edge_index.dim() in (3, 4) and not is_torch_sparse_tensor(edge_index):
            warnings.warn("passing dense graph blocks as edge_index is deprecated: call "
                          "GlomoConv.forward_dense(x, adj, batch)", DeprecationWarning,
                          stacklevel=2)
            if edge_weight is not None or edge_head is not None:
                raise ValueError("with dense graph blocks, weights and heads come from the "
                                 "tensor itself; do not pass edge_weight or edge_head")
            return self.forward_dense(x, edge_index, batch)
        num_nodes = x.size(0) if isinstance(x, Tensor) and x.dim() else 0
        if isinstance(edge_index, Tensor) and edge_index.dim() == 2 and \
                edge_index.size(0) == 2 and edge_index.size(1) == 0 and \
                edge_index.dtype != torch.long and not is_torch_sparse_tensor(edge_index):
            edge_index = edge_index.long()  # torch.zeros(2, 0) is float: no id to misread
        if isinstance(edge_index, Tensor) and is_torch_sparse_tensor(edge_index):
            if edge_weight is not None or edge_head is not None:
                raise ValueError("with a torch.sparse adjacency, weights and heads come from the "
                                 "tensor itself; do not pass edge_weight or edge_head")
            edge_index, edge_weight, edge_head = self._edges_from_sparse(edge_index, num_nodes)
        self._check(x, edge_index, edge_weight, edge_head)
        index = None
        if is_compiling():
            # the values are checked where the graph runs: an opaque operator that torch
            # compiles around, so bad ids raise the eager error instead of reading or
            # writing outside x (a compiled product does not check indices)
            edge_index = checked_edge_index(x, edge_index, edge_weight, edge_head, self.heads)
        else:
            # a graph given again (same tensors, unchanged) was validated and indexed
            # before: only the features are checked (validate once, as PyG's EdgeIndex
            # remembers its sort order)
            index_refs = (_Seen.ref(edge_index), _Seen.ref(edge_head), x.size(0))
            seen = _SEEN.get(self)
            known = seen is not None and x.size(0) == seen.index_refs[2] and \
                _Seen.same(seen.index_refs[0], edge_index) and \
                _Seen.same(seen.index_refs[1], edge_head)
            weights_known = known and _Seen.same(seen.weight_ref, edge_weight)
            check_graph_values(x, edge_index, edge_weight, edge_head, self.heads,
                               ids=not known, weights=not weights_known)
            index = seen.index if known else None
        given_weight = edge_weight
        if edge_weight is None:
            edge_weight = x.new_ones(edge_index.size(1))
        # (weights permuted without gradients cannot serve a call that needs them)
        reuse = seen.sorted_weight if index is not None and weights_known and not (
            torch.is_grad_enabled() and edge_weight.requires_grad) else None
        out, built, sorted_weight = self._aggregate(x, edge_index, edge_weight, edge_head,
                                                    index, reuse)
        if not is_compiling() and index_refs[0] is not False and index_refs[1] is not False:
            keep = sorted_weight if given_weight is not None and not (
                torch.is_grad_enabled() and sorted_weight.requires_grad) else None
            _SEEN[self] = _Seen(index_refs, _Seen.ref(given_weight), built,
                                keep if built[3] is not None else None)
        return self._update(x, out)

    def forward_dense(self, x: Tensor, adj: Tensor, batch: Optional[Tensor] = None) -> Tensor:
        """The dense layout: per-sequence blocks ``adj`` ``[B, H, T, T]`` (or
        ``[B, T, T]``, one graph for all channels) with ``[b, h, i, j] = G_ij``, for
        the sequences of the sorted PyG ``batch`` vector; batched matmuls."""
        if not isinstance(adj, Tensor) or not adj.dtype.is_floating_point or \
                adj.dim() not in (3, 4):
            raise ValueError("adj must be floating-point dense blocks [B, H, T, T] or [B, T, T]")
        return self._update(x, self._aggregate_dense(x, adj, batch))

    def propagate_graphs(self, x: Tensor, graphs: LatentGraphs, layer: int) -> Tensor:
        """Aggregate along graph layer ``layer`` of ``graphs`` (head ``h`` uses the
        ``h``-th chunk of the channels), then update. ``graphs`` must have ``heads``
        heads and cover the rows of ``x``; they were validated when built, so this
        path does no host synchronisation (and so does not test ``x`` for NaN/Inf: callers
        pass features they produced or checked)."""
        if not isinstance(graphs, LatentGraphs):
            raise TypeError(f"graphs must be LatentGraphs (e.g. a predictor's forward graphs), "
                            f"got {type(graphs).__name__}")
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor [N, {self.channels}], got "
                            + (f"dtype {x.dtype}" if isinstance(x, Tensor) else type(x).__name__))
        if x.dim() != 2 or x.size(1) != self.channels:
            raise ValueError(f"x must have shape [N, {self.channels}], got {tuple(x.shape)}")
        n = x.size(0)
        if graphs.num_heads != self.heads or graphs.num_nodes != n:
            raise ValueError(f"graphs have {graphs.num_heads} heads over {graphs.num_nodes} "
                             f"units; this layer needs {self.heads} heads over {n}")
        self._check_dtype(x)
        xb = x.view(n, self.heads, self.channels // self.heads).transpose(0, 1)
        c = graphs.propagate(xb, layer)
        return self._update(x, c.transpose(0, 1).reshape(n, self.channels))

    def _update(self, x: Tensor, c: Tensor) -> Tensor:
        if self.gru is not None:
            return self.gru(torch.cat([c * x, c], dim=-1), x)
        if self.lin is not None:
            return x + self.lin(c)
        return c

    def _aggregate(self, x: Tensor, edge_index: Tensor, edge_weight: Tensor,
                   edge_head: Optional[Tensor], index=None, sorted_weight=None
                   ) -> Tuple[Tensor, tuple, Tensor]:
        """The aggregation, the index it used and the weights in the index's order
        (``index``, ``sorted_weight``: built before for the same graph).

        A graph seen once is aggregated head-blocked (node ``(h, v)`` at ``h * N + v``,
        :func:`~glomo_pyg.kernels.head_blocked_index`): edges in (head, target) order, as
        emitted ones are, need no sort, at the price of a copy of ``x`` in and of the
        result out. A graph given again switches to the interleaved index (node ``(v, h)``
        at ``v * H + h``, :func:`~glomo_pyg.kernels.interleaved_index`): ``x`` viewed as
        ``[N H, C / H]`` with no copy either way, its edges sorted once."""
        n = x.size(0)
        heads = 1 if edge_head is None else self.heads  # (None: one graph for all channels)
        if index is None or index[0] == "blocked":
            head = torch.zeros_like(edge_index[0]) if edge_head is None else edge_head
            if index is None:
                index = ("blocked", *head_blocked_index(edge_index, head, n, False, heads))
            else:  # a graph given again: worth the one sort of the copy-free layout
                index = ("interleaved", *interleaved_index(edge_index, head, n, heads))
                sorted_weight = None
        kind, rows, cols, perm = index
        weight = sorted_weight if sorted_weight is not None else \
            edge_weight if perm is None else edge_weight[perm]
        c = self.channels // heads
        flat = x.reshape(n * heads, c) if kind == "interleaved" else \
            x.view(n, heads, c).transpose(0, 1).reshape(heads * n, c)
        if self.fused:
            out = spmm_unchecked(rows, cols, weight, flat, n * heads)
        else:
            out = self.propagate(torch.stack([cols, rows]).long(), x=flat, edge_weight=weight,
                                 size=(n * heads, n * heads))
        if kind == "blocked":
            out = out.view(heads, n, c).transpose(0, 1)
        return out.reshape(n, self.channels), index, weight

    def _aggregate_dense(self, x: Tensor, adj: Tensor, batch: Optional[Tensor]) -> Tensor:
        """Dense layout: per-sequence blocks ``[B, H, T, T]`` (or ``[B, T, T]``, one graph
        for all channels) with ``[b, h, i, j] = G_ij``; batched matmuls."""
        if not isinstance(x, Tensor) or not x.dtype.is_floating_point or x.dim() != 2 or \
                x.size(1) != self.channels:
            raise ValueError(f"x must be a floating-point tensor [N, {self.channels}], got "
                             f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
        seqs = sequence_batch(x.size(0), batch, x.device)
        block = adj.unsqueeze(1) if adj.dim() == 3 else adj
        heads = 1 if adj.dim() == 3 else self.heads
        want = (seqs.num_sequences, heads, seqs.max_len, seqs.max_len)
        if block.dim() != 4 or tuple(block.shape) != want:
            raise ValueError(f"dense graph blocks must have shape [B, H, T, T] = {list(want)} "
                             f"(or [B, T, T]) for this batch, got {tuple(adj.shape)}")
        self._check_dtype(x)
        if not bool(torch.isfinite(x).all() & torch.isfinite(adj).all()):  # one sync for both
            raise ValueError("x or adj contains NaN or Inf")
        n = x.size(0)
        if n == seqs.num_sequences * seqs.max_len:  # no padding: stay in [B, T, H, c]
            xb = x.view(seqs.num_sequences, seqs.max_len, heads, -1).transpose(1, 2)
            out = block.transpose(-1, -2).to(x.dtype) @ xb  # [B, H, T, c]
            return out.transpose(1, 2).reshape(n, -1)
        xb = x.view(n, heads, -1).transpose(0, 1)
        out = dense_head_propagate(xb, block, seqs.ptr, seqs.position, seqs.batch)
        return out.transpose(0, 1).reshape(n, -1)

    def message(self, x_j: Tensor, edge_weight: Tensor) -> Tensor:
        return edge_weight.view(-1, 1).to(x_j.dtype) * x_j

    def _edges_from_sparse(self, adj_t: Tensor, num_nodes: int) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        if adj_t.dim() not in (2, 3) or adj_t.shape[-2:] != (num_nodes, num_nodes):
            raise ValueError(f"a sparse adjacency must be [N, N] or [H, N, N] with N = {num_nodes}, "
                             f"got {tuple(adj_t.shape)}")
        if adj_t.dim() == 3 and adj_t.size(0) != self.heads:
            raise ValueError(f"a [H, N, N] sparse adjacency needs H = heads = {self.heads}, "
                             f"got H = {adj_t.size(0)}")
        coo = adj_t.to_sparse_coo().coalesce()  # sorted by (head, target, source)
        idx, val = coo.indices(), coo.values()
        head = idx[0] if adj_t.dim() == 3 else None
        return torch.stack([idx[-1], idx[-2]]), val, head

    def _check_dtype(self, x: Tensor) -> None:
        """With an update (GRU or linear map) ``x`` meets the parameters: same dtype,
        unless autocast converts it (host-side, no sync)."""
        params = self.gru if self.gru is not None else self.lin
        if params is not None:
            check_dtype(x, next(params.parameters()).dtype,
                        owner=f"GlomoConv(update={self.update_kind!r})'s parameters")

    def _check(self, x: Tensor, edge_index: Tensor, edge_weight: Optional[Tensor],
               edge_head: Optional[Tensor]) -> None:
        """Types, shapes and devices: host-side facts, known while tracing too (the
        values are checked by :func:`~glomo_pyg.kernels.check_graph_values`)."""
        if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
            raise TypeError(f"x must be a floating-point tensor, got "
                            f"{x.dtype if isinstance(x, Tensor) else type(x).__name__}")
        if x.dim() != 2 or x.size(1) != self.channels:
            raise ValueError(f"x must have shape [N, {self.channels}], got {tuple(x.shape)}")
        self._check_dtype(x)
        if not isinstance(edge_index, Tensor) or edge_index.dtype != torch.long:
            raise TypeError("edge_index must be an int64 tensor [2, E] or a torch.sparse adjacency")
        if edge_index.dim() != 2 or edge_index.size(0) != 2:
            raise ValueError(f"edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
        num_edges = edge_index.size(1)
        if edge_weight is not None:
            if not isinstance(edge_weight, Tensor) or not edge_weight.dtype.is_floating_point:
                raise TypeError(f"edge_weight must be a floating-point tensor, got "
                                f"{getattr(edge_weight, 'dtype', type(edge_weight).__name__)}")
            if edge_weight.shape != (num_edges,):
                raise ValueError(f"edge_weight must have shape [E] = [{num_edges}], "
                                 f"got {tuple(edge_weight.shape)}")
        if edge_head is not None:
            if not isinstance(edge_head, Tensor) or edge_head.dtype != torch.long or \
                    edge_head.shape != (num_edges,):
                raise ValueError(f"edge_head must be an int64 tensor of shape [E] = [{num_edges}]")
        for name, t in (("edge_index", edge_index), ("edge_weight", edge_weight),
                        ("edge_head", edge_head)):
            if t is not None and t.device != x.device:
                raise ValueError(f"{name} is on {t.device} but x is on {x.device}")

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.channels}, heads={self.heads}, "
                f"update={self.update_kind!r})")
