"""GlomoResNet.reset_parameters: the ResNet and the input stage's own weights re-drawn as
the constructor drew them, the frozen pixel-graph predictor kept."""
import torch

from glomo_pyg import Glomo, GlomoResNet, GlomoTransfer


def test_glomo_resnet_resets_all_but_the_frozen_predictor():
    torch.manual_seed(1)
    predictor = Glomo.image(in_channels=3, height=8, width=8, hidden_channels=8, num_layers=1,
                            heads=2, cnn_layers=1, num_positions=4).to_pretrained()
    torch.manual_seed(0)
    model = GlomoResNet(GlomoTransfer(predictor, 3, graph="learned"), width=4)
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all(".predictor." in n for n in frozen)
    model(torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8))  # BatchNorm statistics
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.fill_(0.123)  # "trained"
    model.reset_parameters()
    for name, p in model.named_parameters():
        if name in frozen:
            assert torch.equal(p, init[name]), name  # the pretrained predictor
            continue
        assert not torch.all(p == 0.123), f"{name} was not reset"
        if p.numel() >= 16 and init[name].std() > 0:  # drawn at random: the same spread
            assert 0.5 < (p.std() / init[name].std()).item() < 2, name
        else:  # constants (biases, norms) come back exactly
            assert torch.equal(p, init[name]) or init[name].std() > 0, name
    bn = model.resnet.stem[1]
    assert torch.equal(bn.running_mean, torch.zeros_like(bn.running_mean))
    assert int(bn.num_batches_tracked) == 0
