"""GraphMixer: mixes features along a weighted combination of latent graphs
(paper Sec. 2.2)."""
from __future__ import annotations

import numbers
from typing import Iterator, List, Optional, Sequence, Tuple, Union, cast

import torch
from torch import Tensor

from glomo_pyg.graphs import LatentGraphs
from glomo_pyg.ordering import DIRECTIONS
from glomo_pyg.sequences import check_dtype, check_features

MIXINGS = ("free", "conditioned")
PROPAGATIONS = ("both", "graph", "hierarchical")
GraphsArg = Union[LatentGraphs, Sequence[Optional[LatentGraphs]]]


class GraphMixer(torch.nn.Module):
    r"""Propagates features :math:`H` along a learned mixture of the graphs of a
    frozen graph predictor, separately for each direction.

    With components :math:`c = (l, h)` over the selected graph layers and all
    heads, and :math:`\Lambda^{l,h} = G^{1,h} G^{2,h} \cdots G^{l,h}`
    (hierarchical propagation, paper Sec. 2.2), each direction computes

    .. math::
        (HM)_j = \gamma \Big( \sum_c m_c\, (H G_c)_j
                 + \sum_c m'_c\, (H \Lambda_c)_j \Big), \qquad
        (H G)_j = \sum_i G_{ij}\, \mathbf{h}_i

    with mixture weights that sum to 1 over all components:

    * ``mixing='free'``: :math:`(m, m') = \mathrm{softmax}(\mathbf{w})` of free
      logits initialised at 0 (ELMo's ScalarMix), one set per direction;
    * ``mixing='conditioned'``: per target unit,
      :math:`(m, m')_j = \mathrm{softmax}(\mathbf{W} \mathbf{h}_j + \mathbf{b})`,
      zero-initialised.

    :math:`\gamma` is a learned scale per direction (initialised at 1). :math:`H` may
    have any width; :math:`H\Lambda^l` is chained, :math:`P^l = P^{l-1} G^l`, never
    densified.

    Args:
        in_channels (int): width :math:`d` of the features :math:`H`.
        num_layers (int): graph layers of the predictor.
        heads (int): heads per graph layer of the predictor.
        directions (sequence of str): directions mixed, in output order.
            (default: ``('forward', 'backward')``)
        mixing (str): ``'free'`` or ``'conditioned'``. (default: :obj:`'free'`)
        propagation (str): ``'both'`` (:math:`G` and :math:`\Lambda`, the paper),
            ``'graph'`` (the "-hierarchical" ablation) or ``'hierarchical'``.
            (default: :obj:`'both'`)
        layers (sequence of int, optional): graph layers whose components are mixed.
            (default: all)

    Shapes:
        - **input:** features :math:`(N, d)`; graphs: one :class:`~glomo_pyg.LatentGraphs`
          per direction over the same :math:`N` units
        - **output:** a list with one :math:`(N, d)` tensor per direction
    """

    def __init__(self, in_channels: int, num_layers: int, heads: int,
                 directions: Sequence[str] = DIRECTIONS, mixing: str = "free",
                 propagation: str = "both", layers: Optional[Sequence[int]] = None):
        super().__init__()
        for name, value in (("in_channels", in_channels), ("num_layers", num_layers),
                            ("heads", heads)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ValueError(f"in_channels, num_layers and heads must be positive "
                                 f"integers, got {name}={value!r}")
        directions = tuple(directions)
        layers = tuple(range(num_layers)) if layers is None else tuple(layers)
        wrong = [f"{name} must be one of {allowed}, got {value!r}" for name, value, allowed in
                 (("mixing", mixing, MIXINGS), ("propagation", propagation, PROPAGATIONS))
                 if value not in allowed]
        if not directions or len(set(directions)) != len(directions) or \
                any(d not in DIRECTIONS for d in directions):
            wrong.append(f"directions must be distinct values of {DIRECTIONS}, got {directions}")
        # (not int(l): int(0.7) would pick layer 0)
        if not layers or any(isinstance(l, bool) or not isinstance(l, numbers.Integral) or
                             not 0 <= l < num_layers for l in layers):
            wrong.append(f"layers must be a non-empty subset of the integer layer indices "
                         f"0..{num_layers - 1}, got {list(layers)!r}")
        if wrong:
            raise ValueError("; ".join(wrong))
        layers = tuple(sorted(set(int(l) for l in layers)))
        self.in_channels, self.num_layers, self.heads = in_channels, num_layers, heads
        self.directions, self.mixing, self.propagation = directions, mixing, propagation
        self.layers = layers
        self.kinds = ("graph", "hierarchical") if propagation == "both" else (propagation,)
        self.num_components = len(self.kinds) * len(layers) * heads
        free = mixing == "free"
        self.logits = torch.nn.Parameter(torch.empty(len(directions), self.num_components)) \
            if free else None
        self.weight_lins = None if free else torch.nn.ModuleList(
            torch.nn.Linear(in_channels, self.num_components) for _ in directions)
        self.gamma = torch.nn.Parameter(torch.empty(len(directions)))
        self.reset_parameters()

    def reset_parameters(self):
        free = [self.logits] if self.logits is not None else self.weight_lins.parameters()
        for weight in free:  # zero: training starts from the uniform mixture
            torch.nn.init.zeros_(weight)
        torch.nn.init.ones_(self.gamma)

    def components(self) -> List[Tuple[str, int, int]]:
        """``(kind, layer, head)`` of each mixture component, in weight order."""
        return [(k, l, h) for k in self.kinds for l in self.layers for h in range(self.heads)]

    def mixture_weights(self, x: Optional[Tensor] = None) -> Tensor:
        """Mixture weights: ``[D, K]`` (free) or ``[D, N, K]`` (conditioned on
        ``x``), ``D`` directions, ``K`` components; they sum to 1 over ``K``."""
        if self.logits is not None:
            return torch.softmax(self.logits, dim=-1)
        if x is None:
            raise ValueError("conditioned mixture weights depend on the features: pass x")
        assert self.weight_lins is not None
        return torch.stack([torch.softmax(lin(x), dim=-1) for lin in self.weight_lins])

    def forward(self, x: Tensor, graphs: GraphsArg) -> List[Tensor]:
        """``x`` must have the parameters' dtype unless autocast converts it."""
        check_features(x, self.in_channels)
        return self.mix(x, graphs)

    def mix(self, x: Tensor, graphs: GraphsArg) -> List[Tensor]:
        """:meth:`forward` for features ``x`` whose shape the caller checked."""
        check_dtype(x, self.gamma.dtype, owner="GraphMixer's parameters")
        graphs = self._check_graphs(x, graphs)
        weights = self.mixture_weights(x)
        return [self.gamma[d] * self._mix(x, g, weights[d]) for d, g in enumerate(graphs)]

    @torch.no_grad()
    def propagations(self, x: Tensor, graphs: GraphsArg) -> Tensor:
        """Every component's propagation of ``x``, unweighted, ``[D, K, N, C]`` in the
        order of :meth:`components`: for fixed inputs, compute once and reuse with
        :meth:`combine` (the mixture is linear in them)."""
        check_features(x, self.in_channels)
        graphs = self._check_graphs(x, graphs)
        out = []
        for g in graphs:
            selected = list(self._propagate(x, g))
            out.append(torch.cat([pair[kind == "hierarchical"] for kind in self.kinds
                                  for pair in selected], 0))
        return torch.stack(out)

    def combine(self, propagations: Tensor, x: Optional[Tensor] = None) -> List[Tensor]:
        """:meth:`forward` from precomputed :meth:`propagations` ``[D, K, N, C]`` (``x``,
        the features, is needed for ``mixing='conditioned'``)."""
        d, k = len(self.directions), self.num_components
        if propagations.dim() != 4 or propagations.shape[:2] != (d, k) or \
                propagations.size(-1) != self.in_channels:
            raise ValueError(f"propagations must be [{d}, {k}, N, {self.in_channels}], got "
                             f"{tuple(propagations.shape)}")
        if self.weight_lins is not None and x is not None:  # host-side checks only
            check_features(x, self.in_channels)
            check_dtype(x, self.gamma.dtype, owner="GraphMixer's parameters")
        weights = self.mixture_weights(x)
        spec = "nk,knc->nc" if weights.dim() == 3 else "k,knc->nc"
        return [self.gamma[i] * torch.einsum(spec, weights[i], propagations[i].to(
            weights.dtype)) for i in range(d)]

    def _mix(self, x: Tensor, graphs: LatentGraphs, weights: Tensor) -> Tensor:
        # weights [K] or [N, K] -> [..., kinds, selected layers, heads]
        w = weights.view(*weights.shape[:-1], len(self.kinds), len(self.layers), self.heads)
        spec = "nh,hnc->nc" if w.dim() == 4 else "h,hnc->nc"
        out = x.new_zeros(x.shape)
        for i, (direct, chain) in enumerate(self._propagate(x, graphs)):
            if direct is not None:
                out = out + torch.einsum(spec, w[..., 0, i, :], direct)
            if chain is not None:
                out = out + torch.einsum(spec, w[..., len(self.kinds) - 1, i, :], chain)
        return out

    def _propagate(self, x: Tensor, graphs: LatentGraphs) -> Iterator[tuple]:
        """``[H, N, C]`` ``(H G^l, H Lambda^l)`` per selected layer ``l`` (``None``: unmixed)."""
        use_graph, use_chain = "graph" in self.kinds, "hierarchical" in self.kinds
        chain: Optional[Tensor] = None
        for l in range(self.layers[-1] + 1):
            selected = l in self.layers
            if not selected and not use_chain:
                continue
            direct: Optional[Tensor] = None
            if use_graph and selected and use_chain and l > 0 and graphs.layout == "fused":
                # one fused call for H G^l and P^{l-1} G^l: the fused layout scores the
                # layer once per call, and wider values cost it little
                assert chain is not None  # (from layer 0)
                c = x.size(-1)
                both = graphs.propagate(torch.cat([x.expand(chain.shape), chain], -1), l)
                yield both[..., :c], both[..., c:]
                chain = both[..., c:]
                continue
            if use_graph and selected or use_chain and l == 0:
                direct = graphs.propagate(x, l)
            if use_chain:  # P^l = P^{l-1} G^l, per head
                chain = direct if l == 0 else graphs.propagate(cast(Tensor, chain), l)
            if selected:
                yield direct if use_graph else None, chain

    def _check_graphs(self, x: Tensor, graphs: GraphsArg) -> List[LatentGraphs]:
        graphs = [graphs] if isinstance(graphs, LatentGraphs) else list(graphs)
        foreign = [type(g).__name__ for g in graphs
                   if g is not None and not isinstance(g, LatentGraphs)]
        if foreign:
            raise TypeError(f"graphs must be LatentGraphs (or None), got {foreign}")
        by_direction = {g.direction: g for g in graphs if g is not None}
        out = [by_direction.get(d) for d in self.directions]
        missing = [d for d, g in zip(self.directions, out) if g is None]
        bad = next((g for g in out if g is not None and (
            g.num_layers, g.num_heads, g.num_nodes, g.device) != (
                self.num_layers, self.heads, x.size(0), x.device)), None)
        if missing or bad is not None:
            bad = cast(LatentGraphs, bad)  # (read only when no direction is missing)
            raise ValueError(
                f"this mixer needs graphs for directions {self.directions}; missing {missing}"
                if missing else
                f"{bad.direction} graphs cover {bad.num_nodes} units, x has {x.size(0)} rows "
                f"({bad.num_layers} layers x {bad.num_heads} heads on {bad.device}; this mixer "
                f"was built for {self.num_layers} x {self.heads}, x is on {x.device})")
        return cast(List[LatentGraphs], out)  # (none missing)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, layers={list(self.layers)}, "
                f"heads={self.heads}, directions={self.directions}, mixing='{self.mixing}', "
                f"propagation='{self.propagation}')")
