"""GlomoTransfer: the module a user drops into a downstream model (paper Sec. 2.2-2.3)."""
from __future__ import annotations

import sys
import warnings
from types import FrameType
from typing import List, Optional, Sequence, cast

import torch
import torch_geometric
from torch import Tensor

from glomo_pyg.graphs import DirectionalGraphs, LatentGraphs, check_max_distance
from glomo_pyg.nn.fusion import GatedFusion
from glomo_pyg.nn.mixer import GraphMixer
from glomo_pyg.nn.pretrained import PretrainedGraphPredictor
from glomo_pyg.sequences import check_dtype, check_features, sequence_batch

GRAPHS = ("learned", "uniform", "adjacent", "none")
# frames of these packages are skipped when a warning names its caller
_INTERNAL = tuple(cast(str, m.__file__)[:-len("__init__.py")]  # the package folders (with /)
                  for m in (sys.modules["glomo_pyg"], torch, torch_geometric))


def _check_graph(graph: str) -> None:
    if graph not in GRAPHS:
        raise ValueError(f"graph must be one of {GRAPHS}, got {graph!r}")


def caller_stacklevel() -> int:
    """``stacklevel`` of the first frame outside glomo_pyg and torch (the depth varies)."""
    frame: Optional[FrameType]
    level, frame = 2, sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        level, frame = level + 1, frame.f_back
    return level


