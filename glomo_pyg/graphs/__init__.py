"""Latent graphs: the one graph object of the library (:class:`LatentGraphs`), the
forward/backward pair a bidirectional predictor emits (:class:`DirectionalGraphs`),
how each graph layer is stored (:mod:`glomo_pyg.graphs.storage`), the one pruning rule
of edge lists (:mod:`glomo_pyg.graphs.pruning`) and the block-by-block kernels
(:mod:`glomo_pyg.graphs.score_blocks`)."""
from glomo_pyg.graphs.checks import MAX_HEADS, MAX_LAYERS, check_max_distance
from glomo_pyg.graphs.latent import DIRECTION_KEYS, DirectionalGraphs, LatentGraphs
from glomo_pyg.graphs.storage import (
    DenseStorage,
    EdgeStorage,
    FusedStorage,
    GraphFrame,
    GraphStorage,
    LayerEdges,
    UniformStorage,
)

__all__ = ["LatentGraphs", "DirectionalGraphs", "DIRECTION_KEYS", "MAX_HEADS", "MAX_LAYERS",
           "check_max_distance", "LayerEdges", "GraphFrame", "GraphStorage", "EdgeStorage",
           "DenseStorage", "FusedStorage", "UniformStorage"]
