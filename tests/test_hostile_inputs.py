"""Hand-made (hostile) input at the public doors: a named error (what argument, expected
vs got) or a correct result, never a crash deep inside, a silent wrong result or an
unbounded allocation. With test_data_hostile.py (readers), test_ingest_hostile.py (the GPU
campaign's ingest), test_pretrain_reliability.py (checkpoints, kills, signals),
test_pretrained_io.py / test_pretrained_seal.py / test_pretrained_atomic_save.py (saved
predictors) and test_compile.py (compiled layers), the one home of the hostile cases."""
import os
import pickle
import shlex
import time

import numpy as np
import pytest
import torch

import glomo_pyg.kernels as K
import glomo_pyg.sequences as S
from glomo_pyg import (
    FeaturePredictor,
    GatedFusion,
    Glomo,
    GlomoConv,
    GlomoTransfer,
    GraphMixer,
    GraphPredictor,
    LatentGraphs,
    load_pretrained,
)
from glomo_pyg.data.images import UnsafePickleError, load_cifar10, load_imagenet32
from glomo_pyg.nn import ContextDecoder, GlomoTextClassifier, PretrainedGraphPredictor
from glomo_pyg.nn.functional import head_propagate, latent_graph_dense, weighted_spmm

NAN, INF = float("nan"), float("inf")


def _kq(b=2, h=2, t=7, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, t, d, generator=g), torch.randn(b, h, t, d, generator=g)


def _column_sums_ok(graphs):
    """Finite weights; every (layer, sequence, head, target) column sums to 1 or is empty."""
    dense = graphs.to_dense()  # [L, B, H, T(i), T(j)]
    assert bool(torch.isfinite(dense).all())
    sums = dense.sum(-2)
    ok = (sums == 0) | ((sums - 1).abs() < 1e-5)
    assert bool(ok.all()), sums[~ok]


# --- silent wrong results ---------------------------------------------------------------

def test_public_sparse_kernels_refuse_unsorted_rows_and_out_of_range_sources():
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match="row must be sorted"):
        weighted_spmm(torch.tensor([2, 0, 1]), torch.tensor([0, 1, 2]), torch.ones(3), x, 3)
    ei, eh = torch.tensor([[0, 9], [1, 2]]), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"outside \[0, 4\)"):
        head_propagate(x, ei, torch.ones(2), eh, 1)
    with pytest.raises(ValueError, match=r"outside \[0, 4\)"):  # head-blocked [H, N, C] too
        head_propagate(x.unsqueeze(0), ei, torch.ones(2), eh, 1)
    # sorted, in range: the same numbers as the dense product
    row, col, w = torch.tensor([0, 0, 2]), torch.tensor([1, 3, 0]), torch.rand(3)
    dense = torch.zeros(3, 4).index_put((row, col), w)
    torch.testing.assert_close(weighted_spmm(row, col, w, x, 3), dense @ x)


