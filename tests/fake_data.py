"""Tiny data sets in the official file formats, written by the tests that run a whole
benchmark (seconds): aclImdb reviews, Downsampled-ImageNet and CIFAR-10 python batches."""
import os
import pickle
import random

import numpy as np


def write_aclimdb(root, counts=(("train", 12), ("test", 8)), unlabelled=20) -> None:
    """``root/aclImdb``: per split and label, reviews of 3 sentiment words among 15
    fillers; ``unlabelled`` filler-only reviews in ``train/unsup``."""
    rng = random.Random(0)
    for split, count in counts:
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
    for k in range(unlabelled):
        (unsup / f"{k}_0.txt").write_text(" ".join(f"filler{rng.randrange(30)}"
                                                    for _ in range(20)))


def write_image_batches(root, imagenet: int = 6, cifar: int = 4) -> None:
    """``root/imagenet32`` (two batches of ``imagenet`` images) and
    ``root/cifar-10-batches-py`` (six batches of ``cifar`` images, labels 0-3)."""
    rng = np.random.default_rng(0)
    os.makedirs(root / "imagenet32")
    for i in (1, 2):
        data = rng.integers(0, 256, (imagenet, 3072), dtype=np.uint8)
        with open(root / "imagenet32" / f"train_data_batch_{i}", "wb") as fh:
            pickle.dump({"data": data, "labels": [1] * imagenet, "mean": data.mean(0)}, fh)
    os.makedirs(root / "cifar-10-batches-py")
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (cifar, 3072), dtype=np.uint8)
        with open(root / "cifar-10-batches-py" / name, "wb") as fh:
            pickle.dump({b"data": data, b"labels": [k % 4 for k in range(cifar)]}, fh)
