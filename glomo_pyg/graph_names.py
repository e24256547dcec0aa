"""The one name of a graph: ``"<direction>/layer<l>/head<h>"`` (products of the layers up
to ``l``: ``"<direction>/layers0-<l>/head<h>"``), layers and heads counted from 0, as
every surface shows it (transform relations, GraphML keys, networkx edges, statistics
tables, the viewer)."""
from __future__ import annotations


def layer_name(layer: int, products: bool = False) -> str:
    """``"layer<l>"``, or ``"layers0-<l>"`` for the product of layers 0 to ``l``."""
    return f"layers0-{layer}" if products else f"layer{layer}"


def relation_name(direction: str, layer: int, head: int, products: bool = False) -> str:
    """``"forward/layer0/head3"``: graph ``head`` of ``layer`` (0-based) of ``direction``."""
    return f"{direction}/{layer_name(layer, products)}/head{head}"
