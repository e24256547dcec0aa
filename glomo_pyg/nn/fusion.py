"""GatedFusion: concatenates features with a gated transform of their graph mixtures
(paper Sec. 2.3)."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from glomo_pyg.sequences import check_dtype, check_features


class GatedFusion(torch.nn.Module):
    r"""Fuses features :math:`H` with their mixtures :math:`M_1 H, \dots, M_K H`
    (one per graph direction):

    .. math::
        \mathbf{z}_j = [\mathbf{h}_j ; (M_1 H)_j ; \dots ; (M_K H)_j], \qquad
        \mathbf{h}'_j = \big[\mathbf{h}_j ;\;
        \mathbf{W}_1 \mathbf{z}_j \odot \sigma(\mathbf{W}_2 \mathbf{z}_j)\big]

    (the reference implementation's fusion) with affine maps
    :math:`\mathbf{W}_1, \mathbf{W}_2` to ``fusion_channels``.

    Args:
        in_channels (int): width :math:`d` of :math:`H` and of each mixture.
        num_mixtures (int): number :math:`K` of mixtures. (default: :obj:`2`)
        fusion_channels (int, optional): width of the gated part. (default: ``d``)

    Shapes:
        - **input:** features :math:`(N, d)`, :math:`K` mixtures :math:`(N, d)`
        - **output:** :math:`(N, d + \text{fusion\_channels})`
    """

    def __init__(self, in_channels: int, num_mixtures: int = 2,
                 fusion_channels: Optional[int] = None):
        super().__init__()
        fusion_channels = in_channels if fusion_channels is None else fusion_channels
        if min(in_channels, num_mixtures, fusion_channels) <= 0:
            raise ValueError("in_channels, num_mixtures and fusion_channels must be positive")
        self.in_channels, self.num_mixtures, self.fusion_channels = \
            in_channels, num_mixtures, fusion_channels
        gate_in = in_channels * (1 + num_mixtures)
        self.transform = torch.nn.Linear(gate_in, fusion_channels)
        self.gate = torch.nn.Linear(gate_in, fusion_channels)
        self.reset_parameters()

    @property
    def out_channels(self) -> int:
        return self.in_channels + self.fusion_channels

    def reset_parameters(self):
        self.transform.reset_parameters()
        self.gate.reset_parameters()

    def forward(self, x: Tensor, mixed: Sequence[Tensor]) -> Tensor:
        """``x`` and every mixture must have ``x``'s shape and device and the parameters'
        dtype (unless autocast converts them)."""
        check_features(x, self.in_channels)
        check_dtype(x, self.transform.weight.dtype, owner="GatedFusion's parameters")
        mixed = [mixed] if isinstance(mixed, Tensor) else list(mixed)
        if len(mixed) != self.num_mixtures or not all(
                isinstance(m, Tensor) and m.shape == x.shape and m.device == x.device
                for m in mixed):
            raise ValueError(f"expected {self.num_mixtures} mixtures, each of the shape "
                             f"{tuple(x.shape)} and device {x.device} of x, got "
                             + ", ".join(f"{tuple(m.shape)} on {m.device}"
                                         if isinstance(m, Tensor) else type(m).__name__
                                         for m in mixed))
        for k, m in enumerate(mixed):
            check_dtype(m, x.dtype, name=f"mixture {k}", owner="x's values")
        return self.fuse(x, mixed)

    def fuse(self, x: Tensor, mixed: Sequence[Tensor]) -> Tensor:
        """:meth:`forward` without the checks, for inputs validated by the caller."""
        z = torch.cat([x, *mixed], dim=-1)
        return torch.cat([x, self.transform(z) * torch.sigmoid(self.gate(z))], dim=-1)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, num_mixtures={self.num_mixtures}, "
                f"fusion_channels={self.fusion_channels})")
