"""Image data sets in their standard pickle formats (CIFAR-10's python batches and
Downsampled ImageNet, Chrabaszcz et al., 2017), read without trusting the pickle: see
docs/images.md for the formats and :func:`safe_load`."""
from __future__ import annotations

import os
import pickle
import zipfile
from typing import Any, Dict, List, Optional, Sequence, Tuple, cast

import numpy as np
import torch
from torch import Tensor

from glomo_pyg.io.memory import physical_memory
from glomo_pyg.settings import Rule, check_int

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck")
CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST = ("test_batch",)


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle asked for something other than plain data and numpy arrays."""


class ImageDataError(ValueError):
    """An image batch file that is truncated, corrupt or not in the expected format."""


class _ArrayClass:
    """Stands in for ``numpy.ndarray`` inside the pickle: never called to allocate."""


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
    # (numpy refuses to build an object dtype from raw bytes, so nothing can run here)
    return np.frombuffer(data, dtype=dtype, count=1)[0]


_ALLOWED = {("numpy", "ndarray"): _ArrayClass, ("numpy", "dtype"): _dtype}
for _module in ("numpy.core.multiarray", "numpy._core.multiarray"):  # numpy 1 and 2
    _ALLOWED.update({(_module, "_reconstruct"): _reconstruct, (_module, "scalar"): _scalar})


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise UnsafePickleError(f"refusing to load {module}.{name}: only plain data and "
                                    "numpy arrays are allowed in image batch files") from None


MAX_PICKLE_NODES = 1 << 22  # an ImageNet-32 batch holds about 130k labels
_PLAIN = (str, bytes, int, float, bool, type(None), np.generic, np.ndarray)


def _check_plain(obj: Any, max_depth: int = 8, max_nodes: int = MAX_PICKLE_NODES) -> None:
    """Plain data and non-object arrays only; each container walked once, ``max_nodes`` in all."""
    seen, stack, nodes = set(), [(obj, 0)], 0
    while stack:
        item, depth = stack.pop()
        container = isinstance(item, (dict, list, tuple))
        if container:
            if id(item) in seen:
                continue
            seen.add(id(item))
            children = [c for kv in item.items() for c in kv] if isinstance(item, dict) \
                else list(item)
            nodes += len(children)
            stack.extend((c, depth + 1) for c in children)
            ok = nodes <= max_nodes and not (children and depth >= max_depth)
        else:
            ok = isinstance(item, _PLAIN) and not getattr(item, "dtype", np.dtype(int)).hasobject
        if not ok:
            raise UnsafePickleError(
                f"more than {max_nodes} objects or {max_depth} levels of nesting: not an "
                "image batch file" if container else f"refusing an object of type "
                f"{type(item).__name__} (numpy object arrays included)")


def safe_load(path: str) -> Any:
    """Unpickle ``path`` allowing only plain data and numpy arrays.

    Raises:
        UnsafePickleError: anything else, before it can run.
        ImageDataError: a truncated or corrupt file."""
    with open(path, "rb") as fh:  # (a missing file stays FileNotFoundError)
        try:
            obj = _RestrictedUnpickler(fh, encoding="latin1").load()
            _check_plain(obj)
            return obj
        except Exception as e:  # unsafe, or truncated, corrupt, not a pickle, bad array state
            unsafe = isinstance(e, UnsafePickleError)
            what = "" if unsafe else f"truncated or corrupt pickle ({type(e).__name__}): "
            raise (UnsafePickleError if unsafe else ImageDataError)(
                f"{path}: {what}{e}") from None


def load_npz(path: str) -> Dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file, read without pickle; from their headers, before
    anything is allocated, object arrays and arrays larger than their zip member or
    (together) than this machine's memory are refused."""
    with open(path, "rb") as fh:  # (a missing file stays FileNotFoundError)
        try:
            with zipfile.ZipFile(fh) as archive:
                members = [i for i in archive.infolist() if i.filename.endswith(".npy")]
                headers = [_npy_header(archive, info) for info in members]
                problems = [p for _, p in headers if p]
                total, memory = sum(n for n, _ in headers), physical_memory()
                if not members:
                    problems.append("no arrays (.npy members) in this .npz")
                elif memory is not None and total > memory:
                    problems.append(f"its arrays would take {total / 2**30:.1f} GiB, more "
                                    f"than this machine's memory ({memory / 2**30:.1f} GiB)")
                if not problems:
                    return {info.filename[:-len(".npy")]: _read_npy(archive, info)
                            for info in members}
        except Exception as e:  # truncated, corrupt, encrypted, an unknown compression...
            problems = [f"truncated or corrupt .npz ({type(e).__name__}: {e})"]
    raise ImageDataError(f"{path}: {problems[0]}")


