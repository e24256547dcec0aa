"""The local-context input of the feature predictor (an extension of the paper)."""
import pytest
import torch
from reference import allowed_pairs, batch_vector

from glomo_pyg import FeaturePredictor, Glomo, LatentGraphs
from glomo_pyg.nn.feature_predictor import FeatureGraphEmitter

LENGTHS = [5, 1, 7, 3]


def reference_nearest(x, lengths, direction, k):
    """Unit by unit: the features of units j-1..j-k (forward) or j+1..j+k (backward) of
    the same sequence, concatenated nearest first, zero past the sequence's ends."""
    out, start = [], 0
    for n in lengths:
        for j in range(n):
            rows = []
            for d in range(1, k + 1):
                i = j - d if direction == "forward" else j + d
                rows.append(x[start + i] if 0 <= i < n else torch.zeros_like(x[0]))
            out.append(torch.cat(rows))
        start += n
    return torch.stack(out)


def random_graphs(direction, include_self, num_layers=2, heads=2):
    size = max(LENGTHS)
    ptr = torch.tensor([0] + LENGTHS).cumsum(0)
    scores = torch.rand(num_layers, len(LENGTHS), heads, size, size, dtype=torch.float64)
    dense = scores * allowed_pairs(LENGTHS, size, direction, include_self)
    dense = dense / dense.sum(-2, keepdim=True).clamp_min(1e-12)
    return LatentGraphs.from_dense(dense, direction=direction, ptr=ptr,
                                   include_self=include_self)


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("include_self", [False, True])
@pytest.mark.parametrize("k", [1, 3, 9])  # 9: longer than every sequence
def test_each_layer_adds_the_mapped_nearest_units(direction, include_self, k):
    torch.manual_seed(0)
    model = FeaturePredictor(in_channels=3, hidden_channels=8, num_layers=2, heads=2,
                             local_context=k).double()
    plain = FeaturePredictor(in_channels=3, hidden_channels=8, num_layers=2, heads=2).double()
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    assert not missing and sorted(unexpected) == ["local.0.weight", "local.1.weight"]
    assert model.local[0].weight.shape == (8, 8 * k)
    x = torch.randn(sum(LENGTHS), 3, dtype=torch.float64)
    batch = batch_vector(LENGTHS)
    graphs = random_graphs(direction, include_self)
    # untrained (zero maps): exactly the paper's network
    torch.testing.assert_close(model(x, graphs, batch)[0], plain(x, graphs, batch)[0])
    for lin in model.local:
        torch.nn.init.normal_(lin.weight)
    f = model.encoder.encode(x)
    for l, conv in enumerate(model.convs):
        f = conv.propagate_graphs(f, graphs, l) + \
            reference_nearest(f, LENGTHS, direction, k) @ model.local[l].weight.T
    got = model(x, graphs, batch)[0]
    torch.testing.assert_close(got, f)
    (g_got,) = torch.autograd.grad(got.sum(), model.local[1].weight)
    (g_ref,) = torch.autograd.grad(f.sum(), model.local[1].weight)
    torch.testing.assert_close(g_got, g_ref)


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_a_unit_reads_nothing_on_its_other_side(direction):
    """With the graphs set to zero, only the local maps mix units: the gradient of unit j
    with respect to every unit on its disallowed side (and beyond k) is zero."""
    torch.manual_seed(1)
    k = 2
    model = FeaturePredictor(in_channels=3, hidden_channels=4, num_layers=1, heads=1,
                             local_context=k).double()
    torch.nn.init.normal_(model.local[0].weight)
    lengths = [6, 4]  # a second sequence: nothing may cross between them
    ptr = torch.tensor([0, 6, 10])
    graphs = LatentGraphs.from_dense(torch.zeros(1, 2, 1, 6, 6, dtype=torch.float64),
                                     direction=direction, ptr=ptr)
    x = torch.randn(10, 3, dtype=torch.float64, requires_grad=True)
    out = model(x, graphs, batch_vector(lengths))[0]
    for j in range(10):
        start, end = (0, 6) if j < 6 else (6, 10)
        (grad,) = torch.autograd.grad(out[j].sum(), x, retain_graph=True)
        reached = {i for i in range(10) if grad[i].abs().sum() > 0}
        near = range(j - k, j + 1) if direction == "forward" else range(j, j + k + 1)
        assert reached == {i for i in near if start <= i < end}


def test_local_context_is_saved_in_the_config_and_reaches_the_decouple_ablation():
    fp = FeaturePredictor(num_tokens=10, hidden_channels=8, num_layers=2, heads=2,
                          local_context=2)
    assert fp.config()["local_context"] == 2
    rebuilt = FeaturePredictor.from_config(fp.config())
    assert rebuilt.local is not None and len(rebuilt.local) == 2
    assert all(float(lin.weight.detach().abs().sum()) == 0 for lin in rebuilt.local)
    model = Glomo.text(10, hidden_channels=8, num_layers=2, heads=2, cnn_layers=1,
                       decouple=False, local_context=1)
    emitter = model.feature_predictors["bw"]
    assert isinstance(emitter, FeatureGraphEmitter) and emitter.local is not None
    assert Glomo.text(10, hidden_channels=8, num_layers=2, heads=2, cnn_layers=1,
                      local_context=3).feature_predictors["fw"].local_context == 3
    assert Glomo.text(10, hidden_channels=8, num_layers=1, heads=2).feature_predictors[
        "fw"].local is None  # off by default


@pytest.mark.parametrize("bad,error", [(-1, ValueError), (65, ValueError), (1.5, TypeError),
                                       (True, TypeError), ("2", TypeError), (None, TypeError)])
def test_bad_local_context_is_named(bad, error):
    with pytest.raises(error, match="local_context must be an integer"):
        FeaturePredictor(num_tokens=10, hidden_channels=8, num_layers=1, heads=2,
                         local_context=bad)


def test_numpy_values_build_the_same_network():
    import numpy as np

    fp = FeaturePredictor(num_tokens=10, hidden_channels=8, num_layers=1, heads=2,
                          local_context=np.int64(2), pooled_context=np.True_)
    assert fp.local_context == 2 and type(fp.local_context) is int
    assert fp.local[0].weight.shape == (8, 16) and fp.pooled is not None
