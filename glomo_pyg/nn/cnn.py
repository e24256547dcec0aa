"""Causal (or anti-causal) 1-D CNN over padded sequences: the key and query
networks of the graph predictor (paper Sec. 2.1)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from glomo_pyg.ordering import check_direction
from glomo_pyg.settings import check_int

NORMS = (None, "layer", "batch")


class MaskedNorm(torch.nn.Module):
    """LayerNorm or BatchNorm over the real positions of ``[B, T, C]`` input (BatchNorm
    mixes positions while training: only LayerNorm keeps the network strictly causal)."""

    def __init__(self, channels: int, norm: Optional[str]):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        self.norm = norm
        self.module = None if norm is None else \
            (torch.nn.LayerNorm if norm == "layer" else torch.nn.BatchNorm1d)(channels)

    def reset_parameters(self) -> None:
        if self.module is not None:
            self.module.reset_parameters()

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        if self.norm != "batch":
            return x if self.module is None else self.module(x)
        units = x[mask]
        if self.training and units.size(0) < 2:
            # say which setting and input, instead of torch's "more than 1 value per channel"
            raise ValueError(f"norm='batch' needs at least 2 units in a batch while training "
                             f"(its statistics are over the batch's units), got "
                             f"{units.size(0)}: train on larger batches, use norm='layer', or "
                             "call .eval() to emit graphs")
        out = torch.zeros_like(x)
        assert self.module is not None
        out[mask] = self.module(units)
        return out


class CausalCNN(torch.nn.Module):
    r"""Stack of ``Conv1d -> norm -> ReLU`` layers that only look one way.

    ``direction='forward'``: position :math:`t` sees positions :math:`\le t` (left zero
    padding, as in WaveNet); ``'backward'``: positions :math:`\ge t`. Padding positions
    are zeroed before every convolution.

    Shapes:
        - **input:** :math:`(B, T, C)` and mask :math:`(B, T)`
        - **output:** :math:`(B, T, C)`, zero at padding
    """

    def __init__(self, channels: int, num_layers: int = 4, kernel_size: int = 3,
                 direction: str = "forward", norm: Optional[str] = "layer", dropout: float = 0.0):
        super().__init__()
        check_direction(direction)
        num_layers = check_int("num_layers", num_layers, 0)
        kernel_size = check_int("kernel_size", kernel_size)
        self.channels, self.kernel_size, self.direction = channels, kernel_size, direction
        self.convs = torch.nn.ModuleList(
            torch.nn.Conv1d(channels, channels, kernel_size) for _ in range(num_layers))
        self.norms = torch.nn.ModuleList(MaskedNorm(channels, norm) for _ in range(num_layers))
        self.dropout = dropout

    def reset_parameters(self):
        for module in (*self.convs, *(n.module for n in self.norms if n.module is not None)):
            module.reset_parameters()

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        keep = mask.unsqueeze(-1).to(x.dtype)
        k = self.kernel_size - 1
        pad = (k, 0) if self.direction == "forward" else (0, k)
        for conv, norm in zip(self.convs, self.norms):
            h = F.pad((x * keep).transpose(1, 2), pad)
            x = F.relu(norm(conv(h).transpose(1, 2), mask))
            x = F.dropout(x, self.dropout, self.training)
        return x * keep

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.channels}, num_layers={len(self.convs)}, "
                f"kernel_size={self.kernel_size}, direction='{self.direction}')")
