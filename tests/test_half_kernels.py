"""The two T x T kernels in bfloat16 under autocast: the fused propagation (FlexAttention,
paper Eq. 1 and 2) and the keep-alive scan (column maxima of the scores), against dense
float64 references written from the equations (tests/reference.py).

Tolerances are in units of bfloat16's unit roundoff u = 2**-8 (8 significand bits):
- fused values: the output is a convex combination of the values, so its error is at most
  (L1 change of the weights + rounding of the values, the weights and the output) times
  max |v|. Rounding keys and queries moves score s_ij by up to about 2u M_j, with
  M_j = max_i sum_d |k_id q_jd|. The squared-ReLU weights depend on the ratios
  s_ij / max_i s_ij, so they move by O(u kappa_j), kappa_j = M_j / max_i s_ij (the
  column's conditioning): O(u) where the largest score is well above its rounding. A
  column whose largest score is within rounding of 0 is not determined in bfloat16
  (ReLU^2 is continuous, its normalisation 0/0 is not): it may lose its edges or gain
  them, and its weights may change by O(1). Bound used: (2 + kappa_j / 4) u max |v| for
  kappa_j <= 1 / (4u) = 64 (largest score at least twice its rounding); measured on CPU
  at most 0.7u for kappa_j <= 4 (most targets), 1.3u up to 8, 1.7u up to 32, 4.4u up to
  64. The others are only checked to lie in the values' convex hull (measured: up to
  0.41 max |v| at one target with kappa > 64). The softmax is continuous everywhere: 4u
  max |v| for every target (measured 1.5u).
- keep-alive values: the scan's bfloat16 scores are within 3u M_j of the exact ones
  (rounded inputs, rounded output), so the pair it picks scores within twice that of
  the maximum. Bound used: 8u M_j.
"""
import pytest
import torch
from reference import allowed_pairs, dense_graph

from glomo_pyg import GraphPredictor, PixelGraphPredictor, flex, kernels
from glomo_pyg.kernels import bounded_keys_queries, column_max_scores

U = 2.0 ** -8  # bfloat16's unit roundoff
VALUE_TOL = 4 * U  # softmax, and the containers' check
GRAD_TOL = 16 * U  # FlexAttention's backward also rounds dS to bfloat16 (GPU only: its
# test is in tests/test_fused.py, the file the GPU campaign runs)
BF16 = torch.bfloat16
LENGTHS = [150, 23, 1, 129]  # across a 128-unit block, one unit alone, padding

needs_flex = pytest.mark.skipif(not flex.available(), reason="needs FlexAttention")


@pytest.fixture
def kernel_dtypes(monkeypatch):
    """The (query, key, value) dtypes of every FlexAttention call."""
    seen, compiled = [], flex._flex

    def spy(dtype=torch.float32):
        fn = compiled(dtype)

        def call(query, key, value, **kwargs):
            seen.append((query.dtype, key.dtype, value.dtype))
            return fn(query, key, value, **kwargs)
        return call

    monkeypatch.setattr(flex, "_flex", spy)
    return seen


def fused_inputs(shared=False, device="cpu"):
    gen = torch.Generator().manual_seed(0)
    b, h, t, d, c = len(LENGTHS), 2, max(LENGTHS), 9, 5
    k = torch.randn(b, h, t, d, generator=gen)
    q = torch.randn(b, h, t, d, generator=gen) - 0.3  # many non-positive scores
    v = torch.randn(b, 1 if shared else h, t, c, generator=gen)
    return k.to(device), q.to(device), v.to(device), torch.tensor(LENGTHS, device=device)


def reference_propagation(k, q, v, lengths, direction="forward", include_self=False,
                          normalization="relu2"):
    """Paper Eq. 1 and 2 in float64: ``[B, H, T(j), C]``."""
    scores = k.double() @ q.double().transpose(-1, -2)  # [B, H, i, j]
    allowed = allowed_pairs(lengths.tolist(), k.size(2), direction, include_self)
    graph = dense_graph(scores, allowed.to(scores.device), normalization)
    return graph.transpose(-1, -2) @ v.double()


def relative_error(got, want, scale):
    return float((got.double() - want).abs().max() / scale.abs().max())


def conditioning(k, q, lengths, direction="forward", include_self=False):
    """``(kappa, has)``, ``[B, H, T]``: ``M_j / max_i s_ij`` over the allowed sources
    (``inf`` where no score is positive), and whether the target has allowed sources."""
    k, q = k.detach().double().cpu(), q.detach().double().cpu()
    allowed = allowed_pairs(lengths.tolist(), k.size(2), direction, include_self)
    top = (k @ q.transpose(-1, -2)).masked_fill(~allowed, float("-inf")).amax(2)
    rounding = (k.abs() @ q.abs().transpose(-1, -2)).masked_fill(~allowed, 0).amax(2)
    kappa = torch.where(top > 0, rounding / top.clamp_min(1e-300), float("inf"))
    return kappa, allowed.any(2).expand_as(top)


