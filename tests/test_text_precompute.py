"""TextGraphCache: the frozen predictor's graphs computed once per document give the
classifier the same graphs, logits, gradients and training run as the predictor run at
every step; bad input is refused by name."""
import pytest
import torch
from torch_geometric.data import Data

from glomo_pyg import Glomo, GlomoTextClassifier
from glomo_pyg.training.text_classification import cache_documents, train_and_test
from glomo_pyg.transforms import TextGraphCache

TOKENS = ["<pad>", "<unk>", "<bos>", "<eos>"] + [f"w{k}" for k in range(16)]
LENGTHS = [5, 1, 9, 3, 12, 7, 2, 30]  # a one-token review among them


def predictor(seed=0):
    torch.manual_seed(seed)
    model = Glomo.text(num_tokens=len(TOKENS), hidden_channels=8, num_layers=2, heads=2,
                       cnn_layers=1, padding_idx=0)
    return model.to_pretrained(TOKENS)


def documents(lengths=LENGTHS, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(4, len(TOKENS), (n,), generator=gen) for n in lengths]


def classifier(seed=0, **kw):
    torch.manual_seed(seed)
    kw.setdefault("predictor", predictor())
    return GlomoTextClassifier(torch.randn(len(TOKENS), 6), hidden_channels=4,
                               attention_heads=2, **kw)


def batch_of(docs, index):
    x = torch.cat([docs[i] for i in index])
    lengths = torch.tensor([docs[i].numel() for i in index])
    return x, torch.repeat_interleave(torch.arange(len(index)), lengths)


VARIANTS = [dict(), dict(max_distance=3), dict(places=("embedding", "rnn")),
            dict(graph="uniform"), dict(graph="uniform", max_distance=2),
            dict(graph="adjacent")]


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_graphs_are_the_emitted_graphs(variant):
    """The same edges, heads and edge order as the predictor gives for the batch, the
    weights up to the rounding between batches of other shapes (the cache computes in
    batches of 3, sorted by length); documents in any order, one of them twice."""
    docs = documents()
    model = classifier(**variant)
    cache = TextGraphCache.compute(model, docs, batch_size=3)
    index = [4, 0, 1, 7, 6, 2, 0]
    x, batch = batch_of(docs, index)
    emitted = model.transfer.graphs(x, batch, num_nodes=x.numel())
    cached = cache.graphs(torch.tensor(index))
    for a, b in zip(emitted, cached):
        assert b.layout == "sparse" and torch.equal(a.ptr, b.ptr) and a.order == b.order
        for l in range(a.num_layers):
            (ia, wa, ha), (ib, wb, hb) = a.layer(l), b.layer(l)
            assert torch.equal(ia, ib) and torch.equal(ha, hb)
            torch.testing.assert_close(wa, wb, rtol=1e-5, atol=1e-7)
    assert (cache.nbytes == 0) == (model.transfer.graph != "learned")


@pytest.mark.parametrize("variant", VARIANTS)
def test_precomputed_path_gives_the_same_logits_and_gradients(variant):
    """With dropout on (training mode, the same seed for both passes) and padding
    (reviews of different lengths): logits and every trainable parameter's gradient."""
    docs = documents()
    cache = TextGraphCache.compute(classifier(**variant), docs, batch_size=4)
    index = [7, 3, 1, 4, 5]
    x, batch = batch_of(docs, index)
    results = []
    for graphs in (None, cache.graphs(index)):
        model = classifier(seed=1, **variant).train()  # the same parameters each time
        torch.manual_seed(2)  # the same dropout masks
        logits = model(x, batch) if graphs is None else model(x, batch, graphs=graphs)
        (logits * torch.arange(1.0, 3.0)).sum().backward()
        grads = {n: q.grad for n, q in model.named_parameters() if q.requires_grad}
        assert all(g is not None for g in grads.values())
        results.append((logits, grads))
    (a, ga), (b, gb) = results
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert ga.keys() == gb.keys()
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], rtol=1e-4, atol=1e-6, msg=name)


def test_half_weights_halve_the_memory_and_stay_close():
    """float16 weights: a smaller cache whose logits match to about 1e-3; distances
    beyond 255 (no window, reviews of 300 tokens) use a wider integer type."""
    docs = documents([300, 280, 4])
    model = classifier().eval()
    exact = TextGraphCache.compute(model, docs)
    half = TextGraphCache.compute(model, docs, weight_dtype=torch.float16)
    assert exact.layers["forward"][0]["distance"].dtype == torch.int16
    assert half.nbytes < exact.nbytes
    x, batch = batch_of(docs, [0, 1, 2])
    reference = model(x, batch)
    torch.testing.assert_close(model(x, batch, graphs=exact.graphs([0, 1, 2])), reference,
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model(x, batch, graphs=half.graphs([0, 1, 2])), reference,
                               rtol=1e-3, atol=1e-3)
    short = TextGraphCache.compute(classifier(max_distance=40), docs)
    assert short.layers["forward"][0]["distance"].dtype == torch.uint8


