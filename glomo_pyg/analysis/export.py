"""Export of latent graphs for analysis: every graph of one sequence as a JSON edge list
or a GraphML-ready networkx graph (``glomo export`` writes them to files), beside the
per-sample conversions of :mod:`glomo_pyg.graph_conversion` (networkx, sparse
adjacency, hierarchical products), which are importable from here too."""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from glomo_pyg.graph_conversion import (adjacency, check_sample,  # noqa: F401 (re-exported)
                                        hierarchical, sample_edges, to_networkx)

if TYPE_CHECKING:
    from glomo_pyg.graphs import LatentGraphs


def directions(graphs) -> List[Tuple[str, "LatentGraphs"]]:
    """``[(direction, graphs)]`` of a :class:`~glomo_pyg.LatentGraphs` or each present
    direction of a :class:`~glomo_pyg.DirectionalGraphs` (recognised by shape)."""
    if isinstance(graphs, tuple) and getattr(graphs, "_fields", None) == ("forward", "backward"):
        parts = [(d, g) for d, g in zip(("forward", "backward"), graphs) if g is not None]
    elif hasattr(graphs, "num_layers") and hasattr(graphs, "direction") and hasattr(graphs, "ptr"):
        parts = [(graphs.direction, graphs)]
    else:
        parts = []
    if not parts:
        raise TypeError(f"expected LatentGraphs or DirectionalGraphs with a direction, got "
                        f"{type(graphs).__name__}")
    return parts


def check_thinning(min_weight: float, top_k: Optional[int], closed: bool = True) -> None:
    """``min_weight`` a number in ``[0, 1]`` (``[0, 1)`` unless ``closed``) and ``top_k``
    ``None`` or a positive integer."""
    if isinstance(min_weight, bool) or not isinstance(min_weight, (int, float)) or \
            not 0.0 <= float(min_weight) <= 1.0 or (not closed and min_weight == 1.0):
        raise ValueError(f"min_weight must be a number in [0, 1{']' if closed else ')'}, got "
                         f"{min_weight!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or
                              top_k < 1):
        raise ValueError(f"top_k must be None or an integer >= 1, got {top_k!r}")


def _unit_attributes(g: "LatentGraphs", sample: int) -> List[Dict]:
    """Per-unit attributes of one sequence: its position and, on an image grid, its
    row and column."""
    length = int(g.lengths[sample])
    width = getattr(g.order, "width", None)
    if width is None:
        return [dict(position=t) for t in range(length)]
    return [dict(position=t, row=t // width, column=t % width) for t in range(length)]


def _strongest(src: Tensor, tgt: Tensor, heads: Tensor, weight: Tensor, min_weight: float,
               top_k: Optional[int]) -> Tensor:
    """Mask of the edges kept: weight >= ``min_weight`` and among the ``top_k`` heaviest
    of their (head, target) column."""
    keep = weight >= min_weight
    if top_k is not None and weight.numel():
        # rank within each column: sort by weight (descending), then stably by column
        order = torch.argsort(weight, descending=True, stable=True)
        column = (heads * (int(tgt.max()) + 1) + tgt)[order]
        order = order[torch.argsort(column, stable=True)]
        column = column[torch.argsort(column, stable=True)]
        start = torch.ones_like(column, dtype=torch.bool)
        start[1:] = column[1:] != column[:-1]
        first = torch.cummax(torch.where(start, torch.arange(column.numel()),
                                         torch.zeros_like(column)), 0).values
        rank = torch.empty_like(order)
        rank[order] = torch.arange(column.numel()) - first
        keep &= rank < top_k
    return keep


def edge_list(graphs, sample: int, labels: Optional[Sequence[str]] = None,
              min_weight: float = 0.0, top_k: Optional[int] = None) -> Dict:
    """One sequence's graphs, every direction, layer and head, as a JSON-ready dict.

    ``units`` lists each unit's attributes (``position``; ``row``/``column`` for
    images; ``label`` if ``labels`` is given). ``graphs`` holds one entry per
    (direction, layer, head) with parallel lists ``source``, ``target``, ``weight``
    (``G_ij`` of source ``i`` and target ``j``, local positions). Plain numbers and
    strings only: it is written with :mod:`json`, never pickled.

    ``min_weight`` and ``top_k`` thin the export (edges of weight below ``min_weight``
    are left out, and all but the ``top_k`` heaviest edges into each target); the
    weights kept are not renormalised.
    """
    check_thinning(min_weight, top_k)
    parts = directions(graphs)
    g0 = parts[0][1]
    check_sample(g0, sample, labels)
    units = _unit_attributes(g0, sample)
    for u, label in zip(units, labels or ()):
        u["label"] = str(label)
    out = []
    for direction, g in parts:
        for l in range(g.num_layers):
            src, tgt, heads, weight = sample_edges(g, sample, l)
            strong = _strongest(src, tgt, heads, weight, float(min_weight), top_k)
            for h in range(g.num_heads):
                keep = (heads == h) & strong
                out.append(dict(direction=direction, layer=l, head=h,
                                source=src[keep].tolist(), target=tgt[keep].tolist(),
                                weight=weight[keep].double().tolist()))
    return dict(num_units=len(units), units=units, graphs=out)


def to_graphml_graph(graphs, sample: int, labels: Optional[Sequence[str]] = None,
                     min_weight: float = 0.0, top_k: Optional[int] = None):
    """One sequence's graphs as a ``networkx.MultiDiGraph`` ready for GraphML: edges
    ``i -> j`` keyed ``'<direction>/<layer>/<head>'`` with attributes ``direction``,
    ``layer``, ``head`` and ``weight``; nodes carry the attributes of
    :func:`edge_list`'s ``units`` (``min_weight`` and ``top_k`` as there)."""
    import networkx as nx

    data = edge_list(graphs, sample, labels, min_weight, top_k)
    graph = nx.MultiDiGraph()
    for t, attrs in enumerate(data["units"]):
        graph.add_node(t, **attrs)
    for part in data["graphs"]:
        key = f"{part['direction']}/{part['layer']}/{part['head']}"
        for i, j, w in zip(part["source"], part["target"], part["weight"]):
            graph.add_edge(i, j, key=key, direction=part["direction"], layer=part["layer"],
                           head=part["head"], weight=w)
    return graph
