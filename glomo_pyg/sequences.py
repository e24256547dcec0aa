"""Validation of PyG-style sequence batches (every public entry point's ``(x, batch)``)
and padded <-> flat conversion."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import Tensor


@dataclass(frozen=True)
class SequenceBatch:
    """Layout of ``B`` variable-length sequences stored flat as ``N`` nodes.

    ``ptr[b]:ptr[b + 1]`` are the flat ids of sequence ``b``; ``position[n]`` is node
    ``n``'s index in its sequence; ``sizes`` is ``lengths`` as host integers (read once).
    """

    batch: Tensor
    ptr: Tensor
    lengths: Tensor
    position: Tensor
    sizes: Tuple[int, ...]

    @property
    def max_len(self) -> int:
        return max(self.sizes, default=0)

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
        return cls(batch, ptr, lengths, position, tuple(lengths.tolist()))


# A batch vector may skip ids (empty sequences), but every id costs memory (a batch
# [0, 10**8] of two units would allocate gigabytes): B <= N + MAX_EMPTY_SEQUENCES
# (docs/design.md, "Limits").
MAX_EMPTY_SEQUENCES = 1024
# Units a batch may claim through ``ptr`` alone: per-unit vectors of 2 GiB at 2**28.
MAX_UNITS = 1 << 28

# Token ids the embedding takes as they are.
TOKEN_DTYPES = (torch.int64, torch.int32)


def sequence_batch(num_nodes: int, batch: Optional[Tensor], device: torch.device) -> SequenceBatch:
    """Validate a PyG ``batch`` vector (``None``: one sequence) and describe it.

    The ids must be sorted and non-negative; skipped ids (empty sequences) are allowed, up
    to ``N + MAX_EMPTY_SEQUENCES`` sequences. Two device syncs, here at the door only."""
    if batch is None:
        batch = torch.zeros(num_nodes, dtype=torch.long, device=device)
    if not isinstance(batch, Tensor) or batch.dtype != torch.long:
        raise TypeError(f"batch must be an int64 (torch.long) torch.Tensor or None, got "
                        f"{getattr(batch, 'dtype', type(batch).__name__)}")
    problem: Optional[str]
    if num_nodes == 0 or batch.shape != (num_nodes,) or batch.device != device:
        problem = (f"batch must have shape [N] = [{num_nodes}] on x's device {device}, got "
                   f"{tuple(batch.shape)} on {batch.device}" + (
                       "; empty input: x has no units (N = 0), every batch needs at least "
                       "one unit" if num_nodes == 0 else ""))
    else:
        unsorted, first, last = torch.stack([(batch[1:] < batch[:-1]).any().long(), batch[0],
                                             batch[-1]]).tolist()  # sorted: the extremes
        num_seqs = last + 1
        problem = (
            "batch must be sorted (non-decreasing), as PyG's DataLoader produces; sort the "
            "units by sequence id first" if unsorted else
            "batch contains negative sequence ids" if first < 0 else
            f"batch numbers {num_seqs} sequences (its last id is {last}) for {num_nodes} "
            f"units: at most N + MAX_EMPTY_SEQUENCES = {num_nodes + MAX_EMPTY_SEQUENCES} are "
            f"accepted, since every sequence id costs memory "
            f"(glomo_pyg.sequences.MAX_EMPTY_SEQUENCES); renumber the sequences 0, 1, 2, ... "
            f"(e.g. torch.unique_consecutive(batch, return_inverse=True)[1])"
            if num_seqs > num_nodes + MAX_EMPTY_SEQUENCES else None)
    if problem:
        raise ValueError(problem)
    lengths = torch.bincount(batch, minlength=num_seqs)
    ptr = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    position = torch.arange(num_nodes, device=device) - ptr[batch]
    return SequenceBatch(batch, ptr, lengths, position, tuple(lengths.tolist()))


def check_tokens(x: Tensor, num_tokens: int) -> None:
    """Token ids: a 1-D int64 or int32 tensor with values in ``[0, num_tokens)``."""
    if not isinstance(x, Tensor) or x.dtype not in TOKEN_DTYPES:
        raise TypeError(f"this model reads token ids: x must be an integer tensor, int64 or "
                        f"int32 (what an embedding indexes with), got "
                        f"{getattr(x, 'dtype', type(x).__name__)}; convert them with x.long()")
    low, high = torch.stack(torch.aminmax(x)).tolist() if x.numel() else (0, 0)  # one sync
    if x.dim() != 1 or low < 0 or high >= num_tokens:
        raise ValueError(f"token ids must lie in [0, {num_tokens}) and have shape [N], got "
                         f"shape {tuple(x.shape)}, values in [{low}, {high}]")


def check_dtype(x: Tensor, dtype: torch.dtype, name: str = "x",
                owner: str = "this module's parameters") -> None:
    """``TypeError`` if floating ``x`` does not have ``dtype`` (the parameters it meets),
    unless autocast is on for its device and converts ``x`` (fp32, fp16, bf16)."""
    if x.dtype != dtype and not (x.dtype in (torch.float32, torch.float16, torch.bfloat16)
                                 and torch.is_autocast_enabled(x.device.type)):
        raise TypeError(f"{name} is {x.dtype} but {owner} are {dtype}: convert one of them "
                        f"({name}.to({dtype}) or module.to({x.dtype})), or run under "
                        f"torch.autocast (fp32/fp16/bf16 input)")


def check_features(x: Tensor, in_channels: int, name: str = "x") -> None:
    """Features: a floating ``[N, in_channels]`` tensor (values are not read: no sync)."""
    if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point torch.Tensor of features, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() != 2 or x.size(1) != in_channels:
        raise ValueError(f"{name} must have shape [N, {in_channels}], got {tuple(x.shape)}")


def first_failure(checks: List[Tuple[Tensor, str]], prefix: str = "") -> None:
    """``ValueError`` with the message of the first check whose 0-d flag is set (true
    when it fails): one device sync for all the value checks of a door."""
    if not checks:
        return
    flags = torch.stack([flag.reshape(()).to(torch.bool) for flag, _ in checks]).tolist()
    if any(flags):
        raise ValueError(prefix + checks[flags.index(True)][1])
