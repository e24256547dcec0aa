"""The fused layout (FlexAttention): the same propagation as the sparse edges, on CPU in
the forward pass, with automatic fallback where gradients are needed."""
import pytest
import torch
from test_half_kernels import (  # noqa: F401
    BF16,
    GRAD_TOL,
    U,
    assert_close_to_the_reference,
    conditioning,
    fused_inputs,
    kernel_dtypes,
    reference_propagation,
    relative_error,
)

from glomo_pyg import (
    FeatureGraphEmitter,
    Glomo,
    GlomoConv,
    GlomoTransfer,
    GraphPredictor,
    PretrainedGraphPredictor,
    flex,
)
from glomo_pyg.kernels import head_propagate, latent_graph_edges

pytestmark = pytest.mark.skipif(not flex.available(), reason="needs FlexAttention")

LENGTHS = [5, 11, 7]


def tokens():
    torch.manual_seed(1)
    x = torch.randint(0, 30, (sum(LENGTHS),))
    batch = torch.repeat_interleave(torch.arange(3), torch.tensor(LENGTHS))
    return x, batch


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("kw", [dict(), dict(bias="threshold", position="relative",
                                             position_frequencies=4),
                                dict(sparse=False), dict(include_self=True)])
def test_fused_propagation_equals_the_sparse_edges(direction, kw):
    torch.manual_seed(0)
    p = GraphPredictor(num_tokens=30, hidden_channels=16, num_layers=2, heads=4, cnn_layers=1,
                       direction=direction, **kw).eval()
    x, batch = tokens()
    with torch.no_grad():
        sparse, fused = p(x, batch), p(x, batch, layout="fused")
        assert fused.layout == "fused"
        shared, per_head = torch.randn(len(x), 6), torch.randn(4, len(x), 6)
        for l in range(2):
            torch.testing.assert_close(fused.propagate(shared, l), sparse.propagate(shared, l),
                                       atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(fused.propagate(per_head, l),
                                       sparse.propagate(per_head, l), atol=1e-5, rtol=1e-4)
        # export sees the same sparse edges, emitted on demand from the keys and queries
        for (ea, wa, ha), (eb, wb, hb) in zip(fused, sparse):
            assert torch.equal(ea, eb) and torch.equal(ha, hb)
            torch.testing.assert_close(wa, wb)
        torch.testing.assert_close(fused.to_dense(), sparse.to_dense())
        assert fused.to(torch.device("cpu")).layout == "fused"


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("include_self", [False, True])
def test_block_mask_over_several_blocks_padding_and_empty_columns(direction, include_self):
    """Lengths across 128-unit block boundaries (full, partial and empty blocks), a
    length-1 sequence, and many targets without a positive score."""
    torch.manual_seed(0)
    lengths = torch.tensor([300, 129, 1, 256])
    b, h, t, d = 4, 2, 300, 9
    k, q = torch.randn(b, h, t, d), torch.randn(b, h, t, d) - 0.3
    ptr = torch.zeros(b + 1, dtype=torch.long)
    ptr[1:] = lengths.cumsum(0)
    batch = torch.repeat_interleave(torch.arange(b), lengths)
    pos = torch.arange(int(ptr[-1])) - ptr[batch]
    x = torch.randn(int(ptr[-1]), 3)
    values = torch.zeros(b, 1, t, 3)
    values[batch, 0, pos] = x
    edges = latent_graph_edges(k, q, lengths, ptr, direction=direction, include_self=include_self)
    want = head_propagate(x, *edges, num_heads=h)
    out = flex.fused_propagate(k, q, values, lengths, direction=direction,
                               include_self=include_self)
    torch.testing.assert_close(out[batch, :, pos].transpose(0, 1), want, atol=1e-5, rtol=1e-4)
    assert torch.isfinite(out).all() and out[1, :, 129:].abs().max() == 0  # padding stays 0


def test_training_on_cpu_falls_back_and_matches_the_sparse_layout():
    """FlexAttention has no CPU backward: with gradients the fused layout propagates along
    the sparse edges instead, silently and with the same values and gradients."""
    x, batch = tokens()
    models = {}
    for layout in ("sparse", "fused"):
        torch.manual_seed(3)
        models[layout] = Glomo.text(num_tokens=30, hidden_channels=16, num_layers=2, heads=4,
                                    cnn_layers=1, num_positions=4).set_layout(layout)
    out = {}
    for layout, model in models.items():
        torch.manual_seed(5)
        loss = model(x, batch).loss
        loss.backward()
        out[layout] = (loss, [p.grad for p in model.parameters()])
    torch.testing.assert_close(out["fused"][0], out["sparse"][0])
    for a, b in zip(out["fused"][1], out["sparse"][1]):
        if a is not None or b is not None:
            torch.testing.assert_close(a, b)


def test_transfer_and_conv_accept_fused_graphs():
    torch.manual_seed(0)
    parts = [GraphPredictor(num_tokens=30, hidden_channels=16, num_layers=2, heads=4,
                            cnn_layers=1, direction=d) for d in ("forward", "backward")]
    predictor = PretrainedGraphPredictor(*parts)
    x, batch = tokens()
    h = torch.randn(len(x), 8)
    transfer = GlomoTransfer(predictor, in_channels=8, mixing="conditioned").eval()
    with torch.no_grad():
        want = transfer(h, x, batch)
        predictor.set_layout("fused")
        graphs = transfer.graphs(x, batch)
        assert graphs.forward.layout == "fused"
        torch.testing.assert_close(transfer(h, graphs=graphs), want, atol=1e-5, rtol=1e-4)
        conv = GlomoConv(8, heads=4, update="gru")
        torch.testing.assert_close(conv.propagate_graphs(h, graphs.backward, 1),
                                   conv(h, *graphs.backward.to_sparse().layer(1)),
                                   atol=1e-5, rtol=1e-4)
    emitter = FeatureGraphEmitter(num_tokens=30, hidden_channels=16, num_layers=2, heads=4).eval()
    with torch.no_grad():
        fused, sparse = emitter(x, batch, layout="fused"), emitter(x, batch)
        assert fused.layout == "fused"
        torch.testing.assert_close(fused.to_dense(), sparse.to_dense(), atol=1e-5, rtol=1e-4)


def test_unsupported_inputs_name_the_other_layouts():
    p = GraphPredictor(num_tokens=30, hidden_channels=16, num_layers=1, heads=4,
                       cnn_layers=1).double()
    x, batch = tokens()
    with pytest.raises(ValueError, match="layout='sparse' or 'dense'"):
        p(x, batch, layout="fused")
    k = torch.randn(1, 1, 4, 2)
    with pytest.raises(ValueError, match="normalization"):
        flex.fused_propagate(k, k, k, torch.tensor([4]), normalization="sigmoid")


def test_auto_picks_fused_only_without_gradients_at_long_lengths():
    torch.manual_seed(0)
    p = GraphPredictor(num_tokens=30, hidden_channels=16, num_layers=1, heads=2,
                       cnn_layers=1).set_layout("auto").eval()
    long = torch.randint(0, 30, (600,))
    with torch.no_grad():
        assert p(long).layout == "fused"
        assert p(torch.randint(0, 30, (100,))).layout in ("sparse", "dense")
    assert p(long).layout in ("sparse", "dense")  # gradients enabled: no fused emission


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's backward needs a GPU")
def test_fused_gradients_equal_the_sparse_path_on_gpu():
    torch.manual_seed(0)
    p = GraphPredictor(num_tokens=30, hidden_channels=16, num_layers=2, heads=4,
                       cnn_layers=1).cuda()
    x, batch = (t.cuda() for t in tokens())
    h = torch.randn(len(x), 8, device="cuda")
    grads = {}
    for layout in ("sparse", "fused"):
        p.zero_grad()
        hh = h.clone().requires_grad_()
        graphs = p(x, batch, layout=layout)
        out = graphs.propagate(hh, 0).square().sum() + graphs.propagate(hh.repeat(1, 1), 1).sum()
        out.backward()
        grads[layout] = [hh.grad] + [q.grad.clone() for q in p.parameters() if q.grad is not None]
    for a, b in zip(grads["fused"], grads["sparse"]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_squared_relu_score_has_finite_gradients_where_the_score_is_not_positive():
    # Found on an H100: zeroed padding keys give s = 0 exactly, and d(2 log s)/ds = 2/s
    # times the zero gradient of the unselected branch was 0 * inf = NaN, which made the
    # first fused training step diverge. FlexAttention's backward differentiates the same
    # score_mod, so its eager gradient must be finite.
    s = torch.tensor([[-1.0, 0.0, 0.5, 2.0]], requires_grad=True)
    mod = flex._relu2_score(s, None, None, None, None)
    assert torch.equal(mod[0, :2], torch.full((2,), -float("inf")))
    torch.logsumexp(mod, -1).sum().backward()
    weights = torch.tensor([0.0, 0.0, 0.25, 4.0]) / 4.25  # ReLU(s)^2 normalised
    torch.testing.assert_close(s.grad[0], torch.tensor([0.0, 0.0, 2 / 0.5, 2 / 2.0]) * weights)


def test_wide_values_are_propagated_in_column_blocks(monkeypatch):
    # Found on an H100: the kernel ran out of shared memory at 300 value columns. Wider
    # values go through in blocks with the same keys and queries; the result is the same,
    # including a last block narrower than the kernel's minimum width (zero-padded).
    torch.manual_seed(0)
    k, q = torch.randn(2, 3, 40, 5), torch.randn(2, 3, 40, 5)
    lengths = torch.tensor([40, 23])
    for v in (torch.randn(2, 3, 40, 11), torch.randn(2, 1, 40, 11)):
        plain = flex.fused_propagate(k, q, v, lengths)
        with monkeypatch.context() as m:
            m.setitem(flex.MAX_VALUE_DIM, "cpu", 4)  # blocks of 4, 4 and 3 columns
            m.setitem(flex.MIN_HEAD_DIM, "cpu", 4)
            blocked = flex.fused_propagate(k, q, v, lengths)
        assert blocked.shape == plain.shape == (2, 3, 40, 11)
        torch.testing.assert_close(blocked, plain, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kw", [dict(), dict(bias="threshold", position="relative",
                                             position_frequencies=4)])
