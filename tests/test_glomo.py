"""The pretraining model: causality through the whole network, objective, ablations."""
import pytest
import torch
from reference import batch_vector

from glomo_pyg import ContextDecoder, FeaturePredictor, Glomo, GraphPredictor
from glomo_pyg.nn.decoder import IGNORE
from glomo_pyg.sequences import sequence_batch

LENGTHS = [6, 1, 9, 4]
SMALL = dict(hidden_channels=16, num_layers=2, heads=2, cnn_layers=2, num_positions=5)


def _batch(lengths=LENGTHS, vocab=25):
    batch = batch_vector(lengths)
    return torch.randint(0, vocab, (batch.numel(),)), batch


def _probe_embeddings(model):
    """Add a zero leaf to every embedding output so d(.)/d emb(x_t) can be read."""
    probes = []

    def hook(module, inputs, output):
        probe = torch.zeros_like(output, requires_grad=True)
        probes.append(probe)
        return output + probe

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, torch.nn.Embedding)]
    return probes, handles


@pytest.mark.parametrize("kw", [dict(), dict(decouple=False), dict(sparse=False),
                                dict(include_self=True, update="residual"),
                                dict(pooled_context=True),
                                dict(pooled_context=True, decouple=False, include_self=True),
                                dict(local_context=2),
                                dict(local_context=1, decouple=False, update="residual")])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_features_are_causal_through_the_whole_network(kw, direction):
    model = Glomo.text(25, **SMALL, **kw).double().train()
    for module in model.modules():  # pooled/local-context maps start at zero: make them count
        if isinstance(module, FeaturePredictor):
            for lin in [*(module.pooled or ()), *(module.local or ())]:
                torch.nn.init.normal_(lin.weight)
    x = torch.randint(0, 25, (10,))
    probes, handles = _probe_embeddings(model)
    f, _ = model.features(x, direction=direction)
    for h in handles:
        h.remove()
    assert len(probes) == (2 if model.decouple else 1)  # g's and f's embeddings
    for t in range(10):
        grads = torch.autograd.grad(f[t].sum(), probes, retain_graph=True, allow_unused=True)
        for g in grads:
            if g is None:
                continue
            other_side = g[t + 1:] if direction == "forward" else g[:t]
            assert torch.count_nonzero(other_side) == 0, f"f_{t} sees the other side"
        assert torch.count_nonzero(grads[-1][t]) > 0  # f's embedding of x_t itself feeds f_t


def test_loss_is_finite_and_every_parameter_learns():
    model = Glomo.text(25, **SMALL).double()
    out = model(*_batch())
    assert out.loss.dim() == 0 and torch.isfinite(out.loss)
    for key in ("forward/loss", "backward/loss", "forward/accuracy", "forward/density", "loss"):
        assert key in out.metrics
    torch.testing.assert_close(out.loss.detach(), (out.metrics["forward/loss"] +
                                                   out.metrics["backward/loss"]) / 2)
    out.loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing


def test_eval_mode_uses_every_position_deterministically():
    model = Glomo.text(25, **SMALL).double().eval()
    x, batch = _batch()
    sequences = sequence_batch(x.numel(), batch, x.device)
    fw = model._positions(sequences, "forward")
    bw = model._positions(sequences, "backward")
    assert fw.numel() == sum(n - 1 for n in LENGTHS) == bw.numel()
    assert torch.equal(model(x, batch).loss, model(x, batch).loss)


def test_training_samples_at_most_num_positions_per_sequence():
    model = Glomo.text(25, **SMALL).train()
    x, batch = _batch()
    sequences = sequence_batch(x.numel(), batch, x.device)
    for direction in ("forward", "backward"):
        pos = model._positions(sequences, direction)
        counts = torch.bincount(batch[pos], minlength=len(LENGTHS))
        assert counts.tolist() == [min(n - 1, 5) for n in LENGTHS]
        local = sequences.position[pos]
        length = sequences.lengths[batch[pos]]
        assert bool((local < length - 1).all() if direction == "forward" else (local > 0).all())


