"""The shipped pretraining configurations and the corpus document spread."""
import os

import pytest
import yaml

from glomo_pyg.training import GlomoPretraining
from glomo_pyg.training.text_pretraining import CorpusConfig, PretrainConfig, iter_documents

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name", ["imdb-cpu.yaml", "imdb-gpu.yaml"])
def test_shipped_configs_validate_and_build_the_model(name):
    with open(os.path.join(ROOT, "configs", name)) as fh:
        data = yaml.safe_load(fh)
    data["corpus"]["path"] = "DATA/aclImdb"
    config = PretrainConfig.from_dict(data)
    assert config.corpus.format == "aclimdb"
    module = GlomoPretraining(dict(num_tokens=50, padding_idx=0, **config.model))
    model = module.model  # the layout of the GPU config is a run-time setting
    assert model.emitter("forward").layout == config.model.get("layout", "sparse")
    assert model.keep_alive > 0
    assert model.graph_predictors["fw"].scorer.position == "relative"
    # relative position terms repeat with the longest period: at least twice the length
    period = config.model.get("position_period", 512.0)
    assert period >= 2 * config.corpus.max_length


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
