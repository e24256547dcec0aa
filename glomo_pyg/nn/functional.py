"""Functional forms of the GLoMo operations (implemented in :mod:`glomo_pyg.kernels`)."""
from glomo_pyg.kernels import (
                               NORMALIZATIONS,
                               column_max_scores,
                               dense_head_propagate,
                               head_blocked_edges,
                               head_propagate,
                               latent_graph_dense,
                               latent_graph_edges,
                               weighted_spmm,
)
from glomo_pyg.ordering import DIRECTIONS

__all__ = ["DIRECTIONS", "NORMALIZATIONS", "column_max_scores", "dense_head_propagate",
           "head_blocked_edges", "head_propagate", "latent_graph_dense", "latent_graph_edges",
           "weighted_spmm"]
