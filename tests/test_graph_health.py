"""Per-head graph health: hand-computed values, the dead-head warning, the logged fields."""
import math
import warnings

import pytest
import torch

from glomo_pyg import LatentGraphs
from glomo_pyg.analysis import graph_health
from glomo_pyg.training.graph_statistics import GraphStatisticsCallback


def hand_graphs(direction="forward"):
    """One sequence of 4 units, 1 layer, 2 heads (forward: sources before targets).

    head 0: every target j <- j - 1 with weight 1 (a previous-unit head);
    head 1: only target 3 has edges, from 0 and 1 with 0.5 each (a dead head).
    """
    src = [0, 1, 2, 0, 1]
    tgt = [1, 2, 3, 3, 3]
    weight = [1.0, 1.0, 1.0, 0.5, 0.5]
    head = [0, 0, 0, 1, 1]
    if direction == "backward":  # mirror: position p -> 3 - p
        src, tgt = [3 - s for s in src], [3 - t for t in tgt]
        order = sorted(range(5), key=lambda e: (head[e], tgt[e], src[e]))
        src, tgt, weight, head = ([v[e] for e in order] for v in (src, tgt, weight, head))
    return LatentGraphs([torch.tensor([src, tgt])], [torch.tensor(weight)], [torch.tensor(head)],
                        num_heads=2, direction=direction, ptr=torch.tensor([0, 4]))


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_health_against_hand_computed_values(direction):
    h = graph_health(hand_graphs(direction))
    torch.testing.assert_close(h.density, torch.tensor([[3 / 6, 2 / 6]]))
    torch.testing.assert_close(h.empty, torch.tensor([[0.0, 2 / 3]]))
    torch.testing.assert_close(h.adjacent, torch.tensor([[1.0, 0.0]]))
    torch.testing.assert_close(h.distance, torch.tensor([[1.0, 2.5]]))  # head 1: 3*.5 + 2*.5
    # entropy over targets with >= 2 allowed sources: head 0 one edge each (0); head 1's
    # only column with edges splits 0.5 / 0.5 over 3 allowed sources: log 2 / log 3
    torch.testing.assert_close(h.entropy, torch.tensor([[0.0, math.log(2) / math.log(3)]]))
    # uniform: targets with 1, 2, 3 sources -> adjacent (1 + 1/2 + 1/3) / 3;
    # distance (1 + 1.5 + 2) / 3
    assert h.uniform_adjacent == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
    assert h.uniform_distance == pytest.approx(1.5)
    assert h.dead_heads() == [(0, 1)]
    assert h.dead_heads(share=0.7) == []


def test_uniform_graphs_match_their_own_reference():
    ptr = torch.tensor([0, 5, 12, 13])
    for direction in ("forward", "backward"):
        for include_self in (False, True):
            g = LatentGraphs.uniform(ptr, num_layers=1, num_heads=2, direction=direction,
                                     include_self=include_self)
            h = graph_health(g)
            torch.testing.assert_close(h.adjacent, torch.full((1, 2), h.uniform_adjacent))
            torch.testing.assert_close(h.distance, torch.full((1, 2), h.uniform_distance))
            torch.testing.assert_close(h.entropy, torch.ones(1, 2))
            assert h.dead_heads() == [] and float(h.empty.max()) == pytest.approx(0.0)


def test_dead_head_warning_fires_once_and_only_for_dead_heads():
    callback = GraphStatisticsCallback(every_n_steps=10)
    health = graph_health(hand_graphs())
    with pytest.warns(RuntimeWarning, match=r"graph forward/layer0/head1 is dead: 67%"):
        assert len(callback.check_health("forward", health, step=10)) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # still dead: no second warning
        assert callback.check_health("forward", health, step=20) == []
        healthy = LatentGraphs.uniform(torch.tensor([0, 4]), num_layers=1, num_heads=2,
                                       direction="forward")
        assert callback.check_health("backward", graph_health(healthy), step=20) == []
    # a recovery is said too: what the progress bar's dead count shows agrees with the
    # warnings (it drops to 0 here)
    with pytest.warns(RuntimeWarning, match=r"^step 30: graph forward/layer0/head1, "
                                            r"dead since step 10, recovered: 0%") as caught:
        assert len(callback.check_health("forward", graph_health(healthy), step=30)) == 1
    assert len(caught) == 1
    with pytest.warns(RuntimeWarning, match="is dead"):  # died again after recovering
        callback.check_health("forward", health, step=40)
    with pytest.raises(ValueError):
        GraphStatisticsCallback(every_n_steps=0)
    with pytest.raises(ValueError):
        GraphStatisticsCallback(dead_share=1.5)


