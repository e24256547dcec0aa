"""PickConv against a plain loop over the edges of PICK's graph convolution (values and
gradients, edge_index and EdgeIndex input, with and without edge features), stacking,
relative positions, and the door."""
import pytest
import torch
from torch_geometric import EdgeIndex

from glomo_pyg import PickConv
from glomo_pyg.nn import relative_positions


def loop_reference(conv: PickConv, x, edge_index, edge_weight, edge_attr):
    """h_ij = relu(W1 v_i + b + W2 v_j + alpha_ij), v'_i = relu(W sum_j A_ij h_ij),
    alpha'_ij = relu(W_alpha h_ij), one edge at a time."""
    w1, b = conv.lin_target.weight, conv.lin_target.bias
    w2, w, wa = conv.lin_source.weight, conv.lin.weight, conv.lin_alpha.weight
    sums = [x.new_zeros(conv.out_channels) for _ in range(x.size(0))]
    alphas = []
    for e in range(edge_index.size(1)):
        j, i = int(edge_index[0, e]), int(edge_index[1, e])
        pair = w1 @ x[i] + b + w2 @ x[j]
        if edge_attr is not None:
            pair = pair + (edge_attr[e] if conv.lin_edge is None
                           else conv.lin_edge.weight @ edge_attr[e])
        h = torch.relu(pair)
        weight = 1.0 if edge_weight is None else edge_weight[e]
        sums[i] = sums[i] + weight * h
        alphas.append(torch.relu(wa @ h))
    out = torch.stack([torch.relu(w @ s) for s in sums])
    return out, torch.stack(alphas)


def graph(n=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    # duplicates, a self loop, node 5 without incoming edges
    edge_index = torch.tensor([[0, 1, 2, 2, 3, 4, 1, 3], [1, 2, 0, 0, 3, 2, 4, 1]])
    x = torch.randn(n, 4, generator=gen, dtype=torch.float64)
    w = torch.rand(edge_index.size(1), generator=gen, dtype=torch.float64)
    return x, edge_index, w


def grads(outputs, inputs):
    total = sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum()
                for o in outputs)
    return torch.autograd.grad(total, inputs, allow_unused=True)


@pytest.mark.parametrize("edge_dim", [None, 3, "none"])
@pytest.mark.parametrize("form", ["tensor", "edge_index", "unweighted"])
def test_values_and_gradients_equal_the_loop(edge_dim, form):
    torch.manual_seed(0)
    x, edge_index, w = graph()
    conv = PickConv(4, 5, edge_dim=None if edge_dim == "none" else edge_dim).double()
    attr = None if edge_dim == "none" else \
        torch.randn(edge_index.size(1), edge_dim or 5, dtype=torch.float64)
    x.requires_grad_(True)
    w.requires_grad_(True)
    weight = None if form == "unweighted" else w
    if attr is not None:
        attr.requires_grad_(True)
    given = EdgeIndex(edge_index, sparse_size=(6, 6)) if form == "edge_index" else edge_index
    out, alpha = conv(x, given, weight, attr)
    want_out, want_alpha = loop_reference(conv, x, edge_index, weight, attr)
    assert out.shape == (6, 5) and alpha.shape == (edge_index.size(1), 5)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(alpha, want_alpha)
    assert torch.equal(out[5], torch.zeros(5, dtype=torch.float64))  # no incoming edge
    inputs = [x] + ([w] if weight is not None else []) + ([attr] if attr is not None else []) \
        + list(conv.parameters())
    for got, want in zip(grads((out, alpha), inputs), grads((want_out, want_alpha), inputs)):
        if want is None:
            assert got is None or torch.count_nonzero(got) == 0
        else:
            torch.testing.assert_close(got, want)


def test_two_layers_stack_through_the_edge_embedding():
    torch.manual_seed(1)
    x, edge_index, w = graph(seed=1)
    pos = torch.arange(6)
    first, second = PickConv(4, 5, edge_dim=2).double(), PickConv(5, 5).double()
    attr = relative_positions(edge_index, pos, 6.0).double()
    h, alpha = first(x, edge_index, w, attr)
    out, _ = second(h, edge_index, w, alpha)
    ref_h, ref_alpha = loop_reference(first, x, edge_index, w, attr)
    ref_out, _ = loop_reference(second, ref_h, edge_index, w, ref_alpha)
    torch.testing.assert_close(out, ref_out)


def test_relative_positions_of_tokens_and_pixels():
    edge_index = torch.tensor([[0, 3], [2, 1]])
    got = relative_positions(edge_index, torch.tensor([0, 1, 2, 3]), 4.0)
    torch.testing.assert_close(got, torch.tensor([[0.5, 0.5], [-0.5, 0.5]]))
    pos = torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1]])   # (row, column)
    got = relative_positions(edge_index, pos, 2.0)
    # edge 0 -> 2: (1 - 0, 0 - 0); edge 3 -> 1: (0 - 1, 1 - 1)
    want = torch.tensor([[1.0, 0.0, 1.0], [-1.0, 0.0, 1.0]]) / 2.0
    torch.testing.assert_close(got, want)
    # default scale: the largest position (here 1)
    torch.testing.assert_close(relative_positions(edge_index, pos), want * 2.0)


@pytest.mark.parametrize("scale", [0, -1.0, float("inf")])
def test_relative_positions_refuse_a_bad_scale(scale):
    with pytest.raises(ValueError, match="scale"):
        relative_positions(torch.tensor([[0], [1]]), torch.arange(2), scale)


def test_relative_positions_refuse_bad_input():
    with pytest.raises(ValueError, match="pos"):
        relative_positions(torch.tensor([[0], [1]]), torch.zeros(2, 2, 2))
    with pytest.raises(ValueError, match="outside"):
        relative_positions(torch.tensor([[0], [5]]), torch.arange(2))


def test_the_door():
    x, edge_index, w = graph()
    conv = PickConv(4, 5, edge_dim=3).double()
    attr = torch.randn(edge_index.size(1), 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="outside"):
        conv(x, edge_index + 10, w, attr)
    with pytest.raises(ValueError, match="NaN"):
        conv(x, edge_index, w.clone().fill_(float("nan")), attr)
    with pytest.raises(ValueError, match="edge_attr"):
        conv(x, edge_index, w, attr[:, :2])
    with pytest.raises(ValueError, match="edge_attr"):
        conv(x, edge_index, w, attr[:-1])
    with pytest.raises(ValueError, match="give edge_attr"):
        conv(x, edge_index, w)
    with pytest.raises(ValueError, match=r"\[N, 4\]"):
        conv(x[:, :3], edge_index, w, attr)
    with pytest.raises(ValueError, match="edge_index"):
        conv(x, edge_index.int(), w, attr)
    with pytest.raises(ValueError, match="edge_index"):
        conv(x, edge_index[0], w, attr)
    with pytest.raises(ValueError, match="edge_weight"):
        conv(x, edge_index, w[:-1], attr)
    with pytest.raises(ValueError, match="out_channels"):
        PickConv(4, 0)
