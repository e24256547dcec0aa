"""Input encoder shared by the graph and feature predictors: token ids or features."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from glomo_pyg.sequences import check_features, check_tokens


class UnitEncoder(torch.nn.Module):
    r"""Maps units to vectors: an embedding for token ids (``num_tokens``) or a
    linear map for ``[N, in_channels]`` features (``in_channels``); exactly one
    of the two is given. Validates the input before touching it.

    Shapes:
        - **input:** :math:`(N)` int64 ids or :math:`(N, F_{in})` floats
        - **output:** :math:`(N, C)`
    """

    def __init__(self, out_channels: int, num_tokens: Optional[int] = None,
                 in_channels: Optional[int] = None, padding_idx: Optional[int] = None):
        super().__init__()
        if (num_tokens is None) == (in_channels is None):
            raise ValueError("give exactly one of num_tokens (token-id input) or in_channels "
                             "(feature input)")
        if out_channels <= 0:
            raise ValueError(f"out_channels must be positive, got {out_channels}")
        self.num_tokens = num_tokens
        self.in_channels = in_channels
        self.out_channels = out_channels
        if num_tokens is not None:
            if num_tokens <= 0:
                raise ValueError(f"num_tokens must be positive, got {num_tokens}")
            self.embedding = torch.nn.Embedding(num_tokens, out_channels, padding_idx=padding_idx)
            self.linear = None
        else:
            if in_channels <= 0:
                raise ValueError(f"in_channels must be positive, got {in_channels}")
            self.embedding = None
            self.linear = torch.nn.Linear(in_channels, out_channels)
        self.reset_parameters()

    def reset_parameters(self):
        if self.embedding is not None:
            torch.nn.init.normal_(self.embedding.weight, std=self.out_channels ** -0.5)
            if self.embedding.padding_idx is not None:
                with torch.no_grad():
                    self.embedding.weight[self.embedding.padding_idx].zero_()
        else:
            self.linear.reset_parameters()

    def check(self, x: Tensor) -> None:
        if self.embedding is not None:
            check_tokens(x, self.num_tokens)
        else:
            check_features(x, self.in_channels)

    def encode(self, x: Tensor) -> Tensor:
        """:meth:`forward` without the checks, for input validated at the door."""
        return self.embedding(x) if self.embedding is not None else self.linear(x)

    def forward(self, x: Tensor) -> Tensor:
        self.check(x)
        return self.encode(x)

    def __repr__(self) -> str:
        src = f"num_tokens={self.num_tokens}" if self.num_tokens is not None else \
            f"in_channels={self.in_channels}"
        return f"{self.__class__.__name__}({src}, out_channels={self.out_channels})"
