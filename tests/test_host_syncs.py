"""A steady-state forward launches kernels and returns: no ``.item()``, ``.tolist()``,
``bool(tensor)``, ``.cpu()`` (...) during the emission, :class:`GlomoTransfer` and
:class:`GatedFusion` once their input was validated at the door (issue 50)."""
import pytest
import torch
from host_syncs import count_host_syncs, total

from glomo_pyg import (
    DirectionalGraphs,
    GatedFusion,
    GlomoTransfer,
    GraphPredictor,
    PixelGraphPredictor,
)
from glomo_pyg.nn import PretrainedGraphPredictor
from glomo_pyg.sequences import sequence_batch

LENGTHS = [5, 1, 9, 3]


def steady(fn):
    """Syncs of ``fn()`` after one warm-up call with the same shapes."""
    fn()
    with count_host_syncs() as counts:
        fn()
    return counts


def text_predictor(direction="forward"):
    torch.manual_seed(0)
    return GraphPredictor(num_tokens=20, hidden_channels=16, num_layers=2, heads=2,
                          cnn_layers=1, direction=direction).eval()


def text_batch():
    x = torch.randint(0, 20, (sum(LENGTHS),))
    batch = torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS))
    return x, sequence_batch(x.numel(), batch, x.device)  # the door: validated once


@pytest.mark.parametrize("layout", ["sparse", "dense"])
@pytest.mark.parametrize("heads", [2, 1])
def test_text_emission_does_not_sync(layout, heads):
    torch.manual_seed(0)
    predictor = GraphPredictor(num_tokens=20, hidden_channels=16, num_layers=2, heads=heads,
                               cnn_layers=1, block_size=16).eval()  # several blocks
    x, sequences = text_batch()
    counts = steady(lambda: predictor.emit(x, sequences, layout))
    assert total(counts) == 0, counts
    with torch.no_grad():
        graphs = predictor.emit(x, sequences, layout)
    assert graphs.num_edges[0] > 0


def test_emission_with_gradients_does_not_sync():
    predictor = text_predictor().train()
    x, sequences = text_batch()

    def step():
        graphs = predictor.emit(x, sequences, "sparse")
        sum(w.sum() for w in graphs.edge_weight).backward()

    assert total(steady(step)) == 0


@pytest.mark.parametrize("layout", ["sparse", "dense"])
def test_pixel_emission_does_not_sync(layout):
    torch.manual_seed(0)
    predictor = PixelGraphPredictor(4, 3, hidden_channels=8, num_layers=2, heads=2,
                                    cnn_layers=1, direction="backward").eval()
    x = torch.randint(0, 256, (2 * 12, 3), dtype=torch.uint8)
    sequences = sequence_batch(x.size(0), torch.arange(2).repeat_interleave(12), x.device)
    assert total(steady(lambda: predictor.emit(x, sequences, layout))) == 0


@pytest.fixture(scope="module")
def transfer_setting():
    predictor = PretrainedGraphPredictor(text_predictor("forward"), text_predictor("backward"))
    transfer = GlomoTransfer(predictor, in_channels=6, mixing="conditioned")
    x, sequences = text_batch()
    graphs = transfer.graphs(x, sequences.batch)
    return transfer, graphs, torch.randn(x.numel(), 6, requires_grad=True)


@pytest.mark.parametrize("layout", ["sparse", "dense"])
def test_transfer_forward_does_not_sync(transfer_setting, layout):
    transfer, graphs, h = transfer_setting
    if layout == "dense":
        graphs = DirectionalGraphs(*(g.to_dense_layout() for g in graphs))
    assert total(steady(lambda: transfer(h, graphs=graphs))) == 0
    propagated = transfer.propagations(h, graphs=graphs)
    assert total(steady(lambda: transfer(h, propagated=propagated))) == 0


def test_transfer_baselines_do_not_sync(transfer_setting):
    transfer, _, h = transfer_setting
    none = GlomoTransfer(transfer.predictor, in_channels=6, graph="none")
    assert total(steady(lambda: none(h))) == 0


def test_gated_fusion_does_not_sync():
    fusion = GatedFusion(4, num_mixtures=2)
    x = torch.randn(7, 4)
    mixed = [torch.randn(7, 4), torch.randn(7, 4)]
    assert total(steady(lambda: fusion(x, mixed))) == 0
