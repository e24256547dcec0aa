"""save_pretrained / load_pretrained: round trips and every way a file can be wrong."""
import json
import os
import pickle
import time

import pytest
import torch
from bundles import edit_config, write_config
from reference import batch_vector

import glomo_pyg.io.pretrained as io
from glomo_pyg import (
    GlomoTransfer,
    GraphPredictor,
    PretrainedFormatError,
    PretrainedGraphPredictor,
    load_pretrained,
    save_pretrained,
)
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
                                           heads=2, direction=d, bias=bias,
                                           pooled_context=kind == "feature-pooled",
                                           local_context=2 if kind == "feature-local" else 0)
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
    ("feature-pooled", "layer", "scalar", ("forward",)),
    ("feature-local", None, "threshold", ("backward",)),
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


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_load_onto_gpu(tmp_path):
    save_pretrained(make(), tmp_path)
    loaded = load_pretrained(tmp_path, map_location="cuda")
    assert all(p.is_cuda for p in loaded.parameters())


def test_vocabulary_checks(tmp_path):
    save_pretrained(make(), tmp_path)
    load_pretrained(tmp_path, vocabulary=VOCAB)
    changed = VOCAB[:4] + ["other"] + VOCAB[5:]
    with pytest.raises(PretrainedFormatError,
                       match="first difference at id 4: 'other' given, 'tok4'"):
        load_pretrained(tmp_path, vocabulary=changed)
    with pytest.raises(PretrainedFormatError, match="29 tokens given, 30 saved"):
        load_pretrained(tmp_path, vocabulary=VOCAB[:-1])
    save_pretrained(make(vocab=False), tmp_path / "novocab")
    assert load_pretrained(tmp_path / "novocab").vocabulary is None
    with pytest.raises(PretrainedFormatError, match="tokens given, none saved"):
        load_pretrained(tmp_path / "novocab", vocabulary=VOCAB)
    edit_config(tmp_path, lambda c: c.update(vocabulary=VOCAB[:-2]))
    with pytest.raises(PretrainedFormatError,
                       match="vocabulary has 28 entries, the predictor embeds 30"):
        load_pretrained(tmp_path)
    edit_config(tmp_path, lambda c: c.update(vocabulary=[1, 2]))
    with pytest.raises(PretrainedFormatError, match="list of strings"):
        load_pretrained(tmp_path)


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
    with pytest.raises(PretrainedFormatError,
                       match="format must be .* pretrained-predictor config"):
        load_pretrained(d)
    save_pretrained(make(), d)
    edit_config(d, lambda c: c.update(format_version=io.FORMAT_VERSION + 1))
    with pytest.raises(PretrainedFormatError, match="format version 4.*reads versions up to 3"):
        load_pretrained(d)
    save_pretrained(make(), d)
    edit_config(d, lambda c: c.pop("weights"))
    with pytest.raises(PretrainedFormatError,
                       match="weights.file must be 'model.safetensors', got null"):
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
    with pytest.raises(PretrainedFormatError,
                       match=f"truncated: {len(data) // 2} of {len(data)} bytes"):
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
    edit_config(tmp_path,
                lambda c: c["directions"]["forward"]["config"].update(direction="backward"))
    with pytest.raises(PretrainedFormatError,
                       match="forward predictor was built for direction 'backward'"):
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


# --- untrusted configs: bombs, types, nesting, non-finite weights, bad paths -----------
def set_forward(path, **values):
    edit_config(path, lambda c: c["directions"]["forward"]["config"].update(values))


def raw_config(path, text):
    (path / "config.json").write_bytes(text if isinstance(text, bytes) else text.encode())


def fails_fast(path, match, limit=0.5):
    """load_pretrained refuses ``path`` with a PretrainedFormatError, within ``limit`` s."""
    start = time.perf_counter()
    with pytest.raises(PretrainedFormatError, match=match):
        load_pretrained(path)
    assert time.perf_counter() - start < limit


