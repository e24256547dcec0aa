"""Column maxima of the scores and the keep-alive penalty against dead heads."""
import pytest
import torch
from reference import allowed_pairs, batch_vector

from glomo_pyg import Glomo
from glomo_pyg.kernels import column_max_scores


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("include_self", [False, True])
@pytest.mark.parametrize("block_size", [1 << 22, 7, 30])
def test_column_max_equals_the_dense_reference(direction, include_self, block_size):
    torch.manual_seed(0)
    lengths = [5, 1, 3]
    k = torch.randn(3, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    q = torch.randn(3, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    got = column_max_scores(k, q, torch.tensor(lengths), direction=direction,
                            include_self=include_self, block_size=block_size)
    scores = k @ q.transpose(-1, -2)  # [B, H, i, j]
    allowed = allowed_pairs(lengths, 5, direction, include_self)
    want = scores.masked_fill(~allowed, float("-inf")).amax(2)
    torch.testing.assert_close(got, want)
    finite = torch.isfinite(want)
    (gk, gq) = torch.autograd.grad(got[finite].sum(), (k, q))
    (rk, rq) = torch.autograd.grad(want[finite].sum(), (k, q))
    torch.testing.assert_close(gk, rk)
    torch.testing.assert_close(gq, rq)


def test_column_max_keeps_nothing_of_size_t_squared_for_the_backward_pass():
    # autograd used to keep every [B, H, tile, T] score tile for amax's backward: O(B H T^2)
    b, h, t, d = 2, 3, 64, 4
    k = torch.randn(b, h, t, d, requires_grad=True)
    q = torch.randn(b, h, t, d, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x.numel()) or x,
                                                  lambda x: x):
        out = column_max_scores(k, q, torch.tensor([t, 40]))
    assert saved and max(saved) <= b * h * t * d  # keys, queries and the arg-max sources
    with torch.no_grad():
        plain = column_max_scores(k, q, torch.tensor([t, 40]))
    torch.testing.assert_close(out.detach(), plain)
    assert not plain.requires_grad


def test_column_max_with_tied_sources_sends_the_gradient_to_the_first():
    # identical keys tie every allowed source; the value is the maximum exactly, and the
    # gradient (a subgradient of max) goes to the first tied source, not split as amax does
    k = torch.ones(1, 1, 4, 2, dtype=torch.float64, requires_grad=True)
    q = torch.full((1, 1, 4, 2), 0.5, dtype=torch.float64, requires_grad=True)
    out = column_max_scores(k, q, torch.tensor([4]))
    assert torch.equal(out.detach()[0, 0], torch.tensor([-float("inf"), 1.0, 1.0, 1.0],
                                                        dtype=torch.float64))
    (gk,) = torch.autograd.grad(out[0, 0, 1:].sum(), k)
    torch.testing.assert_close(gk[0, 0, :, 0], torch.tensor([1.5, 0.0, 0.0, 0.0],
                                                            dtype=torch.float64))


def test_keep_alive_revives_a_dead_head_and_is_off_by_default():
    torch.manual_seed(0)
    lengths = [9, 6]
    x, batch = torch.randint(0, 20, (sum(lengths),)), batch_vector(lengths)
    model = Glomo.text(20, hidden_channels=16, num_layers=2, heads=2, cnn_layers=1,
                  bidirectional=False, keep_alive=1.0, keep_alive_margin=0.5)
    scorer = model.graph_predictors["fw"].scorer
    with torch.no_grad():  # kill every head of layer 0: all scores far below zero
        scorer.bias[0] = -100.0
    out = model(x, batch)
    assert float(out.metrics["forward/empty_columns"]) > 0.45
    assert float(out.metrics["forward/keep_alive"]) > 0
    out.loss.backward()
    # the penalty revives through each head's own parameters, not the shared bias
    assert scorer.key[0].weight.grad.abs().sum() > 0
    assert scorer.query[0].weight.grad.abs().sum() > 0
    assert scorer.bias.grad[0] == 0
    # without the penalty a dead layer gets no gradient at all
    plain = Glomo.text(20, hidden_channels=16, num_layers=2, heads=2, cnn_layers=1,
                  bidirectional=False)
    plain.load_state_dict(model.state_dict())
    result = plain(x, batch)
    assert "forward/keep_alive" not in result.metrics
    result.loss.backward()
    dead = plain.graph_predictors["fw"].scorer
    grad = dead.key[0].weight.grad  # no gradient at all, or exactly zero
    assert (grad is None or grad.abs().sum() == 0) and dead.bias.grad[0] == 0
    model.eval()  # evaluation loss is the objective alone
    assert "forward/keep_alive" not in model(x, batch).metrics


@pytest.mark.parametrize("kw", [dict(keep_alive=-1.0), dict(keep_alive=float("nan")),
                                dict(keep_alive=1.0, keep_alive_margin=0.0),
                                dict(keep_alive=1.0, decouple=False),
                                dict(keep_alive=1.0, sparse=False)])
def test_keep_alive_bad_settings(kw):
    with pytest.raises(ValueError, match="keep_alive"):
        Glomo.text(20, hidden_channels=16, num_layers=1, heads=2, **kw)
