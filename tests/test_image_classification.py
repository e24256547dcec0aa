"""Image classification with Lightning (glomo_pyg.training.image_classification), on toy
ResNets on the CPU (seconds): the data of the earlier hand-written loop, an exact resume
after a kill at an epoch's end or a signal mid-epoch, the best validation epoch restored
and reported, refused resumes, the trainer's flags and its messages."""
import logging
import os
import signal

import lightning.pytorch as pl
import pytest
import torch

from glomo_pyg import Glomo, GlomoTransfer
from glomo_pyg.data.images import augment
from glomo_pyg.nn.resnet import GlomoResNet
from glomo_pyg.pixels import image_units
from glomo_pyg.training.checkpoints import CheckpointError, read_checkpoint
from glomo_pyg.training.image_classification import (
    ImageBatches,
    ImageTrainConfig,
    best_checkpoint_path,
    crop_maps,
    evaluate,
    precompute_propagations,
    train_image_classifier,
)
from glomo_pyg.training.interrupts import TrainingInterrupted

CONFIG = ImageTrainConfig(epochs=3, batch_size=4, lr=0.05, crop_padding=1)


def toy_data(n=12):
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 3, 8, 8), generator=g, dtype=torch.uint8)
    return images, torch.randint(0, 10, (n,), generator=g)


def toy_transfer():
    torch.manual_seed(1)
    predictor = Glomo.image(in_channels=3, height=8, width=8, hidden_channels=8, num_layers=1,
                            heads=2, cnn_layers=1, num_positions=4).to_pretrained().eval()
    return GlomoTransfer(predictor, 3, graph="learned")


def run(checkpoint=None, callbacks=(), config=CONFIG, width=4, seed=0, data=None,
        precomputed=False, transfer=False, dtype=torch.float16):
    images, labels = data or toy_data()
    transfer = toy_transfer() if precomputed or transfer else None
    torch.manual_seed(0)
    model = GlomoResNet(transfer, width=width)
    stage = {}
    if precomputed:  # (the propagations of the images and of their mirrors)
        if config.crop_target == "pixels":  # (flips only)
            config = ImageTrainConfig(**dict(vars(config), crop_padding=0))
        stage = dict(train_propagations=(precompute_propagations(model, images, dtype=dtype),
                                         precompute_propagations(model, images.flip(3),
                                                                 dtype=dtype)),
                     val_propagations=precompute_propagations(model, images[:4], dtype=dtype))
    out = train_image_classifier(model, (images, labels), (images[:4], labels[:4]), config,
                                 seed=seed, device="cpu", checkpoint=checkpoint,
                                 extra_callbacks=list(callbacks), **stage)
    return out, model


class Kill(pl.Callback):
    """At ``step``: raise (a kill: the run resumes from its last epoch's checkpoint) or
    send SIGTERM (the run writes a checkpoint and stops)."""

    def __init__(self, step, how):
        self.step, self.how = step, how

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step:
            if self.how == "signal":
                os.kill(os.getpid(), signal.SIGTERM)
            else:
                raise RuntimeError("killed")


def test_training_batches_draw_the_earlier_loops_order_and_augmentation():
    images, labels = toy_data(10)
    batches = ImageBatches(images, labels, 4, torch.Generator().manual_seed(5), flip=True,
                           crop_padding=1)
    gen = torch.Generator().manual_seed(5)
    for _ in range(2):  # the earlier loop: one generator, the order, then each batch
        order = torch.randperm(len(images), generator=gen)
        expected = [(augment(images[i], gen, crop_padding=1), labels[i])
                    for i in order.split(4)]
        got = list(batches)
        assert len(got) == len(batches) == 3
        for (x, y), batch in zip(expected, got):
            assert torch.equal(batch["images"], x) and torch.equal(batch["labels"], y)
    val = list(ImageBatches(images, labels, 4))
    assert torch.equal(torch.cat([b["labels"] for b in val]), labels)
    # precomputed propagations: a flipped image comes with its mirror's
    plain, mirrored = torch.zeros(10, 1, 1, 1, 1), torch.ones(10, 1, 1, 1, 1)
    batches = ImageBatches(images, labels, 4, torch.Generator().manual_seed(5), flip=True,
                           propagations=(plain, mirrored))
    flips = [bool(f) for batch in batches for f in batch["propagated"].flatten()]
    assert 0 < sum(flips) < 10
    for batch in batches:
        index = [int((images == x).all(dim=(1, 2, 3)).nonzero()) if not f else
                 int((images.flip(3) == x).all(dim=(1, 2, 3)).nonzero())
                 for x, f in zip(batch["images"], batch["propagated"].flatten())]
        assert torch.equal(labels[index], batch["labels"])


