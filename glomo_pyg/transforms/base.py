"""What every graph transform shares: ``Data`` in, the same ``Data`` with relational edges
out (or its ``HeteroData`` form), for one sample, a list of samples (emitted together) or a
PyG ``Batch``."""
from __future__ import annotations

import copy
from abc import abstractmethod
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.data import Batch, Data, HeteroData
from torch_geometric.transforms import BaseTransform

from glomo_pyg.digests import digest
from glomo_pyg.transforms.edge_options import (
    NODE_TYPE,
    SampleEdges,
    apply_edge_options,
    check_edge_options,
    coalesced,
    edge_type_names,
    relation_columns,
)

Samples = Union[Data, Batch, HeteroData, Sequence[Union[Data, HeteroData]]]
EDGE_KEYS = ("edge_index", "edge_weight", "edge_type")
#: The most edges one sample may get (counted before they are made: the transform's
#: edges, doubled by ``symmetric``, plus ``self_loops``' loops). Making a sample's edges
#: holds about 90 bytes per edge at its peak (~180 with ``self_loops`` or
#: ``relation_columns``: UniformGraphs on 1,000 units, measured), so this keeps one sample
#: under ~400 MiB; raise it (``glomo_pyg.transforms.base.MAX_SAMPLE_EDGES = ...``) where
#: the memory is there.
MAX_SAMPLE_EDGES = 1 << 21
SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr,
                  torch.sparse_bsc)


def plain_number(value: Any) -> Any:
    """A numpy scalar or 0-dim torch tensor as the Python number it holds (a ``np.int64``
    top_k, a ``torch.tensor(4)``), anything else as it is: options are stored, digested
    (JSON) and shown as plain numbers, and the checks that follow refuse what is not one
    (a bool stays a bool, refused where a number is due)."""
    if getattr(value, "shape", None) != () or not hasattr(value, "item"):
        return value
    try:
        return value.item()
    except (RuntimeError, TypeError, ValueError):  # (a meta tensor: no value to read)
        return value


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


def check_readable(x: Tensor, name: str) -> None:
    """Refuse, naming ``name``, a tensor whose values the transforms cannot read: a sparse
    or other non-strided layout, a nested tensor, or one on the meta device (a shape
    without values), before torch fails somewhere inside with its own words."""
    if x.layout in SPARSE_LAYOUTS:
        raise ValueError(f"{name} is a sparse tensor (layout {x.layout}); the graph transforms "
                         f"read one dense row per unit: pass {name.split()[-1]}.to_dense()")
    if x.layout != torch.strided or x.is_nested:
        raise ValueError(f"{name} is a {'nested' if x.is_nested else str(x.layout)} tensor; the "
                         f"graph transforms read one dense (strided) tensor with one row per "
                         f"unit: one Data per sample")
    if x.device.type == "meta":
        raise ValueError(f"{name} is on the meta device (a shape without values); the graph "
                         f"transforms read its values: pass a tensor on the CPU or a GPU")


def old_edge_keys(data: Data) -> List[str]:
    """The keys of ``data``'s edge-level attributes besides :data:`EDGE_KEYS` (which the
    transforms replace): those PyG's naming makes edge-level (``edge_<name>``:
    ``edge_attr``, ``edge_label``; and ``num_edges``) and, where ``data`` has edges, those
    PyG counts as one entry per edge (``is_edge_attr``), but a list that also has one entry
    per unit. Other names holding ``edge`` (``knowledge``, ``pos_edge_label_index``: link
    labels of other edges) are kept."""
    probe = copy.copy(data)  # (is_edge_attr caches on the store: not on what is emitted)
    # with a single old edge a [1] tensor may as well be graph-level (a label ``y``): kept
    has_edges = probe.num_edges > 1
    n = data.x.size(0)
    return [key for key, value in data.items() if key not in EDGE_KEYS and key != "x" and (
        key.startswith("edge_") or key == "num_edges" or has_edges and
        probe.is_edge_attr(key) and not (
            isinstance(value, (list, tuple)) and len(value) == n))]


