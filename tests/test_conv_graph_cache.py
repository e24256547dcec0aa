"""GlomoConv validates and indexes a graph once (PyG's pattern: the same edge_index every
step) and checks it again whenever it could have changed; the results never depend on it."""
import copy
import pickle

import pytest
import torch

import glomo_pyg.nn.conv as conv_module
from glomo_pyg import GlomoConv


def graph(seed=0, n=12, edges=40, heads=2, shuffled=True):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, edges), generator=g)
    eh = torch.randint(0, heads, (edges,), generator=g)
    if not shuffled:  # (head, target) order
        order = torch.argsort(eh * n + ei[1])
        ei, eh = ei[:, order], eh[order]
    return ei, torch.rand(edges, generator=g), eh, torch.randn(n, 8, generator=g)


@pytest.fixture
def builds(monkeypatch):
    """Counts the indexes GlomoConv builds (head-blocked the first time it sees a graph,
    interleaved the second, then none)."""
    count = [0]
    for name in ("head_blocked_index", "interleaved_index"):
        def counting(*args, _real=getattr(conv_module, name), **kwargs):
            count[0] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(conv_module, name, counting)
    return count


def test_the_same_graph_is_indexed_once_and_gives_the_same_numbers(builds):
    ei, w, eh, x = graph()
    conv = GlomoConv(8, heads=2)
    first = conv(x, ei, w, eh)
    for _ in range(3):  # (the second call switches to the copy-free index: same numbers)
        torch.testing.assert_close(conv(x, ei, w, eh), first)
    assert builds[0] == 2
    x2 = torch.randn_like(x)  # new features: nothing about the graph changed
    torch.testing.assert_close(conv(x2, ei, w, eh), conv(x2, ei.clone(), w, eh))
    assert builds[0] == 3  # (the clone: a new tensor, indexed again)


@pytest.mark.parametrize("shuffled", [True, False])
def test_values_and_gradients_equal_a_fresh_layer_with_new_weights_each_call(shuffled):
    """The sort permutation is cached, the weights are not: new weights on the same
    edges (learned, or a new batch) reach the product, with their gradients."""
    ei, w, eh, x = graph(shuffled=shuffled)
    conv = GlomoConv(8, heads=2, update="gru")
    conv(x, ei, w, eh)  # seen
    for step in range(3):
        w_step = torch.rand(w.shape, generator=torch.Generator().manual_seed(step))
        a, b = w_step.clone().requires_grad_(), w_step.clone().requires_grad_()
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        fresh = copy.deepcopy(conv)
        got = conv(xa, ei, a, eh)
        want = fresh(xb, ei.clone(), b, eh.clone())
        probe = torch.randn_like(got)
        ga = torch.autograd.grad((got * probe).sum(), (xa, a))
        gb = torch.autograd.grad((want * probe).sum(), (xb, b))
        torch.testing.assert_close(got, want)
        for u, v in zip(ga, gb):
            torch.testing.assert_close(u, v)


def test_an_in_place_edit_of_a_seen_graph_is_checked_again():
    ei, w, eh, x = graph()
    conv = GlomoConv(8, heads=2)
    conv(x, ei, w, eh)
    ei[1, 3] = 99  # torch bumps the version counter
    with pytest.raises(ValueError, match="edge_index refers to nodes outside"):
        conv(x, ei, w, eh)
    ei[1, 3] = 0
    eh[0] = 5
    with pytest.raises(ValueError, match="edge_head values must lie in"):
        conv(x, ei, w, eh)
    eh[0] = 0
    conv(x, ei, w, eh)
    w[2] = float("nan")
    with pytest.raises(ValueError, match="edge_weight contains NaN"):
        conv(x, ei, w, eh)
    w[2] = 0.5
    with pytest.raises(ValueError, match="outside"):  # another node count: checked again
        conv(x[:5], ei, w, eh)


def test_inference_mode_tensors_are_checked_every_call(builds):
    with torch.inference_mode():
        ei, w, eh, x = graph()
        conv = GlomoConv(8, heads=2)
        conv(x, ei, w, eh)
        conv(x, ei, w, eh)
        assert builds[0] == 2  # no version counter: nothing remembered
        bad = ei.clone()
        bad[0, 0] = -1
        with pytest.raises(ValueError, match="outside"):
            conv(x, bad, w, eh)


def test_a_layer_that_saw_a_graph_still_copies_and_pickles():
    ei, w, eh, x = graph()
    conv = GlomoConv(8, heads=2)
    conv(x, ei, w, eh)
    for twin in (copy.deepcopy(conv), pickle.loads(pickle.dumps(conv))):
        torch.testing.assert_close(twin(x, ei, w, eh), conv(x, ei, w, eh))


def test_feature_values_are_not_checked_as_in_pyg_layers():
    """NaN in x propagates along the edges, as in PyG's layers (no device sync for it)."""
    ei, w, eh, x = graph()
    x[0, 0] = float("nan")
    out = GlomoConv(8, heads=2)(x, ei, w, eh)
    reached = ei[1][(ei[0] == 0) & (eh == 0)]
    assert out[reached, 0].isnan().all() and not out[:, 4:].isnan().any()


def test_one_graph_for_all_channels_is_remembered_too(builds):
    ei, w, _, x = graph(heads=1)
    conv = GlomoConv(8, heads=2)
    out = conv(x, ei, w)
    for _ in range(2):
        torch.testing.assert_close(conv(x, ei, w), out)
    assert builds[0] == 2
    torch.testing.assert_close(conv(x, ei), conv(x, ei, torch.ones_like(w)))


def test_weights_reordered_without_gradients_never_serve_a_call_that_needs_them():
    ei, w, eh, x = graph()  # unsorted: the weights are permuted into the index's order
    conv = GlomoConv(8, heads=2)
    w = w.requires_grad_()
    with torch.no_grad():
        conv(x, ei, w, eh)  # remembered (no autograd graph hangs on the reordering)
        conv(x, ei, w, eh)
    out = conv(x, ei, w, eh)  # gradients on: the weights are reordered again
    (grad,) = torch.autograd.grad(out.sum(), w)
    want = torch.autograd.grad(GlomoConv(8, heads=2)(x, ei.clone(), w, eh.clone()).sum(), w)[0]
    torch.testing.assert_close(grad, want)
    assert grad.abs().sum() > 0
