"""glomo pretrain: corpus preparation, Lightning training, kill and resume, DDP, CLI."""
import json
import logging
import os
import random
import warnings

import lightning.pytorch as pl
import pytest
import torch

from glomo_pyg import PretrainedGraphPredictor
from glomo_pyg.cli import main
from glomo_pyg.training import PretrainConfig, run_pretraining

WORDS = "the cat sat on a mat and dog ran to park it was good bad movie film".split()


def write_corpus(folder, documents=40, seed=0):
    rng = random.Random(seed)
    os.makedirs(folder, exist_ok=True)
    for k in range(documents):
        with open(os.path.join(folder, f"doc{k:03d}.txt"), "w") as fh:
            fh.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 60))) + ".")


def config(tmp_path, name, **train):
    settings = dict(batch_size=4, max_steps=6, checkpoint_every=3, validate_every=3,
                    log_every=1, graph_stats_every=2, progress_bar=False, accelerator="cpu",
                    graph_warmup_steps=2, seed=1)
    settings.update(train)
    return PretrainConfig.from_dict(dict(
        output_dir=str(tmp_path / name),
        corpus=dict(path=str(tmp_path / "corpus"), min_count=1, max_length=16, min_length=4,
                    validation_fraction=0.1),
        model=dict(hidden_channels=16, num_layers=2, heads=2, cnn_layers=1, num_positions=4),
        train=settings))


def model_state(run_dir):
    ckpt = torch.load(os.path.join(run_dir, "checkpoints", "last.ckpt"), weights_only=True)
    return ckpt["state_dict"], ckpt["global_step"]


