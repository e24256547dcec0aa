"""Column entropy of latent graphs and the sharpness (entropy) penalty of pretraining."""
import math

import pytest
import torch
from reference import allowed_pairs, batch_vector, dense_graph

from glomo_pyg import Glomo, LatentGraphs


def reference_entropy(graph, lengths, direction, include_self, normalized):
    """``[H, N]`` entropies of each target's column of ``[B, H, T(i), T(j)]`` graphs,
    written out target by target; NaN without edges or with < 2 allowed sources."""
    rows = []
    for b, n in enumerate(lengths):
        for j in range(n):
            if direction == "forward":
                allowed = j + int(include_self)
            else:
                allowed = n - j - 1 + int(include_self)
            col = graph[b, :, :n, j]  # [H, sources]
            plogp = torch.where(col > 0, col * col.clamp_min(1e-300).log(), col.new_zeros(()))
            h = -plogp.sum(1)
            if normalized and allowed >= 2:
                h = h / math.log(allowed)
            undefined = (col.sum(1) == 0) | (allowed < 2)
            rows.append(torch.where(undefined, h.new_full((), float("nan")), h))
    return torch.stack(rows, 1)


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("include_self", [False, True])
@pytest.mark.parametrize("normalized", [True, False])
def test_column_entropy_equals_the_dense_reference(direction, include_self, normalized):
    torch.manual_seed(0)
    lengths, heads = [6, 1, 4, 2], 3
    scores = torch.randn(2, len(lengths), heads, 6, 6, dtype=torch.float64, requires_grad=True)
    allowed = allowed_pairs(lengths, 6, direction, include_self)
    graphs = [dense_graph(scores[l], allowed) for l in range(2)]
    ptr = torch.tensor([0] + lengths).cumsum(0)
    dense = LatentGraphs.from_dense(graphs, direction=direction, ptr=ptr,
                                    include_self=include_self)
    want = torch.stack([reference_entropy(g, lengths, direction, include_self, normalized)
                        for g in graphs])
    defined = ~want.isnan()
    assert defined.any() and (~defined).any()  # some columns are empty (ReLU^2 pruning)
    probe = torch.randn_like(want)
    (want_grad,) = torch.autograd.grad((want[defined] * probe[defined]).sum(), scores,
                                    retain_graph=True)
    for layout in (dense, dense.to_sparse()):
        got = layout.column_entropy(normalized)
        assert got.shape == (2, heads, sum(lengths))
        torch.testing.assert_close(got, want, equal_nan=True)
        (got_grad,) = torch.autograd.grad((got[defined] * probe[defined]).sum(), scores,
                                       retain_graph=True)
        assert torch.isfinite(got_grad).all()
        torch.testing.assert_close(got_grad, want_grad)


def test_column_entropy_of_uniform_and_one_hot_graphs():
    ptr = torch.tensor([0, 5, 6, 9])
    uniform = LatentGraphs.uniform(ptr, num_layers=2, num_heads=2, direction="forward")
    got = uniform.column_entropy()
    undefined = torch.tensor([1, 1, 0, 0, 0, 1, 1, 1, 0], dtype=torch.bool)  # < 2 sources
    assert got.isnan().equal(undefined.expand(2, 2, -1))
    torch.testing.assert_close(got[:, :, ~undefined], torch.ones(2, 2, 4))
    raw = uniform.column_entropy(normalized=False)[0, 0]
    torch.testing.assert_close(raw[~undefined], torch.tensor([2, 3, 4, 2.]).log())
    # each target attends only to its previous unit: zero entropy
    src, tgt = torch.tensor([0, 1, 2, 3, 6, 7]), torch.tensor([1, 2, 3, 4, 7, 8])
    one_hot = LatentGraphs([torch.stack([src, tgt])], [torch.ones(6)],
                           [torch.zeros(6, dtype=torch.long)], num_heads=1,
                           direction="forward", ptr=ptr)
    got = one_hot.column_entropy()[0, 0]
    torch.testing.assert_close(got[~undefined], torch.zeros(4))


def _model(entropy_penalty, **kw):
    torch.manual_seed(0)
    return Glomo.text(20, hidden_channels=16, num_layers=2, heads=2, cnn_layers=1,
                      entropy_penalty=entropy_penalty, position="relative", **kw)


def test_entropy_penalty_adds_the_mean_column_entropy_while_training_only():
    lengths = [9, 6, 1]
    x, batch = torch.randint(0, 20, (sum(lengths),), generator=torch.Generator().manual_seed(1)), \
        batch_vector(lengths)
    model, plain = _model(0.5), _model(0.0)
    plain.load_state_dict(model.state_dict())
    torch.manual_seed(2)  # same sampled positions in both
    out = model(x, batch)
    torch.manual_seed(2)
    ref = plain(x, batch)
    entropies = []
    for d in ("forward", "backward"):
        graphs = model.graphs(x, batch).forward if d == "forward" else \
            model.graphs(x, batch).backward
        e = graphs.column_entropy()
        entropies.append(e[~e.isnan()].mean())
        torch.testing.assert_close(out.metrics[f"{d}/column_entropy"], entropies[-1].detach())
        assert 0 < float(entropies[-1].detach()) <= 1
    torch.testing.assert_close(out.loss, ref.loss + 0.5 * torch.stack(entropies).mean())
    assert "forward/column_entropy" not in ref.metrics
    # the penalty's gradient reaches g; f's does not change through it
    out.loss.backward()
    assert model.graph_predictors["fw"].scorer.key[0].weight.grad.abs().sum() > 0
    model.eval()
    evaluated = model(x, batch)
    assert "forward/column_entropy" not in evaluated.metrics  # evaluation: the objective alone


def test_entropy_penalty_on_softmax_graphs_and_images():
    lengths = [7, 5]
    x, batch = torch.randint(0, 20, (sum(lengths),)), batch_vector(lengths)
    out = _model(0.1, sparse=False)(x, batch)
    assert float(out.metrics["forward/column_entropy"]) > 0
    out.loss.backward()
    model = Glomo.image(4, 4, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1,
                        num_positions=4, entropy_penalty=0.1)
    assert model.entropy_penalty == 0.1


@pytest.mark.parametrize("value", [-0.1, float("nan"), float("inf")])
def test_entropy_penalty_bad_settings(value):
    with pytest.raises(ValueError, match="entropy_penalty"):
        Glomo.text(20, hidden_channels=16, num_layers=1, heads=2, entropy_penalty=value)
