"""The graph-emitter protocol: what every producer of latent graphs provides."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple, Type, Union

from torch import Tensor

from glomo_pyg.graphs import LatentGraphs
from glomo_pyg.nn.config import ConfigurableModule
from glomo_pyg.nn.layout import LAYOUTS
from glomo_pyg.ordering import SequenceOrder, UnitOrder
from glomo_pyg.sequences import SequenceBatch, sequence_batch

# Every emitter class by name: the only classes a saved predictor's config may name
# (glomo_pyg.io rebuilds them from plain keyword arguments, never by unpickling).
EMITTERS: Dict[str, Type["GraphEmitter"]] = {}

EmitResult = Union[LatentGraphs, Tuple[LatentGraphs, List[Tensor]]]


class GraphEmitter(ConfigurableModule):
    r"""Base of every module that turns a batch of units into
    :class:`~glomo_pyg.LatentGraphs` (paper Sec. 2.1, the graph predictor :math:`g`).

    An emitter has

    * attributes ``direction`` (``'forward'``/``'backward'``), ``num_layers``,
      ``heads`` and ``include_self``, and an ``encoder``
      (:class:`~glomo_pyg.nn.UnitEncoder`) that says what it reads (``num_tokens``
      token ids or ``in_channels`` features) and validates it;
    * :attr:`order`, the allowed-sources rule of its graphs;
    * :meth:`emit` ``(x, sequences) -> LatentGraphs`` on an already validated batch,
      and ``forward(x, batch)``, which validates at the door and then emits;
    * :meth:`config` / :meth:`from_config` (constructor arguments as JSON data),
      from which :mod:`glomo_pyg.io` saves and rebuilds it.

    The graph layout (``'sparse'``, ``'dense'`` or ``'auto'``, see
    :class:`~glomo_pyg.LatentGraphs`) is a run-time choice (:meth:`set_layout`, or
    ``layout=`` per call), not part of the model: every layout gives the same graphs.
    Subclasses register themselves in :data:`EMITTERS` by class name.
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
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.layout = layout
        return self

    def check_input(self, x: Tensor) -> None:
        """Raise ``TypeError`` / ``ValueError`` unless ``x`` is what this emitter reads."""
        self.encoder.check(x)

    def emit(self, x: Tensor, sequences: SequenceBatch, layout: Optional[str] = None,
             return_column_max: bool = False) -> EmitResult:
        """Graphs of an already validated batch; with ``return_column_max`` also each
        layer's ``[B, H, T]`` largest score per target (for a keep-alive penalty)."""
        raise NotImplementedError

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

    def states(self, x: Tensor, sequences: SequenceBatch) -> Tuple[Tensor, Tensor]:
        """Padded ``[B, T, C]`` key and query states of an already validated batch."""
        raise NotImplementedError

    def emit(self, x: Tensor, sequences: SequenceBatch, layout: Optional[str] = None,
             return_column_max: bool = False) -> EmitResult:
        keys, queries = self.states(x, sequences)
        graphs = self.scorer.emit(keys, queries, sequences, layout or self.layout
                                  ).with_order(self.order)
        if not return_column_max:
            return graphs
        return graphs, [self.scorer.column_max(l, keys, queries, sequences)
                        for l in range(self.num_layers)]
