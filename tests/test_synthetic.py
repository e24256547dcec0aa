"""Planted-dependency corpus and the recovery metric."""
import pytest
import torch
from torch_geometric.loader import DataLoader

from glomo_pyg import LatentGraphs
from glomo_pyg.analysis import planted_source_recovery
from glomo_pyg.data import PlantedDependencyCorpus


def test_items_are_deterministic_and_splits_share_the_language():
    a = PlantedDependencyCorpus(num_sequences=5, seed=3)
    b = PlantedDependencyCorpus(num_sequences=5, seed=3)
    assert all(torch.equal(a[i].x, b[i].x) and torch.equal(a[i].source, b[i].source)
               for i in range(5))
    shifted = PlantedDependencyCorpus(num_sequences=5, seed=3, start=2)
    assert torch.equal(shifted[0].x, a[2].x)
    assert (a.transitions == shifted.transitions).all()
    other = PlantedDependencyCorpus(num_sequences=5, seed=4)
    assert not all(torch.equal(a[i].x, other[i].x) for i in range(5))


def test_planted_dependencies_are_what_the_generator_says():
    corpus = PlantedDependencyCorpus(num_sequences=50, seed=1, dependencies=4)
    v = corpus.vocab
    counted = 0
    for i in range(len(corpus)):
        data = corpus[i]
        x, source = data.x.tolist(), data.source.tolist()
        assert corpus.min_length <= len(x) <= corpus.max_length
        assert all(0 <= t < corpus.num_tokens for t in x)
        for t, s in enumerate(source):
            if s < 0:
                assert not (v.dependent(0) <= x[t] < v.dependent(0) + v.num_values)
                continue
            counted += 1
            assert corpus.min_distance <= t - s <= corpus.max_distance
            slot, value = divmod(x[s] - v.trigger(0, 0), v.num_values)
            assert 0 <= slot < v.num_slots
            assert x[t - 1] == v.cue(slot) and x[t] == v.dependent(value)
            # the cue identifies its trigger: no other trigger of the same slot in the sequence
            same_slot = [p for p, tok in enumerate(x)
                         if v.trigger(slot, 0) <= tok < v.trigger(slot, 0) + v.num_values]
            assert same_slot == [s]
    assert counted > 150  # almost every sequence gets its 4 dependencies


def test_corpus_rejects_bad_settings():
    with pytest.raises(ValueError, match="distance"):
        PlantedDependencyCorpus(min_length=10, max_distance=12)
    with pytest.raises(ValueError, match="dependencies"):
        PlantedDependencyCorpus(num_slots=2, dependencies=3)
    with pytest.raises(ValueError, match="topic_size"):
        PlantedDependencyCorpus(num_filler=5, topic_size=6)
    with pytest.raises(IndexError):
        PlantedDependencyCorpus(num_sequences=3)[3]


def _graphs(edges, lengths, heads=1):
    """LatentGraphs from (head, source, target, weight) tuples in flat ids."""
    h, s, t, w = zip(*sorted(edges, key=lambda e: (e[0], e[2], e[1])))
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.tensor(lengths).cumsum(0)])
    return LatentGraphs([torch.tensor([s, t])], [torch.tensor(w)], [torch.tensor(h)],
                        num_heads=heads, direction="forward", ptr=ptr)


def test_recovery_scores_hand_built_graphs():
    # Two sequences of length 6; dependents at flat 4 (source 1) and 6 + 5 (source 6 + 0).
    source = torch.full((12,), -1)
    source[4], source[11] = 1, 0
    # Readers are flat 3 and 10. Head 0 is right on both, head 1 on neither.
    edges = [(0, 1, 3, 0.7), (0, 2, 3, 0.3), (0, 6, 10, 0.6), (0, 9, 10, 0.4),
             (1, 2, 3, 1.0), (1, 9, 10, 0.9), (1, 6, 10, 0.1)]
    report = planted_source_recovery(_graphs(edges, [6, 6], heads=2), source)
    assert report.num_dependencies == 2
    assert report.per_graph.tolist() == [[1.0, 0.0]]
    assert report.best == (0, 0, 1.0)
    # Head-averaged: reader 3 gets 0.7 from 1 vs 1.3 from 2 -> wrong; reader 10: 0.7 vs 1.3 ->
    # wrong.
    assert report.per_layer.tolist() == [0.0]
    assert report.uniform == pytest.approx((1 / 3 + 1 / 4) / 2)  # readers at positions 3 and 4
    assert report.previous_token == 0.0
    assert "precision@1" in report.format()


