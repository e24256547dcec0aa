"""MoCo pretraining (glomo_pyg.training.moco) against direct computations: InfoNCE by
hand, the key encoder as the moving average of the query encoder, the queue as the last K
keys; the augmentations, the encoder, exact resume, and bad input."""
import copy
import logging
import math

import pytest
import torch
import torch.nn.functional as F

from glomo_pyg.nn.image_encoder import ImageEncoder
from glomo_pyg.training.moco import (
    MoCo,
    MocoConfig,
    info_nce,
    load_encoder,
    pretrain_moco,
    random_views,
)


def tiny_moco(queue_size=5, momentum=0.9):
    torch.manual_seed(0)
    return MoCo(ImageEncoder(channels=(4, 4, 6), groups=2), dim=3, queue_size=queue_size,
                momentum=momentum, temperature=0.5)


def images(n=4, size=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)


def test_info_nce_is_the_hand_computed_loss():
    q = F.normalize(torch.tensor([[1.0, 0.0], [0.6, 0.8]]), dim=1)
    k = F.normalize(torch.tensor([[0.8, 0.6], [0.0, 1.0]]), dim=1)
    queue = F.normalize(torch.tensor([[-1.0, 0.0], [0.0, -1.0], [1.0, 1.0]]), dim=1)
    t = 0.07
    want = 0.0
    for b in range(2):
        positive = math.exp(float(q[b] @ k[b]) / t)
        negatives = sum(math.exp(float(q[b] @ n) / t) for n in queue)
        want += -math.log(positive / (positive + negatives)) / 2
    assert float(info_nce(q, k, queue, t)) == pytest.approx(want, rel=1e-5)


