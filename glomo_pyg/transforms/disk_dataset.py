"""A PyG ``Dataset`` of samples with a graph transform's edges for corpora larger than
memory: the samples are streamed, their graphs made and written chunk by chunk (one
safetensors file each, resumable), and read back one sample at a time."""
from __future__ import annotations

import bisect
import collections
import hashlib
import json
import logging
import os
import re
from itertools import islice
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.data import Data, Dataset
from torch_geometric.data.collate import collate

from glomo_pyg.atomic_files import atomic_write
from glomo_pyg.digests import digest
from glomo_pyg.io.paths import descriptor_path, open_regular
from glomo_pyg.transforms.base import UnitGraphs
from glomo_pyg.transforms.dataset import (
    FORMAT,
    Hook,
    check_graphs,
    check_root,
    check_samples,
    decode_json,
    encode_store,
    feed_samples,
    prepared,
    read_tensors,
    settings_parts,
)

logger = logging.getLogger(__name__)

Samples = Union[Iterable[Data], Callable[[], Iterable[Data]]]
_CHUNK = re.compile(r"chunk-([0-9]+)\.safetensors")


class _Chunk:
    """One chunk file opened for reading: its safetensors handle (memory-mapped: a sample
    reads only its own slice of each tensor), its slices and its JSON values. ``content``
    is the digest the file held when the dataset checked it whole (on opening)."""

    def __init__(self, path: str, key: str, content: str):
        from safetensors import safe_open

        fd = open_regular(path, "graph cache chunk")
        try:
            self.handle = safe_open(descriptor_path(fd, path), "pt")
        finally:
            os.close(fd)
        metadata = self.handle.metadata() or {}
        if metadata.get("key") != key or metadata.get("content") != content:
            raise ValueError(f"{path} was replaced since the dataset was opened (another "
                             "key or content); open the dataset again")
        names = list(self.handle.keys())
        self.slices = {n[7:]: self.handle.get_tensor(n).tolist() for n in names
                       if n.startswith("slices.")}
        self.values = {n[5:]: decode_json(self.handle.get_tensor(n)) for n in names
                       if n.startswith("json.")}
        self.tensors = {n[5:] for n in names if n.startswith("data.")}

    def sample(self, j: int) -> Data:
        """Sample ``j`` of the chunk, as PyG's ``separate`` gives it from the collated
        chunk: each tensor narrowed along its concatenation dimension."""
        out = Data()
        for name, bounds in self.slices.items():
            start, end = bounds[j], bounds[j + 1]
            if name in self.tensors:
                part = self.handle.get_slice(f"data.{name}")
                dim = out.__cat_dim__(name, torch.empty(0)) % len(part.get_shape())
                # (a copy: a view would keep the chunk's memory map alive, and see the file
                # change under it)
                out[name] = part[(slice(None),) * dim + (slice(start, end),)].clone()
            else:
                out[name] = self.values[name][j]
        if "_num_nodes" in self.values:  # (samples that set num_nodes themselves)
            out.num_nodes = self.values["_num_nodes"][j]
        return out


