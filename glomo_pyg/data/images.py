"""Image data sets in their standard pickle formats, read without trusting the pickle.

* **CIFAR-10** (the official "python version": ``data_batch_1..5``, ``test_batch``): a
  dict with ``data`` uint8 ``[10000, 3072]`` (R, G, B planes of 32 x 32, row-major) and
  ``labels`` in ``0..9``.
* **Downsampled ImageNet** (Chrabaszcz et al., 2017; ``train_data_batch_*``,
  ``val_data``): ``data`` uint8 ``[n, 3 s^2]`` planes, ``labels`` 1-based, ``mean``.

Pickles can execute arbitrary code when loaded. :func:`safe_load` reads them with an
unpickler that rebuilds only plain containers (dict, list, tuple, str, bytes, numbers)
and numpy arrays of non-object dtypes; anything else (a function to call, a class to
instantiate) is refused with :class:`UnsafePickleError` before it can run.
"""
from __future__ import annotations

import io
import os
import pickle
import zipfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from glomo_pyg.io.memory import physical_memory

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck")
CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST = ("test_batch",)


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle asked for something other than plain data and numpy arrays."""


class ImageDataError(ValueError):
    """An image batch file that is truncated, corrupt or not in the expected format."""


class _ArrayClass:
    """Stands in for ``numpy.ndarray`` inside the pickle: it can only be handed to the
    guarded array reconstructor, never called to allocate."""


def _reconstruct(cls, shape, dtype_code):
    # numpy pickles an array as _reconstruct(ndarray, (0,), b'b') and then sets its
    # state (shape, dtype, raw bytes); only that exact form is accepted
    if cls is not _ArrayClass or tuple(shape) != (0,):
        raise UnsafePickleError("refusing an unusual numpy array reconstruction")
    return np.ndarray.__new__(np.ndarray, (0,), np.uint8)


def _dtype(spec, align=False, copy=False):
    if not isinstance(spec, str) or np.dtype(spec).hasobject:
        raise UnsafePickleError(f"refusing a numpy dtype built from {spec!r}: a plain type "
                                "name only (an object dtype would hold arbitrary objects)")
    return np.dtype(spec)


def _scalar(dtype, data):
    if not isinstance(dtype, np.dtype) or dtype.hasobject or not isinstance(data, bytes):
        raise UnsafePickleError("refusing an unusual numpy scalar")
    return np.frombuffer(data, dtype=dtype, count=1)[0]


_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.multiarray", "scalar"): _scalar,
    ("numpy._core.multiarray", "scalar"): _scalar,
    ("numpy", "ndarray"): _ArrayClass,
    ("numpy", "dtype"): _dtype,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise UnsafePickleError(f"refusing to load {module}.{name}: only plain data and "
                                    "numpy arrays are allowed in image batch files") from None


MAX_PICKLE_NODES = 1 << 22  # an ImageNet-32 batch holds about 130k labels


def _check_plain(obj: Any, max_depth: int = 8, max_nodes: int = MAX_PICKLE_NODES) -> None:
    """Plain containers, numbers, strings and non-object numpy arrays only. Each object is
    visited once and at most ``max_nodes`` in all: containers that share references
    (``x = [x] * 60``, nested) would otherwise take hours to walk from a few KB."""
    seen, stack, nodes = set(), [(obj, 0)], 0
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            if id(item) in seen:
                continue
            seen.add(id(item))
            children = [c for kv in item.items() for c in kv] if isinstance(item, dict) \
                else list(item)
            nodes += len(children)
            if nodes > max_nodes or (children and depth >= max_depth):
                raise UnsafePickleError(f"more than {max_nodes} objects or {max_depth} levels "
                                        "of nesting: not an image batch file")
            stack.extend((c, depth + 1) for c in children)
        elif not isinstance(item, (str, bytes, int, float, bool, type(None), np.generic,
                                   np.ndarray)) or (isinstance(item, np.ndarray) and item.dtype.hasobject):
            raise UnsafePickleError(f"refusing an object of type {type(item).__name__} "
                                    "(numpy object arrays included)")


def safe_load(path: str) -> Any:
    """Unpickle ``path`` allowing only plain containers, numbers, strings and numpy
    arrays (:class:`UnsafePickleError` otherwise, before anything runs); truncated or
    corrupt files raise :class:`ImageDataError` naming the file."""
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        obj = _RestrictedUnpickler(io.BytesIO(raw), encoding="latin1").load()
        _check_plain(obj)
    except UnsafePickleError as e:
        raise UnsafePickleError(f"{path}: {e}") from None
    except Exception as e:  # truncated, corrupt, not a pickle, bad array state
        raise ImageDataError(f"{path}: truncated or corrupt pickle ({type(e).__name__}: "
                             f"{e})") from None
    return obj


def load_npz(path: str) -> Dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file (e.g. Downsampled-ImageNet's numpy release), read
    without pickle. Each array's header is read first: object arrays (which would need
    pickle) are refused, and so are arrays larger than their zip member or, together,
    than this machine's memory, before anything is allocated."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = [i for i in archive.infolist() if i.filename.endswith(".npy")]
            if not members:
                raise ImageDataError(f"{path}: no arrays (.npy members) in this .npz")
            total = sum(_npy_bytes(archive, info, path) for info in members)
            memory = physical_memory()
            if memory is not None and total > memory:
                raise ImageDataError(f"{path}: its arrays would take {total / 2**30:.1f} GiB, "
                                     f"more than this machine's memory "
                                     f"({memory / 2**30:.1f} GiB)")
            arrays = {}
            for info in members:
                with archive.open(info) as fh:
                    arrays[info.filename[:-len(".npy")]] = np.lib.format.read_array(
                        fh, allow_pickle=False)
            return arrays
    except (ImageDataError, FileNotFoundError):  # (a missing file stays FileNotFoundError)
        raise
    except Exception as e:  # truncated, corrupt, encrypted, an unknown compression...
        raise ImageDataError(f"{path}: truncated or corrupt .npz ({type(e).__name__}: "
                             f"{e})") from None


def _npy_bytes(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: str) -> int:
    """The data size of one ``.npy`` member, from its header alone (checked)."""
    with archive.open(info) as fh:
        version = np.lib.format.read_magic(fh)
        header = {(1, 0): np.lib.format.read_array_header_1_0,
                  (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        shape, _, dtype = header(fh) if header else ((0,), False, np.dtype(np.uint8))
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    # (the zip member's size is enforced while inflating)
    problem = (f"is in .npy format {version}, not supported (1.0 or 2.0)" if header is None
               else "holds Python objects, which would need pickle to read: refused"
               if dtype.hasobject else f"declares {nbytes} bytes of data in a member of "
               f"{info.file_size}: corrupt" if nbytes > info.file_size else None)
    if problem:
        raise ImageDataError(f"{path}: {info.filename} {problem}")
    return nbytes


def _field(batch: Any, name: str, path: str) -> Any:
    """Entry ``name`` (a str or bytes key) of the batch dict."""
    for key in (name, name.encode()) if isinstance(batch, dict) else ():
        if key in batch:
            return batch[key]
    raise ImageDataError(f"{path}: no '{name}' entry (keys: {sorted(map(str, batch))[:6]})"
                         if isinstance(batch, dict) else
                         f"{path}: expected a dict, got {type(batch).__name__}")


def read_image_batch(path: str, num_classes: Optional[int] = None, label_offset: int = 0,
                     labels: bool = True) -> Tuple[Tensor, Optional[Tensor]]:
    """One batch file: ``(images, labels)``, uint8 ``[n, 3, s, s]`` and int64 ``[n]``
    (``labels - label_offset``, checked to lie in ``[0, num_classes)``). A pickled dict
    (CIFAR's and Downsampled-ImageNet's python batches) or an ``.npz`` file with the same
    entries."""
    batch = load_npz(path) if path.endswith(".npz") else safe_load(path)
    data = _field(batch, "data", path)
    ok = isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2
    side = int(round((data.shape[1] / 3) ** 0.5)) if ok else 0
    if not ok or data.shape[0] < 1 or side < 1 or 3 * side * side != data.shape[1]:
        raise ImageDataError(f"{path}: 'data' must be a uint8 [n >= 1, 3 * side^2] array (rows "
                             f"of 3 square colour planes), got "
                             f"{getattr(data, 'dtype', type(data).__name__)} "
                             f"{getattr(data, 'shape', '')}")
    images = torch.from_numpy(np.ascontiguousarray(data)).view(-1, 3, side, side)
    if not labels:
        return images, None
    raw = _field(batch, "labels", path)
    # a list is checked before np.asarray: nested lists that share references would expand
    flat = not isinstance(raw, (list, tuple)) or all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in raw)
    y = np.asarray(raw) if flat else np.zeros(0)
    if y.ndim != 1 or y.shape[0] != data.shape[0] or not np.issubdtype(y.dtype, np.integer):
        raise ImageDataError(f"{path}: 'labels' must be a flat list of integers "
                             f"({data.shape[0]} integers, one per image), got "
                             f"{y.dtype if flat else 'nested lists'} {y.shape}")
    y = torch.from_numpy(y.astype(np.int64)) - label_offset
    if num_classes is not None and y.numel() and (int(y.min()) < 0 or
                                                   int(y.max()) >= num_classes):
        raise ImageDataError(f"{path}: labels out of range: {int(y.min()) + label_offset}.."
                             f"{int(y.max()) + label_offset} (expected {label_offset}.."
                             f"{num_classes - 1 + label_offset})")
    return images, y


def _read_batches(root: str, names: Sequence[str], **kwargs) -> Tuple[Tensor, Optional[Tensor]]:
    images, labels = [], []
    for name in names:
        path = os.path.join(root, name)
        x, y = read_image_batch(path, **kwargs)
        if images and x.shape[1:] != images[0].shape[1:]:
            raise ImageDataError(f"{path}: images of {tuple(x.shape[1:])}, earlier files "
                                 f"{tuple(images[0].shape[1:])}")
        images.append(x)
        labels.append(y)
    y = torch.cat(labels) if labels and labels[0] is not None else None
    return torch.cat(images), y


def load_cifar10(root: str, split: str = "train") -> Tuple[Tensor, Tensor]:
    """CIFAR-10 from the official python batches in ``root``
    (``cifar-10-batches-py``): ``split='train'`` (50,000) or ``'test'`` (10,000) as uint8
    ``[n, 3, 32, 32]`` images and int64 labels."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    images, labels = _read_batches(root, CIFAR10_TRAIN if split == "train" else CIFAR10_TEST,
                                   num_classes=10)
    if images.shape[1:] != (3, 32, 32):
        raise ImageDataError(f"{root}: CIFAR-10 images are 3x32x32, got {tuple(images.shape[1:])}")
    return images, labels


