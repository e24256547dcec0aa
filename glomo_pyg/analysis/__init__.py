"""Analysis of learned graphs: statistics and health, recovery of planted dependencies,
comparison with gold syntax, figures, export and the viewer. Submodules load on first use
(PEP 562), so importing the package needs none of their optional packages."""
from importlib import import_module

_EXPORTS = {
    "figures": ("plot_graph_heatmaps", "plot_pixel_weights", "plot_statistics",
                "plot_syntax_scores", "save_figure"),
    "export": ("adjacency", "edge_list", "hierarchical", "to_graphml_graph", "to_networkx"),
    "export_files": ("ExportDirectory", "ExportItem", "export_graphs"),
    "recovery": ("RecoveryReport", "planted_source_recovery"),
    "statistics": ("DEAD_HEAD_SHARE", "DISTANCE_EDGES", "GRID_RADIUS", "GraphHealth",
                   "GraphStatisticsAccumulator", "GraphStatisticsTable", "HeadStatistics",
                   "NEAR_UNIFORM_KL", "dataset_statistics", "distance_bin_names",
                   "graph_health", "graph_statistics"),
    "syntax": ("Alignment", "GraphScores", "NothingToScore", "SyntaxComparison", "SyntaxScores",
               "align", "compare_with_syntax", "syntax_scores", "untrained_copy"),
    "treebank": ("GoldTree", "TreebankFormatError", "read_treebank"),
    "viewer": ("GraphView", "view", "view_data"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
