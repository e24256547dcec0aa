"""Pieces of the IMDB reproduction script: paired differences with Student-t intervals
and the TF-IDF + logistic regression baseline."""
import math
import random

import pytest

from benchmarks.reproduce.imdb import comparisons, tfidf_baseline
from benchmarks.statistics import paired_difference, t_quantile_975


def test_t_quantiles_match_known_values():
    for df, t in ((1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (30, 2.042)):
        assert t_quantile_975(df) == pytest.approx(t, abs=1e-3)
    assert t_quantile_975(31) == t_quantile_975(1000) == 1.96
    with pytest.raises(ValueError, match="df"):
        t_quantile_975(0)


def test_paired_difference_hand_computed():
    # differences 1..5: mean 3, sd sqrt(2.5), se sqrt(0.5), half width 2.7764 * sqrt(0.5)
    mean, low, high, n = paired_difference([1, 2, 3, 4, 5], [0, 0, 0, 0, 0])
    assert (mean, n) == (3.0, 5)
    assert low == pytest.approx(3 - 1.96322, abs=1e-4)
    assert high == pytest.approx(3 + 1.96322, abs=1e-4)
    # differences 0.02, 0.02, -0.01: mean 0.01, variance 0.0003, se 0.01, t(2) = 4.3027
    mean, low, high, n = paired_difference([0.80, 0.82, 0.79], [0.78, 0.80, 0.80])
    assert n == 3 and mean == pytest.approx(0.01)
    assert (low, high) == (pytest.approx(0.01 - 0.043027, abs=1e-6),
                           pytest.approx(0.01 + 0.043027, abs=1e-6))
    # identical differences: a zero-width interval; more than 31 pairs: the normal 1.96
    assert paired_difference([2, 3], [1, 2]) == (1.0, 1.0, 1.0, 2)
    d = [1.0, -1.0] * 16
    mean, low, high, n = paired_difference(d, [0.0] * 32)
    assert (mean, n) == (0.0, 32) and high == pytest.approx(1.96 / math.sqrt(31))


def test_comparisons_cover_every_variant_and_learned_graphs_against_uniform():
    assert comparisons(["baseline", "glomo", "glomo-rnn", "uniform"]) == [
        ("glomo", "baseline"), ("glomo-rnn", "baseline"), ("uniform", "baseline"),
        ("glomo", "uniform"), ("glomo-rnn", "uniform")]
    assert comparisons(["baseline", "glomo-rnn", "no-sparse"]) == [
        ("glomo-rnn", "baseline"), ("no-sparse", "baseline")]
    assert comparisons(["baseline", "glomo", "uniform", "untrained"]) == [
        ("glomo", "baseline"), ("uniform", "baseline"), ("untrained", "baseline"),
        ("glomo", "uniform"), ("glomo", "untrained")]
    assert comparisons(["baseline", "glomo", "untrained", "adjacent", "uniform"]) == [
        ("glomo", "baseline"), ("untrained", "baseline"), ("adjacent", "baseline"),
        ("uniform", "baseline"), ("glomo", "uniform"), ("glomo", "adjacent"),
        ("glomo", "untrained")]
    assert comparisons(["baseline"]) == []
    # the paper's ablations (Table 2) are read against the full predictor they ablate
    assert comparisons(["baseline", "glomo", "no-sparse", "no-unit-level", "uniform"]) == [
        ("glomo", "baseline"), ("no-sparse", "baseline"), ("no-unit-level", "baseline"),
        ("uniform", "baseline"), ("glomo", "uniform"), ("no-sparse", "glomo"),
        ("no-unit-level", "glomo")]
    assert comparisons(["glomo-rnn", "no-sequence"]) == [
        ("glomo-rnn", "baseline"), ("no-sequence", "baseline")]


def test_paired_difference_edge_cases():
    mean, low, high, n = paired_difference([0.9], [0.8])  # one pair: no interval
    assert mean == pytest.approx(0.1) and n == 1 and math.isnan(low) and math.isnan(high)
    with pytest.raises(ValueError, match="equal lengths"):
        paired_difference([1, 2], [1])
    with pytest.raises(ValueError, match="no pairs"):
        paired_difference([], [])


def keyword_texts(count, seed):
    """Reviews whose label is told by one keyword among filler words."""
    rng = random.Random(seed)
    texts, labels = [], []
    for k in range(count):
        label = k % 2
        words = [f"filler{rng.randrange(20)}" for _ in range(8)]
        words.insert(rng.randrange(len(words) + 1), "Great!" if label else "awful...")
        texts.append(" ".join(words))
        labels.append(label)
    return texts, labels


def test_tfidf_baseline_runs_and_chooses_c_on_validation():
    train, val, test = keyword_texts(60, 0), keyword_texts(20, 1), keyword_texts(20, 2)
    result = tfidf_baseline(train, val, test, max_length=16, cs=(0.3, 1.0, 3.0))
    assert result["C"] in (0.3, 1.0, 3.0)
    assert 0.0 <= result["test_acc"] <= 1.0 and result["test_acc"] > 0.9
    accs = dict((c, a) for c, a in result["val_by_C"])
    assert result["val_acc"] == accs[result["C"]] == max(accs.values())
    assert result["features"] > 0


def test_tfidf_baseline_sees_only_the_first_tokens():
    # the keyword comes after the cut: nothing is left to tell the classes apart
    def late(count, seed):
        texts, labels = keyword_texts(count, seed)
        return ["filler0 filler1 filler2 " + t for t in texts], labels

    result = tfidf_baseline(late(60, 0), late(20, 1), late(40, 2), max_length=3, cs=(1.0,))
    assert result["test_acc"] == 0.5


def test_search_accuracy_averages_the_search_seeds():
    import dataclasses

    from benchmarks.reproduce.imdb import REDUCED, search_accuracy
    # seed 0 alone prefers 2e-3; over seeds 0 and 1, 1e-3 is better
    runs = {"baseline/0/lr=0.001": {"val_acc": 0.78}, "baseline/0/lr=0.002": {"val_acc": 0.79},
            "baseline/1/lr=0.001": {"val_acc": 0.80}, "baseline/1/lr=0.002": {"val_acc": 0.75}}
    one = dataclasses.replace(REDUCED, lr_seeds=1)
    two = dataclasses.replace(REDUCED, lr_seeds=2)
    assert search_accuracy(runs, one, "baseline", 2e-3) == pytest.approx(0.79)
    assert search_accuracy(runs, two, "baseline", 1e-3) == pytest.approx(0.79)
    assert search_accuracy(runs, two, "baseline", 2e-3) == pytest.approx(0.77)
    assert max((1e-3, 2e-3), key=lambda lr: search_accuracy(runs, one, "baseline", lr)) == 2e-3
    assert max((1e-3, 2e-3), key=lambda lr: search_accuracy(runs, two, "baseline", lr)) == 1e-3
