"""A PyG ``InMemoryDataset`` of samples with a graph transform's edges, made once and
cached as safetensors under a key of the transform (its predictor's digest included),
PyG's ``pre_filter`` / ``pre_transform`` and the samples: another predictor, option, hook
or sample set never reads old graphs. What it shares with
:class:`~glomo_pyg.transforms.GraphsOnDiskDataset` (the checks of samples, their digest,
the key of the hooks, the file format) has its one home here."""
from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch_geometric.data import Data, InMemoryDataset

from glomo_pyg.atomic_files import atomic_write
from glomo_pyg.digests import add_tensor, digest, weights_digest
from glomo_pyg.io.paths import check_output_folder, descriptor_path, open_regular
from glomo_pyg.transforms.base import UnitGraphs

_PREFIX = "graphs-"
#: Enters every key: a change of the file layout never reads files of the old one.
FORMAT = "glomo-graphs-dataset/3"
_STORED = ("tensors, Python numbers (bool, int, float), strings and lists of numbers and "
           "strings")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
Hook = Optional[Callable[[Data], Any]]


# ----------------------------------------------------------------------------- samples

def _plain(value: Any) -> bool:
    """Whether JSON gives ``value`` back with the same types (nested lists included)."""
    if type(value) in (str, int, float, bool):
        return True
    return type(value) is list and all(map(_plain, value))


def attribute_kind(value: Any, where: str) -> str:
    """``'tensor'``, ``'number'`` (PyG collates it into a tensor), ``'string'`` or
    ``'list'``; anything the cache could not give back as it was is refused, by name."""
    if isinstance(value, Tensor):
        if value.layout != torch.strided:
            raise TypeError(f"{where} is a {value.layout} tensor; datasets of graphs store "
                            "dense tensors (make it dense, or edge lists)")
        return "tensor"
    if isinstance(value, (bool, int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list) and any(isinstance(v, Tensor) for v in value):
        raise TypeError(f"{where} is a list of tensors; datasets of graphs store {_STORED} "
                        "(stack the tensors into one tensor attribute)")
    if isinstance(value, list) and _plain(value):
        return "list"
    hint = " (use a list)" if isinstance(value, tuple) else ""
    raise TypeError(f"{where} is a {type(value).__name__}{hint}; datasets of graphs store "
                    f"{_STORED}, kept as safetensors and JSON (never pickled)")


def check_samples(samples: Sequence[Data], start: int = 0,
                  kinds: Optional[Dict[str, str]] = None, what: str = "sample") -> Dict[str, str]:
    """Check that every sample is a ``Data`` whose attributes the cache stores, each
    sample with the attributes, and of the kinds, of the first (``kinds``, returned, when
    given: of an earlier chunk). Samples are numbered from ``start`` in messages, and
    called ``what`` (e.g. ``pre_transform``'s outputs).

    Raises:
        TypeError: a sample that is not a ``Data``, or an attribute the cache cannot store
            (:func:`attribute_kind`).
        ValueError: a sample whose attributes differ from the first's."""
    for i, data in enumerate(samples, start):
        if not isinstance(data, Data):
            raise TypeError(f"{what} {i}: expected a torch_geometric Data, got "
                            f"{type(data).__name__}")
        found = {key: attribute_kind(value, f"{what} {i}: attribute {key!r}")
                 for key, value in data.to_dict().items()}
        if kinds is None:
            kinds = found
        elif found != kinds:
            raise ValueError(f"{what} {i} has attributes {_described(found)}, the first sample "
                             f"{_described(kinds)}; PyG collates samples of one layout")
    return kinds or {}


def _described(kinds: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())) + "}"


