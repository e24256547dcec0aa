"""glomo_pyg: GLoMo's unsupervisedly learned relational graphs for PyTorch Geometric."""
from glomo_pyg.graphs import LatentGraphs
from glomo_pyg.nn import (ContextDecoder, DirectionalGraphs, FeaturePredictor, Glomo, GlomoConv,
                          GlomoOutput, GraphPredictor, GraphScorer)

__version__ = "0.1.0"

__all__ = [
    "ContextDecoder", "DirectionalGraphs", "FeaturePredictor", "Glomo", "GlomoConv", "GlomoOutput",
    "GraphPredictor", "GraphScorer", "LatentGraphs", "__version__",
]