class UnitGraphs(BaseTransform):
    r"""Base of the graph transforms: each sample's units (tokens, pixels: the rows of
    ``data.x``) get relational edges ``edge_index`` (``[2, E]``, row 0 the source),
    ``edge_weight`` (``[E]``, float32) and ``edge_type`` (``[E]``, an index into
    :attr:`relations`), sorted by (relation, target, source).

    Call it on one ``Data``, on a list of them (graphs are made for many samples at
    once: use it so in an ``InMemoryDataset``'s ``process``) or on a ``Batch``. As every
    PyG transform, ``__call__`` copies its input and :meth:`forward` edits the copy: inputs
    are not modified; edge attributes already present are replaced; other edge-level
    attributes of the old edges are dropped (``edge_attr`` and every ``edge_<name>``,
    ``num_edges``, and what PyG's ``is_edge_attr`` counts as one entry per old edge): they would no
    longer line up with the edges. A sample whose edges could exceed
    :data:`MAX_SAMPLE_EDGES` is refused before any is made.

    The edge options (:mod:`glomo_pyg.transforms.edge_options`) come after the
    subclass's pruning, in this order: ``renormalize``, ``self_loops``, ``symmetric``.
    Then the output form: ``as_edge_index=True`` makes ``edge_index`` an
    ``torch_geometric.EdgeIndex`` (``sparse_size`` the units; ``sort_order="col"`` when
    the edges are sorted by target: with one relation, or with ``relation_columns``;
    ``is_undirected`` with ``symmetric``). ``relation_columns=True`` gives one edge per
    pair of units with any edge and ``edge_weight`` :math:`(E, R)`, one column per
    relation (0 where that relation has no edge between the two), sorted by (target,
    source), and no ``edge_type``: multi-dimensional edge features, as ``GATConv`` /
    ``TransformerConv`` (``edge_dim=R``) read them. ``hetero=True`` gives
    :meth:`to_hetero`'s ``HeteroData`` instead (one edge type per relation).

    PyG's homogeneous ``T.AddSelfLoops`` and ``T.ToUndirected`` do not know
    ``edge_type``: the first appends loops to ``edge_index`` and its ``attr`` only (leaving
    ``edge_type`` shorter), the second merges edges of different relations between the
    same units. Use ``self_loops`` / ``symmetric``, the ``relation_columns`` form (where
    ``T.AddSelfLoops(attr="edge_weight")`` gives each relation its loop and
    ``T.ToUndirected`` adds reverse edges column by column) or the ``HeteroData`` form, on
    which both act per relation (docs/any_gnn.md).
    """

    #: Samples per predictor call (subclasses that batch).
    batch_size: int = 1

    def __init__(self, *, renormalize: bool = False, self_loops: bool = False,
                 symmetric: bool = False, as_edge_index: bool = False, hetero: bool = False,
                 relation_columns: bool = False):
        self.edge_options = check_edge_options(renormalize=renormalize, self_loops=self_loops,
                                               symmetric=symmetric)
        forms = check_edge_options(as_edge_index=as_edge_index, hetero=hetero,
                                   relation_columns=relation_columns)
        if hetero and relation_columns:
            raise ValueError("hetero=True and relation_columns=True are two output forms: "
                             "choose one")
        self.as_edge_index, self.hetero = forms["as_edge_index"], forms["hetero"]
        self.relation_columns = relation_columns

    @property
    @abstractmethod
    def relations(self) -> List[str]:
        """The name of each ``edge_type`` value."""

    @property
    def num_relations(self) -> int:
        return len(self.relations)

    @property
    def edge_types(self) -> List[Tuple[str, str, str]]:
        """The ``HeteroData`` form's edge types, one per relation in :attr:`relations`
        order: ``("unit", name, "unit")``, the name with each character other than letters,
        digits and ``_`` replaced by ``_`` (``torch_geometric.nn.to_hetero`` keys)."""
        return [(NODE_TYPE, name, NODE_TYPE) for name in edge_type_names(self.relations)]

    @property
    def cache_key(self) -> str:
        """A digest of everything the edges depend on besides the samples (for a
        dataset's cache: a different predictor or option gives a different key)."""
        return digest(self.key_parts())[:32]

    @abstractmethod
    def key_parts(self) -> Dict[str, Any]:
        """What :attr:`cache_key` digests (JSON-serialisable)."""

    def edge_key_parts(self) -> Dict[str, Any]:
        """The edge options and output form for :meth:`key_parts`: those not at their
        default (so that the defaults' keys are those of the transforms before them)."""
        return {k: v for k, v in UnitGraphs.options(self).items() if v}

    def options(self) -> Dict[str, Any]:
        """Every option, as the constructor takes it (what :func:`repr` shows)."""
        return dict(self.edge_options, as_edge_index=self.as_edge_index, hetero=self.hetero,
                    relation_columns=self.relation_columns)

    def check_sample(self, data: Data, index: int) -> None:
        """Raise a named error if ``data`` (sample ``index``) is not what this reads."""
        if not isinstance(data, Data):
            raise TypeError(f"sample {index}: expected a torch_geometric Data, got "
                            f"{type(data).__name__}")
        if isinstance(getattr(data, "x", None), Tensor):
            check_readable(data.x, f"sample {index}: data.x")
        if not isinstance(getattr(data, "x", None), Tensor) or data.x.dim() not in (1, 2) \
                or data.x.size(0) < 1:
            raise ValueError(f"sample {index}: data.x must hold one row per unit (token or "
                             f"pixel), at least one, got "
                             f"{tuple(getattr(data.x, 'shape', ())) or type(data.x).__name__}")

    def check_edge_count(self, index: int, num_units: int, edges: int, why: str,
                         hint: str = "") -> None:
        """Refuse sample ``index`` (``num_units`` units) before any edge is made when
        ``edges`` (the transform's own, at most: ``why`` says which), doubled by
        ``symmetric``, plus the loops of ``self_loops``, exceed :data:`MAX_SAMPLE_EDGES`
        (read at each call: raising it takes effect at once); ``hint``: another remedy."""
        total, options = edges, ""
        if self.edge_options["symmetric"]:  # (a loop is its own reverse: not doubled)
            total *= 2
            options += ", doubled by symmetric"
        if self.edge_options["self_loops"]:
            total += num_units * self.num_relations
            options += ", plus self_loops' loops"
        if total > MAX_SAMPLE_EDGES:
            raise ValueError(
                f"sample {index}: {num_units:,} units would get up to {total:,} edges ({why}"
                f"{options}), more than glomo_pyg.transforms.base.MAX_SAMPLE_EDGES = "
                f"{MAX_SAMPLE_EDGES:,} per sample (making them holds ~90 to 180 bytes per "
                f"edge); use fewer units per sample{hint}, or raise MAX_SAMPLE_EDGES where "
                f"the memory is there")

    @abstractmethod
    def sample_edges(self, samples: List[Data]) -> List[SampleEdges]:
        """Each (checked) sample's local edges."""

    def forward(self, data: Samples) -> Samples:
        if isinstance(data, Batch):
            return Batch.from_data_list(self._apply(data.to_data_list()))
        if isinstance(data, Data):
            return self._apply([data])[0]
        if isinstance(data, (list, tuple)):
            return self._apply(list(data))
        raise TypeError(f"{type(self).__name__} takes a Data, a Batch or a list of Data, got "
                        f"{type(data).__name__}")

    def _apply(self, samples: List[Data]) -> List[Union[Data, HeteroData]]:
        for i, data in enumerate(samples):
            self.check_sample(data, i)
        out: List[Union[Data, HeteroData]] = []
        for start in range(0, len(samples), self.batch_size):
            chunk = samples[start:start + self.batch_size]
            for data, edges in zip(chunk, self.sample_edges(chunk)):
                n = data.x.size(0)
                edges = apply_edge_options(edges, n, self.num_relations, **self.edge_options)
                out.append(self._hetero(data, edges) if self.hetero else
                           self._with_edges(data, edges))
        return out

    def _with_edges(self, data: Data, edges: SampleEdges) -> Data:
        data = copy.copy(data)  # (the caller's samples stay as they were)
        for key in old_edge_keys(data):  # (one entry per old edge: misaligned with the new)
            del data[key]
        n = data.x.size(0)
        if self.relation_columns:
            edge_index, table = relation_columns(edges, n, self.num_relations)
            data.edge_index = self._edge_index(edge_index, n, sorted_by_target=True)
            data.edge_weight = table
            if "edge_type" in data:
                del data.edge_type
            return data
        edge_index, weight, relation = edges
        data.edge_index = self._edge_index(edge_index, n, sorted_by_target=self.num_relations == 1)
        data.edge_weight, data.edge_type = weight, relation
        return data

    def _edge_index(self, edge_index: Tensor, n: int, sorted_by_target: bool) -> Tensor:
        if not self.as_edge_index:
            return edge_index
        return EdgeIndex(edge_index, sparse_size=(n, n),
                         sort_order="col" if sorted_by_target else None,
                         is_undirected=self.edge_options["symmetric"])

    def _hetero(self, data: Data, edges: SampleEdges) -> HeteroData:
        """``data`` with ``edges`` as a ``HeteroData``: node-level attributes (``x``,
        ``pos``, ...) on node type ``"unit"``, the others graph-level, each relation's
        edges (sorted by target, source) with their ``edge_weight`` under its edge type;
        the other edge-level attributes of ``data`` are dropped (:func:`old_edge_keys`)."""
        out = HeteroData()
        n = data.x.size(0)
        dropped = set(EDGE_KEYS).union(old_edge_keys(data))
        for key, value in data.items():
            if key in dropped:
                continue
            if data.is_node_attr(key):
                out[NODE_TYPE][key] = value
            else:
                out[key] = value
        out[NODE_TYPE].num_nodes = n
        edge_index, weight, relation = edges
        for r, edge_type in enumerate(self.edge_types):
            keep = relation == r
            store = out[edge_type]
            store.edge_index = self._edge_index(edge_index[:, keep], n, sorted_by_target=True)
            store.edge_weight = weight[keep]
        return out

    def to_hetero(self, data: Union[Data, Batch]) -> Union[HeteroData, Batch]:
        """The ``HeteroData`` form of what this transform emitted (``data``, or a ``Batch``
        of them: a ``Batch`` of the forms), as ``hetero=True`` emits it: one edge type per
        relation (:attr:`edge_types`), for ``torch_geometric.nn.to_hetero`` or
        ``HeteroConv``. ``data`` holds ``edge_type`` beside ``edge_index`` and
        ``edge_weight`` [E], or ``edge_weight`` [E, R] (the ``relation_columns`` form: an
        entry of 0 is no edge), also after PyG's transforms edited them."""
        if isinstance(data, Batch):
            return Batch.from_data_list([self.to_hetero(d) for d in data.to_data_list()])
        edges = self._emitted_edges(data)
        return self._hetero(data, coalesced(edges[0][0], edges[0][1], edges[1], edges[2],
                                            data.x.size(0)))

    def _emitted_edges(self, data: Data) -> SampleEdges:
        """``data``'s edges as (edge_index, edge_weight [E], edge_type), refused unless
        aligned."""
        r = self.num_relations
        form = (f"a Data emitted by this {type(self).__name__}: edge_index [2, E] with "
                f"edge_weight [E] and edge_type [E] in [0, {r}), or edge_weight [E, {r}]")
        weight = getattr(data, "edge_weight", None) if isinstance(data, Data) else None
        if not isinstance(weight, Tensor) or not isinstance(data.get("x"), Tensor) or \
                not isinstance(data.get("edge_index"), Tensor):
            raise ValueError(f"to_hetero takes {form}")
        edge_index = data.edge_index
        if isinstance(edge_index, EdgeIndex):
            edge_index = edge_index.as_tensor()
        e = edge_index.size(1)
        if weight.dim() == 2 and "edge_type" not in data:
            if weight.shape != (e, r):
                raise ValueError(f"to_hetero takes {form}; got edge_weight "
                                 f"{tuple(weight.shape)} for {e} edges")
            pair, relation = weight.nonzero(as_tuple=True)
            return edge_index[:, pair], weight[pair, relation], relation
        relation = data.get("edge_type")
        if weight.shape != (e,) or not isinstance(relation, Tensor) or \
                relation.shape != (e,) or (e and not 0 <= int(relation.min()) <=
                                           int(relation.max()) < r):
            shapes = {k: tuple(v.shape) for k, v in data.items()
                      if k in EDGE_KEYS and isinstance(v, Tensor)}
            raise ValueError(f"to_hetero takes {form}; got {shapes} (PyG's homogeneous "
                             f"T.AddSelfLoops / T.ToUndirected do not keep edge_type: use "
                             f"self_loops= / symmetric=, or relation_columns=True)")
        n = data.x.size(0)
        key = (relation * n + edge_index[1]) * n + edge_index[0]
        if e > 1 and not bool((key[1:] > key[:-1]).all()):
            raise ValueError(f"to_hetero takes {form}, its edges in the order it emits them "
                             f"(by relation, target, source, each once): these were reordered "
                             f"or merged since (PyG's homogeneous T.ToUndirected / "
                             f"T.RemoveDuplicatedEdges merge edges of different relations and "
                             f"add their edge_type values); use symmetric= / self_loops=, or "
                             f"relation_columns=True, on which PyG's transforms keep relations "
                             f"apart")
        return edge_index, weight, relation

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({shown}, num_relations={self.num_relations})"