def test_fused_emission_under_bfloat16_autocast(kw):
    # Found on an H100: under autocast the key/query projections are bfloat16 while the
    # folded bias (or threshold) is a float32 parameter, so keys and queries differed in
    # dtype and the fused layout refused every bf16-mixed pretraining run.
    torch.manual_seed(0)
    p = GraphPredictor(num_tokens=30, hidden_channels=16, num_layers=2, heads=4, cnn_layers=1,
                       **kw).eval()
    x, batch = tokens()
    h = torch.randn(len(x), 6)
    with torch.no_grad():
        exact = p(x, batch, layout="fused")
        states = torch.randn(3, 11, 16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            k, q = p.scorer.augmented(0, states, states)
            mixed = p(x, batch, layout="fused")
        assert k.dtype == q.dtype == torch.float32  # scored in the wider dtype
        for l in range(2):  # bf16 projections move scores near the threshold, so a few
            # targets gain or lose an edge; the rest match the float32 graphs closely
            a, b = mixed.propagate(h, l), exact.propagate(h, l)
            assert torch.isfinite(a).all()
            assert ((a - b).abs() <= 0.05 + 0.05 * b.abs()).float().mean() > 0.95


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's backward needs a GPU")
@pytest.mark.parametrize("modality", ["text", "image"])
def test_fused_bf16_training_steps_stay_finite_on_gpu(modality):
    # what stopped the first GPU pretraining runs: keys and queries of two dtypes under
    # bf16 autocast, then NaN gradients at zero scores (zeroed padding keys)
    torch.manual_seed(0)
    if modality == "text":
        model = Glomo.text(num_tokens=30, hidden_channels=32, num_layers=2, heads=4,
                           cnn_layers=1, num_positions=4, keep_alive=0.05)
        x, batch = (t.cuda() for t in tokens())  # variable lengths: padded keys
    else:
        from glomo_pyg.pixels import image_units
        model = Glomo.image(8, 8, hidden_channels=32, num_layers=2, heads=4, cnn_layers=1,
                            num_positions=4, position="grid", keep_alive=0.05)
        x, batch = (t.cuda() for t in image_units(
            torch.randint(0, 256, (3, 3, 8, 8), dtype=torch.uint8)))
    model = model.set_layout("fused").cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, batch).loss
        loss.backward()
        assert torch.isfinite(loss)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters()
                   if p.grad is not None)
        opt.step()