def test_key_encoder_is_the_moving_average_and_the_queue_holds_the_last_keys_oldest_first():
    model = tiny_moco(queue_size=5, momentum=0.9)
    optimizer = torch.optim.SGD(model.query.parameters(), lr=0.5)
    ema = [p.detach().clone() for p in model.key.parameters()]
    for p, q in zip(ema, model.query.parameters()):
        assert torch.equal(p, q)  # the key encoder starts as a copy
    keys = []
    for step in range(3):
        v1, v2 = images(seed=2 * step), images(seed=2 * step + 1)
        loss = model(v1, v2)
        ema = [0.9 * e + 0.1 * q.detach() for e, q in zip(ema, model.query.parameters())]
        for e, k in zip(ema, model.key.parameters()):
            torch.testing.assert_close(k, e)
        with torch.no_grad():
            keys.append(F.normalize(model.key(v2), dim=1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert all(p.grad is None for p in model.key.parameters())  # never trained directly
    torch.testing.assert_close(model.ordered_queue(), torch.cat(keys)[-5:])  # 12 keys, K = 5
    assert int(model.queue_ptr) == 12 % 5


def test_the_loss_uses_the_queue_before_this_batch_joins_it():
    model = tiny_moco(queue_size=8)
    before = model.queue.clone()
    v1, v2 = images(seed=1), images(seed=2)
    probe = copy.deepcopy(model)
    loss = model(v1, v2)
    with torch.no_grad():
        probe.momentum_update()
        q = F.normalize(probe.query(v1), dim=1)
        k = F.normalize(probe.key(v2), dim=1)
    torch.testing.assert_close(loss, info_nce(q, k, before, 0.5))


def test_random_views_are_uint8_seeded_and_only_flip_without_crop_or_colour():
    x = images(n=6, size=8)
    a = random_views(x, torch.Generator().manual_seed(0))
    b = random_views(x, torch.Generator().manual_seed(0))
    assert a.dtype == torch.uint8 and a.shape == x.shape and torch.equal(a, b)
    # without colour changes a plain-coloured image stays itself whatever the crop and flip
    flat = torch.arange(6, dtype=torch.uint8).mul(40).view(6, 1, 1, 1).expand(6, 3, 8, 8)
    plain = random_views(flat.contiguous(), torch.Generator().manual_seed(1), jitter=0.0,
                         jitter_probability=0.0, gray_probability=0.0)
    assert torch.equal(plain, flat)
    jittered = random_views(flat.contiguous(), torch.Generator().manual_seed(1),
                            jitter_probability=1.0, gray_probability=0.0)
    assert not torch.equal(jittered, flat)  # brightness moves them
    gray = random_views(x, torch.Generator().manual_seed(2), gray_probability=1.0)
    assert torch.equal(gray[:, 0], gray[:, 1]) and torch.equal(gray[:, 1], gray[:, 2])


def test_image_encoder_maps_pixels_round_trips_its_config_and_refuses_floats(tmp_path):
    encoder = ImageEncoder(channels=(4, 6, 8), groups=2)
    x = images(n=2, size=8)
    assert encoder.feature_map(x).shape == (2, 4, 8, 8)  # stage 1 keeps the resolution
    assert encoder(x).shape == (2, 8)
    rebuilt = ImageEncoder.from_config(encoder.config())
    assert rebuilt.config() == encoder.config()
    with pytest.raises(TypeError, match="uint8"):
        encoder(x.float())
    with pytest.raises(ValueError, match="three widths"):
        ImageEncoder(channels=(4, 4))
    with pytest.raises(ValueError, match="pixel_std"):
        ImageEncoder(pixel_std=(0.2, 0.0, 0.2))
    with pytest.raises(TypeError, match="ImageEncoder"):
        MoCo(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="momentum"):
        MoCo(encoder, momentum=1.0)


def config(**changes):
    base = dict(channels=(4, 4, 6), dim=3, queue_size=8, batch_size=4, max_steps=4,
                checkpoint_every=2, log_every=1, lr=0.05)
    base.update(changes)
    return MocoConfig(**base)


class KilledAtStep3(logging.Handler):
    """A kill while step 3's progress line is written (after the checkpoint of step 2)."""

    def emit(self, record):
        if "step 3/" in record.getMessage():
            raise KeyboardInterrupt


def test_pretraining_resumes_exactly_and_saves_a_loadable_encoder(tmp_path, caplog):
    data = images(n=12, size=8, seed=5)
    straight = pretrain_moco(data, config(), str(tmp_path / "a"))
    caplog.set_level(logging.INFO, logger="glomo_pyg")
    moco_logger = logging.getLogger("glomo_pyg.training.moco")
    moco_logger.addHandler(kill := KilledAtStep3())
    try:
        with pytest.raises(KeyboardInterrupt):
            pretrain_moco(data, config(), str(tmp_path / "b"))
    finally:
        moco_logger.removeHandler(kill)
    messages = []  # (the deprecated log= still receives the lines)
    with pytest.warns(DeprecationWarning, match=r"pretrain_moco\(log=...\) is deprecated"):
        resumed = pretrain_moco(data, config(), str(tmp_path / "b"), log=messages.append)
    assert "resumed at step 2" in messages[0]
    assert straight["steps"] == resumed["steps"] == 4
    assert straight["final_loss"] == pytest.approx(resumed["final_loss"], rel=1e-6)
    a, _ = load_encoder(str(tmp_path / "a"))
    b, summary = load_encoder(str(tmp_path / "b"))
    assert summary["steps"] == 4 and not a.training
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(p, q, msg=name)
    with pytest.raises(ValueError, match="other settings"):
        pretrain_moco(data, config(lr=0.1), str(tmp_path / "b"))
    # settings that do not change what is trained do not stop a resume
    again = pretrain_moco(data, config(log_every=3, threads=1), str(tmp_path / "b"))
    assert again["steps"] == 4


def test_moco_settings_refuse_bad_values():
    with pytest.raises(ValueError, match="unknown MoCo settings"):
        MocoConfig.from_dict({"batchsize": 4})
    with pytest.raises(ValueError, match="crop_scale"):
        config(crop_scale=(0.5, 0.2))
    with pytest.raises(ValueError, match="lr"):
        config(lr=0.0)
    with pytest.raises(ValueError, match="batch_size"):
        config(batch_size=0)
    with pytest.raises(ValueError, match="at least batch_size"):
        pretrain_moco(images(n=2), config(), "/nonexistent-never-written")
    with pytest.raises(TypeError, match="uint8"):
        pretrain_moco(images(n=12).float(), config(), "/nonexistent-never-written")
