"""Archives a slice carries, and the data formats built from them on the GPU machine.

The archives are those of the project's data folder (CIFAR-10 as JPEG, Tiny ImageNet
32x32 in two shards, IMDB, UD English-EWT); a call carries at most 64 MiB, so a pixel
slice carries one ImageNet shard (50,000 images). :func:`build` turns each archive into
the format the loaders read (``glomo_pyg.data.images.load_cifar10`` and
``load_imagenet32``, the aclImdb and CoNLL-U folders), idempotently.
:func:`write_toy_archives` writes archives of the same layout with a few random images
or documents, for the CPU dry run.
"""
from __future__ import annotations

import io
import os
import pickle
import tarfile
import time
from typing import Dict, List

import numpy as np

CIFAR = "cifar-10-jpeg.tar.gz"
IMAGENET = ("tiny-imagenet-32-train-0.tar.gz", "tiny-imagenet-32-train-1.tar.gz")
IMDB = "aclImdb.tar.xz"
EWT = "ud-english-ewt-2.16.tar.xz"
ARCHIVES = (CIFAR, *IMAGENET, IMDB, EWT)


def _row(data: bytes) -> np.ndarray:
    from PIL import Image

    a = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.uint8)
    return a.transpose(2, 0, 1).reshape(-1)  # colour planes, as CIFAR stores them


def _dump(path: str, batch: Dict) -> None:
    with open(path + ".tmp", "wb") as fh:
        pickle.dump(batch, fh, protocol=4)
    os.replace(path + ".tmp", path)


def _build_cifar(archive: str, dest: str) -> str:
    out = os.path.join(dest, "cifar-10-batches-py")
    if os.path.exists(os.path.join(out, "test_batch")):
        return out
    os.makedirs(out, exist_ok=True)
    files, labels = {}, {}
    with tarfile.open(archive) as tf:
        for m in tf:
            if not m.isfile():
                continue
            name, data = m.name.split("/", 1)[1], tf.extractfile(m).read()
            if name.endswith("_labels.txt"):
                labels[name[:-len("_labels.txt")]] = [
                    int(line.split()[1]) for line in data.decode().splitlines() if line]
            elif name.endswith(".jpg"):
                files[name] = data
    for split, batches in (("train", 5), ("test", 1)):
        rows = np.stack([_row(files[f"{split}/{i:05d}.jpg"]) for i in range(len(labels[split]))])
        per = len(rows) // batches
        for b in range(batches):
            name = f"data_batch_{b + 1}" if split == "train" else "test_batch"
            part = slice(b * per, (b + 1) * per)
            _dump(os.path.join(out, name), {b"batch_label": name.encode(),
                                            b"labels": labels[split][part],
                                            b"data": rows[part]})
    return out


def _build_imagenet(archive: str, shard: int, dest: str) -> str:
    out = os.path.join(dest, "imagenet32")
    target = os.path.join(out, f"train_data_batch_{shard + 1}")
    if os.path.exists(target):
        return out
    os.makedirs(out, exist_ok=True)
    rows, labels, wnids = [], [], None
    with tarfile.open(archive) as tf:
        members = [m for m in tf if m.isfile()]
        for m in members:
            if m.name.endswith("wnids.txt"):
                wnids = tf.extractfile(m).read().decode().split()
        index = {w: i + 1 for i, w in enumerate(wnids)}  # 1-based, as Downsampled ImageNet
        for m in sorted(members, key=lambda m: m.name):
            if m.name.endswith(".jpg"):
                rows.append(_row(tf.extractfile(m).read()))
                labels.append(index[m.name.split("/")[-2]])
    data = np.stack(rows)
    _dump(target, {"data": data, "labels": labels, "mean": data.mean(0)})
    return out


def _extract(archive: str, dest: str, folder: str) -> str:
    out = os.path.join(dest, folder)
    if not os.path.isdir(out):
        with tarfile.open(archive) as tf:
            tf.extractall(dest, filter="data")
    return out