@pytest.mark.parametrize("how, step, precomputed",
                         [("raise", 5, False), ("signal", 5, False), ("signal", 3, False),
                          ("signal", 9, False), ("signal", 4, True)],
                         ids=["killed mid-epoch", "signal mid-epoch",
                              "signal in an epoch's last batch", "signal in the last batch",
                              "precomputed propagations, signal mid-epoch"])
def test_a_killed_or_interrupted_run_resumes_to_the_same_weights(tmp_path, how, step,
                                                                 precomputed):
    # 3 steps an epoch: a kill at step 5 loses epoch 2's first steps (resumed from the
    # epoch-1 checkpoint); a signal writes a checkpoint at its step, or after validating
    # when it comes in an epoch's last batch
    straight, a = run(str(tmp_path / "straight.ckpt"), precomputed=precomputed)
    ckpt = str(tmp_path / "run.ckpt")
    with pytest.raises(TrainingInterrupted if how == "signal" else RuntimeError) as stop:
        run(ckpt, [Kill(step, how)], precomputed=precomputed)
    if how == "signal":
        assert stop.value.checkpoint == ckpt and stop.value.step == step
    assert read_checkpoint(ckpt)["global_step"] == (3 if how == "raise" else step)
    resumed, b = run(ckpt, precomputed=precomputed)
    for key in ("val_curve", "train_loss", "best_epoch", "best_val"):
        assert resumed[key] == straight[key], key
    assert len(resumed["epoch_seconds"]) == 3
    for key, value in a.state_dict().items():  # the best epoch's weights
        assert torch.equal(value, b.state_dict()[key]), key
    last_a = read_checkpoint(str(tmp_path / "straight.ckpt"))
    last_b = read_checkpoint(ckpt)
    assert last_a["global_step"] == last_b["global_step"] == 9
    for key, value in last_a["state_dict"].items():  # the last epoch's weights
        assert torch.equal(value, last_b["state_dict"][key]), key
    # resumed once more: nothing left to train, the same result
    again, _ = run(ckpt, precomputed=precomputed)
    assert again["val_curve"] == straight["val_curve"]
    assert all(torch.equal(v, again["state"][k]) for k, v in straight["state"].items())


def test_the_best_validation_checkpoint_is_restored_and_reported(tmp_path):
    images, labels = toy_data()
    ckpt = str(tmp_path / "run.ckpt")
    out, model = run(ckpt)
    curve = out["val_curve"]
    assert len(curve) == 3 and set(out) >= {"state", "best_val", "best_epoch",
                                            "epoch_seconds", "train_loss"}
    assert out["best_epoch"] == curve.index(max(curve)) and out["best_val"] == max(curve)
    assert out["best_epoch"] < 2 and curve[2] < max(curve)  # (the case: not the last)
    best = read_checkpoint(best_checkpoint_path(ckpt))
    assert best["epoch"] == out["best_epoch"] and best_checkpoint_path(ckpt).endswith(
        "run.best.ckpt")
    weights = {k[len("model."):]: v for k, v in best["state_dict"].items()}
    last = read_checkpoint(ckpt)["state_dict"]
    assert any(not torch.equal(v, last["model." + k]) for k, v in weights.items())
    for key, value in model.state_dict().items():
        assert torch.equal(value, weights[key]) and torch.equal(value, out["state"][key])
    assert evaluate(model, images[:4], labels[:4]) == out["best_val"]
    # without a checkpoint file: the same run, the best kept in a temporary folder
    plain, _ = run()
    assert plain["val_curve"] == curve and plain["best_epoch"] == out["best_epoch"]
    assert all(torch.equal(v, plain["state"][k]) for k, v in out["state"].items())


