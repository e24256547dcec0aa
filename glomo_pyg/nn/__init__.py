"""Neural network modules of glomo_pyg (no training loops, no file I/O)."""
from glomo_pyg.graphs import DirectionalGraphs
from glomo_pyg.nn.cnn import CausalCNN, MaskedNorm
from glomo_pyg.nn.config import ConfigurableModule
from glomo_pyg.nn.conv import GlomoConv
from glomo_pyg.nn.decoder import ContextDecoder
from glomo_pyg.nn.emitter import EMITTERS, GraphEmitter
from glomo_pyg.nn.encoder import UnitEncoder
from glomo_pyg.nn.feature_predictor import FeatureGraphEmitter, FeaturePredictor
from glomo_pyg.nn.functional import head_propagate, latent_graph_edges, weighted_spmm
from glomo_pyg.nn.fusion import GatedFusion
from glomo_pyg.nn.glomo import Glomo, GlomoOutput
from glomo_pyg.nn.graph_learning import GraphLearning, LearnedGraph
from glomo_pyg.nn.graph_predictor import GraphPredictor
from glomo_pyg.nn.image_encoder import ImageEncoder
from glomo_pyg.nn.mixer import GraphMixer
from glomo_pyg.nn.pick_conv import PickConv, relative_positions
from glomo_pyg.nn.pixel import MaskedConv2d, PixelCNN, PixelContextHead, PixelGraphPredictor
from glomo_pyg.nn.pretrained import PretrainedGraphPredictor
from glomo_pyg.nn.resnet import CifarResNet, GlomoResNet
from glomo_pyg.nn.scorer import GraphScorer
from glomo_pyg.nn.text_classifier import GlomoTextClassifier
from glomo_pyg.nn.transfer import GlomoTransfer

__all__ = [
    "CausalCNN", "CifarResNet", "ConfigurableModule", "ContextDecoder", "DirectionalGraphs",
    "EMITTERS", "FeatureGraphEmitter", "FeaturePredictor", "GatedFusion", "Glomo", "GlomoConv",
    "GlomoOutput", "GlomoResNet", "GlomoTextClassifier", "GlomoTransfer", "GraphEmitter",
    "GraphLearning", "GraphMixer", "GraphPredictor", "GraphScorer", "ImageEncoder",
    "LearnedGraph", "MaskedConv2d", "MaskedNorm", "PickConv",
    "PixelCNN", "PixelContextHead", "PixelGraphPredictor", "PretrainedGraphPredictor",
    "UnitEncoder",
    "head_propagate", "latent_graph_edges", "relative_positions", "weighted_spmm",
]
