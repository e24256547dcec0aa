"""The CIFAR-10 reproduction script end to end on tiny files (seconds): every stage,
cached stages on a second call, the results file and the figure. (Its training loop:
tests/test_image_classification.py.)"""
import json
import os

import pytest
from fake_data import write_image_batches

from benchmarks.reproduce import cifar10


def write_data(root):
    write_image_batches(root)


@pytest.mark.slow
def test_cifar10_reproduction_runs_end_to_end_and_resumes(tmp_path):
    write_data(tmp_path / "data")
    out, results, fig = tmp_path / "out", tmp_path / "cifar10.md", tmp_path / "fig.png"
    argv = ["--data-dir", str(tmp_path / "data"), "--smoke", "--output-dir", str(out),
            "--results", str(results), "--figure", str(fig), "--accelerator", "cpu",
            "--pretrain-steps", "3"]
    cifar10.main(argv)
    pretrain_config = json.load(open(out / "pretrain" / "config.json"))
    assert pretrain_config["train"]["max_steps"] == 3  # the override, recorded
    with open(out / "downstream.json") as fh:
        cache = json.load(fh)
    runs = cache["runs"]
    assert cache["settings"]["epochs"] == cifar10.SMOKE.epochs
    assert sorted(runs) == ["resnet18/baseline/seed0", "resnet18/glomo/seed0",
                            "resnet18/uniform/seed0"]
    assert all(0 <= r["test_acc"] <= 1 and len(r["epoch_seconds"]) == 1 for r in runs.values())
    split = json.load(open(out / "split.json"))
    assert len(split["train"]) == 8 and len(split["validation"]) == 4
    assert not set(split["train"]) & set(split["validation"])
    graphs = json.load(open(out / "pixel_graphs.json"))
    assert set(graphs["learned"]) == {"forward", "backward"}
    text = results.read_text()
    assert "NOT a reproduction" in text and "ResNet + GLoMo" in text and "91.55" in text
    assert fig.stat().st_size > 10_000
    mtime = os.path.getmtime(out / "downstream.json")
    cifar10.main(argv)  # everything cached: nothing retrained
    assert os.path.getmtime(out / "downstream.json") == mtime
    # cached runs of another recipe are refused, not reported under the new one
    with pytest.raises(SystemExit, match="other settings or inputs .epochs"):
        cifar10.main(argv + ["--epochs", "2"])
    # options and input folders are checked before any stage
    (tmp_path / "empty").mkdir()
    for extra, message in [(["--seeds", "0"], "--seeds must be >= 1"),
                           (["--epochs", "-1"], "--epochs must be >= 1"),
                           (["--threads", "-1"], "--threads must be >= 0"),
                           (["--pretrain-steps", "0"], "--pretrain-steps must be >= 1"),
                           (["--pretrain-steps", "5"], "a pretraining of 3 steps, not"),
                           (["--results", str(tmp_path)], "is a directory"),
                           (["--data-dir", str(tmp_path / "empty")], "is not a folder")]:
        with pytest.raises(SystemExit, match=message):
            cifar10.main(argv + extra)
    # a cached split that overlaps or points outside the data is refused
    split_path = out / "split.json"
    good = split_path.read_text()
    for edit, message in [(lambda d: dict(d, validation=d["train"][:1]), "overlap"),
                          (lambda d: dict(d, test=[99999]), "indices in"),
                          (lambda d: dict(d, counts=dict(train=3, test=1)), "other data")]:
        split_path.write_text(json.dumps(edit(json.loads(good))))
        with pytest.raises(SystemExit, match=message):
            cifar10.main(argv)
    split_path.write_text("[]")
    with pytest.raises(SystemExit, match="split.json .image split. is damaged"):
        cifar10.main(argv)
    split_path.write_text(good)
    # the window variants: the recorded crop (8) sets the window unless given
    cifar10.main(argv + ["--variants", "glomo-window", "uniform-window"])
    runs = json.load(open(out / "downstream.json"))["runs"]
    assert runs["resnet18/glomo-window/seed0"]["max_distance"] == 7
    assert runs["resnet18/uniform-window/seed0"]["max_distance"] == 7
    text = results.read_text()
    assert "cut to the pretraining window (offsets <= 7)" in text
    assert "glomo-window − glomo:" in text and "glomo-window − uniform-window:" in text
    # one window per cache: runs of another are refused, not paired
    with pytest.raises(SystemExit, match="window runs with max_distance 7, not 3: give "
                                         "--max-distance 7 or another --output-dir"):
        cifar10.main(argv + ["--variants", "glomo-window", "--max-distance", "3"])
    mtime = os.path.getmtime(out / "downstream.json")
    cifar10.main(argv + ["--variants", "glomo-window", "--max-distance", "7"])  # cached
    assert os.path.getmtime(out / "downstream.json") == mtime
    with pytest.raises(SystemExit, match="--max-distance applies to the .-window variants"):
        cifar10.main(argv + ["--max-distance", "3"])
    with pytest.raises(SystemExit, match="a window of 31 keeps every pair of 32-pixel images"):
        cifar10.main(argv + ["--variants", "glomo-window", "--max-distance", "31",
                             "--output-dir", str(tmp_path / "other")])
    with pytest.raises(SystemExit, match="--max-distance must be >= 1"):
        cifar10.main(argv + ["--variants", "glomo-window", "--max-distance", "0"])

