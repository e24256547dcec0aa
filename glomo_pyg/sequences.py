"""Validation of PyG-style sequence batches and padded <-> flat conversion.

Every public entry point funnels its ``(x, batch)`` through here, so bad input
fails early with a message naming the problem instead of deep inside a kernel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor


@dataclass(frozen=True)
class SequenceBatch:
    """Layout of ``B`` variable-length sequences stored flat as ``N`` nodes.

    ``ptr[b]:ptr[b + 1]`` are the flat ids of sequence ``b``; ``position[n]`` is
    node ``n``'s index inside its sequence.
    """

    batch: Tensor
    ptr: Tensor
    lengths: Tensor
    position: Tensor
    max_len: int

    @property
    def num_nodes(self) -> int:
        return self.batch.numel()

    @property
    def num_sequences(self) -> int:
        return self.lengths.numel()

    @property
    def mask(self) -> Tensor:
        """``[B, T]`` True at real (non-padding) positions."""
        t = torch.arange(self.max_len, device=self.lengths.device)
        return t.view(1, -1) < self.lengths.view(-1, 1)

    def to_padded(self, x: Tensor) -> Tensor:
        """``[N, ...]`` -> ``[B, T, ...]`` with zeros at padding."""
        out = x.new_zeros((self.num_sequences, self.max_len) + tuple(x.shape[1:]))
        return out.index_put((self.batch, self.position), x)

    def to_flat(self, padded: Tensor) -> Tensor:
        """``[B, T, ...]`` -> ``[N, ...]``."""
        return padded[self.batch, self.position]

    @classmethod
    def from_ptr(cls, ptr: Tensor) -> "SequenceBatch":
        lengths = ptr[1:] - ptr[:-1]
        batch = torch.repeat_interleave(torch.arange(lengths.numel(), device=ptr.device), lengths)
        position = torch.arange(batch.numel(), device=ptr.device) - ptr[batch]
        return cls(batch, ptr, lengths, position, int(lengths.max()) if lengths.numel() else 0)


# A sorted PyG batch vector may skip ids (empty graphs, which PyG allows), but every
# sequence id costs memory (lengths, offsets, padded [B, T, ...] tensors) while it holds no
# unit: a batch [0, 10**8] of two units would allocate gigabytes. So a batch may hold at
# most this many sequences beyond its number of units: B <= N + MAX_EMPTY_SEQUENCES
# (docs/design.md, "Limits").
MAX_EMPTY_SEQUENCES = 1024
# Units a batch may claim through ``ptr`` alone (LatentGraphs(ptr=...), uniform graphs):
# per-unit vectors cost 8 bytes each, so 2**28 units are 2 GiB per vector. Raise it
# (glomo_pyg.sequences.MAX_UNITS) for larger batches.
MAX_UNITS = 1 << 28

# Token ids the embedding takes as they are.
TOKEN_DTYPES = (torch.int64, torch.int32)


def sequence_batch(num_nodes: int, batch: Optional[Tensor], device: torch.device) -> SequenceBatch:
    """Validate a PyG ``batch`` vector (``None``: one sequence) and describe it.

    The ids must be sorted (non-decreasing) and non-negative; ids may be skipped (empty
    sequences), but the number of sequences ``batch[-1] + 1`` may exceed the number of
    units ``N`` by at most :data:`MAX_EMPTY_SEQUENCES`, since every sequence costs
    memory. Two device syncs."""
    if num_nodes == 0:
        raise ValueError("empty input: x has no units (N = 0); every batch needs at least one unit")
    if batch is None:
        batch = torch.zeros(num_nodes, dtype=torch.long, device=device)
    if not isinstance(batch, Tensor):
        raise TypeError(f"batch must be a torch.Tensor or None, got {type(batch).__name__}")
    if batch.dtype != torch.long:
        raise TypeError(f"batch must be int64 (torch.long), got {batch.dtype}")
    if batch.dim() != 1 or batch.numel() != num_nodes:
        raise ValueError(f"batch must have shape [N] = [{num_nodes}], got {tuple(batch.shape)}")
    if batch.device != device:
        raise ValueError(f"batch is on {batch.device} but x is on {device}")
    if num_nodes > 1 and bool((batch[1:] < batch[:-1]).any()):
        raise ValueError("batch must be sorted (non-decreasing), as PyG's DataLoader produces; "
                         "sort the units by sequence id first")
    first, last = torch.stack([batch[0], batch[-1]]).tolist()  # sorted: the extremes
    if first < 0:
        raise ValueError("batch contains negative sequence ids")
    num_seqs = last + 1
    if num_seqs > num_nodes + MAX_EMPTY_SEQUENCES:
        raise ValueError(f"batch numbers {num_seqs} sequences (its last id is {last}) for "
                         f"{num_nodes} units: at most N + MAX_EMPTY_SEQUENCES = "
                         f"{num_nodes + MAX_EMPTY_SEQUENCES} are accepted, since every sequence "
                         f"id costs memory whether or not it holds a unit "
                         f"(glomo_pyg.sequences.MAX_EMPTY_SEQUENCES); renumber the sequences "
                         f"0, 1, 2, ... (e.g. torch.unique_consecutive(batch, "
                         f"return_inverse=True)[1])")
    lengths = torch.bincount(batch, minlength=num_seqs)
    ptr = torch.zeros(num_seqs + 1, dtype=torch.long, device=device)
    torch.cumsum(lengths, 0, out=ptr[1:])
    position = torch.arange(num_nodes, device=device) - ptr[batch]
    return SequenceBatch(batch, ptr, lengths, position, int(lengths.max()))


def check_tokens(x: Tensor, num_tokens: int) -> None:
    """Token ids: a 1-D int64 or int32 tensor with values in ``[0, num_tokens)``."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise TypeError(f"this model reads token ids: x must be an integer tensor, got {x.dtype}")
    if x.dtype not in TOKEN_DTYPES:
        raise TypeError(f"token ids must be int64 or int32 (what an embedding indexes with), got "
                        f"{x.dtype}; convert them with x.long()")
    if x.dim() != 1:
        raise ValueError(f"token ids must have shape [N], got {tuple(x.shape)}")
    if x.numel():
        low, high = torch.aminmax(x)
        low, high = torch.stack([low, high]).tolist()  # one device sync
        if low < 0 or high >= num_tokens:
            raise ValueError(f"token ids must lie in [0, {num_tokens}), got values in "
                             f"[{low}, {high}]")