def test_recovery_of_previous_unit_graph_equals_its_baseline():
    corpus = PlantedDependencyCorpus(num_sequences=20, seed=2, min_distance=2)
    data = next(iter(DataLoader(corpus, batch_size=20)))
    n = data.num_nodes
    tgt = torch.arange(n)
    keep = tgt - data.ptr[data.batch] > 0
    src, tgt = tgt[keep] - 1, tgt[keep]
    graphs = LatentGraphs([torch.stack([src, tgt])], [torch.ones(src.numel())],
                          [torch.zeros(src.numel(), dtype=torch.long)], num_heads=1,
                          direction="forward", ptr=data.ptr)
    report = planted_source_recovery(graphs, data.source)
    assert report.per_graph.item() == pytest.approx(report.previous_token)
    assert report.previous_token > 0  # min_distance=2 makes some dependencies adjacent to the cue


def test_recovery_rejects_bad_input():
    graphs = _graphs([(0, 0, 1, 1.0)], [3])
    with pytest.raises(ValueError, match="no planted"):
        planted_source_recovery(graphs, torch.full((3,), -1))
    with pytest.raises(ValueError, match="shape"):
        planted_source_recovery(graphs, torch.full((4,), -1))
    with pytest.raises(ValueError, match="outside"):
        planted_source_recovery(graphs, torch.tensor([-1, -1, 0]), reader_offset=-3)
    backward = LatentGraphs.uniform(graphs.ptr, num_layers=1, num_heads=1,
                                    direction="backward")
    with pytest.raises(ValueError, match="forward"):
        planted_source_recovery(backward, torch.tensor([-1, 0, -1]))


def test_recovery_shares_credit_among_tied_sources_and_checks_readers():
    """Uniform weights used to credit whichever tied source was written last."""
    source = torch.full((6,), -1)
    source[4] = 1  # reader 3 (positions 0..2 allowed), planted source 1
    uniform = LatentGraphs.uniform(torch.tensor([0, 6]), num_layers=1, num_heads=2,
                                   direction="forward")
    report = planted_source_recovery(uniform, source)
    assert report.per_graph.tolist() == [[pytest.approx(1 / 3)] * 2]
    assert report.per_layer.tolist() == [pytest.approx(1 / 3)]
    assert report.uniform == pytest.approx(1 / 3)
    two_way = _graphs([(0, 0, 3, 0.5), (0, 1, 3, 0.5)], [6])  # a tie between 0 and 1
    assert planted_source_recovery(two_way, source).per_graph.item() == pytest.approx(0.5)
    last = torch.full((6,), -1)
    last[5] = 0
    with pytest.raises(ValueError, match="outside"):
        planted_source_recovery(uniform, last, reader_offset=3)
    with pytest.raises(ValueError, match="reader_offset must be an integer"):
        planted_source_recovery(uniform, last, reader_offset=0.5)
    with pytest.raises(ValueError, match="int64 tensor"):
        planted_source_recovery(uniform, [-1] * 6)


def test_recovery_gives_no_credit_to_zero_weight_edges():
    source = torch.full((6,), -1)
    source[4] = 1
    dead = _graphs([(0, 0, 3, 0.0), (0, 1, 3, 0.0), (0, 2, 3, 0.0)], [6])
    assert planted_source_recovery(dead, source).per_graph.item() == 0.0
