"""glomo pretrain reliability: damaged, unsafe and foreign checkpoints, damaged run files,
corpus changes under a resumed run, kills between checkpoint writes, SIGTERM/SIGINT."""
import logging
import os
import shutil
import signal
import subprocess
import sys
import time

import lightning.pytorch as pl
import pytest
import torch
import yaml
from pretrain_runs import WORDS, without_recorded_settings, write_corpus
from pretrain_runs import pretrain_settings as settings

from glomo_pyg.cli import main
from glomo_pyg.training import PretrainConfig, run_pretraining
from glomo_pyg.training.checkpoints import (
    CheckpointMismatchError,
    CorruptCheckpointError,
    UnsafeCheckpointError,
    atomic_save,
    find_resume_checkpoint,
)
from glomo_pyg.training.interrupts import TrainingInterrupted

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def config(out, corpus, **train):
    return PretrainConfig.from_dict(settings(out, corpus, **train))


def ckpt(run, name="last.ckpt"):
    return os.path.join(run, "checkpoints", name)


def weights(path):
    data = torch.load(path, weights_only=True)
    return data["state_dict"], data["global_step"]


def assert_same_weights(a, b):
    (sa, step_a), (sb, step_b) = weights(a), weights(b)
    assert step_a == step_b
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """A finished 6-step run (checkpoints at steps 2, 4, 6 and last.ckpt) and its corpus."""
    base = tmp_path_factory.mktemp("straight")
    write_corpus(base / "corpus")
    run_pretraining(config(base / "run", base / "corpus"))
    return base


def copy_run(straight, tmp_path, keep=("step2.ckpt", "step4.ckpt", "step6.ckpt", "last.ckpt")):
    run = tmp_path / "run"
    shutil.copytree(straight / "run", run)
    for name in os.listdir(run / "checkpoints"):
        if name not in keep:
            os.remove(run / "checkpoints" / name)
    return run


def resume(straight, run, **train):
    return run_pretraining(config(run, straight / "corpus", **train), resume=True)


def messages(caplog, level=logging.INFO):
    """The lines of the records of ``level`` the ``glomo_pyg`` loggers gave so far."""
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("glomo_pyg.") and r.levelno == level]


def write_yaml(path, data):
    path.write_text(yaml.safe_dump(data))
    return str(path)


# --- checkpoints chosen on resume ---------------------------------------------------------
def test_kill_between_periodic_and_last_checkpoint_resumes_from_the_newest(straight, tmp_path,
                                                                          caplog):
    """A kill after step4.ckpt was written but before last.ckpt (here: none at all): the
    newest periodic checkpoint is taken, and the run ends where the straight run did."""
    run = copy_run(straight, tmp_path, keep=("step2.ckpt", "step4.ckpt"))
    with pytest.raises(FileExistsError, match="step4.ckpt.*--resume"):
        run_pretraining(config(run, straight / "corpus"))  # no silent restart
    caplog.set_level(logging.INFO, logger="glomo_pyg")
    assert resume(straight, run)["steps"] == 6
    assert any("step4.ckpt (step 4)" in m and "no last.ckpt" in m for m in messages(caplog))
    assert_same_weights(ckpt(run), ckpt(straight / "run"))


def test_a_kill_while_last_ckpt_is_rewritten_at_the_end_is_repaired_on_resume(straight,
                                                                              tmp_path, caplog):
    """The kill left last.ckpt at the previous checkpoint (step 4) beside the final
    step6.ckpt: resume finds nothing to train, and still makes last.ckpt the newest."""
    run = copy_run(straight, tmp_path)
    shutil.copyfile(ckpt(run, "step4.ckpt"), ckpt(run))
    caplog.set_level(logging.INFO, logger="glomo_pyg")
    assert resume(straight, run)["steps"] == 6
    assert_same_weights(ckpt(run), ckpt(run, "step6.ckpt"))
    assert any("last.ckpt is now a copy of" in m and "step6.ckpt" in m
               for m in messages(caplog)), messages(caplog)


