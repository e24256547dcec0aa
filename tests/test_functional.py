"""Graph emission and weighted spmm against the dense reference (values and gradients)."""
import itertools

import pytest
import torch
from reference import allowed_pairs, assert_same_values_and_grads, dense_graph

from glomo_pyg import LatentGraphs
from glomo_pyg.kernels import latent_graph_edges, weighted_spmm

LENGTHS = [5, 1, 9, 3, 0, 7]  # includes a length-1 and an empty sequence


def _ptr(lengths):
    return torch.cat([torch.zeros(1, dtype=torch.long), torch.tensor(lengths).cumsum(0)])


def _inputs(lengths=LENGTHS, heads=3, dim=4, dtype=torch.float64):
    t = max(lengths)
    key = torch.randn(len(lengths), heads, t, dim, dtype=dtype, requires_grad=True)
    query = torch.randn(len(lengths), heads, t, dim, dtype=dtype, requires_grad=True)
    return key, query, torch.tensor(lengths), _ptr(lengths)


def _emit_dense(key, query, lengths, ptr, **kw):
    ei, w, h = latent_graph_edges(key, query, lengths, ptr, **kw)
    graphs = LatentGraphs([ei], [w], [h], num_heads=key.size(1),
                          direction=kw.get("direction", "forward"), ptr=ptr,
                          include_self=kw.get("include_self", False))
    return graphs.to_dense(0), (ei, w, h)


# Block sizes: everything in one block; all heads of two sequences per block (3 heads x
# 9^2 = 243 scores per sequence); one head at a time with several sequences per block,
# and with target tiling.
CASES = list(itertools.product(["forward", "backward"], [False, True], ["relu2", "softmax"],
                               [1 << 22, 600, 300, 20, 3]))


@pytest.mark.parametrize("direction,include_self,normalization,block_size", CASES)
def test_emission_matches_dense_reference(direction, include_self, normalization, block_size):
    key, query, lengths, ptr = _inputs()
    kw = dict(direction=direction, include_self=include_self, normalization=normalization,
              block_size=block_size)
    dense, (ei, w, h) = _emit_dense(key, query, lengths, ptr, **kw)
    scores = torch.einsum("bhid,bhjd->bhij", key, query)
    ref = dense_graph(scores, allowed_pairs(lengths, key.size(2), direction, include_self),
                      normalization)
    # values, and gradients w.r.t. keys and queries through the pruned edges
    assert_same_values_and_grads(dense, ref, (key, query))


@pytest.mark.parametrize("direction,include_self,normalization,block_size", CASES[::2])
def test_emission_invariants(direction, include_self, normalization, block_size):
    key, query, lengths, ptr = _inputs(dtype=torch.float32)
    ei, w, h = latent_graph_edges(key, query, lengths, ptr, direction=direction,
                                  include_self=include_self, normalization=normalization,
                                  block_size=block_size)
    src, tgt = ei
    assert ei.dtype == torch.long and h.dtype == torch.long
    assert bool((w > 0).all()) and bool(torch.isfinite(w).all())
    order = (h * 1000 + tgt) * 1000 + src
    assert bool((order[1:] > order[:-1]).all()), "edges must be sorted by (head, target, source)"
    batch = torch.repeat_interleave(torch.arange(len(LENGTHS)), lengths)
    assert bool((batch[src] == batch[tgt]).all()), "no edge may cross sequences"
    assert int(ei.max()) < int(ptr[-1]), "no edge may touch padding"
    if direction == "forward":
        assert bool(((src <= tgt) if include_self else (src < tgt)).all())
    else:
        assert bool(((src >= tgt) if include_self else (src > tgt)).all())
    sums = torch.zeros(key.size(1), int(ptr[-1])).index_put_((h, tgt), w, accumulate=True)
    has_edges = torch.zeros_like(sums, dtype=torch.bool).index_put_((h, tgt), torch.tensor(True))
    torch.testing.assert_close(sums[has_edges], torch.ones(int(has_edges.sum())))
    if normalization == "softmax":  # dense: every allowed pair is an edge
        allowed = allowed_pairs(lengths, key.size(2), direction, include_self)
        assert ei.size(1) == int(allowed.sum()) * key.size(1)


def test_first_token_and_negative_scores_give_empty_columns_not_nan():
    key, query, lengths, ptr = _inputs(dtype=torch.float32)
    key = (key.detach().abs() + 0.1).requires_grad_()  # positive keys ...
    query = (-torch.ones_like(key)).requires_grad_()  # ... negative queries: every score < 0
    ei, w, h = latent_graph_edges(key, query, lengths, ptr)
    assert ei.size(1) == 0 and w.numel() == 0
    w.sum().backward()
    assert bool(torch.isfinite(key.grad).all()) and bool(torch.isfinite(query.grad).all())
    # The first unit of each sequence never receives a forward edge.
    key, query, lengths, ptr = _inputs(dtype=torch.float32)
    ei, w, h = latent_graph_edges(key, query, lengths, ptr)
    assert not bool(torch.isin(ei[1], ptr[:-1]).any())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_and_huge_scores_stay_finite(dtype):
    key, query, lengths, ptr = _inputs(dtype=torch.float32)
    ref = latent_graph_edges(key, query, lengths, ptr)
    ei, w, h = latent_graph_edges(key.to(dtype), query.to(dtype), lengths, ptr)
    assert w.dtype == torch.float32 and bool(torch.isfinite(w).all())
    common = torch.isin(ei[0] * 10**6 + ei[1] * 10 + h, ref[0][0] * 10**6 + ref[0][1] * 10 + ref[2])
    assert common.float().mean() > 0.9  # rounding can flip signs of scores near 0
    # Scores around 1e30: squaring overflows fp32, the normalisation must not.
    big_k = (key.detach() * 1e15).requires_grad_()
    big_q = (query.detach() * 1e15).requires_grad_()
    ei, w, h = latent_graph_edges(big_k, big_q, lengths, ptr)
    assert ei.size(1) > 0 and bool(torch.isfinite(w).all())
    w.sum().backward()
    assert bool(torch.isfinite(big_k.grad).all())


