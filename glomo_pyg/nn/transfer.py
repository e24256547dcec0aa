"""GlomoTransfer: the module a user drops into a downstream model (paper Sec. 2.2-2.3)."""
from __future__ import annotations

import sys
import warnings
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from glomo_pyg.graphs import DirectionalGraphs, LatentGraphs, check_max_distance
from glomo_pyg.nn.fusion import GatedFusion
from glomo_pyg.nn.mixer import GraphMixer
from glomo_pyg.nn.pretrained import PretrainedGraphPredictor
from glomo_pyg.ordering import RasterOrder
from glomo_pyg.sequences import check_dtype, check_features, sequence_batch

GRAPHS = ("learned", "uniform", "adjacent", "none")
# frames of these packages are skipped when a warning names its caller
_INTERNAL = tuple(m.__file__[:-len("__init__.py")]  # the package folders, separator included
                  for m in (sys.modules["glomo_pyg"], torch))


def _check_graph(graph: str) -> None:
    if graph not in GRAPHS:
        raise ValueError(f"graph must be one of {GRAPHS}, got {graph!r}")


def _caller_stacklevel() -> int:
    """``stacklevel`` for a warning raised here that points at the first frame outside
    glomo_pyg and torch (modules, ``no_grad`` wrappers and calls in between vary)."""
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

    where :math:`M_{dir} H` is a :class:`GraphMixer` mixture of the
    direction's graphs :math:`G` and hierarchical products :math:`\Lambda`, and
    the fusion is :class:`GatedFusion`.

    The predictor is frozen (no gradients, always in eval mode); only the mixture
    weights, :math:`\gamma` and the gate are trained. ``graph`` switches the graphs
    without changing the parameters, for the baselines:

    * ``'learned'``: the predictor's graphs for the raw units ``x``;
    * ``'uniform'``: equal weights over the same allowed sources
      (:meth:`LatentGraphs.uniform`); the predictor is not run;
    * ``'adjacent'``: weight 1 on each unit's neighbour (:meth:`LatentGraphs.adjacent`;
      not in the paper): the control for graphs that learned little beyond locality;
    * ``'none'``: :math:`M = I` (each :math:`M_{dir} H = H`), the feature-only
      baseline with the same gate; no graph is computed.

    Args:
        predictor (PretrainedGraphPredictor): frozen graph predictor.
        in_channels (int): width :math:`d` of :math:`H` (any width; unrelated to
            the predictor's).
        fusion_channels (int, optional): width of the gated part
            (default: ``in_channels``); the output has
            ``in_channels + fusion_channels`` channels.
        graph (str): ``'learned'``, ``'uniform'``, ``'adjacent'`` or ``'none'``.
        mixing, propagation, layers: options of :class:`GraphMixer`.
        max_distance (int, optional): drop the edges of the graphs this module computes
            that span more than this many units (:meth:`LatentGraphs.within`); graphs
            passed to :meth:`forward` are used as given. For a predictor with a learned
            distance term applied beyond its pretraining window, give the window minus 1
            (a ``RuntimeWarning`` says so once). Default: no limit, as in the paper.

    Shapes:
        - **input:** features :math:`H` :math:`(N, d)`; the predictor's input
          for the same units ``x`` (:math:`(N)` token ids or :math:`(N, F)`) and
          sorted ``batch`` :math:`(N)`; or precomputed ``graphs``
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
            raise TypeError("predictor must be a PretrainedGraphPredictor (from "
                            "PretrainedGraphPredictor.from_pretrained(...) or Glomo.to_pretrained(...)), "
                            f"got {type(predictor).__name__}")
        _check_graph(graph)
        max_distance = check_max_distance(max_distance, optional=True)
        self.graph, self.max_distance = graph, max_distance
        self._warned_length = False
        self.predictor = predictor.requires_grad_(False).eval()
        self.mixer = GraphMixer(in_channels, predictor.num_layers, predictor.heads,
                                predictor.directions, mixing, propagation, layers)
        self.fusion = GatedFusion(in_channels, len(predictor.directions), fusion_channels)

    @property
    def in_channels(self) -> int:
        return self.fusion.in_channels

    @property
    def out_channels(self) -> int:
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
        """The graphs :meth:`forward` uses under the current ``graph`` setting, for
        computing them once and passing them to several transfer modules (e.g.
        at the embeddings and after the first RNN layer). ``None`` for
        ``graph='none'``. ``'uniform'`` and ``'adjacent'`` need only ``batch`` and
        ``num_nodes`` (or ``x``). With ``max_distance`` set, longer edges are already
        removed."""
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
        num_nodes = x.size(0) if num_nodes is None else num_nodes
        device = batch.device if batch is not None else (x.device if x is not None else
                                                         self.fusion.gate.weight.device)
        ptr = sequence_batch(num_nodes, batch, device).ptr
        p = self.predictor
        build = LatentGraphs.uniform if self.graph == "uniform" else LatentGraphs.adjacent
        graphs = DirectionalGraphs(*(
            build(ptr, num_layers=p.num_layers, num_heads=p.heads, direction=d,
                  include_self=p.include_self, order=p.predictor(d).order)
            if d in p.directions else None for d in ("forward", "backward")))
        return self._windowed(graphs)  # (adjacent pixel graphs: the row-start edge is long)

    def _check_length(self, graphs: DirectionalGraphs) -> None:
        """Warn once when graphs scored with a learned distance term cover sequences
        longer (images larger) than the predictor was pretrained on and nothing cuts
        them."""
        if self._warned_length:
            return
        p = self.predictor
        order = next(g.order for g in graphs if g is not None)
        docs = "docs/training.md, 'Position information in the scores'"
        if isinstance(order, RasterOrder):
            docs = "docs/images.md, 'Crops and the window'"
            if p.trained_size is None:
                return
            window = min(p.trained_size) - 1  # the offsets the term saw along both axes
            seen = f"{p.trained_size[0]}x{p.trained_size[1]} images"
            size = (order.height, order.width)
            larger = size[0] > p.trained_size[0] or size[1] > p.trained_size[1]
            now = f"{size[0]}x{size[1]} images"
            far = f"row or column offsets of {window + 1} or more"
        else:
            if p.trained_length is None:
                return
            window = p.trained_length - 1
            seen = f"sequences of at most {p.trained_length}"
            longest = max(g.sequences.max_len for g in graphs if g is not None)  # (host ints)
            larger, now = longest > p.trained_length, f"sequences of up to {longest} units"
            far = f"sources {window + 1} or more units away"
        if (self.max_distance is not None and self.max_distance <= window) or not larger \
                or not p.learned_distance:
            return
        self._warned_length = True
        warnings.warn(f"GlomoTransfer: {now}, but the predictor's learned distance term was "
                      f"pretrained on {seen}: its scores for {far} are extrapolations. Pass "
                      f"max_distance={window} to keep only the distances it learned "
                      f"({docs}).",
                      RuntimeWarning, stacklevel=_caller_stacklevel())

    def _windowed(self, graphs: DirectionalGraphs) -> DirectionalGraphs:
        if self.max_distance is None:
            return graphs
        return DirectionalGraphs(*(None if g is None else g.within(self.max_distance)
                                   for g in graphs))

    @torch.no_grad()
    def propagations(self, h: Tensor, x: Optional[Tensor] = None,
                     batch: Optional[Tensor] = None,
                     graphs: Optional[DirectionalGraphs] = None) -> Optional[Tensor]:
        """Every mixture component's propagation of ``h``, ``[D, K, N, d]``
        (:meth:`GraphMixer.propagations`; ``None`` for ``graph='none'``). For inputs
        ``h`` that are fixed data (e.g. normalised pixels), compute them once per
        input and pass them to :meth:`forward` as ``propagated``: the same output,
        without recomputing graphs and propagation every epoch."""
        check_features(h, self.in_channels, name="h")
        if self.graph == "none":
            return None
        if graphs is None:
            graphs = self.graphs(x, batch, num_nodes=h.size(0))
        else:
            self._check_given_graphs(graphs, x, batch)
        return self.mixer.propagations(h, graphs)

    @staticmethod
    def _check_given_graphs(graphs: DirectionalGraphs, x: Optional[Tensor],
                            batch: Optional[Tensor]) -> None:
        """Graphs passed in are used as they are: ``x`` would be ignored, and a ``batch``
        given beside them must be theirs (graphs of another batch with the same number
        of units would mix features across the wrong sequences without any error)."""
        if not isinstance(graphs, tuple) or len(graphs) != 2:  # DirectionalGraphs or a pair
            raise TypeError(f"graphs must be DirectionalGraphs (forward, backward), got "
                            f"{type(graphs).__name__}")
        if x is not None:
            raise ValueError("pass either x (graphs are computed from it) or graphs (used as "
                             "given), not both")
        present = [g for g in graphs if isinstance(g, LatentGraphs)]  # (others: the mixer)
        if batch is not None and present:
            own = present[0].batch
            if batch is not own and (not isinstance(batch, Tensor) or
                                     batch.shape != own.shape or
                                     not torch.equal(batch.to(own.device), own)):
                raise ValueError("batch differs from the batch the given graphs were computed "
                                 "for")

    def forward(self, h: Tensor, x: Optional[Tensor] = None, batch: Optional[Tensor] = None,
                graphs: Optional[DirectionalGraphs] = None,
                propagated: Optional[Tensor] = None) -> Tensor:
        """``graphs``, when given, are used as they are (e.g. from :meth:`graphs`);
        otherwise they are computed from ``x`` and ``batch``. ``propagated``: the
        precomputed :meth:`propagations` of this ``h`` (then no graph is used). ``h`` must
        be of the parameters' dtype unless autocast converts it; its values are not read
        (no device sync)."""
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
            if graphs is None:
                graphs = self.graphs(x, batch, num_nodes=h.size(0))
            else:
                self._check_given_graphs(graphs, x, batch)
            mixed = self.mixer.mix(h, graphs)
        return self.fusion.fuse(h, mixed)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, out_channels={self.out_channels}, "
                f"graph='{self.graph}', directions={self.mixer.directions}, "
                f"layers={list(self.mixer.layers)}, heads={self.mixer.heads}, "
                f"mixing='{self.mixer.mixing}', propagation='{self.mixer.propagation}'"
                + (f", max_distance={self.max_distance}" if self.max_distance is not None else "")
                + ")")
