"""Data sets and generators."""
from glomo_pyg.data.synthetic import PlantedDependencyCorpus, Vocabulary

__all__ = ["PlantedDependencyCorpus", "Vocabulary"]
