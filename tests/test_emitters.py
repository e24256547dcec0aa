"""The graph-emitter protocol, configs, the saved-format versions, Glomo assembled from
parts, and the one allowed-sources rule."""
import inspect
import json
import os
import warnings

import numpy as np
import pytest
import torch

from glomo_pyg import (
    ContextDecoder,
    FeatureGraphEmitter,
    FeaturePredictor,
    Glomo,
    GraphEmitter,
    GraphPredictor,
    LatentGraphs,
    PretrainedGraphPredictor,
    SequenceOrder,
    UnitOrder,
    load_pretrained,
    save_pretrained,
)
from glomo_pyg.io.pretrained import PretrainedFormatError, UnsealedPredictorWarning
from glomo_pyg.nn import EMITTERS
from glomo_pyg.nn.config import ConfigurableModule

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


@pytest.mark.parametrize("cls, kwargs", [
    (GraphPredictor, dict(num_tokens=12, hidden_channels=8, num_layers=2, heads=2,
                          cnn_layers=1, position="relative", bias="threshold")),
    (GraphPredictor, dict(in_channels=5, hidden_channels=8, num_layers=1, heads=4,
                          direction="backward", include_self=True, norm=None)),
    (FeatureGraphEmitter, dict(num_tokens=12, hidden_channels=8, num_layers=2, heads=2,
                               direction="backward", sparse=False)),
])
def test_config_rebuilds_the_emitter_and_records_every_argument(cls, kwargs):
    torch.manual_seed(0)
    module = cls(**kwargs).eval()
    config = module.config()
    assert json.loads(json.dumps(config)) == config  # plain JSON
    params = set(inspect.signature(cls.__init__).parameters) - {"self", "scorer_kwargs"}
    assert params <= set(config)  # every constructor argument, defaults included
    assert "layout" not in config and "decouple" not in config
    rebuilt = cls.from_config(config).eval()
    rebuilt.load_state_dict(module.state_dict())
    assert isinstance(module, GraphEmitter) and EMITTERS[cls.__name__] is cls
    x = torch.randint(0, 12, (9,)) if "num_tokens" in kwargs else torch.randn(9, 5)
    batch = torch.tensor([0] * 4 + [1] * 5)
    a, b = module(x, batch), rebuilt(x, batch)
    for (ea, wa, ha), (eb, wb, hb) in zip(a, b):
        assert torch.equal(ea, eb) and torch.equal(ha, hb)
        torch.testing.assert_close(wa, wb)
    with pytest.raises(TypeError, match="colour"):
        cls.from_config(dict(config, colour="red"))
    with pytest.raises(TypeError, match="dict with string keys"):
        cls.from_config([1, 2])


def test_configurable_module_refuses_values_it_cannot_save():
    class Holder(ConfigurableModule):
        def __init__(self, value, *, scale: float = 1.0):
            super().__init__()

    assert Holder((1, 2)).config() == {"value": [1, 2], "scale": 1.0}
    with pytest.raises(TypeError, match="cannot be saved"):
        Holder(torch.zeros(1)).config()
    with pytest.raises(TypeError, match="cannot be saved"):
        Holder(np.datetime64("2026-01-01")).config()
    # numpy scalars (e.g. sizes read from an array) are saved as the Python numbers
    config = Holder([np.int64(8), np.bool_(True)], scale=np.float32(0.5)).config()
    assert config == {"value": [8, True], "scale": 0.5}
    assert [type(v) for v in (*config["value"], config["scale"])] == [int, bool, float]
    json.dumps(config, allow_nan=False)


def v1_directory(name: str, tmp_path) -> str:
    """A format-1 predictor directory rebuilt from its fixture: ``config.json`` as
    glomo_pyg 0.1.0 wrote it, and its weights, kept as JSON (the repository holds no
    binary weight files), written back to ``model.safetensors``. The config's checksum
    entry is updated to these bytes: safetensors' framing may differ between versions,
    while the tensors are the saved ones."""
    import hashlib

    from safetensors.torch import save

    source = os.path.join(DATA, name)
    config = json.load(open(os.path.join(source, "config.json")))
    weights = {k: torch.tensor(v["data"], dtype=getattr(torch, v["dtype"])).view(v["shape"])
               for k, v in json.load(open(os.path.join(source, "weights.json"))).items()}
    payload = save(weights)
    config["weights"].update(bytes=len(payload), sha256=hashlib.sha256(payload).hexdigest())
    target = tmp_path / name
    target.mkdir()
    (target / "model.safetensors").write_bytes(payload)
    (target / "config.json").write_text(json.dumps(config))
    return str(target)


@pytest.mark.parametrize("name", ["pretrained-v1", "pretrained-v1-nodecouple"])
def test_files_of_format_version_1_still_load_with_the_same_graphs(name, tmp_path):
    """Fixtures written by glomo_pyg 0.1.0 (format 1, hand-copied kwargs with the layout
    inside): loaded when asked for (allow_unsealed=True), the same graphs come out, with
    a warning that the file is not sealed, and saving again writes the current, sealed
    format."""
    path = v1_directory(name, tmp_path)
    assert json.load(open(os.path.join(path, "config.json")))["format_version"] == 1
    with pytest.raises(PretrainedFormatError, match="format version 1, which is not sealed"):
        load_pretrained(path)
    with pytest.warns(UnsealedPredictorWarning, match="has format version 1.*glomo reseal"):
        predictor = load_pretrained(path, allow_unsealed=True)
    expected = json.load(open(os.path.join(DATA, name, "expected.json")))
    x, batch = torch.tensor(expected["x"]), torch.tensor(expected["batch"])
    graphs = predictor(x, batch)
    for direction in ("forward", "backward"):
        got = getattr(graphs, direction).to_sparse()
        for l, want in enumerate(expected["graphs"][direction]):
            ei, w, eh = got.layer(l)
            assert ei.tolist() == want["edge_index"] and eh.tolist() == want["edge_head"]
            torch.testing.assert_close(w, torch.tensor(want["edge_weight"]), rtol=1e-5,
                                       atol=1e-6)
    kind = FeatureGraphEmitter if name.endswith("nodecouple") else GraphPredictor
    assert type(predictor.predictor("forward")) is kind
    assert predictor.predictor("forward").layout == "sparse"  # the saved 'auto' is dropped
    save_pretrained(predictor, tmp_path / "p")
    config = json.load(open(tmp_path / "p" / "config.json"))
    assert config["format_version"] == 3 and "layout" not in \
        config["directions"]["forward"]["config"] and "seal" in config
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # sealed: no warning
        assert load_pretrained(tmp_path / "p").vocabulary == predictor.vocabulary


