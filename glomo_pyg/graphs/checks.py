"""Checks at the door of the graph constructors: offsets, user-given edges and blocks,
the fixed baselines' arguments and the window of ``LatentGraphs.within``."""
from __future__ import annotations

from typing import Literal, Optional, overload

import torch
from torch import Tensor

from glomo_pyg import sequences
from glomo_pyg.ordering import SequenceOrder, check_direction
from glomo_pyg.sequences import SequenceBatch, first_failure
from glomo_pyg.settings import check_int

# far beyond any model (the paper: 3 layers of 8 heads); statistics allocate
# [layers, heads, units] tensors
MAX_HEADS = 4096
MAX_LAYERS = 4096


def check_fixed_graphs(ptr: Tensor, direction: str, num_layers: int,
                       num_heads: int) -> SequenceBatch:
    """The arguments of the graphs built without a predictor (uniform, adjacent)."""
    check_direction(direction)
    check_int("num_layers", num_layers, high=MAX_LAYERS)
    check_int("num_heads", num_heads, high=MAX_HEADS)
    return check_ptr(ptr)


@overload
def check_max_distance(value, optional: Literal[False] = False) -> int: ...


@overload
def check_max_distance(value, optional: bool) -> Optional[int]: ...


def check_max_distance(value, optional: bool = False) -> Optional[int]:
    """``value`` as the window of :meth:`LatentGraphs.within`: an integer >= 1, or
    ``None`` where ``optional``."""
    return check_int("max_distance", value, optional=optional, unit=" (units)")


def check_ptr(ptr: Tensor) -> SequenceBatch:
    """``ptr`` (``[B + 1]`` offsets) as a :class:`SequenceBatch`, after checking it."""
    if not isinstance(ptr, Tensor) or ptr.dtype != torch.long or ptr.dim() != 1 or \
            ptr.numel() < 2:
        raise ValueError("ptr must be an int64 [B + 1] tensor of sequence offsets (B >= 1)")
    # the limits read at call time, so users can raise them
    first_failure([
        ((ptr[0] != 0) | (ptr[1:] < ptr[:-1]).any(), "ptr must start at 0 and never decrease"),
        (ptr[-1] > sequences.MAX_UNITS,
         f"ptr claims more units than glomo_pyg.sequences.MAX_UNITS = {sequences.MAX_UNITS} "
         "(per-unit vectors would not fit in memory); split the batch or raise the limit"),
        (ptr.numel() - 1 > ptr[-1] + sequences.MAX_EMPTY_SEQUENCES,
         f"ptr has {ptr.numel() - 1} sequences, more than its units plus "
         "glomo_pyg.sequences.MAX_EMPTY_SEQUENCES")])
    return SequenceBatch.from_ptr(ptr)


def check_edge_layer(l: int, ei, ew, eh, seqs: SequenceBatch, num_heads: int,
                     rule: Optional[SequenceOrder] = None) -> None:
    """One layer of user-given edges: dtypes, shapes, device, ids and heads in range,
    edges inside one sequence and along ``rule``, finite non-negative weights. One sync."""
    device = seqs.ptr.device
    if not all(isinstance(t, Tensor) and t.device == device for t in (ei, ew, eh)) or \
            ei.dim() != 2 or ei.size(0) != 2 or ew.shape != (ei.size(1),) or \
            eh.shape != ew.shape or ei.dtype != torch.long or eh.dtype != torch.long or \
            not ew.dtype.is_floating_point:
        raise ValueError(f"layer {l}: edge_index [2, E] and edge_head [E] must be int64 and "
                         f"edge_weight [E] floating point tensors, on the device of ptr "
                         f"({device}); got " + ", ".join(
                             f"{t.dtype} {tuple(t.shape)} on {t.device}"
                             if isinstance(t, Tensor) else type(t).__name__
                             for t in (ei, ew, eh)))
    if ei.size(1) == 0:
        return
    n = seqs.num_nodes
    inside = (ei >= 0) & (ei < n)
    checks = [(~inside.all(), f"edge_index holds node ids outside [0, {n}) (ptr covers {n} "
                              f"units)"),
              (((eh < 0) | (eh >= num_heads)).any(),
               f"edge_head holds heads outside [0, {num_heads})")]
    ei = torch.where(inside, ei, 0)  # refused above; no read out of bounds meanwhile
    batch = seqs.batch[ei]
    checks.append(((batch[0] != batch[1]).any(), "an edge connects two different sequences"))
    if rule is not None:
        start = seqs.ptr[batch[1]]
        checks.append((~rule.allowed(target=ei[1] - start, source=ei[0] - start).all(),
                       f"an edge goes against the {rule.direction} order (include_self="
                       f"{rule.include_self}): forward graphs take earlier sources, backward "
                       "graphs later ones"))
    checks.append((~torch.isfinite(ew).all() | (ew < 0).any(),
                   "edge weights must be finite and non-negative"))
    first_failure(checks, f"layer {l}: ")


def check_dense_blocks(blocks, seqs: SequenceBatch, direction: str, include_self: bool) -> None:
    """User-given ``[B, H, T, T]`` blocks: float, one shape for all layers, on ``ptr``'s
    device, finite, non-negative and zero outside the allowed (source, target) pairs."""
    shape = getattr(blocks[0], "shape", None) if blocks else None
    for l, block in enumerate(blocks or [None]):
        if not isinstance(block, Tensor) or not block.dtype.is_floating_point or \
                block.dim() != 4 or block.shape != shape or \
                block.shape[0] != seqs.num_sequences or block.shape[1] < 1 or \
                block.shape[2:] != (seqs.max_len, seqs.max_len) or \
                block.device != seqs.ptr.device:
            raise ValueError(f"layer {l}: dense graphs need at least one layer of float "
                             f"[B, H, T, T] blocks with B = "
                             f"{seqs.num_sequences}, T = {seqs.max_len}, the same for every "
                             f"layer, on ptr's device {seqs.ptr.device}; got "
                             f"{tuple(getattr(block, 'shape', ()))} on "
                             f"{getattr(block, 'device', None)}")
    # weight outside the allowed pairs, e.g. at padding, would become edges across sequences
    allowed = SequenceOrder(direction, include_self).block_mask(
        0, seqs.max_len, 0, seqs.max_len, seqs.lengths).transpose(1, 2).unsqueeze(1)
    first_failure(
        [((~torch.isfinite(block)).any() | (block < 0).any(),
          f"layer {l}: dense graph weights must be finite and non-negative")
         for l, block in enumerate(blocks)] +
        [((block.masked_fill(allowed, 0) != 0).any(),
          f"layer {l}: dense graphs must be zero outside each sequence's allowed (source, "
          f"target) pairs: at padding, and where the {direction} order (include_self="
          f"{include_self}) forbids an edge") for l, block in enumerate(blocks)])