def test_narrow_heads_are_zero_padded_where_the_kernel_needs_width(monkeypatch):
    # CUDA's kernel needs head dims >= 16; padding keys, queries and values with zeros
    # must leave the result unchanged (exercised on CPU by raising the minimum here).
    torch.manual_seed(0)
    k, q = torch.randn(2, 3, 40, 5), torch.randn(2, 3, 40, 5)
    v = torch.randn(2, 3, 40, 3)
    lengths = torch.tensor([40, 23])
    plain = flex.fused_propagate(k, q, v, lengths)
    monkeypatch.setitem(flex.MIN_HEAD_DIM, "cpu", 16)
    padded = flex.fused_propagate(k, q, v, lengths)
    assert padded.shape == plain.shape == (2, 3, 40, 3)
    torch.testing.assert_close(padded, plain, atol=1e-6, rtol=1e-5)


def test_fused_refuses_over_long_masks_bad_values_and_kernel_failures(monkeypatch):
    t = flex.BLOCK * 4097  # 16 x 4097^2 block indices > MAX_MASK_BLOCKS
    k = torch.zeros(16, 1, t, 1)
    with pytest.raises(ValueError, match="too long for the fused layout's block mask.*sparse"):
        flex.check_fusable(k, k)
    k = torch.randn(2, 2, 8, 4)
    with pytest.raises(ValueError, match=r"values must be \[B, H or 1, T, C\]"):
        flex.fused_propagate(k, k, torch.randn(2, 3, 8, 4), torch.tensor([8, 5]))
    with pytest.raises(ValueError, match="one shape"):
        flex.check_fusable(k, k[..., :3])

    def refuse(*args, **kwargs):
        raise NotImplementedError("NYI: embedding dimension must be at least 16")
    monkeypatch.setitem(flex._COMPILED, "flex", refuse)
    with pytest.raises(ValueError, match="FlexAttention cannot run.*layout='sparse' or 'dense'"):
        flex.fused_propagate(k, k, k, torch.tensor([8, 5]))


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("t", [128, 150])  # a whole block, and padding inside the last block
@pytest.mark.parametrize("sparse", [True, False])
def test_full_length_batches_equal_the_sparse_edges(direction, t, sparse):
    torch.manual_seed(0)
    p = GraphPredictor(num_tokens=30, hidden_channels=16, num_layers=2, heads=4, cnn_layers=1,
                       direction=direction, sparse=sparse).eval()
    x = torch.randint(0, 30, (3 * t,))
    batch = torch.arange(3).repeat_interleave(t)
    with torch.no_grad():
        fused, ref = p(x, batch, layout="fused"), p(x, batch, layout="sparse")
        for h in (torch.randn(3 * t, 5), torch.randn(4, 3 * t, 5)):
            for layer in (0, 1):
                torch.testing.assert_close(fused.propagate(h, layer), ref.propagate(h, layer),
                                           atol=1e-5, rtol=1e-4)