def _read_npy(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    with archive.open(info) as fh:
        return np.lib.format.read_array(fh, allow_pickle=False)


def _npy_header(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> Tuple[int, Optional[str]]:
    """The data size of one ``.npy`` member from its header alone, and what is wrong."""
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
    return nbytes, problem and f"{info.filename} {problem}"


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
    """One batch file (a pickled dict or an ``.npz`` with its entries): uint8 images
    ``[n, 3, s, s]`` and int64 ``labels - label_offset`` ``[n]`` in ``[0, num_classes)``."""
    batch = load_npz(path) if path.endswith(".npz") else safe_load(path)
    data = _field(batch, "data", path)
    ok = isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2
    side = int(round((data.shape[1] / 3) ** 0.5)) if ok else 0
    if not ok or data.shape[0] < 1 or side < 1 or 3 * side * side != data.shape[1]:
        got = f"{getattr(data, 'dtype', type(data).__name__)} {getattr(data, 'shape', '')}"
        raise ImageDataError(f"{path}: 'data' must be a uint8 [n >= 1, 3 * side^2] array (rows "
                             f"of 3 square colour planes), got {got}")
    images = torch.from_numpy(np.ascontiguousarray(data)).view(-1, 3, side, side)
    if not labels:
        return images, None
    n, raw = data.shape[0], _field(batch, "labels", path)
    # a list is checked before np.asarray: nested lists that share references would expand
    flat = not isinstance(raw, (list, tuple)) or all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in raw)
    y = np.asarray(raw) if flat else np.zeros(0)
    ok = y.ndim == 1 and y.shape[0] == n and np.issubdtype(y.dtype, np.integer)
    y = y.astype(np.int64) - label_offset if ok else y
    if not ok or (num_classes is not None and (y.min() < 0 or y.max() >= num_classes)):
        expected = "" if num_classes is None else \
            f", in {label_offset}..{num_classes - 1 + label_offset}"
        got = f"labels out of range: {y.min() + label_offset}..{y.max() + label_offset}" \
            if ok else f"{y.dtype if flat else 'nested lists'} {y.shape}"
        raise ImageDataError(f"{path}: 'labels' must be a flat list of integers ({n} integers, "
                             f"one per image{expected}), got {got}")
    return images, torch.from_numpy(y)


def _read_batches(root: str, names: Sequence[str], shape: Optional[Tuple[int, ...]] = None,
                  **kwargs) -> Tuple[Tensor, Optional[Tensor]]:
    """The batch files ``names``, their images all of ``shape`` (default: the first's)."""
    images: List[Tensor] = []
    labels: List[Optional[Tensor]] = []
    for name in names:
        path = os.path.join(root, name)
        x, y = read_image_batch(path, **kwargs)
        want = shape or (tuple(images[0].shape[1:]) if images else tuple(x.shape[1:]))
        if tuple(x.shape[1:]) != want:
            raise ImageDataError(f"{path}: images of {'x'.join(map(str, x.shape[1:]))}, "
                                 f"expected {'x'.join(map(str, want))}")
        images.append(x)
        labels.append(y)
    # (all or none: the same files' options)
    y = torch.cat(cast(List[Tensor], labels)) if labels and labels[0] is not None else None
    return torch.cat(images), y


def load_cifar10(root: str, split: str = "train") -> Tuple[Tensor, Tensor]:
    """CIFAR-10's ``split`` (``'train'`` or ``'test'``) from the python batches in ``root``
    (``cifar-10-batches-py``): uint8 ``[n, 3, 32, 32]`` images and int64 labels; another
    ``split`` is a ``ValueError``."""
    Rule(str, choices=("train", "test")).check("split", split, typed=True)
    return cast(Tuple[Tensor, Tensor],  # (labels: read by default)
                _read_batches(root, CIFAR10_TRAIN if split == "train" else CIFAR10_TEST,
                              shape=(3, 32, 32), num_classes=10))


def imagenet32_files(root: str) -> List[str]:
    """The ``train_data_batch_*`` files of a Downsampled-ImageNet folder in numeric order:
    the python batches, or (when there are none) the ``.npz`` release."""
    names = [n for n in os.listdir(root) if n.startswith("train_data_batch_")]
    names = [n for n in names if not n.endswith(".npz")] or names
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
    return images[:max_images], (None if y is None else y[:max_images])


def train_validation_split(n: int, validation: int, seed: int = 0) -> Tuple[Tensor, Tensor]:
    """Seeded disjoint ``(train, validation)`` index tensors over ``range(n)``, each sorted;
    a ``validation`` size that leaves either empty is a ``ValueError``."""
    check_int("validation", validation, 1, below=n)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return order[validation:].sort().values, order[:validation].sort().values


def augment(images: Tensor, generator: Optional[torch.Generator] = None, flip: bool = True,
            crop_padding: int = 0) -> Tensor:
    """Random horizontal flips (half of the images) and, with ``crop_padding`` p, random
    crops of the image padded by p (reflection), on uint8 ``[B, C, H, W]`` images."""
    b, _, h, w = images.shape
    out, p = images, crop_padding
    if flip:
        mask = torch.rand(b, generator=generator) < 0.5
        out = torch.where(mask.view(-1, 1, 1, 1).to(images.device), images.flip(3), images)
    if p:
        padded = torch.nn.functional.pad(out.float(), (p, p, p, p), mode="reflect").to(out.dtype)
        dy, dx = torch.randint(0, 2 * p + 1, (2, b), generator=generator).tolist()
        out = torch.stack([padded[i, :, y:y + h, x:x + w] for i, (y, x) in
                           enumerate(zip(dy, dx))])
    return out