@pytest.mark.parametrize("key,value,match", [
    ("num_tokens", 2e7, r"num_tokens must be an integer in \[1, 16777216\] or null, "
                        r"got 20000000\.0"),
    ("num_tokens", 20_000_000, r"num_tokens must be an integer in \[1, 16777216\] or null, "
                               r"got 20000000"),
    ("num_layers", 1e5, r"num_layers must be an integer in \[1, 1024\], got 100000.0"),
    ("num_layers", 100_000, r"num_layers must be an integer in \[1, 1024\], got 100000"),
    ("cnn_layers", 1_000_000, r"cnn_layers must be an integer in \[0, 1024\], got 1000000"),
    ("hidden_channels", 1 << 20, r"hidden_channels must be an integer in \[1, 65536\], "
                                 r"got 1048576"),
    ("heads", 5000, r"heads must be an integer in \[1, 1024\], got 5000"),
    ("kernel_size", 1 << 30, r"kernel_size must be an integer in \[1, 1023\], got 1073741824"),
    ("block_size", 1 << 40, r"block_size must be an integer in \[1, 17179869184\], "
                            r"got 1099511627776"),
    ("position_frequencies", 10 ** 6, r"position_frequencies must be an integer in \[1, 4096\], "
                                      r"got 1000000"),
])
def test_config_bombs_fail_fast_naming_the_key_and_the_bound(tmp_path, key, value, match):
    save_pretrained(make(), tmp_path)
    set_forward(tmp_path, **{key: value})
    fails_fast(tmp_path, r"config.json: forward GraphPredictor config: " + match)


@pytest.mark.parametrize("values", [
    dict(num_tokens=16_000_000),              # within the bounds: an 1 GB embedding
    dict(num_layers=1024, cnn_layers=1024),   # within the bounds: thousands of modules
    dict(hidden_channels=65536, heads=1024, bias="threshold"),
])
def test_configs_within_the_bounds_are_compared_with_the_header_before_any_real_module(
        tmp_path, monkeypatch, values):
    save_pretrained(make(), tmp_path)
    set_forward(tmp_path, **values)
    import glomo_pyg.nn.pretrained as pretrained
    real_builds, build = [], pretrained.build_emitter

    def spy(*args, **kwargs):  # (the loader's builds at real size; meta ones are saved's)
        real_builds.append(args[0])
        return build(*args, **kwargs)
    monkeypatch.setattr(pretrained, "build_emitter", spy)
    fails_fast(tmp_path, "does not match .*config.json|far more tensors than model.safetensors",
               limit=1.0)
    assert real_builds == []  # only the allocation-free meta build ran


def test_dtypes_are_compared_and_a_bad_header_is_refused(tmp_path):
    from safetensors.torch import save
    save_pretrained(make(), tmp_path)
    tensors = dict(make().predictors.state_dict())
    tensors["fw.scorer.bias"] = tensors["fw.scorer.bias"].double()
    (tmp_path / "model.safetensors").write_bytes(save(tensors))
    rehash(tmp_path)
    with pytest.raises(PretrainedFormatError, match=r"unexpected dtypes for \['fw.scorer.bias'\]"):
        load_pretrained(tmp_path)
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes((1 << 62).to_bytes(8, "little") + data[8:])
    rehash(tmp_path)
    with pytest.raises(PretrainedFormatError, match="not a valid safetensors file .*header"):
        load_pretrained(tmp_path)


@pytest.mark.parametrize("key,value,match", [
    ("sparse", "no", 'sparse must be true or false, got "no" \\(a string\\)'),
    ("sparse", 0, "sparse must be true or false, got 0 \\(an integer\\)"),
    ("include_self", None, "include_self must be true or false, got null"),
    ("dropout", "0.5", 'dropout must be a number in \\[0, 1\\), got "0.5" \\(a string\\)'),
    ("dropout", True, "dropout must be a number in \\[0, 1\\), got true"),
    ("dropout", 1.5, r"dropout must be a number in \[0, 1\), got 1.5"),
    ("num_layers", True, r"num_layers must be an integer in \[1, 1024\], got true"),
    ("num_layers", 2.0, r"num_layers must be an integer in \[1, 1024\], got 2.0"),
    ("hidden_channels", "16", r'hidden_channels must be an integer in \[1, 65536\], got "16"'),
    ("norm", 5, "norm must be a string of at most 256 characters or null, got 5"),
    ("bias", ["scalar"], "bias must be a string .*, got a list"),
    ("head_channels", {"a": 1}, r"head_channels must be an integer in \[1, 65536\] or null, "
                                r"got an object"),
    ("position_period", 10 ** 400, "position_period must be a number >= 2, got 1000"),
    ("pixel_mean", [0.5, "0.5"],
     "pixel_mean must be a list of at most 65536 finite numbers or null"),
])
def test_config_values_must_have_their_json_type(tmp_path, key, value, match):
    save_pretrained(make(), tmp_path)
    set_forward(tmp_path, **{key: value})
    fails_fast(tmp_path, match)


