"""The graph-emitter protocol: what every producer of latent graphs provides."""
from __future__ import annotations

from abc import ABCMeta, abstractmethod
from typing import Dict, List, Optional, Tuple, Type, Union

from torch import Tensor

from glomo_pyg.graphs import LatentGraphs
from glomo_pyg.nn.config import ConfigurableModule
from glomo_pyg.nn.scorer import check_layout
from glomo_pyg.ordering import SequenceOrder, UnitOrder
from glomo_pyg.sequences import SequenceBatch, sequence_batch

# Every emitter class by name: the only classes a saved predictor's config may name
# (glomo_pyg.io rebuilds them from plain keyword arguments, never by unpickling).
EMITTERS: Dict[str, Type["GraphEmitter"]] = {}

EmitResult = Union[LatentGraphs, Tuple[LatentGraphs, List[Tensor]]]


class GraphEmitter(ConfigurableModule, metaclass=ABCMeta):
    r"""Base of every module that turns a batch of units into
    :class:`~glomo_pyg.LatentGraphs` (paper Sec. 2.1, the graph predictor :math:`g`).

    An emitter has ``direction``, ``num_layers``, ``heads``, ``include_self``, an
    ``encoder`` (:class:`~glomo_pyg.nn.UnitEncoder`: what it reads, checked at the door),
    :attr:`order`, :meth:`emit` on an already validated batch, ``forward(x, batch)``
    (validates, then emits) and :meth:`config` / :meth:`from_config`. The graph layout
    is a run-time choice (:meth:`set_layout`, or ``layout=`` per call): every layout
    gives the same graphs. Subclasses register themselves in :data:`EMITTERS`.
    """

    layout: str = "sparse"
    direction: str
    num_layers: int
    heads: int
    include_self: bool

    def __init_subclass__(cls, register: bool = True, **kwargs):
        super().__init_subclass__(**kwargs)
        if register:  # abstract bases (register=False) can never be named by a config
            EMITTERS[cls.__name__] = cls

    @property
    def order(self) -> UnitOrder:
        return SequenceOrder(self.direction, self.include_self)

    @property
    def num_tokens(self) -> Optional[int]:
        return self.encoder.num_tokens

    @property
    def in_channels(self) -> Optional[int]:
        return self.encoder.in_channels

    def set_layout(self, layout: str) -> "GraphEmitter":
        """Emit graphs in ``layout`` from now on (not saved with the model)."""
        check_layout(layout)
        self.layout = layout
        return self

    def check_input(self, x: Tensor) -> None:
        """Raise ``TypeError`` / ``ValueError`` unless ``x`` is what this emitter reads."""
        self.encoder.check(x)

    @abstractmethod
    def emit(self, x: Tensor, sequences: SequenceBatch, layout: Optional[str] = None,
             return_column_max: bool = False) -> EmitResult:
        """Graphs of an already validated batch; with ``return_column_max`` also each
        layer's ``[B, H, T]`` largest score per target (for a keep-alive penalty)."""

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                layout: Optional[str] = None) -> LatentGraphs:
        self.check_input(x)
        return self.emit(x, sequence_batch(x.size(0), batch, x.device), layout)


class ScoredEmitter(GraphEmitter, register=False):
    """Base of emitters that compute key and query states and score them with a
    :class:`~glomo_pyg.nn.GraphScorer` held as ``self.scorer`` (paper Eq. 1): subclasses
    implement :meth:`states`; layers, heads, ``include_self``, emission in every layout,
    the column maxima of the keep-alive penalty and the graphs' :attr:`order` follow."""

    @property
    def num_layers(self) -> int:
        return self.scorer.num_layers

    @property
    def heads(self) -> int:
        return self.scorer.heads

    @property
    def include_self(self) -> bool:
        return self.scorer.include_self

    def reset_parameters(self):
        for child in self.children():
            if hasattr(child, "reset_parameters"):
                child.reset_parameters()

    @abstractmethod
    def states(self, x: Tensor, sequences: SequenceBatch) -> Tuple[Tensor, Tensor]:
        """Padded ``[B, T, C]`` key and query states of an already validated batch."""

    def emit(self, x: Tensor, sequences: SequenceBatch, layout: Optional[str] = None,
             return_column_max: bool = False) -> EmitResult:
        keys, queries = self.states(x, sequences)
        graphs = self.scorer.emit(keys, queries, sequences, layout or self.layout
                                  ).with_order(self.order)
        if not return_column_max:
            return graphs
        return graphs, [self.scorer.column_max(l, keys, queries, sequences)
                        for l in range(self.num_layers)]