def feed_samples(h: "hashlib._Hash", samples: Iterable[Data], start: int = 0) -> None:
    """Feed every attribute of every (checked) sample to ``h``: a tensor's name, dtype,
    shape and bytes, another value's type and JSON (so ``1``, ``1.0``, ``True`` and
    ``'1'`` differ)."""
    for i, data in enumerate(samples, start):
        for key, value in sorted(data.to_dict().items()):
            if isinstance(value, Tensor):
                add_tensor(h, f"{i}:{key}", value)
            else:
                text = json.dumps(value)
                h.update(f"{i}:{key}:{type(value).__name__}:{len(text)}:{text}".encode())


def samples_digest(samples: Sequence[Data]) -> str:
    """SHA-256 (hex) of every attribute of every sample (:func:`feed_samples`), after
    :func:`check_samples`."""
    check_samples(samples)
    h = hashlib.sha256()
    feed_samples(h, samples)
    return h.hexdigest()


# ----------------------------------------------------------------------------- hooks

def hook_identity(hook: Hook, name: str) -> Optional[str]:
    """What the key holds of a ``pre_transform`` / ``pre_filter``: its ``repr`` (memory
    addresses removed, as PyG compares them) and, for a function, its qualified name and
    code, so another function or lambda gives another key."""
    if hook is None:
        return None
    if not callable(hook):
        raise TypeError(f"{name} must be callable (or None), got {type(hook).__name__}")
    text = _ADDRESS.sub("", repr(hook))
    code = getattr(hook, "__code__", None)
    if code is not None:
        parts = (getattr(hook, "__module__", ""), getattr(hook, "__qualname__", ""),
                 code.co_code.hex(), _ADDRESS.sub("", repr(code.co_consts)), code.co_names)
        text += ":" + hashlib.sha256(repr(parts).encode()).hexdigest()
    return text


def prepared(samples: Sequence[Data], pre_filter: Hook, pre_transform: Hook,
             start: int = 0) -> List[Data]:
    """``samples`` (checked by :func:`check_samples`) that ``pre_filter`` keeps, each
    mapped by ``pre_transform`` (PyG's order); what ``pre_transform`` returns is checked
    as the samples are, named as its output.

    Raises:
        TypeError, ValueError: as :func:`check_samples`, for ``pre_transform``'s outputs."""
    kept = [d for d in samples if pre_filter is None or pre_filter(d)]
    if pre_transform is None:
        return kept
    out = [pre_transform(d) for d in kept]
    check_samples(out, start, what="pre_transform's output for kept sample")
    return out


def check_graphs(graphs: Any) -> None:
    """Refuse what is not a graph transform whose output a dataset stores."""
    if not isinstance(graphs, UnitGraphs):
        raise TypeError(f"graphs must be a graph transform of glomo_pyg.transforms, got "
                        f"{type(graphs).__name__}")
    if getattr(graphs, "hetero", False):
        raise ValueError("graphs emits HeteroData (hetero=True); a dataset of graphs stores "
                         "the Data form: give graphs with hetero=False and "
                         "transform=graphs.to_hetero to get HeteroData on access")


def settings_parts(graphs: UnitGraphs, pre_filter: Hook, pre_transform: Hook
                   ) -> Dict[str, Any]:
    """What a key holds besides the samples."""
    return {"format": FORMAT, "graphs": graphs.cache_key,
            "pre_filter": hook_identity(pre_filter, "pre_filter"),
            "pre_transform": hook_identity(pre_transform, "pre_transform")}


# ----------------------------------------------------------------------------- storage

def content_digest(key: str, tensors: Mapping[str, Tensor]) -> str:
    """SHA-256 (hex) of ``key`` and every stored tensor (name, dtype, shape, bytes): what a
    cache file records as ``content`` and is checked against before use, so a changed
    byte, a changed dtype, or another file's tensors under this key's name are never
    served."""
    return weights_digest({"format": FORMAT, "key": key}, tensors)


def check_root(root: str) -> None:
    """Refuse, by name, a dataset ``root`` (or its ``processed`` folder) that is a file."""
    for folder in (root, os.path.join(root, "processed")):
        try:
            check_output_folder(folder)
        except ValueError as err:
            raise ValueError(f"root {root!r}: {err} (a dataset's root and its processed/ "
                             "must be folders)") from None


