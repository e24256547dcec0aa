"""Image loaders on tiny files written here: the CIFAR-10 and Downsampled-ImageNet pickle
formats, Downsampled-ImageNet's .npz release, the restricted unpickler, splits and
augmentation."""
import io
import os
import pickle
import zipfile

import numpy as np
import pytest
import torch

from glomo_pyg.data.images import (
    ImageDataError,
    UnsafePickleError,
    augment,
    load_cifar10,
    load_imagenet32,
    read_image_batch,
    safe_load,
    train_validation_split,
)


def write(path, obj):
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=4)


def cifar_folder(tmp_path, per_batch=4, side=32, byte_keys=True):
    rng = np.random.default_rng(0)
    root = tmp_path / "cifar"
    root.mkdir()
    key = (lambda s: s.encode()) if byte_keys else (lambda s: s)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3 * side * side), dtype=np.uint8)
        write(root / name, {key("data"): data, key("labels"): list(range(per_batch)),
                            key("batch_label"): name.encode()})
    return root


def test_cifar10_batches_load_as_planes_in_order(tmp_path):
    root = cifar_folder(tmp_path)
    images, labels = load_cifar10(str(root))
    assert images.shape == (20, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.tolist() == [0, 1, 2, 3] * 5
    raw = pickle.load(open(root / "data_batch_1", "rb"))[b"data"]
    # R, G, B planes of 32x32, row-major: pixel (r, c) of channel k is at k*1024 + r*32 + c
    assert images[1, 2, 3, 4].item() == raw[1, 2 * 1024 + 3 * 32 + 4]
    test_images, _ = load_cifar10(str(root), "test")
    assert test_images.shape == (4, 3, 32, 32)


def test_imagenet32_format_with_one_based_labels(tmp_path):
    root = tmp_path / "imagenet32"
    root.mkdir()
    rng = np.random.default_rng(1)
    for i in (1, 2, 10):
        data = rng.integers(0, 256, (3, 3072), dtype=np.uint8)
        write(root / f"train_data_batch_{i}", {"data": data, "labels": [1, 1000, i],
                                                "mean": data.mean(0)})
    images, labels = load_imagenet32(str(root), labels=True)
    assert images.shape == (9, 3, 32, 32)
    assert labels.tolist() == [0, 999, 0, 0, 999, 1, 0, 999, 9]  # files 1, 2, 10 in order
    first, none = load_imagenet32(str(root), max_images=4)
    assert first.shape[0] == 4 and none is None


def test_imagenet32_npz_release_loads_in_numeric_order_without_pickle(tmp_path):
    pickled, npz = tmp_path / "pickled", tmp_path / "npz"
    pickled.mkdir()
    npz.mkdir()
    rng = np.random.default_rng(2)
    for i in (1, 2, 10):
        data = rng.integers(0, 256, (3, 3072), dtype=np.uint8)
        write(pickled / f"train_data_batch_{i}", {"data": data, "labels": [1, 1000, i]})
        np.savez(npz / f"train_data_batch_{i}.npz", data=data, labels=np.array([1, 1000, i]),
                 mean=data.mean(0))
    images, labels = load_imagenet32(str(npz), labels=True)
    assert labels.tolist() == [0, 999, 0, 0, 999, 1, 0, 999, 9]  # files 1, 2, 10 in order
    want, _ = load_imagenet32(str(pickled), labels=True)
    assert torch.equal(images, want)
    valid = (npz / "train_data_batch_1.npz").read_bytes()
    # a folder holding both releases reads the python batches only (no image twice)
    for name in os.listdir(npz):
        os.replace(npz / name, pickled / name)
    assert load_imagenet32(str(pickled))[0].shape[0] == 9
    # object arrays would need pickle: refused; truncated and foreign files are named
    bad = tmp_path / "bad"
    bad.mkdir()
    np.savez(bad / "train_data_batch_1.npz", data=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ImageDataError, match="data.npy holds Python objects, which would need "
                                             "pickle"):
        load_imagenet32(str(bad))
    # a header that declares far more data than its member holds: refused before allocating
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, dict(descr="|u1", fortran_order=False,
                                                      shape=(10 ** 15,)))
    with zipfile.ZipFile(bad / "train_data_batch_1.npz", "w") as archive:
        archive.writestr("data.npy", header.getvalue() + b"\0" * 16)
    with pytest.raises(ImageDataError, match="declares 1000000000000000 bytes of data"):
        load_imagenet32(str(bad))
    with zipfile.ZipFile(bad / "train_data_batch_1.npz", "w") as archive:
        archive.writestr("readme.txt", "no arrays")
    with pytest.raises(ImageDataError, match="no arrays"):
        load_imagenet32(str(bad))
    (bad / "train_data_batch_1.npz").write_bytes(valid[:200])
    with pytest.raises(ImageDataError, match="truncated or corrupt .npz"):
        load_imagenet32(str(bad))
    (bad / "train_data_batch_1.npz").write_bytes(b"not a zip file")
    with pytest.raises(ImageDataError, match="truncated or corrupt .npz"):
        load_imagenet32(str(bad))


