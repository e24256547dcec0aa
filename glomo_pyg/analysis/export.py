"""Every graph of one sequence as a JSON edge list or a GraphML-ready networkx graph
(``glomo export`` writes them to files); the conversions of
:mod:`glomo_pyg.graph_conversion` are importable from here too."""
from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from glomo_pyg.graph_conversion import (
    adjacency,
    check_sample,
    hierarchical,
    networkx_graph,
    sample_edges,
    to_networkx,
)
from glomo_pyg.graph_names import relation_name
from glomo_pyg.graphs import DirectionalGraphs, LatentGraphs
from glomo_pyg.graphs.pruning import check_pruning, prune_edges
from glomo_pyg.nn.transfer import caller_stacklevel
from glomo_pyg.ordering import DIRECTIONS

__all__ = ["MAX_IMAGE_PIXELS", "adjacency", "concat_sequences", "directions", "edge_list",
           "hierarchical", "image_predictor", "to_graphml_graph", "to_networkx"]

#: The largest image (in pixels) ``glomo view`` shows and ``glomo export`` reads unless
#: ``--max-units`` says otherwise: 64x64 (graphs grow with the square of the pixel count).
MAX_IMAGE_PIXELS = 64 * 64


def image_predictor(predictor, height: int, width: int):
    """The one size rule of the viewer and ``glomo export``: an image is read at its own
    ``height x width``, never resampled, by a pixel predictor's weights at that size
    (``predictor`` itself at its own ``image_size``, else
    :meth:`~glomo_pyg.nn.PretrainedGraphPredictor.resized`). How large an image may be is
    the caller's limit (:data:`MAX_IMAGE_PIXELS` by default)."""
    if height * width < 2:
        raise ValueError(f"the image is {width}x{height} pixels: a graph needs at least 2")
    if (height, width) == tuple(predictor.image_size):
        return predictor
    return predictor.resized(height, width)


def windowed(predictor, graphs: DirectionalGraphs, max_distance: Optional[int], owner: str,
             warn: bool = True) -> Tuple[DirectionalGraphs, bool]:
    """``graphs`` (emitted by ``predictor``) cut to ``max_distance`` (``None``: whole), and
    whether a ``RuntimeWarning`` was given: with ``warn``, when they reach beyond the
    lengths or image sizes the predictor's learned distance term saw
    (:meth:`~glomo_pyg.nn.PretrainedGraphPredictor.extrapolation_warning`, the one rule of
    every path that emits graphs; ``owner`` names this one)."""
    message = predictor.extrapolation_warning(graphs.extent, max_distance, owner=owner) \
        if warn else None
    if message is not None:
        warnings.warn(message, RuntimeWarning, stacklevel=caller_stacklevel())
    return graphs.within(max_distance), message is not None


def directions(graphs) -> List[Tuple[str, LatentGraphs]]:
    """``[(direction, graphs)]`` of a :class:`~glomo_pyg.LatentGraphs` or each present
    direction of a :class:`~glomo_pyg.DirectionalGraphs`."""
    if isinstance(graphs, DirectionalGraphs):
        parts = [(d, g) for d, g in zip(DIRECTIONS, graphs) if g is not None]
    else:
        parts = [(graphs.direction, graphs)] if isinstance(graphs, LatentGraphs) else []
    if not parts:
        raise TypeError(f"expected LatentGraphs or DirectionalGraphs with a direction, got "
                        f"{type(graphs).__name__}")
    return parts


def concat_sequences(seqs: Sequence[Tensor]) -> Tuple[Tensor, Tensor]:
    """The predictor's ``(x, batch)`` input of per-sequence tensors."""
    lengths = torch.tensor([s.size(0) for s in seqs], device=seqs[0].device)
    return torch.cat(list(seqs)), torch.arange(len(seqs), device=lengths.device) \
        .repeat_interleave(lengths)


def edge_list(graphs, sample: int, labels: Optional[Sequence[str]] = None,
              min_weight: Optional[float] = None, top_k: Optional[int] = None) -> Dict:
    """One sequence's graphs, every direction, layer and head, as a JSON-ready dict:
    ``units`` (``position``; ``row``/``column`` for images; ``label`` if ``labels`` is
    given) and ``graphs``, per (direction, layer, head) the lists ``source``, ``target``,
    ``weight`` (``G_ij`` of source ``i`` and target ``j``, local positions). Edges lighter
    than ``min_weight`` are left out, and with ``top_k`` all but the heaviest ``top_k``
    into each target, ties going to the lower source (:mod:`glomo_pyg.graphs.pruning`, the
    rule of the transforms and the viewer); the weights kept are not renormalised."""
    check_pruning(top_k, min_weight)
    parts = directions(graphs)
    width = getattr(parts[0][1].order, "width", None)  # an image grid's units: row, column
    units: List[Dict[str, Any]] = [
        dict(position=t) if width is None else dict(position=t, row=t // width, column=t % width)
        for t in range(check_sample(parts[0][1], sample, labels))]
    for u, label in zip(units, labels or ()):
        u["label"] = str(label)
    out = []
    for direction, g in parts:
        for l in range(g.num_layers):
            for h in range(g.num_heads):
                src, tgt, _, weight = sample_edges(g, sample, l, h)
                src, tgt, weight = prune_edges(src, tgt, weight, len(units), top_k, min_weight)
                out.append(dict(direction=direction, layer=l, head=h, source=src.tolist(),
                                target=tgt.tolist(), weight=weight.double().tolist()))
    return dict(num_units=len(units), units=units, graphs=out)


def to_graphml_graph(graphs, sample: int, labels: Optional[Sequence[str]] = None,
                     min_weight: Optional[float] = None, top_k: Optional[int] = None):
    """:func:`edge_list` as a ``networkx.MultiDiGraph`` ready for GraphML: edges ``i -> j``
    keyed by the graph's name (``'forward/layer0/head3'``,
    :func:`~glomo_pyg.graph_names.relation_name`; also its ``relation`` attribute), nodes
    with the attributes of ``units``."""
    data = edge_list(graphs, sample, labels, min_weight, top_k)
    parts = [(relation_name(p["direction"], p["layer"], p["head"]),
              dict(relation=relation_name(p["direction"], p["layer"], p["head"]),
                   direction=p["direction"], layer=p["layer"], head=p["head"]),
              p["source"], p["target"], p["weight"]) for p in data["graphs"]]
    return networkx_graph(data["units"], parts)