def test_whole_images_of_any_batch_size_reuse_one_compiled_kernel():
    # Images used to run heads-first, with the batch in FlexAttention's (specialised) head
    # dimension: every new batch size recompiled (about 10 s on CPU), and past torch's
    # recompilation limit FlexAttention silently ran eagerly with T x T memory.
    from torch._dynamo.utils import counters

    from glomo_pyg import PixelGraphPredictor
    from glomo_pyg.pixels import image_units

    torch.manual_seed(0)
    p = PixelGraphPredictor(8, 8, hidden_channels=16, num_layers=1, heads=2).eval()
    graphs_compiled = []
    with torch.no_grad():
        for b in (3, 5, 1, 2, 4):
            x, batch = image_units(torch.randint(0, 256, (b, 3, 8, 8), dtype=torch.uint8))
            fused = p(x, batch, layout="fused")
            h = torch.randn(len(batch), 3)
            out = fused.propagate(h, 0)
            graphs_compiled.append(counters["stats"]["unique_graphs"])
            if b == 3:
                torch.testing.assert_close(out, p(x, batch, layout="sparse").propagate(h, 0),
                                           atol=1e-5, rtol=1e-4)
    # the first compile is specialised to its batch size; the second size makes the batch
    # dimension dynamic (torch's automatic dynamic shapes); a batch of one image is always
    # specialised (torch's 0/1 rule) and compiles once more; no size compiles again
    assert graphs_compiled[2] <= graphs_compiled[0] + 2
    assert graphs_compiled[2:] == graphs_compiled[2:3] * 3