def test_an_npz_declaring_more_than_memory_is_refused_before_inflating(tmp_path, monkeypatch):
    import glomo_pyg.data.images as images_module

    path = tmp_path / "train_data_batch_1.npz"
    np.savez_compressed(path, data=np.zeros((64, 3072), np.uint8), labels=np.ones(64, int))
    monkeypatch.setattr(images_module, "physical_memory", lambda: 1000)
    with pytest.raises(ImageDataError, match="would take .* more than this machine's memory"):
        read_image_batch(str(path))


def test_a_malicious_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    for payload in ({"data": Evil()}, Evil(), {"data": np.zeros((1, 3), dtype=object)}):
        path = tmp_path / "batch"
        write(path, payload)
        with pytest.raises(UnsafePickleError, match="refusing"):
            safe_load(str(path))
        with pytest.raises(UnsafePickleError):
            read_image_batch(str(path))
    assert not marker.exists()
    # eval smuggled through builtins is refused too
    path = tmp_path / "eval"
    path.write_bytes(b"cbuiltins\neval\n(Vprint(1)\ntR.")
    with pytest.raises(UnsafePickleError, match="builtins.eval"):
        safe_load(str(path))


def test_corrupt_and_malformed_batches_get_named_errors(tmp_path):
    root = cifar_folder(tmp_path)
    path = root / "data_batch_3"
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])  # truncated
    with pytest.raises(ImageDataError, match="data_batch_3: truncated or corrupt"):
        load_cifar10(str(root))
    bad = tmp_path / "bad"
    write(bad, {"data": np.zeros((2, 3072), dtype=np.float32), "labels": [0, 1]})
    with pytest.raises(ImageDataError, match="uint8"):
        read_image_batch(str(bad))
    write(bad, {"data": np.zeros((2, 3000), dtype=np.uint8), "labels": [0, 1]})
    with pytest.raises(ImageDataError, match="colour planes"):
        read_image_batch(str(bad))
    write(bad, {"data": np.zeros((2, 3072), dtype=np.uint8), "labels": [0, 10]})
    with pytest.raises(ImageDataError, match="labels out of range"):
        read_image_batch(str(bad), num_classes=10)
    write(bad, {"data": np.zeros((2, 3072), dtype=np.uint8), "labels": [0]})
    with pytest.raises(ImageDataError, match="2 integers"):
        read_image_batch(str(bad))
    write(bad, {"pixels": np.zeros((2, 3072), dtype=np.uint8)})
    with pytest.raises(ImageDataError, match="no 'data' entry"):
        read_image_batch(str(bad))
    write(bad, [1, 2])
    with pytest.raises(ImageDataError, match="expected a dict"):
        read_image_batch(str(bad))
    (tmp_path / "s").mkdir()
    small = cifar_folder(tmp_path / "s", side=16)
    with pytest.raises(ImageDataError, match="3x32x32"):
        load_cifar10(str(small))
    with pytest.raises(FileNotFoundError):
        load_cifar10(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="split"):
        load_cifar10(str(root), "validation")


def test_train_validation_split_is_seeded_disjoint_and_complete():
    train, val = train_validation_split(50, 8, seed=3)
    assert len(train) == 42 and len(val) == 8
    assert sorted(torch.cat([train, val]).tolist()) == list(range(50))
    again, val2 = train_validation_split(50, 8, seed=3)
    assert torch.equal(val, val2) and torch.equal(train, again)
    assert not torch.equal(val, train_validation_split(50, 8, seed=4)[1])
    with pytest.raises(ValueError):
        train_validation_split(10, 10)


def test_augmentation_flips_and_crops_pixels():
    img = torch.arange(2 * 3 * 4 * 4, dtype=torch.uint8).view(2, 3, 4, 4)
    flipped = augment(img, torch.Generator().manual_seed(0))
    for i in range(2):
        assert torch.equal(flipped[i], img[i]) or torch.equal(flipped[i], img[i].flip(2))
    many = augment(img.repeat(32, 1, 1, 1), torch.Generator().manual_seed(0))
    assert any(torch.equal(m, img[0].flip(2)) for m in many[::2])
    cropped = augment(img, torch.Generator().manual_seed(0), flip=False, crop_padding=1)
    assert cropped.shape == img.shape and cropped.dtype == torch.uint8


def test_shared_reference_bombs_and_degenerate_arrays_are_refused_quickly(tmp_path):
    import time

    x = [0] * 60
    for _ in range(5):  # 60^6 leaves from a few KB: walking it naively takes hours
        x = [x] * 60
    data = np.zeros((2, 3072), dtype=np.uint8)
    bad = tmp_path / "bad"
    write(bad, {"data": data, "labels": [0, 1], "extra": x})
    start = time.time()
    images, labels = read_image_batch(str(bad), num_classes=10)  # each object visited once
    assert images.shape == (2, 3, 32, 32) and time.time() - start < 5
    write(bad, {"data": data, "labels": [x, x]})
    with pytest.raises(ImageDataError, match="flat list of integers"):
        read_image_batch(str(bad))
    from glomo_pyg.data.images import _check_plain

    write(bad, {"data": data, "labels": [0, 1], "extra": [[k] for k in range(3000)]})
    with pytest.raises(UnsafePickleError, match="more than 100 objects"):
        _check_plain(safe_load(str(bad)), max_nodes=100)
    write(bad, {"data": np.zeros((2, 0), dtype=np.uint8), "labels": [0, 1]})
    with pytest.raises(ImageDataError, match="colour planes"):
        read_image_batch(str(bad))