class Crash(pl.Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step:
            raise RuntimeError("simulated crash")


def test_pretrain_killed_and_resumed_reaches_the_uninterrupted_state(tmp_path):
    write_corpus(tmp_path / "corpus")
    summary = run_pretraining(config(tmp_path, "straight"))
    assert summary["steps"] == 6 and summary["vocabulary"] == len(WORDS) + 5  # + "." and 4 specials
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_pretraining(config(tmp_path, "crashed"), extra_callbacks=[Crash(5)])
    assert model_state(tmp_path / "crashed")[1] == 3  # the last checkpoint before the crash
    with pytest.raises(FileExistsError, match="--resume"):
        run_pretraining(config(tmp_path, "crashed"))
    run_pretraining(config(tmp_path, "crashed"), resume=True)
    straight, step_a = model_state(tmp_path / "straight")
    resumed, step_b = model_state(tmp_path / "crashed")
    assert step_a == step_b == 6
    assert straight.keys() == resumed.keys()
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key
    # and the run's artefacts: the predictor with its vocabulary, graph statistics in the log
    predictor = PretrainedGraphPredictor.from_pretrained(str(tmp_path / "crashed" / "predictor"))
    assert predictor.vocabulary[:2] == ["<pad>", "<unk>"] and "cat" in predictor.vocabulary
    x = predictor.encode("the cat sat on the mat".split())
    graphs = predictor(x)
    assert graphs.forward.num_layers == 2 and graphs.backward is not None
    metrics = open(tmp_path / "straight" / "logs" / "version_0" / "metrics.csv").readline()
    for name in ("graphs/forward/layer1/density", "graphs/forward/layer0/out_degree",
                 "graphs/backward/layer0/dist_1", "val_loss", "train_loss"):
        assert name in metrics


def edit_checkpoints(run, change):
    """Apply ``change`` to the 'glomo' record of every checkpoint of ``run``."""
    from glomo_pyg.training.checkpoints import atomic_save
    folder = run / "checkpoints"
    for name in os.listdir(folder):
        data = torch.load(folder / name, weights_only=True)
        change(data["glomo"])
        atomic_save(data, folder / name)


def test_pretrain_reuses_the_prepared_corpus_and_rejects_bad_settings(tmp_path):
    write_corpus(tmp_path / "corpus")
    cfg = config(tmp_path, "run", max_steps=2)
    run_pretraining(cfg)
    shards_mtime = os.path.getmtime(tmp_path / "run" / "tokens" / "index.json")
    run_pretraining(cfg, resume=True)  # already at max_steps: no-op
    assert os.path.getmtime(tmp_path / "run" / "tokens" / "index.json") == shards_mtime
    changed = config(tmp_path, "run", max_steps=2)
    changed.corpus.min_count = 5
    with pytest.raises(ValueError, match="other corpus settings"):
        run_pretraining(changed, resume=True)
    wider = config(tmp_path, "run", max_steps=3)
    wider.model["hidden_channels"] = 32  # a checkpoint of another model shape
    with pytest.raises(ValueError, match="other model settings"):
        run_pretraining(wider, resume=True)
    # settings saved before a corpus key existed (here: crop) mean what those runs did;
    # any other missing key is a difference. First a run whose checkpoints hold no
    # settings record (glomo_pyg 0.2.0): its config.json is checked
    edit_checkpoints(tmp_path / "run", lambda record: record.pop("settings"))
    saved = tmp_path / "run" / "config.json"
    settings = json.loads(saved.read_text())
    del settings["corpus"]["crop"]
    saved.write_text(json.dumps(settings))
    built = tmp_path / "run" / "corpus.json"
    prepared = json.loads(built.read_text())
    del prepared["settings"]["crop"]
    built.write_text(json.dumps(prepared))
    longer = config(tmp_path, "run", max_steps=3)  # train settings may change on resume
    assert run_pretraining(longer, resume=True)["steps"] == 3
    # then the checkpoint's own record, which config.json no longer overrides
    os.remove(saved)
    edit_checkpoints(tmp_path / "run", lambda record: record["settings"]["corpus"].pop("crop"))
    assert run_pretraining(config(tmp_path, "run", max_steps=4), resume=True)["steps"] == 4
    edit_checkpoints(tmp_path / "run",
                     lambda record: record["settings"]["corpus"].pop("min_count"))
    with pytest.raises(ValueError, match="other corpus settings"):
        run_pretraining(config(tmp_path, "run", max_steps=5), resume=True)
    edit_checkpoints(tmp_path / "run",
                     lambda record: record["settings"]["corpus"].update(min_count=1))
    del prepared["settings"]["lower"]
    built.write_text(json.dumps(prepared))
    with pytest.raises(ValueError, match="holds a corpus built with other settings"):
        run_pretraining(config(tmp_path, "run", max_steps=5), resume=True)
    with pytest.raises(ValueError, match="unknown train settings"):
        PretrainConfig.from_dict(dict(train=dict(learning_rate=1)))
    with pytest.raises(ValueError, match="unknown configuration keys"):
        PretrainConfig.from_dict(dict(trainer={}))
    with pytest.raises(ValueError, match="corpus.format"):
        PretrainConfig.from_dict(dict(corpus=dict(format="pdf")))
    with pytest.raises(ValueError, match="set from the vocabulary"):
        PretrainConfig.from_dict(dict(model=dict(num_tokens=5)))
    with pytest.raises(ValueError, match="corpus.path is not set"):
        run_pretraining(PretrainConfig.from_dict(dict(output_dir=str(tmp_path / "x"))))


def test_pretrain_command_line(tmp_path, capsys):
    write_corpus(tmp_path / "corpus", documents=20)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"corpus: {{path: {tmp_path / 'corpus'}, min_count: 1, max_length: 16, "
                   "min_length: 4}\nmodel: {hidden_channels: 8, num_layers: 1, heads: 2, "
                   "cnn_layers: 1}\ntrain: {batch_size: 4, progress_bar: false, "
                   "accelerator: cpu}\n")
    assert main(["pretrain", "--config", str(cfg), "--set", "train.max_steps=2",
                 "--set", "train.lr=0.01", "--output-dir", str(tmp_path / "cli"),
                 "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "max_steps: 2" in printed and "lr: 0.01" in printed
    assert main(["pretrain", "--config", str(cfg), "--set", "train.max_steps=2",
                 "--output-dir", str(tmp_path / "cli")]) == 0
    assert os.path.exists(tmp_path / "cli" / "predictor" / "model.safetensors")
    # the predictor records the longest training sequence (corpus.max_length)
    assert PretrainedGraphPredictor.from_pretrained(
        str(tmp_path / "cli" / "predictor")).trained_length == 16
    with pytest.raises(SystemExit, match="key=value"):
        main(["pretrain", "--config", str(cfg), "--set", "train.lr"])
    with pytest.raises(SystemExit, match="cannot read"):
        main(["pretrain", "--config", str(tmp_path / "missing.yaml")])
    vectors = tmp_path / "vectors.txt"
    assert main(["word-vectors", "--corpus", str(tmp_path / "corpus"), "--output", str(vectors),
                 "--dim", "8", "--min-count", "1", "--epochs", "1", "--workers", "1"]) == 0
    from glomo_pyg.data import read_word_vectors
    words, array = read_word_vectors(str(vectors))
    assert set(words) <= set(WORDS) | {"."} and array.shape == (len(words), 8)


@pytest.mark.slow
def test_pretrain_ddp_two_cpu_processes(tmp_path):
    """Lightning's own DDP strategy, 2 processes on CPU (gloo), through the command line:
    the launcher runs the same command again for rank 1."""
    import subprocess
    import sys

    write_corpus(tmp_path / "corpus", documents=30)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"corpus: {{path: {tmp_path / 'corpus'}, min_count: 1, max_length: 16, "
                   "min_length: 4, validation_fraction: 0.1}\nmodel: {hidden_channels: 8, "
                   "num_layers: 1, heads: 2, cnn_layers: 1}\ntrain: {batch_size: 4, max_steps: 3, "
                   "checkpoint_every: 3, validate_every: 3, progress_bar: false, "
                   "accelerator: cpu, strategy: ddp, devices: 2}\n")
    out = tmp_path / "ddp"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "glomo_pyg.cli", "pretrain", "--config",
                           str(cfg), "--output-dir", str(out)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 device(s) x 1 node(s), DDPStrategy" in proc.stdout
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 3
    assert os.path.exists(out / "predictor" / "model.safetensors")


def test_graph_statistics_are_logged_only_at_their_interval(tmp_path):
    import csv

    write_corpus(tmp_path / "corpus")
    run_pretraining(config(tmp_path, "stats", max_steps=6, graph_stats_every=3, log_every=1))
    rows = list(csv.DictReader(open(tmp_path / "stats" / "logs" / "version_0" / "metrics.csv")))
    steps = sorted({int(r["step"]) for r in rows if r.get("graphs/forward/layer0/density")})
    assert steps == [3, 6]  # global_step after the optimiser steps of batches 3 and 6
    assert all(0 < float(r["graphs/forward/layer0/density"]) <= 1 for r in rows
               if r.get("graphs/forward/layer0/density"))


def test_health_and_syntax_are_logged_while_training(tmp_path):
    import csv

    write_corpus(tmp_path / "corpus")
    trees = tmp_path / "gold.conllu"
    trees.write_text("1\tthe\t_\tDET\t_\t_\t2\tdet\t_\t_\n2\tcat\t_\tNOUN\t_\t_\t3\tnsubj\t_\t_\n"
                     "3\tsat\t_\tVERB\t_\t_\t0\troot\t_\t_\n4\t.\t_\tPUNCT\t_\t_\t3\tpunct\t_\t_\n")
    run_pretraining(config(tmp_path, "health", max_steps=4, graph_stats_every=2,
                           syntax_treebank=str(trees), syntax_every=2, syntax_sentences=5))
    rows = list(csv.DictReader(open(tmp_path / "health" / "logs" / "version_0" / "metrics.csv")))
    health = [r for r in rows if r.get("health/forward/layer1/head1/empty")]
    assert sorted({int(r["step"]) for r in health}) == [2, 4]
    assert all(0 <= float(r["health/forward/layer1/head1/empty"]) <= 1 for r in health)
    assert all(0 <= float(r["health/forward/layer1/head1/entropy"]) <= 1 for r in health)
    backward = [r for r in rows if r.get("health/backward/uniform_adjacent")]
    assert len(backward) == 2 and all(float(r["health/backward/uniform_adjacent"]) > 0
                                      for r in backward)
    syntax = [r for r in rows if r.get("syntax/forward/best")]
    assert sorted({int(r["step"]) for r in syntax}) == [2, 4]
    assert all(0 <= float(r["syntax/backward/next_word"]) <= 1 for r in syntax)


# --- hostile configurations ----------------------------------------------------------------
def test_config_yaml_refuses_alias_bombs_and_duplicate_keys(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("train: {lr: [&a [x, x, x, x, x, x, x, x, x, x], [*a, *a, *a, *a]]}\n")
    with pytest.raises(SystemExit, match=r"aliases \(\*name\) are not allowed"):
        main(["pretrain", "--config", str(bomb), "--print-config"])
    with pytest.raises(SystemExit, match="aliases"):
        main(["pretrain", "--set", "train.lr=[&a 1, *a]", "--print-config"])
    dup = tmp_path / "dup.yaml"
    dup.write_text("train:\n  lr: 0.5\ntrain:\n  max_steps: 7\n")
    with pytest.raises(SystemExit, match="duplicate key 'train'"):
        main(["pretrain", "--config", str(dup), "--print-config"])
    deep = tmp_path / "deep.yaml"
    deep.write_text("model: " + "[" * 20000 + "]" * 20000 + "\n")
    with pytest.raises(SystemExit, match="deep.yaml: nested too deeply"):
        main(["pretrain", "--config", str(deep), "--print-config"])
    with pytest.raises(SystemExit, match="--set model.x: the value is nested too deeply"):
        main(["pretrain", "--set", "model.x=" + "[" * 3000 + "]" * 3000, "--print-config"])
    # an error message quotes a hostile value only in part
    with pytest.raises(ValueError) as err:
        PretrainConfig.from_dict(dict(train=dict(lr=[list(range(1000))] * 1000)))
    assert "train.lr" in str(err.value) and len(str(err.value)) < 300


def test_numbers_and_choices_written_as_yaml_reads_them(capsys):
    assert main(["pretrain", "--set", "train.lr=1e-3", "--set", "train.precision=32",
                 "--set", "model.keep_alive=5E-2", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "lr: 0.001" in printed and "precision: '32'" in printed and "keep_alive: 0.05" in printed
    for key, value, message in [("train.lr", ".inf", "train.lr must be a positive number"),
                                ("train.weight_decay", "inf", "train.weight_decay"),
                                ("train.graph_lr_scale", "nan", "train.graph_lr_scale"),
                                ("train.lr", "fast", "train.lr must be"),
                                ("corpus.min_length", "1", "corpus.min_length must be an "
                                                           "integer >= 2"),
                                ("train.threads", "100000", r"train.threads must be an "
                                                            r"integer in \[0, 1024\]"),
                                ("train.batch_size", str(2 ** 63), "train.batch_size"),
                                # beyond what load_pretrained accepts: refused before a run
                                # that could not be loaded afterwards
                                ("model.block_size", str(2 ** 34 + 1), r"model.block_size must be "
                                 r"an integer in \[1, 17179869184\], got 17179869185"),
                                ("model.num_layers", "100000", "model.num_layers"),
                                ("model.head_channels", "100000", "model.head_channels"),
                                ("model.kernel_size", "1024", "model.kernel_size"),
                                ("model.position_frequencies", "4097",
                                 "model.position_frequencies"),
                                ("model.context_length", "500", "must be below "
                                                                "corpus.max_length")]:
        with pytest.raises(SystemExit, match=message):
            main(["pretrain", "--set", f"{key}={value}", "--print-config"])


def test_bad_train_settings_fail_before_the_corpus_is_prepared(tmp_path, monkeypatch):
    write_corpus(tmp_path / "corpus", documents=10)
    for name in ("MASTER_ADDR", "NODE_RANK", "SLURM_NTASKS", "TORCHELASTIC_RUN_ID",
                 "OMPI_COMM_WORLD_SIZE", "LSB_JOBID"):
        monkeypatch.delenv(name, raising=False)
    cases = [(dict(num_nodes=2), "no cluster environment"),  # (would wait forever)
             (dict(devices=[0, 1]), "train settings"),
             (dict(precision="16-true"), "not supported on the CPU"),
             (dict(syntax_treebank=str(tmp_path / "missing.conllu")),
              "train.syntax_treebank: .*No such file")]
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        cases.append((dict(logger="tensorboard"), "train settings.*tensorboard"))
    for k, (train, message) in enumerate(cases):
        cfg = config(tmp_path, f"bad{k}", **train)
        with pytest.raises(ValueError, match=message):
            run_pretraining(cfg)
        assert not os.path.exists(tmp_path / f"bad{k}" / "tokens")  # nothing was tokenised
    # trees that read but leave nothing to score: refused before any step, not after
    (tmp_path / "punct.conllu").write_text(
        "1\t.\t.\tPUNCT\t_\t_\t0\troot\t_\t_\n2\t!\t!\tPUNCT\t_\t_\t1\tpunct\t_\t_\n\n")
    with pytest.raises(ValueError, match="train.syntax_treebank: the gold trees cannot be "
                                         "scored: no target to score"):
        run_pretraining(config(tmp_path, "bad-punct",
                               syntax_treebank=str(tmp_path / "punct.conllu")))
    assert not os.path.exists(tmp_path / "bad-punct" / "checkpoints") or \
        not os.listdir(tmp_path / "bad-punct" / "checkpoints")
    (tmp_path / "empty.conllu").write_text("# no sentences\n")
    with pytest.raises(ValueError, match="empty.conllu holds no sentences"):
        run_pretraining(config(tmp_path, "bad-empty",
                               syntax_treebank=str(tmp_path / "empty.conllu")))
    rare = config(tmp_path, "rare")
    rare.corpus.min_count = 1000
    with pytest.raises(ValueError, match="only the special tokens"):
        run_pretraining(rare)
    (tmp_path / "a-file").write_text("x")
    as_file = config(tmp_path, "a-file")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        run_pretraining(as_file)


def test_model_widths_beyond_memory_fail_before_the_corpus_is_prepared(tmp_path, monkeypatch):
    import glomo_pyg.training.pretrain.trainer as pretraining

    monkeypatch.setattr(pretraining, "physical_memory", lambda: 2 ** 30)  # any machine: 1 GiB
    write_corpus(tmp_path / "corpus", documents=10)
    # widths no saved predictor may hold are refused by range, before any estimate
    for k, (width, message) in enumerate([(10 ** 9, r"model.hidden_channels must be an "
                                                    r"integer in \[1, 65536\], got 1000000000"),
                                          (10 ** 30, r"model.hidden_channels must be an "
                                                     r"integer in \[1, 65536\], got 1{1}0{30}"),
                                          (2 ** 14, r"parameters \(.* GiB\), more than this "
                                                    r"machine's memory \(1.0 GiB\)")]):
        cfg = config(tmp_path, f"wide{k}")
        cfg.model["hidden_channels"] = width
        with pytest.raises(ValueError, match=message):
            run_pretraining(cfg)
        assert not os.path.exists(tmp_path / f"wide{k}" / "tokens")  # nothing was tokenised
    big_vocabulary = config(tmp_path, "big-vocabulary", max_steps=1)
    big_vocabulary.corpus.max_size = 10 ** 7  # only a cap: the corpus has a few words
    run_pretraining(big_vocabulary)
    bad = config(tmp_path, "bad-heads")
    bad.model["heads"] = 3  # does not divide hidden_channels: the constructor's own check
    with pytest.raises(ValueError, match="model settings"):
        run_pretraining(bad)


def test_a_validation_share_above_half_is_named(tmp_path):
    write_corpus(tmp_path / "corpus")
    cfg = config(tmp_path, "mostly-validation", max_steps=1)
    cfg.corpus.validation_fraction = 0.9
    with pytest.warns(RuntimeWarning, match="validation_fraction 0.9 keeps only .* for training"):
        run_pretraining(cfg)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*validation_fraction", RuntimeWarning)
        run_pretraining(config(tmp_path, "usual", max_steps=1))


def test_a_warm_up_as_long_as_the_run_is_named(tmp_path, caplog):
    write_corpus(tmp_path / "corpus", documents=10)
    caplog.set_level(logging.INFO, logger="glomo_pyg")
    with pytest.warns(RuntimeWarning, match="graph_warmup_steps .3. >= train.max_steps .2."):
        run_pretraining(config(tmp_path, "frozen", max_steps=2, graph_warmup_steps=3))
    assert caplog.messages  # (the run's lines, but not the warning's)
    assert not any("random initialisation" in m for m in caplog.messages)


def test_final_steps_are_checkpointed_and_resume_keeps_optimiser_settings(tmp_path):
    import json

    write_corpus(tmp_path / "corpus")
    # 5 steps with checkpoints every 3: last.ckpt must hold step 5, not 3
    summary = run_pretraining(config(tmp_path, "odd", max_steps=5, validate_every=10))
    assert model_state(tmp_path / "odd")[1] == 5
    with open(tmp_path / "odd" / "pretrain.json") as fh:
        saved = json.load(fh, parse_constant=lambda c: pytest.fail(f"{c} in pretrain.json"))
    assert saved["val_loss"] is None and summary["val_loss"] is None  # no validation ran
    # resuming from the end-of-run checkpoint gives the uninterrupted run's state
    run_pretraining(config(tmp_path, "odd", max_steps=6, validate_every=10), resume=True)
    run_pretraining(config(tmp_path, "six", max_steps=6, validate_every=10))
    odd, step_a = model_state(tmp_path / "odd")
    six, step_b = model_state(tmp_path / "six")
    assert step_a == step_b == 6
    for key in six:
        assert torch.equal(odd[key], six[key]), key
    # a finished run resumed at the same max_steps trains nothing and keeps its summary
    assert run_pretraining(config(tmp_path, "six", max_steps=6), resume=True)["steps"] == 6
    with pytest.raises(ValueError, match="at step 6, past train.max_steps .4."):
        run_pretraining(config(tmp_path, "six", max_steps=4), resume=True)
    for change, message in [(dict(lr=0.5), r"train.lr 0.001 -> 0.5"),
                            (dict(optimizer="sgd"), "train.optimizer 'adam' -> 'sgd'"),
                            (dict(batch_size=8), "train.batch_size 4 -> 8"),
                            (dict(weight_decay=0.1), "train.weight_decay")]:
        with pytest.raises(ValueError, match=message):
            run_pretraining(config(tmp_path, "six", max_steps=8, **change), resume=True)


def test_prepare_only_needs_no_cluster_and_a_stale_summary_is_rewritten(tmp_path, monkeypatch):
    write_corpus(tmp_path / "corpus", documents=10)
    for name in ("MASTER_ADDR", "NODE_RANK", "GROUP_RANK", "RANK", "SLURM_NTASKS",
                 "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "LSB_JOBID"):
        monkeypatch.delenv(name, raising=False)
    # the documented multi-node flow: tokenise once, on a machine outside the cluster
    prepared = run_pretraining(config(tmp_path, "nodes", num_nodes=2), prepare_only=True)
    assert prepared["tokens"] > 0
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("RANK", "0")  # (Kubeflow sets RANK, not NODE_RANK)
    from glomo_pyg.training.pretrain.trainer import _CLUSTER_ENVIRONMENTS
    assert any(all(k in os.environ for k in keys) for keys in _CLUSTER_ENVIRONMENTS)
    # a checkpoint at max_steps beside the summary of an earlier, shorter end
    run_pretraining(config(tmp_path, "stale", max_steps=5))
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_pretraining(config(tmp_path, "stale", max_steps=7), resume=True,
                        extra_callbacks=[Crash(7)])
    assert model_state(tmp_path / "stale")[1] == 7
    summary = run_pretraining(config(tmp_path, "stale", max_steps=7), resume=True)
    assert summary["steps"] == 7
    predictor = PretrainedGraphPredictor.from_pretrained(str(tmp_path / "stale" / "predictor"))
    state = model_state(tmp_path / "stale")[0]
    emb = [k for k in state if k.endswith("graph_predictors.fw.encoder.embedding.weight")][0]
    assert torch.equal(predictor.predictor("forward").state_dict()["encoder.embedding.weight"],
                       state[emb])


def _write_vectors(path, rows):
    with open(path, "w") as fh:
        for word, vec in rows.items():
            fh.write(word + " " + " ".join(f"{v:.6g}" for v in vec) + "\n")


def test_init_vectors_start_every_token_embedding(tmp_path, caplog):
    from glomo_pyg.training.pretrain.vectors import initial_token_embeddings

    write_corpus(tmp_path / "corpus", documents=10)
    rng = random.Random(0)
    known = WORDS[:12]  # the rest of the vocabulary is not in the file
    rows = {w: [rng.gauss(0, 3.0) for _ in range(16)] for w in known}
    rows["zebra"] = [1.0] * 16  # not in the corpus: ignored
    _write_vectors(tmp_path / "vec.txt", rows)
    # g stays frozen for the whole run, so the saved graph predictor holds the start
    cfg = config(tmp_path, "init", max_steps=2, graph_warmup_steps=3,
                 init_vectors=str(tmp_path / "vec.txt"))
    caplog.set_level(logging.INFO, logger="glomo_pyg")
    with pytest.warns(RuntimeWarning, match="graph_warmup_steps"):
        summary = run_pretraining(cfg)
    predictor = PretrainedGraphPredictor.from_pretrained(str(tmp_path / "init" / "predictor"))
    vocab = predictor.vocabulary
    found = sum(w in rows for w in vocab) / len(vocab)
    assert summary["init_vectors_found"] == pytest.approx(found, abs=1e-4) and 0 < found < 1
    assert any("token embeddings start from" in m for m in caplog.messages)
    weight, share = initial_token_embeddings(str(tmp_path / "vec.txt"), vocab, 16, seed=1)
    assert share == pytest.approx(found)
    for part in predictor.predictors.values():
        saved = part.encoder.embedding.weight
        pad = part.encoder.embedding.padding_idx
        keep = [i for i in range(len(vocab)) if i != pad]
        torch.testing.assert_close(saved[keep], weight[keep])
        assert not saved[pad].any()
    # rescaled to the embeddings' own initial scale, the file's directions kept
    assert float(weight.double().std()) == pytest.approx(16 ** -0.5, rel=1e-4)
    a, b = vocab.index(known[0]), vocab.index(known[1])
    file_cos = torch.nn.functional.cosine_similarity(
        torch.tensor(rows[known[0]]), torch.tensor(rows[known[1]]), dim=0)
    torch.testing.assert_close(torch.nn.functional.cosine_similarity(weight[a], weight[b], dim=0),
                               file_cos, atol=1e-5, rtol=1e-5)
    # the feature predictor started there too: its checkpoint moved away only by training
    state, _ = model_state(tmp_path / "init")
    f_start = [k for k in state if k.endswith("encoder.embedding.weight") and "feature" in k]
    assert f_start and all(state[k].shape == weight.shape for k in f_start)


def test_init_vectors_parts_start_g_or_f_alone(tmp_path, caplog):
    from glomo_pyg.training.pretrain.vectors import initial_token_embeddings

    write_corpus(tmp_path / "corpus", documents=10)
    rng = random.Random(0)
    _write_vectors(tmp_path / "vec.txt", {w: [rng.gauss(0, 1.0) for _ in range(16)]
                                          for w in WORDS})
    g_start, f_after = {}, {}
    caplog.set_level(logging.INFO, logger="glomo_pyg")
    for parts in ("graph", "features"):
        caplog.clear()
        cfg = config(tmp_path, parts, max_steps=2, graph_warmup_steps=3,
                     init_vectors=str(tmp_path / "vec.txt"), init_vectors_parts=parts)
        with pytest.warns(RuntimeWarning, match="graph_warmup_steps"):
            run_pretraining(cfg)
        assert any(f"{'g' if parts == 'graph' else 'f'}'s only" in m for m in caplog.messages)
        predictor = PretrainedGraphPredictor.from_pretrained(str(tmp_path / parts / "predictor"))
        g_start[parts] = [p.encoder.embedding for p in predictor.predictors.values()]
        state, _ = model_state(tmp_path / parts)
        f_after[parts] = [state[k] for k in state
                          if k.endswith("encoder.embedding.weight") and "feature" in k]
        assert len(f_after[parts]) == 2  # both directions
    vocab = predictor.vocabulary
    weight, _ = initial_token_embeddings(str(tmp_path / "vec.txt"), vocab, 16, seed=1)
    pad = g_start["graph"][0].padding_idx
    keep = [i for i in range(len(vocab)) if i != pad]
    # g is frozen for the run, so its saved embedding is its start
    for emb in g_start["graph"]:
        torch.testing.assert_close(emb.weight[keep], weight[keep])
    for emb in g_start["features"]:  # g kept its random start
        assert (emb.weight[keep] - weight[keep]).abs().max() > 0.05
    # f trained for 2 Adam steps at lr 1e-3 (each moves an entry by about lr at most):
    # near the vectors when it started there, far from them otherwise
    for f in f_after["features"]:
        torch.testing.assert_close(f[keep], weight[keep], atol=5e-3, rtol=0)
    for f in f_after["graph"]:
        assert (f[keep] - weight[keep]).abs().max() > 0.05
    with pytest.raises(ValueError, match="init_vectors_parts .*not set"):
        PretrainConfig.from_dict(dict(train=dict(init_vectors_parts="graph")))
    with pytest.raises(ValueError, match="init_vectors_parts: with model.decouple=false"):
        PretrainConfig.from_dict(dict(model=dict(decouple=False), train=dict(
            init_vectors="vec.txt", init_vectors_parts="features")))
    with pytest.raises(ValueError, match="init_vectors_parts must be one of 'both', 'graph'"):
        PretrainConfig.from_dict(dict(train=dict(init_vectors="vec.txt",
                                                 init_vectors_parts="g")))


def test_init_vectors_that_do_not_fit_are_refused(tmp_path):
    write_corpus(tmp_path / "corpus", documents=10)
    _write_vectors(tmp_path / "narrow.txt", {"the": [0.5] * 8})
    _write_vectors(tmp_path / "foreign.txt", {"xyzzy": [0.5] * 16})
    _write_vectors(tmp_path / "zero.txt", {w: [0.0] * 16 for w in WORDS})
    (tmp_path / "broken.txt").write_text("the" + " 0.1" * 16 + "\ncat 0.3\n")
    early = [("missing.txt", "train.init_vectors: .*No such file"),
             ("narrow.txt", "8-d vectors, but the token embeddings are "
                            "model.hidden_channels = 16 wide.*--dim 16")]
    for k, (name, message) in enumerate(early):  # refused before the corpus is prepared
        with pytest.raises(ValueError, match=message):
            run_pretraining(config(tmp_path, f"early{k}", init_vectors=str(tmp_path / name)))
        assert not os.path.exists(tmp_path / f"early{k}" / "tokens")
    late = [("foreign.txt", "a vector for none of the .* vocabulary words"),
            ("zero.txt", "zero.txt: .*no directions"),
            ("broken.txt", "train.init_vectors: .*broken.txt:2: expected 16 numbers")]
    for k, (name, message) in enumerate(late):
        with pytest.raises(ValueError, match=message):
            run_pretraining(config(tmp_path, f"late{k}", init_vectors=str(tmp_path / name)))
        assert not os.path.exists(tmp_path / f"late{k}" / "checkpoints") or \
            not os.listdir(tmp_path / f"late{k}" / "checkpoints")
    # read directly (the run reads the same way): vectors that cannot start embeddings
    from glomo_pyg.training.pretrain.vectors import initial_token_embeddings
    (tmp_path / "equal.txt").write_text("a 1 1\nb 1 1\n")
    (tmp_path / "huge.txt").write_text("a 3.4e38 3.4e38\nb -3.4e38 -3.4e38\n")
    for name, vocab, message in (
            ("equal.txt", ["a", "b"], "equal.txt: .*no directions"),
            ("huge.txt", ["<pad>", "a", "b", "c"], "train.init_vectors: .*huge.txt: .*too large")):
        with pytest.raises(ValueError, match=message):
            initial_token_embeddings(str(tmp_path / name), vocab, 2)
    with pytest.raises(ValueError, match="train.init_vectors .*pixel models"):
        PretrainConfig.from_dict(dict(corpus=dict(format="cifar10"),
                                      train=dict(init_vectors="vec.txt")))
    with pytest.raises(ValueError, match="train.init_vectors"):
        PretrainConfig.from_dict(dict(train=dict(init_vectors=3)))


def test_init_vectors_word2vec_trains_them_on_the_corpus_first(tmp_path, caplog):
    from glomo_pyg.data import read_word_vectors
    from glomo_pyg.training.pretrain.vectors import initial_token_embeddings, train_init_vectors

    write_corpus(tmp_path / "corpus", documents=10)
    cfg = config(tmp_path, "w2v", max_steps=2, graph_warmup_steps=3, init_vectors="word2vec")
    caplog.set_level(logging.INFO, logger="glomo_pyg")
    with pytest.warns(RuntimeWarning, match="graph_warmup_steps"):
        summary = run_pretraining(cfg)
    path = str(tmp_path / "w2v" / "word_vectors.txt")
    words, vectors = read_word_vectors(path)
    assert vectors.shape[1] == 16 and set(words) <= set(WORDS + ["."])
    assert any(m.startswith("word vectors: ") and "from 10 documents" in m
               for m in caplog.messages)
    predictor = PretrainedGraphPredictor.from_pretrained(str(tmp_path / "w2v" / "predictor"))
    weight, found = initial_token_embeddings(path, predictor.vocabulary, 16, seed=1)
    assert summary["init_vectors_found"] == pytest.approx(found, abs=1e-4)
    for part in predictor.predictors.values():  # g stayed frozen: it holds the start
        pad = part.encoder.embedding.padding_idx
        keep = [i for i in range(len(predictor.vocabulary)) if i != pad]
        torch.testing.assert_close(part.encoder.embedding.weight[keep], weight[keep])
    # a resumed run keeps its checkpoint's weights: no vectors trained or read again
    os.remove(path)
    more = config(tmp_path, "w2v", max_steps=3, graph_warmup_steps=3, init_vectors="word2vec")
    caplog.clear()
    run_pretraining(more, resume=True)
    assert not os.path.exists(path)
    assert caplog.messages and not any("word vectors" in m or "token embeddings" in m
                                       for m in caplog.messages)
    # a file of the right width is reused; one of another width is trained again
    train_init_vectors(cfg.corpus, 16, str(tmp_path / "w2v"))
    caplog.clear()
    assert train_init_vectors(cfg.corpus, 16, str(tmp_path / "w2v")) == path
    assert caplog.messages == [f"word vectors: reusing {path}"]
    assert caplog.records[0].name == "glomo_pyg.training.pretrain.vectors"
    train_init_vectors(cfg.corpus, 8, str(tmp_path / "w2v"))
    assert "another width" in caplog.messages[1] and read_word_vectors(path)[1].shape[1] == 8
