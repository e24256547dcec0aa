"""A model setting is declared once, in a ModelSettings (sub)class: which settings a saved
config holds, which it may lack (added later) and the rule each value is held to on
loading all follow from that declaration, for the library's emitters and for a user's
subclass that adds a setting."""
import dataclasses

import pytest
import torch
from bundles import edit_config

from glomo_pyg import PretrainedFormatError, PretrainedGraphPredictor, load_pretrained
from glomo_pyg.nn import GraphPredictor
from glomo_pyg.nn.emitter import EMITTERS
from glomo_pyg.nn.settings import (
    SAVED_SETTINGS,
    ModelSettings,
    check_model_setting,
    saved_settings,
)
from glomo_pyg.settings import setting

TOKENS = 20


@dataclasses.dataclass
class GainSettings(ModelSettings):
    """The library's settings and one more."""

    gain: float = setting(1.0, low=0, low_open=True, doc="a scale the emitter records")


@pytest.fixture
def gain_emitter():
    """A user's emitter with one setting of its own (registered for the test only)."""

    class GainGraphPredictor(GraphPredictor):
        settings = GainSettings

        def __init__(self, gain: float = 1.0, **kwargs):
            super().__init__(**kwargs)
            self.gain = check_model_setting("gain", gain, settings=GainSettings)

    yield GainGraphPredictor
    EMITTERS.pop("GainGraphPredictor")


def predictor_of(cls, **settings):
    parts = {d: cls(num_tokens=TOKENS, hidden_channels=16, num_layers=2, heads=2, direction=d,
                    cnn_layers=1, **settings) for d in ("forward", "backward")}
    torch.manual_seed(0)
    return PretrainedGraphPredictor(parts["forward"], parts["backward"],
                                    [f"t{i}" for i in range(TOKENS)])


def test_saved_settings_follow_from_the_declarations():
    never = {f.name for f in dataclasses.fields(ModelSettings) if f.metadata["saved"] is False}
    assert set(SAVED_SETTINGS) == {f.name for f in dataclasses.fields(ModelSettings)} - never
    assert {"decouple", "layout", "context_length"} <= never
    assert saved_settings(ModelSettings, which=("optional",)) == ("pooled_context",
                                                                  "local_context")
    assert "gain" in saved_settings(GainSettings) and "gain" not in SAVED_SETTINGS


def test_a_subclass_setting_round_trips_with_nothing_else_declared(tmp_path, gain_emitter):
    predictor = predictor_of(gain_emitter, gain=2.5)
    predictor.save_pretrained(tmp_path)
    loaded = load_pretrained(tmp_path)
    emitter = loaded.predictor("forward")
    assert type(emitter) is gain_emitter and emitter.gain == 2.5
    assert emitter.config()["gain"] == 2.5
    x = torch.randint(0, TOKENS, (7,))
    want, got = predictor.eval()(x).forward, loaded(x).forward
    assert torch.equal(want.to_dense(), got.to_dense())


def test_a_subclass_setting_is_held_to_its_rule_when_loaded(tmp_path, gain_emitter):
    predictor_of(gain_emitter, gain=2.5).save_pretrained(tmp_path)
    edit_config(tmp_path, lambda c: c["directions"]["forward"]["config"].update(gain=-1.0))
    with pytest.raises(PretrainedFormatError, match=r"forward GainGraphPredictor config: gain"):
        load_pretrained(tmp_path)


def test_a_subclass_setting_missing_from_its_file_is_refused(tmp_path, gain_emitter):
    predictor_of(gain_emitter, gain=2.5).save_pretrained(tmp_path)
    edit_config(tmp_path, lambda c: c["directions"]["backward"]["config"].pop("gain"))
    with pytest.raises(PretrainedFormatError, match=r"it lacks arguments \['gain'\]"):
        load_pretrained(tmp_path)


def test_a_setting_of_another_class_is_unknown_to_the_library_emitter(tmp_path):
    predictor_of(GraphPredictor).save_pretrained(tmp_path)
    edit_config(tmp_path, lambda c: c["directions"]["forward"]["config"].update(gain=2.0))
    with pytest.raises(PretrainedFormatError, match=r"unknown arguments \['gain'\]"):
        load_pretrained(tmp_path)
