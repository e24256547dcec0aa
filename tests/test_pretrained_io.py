"""save_pretrained / load_pretrained: round trips and every way a file can be wrong."""
import json
import os
import pickle

import pytest
import torch
from reference import batch_vector

import glomo_pyg.io.pretrained as io
from glomo_pyg import (GlomoTransfer, GraphPredictor, PretrainedFormatError,
                       PretrainedGraphPredictor, load_pretrained, save_pretrained)
from glomo_pyg.nn import FeatureGraphEmitter

TOKENS = 30
VOCAB = [f"tok{i}" for i in range(TOKENS)]


def make(kind="graph", norm="layer", bias="scalar", directions=("forward", "backward"), vocab=True):
    parts = {}
    for d in directions:
        if kind == "graph":
            parts[d] = GraphPredictor(num_tokens=TOKENS, hidden_channels=16, num_layers=2, heads=2,
                                      direction=d, cnn_layers=1, norm=norm, bias=bias)
        else:
            parts[d] = FeatureGraphEmitter(num_tokens=TOKENS, hidden_channels=16, num_layers=2,
                                           heads=2, direction=d, bias=bias)
    predictor = PretrainedGraphPredictor(parts.get("forward"), parts.get("backward"),
                                         VOCAB if vocab else None)
    with torch.no_grad():  # non-default values everywhere, BatchNorm buffers included
        for t in predictor.state_dict().values():
            if t.is_floating_point():
                t.add_(0.1 * torch.rand_like(t))
    return predictor.eval()


def graphs_equal(a, b):
    x = torch.randint(0, TOKENS, (17,))
    batch = batch_vector([7, 10])
    for ga, gb in zip(a(x, batch), b(x, batch)):
        assert (ga is None) == (gb is None)
        if ga is None:
            continue
        for l in range(ga.num_layers):
            assert torch.equal(ga.edge_index[l], gb.edge_index[l])
            assert torch.equal(ga.edge_weight[l], gb.edge_weight[l])
            assert torch.equal(ga.edge_head[l], gb.edge_head[l])


@pytest.mark.parametrize("kind,norm,bias,directions", [
    ("graph", "layer", "scalar", ("forward", "backward")),
    ("graph", "batch", "threshold", ("forward", "backward")),
    ("graph", None, "scalar", ("backward",)),
    ("feature", "layer", "threshold", ("forward", "backward")),
])
def test_round_trip_gives_identical_graphs(tmp_path, kind, norm, bias, directions):
    predictor = make(kind, norm, bias, directions)
    predictor.save_pretrained(tmp_path / "p")
    assert sorted(os.listdir(tmp_path / "p")) == ["config.json", "model.safetensors"]
    loaded = PretrainedGraphPredictor.from_pretrained(tmp_path / "p", map_location="cpu")
    assert not loaded.training and loaded.directions == directions
    assert loaded.vocabulary == VOCAB
    a, b = predictor.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    graphs_equal(predictor, loaded)
    transfer = GlomoTransfer(loaded, in_channels=3)  # usable downstream as is
    x = torch.randint(0, TOKENS, (9,))
    assert transfer(torch.randn(9, 3), x).shape == (9, 6)


def test_save_overwrites_and_load_accepts_devices(tmp_path):
    first, second = make(), make()
    save_pretrained(first, tmp_path)
    save_pretrained(second, tmp_path)
    graphs_equal(second, load_pretrained(tmp_path, map_location=torch.device("cpu")))
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["format_version"] == io.FORMAT_VERSION
    assert config["directions"]["forward"]["cls"] == "GraphPredictor"
    assert config["directions"]["backward"]["config"]["direction"] == "backward"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_load_onto_gpu(tmp_path):
    save_pretrained(make(), tmp_path)
    loaded = load_pretrained(tmp_path, map_location="cuda")
    assert all(p.is_cuda for p in loaded.parameters())


def test_vocabulary_checks(tmp_path):
    save_pretrained(make(), tmp_path)
    load_pretrained(tmp_path, vocabulary=VOCAB)
    changed = VOCAB[:4] + ["other"] + VOCAB[5:]
    with pytest.raises(PretrainedFormatError, match="first difference at id 4: 'other' given, 'tok4'"):
        load_pretrained(tmp_path, vocabulary=changed)
    with pytest.raises(PretrainedFormatError, match="29 tokens given, 30 saved"):
        load_pretrained(tmp_path, vocabulary=VOCAB[:-1])
    save_pretrained(make(vocab=False), tmp_path / "novocab")
    assert load_pretrained(tmp_path / "novocab").vocabulary is None
    with pytest.raises(PretrainedFormatError, match="holds no vocabulary"):
        load_pretrained(tmp_path / "novocab", vocabulary=VOCAB)
    edit_config(tmp_path, lambda c: c.update(vocabulary=VOCAB[:-2]))
    with pytest.raises(PretrainedFormatError, match="vocabulary has 28 entries, the predictor embeds 30"):
        load_pretrained(tmp_path)
    edit_config(tmp_path, lambda c: c.update(vocabulary=[1, 2]))
    with pytest.raises(PretrainedFormatError, match="list of strings"):
        load_pretrained(tmp_path)


def edit_config(path, change):
    config = json.loads((path / "config.json").read_text())
    change(config)
    (path / "config.json").write_text(json.dumps(config))


