"""Training loops (Lightning) for glomo_pyg models: ``pip install 'glomo-pyg[train]'``."""
from glomo_pyg.extras import require

# (the names below need Lightning: say which extra is missing before importing them)
require("lightning", "Training (glomo_pyg.training)")
from glomo_pyg.analysis import graph_statistics  # noqa: E402
from glomo_pyg.training.graph_statistics import GraphStatisticsCallback  # noqa: E402
from glomo_pyg.training.pretrain.config import PretrainConfig  # noqa: E402
from glomo_pyg.training.pretrain.module import GlomoPretraining  # noqa: E402
from glomo_pyg.training.pretrain.run import run_pretraining  # noqa: E402

__all__ = ["GlomoPretraining", "GraphStatisticsCallback", "PretrainConfig", "graph_statistics",
           "run_pretraining"]
