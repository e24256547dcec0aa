"""benchmarks/linear_probe.py end to end on tiny files the test writes: every stage, the
cached features and probes reused on a second call, cache keys that change with the
predictor or the features, and the report."""
import json
import os

import pytest
from fake_data import write_aclimdb, write_image_batches

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
    write_aclimdb(root, unlabelled=10)
    write_image_batches(root, imagenet=16, cifar=8)


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
    (tmp_path / "moco.yaml").write_text(MOCO.replace("dim: 4", "dim: 5"))
    with pytest.raises(SystemExit, match="other settings"):  # not the encoder of this config
        linear_probe.main(["images"] + argv[1:])


def test_feature_keys_change_with_the_predictor_and_the_features():
    from glomo_pyg import PretrainedGraphPredictor

    release = os.path.join(linear_probe.REPO, "pretrained", "imagenet32-pixel-cpu")
    predictor = PretrainedGraphPredictor.from_pretrained(release)
    base = dict(task="images", split="train", variant="glomo", encoder="e1",
                predictor=predictor.fingerprint())
    key = linear_probe.feature_key(**base)
    assert linear_probe.feature_key(**base) == key
    next(predictor.parameters()).data.add_(1e-3)  # other weights, other graphs
    assert linear_probe.feature_key(**dict(base, predictor=predictor.fingerprint())) != key
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
