"""What every graph transform shares: ``Data`` in, the same ``Data`` with relational edges
out, for one sample, a list of samples (emitted together) or a PyG ``Batch``."""
from __future__ import annotations

import copy
from abc import abstractmethod
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from torch import Tensor
from torch_geometric.data import Batch, Data
from torch_geometric.transforms import BaseTransform

from glomo_pyg.digests import digest

Samples = Union[Data, Batch, Sequence[Data]]
#: Per sample: local ``edge_index [2, E]``, ``edge_weight [E]``, ``edge_type [E]``.
SampleEdges = Tuple[Tensor, Tensor, Tensor]


def check_directions(directions: Optional[Sequence[str]],
                     available: Sequence[str]) -> Tuple[str, ...]:
    """``directions`` (``None``: all ``available``) as a tuple in the canonical order."""
    if directions is None:
        return tuple(available)
    if isinstance(directions, str):
        directions = (directions,)
    chosen = list(directions)
    if not chosen or any(d not in available for d in chosen) or len(set(chosen)) != len(chosen):
        raise ValueError(f"directions must be distinct entries of {tuple(available)}, got "
                         f"{directions!r}")
    return tuple(d for d in available if d in chosen)


class UnitGraphs(BaseTransform):
    r"""Base of the graph transforms: each sample's units (tokens, pixels: the rows of
    ``data.x``) get relational edges ``edge_index`` (``[2, E]``, row 0 the source),
    ``edge_weight`` (``[E]``, float32) and ``edge_type`` (``[E]``, an index into
    :attr:`relations`), sorted by (relation, target, source).

    Call it on one ``Data``, on a list of them (graphs are made for many samples at
    once: use it so in an ``InMemoryDataset``'s ``process``) or on a ``Batch``. Inputs
    are not modified; edge attributes already present are replaced.
    """

    #: Samples per predictor call (subclasses that batch).
    batch_size: int = 1

    @property
    @abstractmethod
    def relations(self) -> List[str]:
        """The name of each ``edge_type`` value."""

    @property
    def num_relations(self) -> int:
        return len(self.relations)

    @property
    def cache_key(self) -> str:
        """A digest of everything the edges depend on besides the samples (for a
        dataset's cache: a different predictor or option gives a different key)."""
        return digest(self.key_parts())[:32]

    @abstractmethod
    def key_parts(self) -> Dict[str, Any]:
        """What :attr:`cache_key` digests (JSON-serialisable)."""

    def check_sample(self, data: Data, index: int) -> None:
        """Raise a named error if ``data`` (sample ``index``) is not what this reads."""
        if not isinstance(data, Data):
            raise TypeError(f"sample {index}: expected a torch_geometric Data, got "
                            f"{type(data).__name__}")
        if not isinstance(getattr(data, "x", None), Tensor) or data.x.dim() not in (1, 2) \
                or data.x.size(0) < 1:
            raise ValueError(f"sample {index}: data.x must hold one row per unit (token or "
                             f"pixel), at least one, got "
                             f"{tuple(getattr(data.x, 'shape', ())) or type(data.x).__name__}")

    @abstractmethod
    def sample_edges(self, samples: List[Data]) -> List[SampleEdges]:
        """Each (checked) sample's local edges."""

    def __call__(self, data: Samples) -> Samples:
        if isinstance(data, Batch):
            return Batch.from_data_list(self._apply(data.to_data_list()))
        if isinstance(data, Data):
            return self._apply([data])[0]
        if isinstance(data, (list, tuple)):
            return self._apply(list(data))
        raise TypeError(f"{type(self).__name__} takes a Data, a Batch or a list of Data, got "
                        f"{type(data).__name__}")

    def forward(self, data: Samples) -> Samples:
        return self(data)

    def _apply(self, samples: List[Data]) -> List[Data]:
        for i, data in enumerate(samples):
            self.check_sample(data, i)
        out = []
        for start in range(0, len(samples), self.batch_size):
            chunk = samples[start:start + self.batch_size]
            for data, (edge_index, weight, relation) in zip(chunk, self.sample_edges(chunk)):
                data = copy.copy(data)  # (the caller's samples stay as they were)
                data.edge_index, data.edge_weight, data.edge_type = edge_index, weight, relation
                out.append(data)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.cache_key[:16]}, relations={self.num_relations})"
