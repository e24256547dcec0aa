"""The shipped pretraining configurations and the corpus document spread."""
import os

import pytest
import yaml

from glomo_pyg.training import GlomoPretraining
from glomo_pyg.training.pretrain.config import CorpusConfig, PretrainConfig
from glomo_pyg.training.pretrain.corpus import iter_documents

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name", ["imdb-cpu.yaml", "imdb-gpu.yaml", "imdb-gpu-release.yaml"])
def test_shipped_configs_validate_and_build_the_model(name):
    with open(os.path.join(ROOT, "configs", name)) as fh:
        data = yaml.safe_load(fh)
    data["corpus"]["path"] = "DATA/aclImdb"
    config = PretrainConfig.from_dict(data)
    assert config.corpus.format == "aclimdb"
    module = GlomoPretraining(num_tokens=50, padding_idx=0, **config.model)
    model = module.model  # the layout of the GPU config is a run-time setting
    assert model.emitter("forward").layout == config.model.get("layout", "sparse")
    assert model.keep_alive > 0
    assert model.graph_predictors["fw"].scorer.position == "relative"
    assert config.train.init_vectors == "word2vec"  # trained on the corpus, one command
    # relative position terms repeat with the longest period: at least twice the length
    period = config.model.get("position_period", 512.0)
    assert period >= 2 * config.corpus.max_length


@pytest.mark.parametrize("name", ["imdb-cpu.yaml", "imdb-gpu-release.yaml"])
def test_release_recipes_make_a_predictor_a_release_can_hold(name):
    """The text recipes whose predictors are released: both directions' graph predictors
    over the whole vocabulary fit a release's weights in float16."""
    from glomo_pyg import Glomo
    from glomo_pyg.io.releases import MAX_WEIGHTS_BYTES

    with open(os.path.join(ROOT, "configs", name)) as fh:
        data = yaml.safe_load(fh)
    words = data["corpus"]["max_size"]
    model = {k: v for k, v in data["model"].items() if k != "layout"}
    predictor = Glomo.text(num_tokens=words, **model).to_pretrained(
        [f"w{i}" for i in range(words)])
    values = sum(t.numel() for t in predictor.state_dict().values())
    assert 2 * values <= MAX_WEIGHTS_BYTES - 64 * 1024  # (room for the header)


