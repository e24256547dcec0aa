"""GlomoTextClassifier variants, the downstream training loop and the IMDB reproduction
script end to end on a tiny aclImdb the test writes."""
import dataclasses
import json
import math
import os
import random

import pytest
import torch
from fake_data import write_aclimdb

from glomo_pyg import Glomo, GlomoTextClassifier, PretrainedGraphPredictor
from glomo_pyg.data import WordVocabulary
from glomo_pyg.training.text_classification import encode_documents, train_and_test

TOKENS = ["<pad>", "<unk>", "<bos>", "<eos>"] + [f"w{k}" for k in range(16)]


def predictor(num_layers=2, **kw):
    torch.manual_seed(0)
    model = Glomo.text(num_tokens=len(TOKENS), hidden_channels=8, num_layers=num_layers, heads=2,
                  cnn_layers=1, padding_idx=0, **kw)
    return model.to_pretrained(TOKENS)


def batch_of(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(4, len(TOKENS), (sum(lengths),), generator=gen)
    return x, torch.arange(len(lengths)).repeat_interleave(torch.tensor(lengths))


@pytest.mark.parametrize("variant", [dict(predictor=None), dict(places=("embedding",)),
                                     dict(places=("rnn",)), dict(places=("embedding", "rnn")),
                                     dict(graph="uniform"), dict(graph="none"),
                                     dict(graph="adjacent"), dict(rnn_layers=0),
                                     dict(rnn_layers=0, predictor=None),
                                     dict(rnn="lstm"), dict(ablation=dict(decouple=False)),
                                     dict(ablation=dict(sparse=False, num_layers=1))])
def test_every_variant_runs_forward_and_backward_on_a_tiny_batch(variant):
    variant = dict(variant)
    ablation = variant.pop("ablation", {})
    p = variant.pop("predictor", "default")
    p = predictor(**ablation) if p == "default" else p
    emb = torch.randn(len(TOKENS), 6)
    model = GlomoTextClassifier(emb, predictor=p, hidden_channels=4, attention_heads=2,
                                **variant)
    x, batch = batch_of([5, 1, 9, 3])  # a length-1 review included
    logits = model(x, batch)
    assert logits.shape == (4, 2) and torch.isfinite(logits).all()
    logits.sum().backward()
    trained = [n for n, q in model.named_parameters() if q.grad is not None]
    assert "classifier.3.weight" in trained
    assert not any(n.startswith(("embedding.", "glomo_embedding.predictor", "glomo_rnn.predictor"))
                   for n in trained)  # frozen word vectors and frozen predictor
    for place in ("glomo_embedding", "glomo_rnn"):  # the gate trains wherever graphs go
        if getattr(model, place) is not None:
            assert any(n.startswith(f"{place}.fusion") for n in trained)


def test_reviews_do_not_see_each_other_and_graphs_matter():
    """A review's logits do not depend on the other reviews in its batch (padding and
    graphs never cross reviews), with learned graphs at both places."""
    emb = torch.randn(len(TOKENS), 6)
    model = GlomoTextClassifier(emb, predictor=predictor(), places=("embedding", "rnn"),
                                hidden_channels=4, attention_heads=2).eval()
    x, batch = batch_of([5, 9, 3])
    together = model(x, batch)
    alone = model(x[5:14], torch.zeros(9, dtype=torch.long))
    torch.testing.assert_close(together[1:2], alone, rtol=1e-5, atol=1e-6)
    # the same parameters with uniform graphs give other outputs: the graphs matter
    uniform = GlomoTextClassifier(emb, predictor=predictor(), places=("embedding", "rnn"),
                                  hidden_channels=4, attention_heads=2, graph="uniform").eval()
    uniform.load_state_dict(model.state_dict())
    assert not torch.allclose(uniform(x, batch), together, atol=1e-4)


def test_without_rnn_word_order_reaches_the_model_only_through_graphs():
    """rnn_layers=0: shuffling a review's words leaves the feature-only model's logits
    unchanged (attention and pooling read no order), but not GLoMo's, whose graphs
    link each word to particular others; a review still never sees the others."""
    emb = torch.randn(len(TOKENS), 6)
    x, batch = batch_of([5, 9, 3])
    perm = torch.cat([torch.arange(5), 5 + torch.randperm(9, generator=torch.Generator(
        ).manual_seed(0)), torch.arange(14, 17)])
    for graph, order_matters in (("none", False), ("learned", True), ("adjacent", True)):
        torch.manual_seed(0)
        model = GlomoTextClassifier(emb, predictor=predictor(), hidden_channels=4,
                                    attention_heads=2, rnn_layers=0, graph=graph).eval()
        assert len(model.rnns) == 0 and "rnn=none" in repr(model)
        pooled = []  # the classifier's input: logits of a tiny MLP can be constant
        model.classifier.register_forward_hook(lambda m, i, o, pooled=pooled: pooled.append(i[0]))
        with torch.no_grad():
            model(x, batch), model(x[perm], batch)
            model(x[5:14], torch.zeros(9, dtype=torch.long))
        out, shuffled, alone = pooled
        assert not torch.allclose(out[0], out[1], atol=1e-3)  # the features are not constant
        torch.testing.assert_close(out[[0, 2]], shuffled[[0, 2]])
        assert torch.allclose(out[1], shuffled[1], atol=1e-5) != order_matters, graph
        torch.testing.assert_close(out[1:2], alone, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="rnn_layers >= 2"):
        GlomoTextClassifier(emb, predictor=predictor(), places=("rnn",), rnn_layers=0)


def test_classifier_rejects_bad_input():
    emb = torch.randn(len(TOKENS), 6)
    with pytest.raises(ValueError, match="vocabulary"):
        GlomoTextClassifier(torch.randn(7, 6), predictor=predictor())
    with pytest.raises(ValueError, match="rnn_layers >= 2"):
        GlomoTextClassifier(emb, predictor=predictor(), places=("rnn",), rnn_layers=1)
    with pytest.raises(ValueError, match="places"):
        GlomoTextClassifier(emb, predictor=predictor(), places=("output",))
    model = GlomoTextClassifier(emb, predictor=predictor(), hidden_channels=4, attention_heads=2)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 20\)"):
        model(torch.tensor([1, 25]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="int64 or int32 token ids.*got torch.float32"):
        model(torch.tensor([1.0, 2.0]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="int64 or int32 token ids.*got torch.int16"):
        model(torch.tensor([1, 2], dtype=torch.int16), torch.tensor([0, 0]))
    # int32 ids, which the predictor also takes, give the int64 result
    x, batch = batch_of([5, 3])
    torch.testing.assert_close(model.eval()(x.int(), batch), model(x, batch))


def test_train_and_test_selects_on_validation_and_learns_a_keyword_task():
    vocab = WordVocabulary(TOKENS)
    rng = random.Random(0)
    texts, labels = [], []
    for k in range(160):
        label = k % 2
        words = [f"w{rng.randrange(2, 16)}" for _ in range(rng.randint(3, 10))]
        words.insert(rng.randrange(len(words) + 1), "w1" if label else "w0")
        texts.append(" ".join(words))
        labels.append(label)
    data = encode_documents(texts, labels, vocab, max_length=12)
    assert data[0].x.tolist()[:1] and data[0].y.item() == 0
    torch.manual_seed(0)
    model = GlomoTextClassifier(torch.randn(len(TOKENS), 8), predictor=None, hidden_channels=8,
                                attention_heads=2, freeze_embedding=False, dropout=0.0)
    result = train_and_test(model, data[:100], data[100:130], data[130:], epochs=6,
                            batch_size=16, lr=1e-2, seed=0, accelerator="cpu")
    assert result.test_acc > 0.9 and 0 <= result.best_epoch < 6
    assert len(result.val_history) == len(result.loss_history) == 6
    assert result.val_acc == max(result.val_history)
    assert result.val_history[result.best_epoch] == result.val_acc
    assert result.loss_history[-1] < result.loss_history[0]
    with pytest.raises(ValueError, match="labels"):
        encode_documents(["a"], [0, 1], vocab)
    for kwargs, message in [(dict(epochs=0), "epochs must be a positive integer"),
                            (dict(batch_size=0), "batch_size must be"),
                            (dict(lr=float("nan")), "lr must be a positive number"),
                            (dict(lr=-1e-3), "lr must be a positive number")]:
        with pytest.raises(ValueError, match=message):
            train_and_test(model, data[:10], data[10:12], data[12:14], **kwargs)
    with pytest.raises(ValueError, match="the val split is empty"):
        train_and_test(model, data[:10], [], data[12:14])
    # a loss that is not finite stops training instead of being recorded as a result

    class NanLogits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x, batch):
            return (self.weight * float("nan")).expand(int(batch.max()) + 1, 2)

    with pytest.raises(FloatingPointError, match="training loss is nan at step 0"):
        train_and_test(NanLogits(), data[:16], data[16:20], data[20:24], epochs=1,
                       batch_size=8, accelerator="cpu")


@pytest.mark.slow
def test_imdb_reproduction_script_end_to_end(tmp_path, capsys, monkeypatch):
    from benchmarks.reproduce import imdb

    write_aclimdb(tmp_path)
    results = tmp_path / "imdb.md"
    variants = ("baseline", "glomo", "uniform", "adjacent", "untrained", "no-decouple")
    args = ["--data-dir", str(tmp_path), "--smoke", "--output-dir", str(tmp_path / "run"),
            "--accelerator", "cpu", "--workers", "1", "--results", str(results),
            "--variants", *variants]
    imdb.main(args)
    text = results.read_text()
    for label in ("feature only (word vectors)", "GLoMo on embeddings", "uniform graph",
                  "adjacent-word graph", "untrained graphs", "GLoMo, predictor -decouple"):
        assert f"| {label} |" in text
    assert "| `no-decouple` | 0 |" in text  # graph statistics of the ablation's predictor
    assert "| `default, untrained` | 0 |" in text  # and of the untrained predictor
    assert f"| {imdb.TFIDF_LABEL} |" in text
    assert "| GLoMo on embeddings − feature only (word vectors) |" in text  # paired table
    assert "| GLoMo on embeddings − uniform graph |" in text
    assert "| GLoMo on embeddings − untrained graphs |" in text
    assert "| GLoMo on embeddings − adjacent-word graph |" in text
    assert "- downstream model: word vectors -> BiGRU x 2 -> self-attention" in text
    assert os.path.exists(tmp_path / "run" / "pretrain" / "no-decouple" / "predictor")
    with open(tmp_path / "run" / "downstream.json") as fh:
        cache = json.load(fh)
    runs = cache["runs"]
    assert cache["settings"]["epochs"] == imdb.SMOKE.epochs  # the runs' own settings
    lrs = imdb.SMOKE.lrs
    assert len(lrs) > 1  # the smoke run goes through the learning-rate choice
    for v in variants:  # seed 0 at every rate, validation only except at the chosen rate
        search = {lr: runs[f"{v}/0/lr={lr:g}"] for lr in lrs}
        best = max(lrs, key=lambda lr: search[lr]["val_acc"])
        assert [lr for lr in lrs if search[lr]["test_acc"] is not None] == [best]
        assert 0.0 <= search[best]["test_acc"] <= 1.0
        assert 0.0 <= runs[f"{v}/1/lr={best:g}"]["test_acc"] <= 1.0  # other seeds: that rate
        assert all(r["lr"] == lr for lr, r in search.items())
    assert len(runs) == len(variants) * (len(lrs) + 1)
    # every run that mixes graphs records the mixture weights it learned (free: one set)
    for key, entry in runs.items():
        if key.startswith("baseline/"):
            assert "mixture" not in entry
            continue
        mixture = entry["mixture"]["embedding"]
        assert set(entry["mixture"]) == {"embedding"} and set(mixture) == {"forward", "backward"}
        for mixed in mixture.values():  # (2 kinds x 2 heads)
            assert len(mixed["weights"]) == 2 * 2 and abs(sum(mixed["weights"]) - 1) < 1e-5
    assert "| GLoMo on embeddings | embedding | forward | 2 |" in text
    assert "(equal weights: 0.250)" in text and " of 4 |" in text
    assert os.listdir(tmp_path / "run" / "lr-search") == []  # checkpoints removed once used
    tfidf = json.load(open(tmp_path / "run" / "tfidf.json"))
    assert 0.0 <= tfidf["test_acc"] <= 1.0 and tfidf["C"] in imdb.TFIDF_CS
    # a second call reuses every cached stage and only writes the table again
    mtime = os.path.getmtime(tmp_path / "run" / "word_vectors.txt")
    imdb.main(args)
    assert os.path.getmtime(tmp_path / "run" / "word_vectors.txt") == mtime
    assert results.read_text().count("## ") == 2
    # cached runs made with other settings are refused, not reported as these settings'
    with pytest.raises(SystemExit, match="other settings or inputs .epochs"):
        imdb.main(args + ["--epochs", "2"])
    # options are checked before any stage runs
    for extra, message in [(["--seeds", "0"], "--seeds must be >= 1"),
                           (["--first-seed", "-1"], "--first-seed must be >= 0"),
                           (["--first-seed", str(2 ** 32 - 1), "--seeds", "2"],
                            "goes past seed 4294967295"),
                           (["--epochs", "-1"], "--epochs must be >= 1"),
                           (["--lrs", "nan"], "--lrs must be finite positive"),
                           (["--lrs", "0.001", "0.0010000001"], "equal to 6 digits"),
                           (["--accelerator", "tpu9000"], "--accelerator must be one of"),
                           (["--results", str(tmp_path)], "is a directory"),
                           (["--output-dir", str(results)], "is a file, not a folder"),
                           (["--predictor", str(tmp_path / "missing")], "missing"),
                           (["--rnn-layers", "-1"], "--rnn-layers must be >= 0"),
                           (["--lr-seeds", "0"], "--lr-seeds must be >= 1"),
                           (["--lr-seeds", "3"], r"--lr-seeds \(3\) must be at most --seeds \(2\)"),
                           (["--max-distance", "0"], "--max-distance must be >= 1"),
                           (["--rnn-layers", "1", "--variants", "glomo-rnn"],
                            "glomo-rnn puts graphs after the first of at least 2 RNN layers"),
                           (["--rnn-layers", "0"], "other settings or inputs .rnn_layers")]:
        with pytest.raises(SystemExit, match=message):
            imdb.main(args + extra)
    assert results.read_text().count("## ") == 2
    # another predictor (same architecture, other weights) retrains only the runs that
    # read its weights: the baseline reads none, uniform graphs only their shape
    other = PretrainedGraphPredictor.from_pretrained(tmp_path / "run" / "pretrain" / "default"
                                                     / "predictor")
    with torch.no_grad():
        next(other.parameters()).add_(0.5)
    other.save_pretrained(tmp_path / "other")
    again = args[:-len(variants)] + ["baseline", "glomo", "uniform", "adjacent", "untrained",
                                     "--predictor", str(tmp_path / "other")]
    imdb.main(again)
    with open(tmp_path / "run" / "downstream.json") as fh:
        cache = json.load(fh)
    after = cache["runs"]
    weights = imdb.file_digest(str(tmp_path / "other" / "model.safetensors"))
    for prefix in ("baseline/", "uniform/", "adjacent/", "untrained/", "no-decouple/"):  # kept
        assert {k: e for k, e in after.items() if k.startswith(prefix)} == \
            {k: e for k, e in runs.items() if k.startswith(prefix)}
    retrained = {k: e for k, e in after.items() if k.startswith("glomo/")}
    assert retrained and all(e["inputs"] == {"weights": weights} for e in retrained.values())
    assert all(e["inputs"] != {"weights": weights} for k, e in runs.items()
               if k.startswith("glomo/"))
    assert all(e["inputs"] == {} for k, e in after.items() if k.startswith("baseline/"))
    # untrained graphs read the predictor's architecture, not its weights
    assert all(set(e["inputs"]) == {"untrained_graphs"} for k, e in after.items()
               if k.startswith("untrained/"))
    # one variant alone: nothing to pair, so no paired-differences table
    imdb.main(args[:-len(variants)] + ["baseline", "--predictor", str(tmp_path / "other")])
    last = results.read_text().rsplit("\n## ", 1)[1]
    assert "| feature only (word vectors) |" in last and "Paired test-accuracy" not in last
    # the rate chosen on the mean validation accuracy of seeds 0 and 1, both searched
    imdb.main(args[:-len(variants)] + ["baseline", "glomo", "--lr-seeds", "2", "--output-dir",
                                       str(tmp_path / "lr2"), "--predictor",
                                       str(tmp_path / "other")])
    last = results.read_text().rsplit("\n## ", 1)[1]
    assert "seeds 0-1 each trained at each of" in last and "(`--lr-seeds 2`)" in last
    assert "validation accuracy % (mean of seeds 0-1)" in last
    with open(tmp_path / "lr2" / "downstream.json") as fh:
        searched = json.load(fh)["runs"]
    assert len(searched) == 2 * 2 * len(lrs)  # every run is a search run at 2 seeds
    for v in ("baseline", "glomo"):
        mean = {lr: (searched[f"{v}/0/lr={lr:g}"]["val_acc"] +
                     searched[f"{v}/1/lr={lr:g}"]["val_acc"]) / 2 for lr in lrs}
        best = max(lrs, key=lambda lr: mean[lr])
        for seed in (0, 1):  # test-evaluated at the chosen rate only, on both seeds
            tested = [lr for lr in lrs if searched[f"{v}/{seed}/lr={lr:g}"]["test_acc"] is not None]
            assert tested == [best]
        assert f"| {100 * mean[best]:.2f} |" in last
    assert os.listdir(tmp_path / "lr2" / "lr-search") == []
    # a later block of seeds (--first-seed): seeds 2-3 trained at the rate seeds 0-1 chose,
    # and only they are reported (table, paired differences); the search runs are kept
    imdb.main(args[:-len(variants)] + ["baseline", "glomo", "--lr-seeds", "2", "--first-seed",
                                       "2", "--output-dir", str(tmp_path / "lr2"),
                                       "--predictor", str(tmp_path / "other")])
    last = results.read_text().rsplit("\n## ", 1)[1]
    assert "- reported seeds: 2-3 (`--first-seed 2`); none of them was used to choose" in last
    with open(tmp_path / "lr2" / "downstream.json") as fh:
        block = json.load(fh)["runs"]
    assert {k: e for k, e in block.items() if k.split("/")[1] in ("0", "1")} == searched
    chosen = {v: max(lrs, key=lambda lr: searched[f"{v}/0/lr={lr:g}"]["val_acc"] +
                     searched[f"{v}/1/lr={lr:g}"]["val_acc"]) for v in ("baseline", "glomo")}
    assert sorted(k for k in block if k.split("/")[1] in ("2", "3")) == sorted(
        f"{v}/{s}/lr={chosen[v]:g}" for v in chosen for s in (2, 3))
    accs = {v: [100 * block[f"{v}/{s}/lr={chosen[v]:g}"]["test_acc"] for s in (2, 3)]
            for v in chosen}
    difference = imdb.paired_difference(accs["glomo"], accs["baseline"])[0]
    assert f"| GLoMo on embeddings − feature only (word vectors) | {difference:+.2f} |" in last
    assert f"| {sum(accs['glomo']) / 2:.2f} ± " in last and " | 2 | lr = " in last
    # back to seed 0 alone on the same cache, where seed 0 alone prefers the rate that the
    # mean did not choose (cache edited so): seed 0's and seed 1's runs at that rate were
    # validation-only, without checkpoints left, so both are trained again with a test result
    path = tmp_path / "lr2" / "downstream.json"
    cache2 = json.loads(path.read_text())
    other_rate = {}
    for v in ("baseline", "glomo"):
        tested = [lr for lr in lrs if cache2["runs"][f"{v}/0/lr={lr:g}"]["test_acc"] is not None]
        other_rate[v] = next(lr for lr in lrs if lr not in tested)
        cache2["runs"][f"{v}/0/lr={other_rate[v]:g}"]["val_acc"] = 1.0
    path.write_text(json.dumps(cache2))
    imdb.main(args[:-len(variants)] + ["baseline", "glomo", "--output-dir",
                                       str(tmp_path / "lr2"), "--predictor",
                                       str(tmp_path / "other")])
    with open(tmp_path / "lr2" / "downstream.json") as fh:
        seed0 = json.load(fh)["runs"]
    for v in ("baseline", "glomo"):
        assert seed0[f"{v}/0/lr={other_rate[v]:g}"]["test_acc"] is not None
        assert seed0[f"{v}/1/lr={other_rate[v]:g}"]["test_acc"] is not None
    last = results.read_text().rsplit("\n## ", 1)[1]
    assert "| feature only (word vectors) |" in last and "| 2 | lr = " in last
    # the classifier without RNN (word order only through the graphs), in its own folder
    imdb.main(args[:-len(variants)] + ["baseline", "glomo", "adjacent", "--rnn-layers", "0",
                                       "--output-dir", str(tmp_path / "norc"),
                                       "--predictor", str(tmp_path / "other")])
    last = results.read_text().rsplit("\n## ", 1)[1]
    assert "- downstream model: word vectors -> linear map (no RNN" in last
    assert str(imdb.PAPER["baseline"]) not in last  # the paper's numbers are its model's
    assert str(imdb.PAPER["baseline"]) in text
    assert "| GLoMo on embeddings − adjacent-word graph |" in last
    with open(tmp_path / "norc" / "downstream.json") as fh:
        norc = json.load(fh)
    assert norc["settings"]["rnn_layers"] == 0 and "rnn_layers" not in cache["settings"]
    assert len(norc["runs"]) == 3 * (len(lrs) + 1)
    # graphs cut to a window: only the runs whose graphs it shortens are trained again
    imdb.main(args[:-len(variants)] + ["baseline", "glomo", "adjacent", "uniform",
                                       "--rnn-layers", "0", "--output-dir", str(tmp_path / "norc"),
                                       "--max-distance", "3", "--predictor",
                                       str(tmp_path / "other")])
    last = results.read_text().rsplit("\n## ", 1)[1]
    assert "- graphs keep only edges of at most 3 units" in last
    with open(tmp_path / "norc" / "downstream.json") as fh:
        windowed = json.load(fh)["runs"]
    for key, entry in windowed.items():
        if key.startswith("glomo/"):
            assert entry["inputs"] == {"weights": weights, "max_distance": 3}
        elif key.startswith("uniform/"):  # new here, with the window recorded
            assert entry["inputs"]["max_distance"] == 3 and "uniform_graphs" in entry["inputs"]
        else:  # the baseline and the adjacent-word graphs: the same runs as before
            assert entry == norc["runs"][key]
    # mixture weights conditioned on each word: every variant that mixes graphs trains again
    mixers, record = set(), imdb.mixture_weights

    def spy(model, data, reviews=256):
        if model.glomo_embedding is not None:
            mixers.add("free" if model.glomo_embedding.mixer.logits is not None else
                       "conditioned")
        return record(model, data, reviews)

    monkeypatch.setattr(imdb, "mixture_weights", spy)
    imdb.main(args[:-len(variants)] + ["baseline", "glomo", "adjacent", "--rnn-layers", "0",
                                       "--output-dir", str(tmp_path / "norc"), "--max-distance",
                                       "3", "--mixing", "conditioned", "--predictor",
                                       str(tmp_path / "other")])
    last = results.read_text().rsplit("\n## ", 1)[1]
    assert "- mixture weights over the graph components: `conditioned`" in last
    with open(tmp_path / "norc" / "downstream.json") as fh:
        conditioned = json.load(fh)["runs"]
    assert {k: e for k, e in conditioned.items() if k.startswith("baseline/")} == \
        {k: e for k, e in windowed.items() if k.startswith("baseline/")}
    for prefix, inputs in (("glomo/", {"weights": weights, "max_distance": 3,
                                       "mixing": "conditioned"}),
                           ("adjacent/", dict(windowed[f"adjacent/0/lr={lrs[0]}"]["inputs"],
                                              mixing="conditioned"))):
        new = [e for k, e in conditioned.items() if k.startswith(prefix)]
        assert len(new) == len(lrs) + 1 and all(e["inputs"] == inputs for e in new)
        for entry in new:  # conditioned weights: averaged over the validation words
            for mixed in entry["mixture"]["embedding"].values():
                assert abs(sum(mixed["weights"]) - 1) < 1e-5 and min(mixed["weights"]) > 0
    assert "Mixture weights learned over the graph components (mixing `conditioned`" in last
    assert mixers == {"conditioned"}  # the models themselves mixed per word
    with pytest.raises(SystemExit):  # argparse's choices
        imdb.main(args + ["--mixing", "softmax"])
    assert "invalid choice: 'softmax'" in capsys.readouterr().err
    # a cache of the earlier format (predictor digests in the shared settings) made with
    # the same predictor is upgraded in place and reused: nothing is trained again
    old_settings = {k: v for k, v in cache["settings"].items() if k != "vocabulary"}
    old_settings["predictors"] = {"default": weights}
    old_runs = {k: {f: v for f, v in e.items() if f != "inputs"} for k, e in after.items()}
    (tmp_path / "run" / "downstream.json").write_text(json.dumps(
        dict(settings=old_settings, runs=old_runs)))
    imdb.main(again)
    with open(tmp_path / "run" / "downstream.json") as fh:
        upgraded = json.load(fh)
    assert upgraded["settings"] == cache["settings"]
    assert {k: e for k, e in upgraded["runs"].items() if not k.startswith("no-decouple/")} == \
        {k: e for k, e in after.items() if not k.startswith("no-decouple/")}
    # made with another predictor, it is refused as before, naming what differs
    old_settings["predictors"] = {"default": "0" * 16}
    (tmp_path / "run" / "downstream.json").write_text(json.dumps(
        dict(settings=old_settings, runs=old_runs)))
    with pytest.raises(SystemExit, match="other settings or inputs .predictors, vocabulary"):
        imdb.main(again)
    (tmp_path / "run" / "downstream.json").write_text("{")
    with pytest.raises(SystemExit, match=r"downstream.json \(cached runs\) is damaged"):
        imdb.main(args)


def test_classifier_constructor_names_bad_sizes():
    embedding = torch.randn(10, 4)
    for kwargs, message in [(dict(hidden_channels=5, attention_heads=4), "divisible"),
                            (dict(attention_heads=0), "attention_heads must be"),
                            (dict(num_classes=1), "num_classes must be"),
                            (dict(rnn_layers=-1), "rnn_layers must be"),
                            (dict(dropout=-0.1), "dropout must lie"),
                            (dict(hidden_channels=True), "hidden_channels must be")]:
        with pytest.raises(ValueError, match=message):
            GlomoTextClassifier(embedding, predictor=None, **kwargs)


@pytest.mark.parametrize("mixing", ["free", "conditioned"])
def test_imdb_mixture_record_matches_the_weights_the_mixers_compute(mixing):
    """``mixture_weights`` (the reproduction's per-run record) against the mixers' own weights
    on features rebuilt step by step as the classifier's forward computes them."""
    from torch_geometric.data import Data

    from benchmarks.reproduce import imdb
    from glomo_pyg.sequences import sequence_batch

    torch.manual_seed(0)
    model = GlomoTextClassifier(torch.randn(len(TOKENS), 6), predictor=predictor(),
                                places=("embedding", "rnn"), hidden_channels=4,
                                attention_heads=2, mixing=mixing)
    with torch.no_grad():  # weights away from equal, as after training
        for place in (model.glomo_embedding, model.glomo_rnn):
            if mixing == "free":
                place.mixer.logits.normal_()
            else:
                for lin in place.mixer.weight_lins:
                    lin.weight.normal_()
                    lin.bias.normal_()
    x, batch = batch_of([5, 1, 9, 3, 7])
    data = [Data(x=x[batch == k], y=torch.tensor([k % 2])) for k in range(5)]
    model.train()
    record = imdb.mixture_weights(model, data, reviews=4)  # the first 4 reviews only
    assert model.training  # the mode is restored
    assert not model.glomo_embedding._forward_pre_hooks  # and the hooks removed
    keep = batch < 4
    x, batch = x[keep], batch[keep]
    model.eval()
    with torch.no_grad():  # the classifier's forward, step by step (eval: no dropout)
        seqs = sequence_batch(x.size(0), batch, x.device)
        graphs = model.glomo_embedding.graphs(x, batch, num_nodes=x.size(0))
        h_embedding = model.embedding(x)
        h_rnn = model._rnn(model.rnns[0], model.glomo_embedding(h_embedding, graphs=graphs), seqs)
    for place, h in (("embedding", h_embedding), ("rnn", h_rnn)):
        mixer = getattr(model, f"glomo_{place}").mixer
        with torch.no_grad():
            w = mixer.mixture_weights(h).double()
        if w.dim() == 2:
            w = w.unsqueeze(1).expand(-1, x.size(0), -1)
        assert set(record[place]) == {"forward", "backward"}
        for d, direction in enumerate(mixer.directions):
            entry = record[place][direction]
            assert entry["weights"] == pytest.approx(w[d].mean(0).tolist(), abs=1e-6)
            assert entry["largest"] == pytest.approx(float(w[d].amax(-1).mean()), abs=1e-6)
            entropy = -(w[d] * w[d].log()).sum(-1)
            assert entry["effective"] == pytest.approx(float(entropy.exp().mean()), abs=1e-5)
            if mixing == "free":  # one set for every word: the summary of the weights
                tops, top, effective = imdb.mixture_summary(entry["weights"])
                assert entry["largest"] == pytest.approx(top) and \
                    entry["effective"] == pytest.approx(effective)
            else:  # per word, not of the mean: sharper than the mean weights
                assert entry["largest"] >= max(entry["weights"]) - 1e-9
    assert imdb.valid_mixture(record)
    # a classifier without graphs records nothing
    baseline = GlomoTextClassifier(torch.randn(len(TOKENS), 6), predictor=None,
                                   hidden_channels=4, attention_heads=2)
    assert imdb.mixture_weights(baseline, data) == {}


def test_imdb_mixture_table_and_cache_checks():
    from benchmarks.reproduce import imdb

    # ties: components that propagate alike keep equal free weights, and all are named
    assert imdb.mixture_summary([0.25] * 4) == ([0, 1, 2, 3], 0.25, pytest.approx(4.0))
    assert imdb.mixture_summary([0.0, 1.0, 0.0]) == ([1], 1.0, pytest.approx(1.0))
    assert imdb.mixture_summary([0.1, 0.4, 0.1, 0.4]) == ([1, 3], 0.4, pytest.approx(
        math.exp(-(0.2 * math.log(0.1) + 0.8 * math.log(0.4)))))
    one = dict(weights=[0.7, 0.1, 0.1, 0.1], largest=0.7, effective=2.6)
    setup = dataclasses.replace(imdb.SMOKE, variants=("baseline", "glomo", "glomo-rnn"))
    final = {"baseline": {0: {"test_acc": 0.8}},  # no graphs: no record
             "glomo": {0: {"mixture": {"embedding": {"forward": one, "backward": one}}},
                       1: {"mixture": {"embedding": {"forward": dict(one, largest=0.5)}}},
                       2: {}},  # cached before the record
             "glomo-rnn": {0: {"mixture": {"rnn": {"backward": one}}}}}  # one direction
    lines = imdb.mixture_lines(setup, final)
    rows = [l for l in lines if l.startswith("| GLoMo")]
    assert rows == [
        "| GLoMo on embeddings | embedding | forward | 2 | 0 (0.700) | 0.600 (equal weights: "
        "0.250) | 2.6 of 4 |",
        "| GLoMo on embeddings | embedding | backward | 1 | 0 (0.700) | 0.700 (equal weights: "
        "0.250) | 2.6 of 4 |",
        "| GLoMo on RNN states | rnn | backward | 1 | 0 (0.700) | 0.700 (equal weights: "
        "0.250) | 2.6 of 4 |"]
    assert imdb.mixture_lines(setup, {"baseline": final["baseline"]}) == []
    # damaged records are refused when the cache is read, not after the runs
    good = dict(val_acc=0.5, best_epoch=0, seconds=1.0, lr=1e-3, test_acc=None)
    imdb.check_runs({"glomo/0/lr=0.001": dict(good, mixture={"embedding": {"forward": one}})},
                    "cache")
    for bad in ({"embedding": []}, {"embedding": {}}, {"embedding": {"forward": dict(one,
                weights=[])}}, {"embedding": {"forward": dict(one, largest=float("nan"))}},
                {"embedding": {"forward": dict(one, weights=[0.5, "x"])}}, [1.0]):
        with pytest.raises(ValueError, match="damaged mixture record"):
            imdb.check_runs({"glomo/0/lr=0.001": dict(good, mixture=bad)}, "cache")
    # runs that record no inputs are reused, unless the graphs asked for differ from theirs
    for inputs, kept in (({"weights": "w"}, True), ({"weights": "w", "mixing": "conditioned"},
                                                     False),
                         ({"weights": "w", "max_distance": 3}, False)):
        runs = {"glomo/0/lr=0.001": dict(good), "baseline/0/lr=0.001": dict(good, inputs={})}
        dropped = imdb.stale_runs(runs, {"glomo": inputs, "baseline": {}})
        assert ("glomo/0/lr=0.001" in runs) == kept and "baseline/0/lr=0.001" in runs
        assert dropped == ({} if kept else {"glomo": 1})
