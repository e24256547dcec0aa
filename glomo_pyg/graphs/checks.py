"""Checks at the door of the graph constructors: batch offsets, user-given edges, the
fixed baselines' arguments and the window of :meth:`LatentGraphs.within
<glomo_pyg.graphs.LatentGraphs.within>`."""
from __future__ import annotations

import operator
from typing import Optional

import torch
from torch import Tensor

from glomo_pyg import sequences
from glomo_pyg.ordering import DIRECTIONS, SequenceOrder
from glomo_pyg.sequences import SequenceBatch

# far beyond any model (the paper: 3 layers of 8 heads); per-head statistics allocate
# [layers, heads, units] tensors, so absurd counts are refused before they are used
MAX_HEADS = 4096
MAX_LAYERS = 4096


def check_direction(direction) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")


def check_num_heads(num_heads) -> None:
    if not isinstance(num_heads, int) or isinstance(num_heads, bool) or \
            not 1 <= num_heads <= MAX_HEADS:
        raise ValueError(f"num_heads must be an integer in [1, {MAX_HEADS}], got "
                         f"{num_heads!r}")


def check_fixed_graphs(direction: str, num_layers: int, num_heads: int) -> None:
    """The arguments of the graphs built without a predictor (uniform, adjacent)."""
    check_direction(direction)
    for name, value, high in (("num_layers", num_layers, MAX_LAYERS),
                              ("num_heads", num_heads, MAX_HEADS)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
            raise ValueError(f"{name} must be an integer in [1, {high}], got {value!r}")


def check_max_distance(value, optional: bool = False) -> Optional[int]:
    """``value`` as the window of :meth:`LatentGraphs.within`: an integer >= 1 (Python,
    numpy or 0-d tensor; not a bool), or ``None`` where ``optional``."""
    if value is None and optional:
        return None
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < 1:
        raise ValueError(f"max_distance must be {'None or ' if optional else ''}an integer >= 1 "
                         f"(units), got {value!r}")
    return number


def check_ptr(ptr: Tensor) -> SequenceBatch:
    """``ptr`` (``[B + 1]`` offsets) as a :class:`SequenceBatch`, after checking it."""
    if not isinstance(ptr, Tensor) or ptr.dtype != torch.long or ptr.dim() != 1 or \
            ptr.numel() < 2:
        raise ValueError("ptr must be an int64 [B + 1] tensor of sequence offsets (B >= 1)")
    if int(ptr[0]) != 0 or bool((ptr[1:] < ptr[:-1]).any()):
        raise ValueError("ptr must start at 0 and never decrease")
    # read the limits from the module at call time, so users can raise them
    if int(ptr[-1]) > sequences.MAX_UNITS:
        raise ValueError(f"ptr claims {int(ptr[-1])} units, more than "
                         f"glomo_pyg.sequences.MAX_UNITS = {sequences.MAX_UNITS} (per-unit "
                         "vectors would not fit in memory); split the batch or raise the limit")
    if ptr.numel() - 1 > int(ptr[-1]) + sequences.MAX_EMPTY_SEQUENCES:
        raise ValueError(f"ptr has {ptr.numel() - 1} sequences for {int(ptr[-1])} units: at "
                         "most N + glomo_pyg.sequences.MAX_EMPTY_SEQUENCES are accepted")
    return SequenceBatch.from_ptr(ptr)


def check_edge_layer(l: int, ei, ew, eh, seqs: SequenceBatch, num_heads: int,
                     rule: Optional[SequenceOrder] = None) -> None:
    """One layer of user-given edges: dtypes, shapes, device, ids and heads in range,
    edges inside one sequence and along ``rule``, finite non-negative weights; so no
    graph that reaches a sparse kernel can make it read out of bounds."""
    if not all(isinstance(t, Tensor) for t in (ei, ew, eh)):
        raise ValueError(f"layer {l}: edge_index, edge_weight and edge_head must be tensors")
    if ei.dim() != 2 or ei.size(0) != 2 or ew.shape != (ei.size(1),) or eh.shape != ew.shape:
        raise ValueError(f"layer {l}: expected edge_index [2, E], edge_weight [E], "
                         f"edge_head [E]; got {tuple(ei.shape)}, {tuple(ew.shape)}, "
                         f"{tuple(eh.shape)}")
    if ei.dtype != torch.long or eh.dtype != torch.long or not ew.dtype.is_floating_point:
        raise ValueError(f"layer {l}: edge_index and edge_head must be int64 and edge_weight "
                         f"floating point, got {ei.dtype}, {eh.dtype}, {ew.dtype}")
    device = seqs.ptr.device
    if ei.device != device or ew.device != device or eh.device != device:
        raise ValueError(f"layer {l}: edges must be on the device of ptr ({device})")
    if ei.size(1) == 0:
        return
    n = seqs.num_nodes
    if int(ei.min()) < 0 or int(ei.max()) >= n:
        raise ValueError(f"layer {l}: edge_index holds node ids outside [0, {n}) (ptr covers "
                         f"{n} units)")
    if int(eh.min()) < 0 or int(eh.max()) >= num_heads:
        raise ValueError(f"layer {l}: edge_head holds heads outside [0, {num_heads})")
    if bool((seqs.batch[ei[0]] != seqs.batch[ei[1]]).any()):
        raise ValueError(f"layer {l}: an edge connects two different sequences")
    if rule is not None:
        start = seqs.ptr[seqs.batch[ei[1]]]
        if not bool(rule.allowed(target=ei[1] - start, source=ei[0] - start).all()):
            raise ValueError(f"layer {l}: an edge goes against the {rule.direction} order "
                             f"(include_self={rule.include_self}): forward graphs take "
                             "earlier sources, backward graphs later ones")
    if not bool(torch.isfinite(ew).all()) or bool((ew < 0).any()):
        raise ValueError(f"layer {l}: edge weights must be finite and non-negative")


def check_dense_blocks(blocks, seqs: SequenceBatch, direction: str, include_self: bool) -> None:
    """User-given ``[B, H, T, T]`` blocks: float, one shape for all layers, on ``ptr``'s
    device, finite, non-negative and zero outside the allowed (source, target) pairs."""
    shape = getattr(blocks[0], "shape", None)
    for l, block in enumerate(blocks):
        if not isinstance(block, Tensor) or not block.dtype.is_floating_point or \
                block.dim() != 4 or block.shape != shape or \
                block.shape[0] != seqs.num_sequences or block.shape[1] < 1 or \
                block.shape[2:] != (seqs.max_len, seqs.max_len):
            raise ValueError(f"layer {l}: dense graphs must be float [B, H, T, T] with B = "
                             f"{seqs.num_sequences}, T = {seqs.max_len}, the same for every "
                             f"layer; got {tuple(getattr(block, 'shape', ()))}")
        if block.device != seqs.ptr.device:
            raise ValueError(f"layer {l}: dense graphs are on {block.device}, ptr on "
                             f"{seqs.ptr.device}")
    # weight outside the allowed (source, target) pairs of each sequence, e.g. at
    # padding, would become edges between sequences or past the last unit
    allowed = SequenceOrder(direction, include_self).block_mask(
        0, seqs.max_len, 0, seqs.max_len, seqs.lengths).transpose(1, 2).unsqueeze(1)
    bad = torch.stack([(~torch.isfinite(block)).any() | (block < 0).any()
                       for block in blocks] +
                      [(block.masked_fill(allowed, 0) != 0).any() for block in blocks]
                      ).tolist()  # one device sync for all layers
    if any(bad[:len(blocks)]):
        raise ValueError(f"layer {bad.index(True)}: dense graph weights must be finite and "
                         f"non-negative")
    if any(bad[len(blocks):]):
        raise ValueError(f"layer {bad[len(blocks):].index(True)}: dense graphs must be zero "
                         f"outside each sequence's allowed (source, target) pairs: at "
                         f"padding, and where the {direction} order (include_self="
                         f"{include_self}) forbids an edge")
