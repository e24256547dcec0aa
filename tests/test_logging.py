"""How the library reports (glomo_pyg.logs, docs/training.md "Logging"): log records of
``glomo_pyg.*`` loggers, silenced or routed through ``logging.getLogger("glomo_pyg")``,
Lightning's output included; printed lines where nothing is set up; the command's
lines unchanged."""
import logging
import sys

import pytest
import yaml
from pretrain_runs import pretrain_settings, write_corpus

from glomo_pyg.cli import main
from glomo_pyg.training import PretrainConfig, run_pretraining

LIGHTNING = ("lightning.pytorch", "lightning.fabric")
# what a run says, in order (glomo pretrain's lines)
RUN_LINES = ("corpus: ", "token shards: ", "trainer: ", "pretraining: ", "done: ")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("logging") / "corpus", documents=12)


def tiny(out, corpus, **train):
    # (a warm-up shorter than the run: no warning, which pytest would record anyway)
    return pretrain_settings(out, corpus, **dict(dict(max_steps=2, graph_warmup_steps=1,
                                                      checkpoint_every=2), **train))


@pytest.fixture
def package_logger():
    """The ``glomo_pyg`` logger, its level and handlers restored after the test."""
    logger = logging.getLogger("glomo_pyg")
    level, handlers = logger.level, list(logger.handlers)
    yield logger
    logger.setLevel(level)
    logger.handlers[:] = handlers


@pytest.fixture
def lightning_prints(monkeypatch):
    """Lightning's loggers as a plain script finds them: INFO, printed on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    for name in LIGHTNING:
        monkeypatch.setattr(logging.getLogger(name), "level", logging.INFO)
        monkeypatch.setattr(logging.getLogger(name), "handlers", [handler])
    return handler


def unchanged(logger):
    return logger.level == logging.NOTSET and logger.propagate and \
        [type(h) for h in logger.handlers] == [logging.NullHandler]


def test_the_package_logger_writes_nothing_by_itself():
    assert unchanged(logging.getLogger("glomo_pyg"))


def test_a_silenced_package_logger_silences_a_whole_run(tmp_path, corpus, capfd,
                                                         package_logger, lightning_prints):
    package_logger.setLevel(logging.ERROR)
    # a progress bar asked for, and Lightning's INFO lines printed: all follow glomo_pyg
    cfg = PretrainConfig.from_dict(tiny(tmp_path / "run", corpus, progress_bar=True))
    assert run_pretraining(cfg)["steps"] == 2
    assert capfd.readouterr() == ("", "")
    assert [logging.getLogger(n).level for n in LIGHTNING] == [logging.INFO] * 2  # restored


def test_at_info_the_run_says_its_lines_as_records_of_its_modules(tmp_path, corpus, caplog,
                                                                  capfd):
    caplog.set_level(logging.INFO, logger="glomo_pyg")
    summary = run_pretraining(PretrainConfig.from_dict(tiny(tmp_path / "run", corpus)))
    records = [r for r in caplog.records if r.name.startswith("glomo_pyg")]
    assert [r.getMessage().split(":")[0] + ": " for r in records] == list(RUN_LINES)
    assert {r.name for r in records} == {"glomo_pyg.training.pretrain.corpus",
                                         "glomo_pyg.training.pretrain.run"}
    assert all(r.levelno == logging.INFO for r in records)
    done = records[-1]
    assert done.getMessage().startswith(f"done: {summary['steps']} steps in ")
    # the record names the library's function, not the rank-zero wrapper
    assert (done.funcName, done.module) == ("_save_result", "run")
    assert capfd.readouterr().out == ""  # (logging is set up: pytest's handlers)


def test_where_nothing_is_set_up_a_run_prints_its_lines(tmp_path, corpus, capfd, monkeypatch,
                                                        package_logger):
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # a plain script or notebook
    run_pretraining(PretrainConfig.from_dict(tiny(tmp_path / "run", corpus)))
    out, err = capfd.readouterr()
    assert [line.split(":")[0] + ": " for line in out.splitlines()] == list(RUN_LINES)
    assert err == ""
    assert unchanged(package_logger)  # for the call only


def test_the_deprecated_log_argument_still_receives_the_lines(tmp_path, corpus, capfd,
                                                              package_logger):
    lines = []
    with pytest.warns(DeprecationWarning, match=r"run_pretraining\(log=...\) is deprecated"):
        run_pretraining(PretrainConfig.from_dict(tiny(tmp_path / "run", corpus)),
                        log=lines.append)
    assert [line.split(":")[0] + ": " for line in lines] == list(RUN_LINES)
    assert capfd.readouterr() == ("", "") and unchanged(package_logger)


def test_only_rank_zero_reports(tmp_path, corpus, caplog, monkeypatch):
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    from glomo_pyg.training.pretrain.config import CorpusConfig
    from glomo_pyg.training.pretrain.corpus import prepare_corpus

    caplog.set_level(logging.INFO, logger="glomo_pyg")
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    prepare_corpus(CorpusConfig(path=str(corpus), min_count=1), str(tmp_path / "one"))
    assert not caplog.records
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    prepare_corpus(CorpusConfig(path=str(corpus), min_count=1), str(tmp_path / "zero"))
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["corpus", "token shards"]


def test_the_command_prints_its_usual_lines_and_leaves_logging_as_it_was(tmp_path, corpus,
                                                                        capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(tiny(tmp_path / "run", corpus)))
    assert main(["pretrain", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] + ": " for line in out] == list(RUN_LINES)
    assert out[-1].startswith("done: 2 steps in ") and \
        out[-1].endswith(f"; predictor saved to {tmp_path / 'run' / 'predictor'}")
    assert unchanged(logging.getLogger("glomo_pyg"))


def test_a_disk_dataset_logs_one_record_per_chunk(tmp_path, caplog):
    import torch
    from torch_geometric.data import Data

    from glomo_pyg.transforms import GraphsOnDiskDataset, UniformGraphs

    caplog.set_level(logging.INFO, logger="glomo_pyg")
    samples = [Data(x=torch.arange(k + 2)) for k in range(3)]
    GraphsOnDiskDataset(str(tmp_path), samples, UniformGraphs(), chunk_size=2, log=True)
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("glomo_pyg.transforms.disk_dataset", "chunk 0: 2 of 2 samples kept, made"),
        ("glomo_pyg.transforms.disk_dataset", "chunk 1: 1 of 1 samples kept, made")]


def test_glomo_export_verbose_adds_a_line_per_sample(tmp_path, capsys):
    from glomo_pyg import Glomo

    vocab = ["<pad>", "<unk>", "<bos>", "<eos>", "the", "cat", "sat"]
    model = Glomo.text(len(vocab), hidden_channels=8, num_layers=1, heads=2, cnn_layers=1)
    model.to_pretrained(vocab).eval().save_pretrained(str(tmp_path / "pred"))
    (tmp_path / "t.txt").write_text("the cat sat\ncat sat\n", encoding="utf-8")
    command = ["export", "--predictor", str(tmp_path / "pred"), "--text", str(tmp_path / "t.txt")]
    assert main([*command, "--output", str(tmp_path / "quiet")]) == 0
    quiet = capsys.readouterr().out.splitlines()
    assert main([*command, "--output", str(tmp_path / "loud"), "--verbose"]) == 0
    loud = capsys.readouterr().out.splitlines()
    assert len(quiet) == 2 and len(loud) == 4  # (between the two lines: one per sample)
    assert loud[1].startswith(f"{tmp_path / 't.txt'}:1: 3 units, ") and " edges -> " in loud[1]
    assert unchanged(logging.getLogger("glomo_pyg"))
