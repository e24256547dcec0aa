"""PyG transforms that give any PyG model relational graphs over a sample's units:
GLoMo's learned graphs (:class:`GlomoGraphs`) and fixed baselines with the same interface
(:class:`ChainGraphs`, :class:`UniformGraphs`, :class:`GridGraphs`); :class:`GraphsDataset`
makes and caches them for a whole dataset in memory, :class:`GraphsOnDiskDataset` chunk by
chunk on disk (docs/any_gnn.md); :class:`TextGraphCache`
keeps the text classifier's graphs of fixed documents (docs/text.md)."""
from glomo_pyg.transforms.base import UnitGraphs
from glomo_pyg.transforms.dataset import GraphsDataset
from glomo_pyg.transforms.disk_dataset import GraphsOnDiskDataset
from glomo_pyg.transforms.fixed import ChainGraphs, FixedGraphs, GridGraphs, UniformGraphs
from glomo_pyg.transforms.glomo_graphs import GlomoGraphs, image_data
from glomo_pyg.transforms.text_cache import TextGraphCache

__all__ = ["ChainGraphs", "FixedGraphs", "GlomoGraphs", "GraphsDataset", "GraphsOnDiskDataset",
           "GridGraphs", "TextGraphCache", "UniformGraphs", "UnitGraphs", "image_data"]
