r"""GLoMo's learned graphs as PyG edges: :class:`GlomoGraphs` runs a frozen graph
predictor over each sample's units and writes its graphs into the sample's ``Data``, so
that any PyG layer (``GATConv``, ``RGCNConv``, ``GCNConv``, ...) reads them."""
from __future__ import annotations

import math
import os
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union, cast

import torch
from torch import Tensor
from torch_geometric.data import Data

from glomo_pyg import flex, kernels
from glomo_pyg.devices import check_device
from glomo_pyg.graph_names import relation_name
from glomo_pyg.graphs import LatentGraphs
from glomo_pyg.graphs.checks import check_max_distance
from glomo_pyg.graphs.pruning import PrunedEdges, check_pruning, prune_rows
from glomo_pyg.graphs.score_blocks import pruned_graph_edges
from glomo_pyg.nn.pretrained import PretrainedGraphPredictor
from glomo_pyg.nn.transfer import caller_stacklevel
from glomo_pyg.sequences import TOKEN_DTYPES
from glomo_pyg.settings import Rule, check_int
from glomo_pyg.transforms.base import SampleEdges, UnitGraphs, check_directions, plain_number
from glomo_pyg.version import __version__

MERGES = ("sum", "mean")
#: ``merge``: ``None`` (a relation per graph) or one of :data:`MERGES`.
MERGE = Rule(str, choices=MERGES, optional=True)
# Padded units per predictor call of the pruned path: its keys and queries (e.g. 2 x 48
# graphs x 49 values per unit for imagenet32-pixel, 19 MiB per 32x32 image) are what its
# memory holds besides the edges; more per call only adds memory traffic
# (benchmarks/results/image_graphs_cpu.md).
EMISSION_UNITS = 1 << 13
#: The most memory emitting one sample may hold besides its edges (which
#: :data:`~glomo_pyg.transforms.base.MAX_SAMPLE_EDGES` bounds), as :func:`emission_unit_bytes`
#: counts it per unit: with the edges' few hundred MiB, one sample stays under 1 GiB. A
#: longer sequence or larger image is refused before anything is allocated; raise it
#: (``glomo_pyg.transforms.glomo_graphs.MAX_EMISSION_BYTES = ...``) where the memory is there.
MAX_EMISSION_BYTES = 1 << 29
# Copies of the keys and queries live at once (the projections, then their rescaled
# copies), and states of the hidden width per direction (unit encoding, CNN or recurrent
# layers, their norms). Measured (peak RSS, one image, top_k=2): an imagenet32-pixel-sized
# predictor (2 x 3 layers x 8 heads, 128 channels; estimate 54 KB per pixel) held 60 to 80
# KB per pixel with its ~90 edges from 48x48 to 96x96 (702 MiB: glibc's heap fragments as
# the image grows; the live peak is ~30 KB), the tiny test predictors less than the estimate.
KQ_COPIES, STATE_COPIES = 2, 16


def emission_unit_bytes(predictor: PretrainedGraphPredictor) -> int:
    """Bytes per unit that emitting a sample holds besides its edges: per direction,
    :data:`KQ_COPIES` of every layer's augmented keys and queries (heads x (head channels,
    the bias, the position features) values each: 2 x 48 graphs x 49 values for
    imagenet32-pixel) and :data:`STATE_COPIES` states of the hidden width, at the
    predictor's float size."""
    values = 0
    for d in predictor.directions:
        scorer = getattr(predictor.predictor(d), "scorer", None)
        if scorer is None:  # (every emitter of this package scores with a GraphScorer)
            continue
        position = 0 if scorer.position_coef is None else 2 * scorer.position_coef.size(-1)
        width = scorer.head_channels + 1 + position
        values += KQ_COPIES * 2 * scorer.num_layers * scorer.heads * width + \
            STATE_COPIES * scorer.key[0].in_features
    return values * next(predictor.parameters()).element_size()


