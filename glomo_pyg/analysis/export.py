"""Every graph of one sequence as a JSON edge list or a GraphML-ready networkx graph
(``glomo export`` writes them to files); the conversions of
:mod:`glomo_pyg.graph_conversion` are importable from here too."""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from glomo_pyg.graph_conversion import (adjacency, check_sample, hierarchical, sample_edges,
                                        to_networkx)
from glomo_pyg.ordering import check_int

__all__ = ["adjacency", "check_thinning", "concat_sequences", "directions", "edge_list",
           "hierarchical", "to_graphml_graph", "to_networkx"]

if TYPE_CHECKING:
    from glomo_pyg.graphs import LatentGraphs


def directions(graphs) -> List[Tuple[str, "LatentGraphs"]]:
    """``[(direction, graphs)]`` of a :class:`~glomo_pyg.LatentGraphs` or each present
    direction of a :class:`~glomo_pyg.DirectionalGraphs` (recognised by shape)."""
    if isinstance(graphs, tuple) and getattr(graphs, "_fields", None) == ("forward", "backward"):
        parts = [(d, g) for d, g in zip(("forward", "backward"), graphs) if g is not None]
    else:
        latent = all(hasattr(graphs, a) for a in ("num_layers", "direction", "ptr"))
        parts = [(graphs.direction, graphs)] if latent else []
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
    check_int("top_k", top_k, optional=True)


def concat_sequences(seqs: Sequence[Tensor]) -> Tuple[Tensor, Tensor]:
    """The predictor's ``(x, batch)`` input of per-sequence tensors."""
    lengths = torch.tensor([s.size(0) for s in seqs], device=seqs[0].device)
    return torch.cat(list(seqs)), torch.arange(len(seqs), device=lengths.device) \
        .repeat_interleave(lengths)


def _strongest(src: Tensor, tgt: Tensor, heads: Tensor, weight: Tensor, min_weight: float,
               top_k: Optional[int]) -> Tensor:
    """Mask of the edges of weight >= ``min_weight`` among the ``top_k`` heaviest of a column."""
    keep = weight >= min_weight
    if top_k is not None and weight.numel():
        column = heads * (int(tgt.max()) + 1) + tgt
        order = torch.argsort(weight, descending=True, stable=True)
        order = order[torch.argsort(column[order], stable=True)]  # by column, heaviest first
        ranked = column[order]
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel(), device=order.device) - \
            torch.searchsorted(ranked, ranked)  # position within the column
        keep &= rank < top_k
    return keep


def edge_list(graphs, sample: int, labels: Optional[Sequence[str]] = None,
              min_weight: float = 0.0, top_k: Optional[int] = None) -> Dict:
    """One sequence's graphs, every direction, layer and head, as a JSON-ready dict:
    ``units`` (``position``; ``row``/``column`` for images; ``label`` if ``labels`` is
    given) and ``graphs``, per (direction, layer, head) the lists ``source``, ``target``,
    ``weight`` (``G_ij`` of source ``i`` and target ``j``, local positions). Edges lighter
    than ``min_weight`` are left out, and with ``top_k`` all but the heaviest ``top_k``
    into each target; the weights kept are not renormalised."""
    check_thinning(min_weight, top_k)
    parts = directions(graphs)
    width = getattr(parts[0][1].order, "width", None)  # an image grid's units: row, column
    units = [dict(position=t) if width is None else dict(position=t, row=t // width,
                                                        column=t % width)
             for t in range(check_sample(parts[0][1], sample, labels))]
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
    """:func:`edge_list` as a ``networkx.MultiDiGraph`` ready for GraphML: edges ``i -> j``
    keyed ``'<direction>/<layer>/<head>'``, nodes with the attributes of ``units``."""
    import networkx as nx

    data = edge_list(graphs, sample, labels, min_weight, top_k)
    graph = nx.MultiDiGraph()
    graph.add_nodes_from(enumerate(data["units"]))
    for part in data["graphs"]:
        key = f"{part['direction']}/{part['layer']}/{part['head']}"
        for i, j, w in zip(part["source"], part["target"], part["weight"]):
            graph.add_edge(i, j, key=key, direction=part["direction"], layer=part["layer"],
                           head=part["head"], weight=w)
    return graph
