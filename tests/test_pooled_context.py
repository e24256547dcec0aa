"""The pooled-context input of the feature predictor (an extension of the paper)."""
import pytest
import torch
from reference import batch_vector

from glomo_pyg import FeaturePredictor, Glomo, LatentGraphs
from glomo_pyg.nn.feature_predictor import FeatureGraphEmitter

LENGTHS = [5, 1, 7, 3]


def reference_context_mean(x, lengths, direction, include_self):
    """Mean of ``x`` over each unit's allowed sources, unit by unit (0 without any)."""
    out, start = [], 0
    for n in lengths:
        for j in range(n):
            if direction == "forward":
                sources = range(0, j + 1 if include_self else j)
            else:
                sources = range(j if include_self else j + 1, n)
            rows = [x[start + i] for i in sources]
            out.append(torch.stack(rows).mean(0) if rows else torch.zeros_like(x[0]))
        start += n
    return torch.stack(out)


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("include_self", [False, True])
def test_each_layer_adds_the_mapped_mean_over_allowed_sources(direction, include_self):
    torch.manual_seed(0)
    n = sum(LENGTHS)
    model = FeaturePredictor(in_channels=3, hidden_channels=8, num_layers=2, heads=2,
                             pooled_context=True).double()
    plain = FeaturePredictor(in_channels=3, hidden_channels=8, num_layers=2, heads=2).double()
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    assert not missing and sorted(unexpected) == ["pooled.0.weight", "pooled.1.weight"]
    x = torch.randn(n, 3, dtype=torch.float64)
    batch = batch_vector(LENGTHS)
    ptr = torch.tensor([0] + LENGTHS).cumsum(0)
    scores = torch.rand(2, len(LENGTHS), 2, 7, 7, dtype=torch.float64)
    valid = torch.arange(7).view(1, -1) < torch.tensor(LENGTHS).view(-1, 1)
    i, j = torch.arange(7).view(-1, 1), torch.arange(7).view(1, -1)
    order = (i <= j if include_self else i < j) if direction == "forward" else \
        (i >= j if include_self else i > j)
    mask = order & valid[:, None, :, None] & valid[:, None, None, :]
    dense = scores * mask
    dense = dense / dense.sum(-2, keepdim=True).clamp_min(1e-12)
    graphs = LatentGraphs.from_dense(dense, direction=direction, ptr=ptr,
                                     include_self=include_self)
    # untrained (zero maps): exactly the paper's network
    torch.testing.assert_close(model(x, graphs, batch)[0], plain(x, graphs, batch)[0])
    for lin in model.pooled:
        torch.nn.init.normal_(lin.weight)
    # reference: layer by layer, the plain update plus W_l times the context mean
    f = model.encoder.encode(x)
    for l, conv in enumerate(model.convs):
        f = conv.propagate_graphs(f, graphs, l) + \
            reference_context_mean(f, LENGTHS, direction, include_self) @ model.pooled[l].weight.T
    got = model(x, graphs, batch)[0]
    torch.testing.assert_close(got, f)
    (g_got,) = torch.autograd.grad(got.sum(), model.pooled[0].weight)
    (g_ref,) = torch.autograd.grad(f.sum(), model.pooled[0].weight)
    torch.testing.assert_close(g_got, g_ref)


def test_pooled_context_is_saved_in_the_config_and_reaches_the_decouple_ablation():
    fp = FeaturePredictor(num_tokens=10, hidden_channels=8, num_layers=2, heads=2,
                          pooled_context=True)
    assert fp.config()["pooled_context"] is True
    rebuilt = FeaturePredictor.from_config(fp.config())
    assert rebuilt.pooled is not None and len(rebuilt.pooled) == 2
    assert all(float(lin.weight.detach().abs().sum()) == 0 for lin in rebuilt.pooled)
    model = Glomo.text(10, hidden_channels=8, num_layers=2, heads=2, cnn_layers=1,
                       decouple=False, pooled_context=True)
    emitter = model.feature_predictors["fw"]
    assert isinstance(emitter, FeatureGraphEmitter) and emitter.pooled is not None
    assert Glomo.text(10, hidden_channels=8, num_layers=1, heads=2).feature_predictors[
        "fw"].pooled is None  # off by default