def assert_close_to_the_reference(got, k, q, v, lengths, direction="forward",
                                  include_self=False):
    """Squared-ReLU propagation ``got`` against :func:`reference_propagation`: within
    ``(2 + kappa_j / 4) u max |v|`` where ``kappa_j <= 1 / (4u)``; elsewhere (near-empty
    columns, see the module docstring) finite and inside the values' hull. Returns the
    share of those others among the targets with sources."""
    want = reference_propagation(k, q, v, lengths, direction, include_self)
    err = (got.double() - want).abs().amax(-1) / v.abs().max()  # [B, H, T]
    kappa, has = conditioning(k, q, lengths, direction, include_self)
    clear = kappa <= 1 / (4 * U)
    bound = U * (2 + kappa / 4)
    assert (err <= bound)[clear].all(), float((err / bound)[clear].max())
    assert torch.isfinite(got).all() and got.abs().max() <= v.abs().max() * (1 + 2 * U)
    return float((has & ~clear).sum() / has.sum())


def test_kernel_dtype_follows_bfloat16_autocast_only():
    k = torch.zeros(1, 1, 4, 2)
    assert flex.resolve_kernel_dtype(k) == torch.float32
    assert flex.resolve_kernel_dtype(k.to(BF16)) == BF16  # half keys run as given
    with torch.autocast("cpu", dtype=BF16):
        assert flex.resolve_kernel_dtype(k) == BF16
        assert flex.resolve_kernel_dtype(k, torch.float32) == torch.float32  # the switch
        with torch.autocast("cpu", enabled=False):
            assert flex.resolve_kernel_dtype(k) == torch.float32
    with torch.autocast("cpu", dtype=torch.float16):  # float16's range cannot hold the scores
        assert flex.resolve_kernel_dtype(k) == torch.float32
    with pytest.raises(ValueError, match="kernel_dtype"):
        flex.resolve_kernel_dtype(k, torch.float64)


@needs_flex
@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("include_self", [False, True])
@torch.no_grad()  # one grad mode: each is a compiled variant of its own
def test_fused_values_in_bf16_autocast_match_the_dense_reference(direction, include_self,
                                                                 kernel_dtypes):
    k, q, v, lengths = fused_inputs()
    want = reference_propagation(k, q, v, lengths, direction, include_self)
    kw = dict(direction=direction, include_self=include_self)
    exact = flex.fused_propagate(k, q, v, lengths, **kw)
    with torch.autocast("cpu", dtype=BF16):
        mixed = flex.fused_propagate(k, q, v, lengths, **kw)
        switched = flex.fused_propagate(k, q, v, lengths, kernel_dtype=torch.float32, **kw)
    assert kernel_dtypes == [(torch.float32,) * 3, (BF16,) * 3, (torch.float32,) * 3]
    assert mixed.dtype == torch.float32  # the values' dtype
    assert torch.equal(switched, exact)  # the old behaviour, one argument away
    assert relative_error(exact, want, v) < 1e-5
    assert assert_close_to_the_reference(mixed, k, q, v, lengths, **kw) < 0.02
    assert mixed[1, :, 23:].abs().max() == 0 and mixed[2, :, 1:].abs().max() == 0  # padding


@needs_flex
@torch.no_grad()
def test_fused_softmax_and_shared_half_values_in_bf16_autocast(kernel_dtypes):
    k, q, v, lengths = fused_inputs(shared=True)
    want = reference_propagation(k, q, v.expand(-1, 2, -1, -1), lengths,
                                 normalization="softmax")
    with torch.autocast("cpu", dtype=BF16):
        mixed = flex.fused_propagate(k, q, v.to(BF16), lengths, normalization="softmax")
    assert kernel_dtypes == [(BF16,) * 3]
    assert mixed.dtype == BF16  # returned in the values' dtype
    assert relative_error(mixed, want, v) < VALUE_TOL


@needs_flex
@pytest.mark.parametrize("direction", ["forward", "backward"])
@torch.no_grad()
def test_fused_pixel_grid_in_bf16_autocast_matches_the_dense_reference(direction,
                                                                       kernel_dtypes):
    # whole 8 x 8 images, as the pixel layers call it: one order mask of batch 1,
    # full_length, keys with the grid position features folded in
    torch.manual_seed(0)
    p = PixelGraphPredictor(8, 8, hidden_channels=16, num_layers=1, heads=2,
                            position="grid", direction=direction, bias="threshold")
    p.scorer.position_coef.normal_()
    k, q = p.scorer.augmented(0, torch.randn(3, 64, 16), torch.randn(3, 64, 16))
    v = torch.randn(3, 2, 64, 6)
    full = torch.full((1,), 64)
    mask = flex.block_mask(full, flex.BLOCK, direction, False, order_only=True)
    with torch.autocast("cpu", dtype=BF16):
        mixed = flex.fused_propagate(k, q, v, full.expand(3), direction=direction, mask=mask,
                                     full_length=True)
    assert kernel_dtypes == [(BF16,) * 3]
    assert_close_to_the_reference(mixed, k, q, v, full.expand(3), direction)