def test_targets_are_the_next_and_previous_units():
    model = Glomo.text(25, **SMALL, context_length=3)
    x = torch.arange(8)
    batch = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])
    sequences = sequence_batch(8, batch, x.device)
    positions = torch.tensor([0, 3, 5])
    fw = model.decoders["fw"].targets(x, sequences, positions, "forward")
    bw = model.decoders["bw"].targets(x, sequences, positions, "backward")
    assert fw.tolist() == [[1, 2, 3], [4, IGNORE, IGNORE], [6, 7, IGNORE]]
    assert bw.tolist() == [[IGNORE] * 3, [2, 1, 0], [IGNORE] * 3]


def test_sequence_objective_pools_prefix_and_suffix():
    f = torch.randn(7, 3, dtype=torch.float64)
    sequences = sequence_batch(7, torch.tensor([0, 0, 0, 1, 1, 1, 1]), f.device)
    fw = Glomo._pooled(f, sequences, "forward")
    bw = Glomo._pooled(f, sequences, "backward")
    torch.testing.assert_close(fw[4], f[3:5].mean(0))
    torch.testing.assert_close(bw[4], f[4:7].mean(0))
    torch.testing.assert_close(fw[2], f[0:3].mean(0))
    torch.testing.assert_close(bw[0], f[0:3].mean(0))


def test_ablation_switches_change_exactly_what_they_claim():
    x, batch = _batch()
    base = Glomo.text(25, **SMALL)
    assert set(base.graph_predictors.keys()) == {"fw", "bw"}
    coupled = Glomo.text(25, **SMALL, decouple=False)
    assert len(coupled.graph_predictors) == 0
    assert coupled.feature_predictors["fw"].scorer is not None
    g = coupled.graphs(x, batch)
    assert g.forward.num_layers == 2 and g.backward.direction == "backward"
    dense = Glomo.text(25, **SMALL, sparse=False).graphs(x, batch).forward
    assert dense.density() == pytest.approx([1.0, 1.0])
    single = Glomo.text(25, **{**SMALL, "num_layers": 1}).graphs(x, batch).forward
    assert single.num_layers == 1
    d1 = Glomo.text(25, **SMALL, context_length=1)
    assert d1.decoders["fw"].context_length == 1 and torch.isfinite(d1(x, batch).loss)
    unit = Glomo.text(25, **SMALL, objective="sequence")
    assert torch.isfinite(unit(x, batch).loss)
    forward_only = Glomo.text(25, **SMALL, bidirectional=False)
    assert forward_only.graphs(x, batch).backward is None
    assert "backward/loss" not in forward_only(x, batch).metrics


def test_decoder_output_is_tied_to_the_embedding():
    fp = FeaturePredictor(num_tokens=11, hidden_channels=8, num_layers=1, heads=2)
    dec = ContextDecoder(fp.embedding, 8, context_length=2)
    assert dec.embedding.weight is fp.embedding.weight
    logits = dec(torch.randn(4, 8), torch.tensor([[1, 2], [3, IGNORE], [0, 0], [5, 6]]))
    assert logits.shape == (4, 2, 11)


def test_feature_predictor_propagates_given_graphs():
    gp = GraphPredictor(num_tokens=25, hidden_channels=16, num_layers=2, heads=2)
    fp = FeaturePredictor(num_tokens=25, hidden_channels=16, num_layers=2, heads=2)
    x, batch = _batch()
    graphs = gp(x, batch)
    f, used = fp(x, graphs, batch)
    assert f.shape == (x.numel(), 16) and used is graphs
    with pytest.raises(ValueError, match="pass graphs"):
        fp(x, None, batch)
    wrong = GraphPredictor(num_tokens=25, hidden_channels=16, num_layers=1, heads=2)(x, batch)
    with pytest.raises(ValueError, match="layers"):
        fp(x, wrong, batch)


def test_bad_input_is_rejected_with_clear_errors():
    model = Glomo.text(25, **SMALL)
    with pytest.raises(ValueError, match="length 1"):
        model(torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"\[0, 25\)"):
        model(torch.tensor([1, 99]))
    with pytest.raises(TypeError, match="int64|integer"):
        model(torch.randn(4))
    with pytest.raises(ValueError, match="sorted"):
        model(torch.tensor([1, 2, 3]), torch.tensor([1, 0, 1]))
    with pytest.raises(ValueError, match="objective"):
        Glomo.text(25, objective="document")
    with pytest.raises(ValueError, match="context_length"):
        Glomo.text(25, **SMALL, context_length=0)
    with pytest.raises(ValueError, match="direction"):
        model.features(torch.tensor([1, 2]), direction="up")


