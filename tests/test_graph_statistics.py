"""graph_statistics against values worked out by hand."""
import pytest
import torch

from glomo_pyg import LatentGraphs
from glomo_pyg.analysis import distance_bin_names, graph_statistics
from glomo_pyg.training.graph_statistics import GraphStatisticsCallback


def test_statistics_of_uniform_graphs_match_closed_forms():
    # one sequence of 5 units, forward, 2 heads: target j has j sources at distances 1..j
    g = LatentGraphs.uniform(torch.tensor([0, 5]), num_layers=1, num_heads=2,
                             direction="forward")
    stats = graph_statistics(g)
    assert stats["layer0/density"] == pytest.approx(1.0)
    assert stats["layer0/out_degree"] == pytest.approx(10 / 5)  # 10 edges per head, 5 units
    # mean over the 4 targets with edges of the mean distance (j + 1) / 2, j = 1..4
    assert stats["layer0/distance"] == pytest.approx((1 + 1.5 + 2 + 2.5) / 4)
    # distances over all edges: 1 x4, 2 x3, 3 x2, 4 x1 (per head)
    assert stats["layer0/dist_1"] == pytest.approx(4 / 10)
    assert stats["layer0/dist_2"] == pytest.approx(3 / 10)
    assert stats["layer0/dist_3-4"] == pytest.approx(3 / 10)
    assert stats["layer0/dist_5-8"] == 0.0 and stats["layer0/dist_65+"] == 0.0


def test_statistics_of_a_hand_made_sparse_graph():
    # two sequences [0, 1, 2] and [3 .. 102]; edges: 0->2 (w 1), 3->100 (w 0.25), 99->100 (0.75)
    g = LatentGraphs([torch.tensor([[0, 3, 99], [2, 100, 100]])],
                     [torch.tensor([1.0, 0.25, 0.75])], [torch.zeros(3, dtype=torch.long)],
                     num_heads=1, direction="forward", ptr=torch.tensor([0, 3, 103]))
    stats = graph_statistics(g)
    assert stats["layer0/density"] == pytest.approx(3 / (3 + 100 * 99 / 2))
    assert stats["layer0/distance"] == pytest.approx((2 * 1.0 + (97 * 0.25 + 1 * 0.75)) / 2)
    assert stats["layer0/dist_2"] == pytest.approx(1 / 3)
    assert stats["layer0/dist_1"] == pytest.approx(1 / 3)
    assert stats["layer0/dist_65+"] == pytest.approx(1 / 3)


def test_bin_names_and_bad_interval():
    assert distance_bin_names() == ["1", "2", "3-4", "5-8", "9-16", "17-32", "33-64", "65+"]
    with pytest.raises(ValueError, match="every_n_steps"):
        GraphStatisticsCallback(0)