def _split(seed=0):
    """A keyword task: label 1 iff w0 occurs."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k in range(36):
        n = int(torch.randint(2, 14, (1,), generator=gen))
        x = torch.randint(5, len(TOKENS), (n,), generator=gen)
        if k % 2:
            x[int(torch.randint(0, n, (1,), generator=gen))] = 4
        out.append(Data(x=x, y=torch.tensor([k % 2])))
    return out[:24], out[24:30], out[30:]


@pytest.mark.parametrize("graph", ["learned", "uniform"])
def test_train_and_test_with_a_graph_cache_is_the_same_run(graph):
    """train_and_test with a cache (computed here, or once beforehand and reused) trains
    the same run as with the predictor at every step; the caller's documents are not
    changed."""
    train, val, test = _split()
    kw = dict(epochs=2, batch_size=5, lr=1e-2, seed=0, accelerator="cpu")
    runs = [train_and_test(classifier(graph=graph), train, val, test, **kw)]
    runs.append(train_and_test(classifier(graph=graph), train, val, test, graph_cache=True,
                               **kw))
    cache = cache_documents(classifier(graph=graph), train, val)
    runs.append(train_and_test(classifier(graph=graph), train, val, test, graph_cache=cache,
                               **kw))
    assert not any(hasattr(d, "graph_cache_row") for d in train + val)
    for run in runs[1:]:
        assert run.val_history == pytest.approx(runs[0].val_history, abs=1e-6)
        assert run.loss_history == pytest.approx(runs[0].loss_history, rel=1e-4)
        assert run.test_acc == pytest.approx(runs[0].test_acc, abs=1e-6)


def test_graph_cache_refuses_bad_input():
    docs = documents()
    model = classifier()
    with pytest.raises(TypeError, match="GlomoTextClassifier or a GlomoTransfer"):
        TextGraphCache.compute(torch.nn.Linear(2, 2), docs)
    with pytest.raises(ValueError, match="nothing to precompute"):
        TextGraphCache.compute(classifier(predictor=None), docs)
    with pytest.raises(ValueError, match="graph='none'"):
        TextGraphCache.compute(classifier(graph="none"), docs)
    for bad in (torch.tensor([4, 5]), [], "w4 w5", 7):
        with pytest.raises(TypeError, match="non-empty sequence of 1-D token-id tensors"):
            TextGraphCache.compute(model, bad)
    for bad in ([torch.tensor([4, 5]), torch.ones(2, 2, dtype=torch.long)],
                [torch.tensor([4.0, 5.0])], [torch.tensor([], dtype=torch.long)], [[4, 5]]):
        with pytest.raises(ValueError, match="document 0|document 1"):
            TextGraphCache.compute(model, bad)
    for bad in ([torch.tensor([4, 20])], [torch.tensor([-1, 4])]):
        with pytest.raises(ValueError, match=r"token ids must lie in \[0, 20\)"):
            TextGraphCache.compute(model, bad)
    for bad in (0, True, 2.5):
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
            TextGraphCache.compute(model, docs, batch_size=bad)
    with pytest.raises(ValueError, match="weight_dtype must be one of"):
        TextGraphCache.compute(model, docs, weight_dtype=torch.int32)

    cache = TextGraphCache.compute(model, docs)
    for bad in ([8], torch.tensor([-1]), torch.tensor([0, 8])):
        with pytest.raises(ValueError, match=r"document ids must lie in \[0, 8\)"):
            cache.graphs(bad)
    for bad in (torch.tensor([0.0]), torch.tensor([[0, 1]]), torch.tensor([], dtype=torch.long)):
        with pytest.raises(ValueError, match="non-empty 1-D integer tensor"):
            cache.graphs(bad)
    for bad in ("01", [0, True], [0.5], 3):
        with pytest.raises(TypeError, match="1-D integer tensor or a sequence of ints"):
            cache.graphs(bad)

    # a cache is checked against the model and the documents it is used with
    with pytest.raises(ValueError, match="max_distance"):
        cache.check_model(classifier(max_distance=3))
    with pytest.raises(ValueError, match="max_distance"):
        cache.check_model(classifier(graph="uniform"))
    with pytest.raises(ValueError, match="another predictor's weights"):
        cache.check_model(classifier(predictor=predictor(seed=5)))
    cache.check_model(classifier(seed=3))  # other classifier weights: the same graphs
    with pytest.raises(ValueError, match="holds 8 documents, got 7"):
        cache.check_documents(docs[:7])
    with pytest.raises(ValueError, match="other documents"):
        cache.check_documents(documents(seed=1))

    # graphs given to forward must be this batch's
    x, batch = batch_of(docs, [0, 3, 2])
    other = cache.graphs([2, 0, 3])  # the same number of tokens, other reviews
    with pytest.raises(ValueError, match="computed for other reviews"):
        model(x, batch, graphs=other)
    with pytest.raises(ValueError, match="graphs cover 8 units on cpu, x has 17"):
        model(x, batch, graphs=cache.graphs([0, 3]))
    with pytest.raises(TypeError, match="DirectionalGraphs"):
        model(x, batch, graphs=cache.graphs([0, 3, 2]).forward)
    with pytest.raises(ValueError, match="directions"):
        model(x, batch, graphs=(cache.graphs([0, 3, 2]).forward, None))
    for plain in (classifier(predictor=None), classifier(graph="none")):
        with pytest.raises(ValueError, match="mixes no graphs"):
            plain(x, batch, graphs=cache.graphs([0, 3, 2]))

    # train_and_test: the cache must be one of this model and of train + val
    train, val, test = _split()
    kw = dict(epochs=1, accelerator="cpu")
    with pytest.raises(TypeError, match="graph_cache must be None, a bool or a TextGraphCache"):
        train_and_test(classifier(), train, val, test, graph_cache="yes", **kw)
    with pytest.raises(TypeError, match="graph_cache needs a GlomoTextClassifier"):
        train_and_test(torch.nn.Linear(2, 2), train, val, test, graph_cache=True, **kw)
    with pytest.raises(ValueError, match="other documents|holds"):
        train_and_test(classifier(), train, val, test, graph_cache=cache, **kw)
    with pytest.raises(ValueError, match="nothing to precompute"):
        train_and_test(classifier(predictor=None), train, val, test, graph_cache=True, **kw)
