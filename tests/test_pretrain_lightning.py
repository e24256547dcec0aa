"""Lightning's contracts of the pretraining module and data modules: the data is opened
in ``setup``, not in the constructor, and ``LightningCLI`` (jsonargparse) builds and
trains ``GlomoPretraining`` with ``TextPretrainingData`` from typed arguments
(docs/training.md, "LightningCLI")."""
import os
import warnings

import pytest
import torch
from pretrain_runs import write_corpus

from glomo_pyg.data import read_shard_index
from glomo_pyg.training import GlomoPretraining
from glomo_pyg.training.pretrain import (
    CorpusConfig,
    ImagePretrainingData,
    TextPretrainingData,
    prepare_corpus,
)

MODEL = ["--model.hidden_channels=16", "--model.num_layers=1", "--model.heads=2",
         "--model.cnn_layers=1", "--model.num_positions=8", "--model.lr=0.01",
         "--model.graph_warmup_steps=1"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    base = tmp_path_factory.mktemp("lightning")
    _, path = prepare_corpus(CorpusConfig(path=str(write_corpus(base / "corpus")), min_count=1),
                             str(base / "prepared"))
    return path


def test_the_data_module_reads_its_shards_in_setup_not_in_the_constructor(tmp_path, shards):
    later = str(tmp_path / "tokens")  # not made yet
    data = TextPretrainingData(later, 16, 4, batch_size=4, validation_fraction=0.1, seed=0)
    assert not os.path.lexists(later)
    with pytest.raises(RuntimeError, match=r"setup\(\) has not run yet"):
        len(data.train_ids)  # (no empty split that a caller would not notice)
    os.symlink(shards, later)  # the corpus prepared after the module was made
    data.setup("fit")
    assert len(data.train_ids) + len(data.val_ids) == len(data.windows) > 2
    split = (list(data.val_ids), list(data.train_ids))
    data.setup("validate")  # (once: Lightning calls it again, and the run before training)
    assert (data.val_ids, data.train_ids) == split
    batch = next(iter(data.train_dataloader()))
    assert batch.num_graphs == 4
    # the same seeded split as a module set up at once
    other = TextPretrainingData(shards, 16, 4, batch_size=4, validation_fraction=0.1, seed=0)
    other.setup()
    assert (other.val_ids, other.train_ids) == split


def test_the_image_data_module_draws_its_split_in_setup():
    images = torch.randint(0, 256, (10, 3, 4, 4), dtype=torch.uint8)
    data = ImagePretrainingData(images, batch_size=2, validation_fraction=0.2, seed=0)
    with pytest.raises(RuntimeError, match="setup"):
        len(data.val_ids)
    data.setup("fit")
    assert len(data.val_ids) == 2 and sorted(data.val_ids + data.train_ids) == list(range(10))


def test_lightning_cli_builds_and_trains_the_module_and_data_module(tmp_path, shards, capsys,
                                                                    monkeypatch):
    pytest.importorskip("jsonargparse")  # (LightningCLI's parser: lightning[pytorch-extra])
    from lightning.pytorch.cli import LightningCLI

    class PretrainingCLI(LightningCLI):
        def add_arguments_to_parser(self, parser):
            # the vocabulary's size, read from the shards' index (not their tokens)
            parser.link_arguments("data.shards", "model.num_tokens",
                                  compute_fn=lambda path: read_shard_index(path)["vocab_size"])

    data = [f"--data.shards={shards}", "--data.max_length=16", "--data.min_length=4",
            "--data.batch_size=4", "--data.validation_fraction=0.1", "--data.seed=0"]
    trainer = ["--trainer.max_steps=2", "--trainer.accelerator=cpu", "--trainer.logger=false",
               "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
               "--trainer.enable_model_summary=false",
               f"--trainer.default_root_dir={tmp_path}"]
    monkeypatch.setattr("sys.argv", ["glomo-lightning-cli"])  # (args= is the command line)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (Lightning's advice on workers and logging)
        cli = PretrainingCLI(GlomoPretraining, TextPretrainingData, args=[
            "fit", *MODEL, "--model.padding_idx=0", *data, *trainer])
    model = cli.model
    assert isinstance(model, GlomoPretraining) and cli.trainer.global_step == 2
    assert model.hparams["lr"] == 0.01 and model.hparams["graph_warmup_steps"] == 1
    assert model.model_settings["hidden_channels"] == 16
    assert model.model_settings["num_tokens"] == read_shard_index(shards)["vocab_size"]
    assert model.model_settings["context_length"] == 3  # (unset: the declared default)
    # the typed arguments are the command line's: a wrong type is refused by name
    capsys.readouterr()
    with pytest.raises(SystemExit):
        PretrainingCLI(GlomoPretraining, TextPretrainingData, run=False,
                       args=[*MODEL, "--model.heads=many", *data, *trainer])
    assert "heads" in capsys.readouterr().err