def test_block_size_bounds_dense_scores():
    """Tiling must not change anything: one block per sequence and target tile."""
    key, query, lengths, ptr = _inputs(lengths=[40], heads=2)
    full = latent_graph_edges(key, query, lengths, ptr, block_size=1 << 22)
    tiled = latent_graph_edges(key, query, lengths, ptr, block_size=40 * 3)
    for a, b in zip(full, tiled):
        torch.testing.assert_close(a, b)


def test_emission_rejects_bad_arguments():
    key, query, lengths, ptr = _inputs()
    with pytest.raises(ValueError, match="direction"):
        latent_graph_edges(key, query, lengths, ptr, direction="sideways")
    with pytest.raises(ValueError, match="normalization"):
        latent_graph_edges(key, query, lengths, ptr, normalization="sparsemax")
    with pytest.raises(ValueError, match=r"\[B, H, T, D\]"):
        latent_graph_edges(key, query[..., :2], lengths, ptr)
    with pytest.raises(ValueError, match="block_size"):
        latent_graph_edges(key, query, lengths, ptr, block_size=0)


def test_weighted_spmm_matches_dense_values_and_gradients():
    n, e, c = 30, 120, 5
    row = torch.sort(torch.randint(0, n, (e,)))[0]
    col = torch.randint(0, n, (e,))
    w = torch.rand(e, dtype=torch.float64, requires_grad=True)
    x = torch.randn(n, c, dtype=torch.float64, requires_grad=True)
    out = weighted_spmm(row, col, w, x, n)
    dense = torch.zeros(n, n, dtype=torch.float64).index_put((row, col), w, accumulate=True)
    ref = dense @ x
    assert_same_values_and_grads(out, ref, (w, x))


def test_weighted_spmm_without_edges_and_in_half_precision():
    x = torch.randn(4, 3)
    empty = torch.empty(0, dtype=torch.long)
    assert torch.equal(weighted_spmm(empty, empty, torch.empty(0), x, 4), torch.zeros(4, 3))
    row, col, w = torch.tensor([1, 2]), torch.tensor([0, 1]), torch.tensor([0.5, 2.0])
    out = weighted_spmm(row, col, w, x.bfloat16(), 4)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float()[1], 0.5 * x[0], atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("min_chunk", [4, 1 << 16])
def test_weighted_spmm_backward_in_row_chunks_matches_dense(monkeypatch, index_dtype, min_chunk):
    """The backward cuts the edges into row chunks (bounded scratch memory): with tiny
    chunks, empty rows, a column range per chunk and int32 indices it still equals the
    dense product's gradients."""
    import glomo_pyg.kernels as F
    monkeypatch.setattr(F, "BACKWARD_MIN_CHUNK", min_chunk)
    gen = torch.Generator().manual_seed(3)
    n, e, c = 40, 300, 3
    row = torch.sort(torch.randint(5, n - 5, (e,), generator=gen))[0].to(index_dtype)
    col = torch.randint(0, n, (e,), generator=gen).to(index_dtype)
    w = torch.rand(e, dtype=torch.float64, generator=gen, requires_grad=True)
    x = torch.randn(n, c, dtype=torch.float64, generator=gen, requires_grad=True)
    row_ptr = torch._convert_indices_from_coo_to_csr(row.long(), n)
    chunks = F._row_chunks(row_ptr, e)
    assert len(chunks) == (16 if min_chunk == 4 else 1)
    assert [c_[2] for c_ in chunks[1:]] == [c_[3] for c_ in chunks[:-1]]  # contiguous edges
    out = weighted_spmm(row, col, w, x, n)
    dense = torch.zeros(n, n, dtype=torch.float64).index_put((row.long(), col.long()), w,
                                                             accumulate=True)
    assert_same_values_and_grads(out, dense @ x, (w, x))


def test_head_blocked_edges_use_int32_indices_and_keep_order():
    from glomo_pyg.kernels import head_blocked_edges
    edge_index = torch.tensor([[0, 1, 0, 2], [1, 2, 2, 3]])
    head = torch.tensor([0, 0, 1, 1])
    w = torch.tensor([1.0, 2.0, 3.0, 4.0])
    rows, cols, weight = head_blocked_edges(edge_index, w, head, 4, num_heads=2)
    assert rows.dtype == cols.dtype == torch.int32
    assert rows.tolist() == [1, 2, 6, 7] and cols.tolist() == [0, 1, 4, 6]
    rows, cols, _ = head_blocked_edges(edge_index, w, head, 4, shared_input=True, num_heads=2)
    assert cols.tolist() == [0, 1, 0, 2]
    # unsorted input: sorted by (row, column), weights carried along
    rows, cols, weight = head_blocked_edges(edge_index.flip(1), w.flip(0), head.flip(0), 4,
                                            num_heads=2)
    assert rows.tolist() == [1, 2, 6, 7] and weight.tolist() == [1.0, 2.0, 3.0, 4.0]
    # past int32 (H * N >= 2**31 - 1) the ids stay int64, and the graph's own heads must
    # not be overwritten by the in-place arithmetic (.to() returns them as they are)
    big = 2**31
    rows, cols, _ = head_blocked_edges(edge_index, w, head, big, num_heads=2)
    assert rows.dtype == torch.int64 and head.tolist() == [0, 0, 1, 1]
    assert rows.tolist() == [1, 2, big + 2, big + 3] and cols.tolist() == [0, 1, big, big + 2]