class GraphsOnDiskDataset(Dataset):
    r"""``samples`` with ``graphs``' edges as a PyG ``Dataset`` kept on disk, for corpora
    that do not fit in memory (:class:`~glomo_pyg.transforms.GraphsDataset` holds them
    all in memory).

    The samples (a list, a generator or other iterable, or a function returning one) are
    read once per opening, ``chunk_size`` at a time. For each chunk, PyG's ``pre_filter``
    and ``pre_transform`` are applied and the graphs made (``graphs.batch_size`` samples
    per predictor call), then written atomically to
    ``root/processed/graphs-ondisk-<settings>/chunk-<i>.safetensors``: ``settings``
    digests the transform (:attr:`~glomo_pyg.transforms.UnitGraphs.cache_key`), the hooks
    and ``chunk_size``, and each chunk records a key of the settings and its samples'
    digest. A chunk whose file holds its key is reused without running the predictor, so
    a build that was interrupted resumes where it stopped, and another sample set never
    reads old graphs; a missing, damaged, edited or foreign chunk (its key, or the SHA-256
    of its whole content recorded when written, differs) is made again. Nothing is
    unpickled (PyG's own ``_process`` is never run: this class defines no ``process``).

    Samples are read lazily: ``dataset[i]`` opens its chunk (memory-mapped; the
    ``cache_chunks`` most recent stay open) and reads only that sample's slices. They
    hold what :class:`~glomo_pyg.transforms.GraphsDataset` holds and come back as from
    it (``Data(y=1)`` as ``y=tensor([1])``, a string as the string). Usable with PyG's
    ``DataLoader`` (workers included: a copy reopens its chunks).

    Memory while building is one chunk's samples and graphs; the whole corpus is never
    held.

    Args:
        root: the dataset folder (``processed/`` is made inside).
        samples: ``Data`` objects, or a function of no argument returning them.
        graphs: the graph transform.
        chunk_size: samples per file (at least 1).
        transform: applied on access, as in PyG.
        pre_transform: maps each kept sample before its graphs are made.
        pre_filter: keeps the samples for which it is true.
        cache_chunks: chunk files kept open for reading (at least 1).
        force_reload: make every chunk again.
        log: one INFO record per chunk (logger ``glomo_pyg.transforms.disk_dataset``).
    """

    def __init__(self, root: str, samples: Samples, graphs: UnitGraphs,
                 chunk_size: int = 1024, transform: Optional[Callable] = None,
                 pre_transform: Hook = None, pre_filter: Hook = None, cache_chunks: int = 4,
                 force_reload: bool = False, log: bool = False):
        check_graphs(graphs)
        check_root(root)
        for name, value in (("chunk_size", chunk_size), ("cache_chunks", cache_chunks)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        stream = _stream(samples)
        self.graphs, self.chunk_size, self.cache_chunks = graphs, chunk_size, cache_chunks
        self.settings = digest(dict(settings_parts(graphs, pre_filter, pre_transform),
                                    chunk_size=chunk_size))[:32]
        # (no `process` / `download`: PyG's Dataset runs neither its `_process`, which
        # unpickles processed/pre_transform.pt, nor `_download`)
        super().__init__(root, transform, pre_transform, pre_filter, log=log,
                         force_reload=force_reload)
        self._cache: "collections.OrderedDict[int, _Chunk]" = collections.OrderedDict()
        self._keys: List[str] = []
        self._contents: List[str] = []  # each chunk file's content digest, checked whole
        self._ends: List[int] = []  # samples up to the end of each chunk
        self._build(stream)
        self.key = digest({"settings": self.settings, "chunks": self._keys})[:32]

    # --------------------------------------------------------------------- PyG Dataset
    @property
    def raw_file_names(self) -> List[str]:
        return []

    @property
    def processed_file_names(self) -> List[str]:
        return [os.path.relpath(self.chunk_path(i), self.processed_dir)
                for i in range(len(self._keys))]

    @property
    def folder(self) -> str:
        """The folder of this dataset's chunk files."""
        return os.path.join(self.processed_dir, f"graphs-ondisk-{self.settings}")

    def chunk_path(self, index: int) -> str:
        return os.path.join(self.folder, f"chunk-{index:06d}.safetensors")

    def len(self) -> int:
        return self._ends[-1] if self._ends else 0

    def get(self, idx: int) -> Data:
        if not 0 <= idx < self.len():
            raise IndexError(f"index {idx} is out of range for {self.len()} samples")
        c = bisect.bisect_right(self._ends, idx)
        return self._chunk(c).sample(idx - (self._ends[c - 1] if c else 0))

    @property
    def relations(self) -> List[str]:
        return self.graphs.relations

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = collections.OrderedDict()  # (open files stay with their process)
        return state

    # --------------------------------------------------------------------- reading
    def _chunk(self, c: int) -> _Chunk:
        chunk = self._cache.get(c)
        if chunk is None:
            chunk = _Chunk(self.chunk_path(c), self._keys[c], self._contents[c])
            self._cache[c] = chunk
            while len(self._cache) > self.cache_chunks:
                self._cache.popitem(last=False)
        self._cache.move_to_end(c)
        return chunk

    # --------------------------------------------------------------------- building
    def _build(self, stream: Iterator[Data]) -> None:
        kinds: Optional[Dict[str, str]] = None
        total = 0
        while True:
            raw = list(islice(stream, self.chunk_size))
            if not raw:
                break
            kinds = check_samples(raw, total, kinds)
            h = hashlib.sha256(f"{self.settings}:{len(self._keys)}".encode())
            feed_samples(h, raw, total)
            key = h.hexdigest()[:32]
            found = None if self.force_reload else self._reusable(len(self._keys), key)
            reused = found is not None
            count, content = found if found is not None else \
                self._write(len(self._keys), key, raw, total)
            self._keys.append(key)
            self._contents.append(content)
            self._ends.append((self._ends[-1] if self._ends else 0) + count)
            total += len(raw)
            if self.log:
                logger.info(f"chunk {len(self._keys) - 1}: {count} of {len(raw)} samples "
                            f"kept, {'reused' if reused else 'made'}")
        if not total:
            raise ValueError("GraphsOnDiskDataset needs at least one sample")
        if not self.len():
            raise ValueError(f"pre_filter kept none of the {total} samples")
        self._remove_stale()

    def _reusable(self, index: int, key: str) -> Optional[Tuple[int, str]]:
        """The sample count and content digest of chunk ``index``'s file if it holds
        ``key`` and its whole content matches its digest (:func:`read_tensors`; a missing,
        cut, damaged, edited or foreign file: ``None``)."""
        from safetensors import SafetensorError

        try:
            _, metadata = read_tensors(self.chunk_path(index), key)
            if metadata.get("format") != FORMAT:
                return None
            return int(metadata["count"]), metadata["content"]
        except (OSError, ValueError, KeyError, SafetensorError):
            return None

    def _write(self, index: int, key: str, raw: List[Data], start: int) -> Tuple[int, str]:
        samples = prepared(raw, self.pre_filter, self.pre_transform, start)
        check_samples(samples, start)
        data, slices = _collated(self.graphs(samples)) if samples else (Data(), {})
        payload, content = encode_store(data, slices, {
            "key": key, "format": FORMAT, "count": str(len(samples)),
            "relations": json.dumps(self.graphs.relations)})
        with atomic_write(self.chunk_path(index), "wb") as fh:
            fh.write(payload)
        return len(samples), content

    def _remove_stale(self) -> None:
        """Remove chunk files past the last chunk (a longer sample set's)."""
        for name in os.listdir(self.folder):
            match = _CHUNK.fullmatch(name)
            if match and int(match[1]) >= len(self._keys):
                os.unlink(os.path.join(self.folder, name))


def _collated(samples: List[Data]) -> Tuple[Data, Dict[str, Tensor]]:
    """PyG's ``InMemoryDataset`` storage of ``samples``, with slices even for one sample
    (so a chunk of one reads as one of many)."""
    data, slices, _ = collate(Data, data_list=samples, increment=False, add_batch=False)
    return data, slices


def _stream(samples: Samples) -> Iterator[Data]:
    """An iterator over ``samples`` (called first if it is a function)."""
    if callable(samples) and not isinstance(samples, Iterable):
        samples = samples()
    if isinstance(samples, (Data, str, bytes)) or not isinstance(samples, Iterable):
        raise TypeError(f"samples must be an iterable of torch_geometric Data or a function "
                        f"returning one, got {type(samples).__name__}")
    return iter(samples)
