r"""The edge options every graph transform shares (:class:`~glomo_pyg.transforms.UnitGraphs`),
applied to one sample's relational edges after pruning, in this order:

1. ``renormalize``: each target's kept weights in each relation divided by their sum
   (:math:`A_{ij} / \sum_{i'} A_{i'j}`), so that they sum to 1 again after ``top_k`` /
   ``min_weight``.
2. ``self_loops``: every unit gets, in every relation, a self-loop of weight 1 added to
   its own edge's weight if it has one (:math:`A + I`, as GCN's :math:`\hat{A}`).
3. ``symmetric``: each relation's graph made undirected within that relation,
   :math:`(A + A^\top) / 2`: an edge and its reverse get their mean weight (an absent
   direction counts 0), a self-loop keeps its weight, relations never mix.

The edges stay sorted by (relation, target, source), one edge per pair and relation.

Shapes:
    - **edges:** ``edge_index`` :math:`(2, E)`, ``edge_weight`` :math:`(E)`,
      ``edge_type`` :math:`(E)`, over ``num_units`` units and ``num_relations`` relations
"""
from __future__ import annotations

import re
from typing import Dict, List, Tuple

import torch
from torch import Tensor

#: Per sample: local ``edge_index [2, E]``, ``edge_weight [E]``, ``edge_type [E]``.
SampleEdges = Tuple[Tensor, Tensor, Tensor]
#: The node type of the ``HeteroData`` form.
NODE_TYPE = "unit"


def check_edge_options(**options: bool) -> Dict[str, bool]:
    """``options`` (names of :data:`EDGE_OPTIONS` and the output forms), refused unless
    each is ``True`` or ``False``."""
    for name, value in options.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    return dict(options)


def coalesced(src: Tensor, tgt: Tensor, weight: Tensor, relation: Tensor,
              num_units: int) -> SampleEdges:
    """One edge per (relation, target, source), weights of repeated ones summed, sorted."""
    n = num_units
    key = (relation * n + tgt) * n + src
    unique, inverse = torch.unique(key, sorted=True, return_inverse=True)
    summed = weight.new_zeros(unique.numel()).index_add_(0, inverse, weight)
    pair = unique % (n * n)
    return torch.stack([pair % n, pair // n]), summed, unique // (n * n)


def renormalized(edges: SampleEdges, num_units: int, num_relations: int) -> SampleEdges:
    """Each target's weights in each relation divided by their sum (a target whose kept
    weights are all 0 keeps them)."""
    edge_index, weight, relation = edges
    slot = relation * num_units + edge_index[1]
    total = weight.new_zeros(num_relations * num_units).index_add_(0, slot, weight)[slot]
    return edge_index, torch.where(total > 0, weight / total.clamp_min(1e-30), weight), relation


def with_self_loops(edges: SampleEdges, num_units: int, num_relations: int) -> SampleEdges:
    r""":math:`A + I` in every relation."""
    edge_index, weight, relation = edges
    unit = torch.arange(num_units, device=weight.device).repeat(num_relations)
    loop_relation = torch.arange(num_relations, device=weight.device).repeat_interleave(
        num_units)
    return coalesced(torch.cat([edge_index[0], unit]), torch.cat([edge_index[1], unit]),
                     torch.cat([weight, weight.new_ones(unit.numel())]),
                     torch.cat([relation, loop_relation]), num_units)


def symmetrized(edges: SampleEdges, num_units: int) -> SampleEdges:
    r""":math:`(A + A^\top) / 2` in every relation."""
    (src, tgt), weight, relation = edges
    half = weight / 2
    return coalesced(torch.cat([src, tgt]), torch.cat([tgt, src]), torch.cat([half, half]),
                     torch.cat([relation, relation]), num_units)


def apply_edge_options(edges: SampleEdges, num_units: int, num_relations: int, *,
                       renormalize: bool = False, self_loops: bool = False,
                       symmetric: bool = False) -> SampleEdges:
    """One sample's pruned edges after the options, in the module's order."""
    if renormalize:
        edges = renormalized(edges, num_units, num_relations)
    if self_loops:
        edges = with_self_loops(edges, num_units, num_relations)
    if symmetric:
        edges = symmetrized(edges, num_units)
    return edges


def relation_columns(edges: SampleEdges, num_units: int,
                     num_relations: int) -> Tuple[Tensor, Tensor]:
    """``edges`` as one edge per connected pair, sorted by (target, source), and their
    weights ``[E, num_relations]`` (0 where a relation has no edge between the pair)."""
    edge_index, weight, relation = edges
    pair = edge_index[1] * num_units + edge_index[0]
    unique, inverse = torch.unique(pair, sorted=True, return_inverse=True)
    table = weight.new_zeros(unique.numel(), num_relations)
    table[inverse, relation] = weight  # (one edge per pair and relation: no collisions)
    return torch.stack([unique % num_units, unique // num_units]), table


def edge_type_names(relations: List[str]) -> List[str]:
    """Each relation's name as a ``HeteroData`` edge type: every character but letters,
    digits and ``_`` becomes ``_`` (``"forward/layer0/head3"`` ->
    ``"forward_layer0_head3"``), what ``torch_geometric.nn.to_hetero`` accepts without
    warnings (its module keys)."""
    names = [re.sub(r"\W", "_", r) for r in relations]
    if len(set(names)) != len(names):
        raise ValueError(f"relations {relations} give repeated edge types {names}")
    return names
