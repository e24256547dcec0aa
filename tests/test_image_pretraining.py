"""glomo pretrain on images (paper Sec. 3.5): a short run on tiny CIFAR-format files,
killed and resumed exactly, and the saved pixel predictor."""
import os
import pickle

import numpy as np
import pytest
import torch
from test_text_pretraining import Crash, model_state

from glomo_pyg import PretrainedGraphPredictor, RasterOrder
from glomo_pyg.pixels import image_units
from glomo_pyg.training import PretrainConfig, run_pretraining


def write_cifar(folder, per_batch=4):
    rng = np.random.default_rng(0)
    os.makedirs(folder, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        # smooth images (a gradient plus noise), so neighbouring pixels are related
        base = np.linspace(0, 200, 32 * 32).reshape(1, 1, 32, 32)
        data = (base + rng.integers(0, 50, (per_batch, 3, 32, 32))).astype(np.uint8)
        with open(os.path.join(folder, name), "wb") as fh:
            pickle.dump({b"data": data.reshape(per_batch, -1), b"labels": [1] * per_batch}, fh)


def config(tmp_path, name, **train):
    settings = dict(batch_size=4, max_steps=4, checkpoint_every=2, validate_every=2,
                    log_every=1, graph_stats_every=2, progress_bar=False, accelerator="cpu",
                    graph_warmup_steps=1, seed=1, lr=0.01)
    settings.update(train)
    return PretrainConfig.from_dict(dict(
        output_dir=str(tmp_path / name),
        corpus=dict(format="cifar10", path=str(tmp_path / "cifar"), validation_fraction=0.2),
        model=dict(hidden_channels=8, num_layers=1, heads=2, cnn_layers=1, num_positions=8,
                   keep_alive=0.05),
        train=settings))


@pytest.mark.slow
def test_image_pretraining_runs_resumes_exactly_and_saves_a_pixel_predictor(tmp_path):
    write_cifar(tmp_path / "cifar")
    summary = run_pretraining(config(tmp_path, "straight"))
    assert summary["steps"] == 4 and summary["images"] == 20
    assert np.isfinite(summary["train_loss"]) and np.isfinite(summary["val_loss"])
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_pretraining(config(tmp_path, "crashed"), extra_callbacks=[Crash(3)])
    os.rename(tmp_path / "cifar", tmp_path / "moved")  # a moved data set: same content
    moved = config(tmp_path, "crashed")
    moved.corpus.path = str(tmp_path / "moved")
    run_pretraining(moved, resume=True)
    straight, step_a = model_state(tmp_path / "straight")
    resumed, step_b = model_state(tmp_path / "crashed")
    assert step_a == step_b == 4
    for key in straight:  # flips and sampled positions included: the same run
        assert torch.equal(straight[key], resumed[key]), key
    predictor = PretrainedGraphPredictor.from_pretrained(str(tmp_path / "straight" / "predictor"))
    images = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    graphs = predictor(*image_units(images))
    assert isinstance(graphs.forward.order, RasterOrder) and graphs.forward.order.height == 32
    assert predictor.vocabulary is None
    metrics = open(tmp_path / "straight" / "logs" / "version_0" / "metrics.csv").readline()
    assert "health/backward/layer0/head1/adjacent" in metrics


def test_image_pretraining_rejects_settings_taken_from_the_images(tmp_path):
    with pytest.raises(ValueError, match="model.height is set from the images"):
        PretrainConfig.from_dict(dict(corpus=dict(format="cifar10", path="x"),
                                      model=dict(height=16)))
    with pytest.raises(ValueError, match="corpus.format"):
        PretrainConfig.from_dict(dict(corpus=dict(format="mnist")))
    cfg = config(tmp_path, "missing")
    with pytest.raises(FileNotFoundError):
        run_pretraining(cfg)


def test_pretraining_on_crops_saves_a_full_size_predictor(tmp_path):
    write_cifar(tmp_path / "cifar")
    cfg = config(tmp_path, "crops", max_steps=2)
    cfg.corpus.crop = 8
    summary = run_pretraining(cfg)
    assert summary["steps"] == 2 and np.isfinite(summary["val_loss"])
    predictor = PretrainedGraphPredictor.from_pretrained(str(tmp_path / "crops" / "predictor"))
    emitter = predictor.predictor("forward")
    assert (emitter.height, emitter.width) == (32, 32)
    assert predictor.trained_size == (8, 8)  # the crops: the offsets its grid term saw
    graphs = predictor(*image_units(torch.zeros(1, 3, 32, 32, dtype=torch.uint8)))
    assert graphs.forward.num_nodes == 1024
    too_big = config(tmp_path, "big", max_steps=1)
    too_big.corpus.crop = 40
    with pytest.raises(ValueError, match="larger than"):
        run_pretraining(too_big)
