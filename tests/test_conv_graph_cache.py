"""GlomoConv checks and indexes a user's graph at each call, or once where the graph says it
is reused: ``cached=True`` (PyG's ``GCNConv(cached=True)``) or an ``EdgeIndex``, which keeps
what was checked of it. No module-level registry: the results never depend on it."""
import copy
import pickle

import pytest
import torch
from host_syncs import count_host_syncs, total
from torch_geometric import EdgeIndex

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


def edge_index_of(ei, n=12):
    return EdgeIndex(ei, sparse_size=(n, n))


@pytest.fixture
def builds(monkeypatch):
    """Counts the indexes GlomoConv builds (head-blocked for a graph seen once,
    interleaved for one that will be reused)."""
    count = [0]
    for name in ("head_blocked_index", "interleaved_index"):
        # the default binds this iteration's function, on purpose
        def counting(*args, _real=getattr(conv_module, name), **kwargs):  # noqa: B008
            count[0] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(conv_module, name, counting)
    return count


def test_the_module_keeps_no_registry_of_graphs():
    assert not any(isinstance(v, type(conv_module.weakref.WeakKeyDictionary()))
                   for v in vars(conv_module).values())


def test_plain_tensors_are_checked_and_indexed_at_every_call(builds):
    ei, w, eh, x = graph()
    conv = GlomoConv(8, heads=2)
    first = conv(x, ei, w, eh)
    for _ in range(2):
        torch.testing.assert_close(conv(x, ei, w, eh), first)
    assert builds[0] == 3
    with count_host_syncs() as counts:
        conv(x, ei, w, eh)
    assert 1 <= total(counts) <= 2, counts  # the value check (and the sortedness test)


@pytest.mark.parametrize("kind", ["plain", "edge_index", "shared", "sparse"])
def test_cached_layers_index_once_and_later_calls_do_not_sync(builds, kind):
    ei, w, eh, x = graph()
    reference = GlomoConv(8, heads=2, update="gru")
    conv = copy.deepcopy(reference)
    conv.cached = True
    if kind == "sparse":
        args = (torch.sparse_coo_tensor(torch.stack([eh, ei[1], ei[0]]), w,
                                        (2, 12, 12)).coalesce(),)
    elif kind == "shared":
        args = (ei, w)
    else:
        args = (edge_index_of(ei) if kind == "edge_index" else ei, w, eh)
    want = reference(x, *args)
    torch.testing.assert_close(conv(x, *args), want)
    built = builds[0]
    with count_host_syncs() as counts:
        again = conv(x, *args)
    assert total(counts) == 0, counts
    assert builds[0] == built
    torch.testing.assert_close(again, want)


def test_a_cached_layer_takes_new_weights_with_their_gradients():
    ei, w, eh, x = graph()
    conv = GlomoConv(8, heads=2, update="gru", cached=True)
    with torch.no_grad():
        conv(x, ei, w, eh)  # cached without gradients
    fresh = GlomoConv(8, heads=2, update="gru")
    fresh.load_state_dict(conv.state_dict())
    for step in range(2):
        w_step = torch.rand(w.shape, generator=torch.Generator().manual_seed(step))
        a, b = w_step.clone().requires_grad_(), w_step.clone().requires_grad_()
        got, want = conv(x, ei, a, eh), fresh(x, ei.clone(), b, eh.clone())
        torch.testing.assert_close(got, want)
        probe = torch.randn_like(got)
        ga, = torch.autograd.grad((got * probe).sum(), a)
        gb, = torch.autograd.grad((want * probe).sum(), b)
        torch.testing.assert_close(ga, gb)
        assert ga.abs().sum() > 0
    torch.testing.assert_close(conv(x, ei, None, eh), fresh(x, ei, None, eh))