def _index_list(name: str, values: Optional[Sequence[int]], size: int) -> Tuple[int, ...]:
    """Distinct indices in ``[0, size)``, sorted (``None``: all)."""
    if values is None:
        return tuple(range(size))
    if isinstance(values, int) and not isinstance(values, bool):
        values = (values,)
    chosen = list(values) if isinstance(values, (list, tuple, range)) else None
    if not chosen or len(set(chosen)) != len(chosen) or any(
            isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < size for v in chosen):
        raise ValueError(f"{name} must be distinct integers in [0, {size}) (the predictor's "
                         f"{name}), or None for all; got {values!r}")
    return tuple(sorted(chosen))


class GlomoGraphs(UnitGraphs):
    r"""Turn each sample's tokens or pixels into a ``Data`` with GLoMo's graphs as edges.

    A frozen graph predictor (paper Sec. 2.1) emits, per direction :math:`d`, layer
    :math:`l` and head :math:`h`, a weighted graph :math:`G^{d,l,h}` over the sample's
    units (:math:`G_{ij} > 0`: unit :math:`i` is a source of target :math:`j`; each
    target's weights sum to 1). Each selected graph becomes one relation:
    ``edge_index[:, e] = (i, j)``, ``edge_weight[e] = G_ij`` exactly as emitted,
    ``edge_type[e]`` its index in :attr:`relations` (named ``"forward/layer0/head3"``).

    With ``products=True`` relation :math:`l` is the hierarchical product
    :math:`\Lambda^{l} = G^{1} G^{2} \cdots G^{l}` of layers up to :math:`l` (paper
    Sec. 2.2; named ``"forward/layers0-2/head3"``). ``merge`` collapses every direction's
    selected relations into one (``"forward"``, ``"backward"``): an edge's weights summed,
    or averaged over the merged relations (an edge absent from one counts 0 there, so
    each target's weights still sum to at most 1). Pruning follows, per relation:
    weights below ``min_weight`` are dropped, then each target keeps its ``top_k``
    heaviest sources (ties: the lower source). Kept weights are renormalised only with
    ``renormalize``.

    The order of operations: ``max_distance`` window, relations (``products``), ``merge``,
    pruning (``min_weight``, ``top_k``), then the edge options of :class:`UnitGraphs`:
    ``renormalize`` (each target's kept weights per relation sum to 1), ``self_loops``
    (:math:`A + I` per relation), ``symmetric`` (:math:`(A + A^\top) / 2` per relation),
    and the output form (``as_edge_index``, ``hetero``).

    Samples: ``data.x`` holds one sequence's token ids (``[T]`` or ``[T, 1]``, int64 or
    int32) for a text predictor, one image's pixels in raster order (uint8
    ``[H W, C]``, :func:`glomo_pyg.pixels.image_units`; :func:`image_data` builds it) for
    a pixel predictor, or float features ``[T, F]`` for a feature predictor. A list of
    samples is emitted ``batch_size`` at a time, on ``device``; use the transform on the
    whole list inside an ``InMemoryDataset``'s ``process`` (or :class:`GraphsDataset`,
    which caches under :attr:`cache_key`: it holds the predictor's digest). A sample is
    refused before anything is allocated when emitting it would hold more than
    :data:`MAX_EMISSION_BYTES` (keys and queries of its units) or it could get more than
    :data:`~glomo_pyg.transforms.base.MAX_SAMPLE_EDGES` edges (:meth:`kept_edges`).

    Args:
        predictor: a :class:`~glomo_pyg.PretrainedGraphPredictor`, or a released
            predictor's name or a saved predictor's folder. The transform keeps it in
            eval mode on ``device`` (a module is moved there, not copied).
        directions: ``'forward'`` and/or ``'backward'`` (default: all it has).
        layers, heads: graph layers and heads to keep (default: all).
        products: relations are the products :math:`G^1 \cdots G^l` (dense per sample:
            :math:`O(T^2)` memory per head; ``batch_size`` bounds it).
        merge: ``None``, ``'sum'`` or ``'mean'``: one relation per direction.
        top_k: sources kept per target and relation (``>= 1``; ``None``: all).
        min_weight: drop edges lighter than this (``None``: keep all).
        max_distance: cut every graph to this window before anything else
            (:meth:`LatentGraphs.within`: the far pairs masked before normalising).
        image_size: ``(height, width)`` of the images (pixel predictors; default: the
            predictor's own); refused here when emitting one image would hold more than
            :data:`MAX_EMISSION_BYTES`.
        batch_size: samples per predictor call.
        device: where the predictor runs (default: CUDA when available, else the CPU);
            refused unless this machine has it. Edges come back on the samples' device.
        renormalize: after pruning, divide each target's kept weights in each relation
            by their sum.
        self_loops: add a self-loop of weight 1 to every unit in every relation (added
            to the weight of its own edge, for predictors that include it).
        symmetric: make each relation's graph undirected within that relation: an edge
            and its reverse both get their mean weight (an absent direction counts 0).
        as_edge_index: ``edge_index`` as a ``torch_geometric.EdgeIndex``.
        hetero: emit ``HeteroData`` with one edge type per relation
            (:meth:`~UnitGraphs.to_hetero`; node type ``"unit"``).
        relation_columns: one edge per connected pair of units, ``edge_weight`` with one
            column per relation (0: no edge in that relation) and no ``edge_type``, the
            form on which PyG's ``T.AddSelfLoops`` / ``T.ToUndirected`` keep every
            relation apart.

    Raises:
        TypeError: a ``predictor`` that is none, an edge option that is not a bool.
        ValueError: an option its rule refuses (``merge``, ``products``, ``top_k``,
            ``min_weight``, ``max_distance``, ``batch_size``, ``directions``, ``layers``,
            ``heads``, ``image_size``), a ``device`` this machine lacks, or an image too
            large to emit (:data:`MAX_EMISSION_BYTES`).

    Shapes:
        - **input:** ``Data`` with ``x`` :math:`(T)` token ids or :math:`(HW, C)` pixels
          (or a list of them, or a ``Batch``)
        - **output:** the same, plus ``edge_index`` :math:`(2, E)`, ``edge_weight``
          :math:`(E)`, ``edge_type`` :math:`(E)`; with ``relation_columns``,
          ``edge_weight`` :math:`(E, R)` and no ``edge_type``; with ``hetero``, a
          ``HeteroData`` with
          ``data["unit"].x`` and, per relation, ``edge_index`` :math:`(2, E_r)` and
          ``edge_weight`` :math:`(E_r)`

    Example::

        from glomo_pyg.transforms import GlomoGraphs
        graphs = GlomoGraphs("imdb-text-cpu", merge="mean", top_k=8)
        data = graphs(Data(x=token_ids))      # data.edge_index, edge_weight, edge_type
    """

    def __init__(self, predictor: Union[PretrainedGraphPredictor, str, os.PathLike], *,
                 directions: Optional[Sequence[str]] = None,
                 layers: Optional[Sequence[int]] = None, heads: Optional[Sequence[int]] = None,
                 products: bool = False, merge: Optional[str] = None,
                 top_k: Optional[int] = None, min_weight: Optional[float] = None,
                 max_distance: Optional[int] = None,
                 image_size: Optional[Tuple[int, int]] = None, batch_size: int = 64,
                 device: Optional[Union[str, torch.device]] = None,
                 renormalize: bool = False, self_loops: bool = False, symmetric: bool = False,
                 as_edge_index: bool = False, hetero: bool = False,
                 relation_columns: bool = False):
        super().__init__(renormalize=renormalize, self_loops=self_loops, symmetric=symmetric,
                         as_edge_index=as_edge_index, hetero=hetero,
                         relation_columns=relation_columns)
        self._name = os.fspath(predictor) if isinstance(predictor, (str, os.PathLike)) \
            else None  # (for repr)
        if isinstance(predictor, (str, os.PathLike)):
            predictor = PretrainedGraphPredictor.from_pretrained(predictor)
        if not isinstance(predictor, PretrainedGraphPredictor):
            raise TypeError(f"predictor must be a PretrainedGraphPredictor or a released "
                            f"predictor's name, got {type(predictor).__name__}")
        # numpy / torch scalars as Python numbers: they are stored, shown and digested (an
        # int min_weight stays an int: the cache keys of those given so stay the same)
        top_k, min_weight = plain_number(top_k), plain_number(min_weight)
        check_pruning(top_k, min_weight)
        batch_size = check_int("batch_size", plain_number(batch_size), 1)
        max_distance = check_max_distance(plain_number(max_distance), optional=True)
        device = check_device(device)
        MERGE.check("merge", merge, typed=True)
        Rule(bool).check("products", products)
        self.directions = check_directions(directions, predictor.directions)
        self.layers = _index_list("layers", layers, predictor.num_layers)
        self.heads = _index_list("heads", heads, predictor.heads)
        self.products, self.merge = products, merge
        self.top_k, self.min_weight, self.max_distance = top_k, min_weight, max_distance
        self.batch_size = batch_size
        self.modality = predictor.modality
        if self.modality == "pixels":
            predictor = self._sized(predictor, image_size)
        elif image_size is not None:
            raise ValueError(f"image_size is for pixel predictors; this one reads "
                             f"{self.modality}")
        self.device = device
        self.predictor = predictor.to(self.device).eval()
        self._warned_length = False

    def _sized(self, predictor: PretrainedGraphPredictor, image_size) -> PretrainedGraphPredictor:
        own = cast(Tuple[int, int], predictor.image_size)  # (a pixel predictor's)
        size = own if image_size is None else tuple(plain_number(v) for v in image_size) \
            if isinstance(image_size, (tuple, list)) else ()
        if len(size) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                                 for v in size) or size[0] * size[1] < 2:
            raise ValueError(f"image_size must be (height, width), positive integers of at "
                             f"least two pixels in all, got {image_size!r}")
        self._check_emission(predictor, size[0] * size[1],
                             f"image_size={size} is {size[0] * size[1]:,} pixels", "image")
        self.image_size = size
        return predictor if size == own else predictor.resized(*size)

    @staticmethod
    def _check_emission(predictor: PretrainedGraphPredictor, units: int, what: str,
                        sample: str) -> None:
        """Refuse, before anything is allocated, a sample of ``units`` units whose emission
        would hold more than :data:`MAX_EMISSION_BYTES` (read at each call)."""
        per_unit = emission_unit_bytes(predictor)
        if units * per_unit <= MAX_EMISSION_BYTES:
            return
        most = MAX_EMISSION_BYTES // per_unit
        side = math.isqrt(most)
        unit = "pixel" if sample == "image" else "unit"
        largest = f"{most:,} pixels (e.g. {side}x{side})" if sample == "image" else \
            f"{most:,} units"
        remedy = "pass a smaller image_size (crop or downscale the images)" \
            if sample == "image" else "split longer sequences into chunks of at most that"
        raise ValueError(
            f"{what}: emitting its graphs holds about {per_unit:,} bytes per {unit} (the keys and "
            f"queries of every graph, the predictor's states), {units * per_unit / 2**30:.1f} "
            f"GiB, more than glomo_pyg.transforms.glomo_graphs.MAX_EMISSION_BYTES = "
            f"{MAX_EMISSION_BYTES / 2**20:,.0f} MiB; the largest {sample} this predictor takes "
            f"is {largest}: {remedy}, or raise MAX_EMISSION_BYTES where the memory is there")

    def _kept_rule(self) -> str:
        """What bounds :meth:`kept_edges`, for the size error."""
        sources = "every earlier (or later) unit" if self.top_k is None else \
            f"at most top_k={self.top_k} units"
        window = "" if self.max_distance is None else \
            f" within max_distance={self.max_distance}"
        return f"GlomoGraphs: {self.num_relations} relations, each target's sources " \
            f"{sources}{window}"

    def kept_edges(self, num_units: int) -> int:
        """At most how many edges pruning keeps of a sample of ``num_units`` units: per
        relation, target ``j`` has the ``j`` units before it (and itself) as sources
        (after it, backward), at most ``top_k`` of them and what the ``max_distance``
        window holds (``w + 1`` units, ``(w + 1) (2 w + 1)`` pixels; products of ``l``
        layers reach ``l`` windows)."""
        cap = num_units if self.top_k is None else min(num_units, self.top_k)
        if self.max_distance is not None:
            w = self.max_distance * (max(self.layers) + 1 if self.products else 1)
            cap = min(cap, (w + 1) * (2 * w + 1) if self.modality == "pixels" else w + 1)
        return self.num_relations * (cap * (cap + 1) // 2 + (num_units - cap) * cap)

    @property
    def relations(self) -> List[str]:
        if self.merge is not None:
            return list(self.directions)
        return [relation_name(d, l, h, self.products) for d in self.directions
                for l in self.layers for h in self.heads]

    def key_parts(self) -> Dict[str, Any]:
        return dict(transform="GlomoGraphs", glomo_pyg=__version__,
                    predictor=self.predictor.fingerprint(), modality=self.modality,
                    image_size=list(getattr(self, "image_size", ())),
                    directions=list(self.directions), layers=list(self.layers),
                    heads=list(self.heads), products=self.products, merge=self.merge,
                    top_k=self.top_k, min_weight=self.min_weight,
                    max_distance=self.max_distance, **self.edge_key_parts())

    def options(self) -> Dict[str, Any]:
        predictor = self._name or self.predictor.fingerprint()[:16]
        sized = dict(image_size=self.image_size) if self.modality == "pixels" else {}
        return dict(predictor=predictor, directions=self.directions, layers=self.layers,
                    heads=self.heads, products=self.products, merge=self.merge,
                    top_k=self.top_k, min_weight=self.min_weight,
                    max_distance=self.max_distance, **sized, batch_size=self.batch_size,
                    device=str(self.device), **super().options())

    def check_sample(self, data: Data, index: int) -> None:
        super().check_sample(data, index)
        x = data.x
        where = f"sample {index}: "
        self._check_sample_type(x, where)
        n = x.size(0)
        if self.modality != "pixels":  # (an image's size was checked at construction)
            self._check_emission(self.predictor, n, f"{where}{n:,} units", "sample")
        self.check_edge_count(index, n, self.kept_edges(n), self._kept_rule(),
                              "" if self.top_k is not None or self.max_distance is not None
                              else ", or pass top_k= or max_distance=")
        if self.modality == "text":  # (after the size checks: this reads every token)
            low, high = (int(v) for v in torch.aminmax(x))
            if low < 0 or high >= self.predictor.num_tokens:
                raise ValueError(where + f"token ids must lie in [0, "
                                 f"{self.predictor.num_tokens}) (the predictor's vocabulary), "
                                 f"got values in [{low}, {high}]")

    def _check_sample_type(self, x: Tensor, where: str) -> None:
        """Refuse ``x`` unless it is the dtype and shape this predictor reads."""
        if self.modality == "text":
            if x.dtype not in TOKEN_DTYPES or (x.dim() == 2 and x.size(1) != 1):
                raise TypeError(where + f"this is a text predictor: data.x must hold token ids "
                                f"(int64 or int32, [T] or [T, 1]), got {x.dtype} "
                                f"{tuple(x.shape)}" + ("; pixels need a pixel predictor"
                                                       if x.dtype == torch.uint8 else ""))
        elif self.modality == "pixels":
            h, w = self.image_size
            c = self.predictor.in_channels
            if x.dtype != torch.uint8:
                raise TypeError(where + f"this is a pixel predictor: data.x must hold uint8 "
                                f"pixels [H W, C] in raster order, got {x.dtype}"
                                + ("; token ids need a text predictor"
                                   if x.dtype in TOKEN_DTYPES else ""))
            if x.dim() != 2 or tuple(x.shape) != (h * w, c):
                raise ValueError(where + f"data.x must be one {h}x{w} image of {c} channels: "
                                 f"[{h * w}, {c}] pixels in raster order, got {tuple(x.shape)} "
                                 f"(other sizes: image_size=...)")
        elif not x.is_floating_point() or x.dim() != 2 or x.size(1) != self.predictor.in_channels:
            raise ValueError(where + f"this predictor reads float features [T, "
                             f"{self.predictor.in_channels}], got {x.dtype} {tuple(x.shape)}")

    def sample_edges(self, samples: List[Data]) -> List[SampleEdges]:
        # the fused layout: each layer's keys and queries, pruned block by block (no T x T
        # graph); products need each sample's dense graphs, and so do float64 predictors
        # (the fused layout takes 32- and 16-bit keys)
        self._check_length(samples)
        dtype = next(self.predictor.parameters()).dtype
        return self._sample_edges(samples, dense=self.products or dtype not in flex.DTYPES)

    def _check_length(self, samples: List[Data]) -> None:
        """Warn once when the learned distance term would read beyond its pretraining
        lengths or image sizes (as :class:`~glomo_pyg.nn.GlomoTransfer` does)."""
        if self._warned_length or not samples:
            return
        units: Union[int, Tuple[int, int]] = self.image_size if self.modality == "pixels" \
            else max(d.x.size(0) for d in samples)
        message = self.predictor.extrapolation_warning(units, self.max_distance,
                                                       owner="GlomoGraphs")
        if message is not None:
            self._warned_length = True
            warnings.warn(message, RuntimeWarning, stacklevel=caller_stacklevel())

    def _sample_edges(self, samples: List[Data], dense: bool) -> List[SampleEdges]:
        longest = max(d.x.size(0) for d in samples)
        if dense:  # [B, relations, T, T] blocks: bounded as the predictor bounds one layer's
            widest = max(len(self.relations), self.predictor.heads)
            fits = max(1, kernels.MAX_GRAPH_PAIRS // (widest * longest * longest))
        else:  # the keys and queries of a call (dozens of values per head and unit) bound it
            fits = max(1, EMISSION_UNITS // longest)
        if len(samples) > fits:
            return [e for start in range(0, len(samples), fits)
                    for e in self._sample_edges(samples[start:start + fits], dense)]
        sizes = torch.tensor([d.x.size(0) for d in samples])
        batch = torch.repeat_interleave(torch.arange(len(samples)), sizes).to(self.device)
        x = torch.cat([d.x.reshape(d.x.size(0), -1) for d in samples])
        x = (x.view(-1) if self.modality == "text" else x).to(self.device)
        with torch.no_grad():
            try:
                emitted = self.predictor(x, batch, layout="dense" if dense else "fused")
            except ValueError:
                if dense:
                    raise
                # what the fused layout refuses (no FlexAttention in this torch, softmax
                # scores that could overflow it): the dense graphs
                return self._sample_edges(samples, dense=True)
            parts, first = [], 0  # per direction: its kept edges
            for d in self.directions:
                graphs = getattr(emitted, d)
                b, relation, tgt, src, weight = (
                    self._pruned_edges(graphs) if graphs.layout == "fused" else
                    self._dense_edges(graphs))
                parts.append((torch.bincount(b, minlength=len(samples)).tolist(),
                              (src, tgt, weight.float(), relation + first)))
                first += len(self.relations) // len(self.directions)
        home = samples[0].x.device
        # each sample's edges: its piece of every direction, in relation order
        pieces = [list(zip(*(torch.split(t.to(home), counts) for t in edges)))
                  for counts, edges in parts]
        out = []
        for sample in zip(*pieces):
            src, tgt, weight, relation = (torch.cat(t) for t in zip(*sample))
            out.append((torch.stack([src, tgt]), weight, relation))
        return out

    def _pruned_edges(self, graphs: LatentGraphs) -> PrunedEdges:
        """One direction's kept edges from its fused graphs' keys and queries."""
        window = graphs.window
        if self.max_distance is not None:
            window = self.max_distance if window is None else min(window, self.max_distance)
        if window is not None and window >= graphs.order.longest_window_distance(
                graphs.sequences.max_len):
            window = None  # (nothing farther apart)
        every_head = len(self.heads) == graphs.num_heads
        layers = cast(List[Tuple[Tensor, Tensor]], graphs.fused_layers)  # (fused layout)
        return pruned_graph_edges([layers[l] for l in self.layers], graphs.lengths,
                                  order=graphs.order, normalization=graphs.normalization,
                                  heads=None if every_head else self.heads, merge=self.merge,
                                  top_k=self.top_k, min_weight=self.min_weight, window=window)

    def _dense_edges(self, graphs: LatentGraphs) -> PrunedEdges:
        """One direction's kept edges from its dense blocks (products, float64 predictors,
        and what the fused layout refuses)."""
        parts, first = [], 0
        for block in self._direction_blocks(graphs):
            # [B, R, target, source], contiguous: top-k and nonzero run along rows
            b, relation, tgt, src, weight = prune_rows(block.transpose(-1, -2).contiguous(),
                                                       self.top_k, self.min_weight)
            parts.append((b, relation + first, tgt, src, weight))
            first += block.size(1)
        b, relation, tgt, src, weight = (torch.cat(t) for t in zip(*parts))
        if len(parts) > 1:  # blocks are layers: (sample, relation) order across them
            _, perm = (b * first + relation).sort(stable=True)
            b, relation, tgt, src, weight = (t[perm] for t in (b, relation, tgt, src, weight))
        return b, relation, tgt, src, weight

    def _direction_blocks(self, graphs: LatentGraphs) -> Iterator[Tensor]:
        """``[B, R, T, T]`` blocks (``[b, r, i, j] = G_ij``) of one direction's selected
        relations, in :attr:`relations` order (one block per layer), or the merged one."""
        if self.max_distance is not None:
            graphs = graphs.within(self.max_distance)
        every_head = len(self.heads) == graphs.num_heads
        blocks = (b if every_head else b[:, list(self.heads)] for b in self._layer_blocks(graphs))
        if self.merge is None:
            yield from blocks
            return
        total = None  # (summed block by block: no [B, L H, T, T] copy)
        for block in blocks:
            total = block.sum(1, keepdim=True) if total is None else \
                total + block.sum(1, keepdim=True)
        assert total is not None  # (self.layers is not empty)
        yield total / (len(self.layers) * len(self.heads)) if self.merge == "mean" else total

    def _layer_blocks(self, graphs: LatentGraphs) -> Iterator[Tensor]:
        r"""``[B, H, T, T]`` of each selected layer :math:`l`: :math:`G^l`, or with
        :attr:`products` :math:`G^1 \cdots G^l`."""
        if not self.products:
            yield from (graphs.dense_layer(l) for l in self.layers)
            return
        product = None
        for l in range(max(self.layers) + 1):
            product = graphs.dense_layer(l) if product is None else \
                product @ graphs.dense_layer(l)
            if l in self.layers:
                yield product


def image_data(image: Tensor, **attributes: Any) -> Data:
    """A ``Data`` of one uint8 ``[C, H, W]`` image: ``x`` its pixels in raster order
    (``[H W, C]``), ``pos`` each pixel's ``(row, column)``, and ``attributes`` (e.g.
    ``y``)."""
    from glomo_pyg.pixels import check_images, image_units

    check_images(image.unsqueeze(0) if isinstance(image, Tensor) and image.dim() == 3 else image,
                 name="image")
    if image.dim() != 3:
        raise ValueError(f"image must be one [C, H, W] image, got {tuple(image.shape)}")
    x, _ = image_units(image.unsqueeze(0))
    h, w = image.shape[1:]
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    pos = torch.stack([rows.reshape(-1), cols.reshape(-1)], 1).to(image.device)
    return Data(x=x, pos=pos, **attributes)