@pytest.mark.parametrize("kind, key, cls", [("graph", "include_self", "GraphPredictor"),
                                             ("feature", "padding_idx", "FeatureGraphEmitter")])
def test_format_2_config_missing_an_argument_is_refused_not_defaulted(tmp_path, kind, key,
                                                                      cls, monkeypatch):
    """A format-2 file records every named constructor argument: a missing one (here
    one that no tensor shape reveals) means an edited file and is named, not silently
    replaced by its default. Arguments declared as added since load without it."""
    save_pretrained(make(kind), tmp_path)
    edit_config(tmp_path, lambda c: c["directions"]["backward"]["config"].pop(key))
    with pytest.raises(PretrainedFormatError,
                       match=rf"the backward {cls} from its config: it lacks arguments "
                             rf"\['{key}'\]"):
        load_pretrained(tmp_path)
    # a setting declared as added later (saved="optional") loads without it, as its default
    import dataclasses
    from typing import Optional

    from glomo_pyg.nn.emitter import EMITTERS
    from glomo_pyg.nn.settings import ModelSettings
    from glomo_pyg.settings import setting

    @dataclasses.dataclass
    class Later(ModelSettings):
        include_self: bool = setting(False, saved="optional")
        padding_idx: Optional[int] = setting(None, saved="optional")

    monkeypatch.setattr(EMITTERS[cls], "settings", Later)
    assert load_pretrained(tmp_path).predictor("backward") is not None


def test_format_2_feature_emitter_saved_before_pooled_context_was_named(tmp_path):
    """glomo_pyg 0.2.0 first wrote -decouple predictors whose config had no pooled_context
    (it went through **scorer_kwargs) and no local_context (added later): they load,
    without either."""
    save_pretrained(make("feature"), tmp_path)
    edit_config(tmp_path, lambda c: [c["directions"][d]["config"].pop(key)
                                     for d in ("forward", "backward")
                                     for key in ("pooled_context", "local_context")])
    loaded = load_pretrained(tmp_path)
    assert loaded.predictor("forward").config()["pooled_context"] is False
    assert loaded.predictor("forward").config()["local_context"] == 0


def test_type_rules_cover_every_emitter_argument():
    """A new constructor argument needs a declared setting (ModelSettings) listed in
    SAVED_SETTINGS, or its saved models would not load; the rule's type must be the
    argument's annotation."""
    import inspect

    from glomo_pyg.nn.emitter import EMITTERS
    from glomo_pyg.nn.scorer import GraphScorer
    from glomo_pyg.nn.settings import MODEL_RULES, SAVED_SETTINGS
    kinds = {"int": (int, False), "Optional[int]": (int, True), "float": (float, False),
             "bool": (bool, False), "str": (str, False), "Optional[str]": (str, True),
             "Sequence[float]": (list, False), "Optional[Sequence[float]]": (list, True)}
    seen = set()
    for cls in EMITTERS.values():
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        if any(p.kind is p.VAR_KEYWORD for p in params):  # FeatureGraphEmitter: the scorer's
            params += list(inspect.signature(GraphScorer.__init__).parameters.values())[4:]
        for p in params:
            if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                continue
            assert p.name in SAVED_SETTINGS, f"{cls.__name__}.{p.name} is not saved"
            rule = MODEL_RULES[p.name]
            kind, optional = kinds[p.annotation]
            assert rule.kind is kind and (rule.optional or not optional), \
                (cls.__name__, p.name, p.annotation)
            seen.add(p.name)
    assert seen == set(SAVED_SETTINGS)


