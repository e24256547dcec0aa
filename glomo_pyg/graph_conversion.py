r"""One sequence's latent graphs as a networkx graph, a sparse adjacency matrix or the
hierarchical product :math:`G^1 \cdots G^l` (also methods of :class:`~glomo_pyg.LatentGraphs`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterable, Optional, Sequence, Tuple

import torch
from torch import Tensor

from glomo_pyg.graph_names import relation_name
from glomo_pyg.settings import check_int

if TYPE_CHECKING:  # annotations only: glomo_pyg.graphs imports this module
    from glomo_pyg.graphs import LatentGraphs


def check_index(name: str, value, size: int) -> None:
    """``value`` must be an integer in ``[0, size)``."""
    check_int(name, value, 0, below=size)


def check_sample(graphs: "LatentGraphs", sample, labels: Optional[Sequence] = None) -> int:
    """The length of sequence ``sample`` (checked); ``labels`` must hold one per unit."""
    check_index("sample", sample, graphs.num_sequences)
    length = int(graphs.lengths[sample])
    if labels is not None and len(labels) != length:
        raise ValueError(f"labels must have one entry per unit of sample {sample} "
                         f"({length}), got {len(labels)}")
    return length


def sample_edges(graphs: "LatentGraphs", sample: int, layer: int, head: Optional[int] = None):
    """Local (source, target, head, weight) of one sequence's edges in one layer."""
    check_index("sample", sample, graphs.num_sequences)
    check_index("layer", layer, graphs.num_layers)
    if head is not None:
        check_index("head", head, graphs.num_heads)
    (src, tgt), weight, heads = graphs.layer(layer)
    lo, hi = int(graphs.ptr[sample]), int(graphs.ptr[sample + 1])
    keep = (tgt >= lo) & (tgt < hi)
    if head is not None:
        keep &= heads == head
    return src[keep] - lo, tgt[keep] - lo, heads[keep], weight[keep].detach()


#: One part of a networkx graph: ``(key, attributes, sources, targets, weights)``.
EdgePart = Tuple[Any, Dict[str, Any], Sequence[int], Sequence[int], Sequence[float]]


def networkx_graph(units: Sequence[Dict[str, Any]], parts: Iterable[EdgePart],
                   multi: bool = True):
    """The one builder of networkx graphs (:func:`to_networkx`, ``glomo export``'s
    GraphML): nodes ``0..len(units)-1`` with the attributes of ``units``; per part, edges
    source -> target with its attributes and ``weight``, keyed by the part's key in a
    ``MultiDiGraph`` (``multi``), unkeyed in a ``DiGraph``."""
    import networkx as nx

    graph = nx.MultiDiGraph() if multi else nx.DiGraph()
    graph.add_nodes_from(enumerate(units))
    for key, attributes, sources, targets, weights in parts:
        for i, j, w in zip(sources, targets, weights):
            if multi:
                graph.add_edge(i, j, key=key, **attributes, weight=w)
            else:
                graph.add_edge(i, j, **attributes, weight=w)
    return graph


def to_networkx(graphs: "LatentGraphs", sample: int, layer: Optional[int] = None,
                head: Optional[int] = None, labels: Optional[Sequence] = None):
    """One sequence's graphs as a networkx graph: nodes ``0..T-1`` (attributes ``position``
    and ``label`` from ``labels``), edges source -> target with ``weight``, the graph's
    name ``relation`` (``'forward/layer0/head3'``,
    :func:`~glomo_pyg.graph_names.relation_name`) and its 0-based ``direction``,
    ``layer`` and ``head``: a ``DiGraph`` with ``layer`` and ``head`` given, else a
    ``MultiDiGraph`` keyed by ``relation``, as ``glomo export``'s GraphML is.
    """
    length = check_sample(graphs, sample, labels)
    layers = [layer] if layer is not None else list(range(graphs.num_layers))
    heads = [head] if head is not None else list(range(graphs.num_heads))
    units = [dict(position=t, **({"label": labels[t]} if labels is not None else {}))
             for t in range(length)]
    parts = []
    for l in layers:
        for h in heads:
            src, tgt, _, weight = sample_edges(graphs, sample, l, h)
            name = relation_name(graphs.direction, l, h)
            parts.append((name, dict(relation=name, direction=graphs.direction, layer=l,
                                     head=h), src.tolist(), tgt.tolist(), weight.tolist()))
    return networkx_graph(units, parts, multi=layer is None or head is None)


def adjacency(graphs: "LatentGraphs", sample: int, layer: int, head: int) -> Tensor:
    """``G`` of one sequence, layer and head as a sparse COO ``[T, T]`` (``[i, j] = G_ij``)."""
    src, tgt, _, weight = sample_edges(graphs, sample, layer, head)
    t = int(graphs.lengths[sample])
    return torch.sparse_coo_tensor(torch.stack([src, tgt]), weight, (t, t)).coalesce()


def hierarchical(graphs: "LatentGraphs", sample: int, layer: int, head: int) -> Tensor:
    r"""Explicit :math:`\Lambda^l = G^1 G^2 \cdots G^l` of one sequence and head, as a
    sparse ``[T, T]`` (paper Sec. 2.2); for analysis only (transfer never forms it)."""
    check_index("layer", layer, graphs.num_layers)
    out = adjacency(graphs, sample, 0, head)
    for l in range(1, layer + 1):
        out = torch.sparse.mm(out, adjacency(graphs, sample, l, head)).coalesce()
    return out