def snapshot(folder):
    """Every file's bytes (and every folder) under ``folder``, by relative path."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            out[os.path.relpath(os.path.join(root, name), folder)] = "dir"
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                out[os.path.relpath(os.path.join(root, name), folder)] = fh.read()
    return out


def test_a_refused_resume_leaves_the_run_folder_as_it_found_it(straight, tmp_path):
    """tokens/ deleted and the corpus edited: the resume is refused, and the refused attempt
    rebuilds nothing in the run folder, so restoring the corpus makes resume work."""
    run = copy_run(straight, tmp_path)
    corpus = tmp_path / "corpus"
    shutil.copytree(straight / "corpus", corpus)
    shutil.rmtree(run / "tokens")
    before = snapshot(run)
    with open(corpus / "doc000.txt", "a") as fh:
        fh.write(" " + " ".join(WORDS[:5]))
    with pytest.raises(CheckpointMismatchError, match="the corpus changed"):
        run_pretraining(config(run, corpus), resume=True)
    assert snapshot(run) == before
    shutil.rmtree(corpus)
    shutil.copytree(straight / "corpus", corpus)  # the corpus restored
    assert run_pretraining(config(run, corpus), resume=True)["steps"] == 6
    assert sorted(os.listdir(run / "tokens")) == sorted(os.listdir(straight / "run" / "tokens"))
    assert not [n for n in os.listdir(run) if n.startswith(".corpus-")]  # no staging left


@pytest.mark.parametrize("damage", ["empty", "random", "truncated"])
def test_damaged_last_checkpoint_is_named(straight, tmp_path, damage):
    run = copy_run(straight, tmp_path, keep=("last.ckpt",))
    path = ckpt(run)
    data = open(path, "rb").read()
    with open(path, "wb") as fh:
        fh.write({"empty": b"", "random": os.urandom(4096),
                  "truncated": data[:len(data) // 2]}[damage])
    with pytest.raises(CorruptCheckpointError) as info:
        resume(straight, run)
    text = str(info.value)
    assert path in text and ("truncated" in text or "corrupt" in text)
    assert "no usable checkpoint" in text
    # the command line says it in one line
    cfg = write_yaml(tmp_path / "cfg.yaml", settings(run, straight / "corpus"))
    with pytest.raises(SystemExit) as info:
        main(["pretrain", "--config", cfg, "--resume"])
    assert str(info.value).startswith("glomo pretrain: cannot resume: ") and path in str(info.value)


def test_damaged_last_checkpoint_falls_back_to_an_older_one(straight, tmp_path, caplog):
    run = copy_run(straight, tmp_path, keep=("step2.ckpt", "last.ckpt"))
    damaged = os.urandom(1000)
    with open(ckpt(run), "wb") as fh:
        fh.write(damaged)
    caplog.set_level(logging.INFO, logger="glomo_pyg")
    assert resume(straight, run)["steps"] == 6
    warning = messages(caplog, logging.WARNING)
    assert warning and ckpt(run) in warning[0] and "step2.ckpt (step 2)" in warning[0]
    assert_same_weights(ckpt(run), ckpt(straight / "run"))  # step2 -> 6 as in one go
    # one message for the decision, and it says what happened: the damaged last.ckpt is
    # kept (under another name) and replaced; nothing claims it was left untouched
    assert len(warning) == 1 and "left untouched" not in warning[0]
    assert f"kept under new names ({ckpt(run)} -> {ckpt(run)}.damaged)" in warning[0]
    assert f"{ckpt(run)} becomes a copy of {ckpt(run, 'step2.ckpt')}" in warning[0]
    assert not [m for m in messages(caplog) if "is now a copy of" in m], messages(caplog)
    with open(ckpt(run) + ".damaged", "rb") as fh:
        assert fh.read() == damaged


def test_damaged_step_checkpoints_are_kept_as_they_are(straight, tmp_path, caplog):
    run = copy_run(straight, tmp_path, keep=("step2.ckpt", "step4.ckpt", "step6.ckpt"))
    with open(ckpt(run, "step6.ckpt"), "wb") as fh:
        fh.write(b"damaged")
    caplog.set_level(logging.INFO, logger="glomo_pyg")
    assert resume(straight, run)["steps"] == 6
    warning = messages(caplog, logging.WARNING)
    step6 = ckpt(run, "step6.ckpt")
    assert len(warning) == 1 and f"({step6} -> {step6}.damaged)" in warning[0], warning
    assert not [m for m in messages(caplog) if "is now a copy of" in m], messages(caplog)
    assert open(step6 + ".damaged", "rb").read() == b"damaged"  # not overwritten by training


def test_unsafe_checkpoint_is_refused_without_unsafe_advice(straight, tmp_path):
    run = copy_run(straight, tmp_path, keep=("step2.ckpt",))
    marker = tmp_path / "pwned"
    # a pickle that would run a command when unpickled unsafely
    atomic_save(dict(state_dict={}, global_step=9, payload=Exploit(str(marker))), ckpt(run))
    with pytest.raises(UnsafeCheckpointError) as info:
        find_resume_checkpoint(str(run / "checkpoints"))
    text = str(info.value)
    assert text.startswith(f"refusing to load {ckpt(run)}: it contains objects other than "
                           "tensors and plain data")
    assert "weights_only" not in text and "False" not in text
    cfg = write_yaml(tmp_path / "cfg.yaml", settings(run, straight / "corpus"))
    with pytest.raises(SystemExit, match="refusing to load") as info:
        main(["pretrain", "--config", cfg, "--resume"])
    assert "weights_only" not in str(info.value)
    assert not marker.exists()


class Exploit:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_foreign_checkpoint_is_refused_with_the_differences(straight, tmp_path):
    run = copy_run(straight, tmp_path, keep=())
    data = torch.load(ckpt(straight / "run"), weights_only=True)
    data["hyper_parameters"]["hidden_channels"] = 32
    key = next(k for k, v in data["state_dict"].items() if v.dim() == 2)
    data["state_dict"][key] = torch.zeros(data["state_dict"][key].size(0) * 2, 3)
    atomic_save(data, ckpt(run))
    with pytest.raises(CheckpointMismatchError) as info:
        resume(straight, run)
    text = str(info.value)
    assert f"{ckpt(run)} does not match this run's configuration" in text
    assert "model.hidden_channels: checkpoint 32, this run 16" in text
    assert key in text and "weights of other shapes" in text


def test_a_checkpoint_of_0_7_recording_model_kwargs_still_resumes_and_loads(straight, tmp_path):
    """glomo_pyg 0.7 recorded the model settings as one mapping (``model_kwargs``, what its
    GlomoPretraining took): such a checkpoint is still checked against the run's settings,
    resumed from, and loaded by ``load_from_checkpoint``."""
    from glomo_pyg.training import GlomoPretraining
    from glomo_pyg.training.pretrain.module import MODEL_ARGUMENTS, model_settings

    run = copy_run(straight, tmp_path, keep=("step4.ckpt",))
    data = torch.load(ckpt(run, "step4.ckpt"), weights_only=True)
    flat = data["hyper_parameters"]
    model = {k: flat.pop(k) for k in list(flat) if k in MODEL_ARGUMENTS}
    old = dict(settings(run, straight / "corpus")["model"], num_tokens=model["num_tokens"],
               padding_idx=model["padding_idx"])  # (0.7: the config's model section, and these)
    atomic_save(dict(data, hyper_parameters=dict(flat, model_kwargs=dict(old, heads=4))),
                ckpt(run, "step4.ckpt"))
    with pytest.raises(CheckpointMismatchError, match="model.heads: checkpoint 4, this run 2"):
        resume(straight, run)
    atomic_save(dict(data, hyper_parameters=dict(flat, model_kwargs=old)), ckpt(run, "step4.ckpt"))
    with pytest.warns(DeprecationWarning, match="model_kwargs"):
        loaded = GlomoPretraining.load_from_checkpoint(ckpt(run, "step4.ckpt"), weights_only=True)
    assert loaded.hparams["heads"] == 2 and "model_kwargs" not in loaded.hparams
    assert loaded.model_settings == model_settings(dict(model, modality="text"))
    assert resume(straight, run)["steps"] == 6
    assert_same_weights(ckpt(run), ckpt(straight / "run"))


# --- run files and the corpus ---------------------------------------------------------------
def test_damaged_run_files_are_named(straight, tmp_path):
    run = copy_run(straight, tmp_path, keep=("last.ckpt",))
    without_recorded_settings(ckpt(run))  # config.json is read only for such checkpoints
    (run / "config.json").write_text('{"model": {')
    with pytest.raises(ValueError, match=r"config\.json is damaged \(not valid JSON"):
        resume(straight, run)
    (run / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"config\.json is damaged \(its settings are not a "
                                         r"mapping\); delete it to skip this check"):
        resume(straight, run)
    os.remove(run / "config.json")  # as the message says: the check is skipped, rest holds
    (run / "corpus.json").write_text("\x00garbage")
    with pytest.raises(ValueError, match=r"corpus\.json is damaged") as info:
        resume(straight, run)
    assert str(run / "corpus.json") in str(info.value)


def test_resume_is_checked_against_the_checkpoints_own_settings(straight, tmp_path):
    """Each checkpoint records the run's settings: with config.json damaged or deleted, a
    resume with other windows (corpus.max_length) or another split (train.seed) is still
    refused, and the same settings resume and rewrite config.json."""
    run = copy_run(straight, tmp_path, keep=("step4.ckpt",))
    recorded = torch.load(ckpt(run, "step4.ckpt"), weights_only=True)["glomo"]
    assert recorded["version"] == 2
    assert recorded["settings"] == config(straight / "run", straight / "corpus").to_dict()
    os.remove(run / "config.json")
    longer = settings(run, straight / "corpus")
    longer["corpus"]["max_length"] = 24
    with pytest.raises(ValueError, match=r"other corpus settings \(.*step4\.ckpt\)"):
        run_pretraining(PretrainConfig.from_dict(longer), resume=True)
    with pytest.raises(ValueError, match=r"changed train\.seed 1 -> 2"):
        resume(straight, run, seed=2)
    (run / "config.json").write_text('{"model": {')  # a copy only: not read, rewritten
    damaged = torch.load(ckpt(run, "step4.ckpt"), weights_only=True)
    for record in (dict(damaged["glomo"], settings=[1]), dict(damaged["glomo"], corpus="x"),
                   "corrupt"):
        atomic_save(dict(damaged, glomo=record), ckpt(run, "step4.ckpt"))
        with pytest.raises(ValueError, match=r"step4\.ckpt: its 'glomo' record .* is damaged"):
            resume(straight, run)
    atomic_save(damaged, ckpt(run, "step4.ckpt"))
    assert resume(straight, run)["steps"] == 6
    assert_same_weights(ckpt(straight / "run"), ckpt(run))
    assert yaml.safe_load((run / "config.json").read_text())["corpus"]["max_length"] == 16


def test_resume_may_change_the_layout(straight, tmp_path):
    """The layout changes only the speed (the same graphs): a run started with the
    default sparse layout resumes with layout 'dense' and with 'auto'."""
    for layout in ("dense", "auto"):
        run = copy_run(straight, tmp_path / layout, keep=("step4.ckpt",))
        data = settings(run, straight / "corpus")
        assert "layout" not in data["model"]
        data["model"]["layout"] = layout
        assert run_pretraining(PretrainConfig.from_dict(data), resume=True)["steps"] == 6


def test_older_checkpoints_are_checked_against_config_json(straight, tmp_path):
    """A checkpoint written before checkpoints recorded settings falls back to the run's
    config.json: another train.seed is refused there too, naming config.json."""
    run = copy_run(straight, tmp_path, keep=("step4.ckpt",))
    without_recorded_settings(ckpt(run, "step4.ckpt"))
    with pytest.raises(ValueError, match=r"changed train\.seed 1 -> 2") as info:
        resume(straight, run, seed=2)
    assert str(run / "config.json") in str(info.value)
    assert resume(straight, run)["steps"] == 6  # the same seed resumes


def test_corpus_change_under_a_resumed_run_is_refused(tmp_path):
    write_corpus(tmp_path / "corpus", documents=20)
    run = tmp_path / "run"
    run_pretraining(config(run, tmp_path / "corpus", max_steps=2))
    recorded = torch.load(ckpt(run), weights_only=True)["glomo"]["corpus"]
    assert recorded["vocabulary"] == len(WORDS) + 5 and recorded["tokens"] > 0
    shutil.rmtree(run / "tokens")  # rebuilt from the same corpus: the same ids
    assert run_pretraining(config(run, tmp_path / "corpus", max_steps=3), resume=True)["steps"] == 3
    shutil.rmtree(run / "tokens")
    with open(tmp_path / "corpus" / "doc000.txt", "a") as fh:
        fh.write(" zebra zebra zebra giraffe giraffe giraffe")
    with pytest.raises(CheckpointMismatchError) as info:
        run_pretraining(config(run, tmp_path / "corpus", max_steps=4), resume=True)
    text = str(info.value)
    assert "the corpus changed since" in text and "vocabulary 22 -> 24" in text
    assert "tokens_sha256 changed" in text
    assert weights(ckpt(run))[1] == 3  # nothing trained on the changed corpus


# --- signals ------------------------------------------------------------------------------
class SendSignal(pl.Callback):
    """Sends ``signals`` to this process when the step after ``step`` starts."""

    def __init__(self, step, *signals):
        self.step, self.signals = step, signals

    def on_train_batch_start(self, trainer, *args):
        if trainer.global_step == self.step:
            for signum in self.signals:
                os.kill(os.getpid(), signum)


def test_sigint_writes_a_checkpoint_that_resumes_exactly(straight, tmp_path):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    run = tmp_path / "run"
    with pytest.raises(TrainingInterrupted) as info:
        run_pretraining(config(run, straight / "corpus"),
                        extra_callbacks=[SendSignal(2, signal.SIGINT)])
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    err = info.value
    assert err.exit_code == 130 and err.step == 3 and err.checkpoint == ckpt(run)
    assert "stopped by SIGINT after step 3" in str(err)
    assert weights(ckpt(run))[1] == 3  # between the periodic checkpoints of steps 2 and 4
    assert not os.path.exists(run / "predictor")
    assert not [n for n in os.listdir(run / "checkpoints") if n.endswith(".tmp")]
    assert resume(straight, run)["steps"] == 6
    assert_same_weights(ckpt(run), ckpt(straight / "run"))


def test_second_signal_stops_at_once(straight, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(TrainingInterrupted) as info:
        run_pretraining(config(run, straight / "corpus"),
                        extra_callbacks=[SendSignal(2, signal.SIGTERM, signal.SIGTERM)])
    assert info.value.exit_code == 143 and info.value.checkpoint is None
    assert "stopped by SIGTERM (sent twice: stop at once) before step 3 was done; no new " \
        "checkpoint" in str(info.value)
    assert weights(ckpt(run))[1] == 2  # the last periodic checkpoint, untouched


@pytest.mark.slow
def test_sigterm_stops_glomo_pretrain_with_a_checkpoint_and_status_143(straight, tmp_path):
    """A real ``kill <pid>`` of a ``glomo pretrain`` process that is training."""
    cfg = write_yaml(tmp_path / "cfg.yaml", settings(tmp_path / "killed", straight / "corpus",
                                                     max_steps=100000, validate_every=1000))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    with open(tmp_path / "stdout", "w") as out, open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "glomo_pyg.cli", "pretrain", "--config",
                                 cfg], stdout=out, stderr=err, env=env, cwd=tmp_path)
        first = tmp_path / "killed" / "checkpoints" / "step2.ckpt"
        deadline = time.time() + 300
        while not first.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
    err = (tmp_path / "stderr").read_text()
    assert proc.returncode == 143, err[-3000:]
    step = weights(tmp_path / "killed" / "checkpoints" / "last.ckpt")[1]
    assert step >= 2
    assert f"stopped by SIGTERM after step {step}" in err
    assert f"--config {cfg} --resume" in err  # how to go on
    assert "Traceback" not in err
    # resumed, it ends on the weights of an uninterrupted run of the same length
    reference = config(tmp_path / "reference", straight / "corpus", max_steps=step + 2,
                       validate_every=1000)
    run_pretraining(reference)
    assert main(["pretrain", "--config", cfg, "--resume", "--set",
                 f"train.max_steps={step + 2}"]) == 0
    assert_same_weights(tmp_path / "killed" / "checkpoints" / "last.ckpt",
                        ckpt(tmp_path / "reference"))


# --- command line ---------------------------------------------------------------------------
def test_word_vectors_command_checks_its_input(tmp_path):
    write_corpus(tmp_path / "corpus", documents=5)
    out = tmp_path / "vectors.txt"
    base = ["word-vectors", "--corpus", str(tmp_path / "corpus"), "--output", str(out)]
    for flag in ("--dim", "--window", "--min-count", "--epochs", "--workers"):
        with pytest.raises(SystemExit,
                           match=f"glomo word-vectors: {flag} must be (a positive|an) integer"):
            main(base + [flag, "0"])
    with pytest.raises(SystemExit, match=r"--epochs must be an integer in \[1, 10000\], got 10001"):
        main(base + ["--epochs", "10001"])  # a typo that would train for days
    assert not out.exists()
    (tmp_path / "blank.txt").write_text("  \n\n")
    with pytest.raises(SystemExit, match="glomo word-vectors: .*no documents with words"):
        main(["word-vectors", "--corpus", str(tmp_path / "blank.txt"), "--output", str(out)])
    with pytest.raises(SystemExit, match="occurs --min-count 1000 times"):
        main(base + ["--min-count", "1000"])
    with pytest.raises(SystemExit, match="^glomo word-vectors: "):
        main(["word-vectors", "--corpus", str(tmp_path / "missing"), "--output", str(out)])
    assert not out.exists()
    with pytest.raises(SystemExit, match=r"--workers must be an integer in \[1, 1024\], got 20000"):
        main(base + ["--workers", "20000"])
    with pytest.raises(SystemExit, match=r"--dim must be an integer in \[1, 65536\]"):
        main(base + ["--dim", "524288"])
    # the vectors would replace the corpus, or be read as one of its documents next time
    text = tmp_path / "one.txt"
    text.write_text("the cat sat on the mat\n")
    for corpus, output in ((text, text), (tmp_path / "corpus", tmp_path / "corpus" / "v.txt")):
        with pytest.raises(SystemExit, match="is the corpus or lies inside the corpus folder"):
            main(["word-vectors", "--corpus", str(corpus), "--output", str(output)])
    assert text.read_text() == "the cat sat on the mat\n"
    assert not (tmp_path / "corpus" / "v.txt").exists()


def test_commands_turn_bad_input_into_one_line(tmp_path):
    with pytest.raises(SystemExit, match="^glomo pretrain: corpus.path is not set"):
        main(["pretrain", "--output-dir", str(tmp_path / "run"), "--set",
              "train.accelerator=cpu"])
    with pytest.raises(SystemExit, match="^glomo quickstart: .*steps"):
        main(["quickstart", "--steps", "0", "--output-dir", ""])
    with pytest.raises(SystemExit, match="^glomo pretrain: --set train.max_steps.x=1: cannot set"):
        main(["pretrain", "--set", "train.max_steps=5", "--set", "train.max_steps.x=1"])


# --- what a run reports ---------------------------------------------------------------------
def test_a_resumed_run_counts_the_seconds_of_every_part(straight, tmp_path, caplog):
    run = copy_run(straight, tmp_path, keep=("step4.ckpt",))
    earlier = torch.load(ckpt(run, "step4.ckpt"), weights_only=True)["callbacks"]["RunRecord"]
    assert earlier["seconds"] > 0
    caplog.set_level(logging.INFO, logger="glomo_pyg")
    summary = resume(straight, run)
    assert summary["steps"] == 6 and summary["seconds"] >= round(earlier["seconds"], 1)
    done = [line for line in messages(caplog) if line.startswith("done: 6 steps in ")]
    assert len(done) == 1
    final = torch.load(ckpt(run), weights_only=True)["callbacks"]["RunRecord"]
    assert final["seconds"] >= earlier["seconds"]


def test_the_command_shows_each_warning_once_on_one_line(straight, tmp_path, capfd):
    cfg = write_yaml(tmp_path / "c.yaml", settings(tmp_path / "run", straight / "corpus",
                                                   max_steps=2, graph_warmup_steps=2,
                                                   checkpoint_every=1, validate_every=1))
    assert main(["pretrain", "--config", cfg]) == 0
    out, err = capfd.readouterr()
    shown = [line for line in (out + err).splitlines() if "graph_warmup_steps (2)" in line]
    assert len(shown) == 1, shown
    assert shown[0].startswith("glomo pretrain: warning: train.graph_warmup_steps (2) >= ")
    assert "run_pretraining(" not in out + err  # (no source line of the caller)


def test_a_resumed_run_logs_into_its_one_folder_as_an_uninterrupted_run(straight, tmp_path):
    # the copy's metrics.csv holds steps 5 and 6 too, as a run killed after them would
    run = copy_run(straight, tmp_path, keep=("step4.ckpt",))
    resume(straight, run)
    assert os.listdir(run / "logs") == ["version_0"]
    metrics = "logs/version_0/metrics.csv"
    assert (run / metrics).read_text() == (straight / "run" / metrics).read_text()