# kernel_dtypes: the fixture imported from test_half_kernels (hence the F811 noqa)
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's backward needs a GPU")
@pytest.mark.parametrize("direction,include_self,shared",
                         [("forward", False, False), ("backward", True, True)])
def test_fused_bf16_gradients_match_the_dense_reference_on_gpu(direction, include_self, shared,
                                                                kernel_dtypes):  # noqa: F811
    # FlexAttention's backward in bfloat16 under autocast (it rounds dS to bfloat16 as
    # well) against autograd through the float64 reference of tests/test_half_kernels.py;
    # near-empty columns are left out of the loss (their weights are not determined in
    # bfloat16: that file's docstring)
    k, q, v, lengths = fused_inputs(shared, device="cuda")
    k, q, v = (x.requires_grad_() for x in (k, q, v))
    kw = dict(direction=direction, include_self=include_self)
    kappa, _ = conditioning(k, q, lengths.cpu(), **kw)
    probe = torch.randn(*kappa.shape, v.size(-1)) * (kappa <= 1 / (4 * U)).unsqueeze(-1)
    with torch.autocast("cuda", dtype=BF16):
        out = flex.fused_propagate(k, q, v, lengths, **kw)
    assert kernel_dtypes == [(BF16,) * 3] and out.dtype == torch.float32
    grads = torch.autograd.grad((out * probe.cuda()).sum(), (k, q, v))
    ref = [x.detach().cpu().double().requires_grad_() for x in (k, q, v)]
    want = reference_propagation(ref[0], ref[1], ref[2].expand(-1, 2, -1, -1),
                                 lengths.cpu(), **kw)
    want_grads = torch.autograd.grad((want * probe.double()).sum(), ref)
    assert assert_close_to_the_reference(out.detach().cpu(), ref[0], ref[1],
                                         ref[2].detach().expand(-1, 2, -1, -1),
                                         lengths.cpu(), **kw) < 0.02
    for got, wanted in zip(grads, want_grads):
        assert torch.isfinite(got).all()
        assert relative_error(got.cpu(), wanted, wanted) < GRAD_TOL