def test_bad_json_is_named_with_the_file(tmp_path, monkeypatch):
    save_pretrained(make(), tmp_path)
    good = (tmp_path / "config.json").read_text()
    cases = [
        ("[" * 100_000 + "]" * 100_000, "not valid JSON \\(nested more than 16 deep\\)"),
        ('{"format": ' + "[" * 20 + "]" * 20 + "}", "nested more than 16 deep"),
        ("\x00\x01garbage", "config.json is not valid JSON"),
        (b"\xff\xfe{}", "config.json is not valid JSON \\(not UTF-8"),
        ('{"a": 1, "a": 2}', "config.json is not valid JSON \\(duplicate key 'a'\\)"),
        ('{"a": NaN}', "config.json is not valid JSON \\(NaN is not a JSON number\\)"),
        ('{"a": ' + "9" * 5000 + "}", "config.json is not valid JSON"),
        ("", "config.json is not valid JSON"),
    ]
    for text, match in cases:
        raw_config(tmp_path, text)
        fails_fast(tmp_path, str(tmp_path / "config.json").replace("\\", "\\\\") + ".*" + match
                   if "config.json" not in match else match)
    raw_config(tmp_path, good.replace('"sparse": true', '"sparse": true, "sparse": false'))
    fails_fast(tmp_path, "duplicate key 'sparse'")
    raw_config(tmp_path, good)
    monkeypatch.setattr(io, "MAX_CONFIG_BYTES", 1000)
    fails_fast(tmp_path, r"config.json has \d+ bytes, more than the 1000")
    monkeypatch.undo()
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").mkdir()
    fails_fast(tmp_path, "config.json cannot be read: .*not a regular file")
    os.rmdir(tmp_path / "config.json")
    if hasattr(os, "mkfifo"):  # a FIFO must not block the loader
        os.mkfifo(tmp_path / "config.json")
        fails_fast(tmp_path, "config.json cannot be read: .*not a regular file")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_are_refused_at_load_and_at_save(tmp_path, value):
    from safetensors.torch import save
    predictor = make()
    save_pretrained(predictor, tmp_path)
    tensors = dict(predictor.predictors.state_dict())
    tensors["bw.key_cnn.convs.0.weight"] = tensors["bw.key_cnn.convs.0.weight"].clone()
    tensors["bw.key_cnn.convs.0.weight"][0, 0, 1] = value
    (tmp_path / "model.safetensors").write_bytes(save(tensors))
    rehash(tmp_path)
    with pytest.raises(PretrainedFormatError, match=r"NaN or infinite weights in "
                       r"bw.key_cnn.convs.0.weight \(1 of 768 values\)"):
        load_pretrained(tmp_path)
    with torch.no_grad():
        predictor.predictor("backward").key_cnn.convs[0].weight[0, 0, 1] = value
    with pytest.raises(ValueError, match="NaN or infinite weights in bw.key_cnn.convs.0.weight"):
        save_pretrained(predictor, tmp_path / "q")
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("bad", [None, 3, b"/tmp/p", ["p"]])
def test_path_must_be_a_string_or_path_like(tmp_path, bad):
    with pytest.raises(TypeError, match="path must be a str or os.PathLike"):
        PretrainedGraphPredictor.from_pretrained(bad)
    with pytest.raises(TypeError, match="path must be a str or os.PathLike"):
        load_pretrained(bad)
    with pytest.raises(TypeError, match="path must be a str or os.PathLike"):
        save_pretrained(make(), bad)
    with pytest.raises(PretrainedFormatError, match="path is empty"):
        load_pretrained("")


def test_weights_entry_and_vocabulary_are_checked(tmp_path):
    save_pretrained(make(), tmp_path)
    for change, match in [
            (lambda c: c["weights"].update(bytes=True), "weights.bytes must be .*got true"),
            (lambda c: c["weights"].update(bytes="12"), "weights.bytes must be"),
            (lambda c: c["weights"].update(sha256=None), "weights.sha256 must be 64"),
            (lambda c: c.update(format_version=True), "format_version must be an integer >= 1"),
            (lambda c: c.update(vocabulary="abc"), "vocabulary must be a list of strings"),
            (lambda c: c.update(trained_length=1), "trained_length must be an integer >= 2"),
            (lambda c: c.update(trained_length=True), "trained_length must be an integer"),
            (lambda c: c.update(trained_length="64"), "trained_length must be an integer"),
            (lambda c: c.update(trained_length=64.5), "trained_length must be an integer"),
            (lambda c: c.update(trained_size=[16]), "trained_size must be .height, width."),
            (lambda c: c.update(trained_size=[16, 0]), "trained_size must be"),
            (lambda c: c.update(trained_size=[16, True]), "trained_size must be"),
            (lambda c: c.update(trained_size="16x16"), "trained_size must be"),
            (lambda c: c.update(trained_size=[16, 1 << 40]), "trained_size must be"),
            (lambda c: c.update(trained_size=[16.0, 16]), "trained_size must be"),
            (lambda c: c.update(trained_size=[[16], [16]]), "trained_size must be"),
            (lambda c: c.update(trained_size=[1, 16]), "trained_size must be"),
            (lambda c: c.update(trained_size=[16, 16, 16]), "trained_size must be")]:
        save_pretrained(make(), tmp_path)
        edit_config(tmp_path, change)
        fails_fast(tmp_path, match)