def encode_store(data: Data, slices: Optional[Mapping[str, Tensor]],
                 metadata: Dict[str, str]) -> Tuple[bytes, str]:
    """A collated ``data`` (PyG's ``InMemoryDataset.collate``) and its ``slices`` as
    safetensors bytes: tensors as ``data.<name>``, other values (strings, lists, a single
    sample's numbers) as UTF-8 JSON in a ``uint8`` tensor ``json.<name>`` (no limit on
    the header's size), slices as ``slices.<name>``; ``metadata`` (with its ``key``) plus
    their :func:`content_digest` as ``content``. Returns the bytes and that digest."""
    from safetensors.torch import save

    tensors: Dict[str, Tensor] = {}
    for key, value in data.to_dict().items():
        if isinstance(value, Tensor):
            tensors[f"data.{key}"] = value.as_subclass(Tensor).contiguous()
        else:  # (checked plain by check_samples)
            text = json.dumps(value).encode()
            tensors[f"json.{key}"] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    for key, value in (slices or {}).items():
        tensors[f"slices.{key}"] = value.contiguous()
    content = content_digest(metadata["key"], tensors)
    return save(tensors, metadata=dict(metadata, content=content)), content


def decode_json(tensor: Tensor) -> Any:
    """The value :func:`encode_store` wrote as ``json.<name>``."""
    return json.loads(bytes(tensor.numpy()).decode())


def read_tensors(path: str, key: str) -> Tuple[Dict[str, Tensor], Dict[str, str]]:
    """Every tensor and the metadata of a file :func:`encode_store` wrote under ``key``,
    opened as a regular file without blocking (a FIFO, device or folder is refused) and
    checked against its recorded :func:`content_digest`; ``OSError`` / ``ValueError`` /
    ``SafetensorError`` if it is missing, damaged, changed or of another key (nothing is
    unpickled)."""
    from safetensors import safe_open

    fd = open_regular(path, "graph cache")
    try:
        with safe_open(descriptor_path(fd, path), "pt") as f:
            metadata = f.metadata() or {}
            if metadata.get("key") != key:
                raise ValueError("the file was written under another key")
            # (memory-mapped, not copied: the library replaces a cache file whole, never
            # edits one in place, so the pages checked are the pages served)
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    finally:
        os.close(fd)
    if metadata.get("content") != content_digest(key, tensors):
        raise ValueError("its content differs from the digest recorded when it was written")
    return tensors, metadata


def read_store(path: str, key: str) -> Tuple[Data, Optional[Dict[str, Tensor]], Dict[str, str]]:
    """``(data, slices, metadata)`` of a file :func:`encode_store` wrote under ``key``,
    read and checked by :func:`read_tensors`."""
    tensors, metadata = read_tensors(path, key)
    parts: Dict[str, Dict[str, Any]] = {"data": {}, "slices": {}, "json": {}}
    for name, t in tensors.items():
        kind, _, attr = name.partition(".")
        if kind not in parts:
            raise ValueError(f"unexpected entry {name!r}")
        parts[kind][attr] = t
    values = dict(parts["data"], **{k: decode_json(t) for k, t in parts["json"].items()})
    return Data.from_dict(values), parts["slices"] or None, metadata


# ----------------------------------------------------------------------------- dataset

