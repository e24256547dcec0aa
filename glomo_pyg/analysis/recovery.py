"""How well learned graphs recover known (planted) dependencies."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch
from torch import Tensor

from glomo_pyg.graphs import LatentGraphs


@dataclass
class RecoveryReport:
    """Precision@1 of the max-weight incoming edge of each dependency's reader (sources
    tied at the maximum share the credit: the expected precision of a random tie-break)
    per graph ``[L, H]`` and per head-averaged graph of each layer ``[L]``, beside
    picking an allowed source at random (``uniform``) or the unit just before."""

    per_graph: Tensor
    per_layer: Tensor
    uniform: float
    previous_token: float
    num_dependencies: int

    @property
    def best(self) -> Tuple[int, int, float]:
        """``(layer, head, precision)`` of the best single graph."""
        l, h = divmod(int(self.per_graph.argmax()), self.per_graph.size(1))
        return l, h, float(self.per_graph[l, h])

    def format(self) -> str:
        l, h, p = self.best
        lines = [f"planted dependencies evaluated: {self.num_dependencies}",
                 f"  precision@1, best single graph (layer {l}, head {h}): {p:.3f}"]
        for layer, value in enumerate(self.per_layer.tolist()):
            heads = " ".join(f"{v:.2f}" for v in self.per_graph[layer].tolist())
            lines.append(f"  layer {layer}: head-averaged graph {value:.3f} | per head: {heads}")
        lines += [f"  baseline, uniform over allowed sources:  {self.uniform:.3f}",
                  f"  baseline, previous token:                {self.previous_token:.3f}"]
        return "\n".join(lines)


def _max_source_credit(src: Tensor, key: Tensor, weight: Tensor, size: int,
                       wanted: Tensor) -> Tensor:
    """``[size]``: ``1 / k`` where ``wanted[key]`` is one of ``k`` tied heaviest sources, else 0."""
    best = weight.new_zeros(size).scatter_reduce(0, key, weight, "amax", include_self=False)
    is_max = (weight == best[key]) & (weight > 0)  # zero-weight edges point nowhere
    zeros = torch.zeros(size, dtype=torch.double, device=weight.device)
    ties = zeros.index_add(0, key, is_max.double())
    credit = zeros.index_add(0, key, (is_max & (src == wanted[key])).double())
    return credit / ties.clamp_min(1)


@torch.no_grad()
def planted_source_recovery(graphs: LatentGraphs, source: Tensor,
                            reader_offset: int = -1) -> RecoveryReport:
    """Score forward graphs against planted dependencies.

    Args:
        graphs: forward :class:`LatentGraphs` of the batch.
        source: ``[N]`` position (within its sequence) of the unit each dependent depends
            on, ``-1`` for others (:class:`~glomo_pyg.data.PlantedDependencyCorpus`).
        reader_offset: the unit that must read the source, relative to the dependent
            (``-1``: the unit that predicts the dependent, GLoMo's objective).
    """
    n = graphs.num_nodes
    shaped = isinstance(source, Tensor) and source.dtype == torch.long and source.shape == (n,)
    if not shaped or not bool((source >= 0).any()):
        raise ValueError(f"source must be an int64 tensor of shape [N] = [{n}] of positions "
                         "(-1: not a dependent) with a planted dependency, got "
                         + (f"{getattr(source, 'dtype', type(source).__name__)} of shape "
                            f"{list(getattr(source, 'shape', []))}" if not shaped
                            else "no planted dependency"))
    if graphs.direction != "forward":
        raise ValueError("planted sources precede their dependents: score forward graphs")
    source = source.to(graphs.device)
    dependents = (source >= 0).nonzero().view(-1)
    seq = graphs.batch[dependents]
    true_src = graphs.ptr[seq] + source[dependents]
    whole = isinstance(reader_offset, int) and not isinstance(reader_offset, bool)
    reader = dependents + (reader_offset if whole else 0)
    reader_pos = reader - graphs.ptr[seq]
    if not whole or bool((reader < 0).any() | (reader >= n).any() | (reader_pos < 0).any()
                         | (graphs.batch[reader.clamp(0, n - 1)] != seq).any()):
        raise ValueError(f"reader_offset must be an integer that does not move a reader "
                         f"outside its sequence, got {reader_offset!r}")
    per_graph, per_layer, h = [], [], graphs.num_heads
    wanted = torch.full((n,), -1, dtype=torch.long, device=graphs.device)
    wanted[reader] = true_src  # each reader's planted source
    for (src, tgt), weight, head in graphs:
        credit = _max_source_credit(src, head * n + tgt, weight, h * n, wanted.repeat(h))
        per_graph.append(credit.view(h, n)[:, reader].mean(1))
        # the head-averaged graph: parallel edges of all heads summed
        pair, inverse = torch.unique(tgt * n + src, return_inverse=True)
        summed = weight.new_zeros(pair.numel()).index_add_(0, inverse, weight)
        per_layer.append(_max_source_credit(pair % n, pair // n, summed, n, wanted)[reader]
                         .mean())
    allowed = graphs.order.num_sources(reader_pos, graphs.lengths[seq])
    uniform = torch.where(allowed > 0, 1.0 / allowed.clamp_min(1).double(), 0.0)
    previous = (true_src == reader - 1).double()
    return RecoveryReport(torch.stack(per_graph).cpu(), torch.stack(per_layer).cpu(),
                          float(uniform.mean()), float(previous.mean()), int(dependents.numel()))
