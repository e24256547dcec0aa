"""glomo_pyg: GLoMo's unsupervisedly learned relational graphs for PyTorch Geometric."""
import logging

# a library writes nothing itself: its records reach the application's handlers, or no one
# (glomo_pyg.logs; docs/training.md, "Logging")
logging.getLogger(__name__).addHandler(logging.NullHandler())

from glomo_pyg.graphs import DirectionalGraphs, LatentGraphs  # noqa: E402
from glomo_pyg.io import PretrainedFormatError  # noqa: E402
from glomo_pyg.nn import (  # noqa: E402
                          ContextDecoder,
                          FeatureGraphEmitter,
                          FeaturePredictor,
                          GatedFusion,
                          Glomo,
                          GlomoConv,
                          GlomoOutput,
                          GlomoResNet,
                          GlomoTextClassifier,
                          GlomoTransfer,
                          GraphEmitter,
                          GraphLearning,
                          GraphMixer,
                          GraphPredictor,
                          GraphScorer,
                          PickConv,
                          PixelGraphPredictor,
                          PretrainedGraphPredictor,
)
from glomo_pyg.nn.pretrained import load_pretrained, save_pretrained  # noqa: E402
from glomo_pyg.ordering import RasterOrder, SequenceOrder, UnitOrder  # noqa: E402
from glomo_pyg.version import __version__  # noqa: E402

__all__ = [
    "ContextDecoder", "DirectionalGraphs", "FeatureGraphEmitter", "FeaturePredictor",
    "GatedFusion", "Glomo", "GlomoConv", "GlomoOutput", "GlomoResNet", "GlomoTextClassifier",
    "GlomoTransfer", "GraphEmitter", "GraphLearning", "GraphMixer", "GraphPredictor",
    "GraphScorer", "LatentGraphs", "PickConv", "PixelGraphPredictor", "PretrainedFormatError",
    "PretrainedGraphPredictor",
    "RasterOrder", "SequenceOrder", "UnitOrder",
    "__version__", "load_pretrained", "save_pretrained",
]
