"""How well learned graphs recover known (planted) dependencies."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import torch
from torch import Tensor

from glomo_pyg.graphs import LatentGraphs


@dataclass
class RecoveryReport:
    """Precision@1 of the max-weight incoming edge of each dependency's reader (sources
    tied at the maximum share the credit: the expected precision of a random tie-break).

    ``per_graph[l, h]``: graph (layer ``l``, head ``h``); ``per_layer[l]``: the
    head-averaged graph of layer ``l`` (no head selection involved);
    ``uniform``: expected precision of picking an allowed source at random;
    ``previous_token``: precision of always picking the unit just before.
    """

    per_graph: Tensor
    per_layer: Tensor
    uniform: float
    previous_token: float
    num_dependencies: int

    @property
    def best(self) -> Tuple[int, int, float]:
        """``(layer, head, precision)`` of the best single graph."""
        flat = int(self.per_graph.argmax())
        l, h = divmod(flat, self.per_graph.size(1))
        return l, h, float(self.per_graph[l, h])

    def format(self) -> str:
        l, h, p = self.best
        lines = [f"planted dependencies evaluated: {self.num_dependencies}",
                 f"  precision@1, best single graph (layer {l}, head {h}): {p:.3f}"]
        for layer, value in enumerate(self.per_layer.tolist()):
            heads = " ".join(f"{v:.2f}" for v in self.per_graph[layer].tolist())
            lines.append(f"  layer {layer}: head-averaged graph {value:.3f} | per head: {heads}")
        lines.append(f"  baseline, uniform over allowed sources:  {self.uniform:.3f}")
        lines.append(f"  baseline, previous token:                {self.previous_token:.3f}")
        return "\n".join(lines)


def _max_source_credit(src: Tensor, key: Tensor, weight: Tensor, size: int,
                       wanted: Tensor) -> Tensor:
    """``[size]``: for each target key, ``1 / k`` if ``wanted[key]`` is one of the ``k``
    sources tied at its heaviest incoming weight, else 0 (also with no incoming edge): the
    expected precision of breaking ties at random, independent of the edges' order."""
    best = torch.zeros(size, dtype=weight.dtype, device=weight.device)
    best = best.scatter_reduce(0, key, weight, "amax", include_self=False)
    is_max = (weight == best[key]) & (weight > 0)  # zero-weight edges point nowhere
    ties = torch.zeros(size, dtype=torch.double, device=weight.device)
    ties.index_add_(0, key, is_max.double())
    credit = torch.zeros(size, dtype=torch.double, device=weight.device)
    credit.index_add_(0, key, (is_max & (src == wanted[key])).double())
    return credit / ties.clamp_min(1)


@torch.no_grad()
def planted_source_recovery(graphs: LatentGraphs, source: Tensor,
                            reader_offset: int = -1) -> RecoveryReport:
    """Score forward graphs against planted dependencies.

    Args:
        graphs: forward :class:`LatentGraphs` of the batch.
        source: ``[N]`` position (within its sequence) of the unit each
            dependent depends on, ``-1`` for other units (as produced by
            :class:`~glomo_pyg.data.PlantedDependencyCorpus`).
        reader_offset: the unit that must read the source, relative to the
            dependent: ``-1`` (the unit whose next-unit prediction is the
            dependent) for GLoMo's context-prediction objective.
    """
    n = graphs.num_nodes
    if not isinstance(source, Tensor) or source.dtype != torch.long or source.shape != (n,):
        raise ValueError(f"source must be an int64 tensor of positions (-1: not a dependent) "
                         f"of shape [N] = [{n}], got {getattr(source, 'shape', type(source))}")
    if graphs.direction != "forward":
        raise ValueError("planted sources precede their dependents: score forward graphs")
    source = source.to(graphs.device)
    dependents = (source >= 0).nonzero().view(-1)
    if dependents.numel() == 0:
        raise ValueError("the batch contains no planted dependency")
    seq = graphs.batch[dependents]
    true_src = graphs.ptr[seq] + source[dependents]
    whole = isinstance(reader_offset, int) and not isinstance(reader_offset, bool)
    reader = dependents + (reader_offset if whole else 0)
    reader_pos = reader - graphs.ptr[seq]
    if not whole or bool((reader < 0).any() | (reader >= n).any() | (reader_pos < 0).any()
                         | (graphs.batch[reader.clamp(0, n - 1)] != seq).any()):
        raise ValueError(f"reader_offset must be an integer that does not move a reader "
                         f"outside its sequence, got {reader_offset!r}")

    per_graph: List[Tensor] = []
    per_layer: List[Tensor] = []
    h = graphs.num_heads
    wanted = torch.full((n,), -1, dtype=torch.long, device=graphs.device)
    wanted[reader] = true_src  # each reader's planted source
    for (src, tgt), weight, head in graphs:
        credit = _max_source_credit(src, head * n + tgt, weight, h * n, wanted.repeat(h))
        per_graph.append(credit.view(h, n)[:, reader].mean(1))
        # Head-averaged graph: sum weights of parallel edges across heads.
        pair, inverse = torch.unique(tgt * n + src, return_inverse=True)
        summed = torch.zeros(pair.numel(), dtype=weight.dtype, device=weight.device)
        summed.index_add_(0, inverse, weight)
        per_layer.append(_max_source_credit(pair % n, pair // n, summed, n, wanted)[reader]
                         .mean())
    allowed = graphs.order.num_sources(reader_pos, graphs.lengths[seq])
    uniform = (1.0 / allowed.clamp_min(1).double()).where(allowed > 0, torch.zeros((), dtype=torch.double))
    previous = (true_src == reader - 1).double()
    return RecoveryReport(torch.stack(per_graph).cpu(), torch.stack(per_layer).cpu(),
                          float(uniform.mean()), float(previous.mean()), int(dependents.numel()))
