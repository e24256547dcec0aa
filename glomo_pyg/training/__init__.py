"""Training loops (Lightning) for glomo_pyg models: ``pip install 'glomo-pyg[train]'``."""
from glomo_pyg.extras import require

require("lightning", "Training (glomo_pyg.training)")
from glomo_pyg.analysis import graph_statistics
from glomo_pyg.training.graph_statistics import GraphStatisticsCallback
from glomo_pyg.training.pretrain.module import GlomoPretraining
from glomo_pyg.training.pretrain.config import PretrainConfig
from glomo_pyg.training.pretrain.run import run_pretraining

__all__ = ["GlomoPretraining", "GraphStatisticsCallback", "PretrainConfig", "graph_statistics",
           "run_pretraining"]
