"""Input encoder shared by the graph and feature predictors: token ids or features."""
from __future__ import annotations

from typing import Optional, Sequence, cast

import torch
from torch import Tensor

from glomo_pyg.pixels import check_pixels, check_statistics
from glomo_pyg.sequences import check_features, check_tokens


class UnitEncoder(torch.nn.Module):
    r"""Maps units to vectors: an embedding for token ids (``num_tokens``) or a linear
    map for ``[N, in_channels]`` features (``in_channels``); exactly one is given. With
    ``pixel_mean`` and ``pixel_std`` (per channel, [0, 1] scale) the features are uint8
    pixels, normalised as :math:`(x / 255 - \mu) / \sigma`. Floating features are
    converted to the parameters' dtype. ``padding_idx`` (token input only) is a token id
    in ``[-num_tokens, num_tokens)``.

    Shapes:
        - **input:** :math:`(N)` int64 ids, :math:`(N, F_{in})` floats or uint8 pixels
        - **output:** :math:`(N, C)`
    """

    pixel_mean: Tensor
    pixel_std: Tensor

    def __init__(self, out_channels: int, num_tokens: Optional[int] = None,
                 in_channels: Optional[int] = None, padding_idx: Optional[int] = None,
                 pixel_mean: Optional[Sequence[float]] = None,
                 pixel_std: Optional[Sequence[float]] = None):
        super().__init__()
        size = num_tokens if in_channels is None else in_channels
        one_input = (num_tokens is None) != (in_channels is None) and \
            min(cast(int, size), out_channels) > 0
        if not one_input or padding_idx is not None and (
                num_tokens is None or isinstance(padding_idx, bool) or
                not isinstance(padding_idx, int) or not -num_tokens <= padding_idx < num_tokens):
            raise ValueError(f"give exactly one of num_tokens (token-id input) or in_channels "
                             f"(feature input), and positive sizes; padding_idx applies to "
                             f"token-id input only: padding_idx must be a token id in "
                             f"[0, {num_tokens}) (or negative from the end), got {padding_idx!r} "
                             f"(num_tokens={num_tokens}, in_channels={in_channels}, "
                             f"out_channels={out_channels})")
        self.num_tokens, self.in_channels, self.out_channels = \
            num_tokens, in_channels, out_channels
        self.embedding = None if num_tokens is None else \
            torch.nn.Embedding(num_tokens, out_channels, padding_idx=padding_idx)
        self.linear = None if in_channels is None else torch.nn.Linear(in_channels, out_channels)
        self.pixels = pixel_mean is not None or pixel_std is not None
        if self.pixels:
            check_statistics(list(pixel_mean or ()), list(pixel_std or ()), in_channels)
            for name, values in (("pixel_mean", pixel_mean), ("pixel_std", pixel_std)):
                assert values is not None  # (checked: as many values as in_channels)
                self.register_buffer(name, torch.tensor([float(v) for v in values]),
                                     persistent=False)
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
            check_tokens(x, cast(int, self.num_tokens))
        elif self.pixels:
            check_pixels(x, cast(int, self.in_channels))
        else:
            check_features(x, cast(int, self.in_channels))

    def encode(self, x: Tensor) -> Tensor:
        """:meth:`forward` without the checks."""
        if self.embedding is not None:
            return self.embedding(x)
        assert self.linear is not None
        dtype = self.linear.weight.dtype
        if self.pixels:
            x = ((x.to(dtype) / 255.0 - self.pixel_mean.to(dtype)) / self.pixel_std.to(dtype))
        return self.linear(x.to(dtype))  # (fp16/bf16/fp64 features into an fp32 predictor)

    def forward(self, x: Tensor) -> Tensor:
        self.check(x)
        return self.encode(x)

    def __repr__(self) -> str:
        src = f"num_tokens={self.num_tokens}" if self.num_tokens is not None else \
            f"in_channels={self.in_channels}" + (", pixels=True" if self.pixels else "")
        return f"{self.__class__.__name__}({src}, out_channels={self.out_channels})"