def test_a_cached_layer_refuses_a_graph_of_another_size_and_forgets_on_reset():
    ei, w, eh, x = graph()
    conv = GlomoConv(8, heads=2, cached=True)
    conv(x, ei, w, eh)
    with pytest.raises(ValueError, match="cached=True: .* over 12 nodes; got 5 nodes"):
        conv(x[:5], ei, w, eh)
    with pytest.raises(ValueError, match="cached=True: edge_weight must be .* 40 edges"):
        conv(x, ei, w[:3], eh)
    other, w2, eh2, _ = graph(seed=1)
    conv.reset_parameters()  # forgets the graph: the next one is checked and kept
    torch.testing.assert_close(conv(x, other, w2, eh2),
                               GlomoConv(8, heads=2)(x, other, w2, eh2))
    bad = other.clone()
    bad[0, 0] = 99
    conv.reset_parameters()
    with pytest.raises(ValueError, match="edge_index refers to nodes outside"):
        conv(x, bad, w2, eh2)


def test_an_edge_index_keeps_what_was_checked_and_rechecks_new_or_edited_values(builds):
    ei, w, eh, x = graph()
    index = edge_index_of(ei)
    conv = GlomoConv(8, heads=2)
    first = conv(x, index, w, eh)
    with count_host_syncs() as counts:
        again = conv(x, index, w, eh)
    assert total(counts) == 0, counts
    torch.testing.assert_close(again, first)
    assert builds[0] == 1
    w2 = torch.rand_like(w)  # other weights: checked (and indexed) again
    torch.testing.assert_close(conv(x, index, w2, eh), GlomoConv(8, heads=2)(x, ei, w2, eh))
    w2[2] = float("nan")  # an edit in place bumps the version: checked again
    with pytest.raises(ValueError, match="edge_weight contains NaN"):
        conv(x, index, w2, eh)
    bad_heads = eh.clone()
    bad_heads[0] = 5
    with pytest.raises(ValueError, match="edge_head values must lie in"):
        conv(x, index, w, bad_heads)
    with pytest.raises(ValueError, match="outside"):  # another node count: checked again
        conv(x[:5], index, w, eh)


def test_an_in_place_edit_of_a_plain_graph_is_always_caught():
    ei, w, eh, x = graph()
    conv = GlomoConv(8, heads=2)
    conv(x, ei, w, eh)
    ei[1, 3] = 99
    with pytest.raises(ValueError, match="edge_index refers to nodes outside"):
        conv(x, ei, w, eh)
    ei[1, 3] = 0
    eh[0] = 5
    with pytest.raises(ValueError, match="edge_head values must lie in"):
        conv(x, ei, w, eh)
    eh[0] = 0
    w[2] = float("nan")
    with pytest.raises(ValueError, match="edge_weight contains NaN"):
        conv(x, ei, w, eh)


def test_inference_mode_values_are_not_kept_on_an_edge_index(builds):
    with torch.inference_mode():
        ei, w, eh, x = graph()
        index = edge_index_of(ei)
        conv = GlomoConv(8, heads=2)
        conv(x, index, w, eh)
        conv(x, index, w, eh)
        assert builds[0] == 2  # no version counter: nothing kept
        w[0] = float("nan")
        with pytest.raises(ValueError, match="NaN"):
            conv(x, index, w, eh)


def test_a_cached_layer_still_copies_and_pickles():
    ei, w, eh, x = graph()
    conv = GlomoConv(8, heads=2, cached=True)
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


@pytest.mark.parametrize("shuffled", [True, False])
def test_cached_and_edge_index_graphs_equal_a_fresh_layer(shuffled):
    ei, w, eh, x = graph(shuffled=shuffled)
    want = GlomoConv(8, heads=2)(x, ei, w, eh)
    cached = GlomoConv(8, heads=2, cached=True)
    index = edge_index_of(ei)
    plain = GlomoConv(8, heads=2)
    for _ in range(2):
        torch.testing.assert_close(cached(x, ei, w, eh), want)
        torch.testing.assert_close(plain(x, index, w, eh), want)
    torch.testing.assert_close(GlomoConv(8, heads=2)(x, ei), GlomoConv(8, heads=2)(
        x, ei, torch.ones_like(w)))
