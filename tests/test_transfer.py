"""Graph transfer: GraphMixer, GatedFusion, GlomoTransfer and the uniform baseline,
against dense references written from SPEC 4."""
import pytest
import torch
from reference import (
    allowed_pairs,
    assert_same_values_and_grads,
    batch_vector,
    dense_from_edges,
    dense_mixture,
)

from glomo_pyg import (
    DirectionalGraphs,
    GatedFusion,
    Glomo,
    GlomoTransfer,
    GraphMixer,
    GraphPredictor,
    LatentGraphs,
    PretrainedGraphPredictor,
)
from glomo_pyg.nn import FeatureGraphEmitter, FeaturePredictor

LENGTHS = [5, 1, 9, 3]
LAYERS, HEADS, TOKENS = 3, 4, 40


def make_predictor(norm="layer", dropout=0.0, decouple=True, directions=("forward", "backward")):
    parts = {}
    for d in directions:
        if decouple:
            parts[d] = GraphPredictor(num_tokens=TOKENS, hidden_channels=32, num_layers=LAYERS,
                                      heads=HEADS, direction=d, cnn_layers=2, norm=norm,
                                      dropout=dropout)
        else:
            parts[d] = FeatureGraphEmitter(num_tokens=TOKENS, hidden_channels=32,
                                           num_layers=LAYERS, heads=HEADS, direction=d)
    return PretrainedGraphPredictor(parts.get("forward"), parts.get("backward"))


def inputs(lengths=LENGTHS):
    x = torch.randint(0, TOKENS, (sum(lengths),))
    return x, batch_vector(lengths)


@pytest.fixture(scope="module")
def setting():
    torch.manual_seed(1)
    predictor = make_predictor()
    x, batch = inputs()
    with torch.no_grad():
        graphs = predictor(x, batch)
    dense = {d: [dense_from_edges(*g.layer(l), LENGTHS, HEADS) for l in range(LAYERS)]
             for d, g in zip(("forward", "backward"), graphs)}
    return predictor, x, batch, graphs, dense


def one_hot_logits(mixer, index, direction=0):
    with torch.no_grad():
        mixer.logits.fill_(-1e4)  # exp(-1e4) is exactly 0 in fp32
        mixer.logits[direction, index] = 0.0


def test_graphs_are_nontrivial(setting):
    _, _, _, graphs, _ = setting
    for g in graphs:
        assert all(0.05 < d < 0.95 for d in g.density())  # sparse but not empty


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_hierarchical_chain_equals_dense_products(setting, direction):
    _, _, _, graphs, dense = setting
    h = torch.randn(sum(LENGTHS), 6)
    mixer = GraphMixer(6, LAYERS, HEADS, directions=[direction], propagation="hierarchical")
    assert mixer.components() == [("hierarchical", l, k) for l in range(LAYERS)
                                  for k in range(HEADS)]
    for l in range(LAYERS):
        for head in range(HEADS):
            one_hot_logits(mixer, l * HEADS + head)
            out, = mixer(h, getattr(graphs, direction))
            lam = dense[direction][0][:, head]
            for k in range(1, l + 1):  # Lambda^l = G^1 G^2 ... G^l, explicit dense products
                lam = lam @ dense[direction][k][:, head]
            want = torch.cat([(lam[b, :n, :n].t() @ h[s:s + n])
                              for b, (n, s) in enumerate(zip(LENGTHS, [0, 5, 6, 15]))])
            torch.testing.assert_close(out, want)


@pytest.mark.parametrize("kind", ["graph", "hierarchical"])
def test_one_component_equals_its_propagation_conditioned(setting, kind):
    _, _, _, graphs, dense = setting
    h = torch.randn(sum(LENGTHS), 5)
    mixer = GraphMixer(5, LAYERS, HEADS, mixing="conditioned", propagation="both")
    index = mixer.components().index((kind, 2, 1))
    with torch.no_grad():
        for lin in mixer.weight_lins:
            lin.bias.fill_(-1e4)
            lin.bias[index] = 0.0
    for d, direction in enumerate(("forward", "backward")):
        out = mixer(h, graphs)[d]
        weights = torch.zeros(mixer.num_components)
        weights[index] = 1.0
        want = dense_mixture(h, dense[direction], LENGTHS, weights, 1.0, mixer.kinds,
                             mixer.layers, HEADS)
        torch.testing.assert_close(out, want)


