"""Settings declared once (glomo_pyg.settings, glomo_pyg.nn.settings): the rules, the
dataclasses built from them, and that every reader of a setting (YAML, --set, saved
predictors, constructors) refuses a value with the same words."""
import dataclasses
import os
from dataclasses import dataclass
from typing import Optional, Sequence

import pytest
from bundles import edit_config

from glomo_pyg import (
    Glomo,
    GraphPredictor,
    PretrainedFormatError,
    PretrainedGraphPredictor,
    load_pretrained,
    save_pretrained,
)
from glomo_pyg.nn.settings import MODEL_RULES, ModelSettings, check_model_setting
from glomo_pyg.settings import (
    DevicesRule,
    Rule,
    check_settings,
    documentation,
    from_mapping,
    rules,
    set_by_path,
    setting,
)


def refuses(rule, value, message, **how):
    with pytest.raises(ValueError) as info:
        rule.check("key", value, **how)
    assert str(info.value) == f"key must be {message}", str(info.value)


def test_numbers_ranges_and_their_words():
    assert Rule(int, low=1).check("k", 3) == 3
    refuses(Rule(int, low=1), 0, "a positive integer, got 0")
    refuses(Rule(int, low=1), True, "a positive integer, got True")  # a bool is no integer
    refuses(Rule(int, low=1), 2.0, "a positive integer, got 2.0")
    refuses(Rule(int, low=0, high=4), 5, "an integer in [0, 4], got 5")
    with pytest.raises(ValueError, match=r"an integer >= 2, got 1000.*\.\.\."):
        Rule(int, low=2).check("key", 10 ** 400)  # beyond the float range, and shown short
    assert Rule(float, low=0).check("k", 1) == 1.0 and isinstance(Rule(float).check("k", 1), float)
    assert Rule(float, low=0, low_open=True).check("k", "1e-3") == 1e-3  # YAML 1.1 text
    refuses(Rule(float, low=0, low_open=True), 0, "a positive number, got 0")
    refuses(Rule(float, low=0, high=1, high_open=True), 1, "a number in [0, 1), got 1")
    for bad in (float("nan"), float("inf"), "nan", "inf", "fast"):
        with pytest.raises(ValueError, match="key must be a finite number"):
            Rule(float).check("key", bad)


def test_typed_sources_never_read_text_as_numbers():
    """JSON values (saved predictors) have types: "0.5" is a string there, 32 no choice."""
    refuses(Rule(float), "0.5", "a finite number, got '0.5'", typed=True)
    assert Rule(str, choices=("32", "16")).check("k", 32) == "32"  # YAML: precision: 32
    refuses(Rule(str, choices=("32", "16")), 32, "one of '32', '16', got 32", typed=True)
    with pytest.raises(KeyError, match="shown"):
        Rule(int).check("key", "x", error=KeyError, show=lambda v: "shown")


def test_other_kinds():
    assert Rule(bool).check("k", False) is False
    refuses(Rule(bool), 0, "true or false, got 0")
    refuses(Rule(str, max_length=3), "abcd", "a string of at most 3 characters, got 'abcd'")
    assert Rule(str).check("k", __import__("pathlib").Path("a")) == "a"  # paths are strings
    assert Rule(list, max_length=2).check("k", (1, 2.5)) == [1, 2.5]
    refuses(Rule(list, max_length=2), [1, 2, 3], "a list of at most 2 finite numbers, got "
                                                  "[1, 2, 3]")
    refuses(Rule(list), [1, float("nan")], "a list of finite numbers, got [1, nan]")
    assert Rule(dict).check("k", {"a": 1}) == {"a": 1}
    refuses(Rule(dict), [1], "a mapping, got [1]")
    assert Rule(int, optional=True).check("k", None) is None
    refuses(Rule(int), None, "an integer, got None")
    refuses(Rule(str, choices=lambda: ("a", "b")), "c", "one of 'a', 'b', got 'c'")
    refuses(Rule(float, low=0, note="0: off"), -1, "a non-negative number (0: off), got -1")
    assert DevicesRule().check("k", [0, 1]) == [0, 1] and DevicesRule().check("k", -1) == -1
    with pytest.raises(ValueError, match="device count"):
        DevicesRule().check("k", 0)