class GraphsDataset(InMemoryDataset):
    r"""``samples`` with ``graphs``' edges (:class:`~glomo_pyg.transforms.GlomoGraphs` or
    a fixed graph), as a PyG ``InMemoryDataset``.

    As in PyG, ``pre_filter`` drops samples and ``pre_transform`` maps the others before
    the dataset is made (here: before the graphs are, so it may, e.g., encode a text into
    ``x``), and ``transform`` maps each sample on access. The graphs are made once,
    ``graphs.batch_size`` samples per predictor call, and stored in
    ``root/processed/graphs-<key>.safetensors``, where ``key`` digests the transform
    (:attr:`~glomo_pyg.transforms.UnitGraphs.cache_key`: the predictor's weights and every
    option), ``pre_filter`` and ``pre_transform`` (:func:`hook_identity`) and every
    attribute of every sample; a later dataset with the same key loads them without
    running the predictor or the hooks, any other key makes its own file. The file is
    read as safetensors (nothing is unpickled), opened as a regular file (a FIFO at its
    path is refused, never waited on), and its recorded key and the SHA-256 of its whole
    content (every tensor's dtype, shape and bytes, under the key) are compared before
    use; a damaged, edited or foreign file is rebuilt.

    Samples may hold what a PyG ``InMemoryDataset`` holds: tensors, numbers, strings and
    lists of numbers and strings; they come back as from one (a number of one sample
    among several as a one-element tensor, ``Data(y=1)`` as ``y=tensor([1])``; a string
    as the string). Non-tensor values are stored as JSON inside the file.

    Args:
        root: the dataset folder (``processed/`` is made inside).
        samples: ``Data`` objects (``x`` as the transform reads it, after
            ``pre_transform``; ``y``, ...).
        graphs: the graph transform.
        transform: applied on access, as in PyG.
        pre_transform: maps each kept sample before its graphs are made.
        pre_filter: keeps the samples for which it is true.
        force_reload: rebuild even if a cache exists.
    """

    def __init__(self, root: str, samples: Sequence[Data], graphs: UnitGraphs,
                 transform: Optional[Callable] = None, pre_transform: Hook = None,
                 pre_filter: Hook = None, force_reload: bool = False, log: bool = False):
        check_graphs(graphs)
        check_root(root)
        if isinstance(samples, (Data, str)) or not isinstance(samples, Iterable):
            raise TypeError(f"samples must be a sequence of torch_geometric Data, got "
                            f"{type(samples).__name__}")
        self.samples, self.graphs = list(samples), graphs
        if not self.samples:
            raise ValueError("GraphsDataset needs at least one sample")
        parts = settings_parts(graphs, pre_filter, pre_transform)
        self.key = digest(dict(parts, samples=samples_digest(self.samples)))[:32]
        # No `process` or `download` here: PyG's Dataset then never runs its `_process`,
        # which unpickles processed/pre_transform.pt and pre_filter.pt (torch.load with
        # weights_only=False) to compare the hooks; the key does that job, and the cache
        # is this class's own safetensors file.
        super().__init__(root, transform, pre_transform, pre_filter, force_reload=force_reload,
                         log=log)
        if force_reload or not self._read():
            self._build()
            self._read(strict=True)

    @property
    def raw_file_names(self) -> List[str]:
        return []

    @property
    def processed_file_names(self) -> List[str]:
        return [f"{_PREFIX}{self.key}.safetensors"]

    def _build(self) -> None:
        samples = prepared(self.samples, self.pre_filter, self.pre_transform)
        if not samples:
            raise ValueError(f"pre_filter kept none of the {len(self.samples)} samples")
        # (checked: the samples by __init__, pre_transform's outputs by prepared)
        data, slices = self.collate(self.graphs(samples))
        payload, _ = encode_store(data, slices, {
            "key": self.key, "format": FORMAT, "relations": json.dumps(self.graphs.relations)})
        with atomic_write(self.processed_paths[0], "wb") as fh:
            fh.write(payload)

    def _read(self, strict: bool = False) -> bool:
        """Load the cache; ``False`` if it is missing, damaged or of another key."""
        from safetensors import SafetensorError

        try:
            data, slices, _ = read_store(self.processed_paths[0], self.key)
        except (OSError, ValueError, SafetensorError) as err:
            if strict:
                raise RuntimeError(f"could not read back {self.processed_paths[0]}: {err}") \
                    from err
            return False
        self.data, self.slices = data, slices
        self._data_list = None
        return True

    @property
    def relations(self) -> List[str]:
        return self.graphs.relations