def test_glomo_conv_refuses_non_finite_weights_of_user_given_edges():
    conv = GlomoConv(4, heads=2)
    ei = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="edge_weight contains NaN or Inf"):
        conv(torch.randn(3, 4), ei, torch.tensor([NAN, 1.0]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="edge_weight contains NaN or Inf"):
        conv(torch.randn(3, 4), torch.sparse_coo_tensor(ei.flip(0), torch.tensor([INF, 1.0]),
                                                        (3, 3)))


def test_transfer_checks_the_shape_of_given_propagations():
    x = torch.randn(3, 4)
    predictor = PretrainedGraphPredictor(GraphPredictor(num_tokens=10, hidden_channels=8,
                                                        num_layers=1, heads=2, cnn_layers=1))
    transfer = GlomoTransfer(predictor, in_channels=4)
    tokens = torch.randint(0, 10, (3,))
    propagated = transfer.propagations(x, tokens)
    with pytest.raises(ValueError, match=r"propagated must be \[D, K, N, C\]"):
        transfer(x, propagated=propagated[0])
    torch.testing.assert_close(transfer(x, propagated=propagated), transfer(x, tokens))


@pytest.mark.parametrize("scale", [1e20, 1e30])
@pytest.mark.parametrize("sparse", [True, False])
def test_extreme_weights_never_give_nan_or_silently_empty_graphs(scale, sparse):
    """Embedding x scale with no CNN: keys and queries ~scale, products overflow fp32. The
    graphs must be finite, their columns sum to 1 or are empty, and they must be the
    graphs of the unscaled model (squared ReLU is scale invariant; the softmax of such
    scores is one-hot at the largest score)."""
    torch.manual_seed(0)
    model = GraphPredictor(num_tokens=10, hidden_channels=8, num_layers=2, heads=2,
                           cnn_layers=0, sparse=sparse, norm=None)
    x, batch = torch.randint(0, 10, (12,)), torch.tensor([0] * 5 + [1] * 7)
    with torch.no_grad():
        for lin in (*model.scorer.key, *model.scorer.query):
            lin.bias.zero_()  # scores then scale as scale**2 exactly: s(scaled) = scale^2 s
        model.scorer.bias.zero_()
    reference = model(x, batch, layout="dense").to_dense()
    with torch.no_grad():
        model.encoder.embedding.weight.mul_(scale)
    for layout in ("sparse", "dense"):
        graphs = model(x, batch, layout=layout)
        _column_sums_ok(graphs)
        got = graphs.to_dense()
        if sparse:
            torch.testing.assert_close(got, reference, atol=1e-5, rtol=1e-4)
        else:  # all weight on the largest allowed score(s) (equal tokens tie exactly)
            torch.testing.assert_close(got.argmax(-2), reference.argmax(-2))
            top = got.amax(-2)
            assert bool(((top == 0) | (top >= 0.5 - 1e-6)).all())
    if sparse:
        fused = model(x, batch, layout="fused")
        _column_sums_ok(fused)
        torch.testing.assert_close(fused.to_dense(), reference, atol=1e-5, rtol=1e-4)
        k, q = fused.fused_layers[0]
        assert float(k.detach().abs().max()) < 2.0 ** K.SAFE_EXPONENT  # FlexAttention sees no inf
    else:
        with pytest.raises(ValueError, match="fused softmax layout cannot rescale"):
            model(x, batch, layout="fused")


@pytest.mark.parametrize("normalization", ["relu2", "softmax"])
def test_rescaled_scores_give_the_same_graphs_and_gradients(normalization):
    """A key column of 2**60 that meets zero queries leaves every score unchanged but makes
    the kernels rescale the keys by 2**-11: graphs and gradients must not change (for the
    softmax the factor is put back after the maximum is subtracted)."""
    k, q = _kq(t=9, d=4)
    lengths, ptr = torch.tensor([9, 6]), torch.tensor([0, 9, 15])
    big = torch.full(k.shape[:-1] + (1,), 2.0 ** 60)
    k_big = torch.cat([k, big], -1).requires_grad_()
    q_big = torch.cat([q, torch.zeros_like(big)], -1).requires_grad_()
    k_ref = torch.cat([k, torch.zeros_like(big)], -1).requires_grad_()
    q_ref = torch.cat([q, torch.zeros_like(big)], -1).requires_grad_()
    probe = None
    for fn in (K.latent_graph_edges, latent_graph_dense):
        args = (ptr,) if fn is K.latent_graph_edges else ()
        want = fn(k_ref, q_ref, lengths, *args, normalization=normalization)
        got = fn(k_big, q_big, lengths, *args, normalization=normalization)
        w_want = want[1] if isinstance(want, tuple) else want
        w_got = got[1] if isinstance(got, tuple) else got
        if isinstance(want, tuple):
            assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
        torch.testing.assert_close(w_got, w_want)
        probe = torch.randn_like(w_want)
        gk_want, gq_want = torch.autograd.grad((w_want * probe).sum(), (k_ref, q_ref))
        gk_got, gq_got = torch.autograd.grad((w_got * probe).sum(), (k_big, q_big))
        torch.testing.assert_close(gk_got[..., :-1], gk_want[..., :-1])
        torch.testing.assert_close(gq_got[..., :-1], gq_want[..., :-1])
    assert probe is not None


def test_scaling_is_exact_and_a_no_op_for_ordinary_magnitudes():
    k, q = _kq()
    ck, cq = K._safe_scales(k * 1e3, q)
    assert bool((ck == 1).all()) and bool((cq == 1).all())
    ck, cq = K._safe_scales(k * 1e30, q * 1e25)
    for c in (ck, cq):
        assert bool((c < 1).all()) and bool((torch.frexp(c)[0] == 0.5).all())  # powers of 2
    lengths, ptr = torch.tensor([7, 7]), torch.tensor([0, 7, 14])
    a = K.latent_graph_edges(k, q, lengths, ptr)
    b = K.latent_graph_edges(k * 2.0 ** 70, q * 2.0 ** 40, lengths, ptr)
    for x, y in zip(a, b):  # squared ReLU of exactly rescaled scores: bit for bit the same
        assert torch.equal(x, y)


# --- crashes with unhelpful messages --------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8, torch.int8])
def test_token_ids_of_unsupported_integer_dtypes_are_named(dtype):
    model = GraphPredictor(num_tokens=10, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1)
    x = torch.randint(0, 10, (5,))
    with pytest.raises(TypeError, match=rf"int64 or int32.*{dtype}.*x.long\(\)"):
        model(x.to(dtype))
    glomo = Glomo.text(10, hidden_channels=8, heads=2, num_layers=1)
    with pytest.raises(TypeError, match="int64 or int32"):
        glomo(x.to(dtype))
    assert model(x.int()).num_edges == model(x).num_edges  # int32 ids are fine


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_features_of_other_float_dtypes(dtype):
    """An fp32 predictor converts its input features (documented); modules whose
    parameters meet the features name the mismatch instead of failing in a matmul."""
    torch.manual_seed(0)
    predictor = GraphPredictor(in_channels=3, hidden_channels=8, num_layers=1, heads=2,
                               cnn_layers=1)
    x = torch.randn(6, 3).to(dtype)
    torch.testing.assert_close(predictor(x).to_dense(), predictor(x.float()).to_dense())
    graphs = LatentGraphs.uniform(torch.tensor([0, 6]), num_layers=1, num_heads=2,
                                  direction="forward")
    h = torch.randn(6, 4).to(dtype)
    mixer = GraphMixer(4, 1, 2, directions=("forward",))
    with pytest.raises(TypeError, match=rf"x is {dtype} but GraphMixer's parameters are "
                                        r"torch.float32"):
        mixer(h, graphs)
    with pytest.raises(TypeError, match=rf"x is {dtype} but GatedFusion's parameters"):
        GatedFusion(4, 1)(h, [h])
    with pytest.raises(TypeError, match=rf"{dtype} but GlomoConv\(update='gru'\)"):
        GlomoConv(4, update="gru")(h, torch.tensor([[0], [1]]))
    transfer = GlomoTransfer(PretrainedGraphPredictor(predictor), in_channels=4)
    with pytest.raises(TypeError, match=rf"h is {dtype} but GlomoTransfer's parameters"):
        transfer(h, x)
    # no parameters meet x without an update: any float dtype propagates
    assert GlomoConv(4)(h, torch.tensor([[0], [1]])).dtype == dtype
    if dtype != torch.float64:  # autocast converts fp16/bf16 input itself
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.isfinite(mixer(h, graphs)[0].float()).all()


# (what is built with which bad argument, the call, the error, what its message must name)
CONSTRUCTOR_DOORS = [
    ("padding_idx=num_tokens", lambda: GraphPredictor(num_tokens=10, hidden_channels=8, heads=2,
                                                      padding_idx=10),
     ValueError, r"padding_idx must be a token id in \[0, 10\).*got 10"),
    ("Glomo.text-padding_idx=-11", lambda: Glomo.text(10, hidden_channels=8, heads=2,
                                                      padding_idx=-11),
     ValueError, "padding_idx must be a token id"),
    ("features-with-padding_idx", lambda: GraphPredictor(in_channels=3, hidden_channels=8,
                                                         heads=2, padding_idx=0),
     ValueError, "padding_idx applies to token-id input"),
    ("classifier-padding_idx", lambda: GlomoTextClassifier(torch.randn(5, 4), padding_idx=5),
     ValueError, r"padding_idx must be a row of the embedding"),
    ("decoder_layers=0", lambda: Glomo.text(10, hidden_channels=8, heads=2, num_layers=1,
                                            decoder_layers=0),
     ValueError, r"decoder_layers must be an integer in \[1, 1024\], got 0"),
    ("ContextDecoder-num_layers=0", lambda: ContextDecoder(torch.nn.Embedding(10, 8), 8,
                                                           num_layers=0),
     ValueError, "at least one GRU layer"),
    ("GlomoConv-channels=8.0", lambda: GlomoConv(8.0, heads=2), TypeError,
     "channels and heads must be integers"),
    ("GlomoConv-heads='2'", lambda: GlomoConv(8, heads="2"), TypeError,
     "channels and heads must be integers"),
    ("GlomoConv-channels=True", lambda: GlomoConv(True, heads=1), TypeError,
     "channels and heads must be integers"),
    ("pooled_context='no'", lambda: FeaturePredictor(num_tokens=5, hidden_channels=4,
                                                     num_layers=1, heads=1, pooled_context="no"),
     TypeError, "pooled_context must be True or False"),
    ("uniform-decreasing-ptr", lambda: LatentGraphs.uniform(
        torch.tensor([0, 5, 3]), num_layers=1, num_heads=1, direction="forward"),
     ValueError, "start at 0 and never decrease"),
    ("uniform-list-ptr", lambda: LatentGraphs.uniform([0, 5, 3], num_layers=1, num_heads=1,
                                                      direction="forward"),
     ValueError, "ptr must be an int64"),
]


@pytest.mark.parametrize("call,error,names", [d[1:] for d in CONSTRUCTOR_DOORS],
                         ids=[d[0] for d in CONSTRUCTOR_DOORS])
def test_constructors_refuse_bad_arguments_by_name(call, error, names):
    with pytest.raises(error, match=names):
        call()


def test_constructors_take_negative_padding_idx_and_numpy_integers():
    assert GraphPredictor(num_tokens=10, hidden_channels=8, heads=2,
                          padding_idx=-1).encoder.embedding.padding_idx == 9
    assert GlomoConv(np.int64(8), heads=np.int64(2)).channels == 8


@pytest.mark.parametrize("update", [None, "gru", "residual"])
@pytest.mark.parametrize("fused", [True, False])
def test_glomo_conv_on_empty_input(update, fused):
    conv = GlomoConv(4, heads=2, update=update, fused=fused)
    empty = torch.zeros(0, 4)
    out = conv(empty, torch.zeros(2, 0))  # torch.zeros(2, 0) is float: no id to misread
    assert out.shape == (0, 4)
    out = conv(empty, torch.zeros(2, 0, dtype=torch.long), torch.zeros(0),
               torch.zeros(0, dtype=torch.long))
    assert out.shape == (0, 4)
    x = torch.randn(3, 4)  # nodes, no edges: zero aggregation, then the update
    out = conv(x, torch.zeros(2, 0, dtype=torch.long))
    assert out.shape == (3, 4) and bool(torch.isfinite(out).all())
    if update is None:
        assert torch.equal(out, torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"outside \[0, 0\)"):  # no node to point at
        conv(empty, torch.tensor([[0], [0]]))
    with pytest.raises(ValueError, match="empty input"):
        conv.forward_dense(empty, torch.zeros(0, 2, 0, 0))


def test_layer_indices_are_validated_with_named_errors():
    model = GraphPredictor(num_tokens=10, hidden_channels=8, num_layers=2, heads=2, cnn_layers=1)
    x = torch.randint(0, 10, (6,))
    for layout in ("sparse", "dense"):
        graphs = model(x, layout=layout)
        with pytest.raises(IndexError, match=r"graph layer 7 is out of range.*2 layers \(0..1\)"):
            graphs.layer(7)
        with pytest.raises(IndexError, match=r"graph layer -3 is out of range"):
            graphs.propagate(torch.randn(6, 4), -3)
        with pytest.raises(IndexError, match="out of range"):
            graphs.to_dense(2)
        with pytest.raises(TypeError, match="must be an integer"):
            graphs.layer(1.0)
        for a, b in zip(graphs.layer(-1), graphs.layer(1)):  # Python's negative indices
            assert torch.equal(a, b)
        assert graphs.layer(torch.tensor(1))[0].shape == graphs.layer(1)[0].shape
    one_layer = LatentGraphs.uniform(torch.tensor([0, 6]), num_layers=1, num_heads=2,
                                     direction="forward")
    with pytest.raises(IndexError, match=r"0..0"):
        GlomoConv(4, heads=2).propagate_graphs(torch.randn(6, 4), one_layer, 1)
    for update in ("gru", None):  # (without an update there are no parameters to meet x)
        conv = GlomoConv(4, heads=2, update=update)
        with pytest.raises(TypeError, match="graphs must be LatentGraphs.*got NoneType"):
            conv.propagate_graphs(torch.randn(6, 4), None, 0)
        with pytest.raises(TypeError, match="floating-point.*dtype torch.int64"):
            conv.propagate_graphs(torch.ones(6, 4, dtype=torch.long), one_layer, 0)
        with pytest.raises(TypeError, match="floating-point.*got tuple"):
            conv.propagate_graphs((1, 2), one_layer, 0)
        with pytest.raises(ValueError, match=r"x must have shape \[N, 4\], got \(\)"):
            conv.propagate_graphs(torch.tensor(1.0), one_layer, 0)


def test_from_dense_refuses_non_finite_or_negative_weights():
    ptr = torch.tensor([0, 3])
    block = torch.rand(1, 2, 3, 3).triu(1)  # forward: source i < target j
    assert LatentGraphs.from_dense([block], direction="forward", ptr=ptr).num_layers == 1
    for bad in (NAN, INF, -0.5):
        broken = block.clone()
        broken[0, 1, 0, 2] = bad
        with pytest.raises(ValueError, match="layer 1: dense graph weights must be finite and "
                                             "non-negative"):
            LatentGraphs.from_dense([block, broken], direction="forward", ptr=ptr)


def test_from_dense_refuses_weight_at_padding_or_forbidden_pairs():
    """Weight at padding became edges into the next sequence or past the last unit (an
    out-of-bounds read in the sparse kernel, heap corruption building CSR rows)."""
    ptr = torch.tensor([0, 4, 6])  # lengths 4 and 2, padded to 4
    good = torch.zeros(2, 1, 4, 4)
    good[0, 0, 0, 3], good[1, 0, 0, 1] = 1.0, 1.0
    graphs = LatentGraphs.from_dense([good], direction="forward", ptr=ptr)
    assert graphs.to_dense().equal(good.unsqueeze(0))
    for b, i, j in [(1, 3, 0), (1, 0, 3), (1, 2, 3), (0, 3, 1), (0, 2, 2)]:
        broken = good.clone()
        broken[b, 0, i, j] = 0.5  # padding source / target, a later source, a self-loop
        with pytest.raises(ValueError, match="layer 0: dense graphs must be zero outside"):
            LatentGraphs.from_dense([broken], direction="forward", ptr=ptr)
    selfish = good.clone()
    selfish[0, 0, 2, 2] = 0.5
    LatentGraphs.from_dense([selfish], direction="forward", ptr=ptr, include_self=True)
    with pytest.raises(ValueError, match="backward"):
        LatentGraphs.from_dense([good], direction="backward", ptr=ptr)
    assert LatentGraphs.from_dense([good.transpose(2, 3)], direction="backward",
                                   ptr=ptr).num_layers == 1


# --- memory and time ------------------------------------------------------------------------

@pytest.mark.parametrize("last", [10 ** 6, 10 ** 8, 2 ** 62])
def test_batch_ids_that_skip_absurdly_are_refused_before_allocating(last):
    model = GraphPredictor(num_tokens=10, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=rf"{last + 1} sequences .* for 2 units: at most N "
                                         r"\+ MAX_EMPTY_SEQUENCES = 1026"):
        model(torch.tensor([3, 4]), torch.tensor([0, last]))
    assert time.perf_counter() - start < 2.0  # no O(num_sequences) allocation first


def test_a_few_empty_sequences_are_allowed_within_the_slack(monkeypatch):
    model = GraphPredictor(num_tokens=10, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1)
    x, batch = torch.randint(0, 10, (5,)), torch.tensor([0, 0, 3, 3, 3])  # 1 and 2 empty
    graphs = model(x, batch)
    assert graphs.num_sequences == 4 and graphs.lengths.tolist() == [2, 0, 0, 3]
    _column_sums_ok(graphs)
    two, sparse_ids = torch.tensor([1, 2]), torch.tensor([0, 9])  # 10 sequences, 2 units
    assert model(two, sparse_ids).num_sequences == 10  # within N + 1024
    monkeypatch.setattr(S, "MAX_EMPTY_SEQUENCES", 0)
    assert model(x, batch).num_sequences == 4  # 4 sequences <= 5 units + 0
    with pytest.raises(ValueError, match=r"10 sequences .* 2 units: at most N \+ "
                                         r"MAX_EMPTY_SEQUENCES = 2"):
        model(two, sparse_ids)
    with pytest.raises(ValueError, match="negative"):
        model(x, batch - 1)


def test_a_20000_unit_sequence_is_refused_before_its_quadratic_graphs():
    """Trained graphs keep 40-85% of the allowed pairs: 8 heads over 20,000 units would be
    ~1.6e9 candidate edges per layer. Refused from host arithmetic, with what to do."""
    model = GraphPredictor(num_tokens=10, hidden_channels=8, num_layers=1, heads=8,
                           head_channels=2, cnn_layers=1)
    x = torch.randint(0, 10, (20000,))
    for layout in (None, "sparse", "dense"):  # None: the default layout
        start = time.perf_counter()
        with pytest.raises(ValueError, match=r"MAX_GRAPH_PAIRS.*Split long sequences into "
                                             r"chunks .*layout='fused'"):
            model(x) if layout is None else model(x, layout=layout)
        assert time.perf_counter() - start < 5.0
    with pytest.raises(ValueError, match="MAX_GRAPH_PAIRS"):  # CPU with gradients: no fused
        model(x, layout="auto")
    uniform = LatentGraphs.uniform(torch.tensor([0, 20000]), num_layers=1, num_heads=8,
                                   direction="forward")
    h = torch.randn(20000, 3)
    out = uniform.propagate(h, 0)  # O(N): the prefix means, zero for the first unit
    assert out.shape == (8, 20000, 3) and bool((out[:, 0] == 0).all())
    prefix_means = h[:-1].double().cumsum(0) / torch.arange(1, 20000).double().unsqueeze(1)
    torch.testing.assert_close(out[3, 1:].double(), prefix_means, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="Uniform graphs propagate in O\\(N\\).*MAX_GRAPH"):
        uniform.layer(0)
    with pytest.raises(ValueError, match="dense layout.*MAX_GRAPH_PAIRS"):
        uniform.to_dense(0)


def test_graph_size_limit_is_overridable_and_auto_takes_the_fused_layout(monkeypatch):
    pytest.importorskip("torch.nn.attention.flex_attention")
    model = GraphPredictor(num_tokens=10, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1)
    x, batch = torch.randint(0, 10, (40,)), torch.tensor([0] * 20 + [1] * 20)
    assert K.graph_pairs("sparse", 2, 40, 20, 2) == 2 * 2 * 20 * 19 // 2  # exact here
    monkeypatch.setattr(K, "MAX_GRAPH_PAIRS", 2 * 2 * 20 * 19 // 2)
    reference = model(x, batch, layout="sparse")  # exactly at the limit: allowed
    monkeypatch.setattr(K, "MAX_GRAPH_PAIRS", 100)
    with pytest.raises(ValueError, match="MAX_GRAPH_PAIRS = 100"):
        model(x, batch, layout="sparse")
    monkeypatch.setattr("glomo_pyg.nn.layout.dense_fits", lambda *a: False)
    with torch.no_grad():
        graphs = model(x, batch, layout="auto")
    assert graphs.layout == "fused"
    with pytest.raises(ValueError, match="fused graphs were asked for their edges"):
        graphs.layer(0)
    monkeypatch.setattr(K, "MAX_GRAPH_PAIRS", 10 ** 6)
    torch.testing.assert_close(graphs.to_dense(), reference.to_dense())


FUSED_20000 = r"""
import torch
from glomo_pyg import GraphPredictor
torch.manual_seed(0)
model = GraphPredictor(num_tokens=10, hidden_channels=8, num_layers=1, heads=8,
                       head_channels=2, cnn_layers=1).eval()
x, h = torch.randint(0, 10, (20000,)), torch.randn(20000, 3)
with torch.no_grad():
    graphs = model(x, layout="auto")
    assert graphs.layout == "fused"
    out = graphs.propagate(h, 0)
    reference = model(x[:500], layout="sparse").propagate(h[:500], 0)
assert out.shape == (8, 20000, 3) and bool(torch.isfinite(out).all())
torch.testing.assert_close(out[:, :500], reference, atol=1e-4, rtol=1e-4)
print("OK")
"""


@pytest.mark.slow
def test_a_20000_unit_sequence_without_gradients_takes_the_fused_layout():
    """Past MAX_GRAPH_PAIRS, 'auto' takes the fused layout (memory linear in T). Checked by
    causality: the first 500 targets of a forward graph see only the first 500 units. In a
    fresh process: after many other shapes in one process, torch.compile's recompile limit
    can leave FlexAttention to its eager path, whose scores are quadratic (12.9 GB here)."""
    import subprocess
    import sys

    pytest.importorskip("torch.nn.attention.flex_attention")
    result = subprocess.run([sys.executable, "-c", FUSED_20000], capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


def test_ptr_claiming_huge_or_mostly_empty_batches_is_refused_before_allocating():
    start = time.perf_counter()
    with pytest.raises(ValueError, match="MAX_UNITS"):
        LatentGraphs.uniform(torch.tensor([0, 10 ** 10]), num_layers=1, num_heads=1,
                             direction="forward")
    with pytest.raises(ValueError, match="MAX_EMPTY_SEQUENCES"):
        LatentGraphs.uniform(torch.zeros(3000, dtype=torch.long), num_layers=1, num_heads=1,
                             direction="forward")
    assert time.perf_counter() - start < 1.0
    ok = LatentGraphs.uniform(torch.tensor([0, 0, 3]), num_layers=1, num_heads=1,
                              direction="forward")
    assert ok.num_sequences == 2 and S.MAX_UNITS >= 1 << 20


def test_graph_indices_and_vocabulary_strings_are_checked():
    from glomo_pyg.data.text import WordVocabulary

    dense = torch.rand(2, 1, 2, 4, 4).triu(1)  # [i, j] = G_ij: source before target
    graphs = LatentGraphs.from_dense(dense, direction="forward", ptr=torch.tensor([0, 4]))
    for call, message in [(lambda: graphs.hierarchical(0, -1, 0), "layer must be an integer"),
                          (lambda: graphs.hierarchical(0, 2, 0), "layer must be an integer"),
                          (lambda: graphs.adjacency(0, 0, 0.5), "head must be an integer"),
                          (lambda: graphs.to_networkx(0.5), "sample must be an integer"),
                          (lambda: graphs.to_networkx(1),
                           r"sample must be an integer in \[0, 1\)")]:
        with pytest.raises(ValueError, match=message):
            call()
    assert graphs.to_networkx(np.int64(0)).number_of_nodes() == 4
    vocab = WordVocabulary.build([["a", "b"]], min_count=1)
    with pytest.raises(TypeError, match="not a string"):
        vocab.encode("ab")
    model = Glomo.text(10, hidden_channels=4, num_layers=1, heads=1, cnn_layers=1)
    with pytest.raises(TypeError, match="not one string"):
        model.to_pretrained("abcdefghij")


# --- files at the loaders' doors ------------------------------------------------------------

class _Exploit:
    """Unpickled by an unrestricted loader, this creates ``path``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.path)}",))


def _pickle(path, obj):
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=4)


def _cifar10(root, marker, bad):
    rng = np.random.default_rng(0)
    root.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        _pickle(root / name, {b"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8),
                              b"labels": [0, 1, 2, 3], b"batch_label": name.encode()})
    if bad == "data_batch_3":  # the whole file is the exploit
        _pickle(root / bad, _Exploit(marker))
        return lambda: load_cifar10(str(root))
    _pickle(root / bad, {b"data": _Exploit(marker), b"labels": [0]})  # inside the batch
    return lambda: load_cifar10(str(root), "test")


def _imagenet32(root, marker, bad):
    root.mkdir()
    data = np.random.default_rng(1).integers(0, 256, (3, 3072), dtype=np.uint8)
    _pickle(root / "train_data_batch_1", {"data": data, "labels": [1, 2, 3]})
    _pickle(root / bad, {"data": data, "labels": [1, 2, 3], "mean": _Exploit(marker)})
    return lambda: load_imagenet32(str(root))


def _long_text_into_loaded_predictor(root, marker, bad):
    torch.manual_seed(0)
    PretrainedGraphPredictor(*(GraphPredictor(num_tokens=30, hidden_channels=16, num_layers=2,
                                              heads=2, direction=d, cnn_layers=1)
                               for d in ("forward", "backward"))).save_pretrained(root)
    predictor = load_pretrained(root)
    return lambda: predictor(torch.randint(0, 30, (bad,)))


@pytest.mark.parametrize("build,bad,error,names", [
    (_cifar10, "data_batch_3", UnsafePickleError, r"data_batch_3: refusing to load .*system"),
    (_cifar10, "test_batch", UnsafePickleError, r"test_batch: refusing to load .*system"),
    (_imagenet32, "train_data_batch_2", UnsafePickleError,
     r"train_data_batch_2: refusing to load .*system"),
    (_long_text_into_loaded_predictor, 20000, ValueError,
     r"MAX_GRAPH_PAIRS.*Split long sequences into chunks"),
], ids=["cifar10-file", "cifar10-inside", "imagenet32", "loaded-predictor-20000-units"])
def test_loaders_refuse_hostile_files_with_named_errors(tmp_path, build, bad, error, names):
    """(what the loader is given, the bad part, the error, what its message must name);
    a planted pickle never runs."""
    marker = tmp_path / "pickle-ran"
    call = build(tmp_path / "input", marker, bad)
    with pytest.raises(error, match=names):
        call()
    assert not marker.exists()