def test_a_resume_is_refused_for_another_recipe_seed_model_or_a_damaged_file(tmp_path):
    ckpt = str(tmp_path / "run.ckpt")
    run(ckpt)
    for kwargs, message in [
            (dict(config=ImageTrainConfig(epochs=5, batch_size=4, lr=0.05, crop_padding=1)),
             "another recipe or training set .changed: epochs"),
            (dict(seed=1), "changed: seed"),
            (dict(data=toy_data(16)), "changed: train"),
            (dict(width=8), "does not match this run's configuration")]:
        with pytest.raises(ValueError, match=message):
            run(ckpt, **kwargs)
    os.remove(best_checkpoint_path(ckpt))
    with pytest.raises(CheckpointError, match="the best epoch's weights .* are missing"):
        run(ckpt)
    with open(ckpt, "wb") as fh:
        fh.write(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot resume from .*run.ckpt: .*corrupt"):
        run(ckpt)


def test_bad_input_is_refused_before_training():
    images, labels = toy_data(8)
    model = GlomoResNet(None, width=4)
    cases = [((images, torch.full_like(labels, 10)), (images, labels), CONFIG, "model has 10"),
             ((images, labels), (images, labels), ImageTrainConfig(epochs=1, batch_size=2),
              "exactly one step"),
             ((images, labels[:5]), (images, labels), CONFIG, "labels"),
             ((images, labels), (images[:0], labels[:0]), CONFIG, "val must be a non-empty split"),
             ((images, labels), (images, labels), ImageTrainConfig(crop_padding=8), "crop_padding"),
             ((images, labels), (images, labels), ImageTrainConfig(lr=float("inf")),
              "lr must be a positive number, got inf"),
             ((images, labels), (images, labels), ImageTrainConfig(momentum=1),
              r"momentum must be a number in \[0, 1\), got 1")]
    for train, val, cfg, message in cases:
        with pytest.raises(ValueError, match=message):
            train_image_classifier(model, train, val, cfg, device="cpu")
    with pytest.raises(ValueError, match="crops"):
        train_image_classifier(model, (images, labels), (images, labels), CONFIG,
                               train_propagations=(images, images))
    rows = torch.zeros(5, 2, 1, 64, 3)  # (not one per image)
    with pytest.raises(ValueError, match=r"val_propagations must be .* the split's 8 images"):
        train_image_classifier(model, (images, labels), (images, labels),
                               ImageTrainConfig(crop_padding=0), val_propagations=rows)
    with pytest.raises(ValueError, match="accelerator='abacus'"):
        train_image_classifier(model, (images, labels), (images, labels), CONFIG,
                               accelerator="abacus")
    with pytest.raises(ValueError, match="trains on one device; devices 2 gives 2"):
        train_image_classifier(model, (images, labels), (images, labels), CONFIG,
                               accelerator="cpu", devices=2)


def test_the_trainer_takes_the_precision_and_accelerator_flags_and_logs_epochs(caplog):
    images, labels = toy_data(8)
    seen = {}

    class Look(pl.Callback):
        def on_train_start(self, trainer, module):
            seen.update(precision=trainer.precision, accelerator=type(trainer.accelerator))

    config = ImageTrainConfig(epochs=2, batch_size=2, lr=0.05, crop_padding=0)
    with caplog.at_level(logging.INFO, logger="glomo_pyg.training.image_classification"):
        out = train_image_classifier(GlomoResNet(None, width=4), (images, labels),
                                     (images, labels), config, accelerator="cpu",
                                     precision="bf16-mixed", extra_callbacks=[Look()])
    from lightning.pytorch.accelerators import CPUAccelerator

    assert seen == dict(precision="bf16-mixed", accelerator=CPUAccelerator)
    assert len(out["val_curve"]) == 2 and all(0 <= v <= 1 for v in out["val_curve"])
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("epoch 2/2: train loss ") for line in lines), lines
    given = []  # the deprecated log= argument still receives them
    with pytest.warns(DeprecationWarning, match=r"train_image_classifier\(log=...\)"):
        train_image_classifier(GlomoResNet(None, width=4), (images, labels), (images, labels),
                               config, device="cpu", log=given.append)
    assert [line.split(":")[0] for line in given] == ["epoch 1/2", "epoch 2/2"]


def test_a_signal_without_a_checkpoint_file_stops_the_run_writing_none(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TrainingInterrupted, match="stopped by SIGTERM") as stop:
        run(None, [Kill(2, "signal")])
    assert stop.value.checkpoint is None and os.listdir(tmp_path) == []
    assert signal.getsignal(signal.SIGTERM) is not None  # (the handlers were put back)


def test_crop_maps_moves_each_map_with_zero_fill_as_a_crop_of_the_padded_map():
    maps = torch.arange(2 * 3 * 5 * 5, dtype=torch.float32).view(2, 3, 5, 5) + 1
    corners = torch.tensor([[1, 4], [2, 2]])
    out = crop_maps(maps, corners, 2)
    assert torch.equal(out[1], maps[1])  # the centred crop: unmoved
    # image 0 moved one row down and two columns left, zeros where it left the frame
    assert torch.equal(out[0, :, 1:, :3], maps[0, :, :4, 2:])
    assert (out[0, :, 0, :] == 0).all() and (out[0, :, :, 3:] == 0).all()
    padded = torch.nn.functional.pad(maps, (2, 2, 2, 2))  # the reference: one crop each
    for b, (y, x) in enumerate(corners.tolist()):
        assert torch.equal(out[b], padded[b, :, y:y + 5, x:x + 5])
    assert torch.equal(crop_maps(maps, corners, 0), maps)