def test_max_documents_spreads_evenly_over_the_corpus(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("".join(f"doc{k}\n" for k in range(10)))
    corpus = CorpusConfig(path=str(path), one_per_line=True, max_documents=3)
    assert [d.strip() for d in iter_documents(corpus)] == ["doc0", "doc3", "doc6"]
    corpus.max_documents = 50  # more than there are: all of them
    assert len(list(iter_documents(corpus))) == 10
    corpus.max_documents = 0
    with pytest.raises(ValueError, match="max_documents"):
        list(iter_documents(corpus))


def test_threads_setting_is_checked():
    with pytest.raises(ValueError, match="threads"):
        PretrainConfig.from_dict(dict(corpus=dict(path="x"), train=dict(threads=-1)))


@pytest.mark.parametrize("data, message", [
    (dict(train=dict(max_steps="abc")), "train.max_steps must be a positive integer, got 'abc'"),
    (dict(train=dict(max_steps=0)), "train.max_steps must be a positive integer, got 0"),
    (dict(train=dict(max_steps=2.5)), "train.max_steps must be a positive integer, got 2.5"),
    (dict(train=dict(batch_size=True)), "train.batch_size must be an integer in [1, 16777216]"),
    (dict(train=5), "train must be a mapping of train settings (e.g. train.max_steps), got 5"),
    (dict(model=5), "model must be a mapping of model settings"),
    (dict(corpus=[1]), "corpus must be a mapping of corpus settings"),
    (dict(train=dict(lr=0)), "train.lr must be a positive number, got 0"),
    (dict(train=dict(lr="fast")), "train.lr must be a positive number"),
    (dict(train=dict(momentum=1.0)), "train.momentum must be a number in [0, 1), got 1.0"),
    (dict(corpus=dict(validation_fraction=-0.1)), "corpus.validation_fraction must be a number "
                                                  "in [0, 1)"),
    (dict(train=dict(optimizer="adamw")), "train.optimizer must be one of 'adam', 'sgd'"),
    (dict(train=dict(logger="wandb")), "train.logger must be one of 'csv', 'tensorboard'"),
    (dict(train=dict(accelerator="abacus")), "train.accelerator must be one of 'auto'"),
    (dict(train=dict(precision="bf17")), "train.precision must be one of"),
    (dict(train=dict(devices=0)), "train.devices must be 'auto', a positive integer"),
    (dict(train=dict(seed=-1)), "train.seed must be an integer in [0, 4294967295]"),
    (dict(train=dict(progress_bar="yes please")), "train.progress_bar must be true or false"),
    (dict(corpus=dict(format="pdf")), "corpus.format must be one of 'text', 'aclimdb'"),
    (dict(corpus=dict(min_count=0)), "corpus.min_count must be a positive integer"),
    (dict(corpus=dict(max_size=3)), "corpus.max_size must be an integer in [5, 16777216]"),
    (dict(corpus=dict(min_length=20, max_length=10)), "corpus.min_length (20) must not exceed"),
    (dict(corpus=dict(path=5)), "corpus.path must be a string or null, got 5"),
    (dict(output_dir=None), "output_dir must be a folder path"),
    (dict(model=dict(hidden_channels="abc")), "model.hidden_channels must be an integer in "
                                              "[1, 65536], got 'abc'"),
    # the range a saved predictor is loaded with: a run cannot end in an unloadable file
    (dict(model=dict(heads=2000)), "model.heads must be an integer in [1, 1024], got 2000"),
    (dict(model=dict(position_period=1)), "model.position_period must be a number >= 2"),
    (dict(model=dict(dropout=1.5)), "model.dropout must be a number in [0, 1)"),
    (dict(model=dict(layout="diagonal")), "model.layout must be one of"),
    (dict(model=dict(entropy_penalty=-0.5)), "model.entropy_penalty must be a non-negative number"),
    (dict(model=dict(hiden_channels=8)), "unknown model settings ['hiden_channels']"),
    (dict(train=dict(learning_rate=1)), "unknown train settings ['learning_rate']"),
    (dict(trainer={}), "unknown configuration keys ['trainer']"),
    ([1, 2], "the configuration must be a mapping"),
])
def test_bad_settings_are_named_with_their_key(data, message):
    with pytest.raises(ValueError) as info:
        PretrainConfig.from_dict(data)
    assert message in str(info.value)


def test_every_setting_has_a_rule_and_defaults_pass():
    import dataclasses

    from glomo_pyg.settings import rules
    from glomo_pyg.training.pretrain.config import TrainConfig

    for _name, kind in (("corpus", CorpusConfig), ("train", TrainConfig)):
        assert {f.name for f in dataclasses.fields(kind)} == set(rules(kind))
        assert all(f.metadata.get("rule") or f.metadata.get("rule_args") is not None
                   for f in dataclasses.fields(kind))  # declared with setting()
    config = PretrainConfig.from_dict(dict(train=dict(lr=1, devices=[0, 1], precision="16"),
                                           corpus=dict(format="cifar10", crop=24)))
    assert config.train.lr == 1.0 and isinstance(config.train.lr, float)
    PretrainConfig.from_dict(dict(train=None, model=None, corpus=None))  # empty YAML sections


def test_command_line_overrides_are_checked(capsys):
    from glomo_pyg.cli import main

    for override, message in (("train.max_steps=abc", "train.max_steps must be a positive "
                                                       "integer, got 'abc'"),
                              ("train=5", "train must be a mapping"),
                              ("model=5", "model must be a mapping"),
                              ("train.lr=[1", "--set train.lr=[1")):
        with pytest.raises(SystemExit) as info:
            main(["pretrain", "--set", override, "--print-config"])
        assert str(info.value).startswith("glomo pretrain: ") and message in str(info.value)


def test_every_supported_precision_is_one_lightning_accepts():
    # the library keeps its own list (Lightning's is private); this test reads Lightning's
    # to catch a release that drops one of them
    from typing import get_args

    from lightning.fabric.connector import _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS

    from glomo_pyg.training.pretrain.config import PRECISIONS

    accepted = {*get_args(_PRECISION_INPUT_STR), *get_args(_PRECISION_INPUT_STR_ALIAS)}
    assert set(PRECISIONS) <= accepted
