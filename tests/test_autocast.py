"""bf16/fp16 autocast: finite outputs close to fp32 across the public layers, in both
graph layouts (normalisation and sparse products run in fp32 inside)."""
import pytest
import torch
from reference import batch_vector

from glomo_pyg import Glomo, GlomoConv, GraphPredictor

LENGTHS = [6, 1, 11]


@pytest.fixture
def data():
    torch.manual_seed(0)
    return torch.randint(0, 30, (sum(LENGTHS),)), batch_vector(LENGTHS)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["sparse", "dense"])
def test_emission_and_aggregation_under_autocast(data, dtype, layout):
    x, batch = data
    predictor = GraphPredictor(num_tokens=30, hidden_channels=16, num_layers=2, heads=4,
                               cnn_layers=1).set_layout(layout)
    with torch.no_grad():
        predictor.scorer.bias.fill_(300.0)  # scores ~300: their squares overflow fp16 (65504)
    want = predictor(x, batch)
    with torch.autocast("cpu", dtype=dtype):
        got = predictor(x, batch)
    dense_want, dense_got = want.to_dense(), got.to_dense()
    assert torch.isfinite(dense_got).all()
    assert dense_got.dtype == torch.float32  # normalised in fp32
    torch.testing.assert_close(dense_got, dense_want, atol=0.05, rtol=0.05)
    conv = GlomoConv(16, heads=4, update="gru")
    h = torch.randn(sum(LENGTHS), 16, requires_grad=True)
    ref = conv.propagate_graphs(h, want, 1)
    with torch.autocast("cpu", dtype=dtype):
        out = conv.propagate_graphs(h, want, 1)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=0.05, rtol=0.05)
    out.float().sum().backward()
    assert torch.isfinite(h.grad).all()


@pytest.mark.parametrize("layout", ["sparse", "dense"])
def test_pretraining_loss_under_bf16_autocast(data, layout):
    x, batch = data
    torch.manual_seed(1)
    model = Glomo.text(num_tokens=30, hidden_channels=16, num_layers=2, heads=4,
                       cnn_layers=1).set_layout(layout).eval()
    want = model(x, batch).loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = model(x, batch).loss
    assert torch.isfinite(got)
    torch.testing.assert_close(got.float(), want, atol=0.05, rtol=0.02)
    got.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
