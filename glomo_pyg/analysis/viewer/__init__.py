"""An interactive viewer of every graph of one sentence or one image (:func:`view`): a
self-contained HTML page, inline in notebooks or saved to a file."""
from glomo_pyg.analysis.viewer.page import GraphView, view, view_data

__all__ = ["GraphView", "view", "view_data"]
