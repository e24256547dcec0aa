"""reset_parameters on every model a user builds: each trained part back to a fresh
initialisation (what the constructor drew, in distribution), the given parts kept."""
import pytest
import torch

from glomo_pyg import Glomo, GlomoTextClassifier
from glomo_pyg.nn.resets import reset_module

TRAINED = 0.123  # every trainable value after "training", so a part left alone shows


def _train(model):
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:  # (frozen parts stay as they are in training)
                p.fill_(TRAINED)


def _check_fresh(model, init, kept=()):
    """Every parameter not in ``kept`` (names) was re-drawn: not the trained value, and with
    the spread the constructor gave it; ``kept`` ones equal their initial values."""
    for name, p in model.named_parameters():
        if any(name.startswith(k) for k in kept):
            assert torch.equal(p, init[name]), name
            continue
        assert not torch.all(p == TRAINED), f"{name} was not reset"
        if p.numel() >= 16 and init[name].std() > 0:  # (drawn at random)
            ratio = (p.std() / init[name].std()).item()
            assert 0.5 < ratio < 2, (name, ratio)
        else:  # constants (biases, norms) come back exactly
            drawn = init[name].numel() > 1 and init[name].std() > 0
            assert drawn or torch.equal(p, init[name]), name


def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("build", [
    lambda: Glomo.text(30, hidden_channels=16, num_layers=2, heads=2, cnn_layers=1),
    lambda: Glomo.text(30, hidden_channels=16, num_layers=1, heads=2, decouple=False),
    lambda: Glomo.image(4, 4, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1),
])
def test_glomo_and_its_predictor_reset(build):
    torch.manual_seed(0)
    model = build()
    init = _snapshot(model)
    _train(model)
    model.reset_parameters()
    _check_fresh(model, init)
    predictor = model.to_pretrained([f"w{k}" for k in range(30)]
                                    if model.num_tokens else None)
    init = _snapshot(predictor)
    _train(predictor)
    predictor.reset_parameters()
    _check_fresh(predictor, init)
    assert predictor.vocabulary is None or predictor.vocabulary[3] == "w3"


@pytest.mark.parametrize("freeze", [True, False])
def test_text_classifier_resets_all_but_the_given_vectors_and_the_frozen_predictor(freeze):
    torch.manual_seed(0)
    pretrained = Glomo.text(30, hidden_channels=16, num_layers=1, heads=2, cnn_layers=1)
    predictor = pretrained.to_pretrained([f"w{k}" for k in range(30)])
    embedding = torch.randn(30, 8)
    model = GlomoTextClassifier(embedding, predictor=predictor, places=("embedding", "rnn"),
                                hidden_channels=8, rnn_layers=2, attention_heads=2,
                                freeze_embedding=freeze)
    init = _snapshot(model)
    _train(model)
    if not freeze:
        assert torch.all(model.embedding.weight == TRAINED)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters()
              if ".predictor." in n}
    assert frozen  # (the predictor is a part of the model)
    model.reset_parameters()
    for n, p in model.named_parameters():
        if ".predictor." in n:
            assert torch.equal(p, frozen[n]), n  # not re-drawn: it is the pretrained one
    _check_fresh(model, init, kept=["embedding."] + sorted(frozen))
    assert torch.equal(model.embedding.weight, embedding)
    assert "_given_embedding" not in model.state_dict()


def test_reset_module_reaches_attention_input_projections():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.MultiheadAttention(8, 2), torch.nn.Linear(8, 8))
    init = _snapshot(model)
    _train(model)
    reset_module(model)
    _check_fresh(model, init)


def test_the_plain_resnet_and_its_blocks_reset():
    from glomo_pyg.nn.resnet import CifarResNet

    torch.manual_seed(0)
    model = CifarResNet(depth=18, width=4)
    init = _snapshot(model)
    _train(model)
    model.reset_parameters()
    _check_fresh(model, init)
