"""glomo_pyg: GLoMo's unsupervisedly learned relational graphs for PyTorch Geometric."""
__version__ = "0.1.0"

from glomo_pyg.graphs import LatentGraphs  # noqa: E402
from glomo_pyg.io import PretrainedFormatError, load_pretrained, save_pretrained  # noqa: E402
from glomo_pyg.nn import (ContextDecoder, DirectionalGraphs, FeaturePredictor,  # noqa: E402
                          GatedFusion, Glomo, GlomoConv, GlomoOutput, GlomoTextClassifier,
                          GlomoTransfer, GraphMixer,
                          GraphPredictor, GraphScorer, PretrainedGraphPredictor)

__all__ = [
    "ContextDecoder", "DirectionalGraphs", "FeaturePredictor", "GatedFusion", "Glomo", "GlomoConv",
    "GlomoOutput", "GlomoTextClassifier", "GlomoTransfer", "GraphMixer", "GraphPredictor", "GraphScorer", "LatentGraphs",
    "PretrainedFormatError", "PretrainedGraphPredictor", "__version__", "load_pretrained",
    "save_pretrained",
]