def imagenet32_files(root: str) -> List[str]:
    """The ``train_data_batch_*`` files of a Downsampled-ImageNet folder in numeric order:
    the python batches, or (when there are none) the ``.npz`` release."""
    names = [n for n in os.listdir(root) if n.startswith("train_data_batch_")]
    plain = [n for n in names if not n.endswith(".npz")]
    names = plain or names
    if not names:
        raise FileNotFoundError(f"{root}: no train_data_batch_* files (Downsampled-ImageNet "
                                "format: python batches or .npz)")

    def number(name: str) -> Tuple[int, str]:
        tail = name[len("train_data_batch_"):].removesuffix(".npz")
        return (int(tail) if tail.isdigit() else 10 ** 9, name)

    return sorted(names, key=number)


def load_imagenet32(root: str, max_images: Optional[int] = None,
                    labels: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
    """Downsampled-ImageNet training batches in ``root`` as uint8 ``[n, 3, s, s]``
    (the first ``max_images`` when given) and, with ``labels``, 0-based int64 labels."""
    images, y = _read_batches(root, imagenet32_files(root), labels=labels, label_offset=1,
                              num_classes=1000)
    if max_images is not None:
        images = images[:max_images]
        y = y[:max_images] if y is not None else None
    return images, y


def train_validation_split(n: int, validation: int, seed: int = 0) -> Tuple[Tensor, Tensor]:
    """Seeded disjoint ``(train, validation)`` index tensors over ``range(n)``, each sorted
    (e.g. CIFAR-10's 50,000 training images as 42,000 / 8,000)."""
    if not 0 < validation < n:
        raise ValueError(f"validation must lie in (0, {n}), got {validation}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return order[validation:].sort().values, order[:validation].sort().values


def augment(images: Tensor, generator: Optional[torch.Generator] = None, flip: bool = True,
            crop_padding: int = 0) -> Tensor:
    """Random horizontal flips (half of the images) and, with ``crop_padding`` p, random
    crops of the image padded by p (reflection), on uint8 ``[B, C, H, W]`` images:
    applied to the pixels, before any graph is computed from them."""
    b, _, h, w = images.shape
    out = images
    if flip:
        mask = torch.rand(b, generator=generator) < 0.5
        out = torch.where(mask.view(-1, 1, 1, 1).to(images.device), images.flip(3), images)
    if crop_padding:
        p = crop_padding
        padded = torch.nn.functional.pad(out.float(), (p, p, p, p), mode="reflect").to(out.dtype)
        dy = torch.randint(0, 2 * p + 1, (b,), generator=generator).tolist()
        dx = torch.randint(0, 2 * p + 1, (b,), generator=generator).tolist()
        out = torch.stack([padded[i, :, y:y + h, x:x + w] for i, (y, x) in
                           enumerate(zip(dy, dx))])
    return out
