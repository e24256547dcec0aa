"""glomo_pyg: GLoMo's unsupervisedly learned relational graphs for PyTorch Geometric.

The public names are imported on first use (PEP 562), so that reading the version
(``glomo --version``) does not import torch."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, List

from glomo_pyg.version import __version__

if TYPE_CHECKING:
    from glomo_pyg.graphs import DirectionalGraphs, LatentGraphs
    from glomo_pyg.io import PretrainedFormatError, load_pretrained, save_pretrained
    from glomo_pyg.nn import (
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
        GraphMixer,
        GraphPredictor,
        GraphScorer,
        PixelGraphPredictor,
        PretrainedGraphPredictor,
    )
    from glomo_pyg.ordering import RasterOrder, SequenceOrder, UnitOrder

#: Where each public name lives.
_HOMES = {
    "glomo_pyg.graphs": ("DirectionalGraphs", "LatentGraphs"),
    "glomo_pyg.io": ("PretrainedFormatError", "load_pretrained", "save_pretrained"),
    "glomo_pyg.nn": ("ContextDecoder", "FeatureGraphEmitter", "FeaturePredictor",
                     "GatedFusion", "Glomo", "GlomoConv", "GlomoOutput", "GlomoResNet",
                     "GlomoTextClassifier", "GlomoTransfer", "GraphEmitter", "GraphMixer",
                     "GraphPredictor", "GraphScorer", "PixelGraphPredictor",
                     "PretrainedGraphPredictor"),
    "glomo_pyg.ordering": ("RasterOrder", "SequenceOrder", "UnitOrder"),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "ContextDecoder", "DirectionalGraphs", "FeatureGraphEmitter", "FeaturePredictor",
    "GatedFusion", "Glomo", "GlomoConv", "GlomoOutput", "GlomoResNet", "GlomoTextClassifier",
    "GlomoTransfer", "GraphEmitter", "GraphMixer", "GraphPredictor", "GraphScorer",
    "LatentGraphs", "PixelGraphPredictor", "PretrainedFormatError", "PretrainedGraphPredictor",
    "RasterOrder", "SequenceOrder", "UnitOrder",
    "__version__", "load_pretrained", "save_pretrained",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'glomo_pyg' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # (later reads skip this function)
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))