def test_set_token_embeddings_fills_every_embedding_and_keeps_padding_zero():
    torch.manual_seed(0)
    model = Glomo.text(num_tokens=12, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1,
                       padding_idx=0)
    weight = torch.randn(12, 8)
    model.set_token_embeddings(weight)
    embeddings = [model.graph_predictors[k].encoder.embedding for k in model.graph_predictors] + \
        [model.feature_predictors[k].embedding for k in model.feature_predictors]
    assert len({id(e) for e in embeddings}) == 4  # g and f, both directions, each its own
    for e in embeddings:
        assert torch.equal(e.weight[1:], weight[1:]) and not e.weight[0].any()
    # the decoders stay tied to f's embedding, so they predict with the new vectors too
    for k, decoder in model.decoders.items():
        assert decoder.embedding is model.feature_predictors[k].embedding
    weight[3] += 1  # a copy, not a view of the caller's tensor
    assert not torch.equal(embeddings[0].weight[3], weight[3])
    # without a padding index every row is copied
    plain = Glomo.text(num_tokens=5, hidden_channels=4, num_layers=1, heads=1, cnn_layers=1)
    plain.set_token_embeddings(torch.ones(5, 4))
    assert plain.feature_predictors["fw"].embedding.weight.eq(1).all()


def test_set_token_embeddings_of_one_part_leave_the_other_alone():
    torch.manual_seed(0)
    weight = torch.randn(12, 8)
    for parts, changed in ((("graph",), "graph"), (["features"], "features")):
        model = Glomo.text(num_tokens=12, hidden_channels=8, num_layers=1, heads=2,
                           cnn_layers=1, padding_idx=0)
        g = {k: p.encoder.embedding.weight.clone() for k, p in model.graph_predictors.items()}
        f = {k: p.embedding.weight.clone() for k, p in model.feature_predictors.items()}
        model.set_token_embeddings(weight, parts)
        for k in model.graph_predictors:
            now = model.graph_predictors[k].encoder.embedding.weight
            assert torch.equal(now[1:], weight[1:]) if changed == "graph" else \
                torch.equal(now, g[k])
        for k in model.feature_predictors:
            now = model.feature_predictors[k].embedding.weight
            assert torch.equal(now[1:], weight[1:]) if changed == "features" else \
                torch.equal(now, f[k])
            assert model.decoders[k].embedding is model.feature_predictors[k].embedding
    model = Glomo.text(num_tokens=12, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1)
    for bad in ("graph", (), ("graph", "graph"), ("g",), None):
        with pytest.raises(ValueError, match="parts must be a non-empty sequence"):
            model.set_token_embeddings(weight, bad)
    coupled = Glomo.text(num_tokens=12, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1,
                         decouple=False)
    with pytest.raises(ValueError, match="decouple=False .*both"):
        coupled.set_token_embeddings(weight, ("graph",))
    coupled.set_token_embeddings(weight, ("features", "graph"))
    assert all(torch.equal(p.embedding.weight, weight)
               for p in coupled.feature_predictors.values())


def test_set_token_embeddings_refuses_bad_weights():
    model = Glomo.text(num_tokens=12, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1)
    for bad, message in ((torch.randn(11, 8), r"shape \(12, 8\).*got \(11, 8\)"),
                         (torch.randn(12, 8, 1), "shape"),
                         (torch.ones(12, 8, dtype=torch.long), "floating-point"),
                         ([[0.0] * 8] * 12, "got list"),
                         (torch.full((12, 8), float("nan")), "NaN"),
                         # finite in float64, infinite in the embeddings' float32
                         (torch.full((12, 8), 1e300, dtype=torch.float64), "beyond the range"),
                         (torch.empty(12, 8, device="meta"), "meta device"),
                         (torch.ones(12, 8).to_sparse(), "dense")):
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(ValueError, match=message):
            model.set_token_embeddings(bad)
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    pixels = Glomo.image(height=4, width=4, hidden_channels=8, num_layers=1, heads=2,
                         cnn_layers=1)
    with pytest.raises(ValueError, match="no token embeddings"):
        pixels.set_token_embeddings(torch.zeros(12, 8))