@needs_flex
@torch.no_grad()
def test_fused_graphs_propagate_in_bf16_under_autocast(kernel_dtypes):
    # through the graph containers: text with padding (threshold bias, relative positions:
    # the folded terms that float32 keys kept exact) and whole images
    from glomo_pyg.pixels import image_units

    torch.manual_seed(0)
    text = GraphPredictor(num_tokens=30, hidden_channels=16, num_layers=1, heads=4,
                          cnn_layers=1, bias="threshold", position="relative",
                          position_frequencies=4).eval()
    image = PixelGraphPredictor(8, 8, hidden_channels=16, num_layers=1, heads=2,
                                position="grid").eval()
    lengths = [5, 11, 7]
    cases = [(text, torch.randint(0, 30, (sum(lengths),)),
              torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))),
             (image, *image_units(torch.randint(0, 256, (3, 3, 8, 8), dtype=torch.uint8)))]
    for model, x, batch in cases:
        fused, dense = model(x, batch, layout="fused"), model(x, batch, layout="dense")
        h = torch.randn(len(batch), 6)
        with torch.autocast("cpu", dtype=BF16):
            mixed = fused.propagate(h, 0)
        assert kernel_dtypes[-1] == (BF16,) * 3
        # per (head, target): near-empty columns may differ (module docstring)
        err = (mixed - dense.propagate(h, 0)).abs().amax(-1) / h.abs().max()
        assert torch.isfinite(mixed).all() and mixed.abs().max() <= h.abs().max() * (1 + 2 * U)
        assert (err < VALUE_TOL).float().mean() > 0.97


@needs_flex
@torch.no_grad()
def test_overflow_guard_holds_in_bf16_and_float16_autocast_stays_float32(kernel_dtypes):
    # keys and queries near 1e30: float32 scores would be 1e60 = inf. The exact power-of-two
    # rescaling keeps them finite in bfloat16 (float32's range); float16 (65504) could not
    # hold even the rescaled keys, so a float16 region runs the float32 kernel, bit for bit.
    k, q, v, lengths = fused_inputs()
    k, q = k * 1e30, q * 1e30
    kb, qb = bounded_keys_queries(k, q)
    exact = flex.fused_propagate(kb, qb, v, lengths)
    with torch.autocast("cpu", dtype=BF16):
        mixed = flex.fused_propagate(kb, qb, v, lengths)
    with torch.autocast("cpu", dtype=torch.float16):
        half = flex.fused_propagate(kb, qb, v, lengths)
    assert kernel_dtypes == [(torch.float32,) * 3, (BF16,) * 3, (torch.float32,) * 3]
    assert assert_close_to_the_reference(mixed, k, q, v, lengths) < 0.02
    assert torch.equal(half, exact)


# --- the keep-alive scan -------------------------------------------------------------------

def scan_inputs(integer=False):
    gen = torch.Generator().manual_seed(0)
    shape = (3, 2, 40, 8)
    if integer:  # exact in bfloat16, and so are their scores (|s| <= 8): ties everywhere
        k, q = (torch.randint(-1, 2, shape, generator=gen).float() for _ in range(2))
    else:
        k, q = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    return k.requires_grad_(), q.requires_grad_(), torch.tensor([40, 1, 17])


