r"""PickConv: PICK's graph convolution with pairwise messages and edge embeddings (Yu et
al. ICPR 2020, Sec. III-C), along any weighted graph; and the units' relative positions
as its edge features."""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn.conv import MessagePassing

from glomo_pyg.kernels import check_graph_values
from glomo_pyg.sequences import check_dtype, check_features
from glomo_pyg.settings import check_int


class PickConv(MessagePassing):
    r"""PICK's graph convolution (Yu et al. 2020, Eqs. 6-8): a message per edge
    :math:`j \to i` from both nodes and the edge's embedding :math:`\boldsymbol\alpha_{ij}`,

    .. math::
        \mathbf{h}_{ij} = \sigma(\mathbf{W}_1 \mathbf{v}_i + \mathbf{W}_2 \mathbf{v}_j
        + \boldsymbol\alpha_{ij} + \mathbf{b}), \qquad
        \mathbf{v}'_i = \sigma\Big(\mathbf{W} \sum_{j} A_{ij} \mathbf{h}_{ij}\Big), \qquad
        \boldsymbol\alpha'_{ij} = \sigma(\mathbf{W}_\alpha \mathbf{h}_{ij})

    with :math:`\sigma` = ReLU. :math:`A_{ij}` is the weight of the edge :math:`j \to i`
    of any graph: PICK's learned one (:class:`~glomo_pyg.nn.GraphLearning`), GLoMo's
    (:class:`~glomo_pyg.transforms.GlomoGraphs`) or a fixed one. With ``edge_dim`` the
    given edge features (e.g. :func:`relative_positions`) are first embedded,
    :math:`\boldsymbol\alpha_{ij} = \mathbf{W}_e \mathbf{e}_{ij}` (PICK's embedding of the
    boxes' layout); without it, ``edge_attr`` is :math:`\boldsymbol\alpha` itself, as a
    previous layer's :math:`\boldsymbol\alpha'` is, or absent (:math:`\boldsymbol\alpha = 0`).

    Args:
        in_channels (int): width of :math:`\mathbf{v}`.
        out_channels (int): width of :math:`\mathbf{h}`, :math:`\mathbf{v}'` and
            :math:`\boldsymbol\alpha'`.
        edge_dim (int, optional): width of the edge features to embed; ``None``:
            ``edge_attr`` is ``out_channels`` wide, or not given. (default: :obj:`None`)
        act (callable): :math:`\sigma`. (default: :func:`torch.relu`)
        **kwargs (optional): additional arguments of
            :class:`torch_geometric.nn.conv.MessagePassing`.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})`, edge indices
          :math:`(2, |\mathcal{E}|)` (row 0 source, row 1 target; a tensor or an
          :class:`~torch_geometric.EdgeIndex`), edge weights :math:`(|\mathcal{E}|)`
          (default all ones), edge features :math:`(|\mathcal{E}|, D)` (optional)
        - **output:** node features :math:`(|\mathcal{V}|, F_{out})` and edge embeddings
          :math:`(|\mathcal{E}|, F_{out})`
    """

    def __init__(self, in_channels: int, out_channels: int, edge_dim: Optional[int] = None,
                 act: Callable[[Tensor], Tensor] = torch.relu, **kwargs):
        kwargs.setdefault("aggr", "sum")
        super().__init__(**kwargs)
        self.in_channels = check_int("in_channels", in_channels)
        self.out_channels = check_int("out_channels", out_channels)
        self.edge_dim = check_int("edge_dim", edge_dim, optional=True)
        if not callable(act):
            raise TypeError(f"act must be callable, got {type(act).__name__}")
        self.act = act
        self.lin_target = torch.nn.Linear(in_channels, out_channels)   # W_1 and b
        self.lin_source = torch.nn.Linear(in_channels, out_channels, bias=False)   # W_2
        self.lin_edge = None if edge_dim is None else \
            torch.nn.Linear(edge_dim, out_channels, bias=False)
        self.lin = torch.nn.Linear(out_channels, out_channels, bias=False)   # W
        self.lin_alpha = torch.nn.Linear(out_channels, out_channels, bias=False)   # W_alpha
        self.reset_parameters()

    def reset_parameters(self):
        super().reset_parameters()
        for lin in (self.lin_target, self.lin_source, self.lin_edge, self.lin, self.lin_alpha):
            if lin is not None:
                lin.reset_parameters()

    def forward(self, x: Tensor, edge_index: Tensor, edge_weight: Optional[Tensor] = None,
                edge_attr: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        self._check(x, edge_index, edge_weight, edge_attr)
        src, tgt = edge_index.as_tensor() if isinstance(edge_index, EdgeIndex) else edge_index
        pair = self.lin_target(x)[tgt] + self.lin_source(x)[src]
        if edge_attr is not None:
            pair = pair + (edge_attr if self.lin_edge is None else self.lin_edge(edge_attr))
        h = self.act(pair)
        if edge_weight is None:
            edge_weight = x.new_ones(h.size(0))
        out = self.propagate(edge_index, h=h, edge_weight=edge_weight,
                             size=(x.size(0), x.size(0)))
        return self.act(self.lin(out)), self.act(self.lin_alpha(h))

    def message(self, h: Tensor, edge_weight: Tensor) -> Tensor:
        return edge_weight.view(-1, 1).to(h.dtype) * h

    def _check(self, x: Tensor, edge_index: Tensor, edge_weight: Optional[Tensor],
               edge_attr: Optional[Tensor]) -> None:
        """Shapes at the door, then ids and weights in one device sync."""
        check_features(x, self.in_channels)
        dtype = self.lin_target.weight.dtype
        check_dtype(x, dtype, owner="PickConv's parameters")
        if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or \
                edge_index.size(0) != 2 or edge_index.dtype != torch.long:
            raise ValueError(f"edge_index must be an int64 tensor (or EdgeIndex) of shape "
                             f"[2, E], got {getattr(edge_index, 'dtype', type(edge_index))} "
                             f"{tuple(getattr(edge_index, 'shape', ()))}")
        num_edges = edge_index.size(1)
        if edge_weight is not None and (not isinstance(edge_weight, Tensor) or
                                        not edge_weight.is_floating_point() or
                                        tuple(edge_weight.shape) != (num_edges,)):
            raise ValueError(f"edge_weight must be a floating-point tensor of shape "
                             f"[E] = [{num_edges}], got {_describe(edge_weight)}")
        width = self.edge_dim or self.out_channels
        if edge_attr is not None:
            check_features(edge_attr, width, name="edge_attr")
            check_dtype(edge_attr, dtype, name="edge_attr", owner="PickConv's parameters")
            if edge_attr.size(0) != num_edges:
                raise ValueError(f"edge_attr must have shape [E, {width}] = "
                                 f"[{num_edges}, {width}], got {tuple(edge_attr.shape)}")
        elif self.lin_edge is not None:
            raise ValueError(f"this layer embeds edge features (edge_dim={self.edge_dim}): "
                             f"give edge_attr")
        plain = edge_index.as_tensor() if isinstance(edge_index, EdgeIndex) else edge_index
        check_graph_values(plain, edge_weight, None, x.size(0), 1)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"edge_dim={self.edge_dim})")