@pytest.mark.parametrize("mixing", ["free", "conditioned"])
@pytest.mark.parametrize("propagation,layers", [("both", None), ("graph", None),
                                                ("hierarchical", [1]), ("both", [0, 2])])
def test_mixture_matches_dense_reference_values_and_grads(setting, mixing, propagation, layers):
    _, _, _, graphs, dense = setting
    h = torch.randn(sum(LENGTHS), 7, requires_grad=True)
    mixer = GraphMixer(7, LAYERS, HEADS, mixing=mixing, propagation=propagation, layers=layers)
    with torch.no_grad():  # move off the uniform initialisation
        for p in mixer.parameters():
            p.add_(0.5 * torch.randn_like(p))
    outs = mixer(h, graphs)
    weights = mixer.mixture_weights(h)
    params = [h, *mixer.parameters()]
    for d, direction in enumerate(("forward", "backward")):
        want = dense_mixture(h, dense[direction], LENGTHS, weights[d], mixer.gamma[d],
                             mixer.kinds, mixer.layers, HEADS)
        assert_same_values_and_grads(outs[d], want, params)


def test_mixture_weights_sum_to_one():
    h = torch.randn(11, 9)
    for mixing in ("free", "conditioned"):
        mixer = GraphMixer(9, 2, 3, mixing=mixing)
        torch.testing.assert_close(mixer.mixture_weights(h).sum(-1),
                                   torch.ones(mixer.mixture_weights(h).shape[:-1]))
        # the initialisation is the uniform mixture
        torch.testing.assert_close(mixer.mixture_weights(h),
                                   torch.full_like(mixer.mixture_weights(h), 1 / 12))
        with torch.no_grad():
            for p in mixer.parameters():
                p.normal_()
        w = mixer.mixture_weights(h)
        assert w.shape == ((2, 12) if mixing == "free" else (2, 11, 12))
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
        assert (w > 0).all()


def test_transfer_onto_wider_features_than_the_predictor():
    """300-d vectors on a 64-d predictor (issue 3: any width)."""
    predictor = PretrainedGraphPredictor(
        *(GraphPredictor(num_tokens=TOKENS, hidden_channels=64, num_layers=2, heads=8, direction=d,
                         cnn_layers=1) for d in ("forward", "backward")))
    x, batch = inputs([6, 11])
    h = torch.randn(17, 300, requires_grad=True)
    transfer = GlomoTransfer(predictor, in_channels=300, fusion_channels=128)
    out = transfer(h, x, batch)
    assert out.shape == (17, 428) and transfer.out_channels == 428
    torch.testing.assert_close(out[:, :300], h)
    out.sum().backward()
    assert h.grad is not None and torch.isfinite(h.grad).all()
    graphs = predictor(x, batch)
    dense = [dense_from_edges(*graphs.forward.layer(l), [6, 11], 8) for l in range(2)]
    got = transfer.mixer(h, graphs)[0]
    want = dense_mixture(h, dense, [6, 11], transfer.mixer.mixture_weights()[0], 1.0,
                         transfer.mixer.kinds, transfer.mixer.layers, 8)
    torch.testing.assert_close(got, want)


def test_mixer_rejects_bad_input(setting):
    _, _, _, graphs, _ = setting
    n = sum(LENGTHS)
    mixer = GraphMixer(4, LAYERS, HEADS)
    with pytest.raises(ValueError, match=r"shape \[N, 4\]"):
        mixer(torch.randn(n, 5), graphs)
    with pytest.raises(TypeError, match="floating-point"):
        mixer(torch.ones(n, 4, dtype=torch.long), graphs)
    with pytest.raises(ValueError, match="cover 18 units, x has 17"):
        mixer(torch.randn(n - 1, 4), graphs)
    with pytest.raises(ValueError, match="missing \\['backward'\\]"):
        mixer(torch.randn(n, 4), graphs.forward)
    with pytest.raises(ValueError, match="built for 3 x 2"):
        GraphMixer(4, LAYERS, 2)(torch.randn(n, 4), graphs)
    with pytest.raises(ValueError, match="layers must be"):
        GraphMixer(4, LAYERS, HEADS, layers=[3])
    with pytest.raises(ValueError, match="layers must be"):
        GraphMixer(4, LAYERS, HEADS, layers=[])
    with pytest.raises(ValueError, match="mixing"):
        GraphMixer(4, LAYERS, HEADS, mixing="softmax")
    with pytest.raises(ValueError, match="propagation"):
        GraphMixer(4, LAYERS, HEADS, propagation="lambda")
    with pytest.raises(ValueError, match="directions"):
        GraphMixer(4, LAYERS, HEADS, directions=["forward", "forward"])
    with pytest.raises(ValueError, match="pass x"):
        GraphMixer(4, LAYERS, HEADS, mixing="conditioned").mixture_weights()