def test_sparse_huge_files_are_refused_before_they_are_read(tmp_path):
    """A sparse file can claim gigabytes on a few disk blocks: the config's size and the
    weights' header (which must cover the file exactly) are checked before any of the
    rest is read."""
    folder = tmp_path / "p"
    make().save_pretrained(folder)
    weights = folder / "model.safetensors"
    config = json.loads((folder / "config.json").read_text())
    with open(weights, "r+b") as fh:
        fh.truncate(1 << 30)  # sparse: 1 GiB of zeros after the real tensors
    config["weights"]["bytes"] = 1 << 30
    write_config(folder, config)
    start = time.time()
    with pytest.raises(PretrainedFormatError,
                       match="not a valid safetensors file .*not fully covered"):
        load_pretrained(folder)
    assert time.time() - start < 5
    with open(folder / "config.json", "r+b") as fh:
        fh.truncate(io.MAX_CONFIG_BYTES + 1)
    with pytest.raises(PretrainedFormatError, match="more than the"):
        load_pretrained(folder)


def test_duplicate_vocabulary_and_bad_map_location_are_named(tmp_path):
    folder = tmp_path / "p"
    make().save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    vocab = config["vocabulary"]
    with pytest.raises(ValueError, match="more than once"):
        PretrainedGraphPredictor(load_pretrained(folder).predictor("forward"),
                                 vocabulary=[vocab[0]] + vocab[:-1])
    config["vocabulary"] = [vocab[0]] + vocab[:-1]
    write_config(folder, config)
    with pytest.raises(PretrainedFormatError, match="more than once"):
        load_pretrained(folder)
    for bad in ("banana", 3.5):
        with pytest.raises(ValueError, match="is not a device"):
            load_pretrained(folder, map_location=bad)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            load_pretrained(folder, map_location="cuda")
    with pytest.raises(TypeError, match="sequence of tokens"):
        load_pretrained(folder, vocabulary=5)


def test_trained_length_travels_with_the_predictor(tmp_path):
    parts = [GraphPredictor(num_tokens=TOKENS, hidden_channels=16, num_layers=1, heads=2,
                            direction=d, cnn_layers=1) for d in ("forward", "backward")]
    predictor = PretrainedGraphPredictor(*parts, VOCAB, trained_length=64)
    assert "trained_length=64" in repr(predictor)
    save_pretrained(predictor, tmp_path / "p")
    assert load_pretrained(tmp_path / "p").trained_length == 64
    # files written before it was recorded load with an unknown length
    edit_config(tmp_path / "p", lambda c: c.pop("trained_length"))
    assert load_pretrained(tmp_path / "p").trained_length is None
    # the same for the crops of pixel predictors
    from glomo_pyg import PixelGraphPredictor
    pixel = PretrainedGraphPredictor(PixelGraphPredictor(height=8, width=8, hidden_channels=8,
                                                         num_layers=1, heads=2, cnn_layers=1),
                                     trained_size=(4, 6))
    save_pretrained(pixel, tmp_path / "px")
    assert load_pretrained(tmp_path / "px").trained_size == (4, 6)
    edit_config(tmp_path / "px", lambda c: c.pop("trained_size"))
    assert load_pretrained(tmp_path / "px").trained_size is None
    for bad in (1, 0, True, 3.0, "64"):
        with pytest.raises(ValueError, match="trained_length must be an integer >= 2"):
            PretrainedGraphPredictor(*parts, VOCAB, trained_length=bad)
