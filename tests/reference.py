"""Independent dense implementations of the paper's equations, for the tests only.

Written directly from the equations (SPEC 3.3, 3.4) over padded ``[B, H, T, T]``
tensors, sharing no code with the library.
"""
import torch


def allowed_pairs(lengths, max_len, direction="forward", include_self=False):
    """``[B, 1, T, T]`` bool, ``[b, 0, i, j]`` = source i may feed target j."""
    i = torch.arange(max_len).view(-1, 1)
    j = torch.arange(max_len).view(1, -1)
    if direction == "forward":
        order = (i <= j) if include_self else (i < j)
    else:
        order = (i >= j) if include_self else (i > j)
    valid = torch.arange(max_len).view(1, -1) < torch.as_tensor(lengths).view(-1, 1)
    return (order & valid[:, :, None] & valid[:, None, :]).unsqueeze(1)


def dense_graph(scores, allowed, normalization="relu2"):
    """Eq. 1 on scores ``[B, H, T(i), T(j)]``: normalise over sources i (dim 2)."""
    if normalization == "relu2":
        r = torch.where(allowed, torch.relu(scores) ** 2, torch.zeros(()))
        total = r.sum(2, keepdim=True)
        return torch.where(total > 0, r / torch.where(total > 0, total, torch.ones(())),
                           torch.zeros(()))
    masked = scores.masked_fill(~allowed, float("-inf"))
    soft = torch.softmax(masked, dim=2)
    return torch.where(allowed, soft, torch.zeros(()))


def dense_aggregate(graph, x_padded, heads):
    """``out[b, j, chunk h] = sum_i G[b, h, i, j] x[b, i, chunk h]`` (A @ X with A = G^T)."""
    b, t, c = x_padded.shape
    xh = x_padded.view(b, t, heads, c // heads).permute(0, 2, 1, 3)  # [B, H, T, c]
    out = graph.transpose(-1, -2) @ xh
    return out.permute(0, 2, 1, 3).reshape(b, t, c)


def pad(x, lengths):
    """Flat ``[N, ...]`` -> padded ``[B, T, ...]``."""
    lengths = list(map(int, lengths))
    out = x.new_zeros((len(lengths), max(lengths)) + tuple(x.shape[1:]))
    start = 0
    for b, n in enumerate(lengths):
        out[b, :n] = x[start:start + n]
        start += n
    return out


def batch_vector(lengths):
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.as_tensor(lengths))


def assert_same_values_and_grads(got, want, inputs):
    """``got`` equals ``want``, and so do their vector-Jacobian products w.r.t. ``inputs``."""
    torch.testing.assert_close(got, want)
    probe = torch.randn_like(want)
    grads_got = torch.autograd.grad((got * probe).sum(), inputs, retain_graph=True)
    grads_want = torch.autograd.grad((want * probe).sum(), inputs, retain_graph=True)
    for g, w in zip(grads_got, grads_want):
        torch.testing.assert_close(g, w)


def unpad(padded, lengths):
    """Padded ``[B, T, ...]`` -> flat ``[N, ...]``."""
    return torch.cat([padded[b, :int(n)] for b, n in enumerate(lengths)])


def dense_from_edges(edge_index, edge_weight, edge_head, lengths, heads):
    """``[B, H, T, T]`` with ``[b, h, i, j] = G_ij``, built edge by edge (no library code)."""
    lengths = [int(n) for n in lengths]
    starts = [sum(lengths[:b]) for b in range(len(lengths))]
    out = torch.zeros(len(lengths), heads, max(lengths), max(lengths), dtype=edge_weight.dtype)
    for (i, j), w, h in zip(edge_index.t().tolist(), edge_weight.tolist(), edge_head.tolist()):
        b = max(k for k, s in enumerate(starts) if s <= j)
        assert starts[b] <= i < starts[b] + lengths[b], "edge crosses sequences"
        out[b, h, i - starts[b], j - starts[b]] += w
    return out


def dense_mixture(x, graphs, lengths, weights, gamma, kinds, layers, heads):
    """``gamma * sum_c m_c (H C_c)`` with ``C = G^{l,h}`` (kind 'graph') or
    ``G^{0,h} G^{1,h} ... G^{l,h}`` (kind 'hierarchical'), components ordered
    (kind, layer, head); ``graphs`` is a list of dense ``[B, H, T, T]`` per layer,
    ``weights`` ``[K]`` or ``[N, K]``."""
    xp = pad(x, lengths)
    comps = []
    for kind in kinds:
        for l in layers:
            for h in range(heads):
                if kind == "graph":
                    a = graphs[l][:, h]
                else:
                    a = graphs[0][:, h]
                    for k in range(1, l + 1):
                        a = a @ graphs[k][:, h]
                comps.append(unpad(a.transpose(-1, -2) @ xp, lengths))  # out_j = sum_i C_ij x_i
    comps = torch.stack(comps)  # [K, N, C]
    w = weights if weights.dim() == 2 else weights.expand(x.size(0), -1)
    return gamma * torch.einsum("nk,knc->nc", w, comps)