def reference_column_max(k, q, lengths, direction, include_self):
    """``(max_i s_ij, s_ij, allowed)`` in float64, ``[B, H, j]`` and ``[B, H, i, j]``."""
    scores = k.detach().double() @ q.detach().double().transpose(-1, -2)
    allowed = allowed_pairs(lengths.tolist(), k.size(2), direction, include_self)
    return scores.masked_fill(~allowed, float("-inf")).amax(2), scores, allowed


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("include_self", [False, True])
@pytest.mark.parametrize("block_size", [1 << 22, 150])  # one tile; 1 target a tile (bf16: 2)
def test_half_scan_picks_a_pair_within_bf16_rounding_of_the_maximum(direction, include_self,
                                                                    block_size):
    k, q, lengths = scan_inputs()
    kw = dict(direction=direction, include_self=include_self, block_size=block_size)
    with torch.autocast("cpu", dtype=BF16):
        got = column_max_scores(k, q, lengths, **kw)
    want, scores, allowed = reference_column_max(k, q, lengths, direction, include_self)
    assert got.dtype == torch.float32
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite)  # -inf: padding, no allowed source
    # the value is the float32 score of an allowed pair ...
    gap = (scores - got.detach().double().unsqueeze(2)).abs().masked_fill(~allowed, float("inf"))
    chosen = gap.argmin(2)
    magnitude = (k.detach().abs().double() @ q.detach().abs().double().transpose(-1, -2))
    magnitude = magnitude.masked_fill(~allowed, 0).amax(2)
    assert (gap.amin(2)[finite] <= 1e-6 * magnitude[finite]).all()
    # ... within the scan's rounding of the maximum
    assert ((want - got.detach().double())[finite] <= 8 * U * magnitude[finite]).all()
    # the gradient reaches that pair only: as through the dense float32 score of the pair
    grads = torch.autograd.grad(got[finite].sum(), (k, q))
    dense = (k @ q.transpose(-1, -2)).gather(2, chosen.unsqueeze(2)).squeeze(2)
    want_grads = torch.autograd.grad(dense[finite].sum(), (k, q))
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b)
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
        assert torch.equal(column_max_scores(k, q, lengths, **kw), got.detach())


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("include_self", [False, True])
def test_half_scan_equals_the_float32_scan_on_exact_inputs_with_ties(direction, include_self):
    # integer keys and queries: bfloat16 scores are exact, so the half scan picks the same
    # first tied source and gives the same values and gradients, bit for bit; both equal
    # the dense reference's maximum
    k, q, lengths = scan_inputs(integer=True)
    kw = dict(direction=direction, include_self=include_self, block_size=150)
    exact = column_max_scores(k, q, lengths, **kw)
    with torch.autocast("cpu", dtype=BF16):
        mixed = column_max_scores(k, q, lengths, **kw)
    want, scores, allowed = reference_column_max(k, q, lengths, direction, include_self)
    ties = ((scores == want.unsqueeze(2)) & allowed).sum(2)
    assert (ties > 1).sum() > 0.3 * (ties > 0).sum()
    assert torch.equal(mixed.detach().double(), want) and torch.equal(mixed, exact)
    finite = torch.isfinite(want)
    probe = torch.randn(want.shape)[finite]
    for a, b in zip(torch.autograd.grad((mixed[finite] * probe).sum(), (k, q)),
                    torch.autograd.grad((exact[finite] * probe).sum(), (k, q))):
        assert torch.equal(a, b)


def test_float32_scan_is_unchanged_outside_bf16_autocast(monkeypatch):
    # float16 regions (scores could overflow float16), the explicit switch and the module
    # switch all scan in float32, bit for bit the same as outside autocast
    k, q, lengths = scan_inputs()
    exact = column_max_scores(k, q, lengths, block_size=150)
    with torch.autocast("cpu", dtype=torch.float16):
        assert torch.equal(column_max_scores(k, q, lengths, block_size=150), exact)
    with torch.autocast("cpu", dtype=BF16):
        assert torch.equal(column_max_scores(k, q, lengths, block_size=150,
                                             scan_dtype=torch.float32), exact)
        monkeypatch.setattr(kernels, "FOLLOW_AUTOCAST", False)
        assert torch.equal(column_max_scores(k, q, lengths, block_size=150), exact)


def test_half_scan_keeps_nothing_of_size_t_squared_for_the_backward_pass():
    b, h, t, d = 2, 3, 64, 4
    k = torch.randn(b, h, t, d, requires_grad=True)
    q = torch.randn(b, h, t, d, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x.numel()) or x,
                                                  lambda x: x), \
            torch.autocast("cpu", dtype=BF16):
        column_max_scores(k, q, torch.tensor([t, 40]))
    assert saved and max(saved) <= b * h * t * d


def test_keep_alive_under_bf16_autocast_is_finite_and_close_to_float32():
    from glomo_pyg import Glomo

    torch.manual_seed(0)
    lengths = [9, 6, 1]
    x = torch.randint(0, 20, (sum(lengths),))
    batch = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))
    model = Glomo.text(20, hidden_channels=16, num_layers=2, heads=2, cnn_layers=1,
                       keep_alive=1.0, keep_alive_margin=0.5)  # training mode: the penalty
    torch.manual_seed(1)
    want = model(x, batch).metrics["forward/keep_alive"]
    torch.manual_seed(1)
    with torch.autocast("cpu", dtype=BF16):
        out = model(x, batch)
    got = out.metrics["forward/keep_alive"]
    assert torch.isfinite(got) and torch.isfinite(out.loss)
    torch.testing.assert_close(got.float(), want.float(), atol=0.05, rtol=0.05)
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
