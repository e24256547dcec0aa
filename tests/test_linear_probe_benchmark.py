"""benchmarks/linear_probe.py end to end on tiny files the test writes: every stage, the
cached features and probes reused on a second call, cache keys that change with the
predictor or the features, and the report."""
import json
import os
import pickle
import random

import numpy as np
import pytest

from benchmarks import linear_probe

MOCO = """max_images: 16
moco:
  channels: [4, 4, 6]
  dim: 4
  queue_size: 8
  batch_size: 4
  max_steps: 2
  checkpoint_every: 1
  log_every: 1
"""


def write_data(root):
    rng = random.Random(0)
    for split, count in (("train", 12), ("test", 8)):
        for kind in ("pos", "neg"):
            folder = root / "aclImdb" / split / kind
            folder.mkdir(parents=True)
            for k in range(count):
                words = [rng.choice(["good", "great"] if kind == "pos" else ["bad", "awful"])
                         for _ in range(3)] + [f"filler{rng.randrange(30)}" for _ in range(15)]
                rng.shuffle(words)
                (folder / f"{k}_{8 if kind == 'pos' else 2}.txt").write_text(" ".join(words))
    unsup = root / "aclImdb" / "train" / "unsup"
    unsup.mkdir()
    for k in range(10):
        (unsup / f"{k}_0.txt").write_text(" ".join(f"filler{rng.randrange(30)}"
                                                    for _ in range(20)))
    data = np.random.default_rng(0)
    os.makedirs(root / "imagenet32")
    for i in (1, 2):
        pixels = data.integers(0, 256, (16, 3072), dtype=np.uint8)
        with open(root / "imagenet32" / f"train_data_batch_{i}", "wb") as fh:
            pickle.dump({"data": pixels, "labels": [1] * 16, "mean": pixels.mean(0)}, fh)
    os.makedirs(root / "cifar-10-batches-py")
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        pixels = data.integers(0, 256, (8, 3072), dtype=np.uint8)
        with open(root / "cifar-10-batches-py" / name, "wb") as fh:
            pickle.dump({b"data": pixels, b"labels": [0, 1, 2, 3] * 2}, fh)


@pytest.mark.slow
def test_every_stage_runs_caches_and_reports(tmp_path):
    write_data(tmp_path / "data")
    (tmp_path / "moco.yaml").write_text(MOCO)
    out, results = tmp_path / "out", tmp_path / "linear_probe.md"
    argv = ["all", "--data-dir", str(tmp_path / "data"), "--output-dir", str(out), "--smoke",
            "--threads", "1", "--moco-config", str(tmp_path / "moco.yaml"),
            "--results", str(results)]
    linear_probe.main(argv)
    text = results.read_text()
    assert text.startswith("# Linear probe") and "**IMDB**" in text and "**MoCo**" in text
    for label in ("features alone", "+ GLoMo", "+ uniform", "+ chain (adjacent unit)",
                  "+ grid", "+ GLoMo (CPU release)"):
        assert f"| {label} |" in text
    images = json.loads((out / "images.json").read_text())
    run = images["variants"]["moco-glomo-mean+max"]["runs"][0]
    assert len(run["correct"]) == 8 and set(run["correct"]) <= {"0", "1"}
    stamps = {p: p.stat().st_mtime_ns for p in (out / "images" / "features").iterdir()}
    linear_probe.main(argv)  # everything cached: nothing recomputed
    assert {p: p.stat().st_mtime_ns for p in (out / "images" / "features").iterdir()} == stamps


def test_feature_keys_change_with_the_predictor_and_the_features():
    from glomo_pyg import PretrainedGraphPredictor
    from glomo_pyg.transforms.glomo_graphs import predictor_digest

    release = os.path.join(linear_probe.REPO, "pretrained", "imagenet32-pixel-cpu")
    predictor = PretrainedGraphPredictor.from_pretrained(release)
    base = dict(task="images", split="train", variant="glomo", encoder="e1",
                predictor=predictor_digest(predictor))
    key = linear_probe.feature_key(**base)
    assert linear_probe.feature_key(**base) == key
    next(predictor.parameters()).data.add_(1e-3)  # other weights, other graphs
    assert linear_probe.feature_key(**dict(base, predictor=predictor_digest(predictor))) != key
    assert linear_probe.feature_key(**dict(base, encoder="e2")) != key  # other features
    assert linear_probe.feature_key(**dict(base, variant="uniform")) != key


def test_cached_features_recompute_a_chunk_written_under_another_key(tmp_path):
    import torch

    calls = []

    def compute(start, stop):
        calls.append((start, stop))
        return torch.arange(start, stop).float().view(-1, 1)

    first = linear_probe.cached_features(str(tmp_path), "f", "k1", 5, 2, compute)
    assert first.view(-1).tolist() == [0, 1, 2, 3, 4] and len(calls) == 3
    linear_probe.cached_features(str(tmp_path), "f", "k1", 5, 2, compute)
    assert len(calls) == 3  # all cached
    linear_probe.cached_features(str(tmp_path), "f", "k2", 5, 2, compute)
    assert len(calls) == 6  # another key: every chunk recomputed


def test_the_command_line_refuses_bad_input(tmp_path, capsys):
    with pytest.raises(SystemExit):
        linear_probe.main(["text"])  # no --data-dir
    with pytest.raises(SystemExit, match="no text.json or images.json"):
        linear_probe.main(["report", "--data-dir", str(tmp_path), "--output-dir",
                           str(tmp_path / "empty"), "--results", str(tmp_path / "r.md")])
    with pytest.raises(SystemExit):
        linear_probe.main(["images", "--data-dir", str(tmp_path), "--skip", "none"])