@dataclass
class Example:
    count: int = setting(3, low=1, doc="how many")
    scale: Optional[float] = setting(None, low=0, low_open=True)
    name: str = setting("a", choices=("a", "b"))
    values: Sequence[float] = setting(factory=lambda: [1.0])
    plain: bool = True  # no metadata: the rule comes from the type alone


def test_settings_dataclasses_take_their_rules_from_the_fields():
    got = rules(Example)
    assert got["count"].describe() == "a positive integer"
    assert got["scale"].describe() == "a positive number or null"
    assert got["values"].kind is list and got["plain"].kind is bool
    example = from_mapping(Example, {"count": 2, "scale": 1}, "sec")
    assert example.count == 2 and example.scale == 1.0 and isinstance(example.scale, float)
    with pytest.raises(ValueError, match=r"unknown sec settings \['cuont'\]; allowed: "
                                         r"\['count', 'name', 'plain', 'scale', 'values'\]"):
        from_mapping(Example, {"cuont": 2}, "sec")
    with pytest.raises(ValueError, match="sec.name must be one of 'a', 'b', got 'c'"):
        from_mapping(Example, {"name": "c"}, "sec")
    with pytest.raises(ValueError, match="sec must be a mapping"):
        from_mapping(Example, [1], "sec")
    bad = Example(count=0)
    with pytest.raises(ValueError, match="^count must be a positive integer, got 0$"):
        check_settings(bad)
    assert documentation(Example)["count"] == (3, "a positive integer", "how many")

    @dataclass
    class Untyped:
        anything: object = None

    with pytest.raises(TypeError, match="no rule for a setting of type"):
        rules(Untyped)


def test_set_by_path():
    data = {"train": None}
    set_by_path(data, "train.lr", 0.1)
    assert data == {"train": {"lr": 0.1}}
    for bad in ("", "train..lr", ".lr"):
        with pytest.raises(ValueError, match="is not a setting name"):
            set_by_path(data, bad, 1)
    with pytest.raises(ValueError, match="train.lr is not a section"):
        set_by_path(data, "train.lr.x", 1)


def test_one_rule_per_model_setting_wherever_the_value_comes_from(tmp_path):
    """The same bad value in a pretraining config, a saved predictor and a constructor is
    refused with the same words (the rule is declared once, in ModelSettings)."""
    from glomo_pyg.training.pretrain.config import PretrainConfig

    words = "heads must be an integer in [1, 1024], got 2000"
    with pytest.raises(ValueError, match=r"^model\." + words.replace("[", r"\[")
                       .replace("]", r"\]") + "$"):
        PretrainConfig.from_dict(dict(model=dict(heads=2000)))
    save_pretrained(PretrainedGraphPredictor(GraphPredictor(
        num_tokens=10, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1)), tmp_path)
    edit_config(tmp_path, lambda c: c["directions"]["forward"]["config"].update(heads=2000))
    with pytest.raises(PretrainedFormatError) as info:
        load_pretrained(tmp_path)
    assert str(info.value).endswith("forward GraphPredictor config: " + words + " (an integer)")
    # constructors check the settings they declare a range for with the same rule
    for kwargs, name in ((dict(keep_alive=-1.0), "keep_alive"),
                         (dict(entropy_penalty=float("inf")), "entropy_penalty"),
                         (dict(decoder_layers=0), "decoder_layers"),
                         (dict(local_context=65), "local_context"),
                         (dict(position_frequencies=0), "position_frequencies")):
        with pytest.raises(ValueError) as info:
            Glomo.text(10, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1, **kwargs)
        with pytest.raises(ValueError) as want:
            check_model_setting(name, kwargs[name])
        assert str(info.value) == str(want.value)


def test_every_configuration_field_is_a_declared_setting():
    from glomo_pyg.training.reference import _sections

    for _, cls, _ in _sections():
        for f in dataclasses.fields(cls):
            assert "rule" in f.metadata, f"{cls.__name__}.{f.name} is not declared with setting()"
    assert set(MODEL_RULES) == {f.name for f in dataclasses.fields(ModelSettings)}
    defaults = ModelSettings()
    check_settings(defaults)  # the declared defaults obey their own rules


def test_the_settings_reference_is_current():
    from glomo_pyg.training.reference import REFERENCE_COMMAND, reference

    path = os.path.join(os.path.dirname(__file__), "..", "docs", "settings.md")
    with open(path, encoding="utf-8") as fh:
        assert fh.read() == reference(), f"docs/settings.md is stale: run {REFERENCE_COMMAND}"