def test_gated_fusion_formula_and_errors():
    fusion = GatedFusion(6, num_mixtures=2, fusion_channels=4)
    h, a, b = torch.randn(3, 10, 6).unbind(0)
    out = fusion(h, [a, b])
    z = torch.cat([h, a, b], -1)
    w1, b1 = fusion.transform.weight, fusion.transform.bias
    w2, b2 = fusion.gate.weight, fusion.gate.bias
    want = torch.cat([h, (z @ w1.t() + b1) * torch.sigmoid(z @ w2.t() + b2)], -1)
    torch.testing.assert_close(out, want)
    assert fusion.out_channels == 10 and out.shape == (10, 10)
    assert GatedFusion(6).out_channels == 12
    with pytest.raises(ValueError, match="expected 2 mixtures"):
        fusion(h, [a])
    with pytest.raises(ValueError,
                       match=r"each of the shape \(10, 6\).*got \(10, 6\) on cpu, \(10, 5\)"):
        fusion(h, [a, b[:, :5]])
    with pytest.raises(ValueError, match="positive"):
        GatedFusion(6, fusion_channels=0)


def test_frozen_predictor_gets_no_gradient_and_never_changes():
    """BatchNorm and dropout in the predictor: train-mode steps of the downstream
    model must leave its weights, its running statistics and its graphs unchanged."""
    torch.manual_seed(3)
    predictor = make_predictor(norm="batch", dropout=0.3)
    x, batch = inputs()
    before = {k: v.clone() for k, v in predictor.state_dict().items()}
    with torch.no_grad():
        graphs_before = predictor.eval()(x, batch)
    transfer = GlomoTransfer(predictor, in_channels=8, mixing="conditioned")
    head = torch.nn.Linear(transfer.out_channels, 1)
    model = torch.nn.ModuleList([transfer, head]).train()
    assert all(not p.requires_grad for p in predictor.parameters())
    assert not predictor.training and transfer.training
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    h = torch.randn(sum(LENGTHS), 8)
    for _ in range(3):
        opt.zero_grad()
        loss = head(transfer(h, x, batch)).pow(2).mean()
        loss.backward()
        opt.step()
    assert all(p.grad is None for p in predictor.parameters())
    for name in ("mixer.gamma", "mixer.weight_lins.0.weight", "mixer.weight_lins.1.bias",
                 "fusion.transform.weight", "fusion.gate.weight"):
        grad = dict(transfer.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name
    after = predictor.state_dict()
    assert any("running_mean" in k for k in after)
    for k, v in before.items():
        assert torch.equal(v, after[k]), k
    graphs_after = predictor(x, batch)
    for g0, g1 in zip(graphs_before, graphs_after):
        for l in range(LAYERS):
            assert torch.equal(g0.edge_weight[l], g1.edge_weight[l])
    # the free mixture's logits get gradients as well
    free = GlomoTransfer(predictor, in_channels=8)
    free(h, x, batch).sum().backward()
    assert free.mixer.logits.grad is not None and free.mixer.logits.grad.abs().sum() > 0


def assert_layers_equal(g, want, lengths):
    """Every layer of ``g`` is the dense ``want`` [B, H, T, T], with positive weights and
    edges sorted by (head, target, source), as emitted graphs are."""
    n = sum(lengths)
    for l in range(g.num_layers):
        torch.testing.assert_close(dense_from_edges(*g.layer(l), lengths, g.num_heads), want)
        assert (g.edge_weight[l] > 0).all()
        (src, tgt), head = g.edge_index[l], g.edge_head[l]
        key = (head * n + tgt) * n + src
        assert (key[1:] > key[:-1]).all()


FIXED_PTR, FIXED_LENGTHS = torch.tensor([0, 4, 5, 12]), [4, 1, 7]
EVERY_RULE = pytest.mark.parametrize("direction,include_self", [
    ("forward", False), ("forward", True), ("backward", False), ("backward", True)])


@EVERY_RULE
def test_uniform_graphs_follow_the_conventions(direction, include_self):
    lengths = FIXED_LENGTHS
    g = LatentGraphs.uniform(FIXED_PTR, num_layers=2, num_heads=3, direction=direction,
                             include_self=include_self)
    allowed = allowed_pairs(lengths, 7, direction, include_self).float()
    count = allowed.sum(2, keepdim=True)
    want = torch.where(count > 0, allowed / count.clamp(min=1), torch.zeros(()))
    assert_layers_equal(g, want.expand(3, 3, 7, 7), lengths)
    assert g.density() == [1.0, 1.0]


@EVERY_RULE
def test_adjacent_graphs_link_each_unit_to_its_neighbour(direction, include_self):
    ptr, lengths = FIXED_PTR, FIXED_LENGTHS
    g = LatentGraphs.adjacent(ptr, num_layers=2, num_heads=3, direction=direction,
                              include_self=include_self)
    want = torch.zeros(3, 7, 7)  # [B, source, target], written out by position
    for b, t in enumerate(lengths):
        for j in range(t):
            i = j - 1 if direction == "forward" else j + 1
            if 0 <= i < t:
                want[b, i, j] = 1.0
    assert_layers_equal(g, want.unsqueeze(1).expand(3, 3, 7, 7), lengths)
    assert g.include_self == include_self and g.num_layers == 2
    # propagation is the shift within each sequence; nothing crosses sequences
    x = torch.randn(12, 5)
    shifted = torch.zeros(12, 5)
    for start, t in ((0, 4), (4, 1), (5, 7)):
        seq = x[start:start + t]
        if direction == "forward":
            shifted[start + 1:start + t] = seq[:-1]
        else:
            shifted[start:start + t - 1] = seq[1:]
    torch.testing.assert_close(g.propagate(x, 0), shifted.expand(3, 12, 5))
    # the library's own validation accepts them as emitted graphs
    LatentGraphs(g.edge_index, g.edge_weight, g.edge_head, num_heads=3, direction=direction,
                 ptr=ptr, include_self=include_self)


def test_adjacent_graphs_refuse_bad_arguments():
    for kwargs, message in [(dict(direction="up"), "direction must be"),
                            (dict(num_layers=0), "num_layers must be"),
                            (dict(num_heads=True), "num_heads must be")]:
        with pytest.raises(ValueError, match=message):
            LatentGraphs.adjacent(FIXED_PTR, **{**dict(num_layers=1, num_heads=1,
                                                       direction="forward"), **kwargs})


def test_transfer_uniform_adjacent_and_none_baselines(setting, monkeypatch):
    predictor, x, batch, graphs, _ = setting
    n = sum(LENGTHS)
    h = torch.randn(n, 6)
    learned = GlomoTransfer(predictor, in_channels=6)
    uniform = GlomoTransfer(predictor, in_channels=6, graph="uniform")
    adjacent = GlomoTransfer(predictor, in_channels=6, graph="adjacent")
    none = GlomoTransfer(predictor, in_channels=6, graph="none")
    for baseline in (uniform, adjacent, none):  # same parameters, only the graphs differ
        baseline.load_state_dict(learned.state_dict())

    def boom(*args, **kwargs):
        raise AssertionError("the predictor must not run for this baseline")
    monkeypatch.setattr(predictor, "forward", boom)
    ptr = torch.tensor([0, 5, 6, 15, 18])
    ug = DirectionalGraphs(*(LatentGraphs.uniform(ptr, num_layers=LAYERS, num_heads=HEADS,
                                                  direction=d) for d in ("forward", "backward")))
    torch.testing.assert_close(uniform(h, batch=batch), learned(h, graphs=ug))
    ag = DirectionalGraphs(*(LatentGraphs.adjacent(ptr, num_layers=LAYERS, num_heads=HEADS,
                                                   direction=d) for d in ("forward", "backward")))
    torch.testing.assert_close(adjacent(h, batch=batch), learned(h, graphs=ag))
    with pytest.raises(ValueError, match="graph='adjacent' needs the number of units"):
        adjacent.graphs()
    adjacent.graph = "random"  # switched after construction: refused, not built as adjacent
    with pytest.raises(ValueError, match="graph must be one of"):
        adjacent(h, batch=batch)
    adjacent.graph = "adjacent"
    assert "graph='adjacent'" in repr(adjacent)
    # the uniform forward mixture of G^1 is the mean of the strict prefix
    u = uniform.mixer(h, uniform.graphs(batch=batch, num_nodes=n))[0]
    assert uniform.graphs(batch=batch, num_nodes=n).forward.num_edges == ug.forward.num_edges
    torch.testing.assert_close(u[6 + 3], _uniform_mix(h[6:15], 3, LAYERS))
    # 'none' is the identity graph: M H = H for both directions
    out = none(h)
    torch.testing.assert_close(out, learned.fusion(h, [h, h]))
    assert none.graphs(x, batch) is None
    assert out.shape == learned(h, graphs=graphs).shape


def _uniform_mix(seq, j, num_layers):
    """Free uniform mixture at position j of one sequence, forward uniform graphs:
    (H G)_j = mean of h_0..h_{j-1}; (H Lambda^l)_j chains that mean l+1 times."""
    t = seq.size(0)
    g = torch.zeros(t, t)
    for jj in range(1, t):
        g[:jj, jj] = 1.0 / jj
    comps = []
    for _ in range(num_layers):
        comps.append((g.t() @ seq)[j])
    lam = g.clone()
    chains = [lam.t() @ seq]
    for _ in range(1, num_layers):
        lam = lam @ g
        chains.append(lam.t() @ seq)
    comps += [c[j] for c in chains]
    return torch.stack(comps).mean(0)


def test_transfer_precomputed_graphs_equal_computed_ones(setting):
    predictor, x, batch, graphs, _ = setting
    transfer = GlomoTransfer(predictor, in_channels=5, fusion_channels=3, layers=[0, 2])
    h = torch.randn(sum(LENGTHS), 5)
    torch.testing.assert_close(transfer(h, x, batch), transfer(h, graphs=transfer.graphs(x, batch)))
    torch.testing.assert_close(transfer(h, x, batch), transfer(h, graphs=graphs))


def test_transfer_rejects_bad_input(setting):
    predictor, x, batch, _, _ = setting
    transfer = GlomoTransfer(predictor, in_channels=5)
    h = torch.randn(sum(LENGTHS), 5)
    with pytest.raises(ValueError, match="pass x"):
        transfer(h, batch=batch)
    with pytest.raises(ValueError, match=r"h must have shape \[N, 5\]"):
        transfer(torch.randn(sum(LENGTHS), 4), x, batch)
    with pytest.raises(ValueError, match="token ids must lie in"):
        transfer(h, torch.full_like(x, TOKENS), batch)
    with pytest.raises(ValueError, match="cover 17 units, x has 18"):
        transfer(h, x[:-1], batch[:-1])
    with pytest.raises(ValueError, match="graph must be"):
        GlomoTransfer(predictor, in_channels=5, graph="random")
    with pytest.raises(TypeError, match="PretrainedGraphPredictor"):
        GlomoTransfer(GraphPredictor(num_tokens=5, hidden_channels=8, heads=2), in_channels=5)


def test_transfer_with_decoupled_ablation_and_one_direction():
    torch.manual_seed(0)
    predictor = make_predictor(decouple=False, directions=("forward",))
    x, batch = inputs()
    transfer = GlomoTransfer(predictor, in_channels=4)
    assert transfer.mixer.directions == ("forward",) and transfer.fusion.num_mixtures == 1
    h = torch.randn(sum(LENGTHS), 4)
    out = transfer(h, x, batch)
    assert out.shape == (sum(LENGTHS), 8)
    torch.testing.assert_close(out[:, :4], h)
    # the graphs are the feature network's own (scored layer by layer from its states)
    own = predictor.predictor("forward")(x, batch=batch)  # an emitter: graphs
    graphs = transfer.graphs(x, batch)
    assert graphs.backward is None
    for l in range(LAYERS):
        assert torch.equal(graphs.forward.edge_index[l], own.edge_index[l])
        torch.testing.assert_close(graphs.forward.edge_weight[l], own.edge_weight[l])
    dense = [dense_from_edges(*own.layer(l), LENGTHS, HEADS) for l in range(LAYERS)]
    want = dense_mixture(h, dense, LENGTHS, transfer.mixer.mixture_weights()[0], 1.0,
                         transfer.mixer.kinds, transfer.mixer.layers, HEADS)
    torch.testing.assert_close(transfer.mixer(h, graphs)[0], want)


def test_pretrained_predictor_of_a_glomo_model_and_checks():
    model = Glomo.text(num_tokens=TOKENS, hidden_channels=16, num_layers=2, heads=2, cnn_layers=1)
    vocab = [f"w{i}" for i in range(TOKENS)]
    predictor = model.to_pretrained(vocabulary=vocab)
    x, batch = inputs()
    for got, want in zip(predictor(x, batch), model.eval().graphs(x, batch)):
        for l in range(2):
            assert torch.equal(got.edge_index[l], want.edge_index[l])
            torch.testing.assert_close(got.edge_weight[l], want.edge_weight[l])
    assert predictor.predictor("forward") is not model.graph_predictors["fw"]  # a copy
    assert predictor.encode(["w3", "w0", "zz"], unknown="w1").tolist() == [3, 0, 1]
    with pytest.raises(ValueError, match="not in the vocabulary"):
        predictor.encode(["zz"])
    with pytest.raises(ValueError, match="vocabulary has 3 entries"):
        model.to_pretrained(vocabulary=["a", "b", "c"])
    fw = GraphPredictor(num_tokens=TOKENS, hidden_channels=16, num_layers=2, heads=2)
    with pytest.raises(ValueError, match="built for direction 'forward'"):
        PretrainedGraphPredictor(None, fw)
    bw = GraphPredictor(num_tokens=TOKENS, hidden_channels=16, num_layers=3, heads=2,
                        direction="backward")
    with pytest.raises(ValueError, match="disagree"):
        PretrainedGraphPredictor(fw, bw)
    with pytest.raises(ValueError, match="at least one"):
        PretrainedGraphPredictor()
    with pytest.raises(TypeError, match="graph emitter"):
        PretrainedGraphPredictor(FeaturePredictor(num_tokens=TOKENS, hidden_channels=16,
                                                  num_layers=2, heads=2))
    assert predictor.vocabulary == vocab


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_transfer_under_cpu_autocast_is_finite_and_close(setting, dtype):
    predictor, x, batch, _, _ = setting
    transfer = GlomoTransfer(predictor, in_channels=8, mixing="conditioned")
    h = torch.randn(sum(LENGTHS), 8, requires_grad=True)
    want = transfer(h, x, batch)
    with torch.autocast("cpu", dtype=dtype):
        got = transfer(h, x, batch)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), want, atol=0.05, rtol=0.05)
    got.float().sum().backward()
    assert torch.isfinite(h.grad).all() and transfer.mixer.gamma.grad is not None