class GlomoTransfer(torch.nn.Module):
    r"""Fuses downstream features :math:`H` with their propagation along the
    graphs of a frozen pretrained predictor:

    .. math::
        H' = \big[H ;\; \mathbf{W}_1 \mathbf{z} \odot \sigma(\mathbf{W}_2 \mathbf{z})\big],
        \qquad \mathbf{z} = [H ; M_{fw} H ; M_{bw} H]

    where :math:`M_{dir} H` is a :class:`GraphMixer` mixture of the direction's graphs
    :math:`G` and hierarchical products :math:`\Lambda`, and the fusion is
    :class:`GatedFusion`. The predictor is frozen (no gradients, always in eval mode).
    ``graph`` switches the graphs for the baselines, without changing the parameters:

    * ``'learned'``: the predictor's graphs for the raw units ``x``;
    * ``'uniform'``: equal weights over the allowed sources (:meth:`LatentGraphs.uniform`);
    * ``'adjacent'``: weight 1 on each unit's neighbour (:meth:`LatentGraphs.adjacent`);
    * ``'none'``: :math:`M = I`, the feature-only baseline with the same gate.

    Args:
        predictor (PretrainedGraphPredictor): frozen graph predictor.
        in_channels (int): width :math:`d` of :math:`H` (any width).
        fusion_channels (int, optional): width of the gated part. (default: ``d``)
        graph (str): ``'learned'``, ``'uniform'``, ``'adjacent'`` or ``'none'``.
        mixing, propagation, layers: options of :class:`GraphMixer`.
        max_distance (int, optional): drop the edges of the graphs this module computes
            that span more than this many units (:meth:`LatentGraphs.within`).
            (default: no limit, as in the paper)

    Shapes:
        - **input:** features :math:`H` :math:`(N, d)`; the predictor's input ``x``
          for the same units and sorted ``batch`` :math:`(N)`, or precomputed ``graphs``
        - **output:** :math:`(N, d + \text{fusion\_channels})`
    """

    # (modules pickled before these existed)
    max_distance: Optional[int] = None
    _warned_length: bool = False

    def __init__(self, predictor: PretrainedGraphPredictor, in_channels: int,
                 fusion_channels: Optional[int] = None, graph: str = "learned",
                 mixing: str = "free", propagation: str = "both",
                 layers: Optional[Sequence[int]] = None, max_distance: Optional[int] = None):
        super().__init__()
        if not isinstance(predictor, PretrainedGraphPredictor):
            raise TypeError(f"predictor must be a PretrainedGraphPredictor (from "
                            f"PretrainedGraphPredictor.from_pretrained(...) or "
                            f"Glomo.to_pretrained(...)), got {type(predictor).__name__}")
        _check_graph(graph)
        max_distance = check_max_distance(max_distance, optional=True)
        self.graph, self.max_distance = graph, max_distance
        self._warned_length = False
        self.predictor = predictor.requires_grad_(False).eval()
        self.mixer = GraphMixer(in_channels, predictor.num_layers, predictor.heads,
                                predictor.directions, mixing, propagation, layers)
        self.fusion = GatedFusion(in_channels, len(predictor.directions), fusion_channels)

    # (plain properties: torch.compile cannot trace an ``operator.attrgetter`` call)
    @property
    def in_channels(self) -> int:
        """Width of :math:`H`."""
        return self.fusion.in_channels

    @property
    def out_channels(self) -> int:
        """Width of the output."""
        return self.fusion.out_channels

    def reset_parameters(self):
        self.mixer.reset_parameters()
        self.fusion.reset_parameters()

    def train(self, mode: bool = True) -> "GlomoTransfer":
        super().train(mode)
        self.predictor.eval()  # frozen: never dropout or BatchNorm updates
        return self

    @torch.no_grad()
    def graphs(self, x: Optional[Tensor] = None, batch: Optional[Tensor] = None,
               num_nodes: Optional[int] = None) -> Optional[DirectionalGraphs]:
        """The graphs :meth:`forward` uses (``None`` for ``graph='none'``), to compute
        once for several transfer modules. ``'uniform'`` and ``'adjacent'`` need only
        ``batch`` and ``num_nodes`` (or ``x``)."""
        _check_graph(self.graph)  # (graph can be switched after init)
        if self.graph == "none":
            return None
        if x is None and (self.graph == "learned" or num_nodes is None):
            raise ValueError(f"graph='{self.graph}' needs the number of units and, for "
                             f"'learned', the predictor's input: pass x (the units' token ids "
                             f"or features) with batch" +
                             ("" if self.graph == "learned" else ", or num_nodes"))
        if self.graph == "learned":
            self.predictor.eval()
            graphs = self.predictor(x, batch)
            self._check_length(graphs)
            return self._windowed(graphs)
        num_nodes = cast(Tensor, x).size(0) if num_nodes is None else num_nodes
        device = batch.device if batch is not None else (x.device if x is not None else
                                                         self.fusion.gate.weight.device)
        ptr = sequence_batch(num_nodes, batch, device).ptr
        p = self.predictor
        build = LatentGraphs.uniform if self.graph == "uniform" else LatentGraphs.adjacent
        return self._windowed(DirectionalGraphs(*(  # (adjacent pixels: long row-start edges)
            build(ptr, num_layers=p.num_layers, num_heads=p.heads, direction=d,
                  include_self=p.include_self, order=p.predictor(d).order)
            if d in p.directions else None for d in ("forward", "backward"))))

    def _check_length(self, graphs: DirectionalGraphs) -> None:
        """Warn once when a learned distance term reads beyond its pretraining lengths
        (:meth:`PretrainedGraphPredictor.extrapolation_warning`)."""
        if self._warned_length:
            return
        message = self.predictor.extrapolation_warning(graphs.extent, self.max_distance)
        if message is not None:
            self._warned_length = True
            warnings.warn(message, RuntimeWarning, stacklevel=caller_stacklevel())

    def _windowed(self, graphs: DirectionalGraphs) -> DirectionalGraphs:
        return graphs.within(self.max_distance)

    @torch.no_grad()
    def propagations(self, h: Tensor, x: Optional[Tensor] = None,
                     batch: Optional[Tensor] = None,
                     graphs: Optional[DirectionalGraphs] = None) -> Optional[Tensor]:
        """Every mixture component's propagation of ``h``, ``[D, K, N, d]``
        (:meth:`GraphMixer.propagations`; ``None`` for ``graph='none'``): for fixed
        inputs ``h``, compute once and pass to :meth:`forward` as ``propagated``."""
        check_features(h, self.in_channels, name="h")
        if self.graph == "none":
            return None
        return self.mixer.propagations(h, self._graphs_for(h, x, batch, graphs))

    def _graphs_for(self, h: Tensor, x: Optional[Tensor], batch: Optional[Tensor],
                    graphs: Optional[DirectionalGraphs]) -> DirectionalGraphs:
        """``graphs`` computed from ``x``, or given: then no ``x`` and only their own ``batch``."""
        if graphs is None:
            # (not graph='none': the callers handle it)
            return cast(DirectionalGraphs, self.graphs(x, batch, num_nodes=h.size(0)))
        if not isinstance(graphs, tuple) or len(graphs) != 2:  # DirectionalGraphs or a pair
            raise TypeError(f"graphs must be DirectionalGraphs (forward, backward), got "
                            f"{type(graphs).__name__}")
        own = next((g.batch for g in graphs if isinstance(g, LatentGraphs)), None)
        differs = batch is not None and own is not None and batch is not own and (
            not isinstance(batch, Tensor) or batch.shape != own.shape or
            not torch.equal(batch.to(own.device), own))
        if x is not None or differs:
            raise ValueError("pass either x (graphs are computed from it) or graphs (used as "
                             "given), not both, and with graphs only their own batch"
                             + ("; this batch differs from theirs" if differs else ""))
        return graphs

    def forward(self, h: Tensor, x: Optional[Tensor] = None, batch: Optional[Tensor] = None,
                graphs: Optional[DirectionalGraphs] = None,
                propagated: Optional[Tensor] = None) -> Tensor:
        """``graphs``, when given, are used as they are; otherwise they are computed from
        ``x`` and ``batch``. ``propagated``: the precomputed :meth:`propagations` of
        ``h``. ``h`` must have the parameters' dtype unless autocast converts it."""
        check_features(h, self.in_channels, name="h")
        check_dtype(h, self.fusion.transform.weight.dtype, name="h",
                    owner="GlomoTransfer's parameters")
        if self.graph == "none":
            mixed: List[Tensor] = [h] * len(self.mixer.directions)
        elif propagated is not None:
            if not isinstance(propagated, Tensor) or propagated.dim() != 4 or \
                    propagated.size(2) != h.size(0) or graphs is not None:
                raise ValueError(f"pass either propagated or graphs, not both; propagated must "
                                 f"be [D, K, N, C] with N = {h.size(0)} (the units of h), got "
                                 f"{tuple(getattr(propagated, 'shape', ())) or type(propagated)}")
            mixed = self.mixer.combine(propagated, h)
        else:
            mixed = self.mixer.mix(h, self._graphs_for(h, x, batch, graphs))
        return self.fusion.fuse(h, mixed)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, out_channels={self.out_channels}, "
                f"graph='{self.graph}', directions={self.mixer.directions}, "
                f"layers={list(self.mixer.layers)}, heads={self.mixer.heads}, "
                f"mixing='{self.mixer.mixing}', propagation='{self.mixer.propagation}'"
                + (f", max_distance={self.max_distance}" if self.max_distance is not None else "")
                + ")")