def test_precomputed_propagations_of_flipped_images_train_as_the_stage_on_the_fly():
    """The propagations precomputed in chunks are each image's own, and training with
    them (flips taking the mirrored images' rows, crops of the stage's output) is
    training with the stage computed from the flipped images at every step."""
    images, _ = toy_data()
    transfer = toy_transfer()
    model = GlomoResNet(transfer, width=4)
    # oneDNN may pick another convolution algorithm for another batch size (on some CPUs
    # the predictor's keys then move by float32 rounding, 2e-5 after the graphs): the
    # rows are compared with PyTorch's own convolution, the same for every batch size
    mkldnn = torch.backends.mkldnn
    enabled, mkldnn.enabled = mkldnn.enabled, False
    try:
        chunked = precompute_propagations(model, images.flip(3), batch_size=5,
                                          dtype=torch.float32)
        for i in (0, 7, 11):  # the reference: one flipped image at a time, by the transfer
            image = images[i:i + 1].flip(3)
            direct = transfer.propagations(model.stage_input(image), *image_units(image))
            assert torch.allclose(chunked[i], direct, atol=1e-6)  # [D, K, HW, C]
    finally:
        mkldnn.enabled = enabled
    # one epoch (the toy ResNet's training is chaotic: float rounding grows tenfold a step)
    config = ImageTrainConfig(**dict(vars(CONFIG), epochs=1, crop_target="stage"))
    marks = (torch.zeros(12, 1, 1, 1, 1), torch.ones(12, 1, 1, 1, 1))  # 1: flipped
    batches = list(ImageBatches(*toy_data(), 4, torch.Generator().manual_seed(0), flip=True,
                                crop_padding=1, propagations=marks, crop_target="stage"))
    flipped = torch.cat([b["propagated"].flatten() for b in batches])
    assert 0 < int(flipped.sum()) < 12  # (the run below: flips and not)
    corners = torch.cat([b["crop_corners"] for b in batches])
    assert corners.shape == (12, 2) and 0 <= int(corners.min()) <= int(corners.max()) <= 2
    fly, a = run(config=config, transfer=True)
    pre, b = run(config=config, precomputed=True, dtype=torch.float32)
    assert fly["val_curve"] == pre["val_curve"]
    assert fly["train_loss"] == pytest.approx(pre["train_loss"], rel=1e-4)
    for key, value in a.state_dict().items():
        assert torch.allclose(value.float(), b.state_dict()[key].float(), atol=1e-4), key


class Poison(pl.Callback):
    """NaN in the classifier's weights after optimizer step ``step``; records the
    optimizer's momentum at every step."""

    def __init__(self, step):
        self.step, self.momentum = step, []

    def on_train_batch_end(self, trainer, module, *args):
        self.momentum.append(trainer.optimizers[0].param_groups[0]["momentum"])
        if trainer.global_step == self.step:
            with torch.no_grad():
                module.model.resnet.fc.weight.fill_(float("nan"))


def test_a_diverged_run_stops_and_keeps_the_best_epoch_before_it(tmp_path):
    ckpt = str(tmp_path / "run.ckpt")
    poison = Poison(4)  # in epoch 2 (3 steps an epoch)
    out, model = run(ckpt, [poison])
    assert out["diverged_at_epoch"] == 2 and len(out["val_curve"]) == 2
    assert out["best_epoch"] == 0 and out["best_val"] == out["val_curve"][0]
    assert all(torch.isfinite(v.float()).all() for v in out["state"].values())
    assert poison.momentum == [CONFIG.momentum] * 6  # constant: the recipe's
    again, _ = run(ckpt)  # resumed: no further training
    assert again["diverged_at_epoch"] == 2 and again["val_curve"] == out["val_curve"]
    assert run()[0]["diverged_at_epoch"] is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_propagations_kept_on_the_gpu_train_as_those_in_host_memory():
    """``storage=None`` keeps the propagations beside the model; the batches gather their
    rows there, with the same training as from host memory (one epoch, float32)."""
    images, labels = toy_data()
    config = ImageTrainConfig(**dict(vars(CONFIG), epochs=1, crop_target="stage"))
    out = []
    for storage in ("cpu", None):
        torch.manual_seed(0)
        model = GlomoResNet(toy_transfer(), width=4).cuda()
        train = tuple(precompute_propagations(model, x, dtype=torch.float32, storage=storage,
                                              autocast=False) for x in (images, images.flip(3)))
        assert train[0].device.type == ("cuda" if storage is None else "cpu")
        val = precompute_propagations(model, images[:4], storage=storage, autocast=False)
        out.append(train_image_classifier(model, (images, labels), (images[:4], labels[:4]),
                                          config, device="cuda", precision="32-true",
                                          train_propagations=train, val_propagations=val))
        assert evaluate(model, images[:4], labels[:4], propagations=val) == out[-1]["best_val"]
    assert out[0]["train_loss"] == pytest.approx(out[1]["train_loss"], rel=1e-4)