def test_given_graphs_must_belong_to_the_batch_and_inputs_be_sound():
    """Graphs of another batch with the same number of units mixed features across the
    wrong sequences without an error; NaN embeddings and zero stds gave NaN silently."""
    from glomo_pyg import GlomoResNet, GlomoTextClassifier

    torch.manual_seed(0)
    predictor = Glomo.text(20, hidden_channels=8, num_layers=1, heads=2,
                           cnn_layers=1).to_pretrained()
    transfer = GlomoTransfer(predictor, 4)
    x = torch.randint(0, 20, (7,))
    b1, b2 = torch.tensor([0, 0, 0, 1, 1, 1, 1]), torch.tensor([0, 0, 0, 0, 1, 1, 1])
    h = torch.randn(7, 4)
    graphs = transfer.graphs(x, b1)
    assert torch.equal(transfer(h, batch=b1, graphs=graphs), transfer(h, x, b1))
    with pytest.raises(ValueError, match="batch differs"):
        transfer(h, batch=b2, graphs=graphs)
    with pytest.raises(ValueError, match="either x .* or graphs"):
        transfer(h, x, b1, graphs=graphs)
    with pytest.raises(ValueError, match="either propagated or graphs"):
        transfer(h, propagated=transfer.propagations(h, x, b1), graphs=graphs)
    with pytest.raises(TypeError, match="DirectionalGraphs"):
        transfer(h, graphs=graphs.forward)
    embedding = torch.randn(20, 4)
    embedding[3] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        GlomoTextClassifier(embedding, 2, None, hidden_channels=8, attention_heads=2)
    with pytest.raises(ValueError, match="pixel_mean and pixel_std"):
        GlomoResNet(None, width=4, pixel_std=(0.0, 0.0, 0.0))


def test_mixer_sizes_and_layers_must_be_integers():
    for kwargs, message in [(dict(layers=[0.7]), "integer layer indices"),
                            (dict(layers=["a"]), "integer layer indices"),
                            (dict(in_channels=6.5), "positive integers, got in_channels=6.5"),
                            (dict(heads=True), "heads=True")]:
        args = dict(in_channels=4, num_layers=2, heads=2)
        args.update(kwargs)
        with pytest.raises(ValueError, match=message):
            GraphMixer(**args)