def test_callback_fills_the_progress_bar_and_warns_about_a_dead_model_head():
    from types import SimpleNamespace

    from glomo_pyg import Glomo

    torch.manual_seed(0)
    model = Glomo.text(20, hidden_channels=16, num_layers=2, heads=2, cnn_layers=1)
    with torch.no_grad():
        model.graph_predictors["fw"].scorer.bias[1] = -100.0  # forward layer 1: dead
    lengths = torch.tensor([9, 6])
    batch = SimpleNamespace(x=torch.randint(0, 20, (15,)),
                            batch=torch.repeat_interleave(torch.arange(2), lengths))
    bar, logged = {}, []
    logger = SimpleNamespace(log_metrics=lambda metrics, step: logged.append((step, metrics)))
    trainer = SimpleNamespace(global_step=4, is_global_zero=True, loggers=[logger],
                              progress_bar_callback=object(), progress_bar_metrics=bar)
    callback = GraphStatisticsCallback(every_n_steps=2)
    with pytest.warns(RuntimeWarning, match=r"graph forward/layer1/head[01] is dead"):
        callback.on_train_batch_end(trainer, SimpleNamespace(model=model), None, batch, 0)
    assert bar["dead"] == 2 and 0 <= bar["adj"] <= 1
    forward = [m for _, m in logged if "health/forward/dead_heads" in m][0]
    assert forward["health/forward/dead_heads"] == 2
    assert forward["health/forward/layer1/head0/empty"] == pytest.approx(1.0)
    assert [h["direction"] for h in callback.history] == ["forward", "backward"]
    trainer.global_step = 5  # not a logging step: nothing happens
    callback.on_train_batch_end(trainer, SimpleNamespace(model=model), None, batch, 0)
    assert len(callback.history) == 2


def test_callback_reads_only_the_leading_whole_sequences_up_to_max_units():
    from types import SimpleNamespace

    from glomo_pyg import Glomo

    model = Glomo.text(20, hidden_channels=16, num_layers=1, heads=2, cnn_layers=1)
    seen = []
    graphs = model.graphs
    model.graphs = lambda x, index: (seen.append(index.clone()), graphs(x, index))[1]
    lengths = torch.tensor([5, 6, 7])
    batch = SimpleNamespace(x=torch.randint(0, 20, (18,)),
                            batch=torch.repeat_interleave(torch.arange(3), lengths))
    logger = SimpleNamespace(log_metrics=lambda metrics, step: None)
    trainer = SimpleNamespace(global_step=0, is_global_zero=True, loggers=[logger],
                              progress_bar_callback=None, progress_bar_metrics={})
    GraphStatisticsCallback(every_n_steps=1, max_units=8).on_train_batch_end(
        trainer, SimpleNamespace(model=model), None, batch, 0)
    assert seen[-1].tolist() == [0] * 5 + [1] * 6  # unit 8 lies in sequence 1: keep 0 and 1
    GraphStatisticsCallback(every_n_steps=1, max_units=3).on_train_batch_end(
        trainer, SimpleNamespace(model=model), None, batch, 0)
    assert seen[-1].tolist() == [0] * 5  # at least one whole sequence
    with pytest.raises(ValueError, match="max_units"):
        GraphStatisticsCallback(max_units=1)


def test_a_resumed_run_remembers_its_dead_heads():
    callback = GraphStatisticsCallback(every_n_steps=10)
    health = graph_health(hand_graphs())
    with pytest.warns(RuntimeWarning, match="is dead"):
        callback.check_health("forward", health, step=10)
    resumed = GraphStatisticsCallback(every_n_steps=10)  # as a checkpoint restores it
    resumed.load_state_dict(torch.load(_saved(callback.state_dict()), weights_only=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # still dead: not warned about again
        assert resumed.check_health("forward", health, step=20) == []
    healthy = LatentGraphs.uniform(torch.tensor([0, 4]), num_layers=1, num_heads=2,
                                   direction="forward")
    with pytest.warns(RuntimeWarning, match="dead since step 10, recovered"):
        resumed.check_health("forward", graph_health(healthy), step=30)


def _saved(state):
    import io
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer
