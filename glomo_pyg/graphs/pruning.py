r"""The one pruning rule of graphs made into edge lists (docs/any_gnn.md, "Pruning"), used
by the PyG transforms, ``glomo export`` and the viewer: weights below ``min_weight`` are
dropped, then each target keeps its ``top_k`` heaviest sources, ties going to the lower
source; zero weights are never edges; kept weights are not renormalised."""
from __future__ import annotations

from typing import Optional, Tuple

from torch import Tensor

from glomo_pyg.settings import Rule

#: ``top_k``: ``None`` (every source) or a positive integer.
TOP_K = Rule(int, low=1, optional=True)
#: ``min_weight``: ``None`` (no floor) or a finite number ``>= 0`` (merged sums of graphs
#: exceed 1, so there is no upper bound; a floor above every weight keeps no edge).
MIN_WEIGHT = Rule(float, low=0, optional=True)

#: ``(sample, relation, target, source, weight)`` of kept edges, in that sort order.
PrunedEdges = Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]


def check_pruning(top_k: Optional[int], min_weight: Optional[float]) -> None:
    """``top_k`` and ``min_weight`` as :data:`TOP_K` and :data:`MIN_WEIGHT` allow."""
    TOP_K.check("top_k", top_k, typed=True)
    MIN_WEIGHT.check("min_weight", min_weight, typed=True)


def prune_rows(dense: Tensor, top_k: Optional[int] = None,
               min_weight: Optional[float] = None) -> PrunedEdges:
    """``(sample, relation, target, source, weight)`` of the entries of ``dense``
    (``[B, R, targets, sources]``, rows = one target's sources) that pruning keeps, sorted
    in that order; ``target`` and ``source`` index the rows and columns."""
    if top_k is None or top_k >= dense.size(-1):
        if min_weight is not None:
            dense = dense.masked_fill(dense < min_weight, 0)
        b, relation, tgt, src = dense.nonzero(as_tuple=True)
        return b, relation, tgt, src, dense[b, relation, tgt, src]
    # the top k of each row, put back in source order; the weights >= min_weight among
    # them are the top k of those >= min_weight
    k = top_k
    weight, source = dense.topk(k + 1, dim=-1)
    # rows whose k-th weight ties with the (k+1)-th: the lower sources win
    tied = (weight[..., k] == weight[..., k - 1]) & (weight[..., k - 1] > 0)
    if bool(tied.any()):
        weight[tied], source[tied] = (t[..., :k + 1] for t in
                                      dense[tied].sort(dim=-1, descending=True, stable=True))
    weight, source = weight[..., :k], source[..., :k]
    source, order = source.sort(dim=-1)
    weight = weight.gather(-1, order)
    floor = 0.0 if min_weight is None else min_weight
    keep = (weight > 0) & (weight >= floor)
    b, relation, tgt, slot = keep.nonzero(as_tuple=True)
    return b, relation, tgt, source[b, relation, tgt, slot], weight[b, relation, tgt, slot]


def prune_edges(source: Tensor, target: Tensor, weight: Tensor, num_units: int,
                top_k: Optional[int] = None,
                min_weight: Optional[float] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """``(source, target, weight)`` of the edges of one graph over ``num_units`` units
    (each pair at most once) that :func:`prune_rows` keeps, in (target, source) order."""
    rows = weight.new_zeros(1, 1, num_units, num_units)
    rows[0, 0, target, source] = weight
    _, _, tgt, src, kept = prune_rows(rows, top_k, min_weight)
    return src, tgt, kept