def rehash(path):
    """Record the current weights file in the config, as an attacker could."""
    data = (path / "model.safetensors").read_bytes()
    import hashlib
    edit_config(path, lambda c: c["weights"].update(bytes=len(data),
                                                    sha256=hashlib.sha256(data).hexdigest()))


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(PretrainedFormatError, match="does not exist"):
        load_pretrained(tmp_path / "nothing")
    (tmp_path / "file.pt").write_bytes(b"abc")
    with pytest.raises(PretrainedFormatError, match="is a file"):
        load_pretrained(tmp_path / "file.pt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PretrainedFormatError, match="config.json is missing"):
        load_pretrained(tmp_path / "empty")
    d = tmp_path / "p"
    save_pretrained(make(), d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(PretrainedFormatError, match="not valid JSON"):
        load_pretrained(d)
    (d / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(PretrainedFormatError, match="not a glomo_pyg pretrained-predictor config"):
        load_pretrained(d)
    save_pretrained(make(), d)
    edit_config(d, lambda c: c.update(format_version=io.FORMAT_VERSION + 1))
    with pytest.raises(PretrainedFormatError, match="format version 3.*reads versions up to 2"):
        load_pretrained(d)
    save_pretrained(make(), d)
    edit_config(d, lambda c: c.pop("weights"))
    with pytest.raises(PretrainedFormatError, match="lacks the 'weights' entry"):
        load_pretrained(d)
    save_pretrained(make(), d)
    os.remove(d / "model.safetensors")
    with pytest.raises(PretrainedFormatError, match="model.safetensors is missing"):
        load_pretrained(d)


def test_truncated_and_corrupted_weights(tmp_path):
    save_pretrained(make(), tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:len(data) // 2])
    with pytest.raises(PretrainedFormatError, match=f"truncated: {len(data) // 2} of {len(data)} bytes"):
        load_pretrained(tmp_path)
    flipped = bytearray(data)
    flipped[-3] ^= 0xFF  # inside a tensor: safetensors alone would not notice
    weights.write_bytes(bytes(flipped))
    with pytest.raises(PretrainedFormatError, match="does not match the SHA-256"):
        load_pretrained(tmp_path)
    weights.write_bytes(data + b"\0")
    with pytest.raises(PretrainedFormatError, match="replaced or corrupted"):
        load_pretrained(tmp_path)
    weights.write_bytes(data[:100])  # truncated and re-hashed: the parser refuses it
    rehash(tmp_path)
    with pytest.raises(PretrainedFormatError, match="not a valid safetensors file"):
        load_pretrained(tmp_path)


class _Payload:
    """Unpickling this would create the marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickle_disguised_as_weights_is_refused_without_executing(tmp_path):
    marker = tmp_path / "executed"
    save_pretrained(make(), tmp_path / "p")
    weights = tmp_path / "p" / "model.safetensors"
    weights.write_bytes(pickle.dumps(_Payload(str(marker))))
    with pytest.raises(PretrainedFormatError, match="SHA-256|replaced|truncated"):
        load_pretrained(tmp_path / "p")
    rehash(tmp_path / "p")  # the checksum alone must not be the only defence
    with pytest.raises(PretrainedFormatError, match="not a valid safetensors file"):
        load_pretrained(tmp_path / "p")
    # a torch.save() checkpoint (zip of pickles) carrying the payload is refused too
    torch.save({"weight": _Payload(str(marker))}, weights)
    rehash(tmp_path / "p")
    with pytest.raises(PretrainedFormatError, match="not a valid safetensors file"):
        load_pretrained(tmp_path / "p")
    assert not marker.exists()


def test_config_that_does_not_match_the_weights(tmp_path):
    save_pretrained(make(), tmp_path)
    edit_config(tmp_path, lambda c: c["directions"]["forward"]["config"].update(hidden_channels=32,
                                                                                 heads=4))
    with pytest.raises(PretrainedFormatError, match=r"shape mismatch fw\..*file \(.*\) vs config"):
        load_pretrained(tmp_path)
    save_pretrained(make(), tmp_path)
    edit_config(tmp_path, lambda c: c["directions"]["forward"]["config"].update(num_layers=3))
    with pytest.raises(PretrainedFormatError, match="missing tensors"):
        load_pretrained(tmp_path)
    save_pretrained(make(), tmp_path)
    edit_config(tmp_path, lambda c: c["directions"]["backward"]["config"].update(cnn_layers=0))
    with pytest.raises(PretrainedFormatError, match="unexpected tensors"):
        load_pretrained(tmp_path)
    save_pretrained(make(), tmp_path)
    edit_config(tmp_path, lambda c: c["directions"]["forward"].update(cls="os.system"))
    with pytest.raises(PretrainedFormatError, match="must name one of"):
        load_pretrained(tmp_path)
    save_pretrained(make(), tmp_path)
    edit_config(tmp_path, lambda c: c["directions"]["forward"]["config"].update(colour="red"))
    with pytest.raises(PretrainedFormatError, match="cannot build the forward GraphPredictor"):
        load_pretrained(tmp_path)
    save_pretrained(make(), tmp_path)
    edit_config(tmp_path, lambda c: c["directions"]["forward"]["config"].update(direction="backward"))
    with pytest.raises(PretrainedFormatError, match="other direction"):
        load_pretrained(tmp_path)
    save_pretrained(make(), tmp_path)
    edit_config(tmp_path, lambda c: c["directions"].update(sideways={}))
    with pytest.raises(PretrainedFormatError, match="directions must be"):
        load_pretrained(tmp_path)


def test_interrupted_save_keeps_the_previous_files(tmp_path, monkeypatch):
    old = make()
    save_pretrained(old, tmp_path)

    def fail(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(io.os, "fsync", fail)
    with pytest.raises(KeyboardInterrupt):
        save_pretrained(make(), tmp_path)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    graphs_equal(old, load_pretrained(tmp_path))


def test_save_rejects_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="PretrainedGraphPredictor"):
        save_pretrained(GraphPredictor(num_tokens=5, hidden_channels=8, heads=2), tmp_path)
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        save_pretrained(make(), tmp_path / "f")