def build(archives: List[str], dest: str, log=print) -> Dict[str, str]:
    """Build every archive in ``archives`` (paths) into ``dest``; returns ``{archive
    name: built folder}``. Archives of another name are refused."""
    built = {}
    for path in archives:
        name = os.path.basename(path)
        start = time.time()
        if name == CIFAR:
            built[name] = _build_cifar(path, dest)
        elif name in IMAGENET:
            built[name] = _build_imagenet(path, IMAGENET.index(name), dest)
        elif name == IMDB:
            built[name] = _extract(path, dest, "aclImdb")
        elif name == EWT:
            built[name] = _extract(path, dest, "ud-english-ewt")
        else:
            raise ValueError(f"{path}: not an archive of the project's data "
                             f"({', '.join(ARCHIVES)})")
        log(f"data: {name} -> {built[name]} ({time.time() - start:.0f} s)")
    return built


def _jpeg(rng: np.random.Generator) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def _toy_treebank(rng: np.random.Generator, words: List[str], sentences: int) -> str:
    """CoNLL-U text of ``sentences`` random dependency trees (one root each) over
    ``words``."""
    out = []
    for s in range(sentences):
        n = int(rng.integers(4, 12))
        order = (rng.permutation(n) + 1).tolist()  # each word attaches to one before it
        heads = {order[0]: 0}
        for k in range(1, n):
            heads[order[k]] = order[int(rng.integers(0, k))]
        out.append(f"# sent_id = toy-{s}")
        for i in range(1, n + 1):
            head, word = heads[i], str(rng.choice(words))
            out.append(f"{i}\t{word}\t{word}\tX\t_\t_\t{head}\t{'root' if head == 0 else 'dep'}"
                       "\t_\t_")
        out.append("")
    return "\n".join(out) + "\n"


def write_toy_archives(names: List[str], folder: str, images: int = 40) -> List[str]:
    """Archives named ``names`` in ``folder``, laid out as the real ones, holding a few
    random 32x32 images (CIFAR: ``images`` per split; ImageNet: ``images`` per shard),
    reviews (IMDB: ``images // 2`` per folder) or dependency trees (UD English-EWT:
    ``images // 2`` sentences in each of train and dev)."""
    rng = np.random.default_rng(0)
    os.makedirs(folder, exist_ok=True)
    paths = []
    for name in names:
        path = os.path.join(folder, name)
        if name == CIFAR:
            with tarfile.open(path, "w:gz") as tf:
                for split in ("train", "test"):
                    n = images if split == "train" else images // 2
                    for i in range(n):
                        _add(tf, f"cifar-10-jpeg/{split}/{i:05d}.jpg", _jpeg(rng))
                    _add(tf, f"cifar-10-jpeg/{split}_labels.txt",
                         "".join(f"{i:05d}.jpg {i % 10}\n" for i in range(n)).encode())
                _add(tf, "cifar-10-jpeg/classes.txt",
                     "".join(f"c{i}\n" for i in range(10)).encode())
        elif name in IMAGENET:
            wnids = ["n00000001", "n00000002"]
            with tarfile.open(path, "w:gz") as tf:
                _add(tf, "tiny-imagenet-32/wnids.txt", "\n".join(wnids).encode())
                for i in range(images):
                    w = wnids[i % 2]
                    _add(tf, f"tiny-imagenet-32/train/{w}/{w}_{i}.jpg", _jpeg(rng))
        elif name == IMDB:  # reviews whose sentiment a model can learn from a few words
            words = ("the a this movie film was is and of it story actor plot scene time "
                     "really very just one its").split()  # (words the real vocabulary has)
            cue = {"pos": ["great", "wonderful"], "neg": ["awful", "boring"], "unsup": ["so"]}
            with tarfile.open(path, "w:xz") as tf:
                for split, kinds in (("train", ("pos", "neg", "unsup")), ("test", ("pos", "neg"))):
                    for kind in kinds:
                        rating = {"pos": 8, "neg": 2, "unsup": 0}[kind]
                        for i in range(images // 2):
                            text = " ".join(rng.choice(words + cue[kind], 24).tolist()) + "."
                            _add(tf, f"aclImdb/{split}/{kind}/{i}_{rating}.txt", text.encode())
        elif name == EWT:  # random trees over the toy reviews' words
            words = ("the a this movie film was is and of it story actor plot scene time "
                     "really very just one its").split()
            with tarfile.open(path, "w:xz") as tf:
                for split in ("train", "dev"):
                    _add(tf, f"ud-english-ewt/en_ewt-ud-{split}.conllu",
                         _toy_treebank(rng, words, images // 2).encode())
        else:
            raise ValueError(f"no toy version of {name}")
        paths.append(path)
    return paths