def test_layout_is_a_run_time_choice_and_not_saved(tmp_path):
    torch.manual_seed(0)
    model = Glomo.text(num_tokens=12, hidden_channels=8, num_layers=2, heads=2, cnn_layers=1)
    predictor = model.to_pretrained().set_layout("dense")
    x, batch = torch.randint(0, 12, (9,)), torch.tensor([0] * 4 + [1] * 5)
    dense = predictor(x, batch)
    assert dense.forward.layout == "dense" and \
        predictor(x, batch, layout="sparse").forward.layout == "sparse"
    predictor.save_pretrained(tmp_path / "p")
    loaded = PretrainedGraphPredictor.from_pretrained(tmp_path / "p")
    assert loaded(x, batch).forward.layout == "sparse"
    torch.testing.assert_close(loaded(x, batch).forward.to_dense(), dense.forward.to_dense())
    with pytest.raises(ValueError, match="layout must be"):
        model.set_layout("csr")


def test_glomo_assembled_from_parts_equals_the_text_factory():
    torch.manual_seed(0)
    text = Glomo.text(num_tokens=15, hidden_channels=8, num_layers=2, heads=2, cnn_layers=1,
                      context_length=2, num_positions=3, bidirectional=False)
    emitter = GraphPredictor(num_tokens=15, hidden_channels=8, num_layers=2, heads=2,
                             cnn_layers=1)
    features = FeaturePredictor(num_tokens=15, hidden_channels=8, num_layers=2, heads=2)
    head = ContextDecoder(features.embedding, 8, context_length=2)
    parts = Glomo({"forward": features}, {"forward": head}, {"forward": emitter},
                  num_positions=3)
    parts.load_state_dict(text.state_dict())  # same parameter names
    x, batch = torch.randint(0, 15, (11,)), torch.tensor([0] * 5 + [1] * 6)
    text.eval(), parts.eval()
    torch.testing.assert_close(parts(x, batch).loss, text(x, batch).loss)
    assert parts.emitter("forward") is emitter and parts.directions == ("forward",)


def test_glomo_parts_are_checked():
    f = FeaturePredictor(num_tokens=15, hidden_channels=8, num_layers=2, heads=2)
    head = ContextDecoder(f.embedding, 8)
    g = GraphPredictor(num_tokens=15, hidden_channels=8, num_layers=3, heads=2)
    with pytest.raises(ValueError, match="3 layers x 2 heads"):
        Glomo({"forward": f}, {"forward": head}, {"forward": g})
    g_bw = GraphPredictor(num_tokens=15, hidden_channels=8, num_layers=2, heads=2,
                          direction="backward")
    with pytest.raises(ValueError, match="built for direction 'backward'"):
        Glomo({"forward": f}, {"forward": head}, {"forward": g_bw})
    with pytest.raises(ValueError, match="score their own graphs"):
        Glomo({"forward": f}, {"forward": head})
    with pytest.raises(ValueError, match="context_heads must cover"):
        Glomo({"forward": f}, {}, {"forward": g})
    with pytest.raises(ValueError, match="non-empty subset"):
        Glomo({"sideways": f}, {"sideways": head})
    with pytest.raises(TypeError, match="FeatureGraphEmitter always"):
        FeatureGraphEmitter(num_tokens=5, hidden_channels=8, heads=2, decouple=True)


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("include_self", [False, True])
def test_sequence_order_closed_forms_equal_the_generic_rule(direction, include_self):
    """SequenceOrder's closed forms against UnitOrder's generic counting from
    allowed() alone (what a 2-D order inherits)."""

    class Generic(UnitOrder):
        def allowed(self, target, source):
            return SequenceOrder(direction, include_self).allowed(target, source)

        def distance(self, target, source):
            return (target - source).abs()

    fast, slow = SequenceOrder(direction, include_self), Generic(direction, include_self)
    ptr = torch.tensor([0, 1, 4, 9, 9, 11])  # with a length-1 and an empty sequence
    lengths = ptr[1:] - ptr[:-1]
    for a, b in zip(fast.pairs(ptr), slow.pairs(ptr)):
        assert torch.equal(a, b)
    torch.testing.assert_close(fast.num_pairs(lengths), slow.num_pairs(lengths))
    pos, length = torch.tensor([0, 0, 1, 2, 4]), torch.tensor([1, 3, 3, 3, 5])
    assert torch.equal(fast.num_sources(pos, length), slow.num_sources(pos, length))
    uniform = LatentGraphs.uniform(ptr, num_layers=1, num_heads=1, direction=direction,
                                   include_self=include_self)
    assert uniform.order == fast
    src, tgt = uniform.layer(0)[0]
    assert bool(fast.allowed(tgt - ptr[uniform.batch[tgt]], src - ptr[uniform.batch[src]]).all())
    with pytest.raises(ValueError, match="direction must be"):
        SequenceOrder("up")
