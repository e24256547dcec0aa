"""Evaluation of transferred graphs with frozen features: pooled ``[H ; M H]`` features,
a linear probe and paired bootstrap intervals (docs/linear_probe.md)."""
from glomo_pyg.evaluation.bootstrap import paired_bootstrap
from glomo_pyg.evaluation.linear import LinearProbe
from glomo_pyg.evaluation.probe import (
                                        POOLINGS,
                                        grid_graphs,
                                        pool_units,
                                        probe_features,
                                        unit_features,
)

__all__ = ["LinearProbe", "POOLINGS", "grid_graphs", "paired_bootstrap", "pool_units",
           "probe_features", "unit_features"]
