"""The graph-emitter protocol: what every producer of latent graphs provides."""
from __future__ import annotations

from abc import ABCMeta, abstractmethod
from operator import attrgetter
from typing import ClassVar, Dict, List, Optional, Tuple, Type, TypeVar, Union, cast

from torch import Tensor

from glomo_pyg.graphs import LatentGraphs
from glomo_pyg.nn.config import ConfigurableModule
from glomo_pyg.nn.encoder import UnitEncoder
from glomo_pyg.nn.resets import reset_children
from glomo_pyg.nn.scorer import GraphScorer
from glomo_pyg.nn.settings import ModelSettings, check_model_setting
from glomo_pyg.ordering import SequenceOrder, UnitOrder
from glomo_pyg.sequences import SequenceBatch, sequence_batch

# Every emitter class by name: the only classes a saved predictor's config may name.
EMITTERS: Dict[str, Type["GraphEmitter"]] = {}

EmitResult = Union[LatentGraphs, Tuple[LatentGraphs, List[Tensor]]]
_E = TypeVar("_E", bound="GraphEmitter")


class GraphEmitter(ConfigurableModule, metaclass=ABCMeta):
    r"""Base of every module that turns a batch of units into
    :class:`~glomo_pyg.LatentGraphs` (paper Sec. 2.1, the graph predictor :math:`g`).

    ``forward(x, batch)`` validates the input with ``encoder``
    (:class:`~glomo_pyg.nn.UnitEncoder`) and calls :meth:`emit`; subclasses register
    themselves in :data:`EMITTERS`. :attr:`settings` declares the constructor's settings
    (their rules, and which a saved config holds): a subclass with a new setting names a
    :class:`~glomo_pyg.nn.settings.ModelSettings` subclass declaring it, and saving and
    loading follow (docs/settings.md).
    """

    settings: ClassVar[type] = ModelSettings
    layout: str = "sparse"
    direction: str
    num_layers: int
    heads: int
    include_self: bool
    encoder: UnitEncoder

    def __init_subclass__(cls, register: bool = True, **kwargs):
        super().__init_subclass__(**kwargs)
        if register:  # abstract bases (register=False) can never be named by a config
            EMITTERS[cls.__name__] = cls

    @property
    def order(self) -> UnitOrder:
        return SequenceOrder(self.direction, self.include_self)

    num_tokens = property(attrgetter("encoder.num_tokens"), doc="Vocabulary size, or None.")
    in_channels = property(attrgetter("encoder.in_channels"), doc="Feature width, or None.")

    def set_layout(self: _E, layout: str) -> _E:
        """Emit graphs in ``layout`` from now on (not saved with the model)."""
        check_model_setting("layout", layout)
        self.layout = layout
        return self

    def check_input(self, x: Tensor) -> None:
        """Raise ``TypeError`` / ``ValueError`` unless ``x`` is what this emitter reads."""
        self.encoder.check(x)

    @abstractmethod
    def emit(self, x: Tensor, sequences: SequenceBatch, layout: Optional[str] = None,
             return_column_max: bool = False) -> EmitResult:
        """Graphs of a validated batch; with ``return_column_max`` also each layer's
        ``[B, H, T]`` largest score per target (for a keep-alive penalty)."""

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                layout: Optional[str] = None) -> LatentGraphs:
        self.check_input(x)
        return cast(LatentGraphs,
                    self.emit(x, sequence_batch(x.size(0), batch, x.device), layout))


class ScoredEmitter(GraphEmitter, register=False):
    """Base of emitters that score key and query states (:meth:`states`) with a
    :class:`~glomo_pyg.nn.GraphScorer` held as ``self.scorer`` (paper Eq. 1)."""

    scorer: GraphScorer

    num_layers = property(attrgetter("scorer.num_layers"), doc="Graph layers.")
    heads = property(attrgetter("scorer.heads"), doc="Graphs per layer.")
    include_self = property(attrgetter("scorer.include_self"), doc="Whether i = j edges exist.")

    def reset_parameters(self):
        reset_children(self)

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
