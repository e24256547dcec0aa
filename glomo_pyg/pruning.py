r"""The pruning rule of graphs made into edge lists (docs/any_gnn.md, "Pruning"):
weights below ``min_weight`` are dropped, then each target keeps its ``top_k`` heaviest
sources, ties going to the lower source; zero weights are never edges; kept weights are not
renormalised."""
from __future__ import annotations

from typing import Optional, Tuple

from torch import Tensor

#: ``(sample, relation, target, source, weight)`` of kept edges, in that sort order.
PrunedEdges = Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]


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
