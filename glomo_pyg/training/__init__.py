"""Training loops (Lightning) for glomo_pyg models."""
from glomo_pyg.training.pretraining import GlomoPretraining

__all__ = ["GlomoPretraining"]