def check_dtype(x: Tensor, dtype: torch.dtype, name: str = "x",
                owner: str = "this module's parameters") -> None:
    """``TypeError`` if floating ``x`` does not have ``dtype`` (the parameters it meets),
    unless autocast is on for its device and ``x`` is a type autocast converts (fp32, fp16,
    bf16): otherwise the first matrix product fails with an anonymous dtype mismatch."""
    if x.dtype == dtype:
        return
    if x.dtype in (torch.float32, torch.float16, torch.bfloat16) and \
            torch.is_autocast_enabled(x.device.type):
        return
    raise TypeError(f"{name} is {x.dtype} but {owner} are {dtype}: convert one of them "
                    f"({name}.to({dtype}) or module.to({x.dtype})), or run under torch.autocast "
                    f"(fp32/fp16/bf16 input)")


def check_features(x: Tensor, in_channels: int, name: str = "x",
                   check_finite: bool = True) -> None:
    """Features: a finite floating ``[N, in_channels]`` tensor (``check_finite=False``
    leaves out the NaN/Inf test, a device sync, for callers that combine it with others)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor of features, got {x.dtype}")
    if x.dim() != 2 or x.size(1) != in_channels:
        raise ValueError(f"{name} must have shape [N, {in_channels}], got {tuple(x.shape)}")
    if check_finite and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or Inf")