def _describe(t) -> str:
    return f"{t.dtype} {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__


def relative_positions(edge_index: Tensor, pos: Tensor, scale: Optional[float] = None
                       ) -> Tensor:
    r"""Edge features of the units' relative position, PICK's layout features for
    tokens and pixels: for the edge :math:`j \to i`, the signed offsets
    :math:`(\mathbf{p}_i - \mathbf{p}_j) / s` and the distance
    :math:`\lVert \mathbf{p}_i - \mathbf{p}_j \rVert / s`.

    Args:
        edge_index: :math:`(2, E)`, row 0 source.
        pos: :math:`(N, D)` (or :math:`(N)`) positions: a token's index in its sequence
            (``SequenceBatch.position``), a pixel's (row, column) (``Data.pos`` of
            :func:`~glomo_pyg.transforms.image_data`).
        scale: :math:`s`, e.g. the sequence length or image side; ``None``: the largest
            position (at least 1).

    Shapes:
        - **output:** :math:`(E, D + 1)`
    """
    if not isinstance(pos, Tensor) or pos.dim() not in (1, 2) or pos.is_complex():
        raise ValueError(f"pos must be a real tensor of shape [N] or [N, D], got "
                         f"{_describe(pos)}")
    pos = (pos.view(-1, 1) if pos.dim() == 1 else pos).to(torch.get_default_dtype())
    plain = edge_index.as_tensor() if isinstance(edge_index, EdgeIndex) else edge_index
    if not isinstance(plain, Tensor) or plain.dim() != 2 or plain.size(0) != 2 or \
            plain.dtype != torch.long:
        raise ValueError(f"edge_index must be an int64 tensor of shape [2, E], got "
                         f"{_describe(plain)}")
    check_graph_values(plain, None, None, pos.size(0), 1)
    if scale is None:
        scale = max(float(pos.abs().max()) if pos.numel() else 1.0, 1.0)
    elif not (isinstance(scale, (int, float)) and 0 < scale < float("inf")):
        raise ValueError(f"scale must be a positive finite number or None, got {scale!r}")
    offset = (pos[plain[1]] - pos[plain[0]]) / scale
    return torch.cat([offset, offset.norm(dim=1, keepdim=True)], 1)
