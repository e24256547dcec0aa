"""Token corpora for pretraining: documents of token ids, in memory or as memory-mapped
shards on disk (format: docs/text.md), cut into training sequences the same way either
way. A malformed shard folder raises a :class:`~glomo_pyg.data.TextDataError`."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Union

import numpy as np
import torch
from torch_geometric.data import Data

from glomo_pyg.data.text import TextDataError, open_text
from glomo_pyg.settings import check_int

FORMAT, VERSION = "glomo-token-shards", 1
TOKEN_DTYPE = np.dtype("<i4")
OFFSET_DTYPE = np.dtype("<i8")
MAX_INDEX_BYTES = 1 << 26
_FILE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")
_REBUILD = "rebuild the folder with glomo_pyg.data.write_token_shards"


def _as_array(doc, vocab_size: int) -> np.ndarray:
    """A document as a 1-D array of token ids in ``[0, vocab_size)`` (checked)."""
    arr = doc.numpy() if isinstance(doc, torch.Tensor) else np.asarray(doc)
    if arr.ndim != 1 or (arr.size and (not np.issubdtype(arr.dtype, np.integer) or
                                       arr.min() < 0 or arr.max() >= vocab_size)):
        raise ValueError(f"a document must be a 1-D sequence of integer token ids, and token "
                         f"ids must lie in [0, {vocab_size}), got shape {arr.shape} of "
                         f"{arr.dtype}" + (f" in [{arr.min()}, {arr.max()}]" if arr.size and
                                           arr.ndim == 1 else ""))
    return arr


def write_token_shards(documents: Iterable, out_dir: str, vocab_size: int,
                       shard_tokens: int = 1 << 26) -> dict:
    """Write documents (sequences of token ids) as shards of about ``shard_tokens`` tokens,
    built beside ``out_dir`` and renamed into place at the end; returns the index (also
    ``out_dir/index.json``).

    Raises:
        ValueError: ``vocab_size`` or ``shard_tokens`` not a positive integer (the ids
            must fit int32), or an empty corpus (nothing is written).
        FileExistsError: ``out_dir`` exists."""
    check_int("vocab_size", vocab_size, 1, int(np.iinfo(TOKEN_DTYPE).max))
    check_int("shard_tokens", shard_tokens)
    if os.path.exists(out_dir):
        raise FileExistsError(f"{out_dir} exists; remove it or choose another folder")
    tmp = f"{out_dir.rstrip(os.sep)}.partial{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    shards: List[dict] = []
    buffer: List[np.ndarray] = []
    filled = 0

    def flush():
        nonlocal buffer, filled
        if buffer:
            k = len(shards)
            shards.append(dict(tokens=f"tokens-{k:05d}.bin", docs=f"docs-{k:05d}.bin",
                               num_tokens=int(filled), num_documents=len(buffer)))
            np.concatenate(buffer).astype(TOKEN_DTYPE, copy=False).tofile(
                os.path.join(tmp, shards[-1]["tokens"]))
            np.cumsum([b.size for b in buffer]).astype(OFFSET_DTYPE).tofile(
                os.path.join(tmp, shards[-1]["docs"]))
        buffer, filled = [], 0

    try:
        for doc in documents:
            arr = _as_array(doc, vocab_size)
            buffer.append(arr)
            filled += arr.size
            if filled >= shard_tokens:
                flush()
        flush()
        index = dict(format=FORMAT, version=VERSION, vocab_size=int(vocab_size),
                     token_dtype=TOKEN_DTYPE.str, num_tokens=sum(s["num_tokens"] for s in shards),
                     num_documents=sum(s["num_documents"] for s in shards), shards=shards)
        if not index["num_tokens"]:
            raise ValueError(f"the corpus is empty: {index['num_documents']} documents, no "
                             f"tokens; nothing written to {out_dir}")
        with open(os.path.join(tmp, "index.json"), "w") as fh:
            json.dump(index, fh, indent=1)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # (nothing left once renamed into place)
    return index


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_shard_index(path: str) -> dict:
    """The ``index.json`` of a shard folder, checked for its fields and against the files
    beside it (plain file names inside the folder, of the sizes it states)."""
    name = os.path.join(path, "index.json")

    def need(ok: object, what: str):
        if not ok:
            raise TextDataError(f"{name}: {what}; {_REBUILD}")

    try:
        with open_text(name) as fh:  # (a FIFO is refused: it would block)
            raw = fh.read(MAX_INDEX_BYTES + 1)
    except FileNotFoundError:
        raise FileNotFoundError(f"{name}: missing; not a token-shard folder "
                                "(write one with glomo_pyg.data.write_token_shards)") from None
    problem: Union[str, Exception, None]
    index: Any  # (JSON, checked field by field)
    problem = f"larger than {MAX_INDEX_BYTES} bytes" if len(raw) > MAX_INDEX_BYTES else None
    try:
        index = None if problem else json.loads(raw)
    except (ValueError, RecursionError) as err:
        index, problem = None, err
    need(problem is None and isinstance(index, dict) and index.get("format") == FORMAT,
         f"unreadable, not a JSON index ({problem})" if problem else f"not a {FORMAT} index")
    version = index.get("version")
    need(_count(version) and version >= 1, f"'version' must be a positive integer, got "
         f"{version!r}")
    need(version <= VERSION, f"format version {version} is newer than this glomo_pyg reads "
         f"({VERSION}): upgrade glomo_pyg, or")
    need(index.get("token_dtype") == TOKEN_DTYPE.str,
         f"'token_dtype' must be {TOKEN_DTYPE.str!r}, got {index.get('token_dtype')!r}")
    for key in ("vocab_size", "num_tokens", "num_documents"):
        need(_count(index.get(key)), f"{key!r} must be a non-negative integer, got "
             f"{index.get(key)!r}")
    need(1 <= index["vocab_size"] <= np.iinfo(TOKEN_DTYPE).max,
         f"vocab_size {index['vocab_size']} outside [1, 2^31)")
    shards = index.get("shards")
    need(isinstance(shards, list), f"'shards' must be a list, got {type(shards).__name__}")
    _check_shard_files(path, shards, need)
    for key in ("num_tokens", "num_documents"):
        need(sum(s[key] for s in shards) == index[key],
             f"{key!r} {index[key]} is not the sum over the shards")
    return index


def _check_shard_files(path: str, shards: List[Any], need: Callable[[object, str], None]
                       ) -> None:
    """Checks each shard's counts and files (plain names in ``path``, of the stated sizes)."""
    root, seen = os.path.realpath(path), set()
    for k, shard in enumerate(shards):
        need(isinstance(shard, dict), f"shard {k} is not an object")
        for key, dtype, count in (("tokens", TOKEN_DTYPE, shard.get("num_tokens")),
                                  ("docs", OFFSET_DTYPE, shard.get("num_documents"))):
            need(_count(count), f"shard {k}: the count of its {key!r} must be a non-negative "
                 f"integer, got {count!r}")
            file = shard.get(key)
            need(isinstance(file, str) and _FILE.fullmatch(file) and file not in seen,
                 f"shard {k}: {key!r} must be a plain file name inside the folder "
                 f"([A-Za-z0-9._-], no leading dot), used once, got {repr(file)[:100]}")
            seen.add(file)
            file = os.path.join(path, file)
            need(os.path.dirname(os.path.realpath(file)) == root,
                 f"shard {k}: {file} leads out of the shard folder (a link?)")
            size = os.path.getsize(file) if os.path.isfile(file) else -1
            need(size == count * dtype.itemsize,
                 f"shard {k}: {file} holds {max(size, 0)} bytes, expected "
                 f"{count * dtype.itemsize} ({count} values)"
                 + (" (missing)" if size < 0 else " (truncated or corrupt)"))


def _windows(ends: np.ndarray, max_length: int, min_length: int):
    """Start offsets and lengths of the windows of documents ending at ``ends``."""
    starts_doc = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    lengths_doc = ends - starts_doc
    per_doc = lengths_doc // max_length + ((lengths_doc % max_length) >= min_length)
    doc = np.repeat(np.arange(len(ends)), per_doc)
    first = np.cumsum(per_doc) - per_doc  # index of each document's first window
    k = np.arange(len(doc)) - first[doc]
    start = starts_doc[doc] + k * max_length
    length = np.minimum(max_length, ends[doc] - start)
    return start.astype(np.int64), length.astype(np.int32)


class TokenWindows(torch.utils.data.Dataset):
    """Training sequences over documents of token ids (built :meth:`from_documents` or
    :meth:`from_shards`): item ``k`` is a :class:`~torch_geometric.data.Data` with ``x``
    the ``[n]`` int64 ids of window ``k``, each document cut into windows of
    ``max_length``, a shorter last one kept if it has ``min_length``. A window holding ids
    outside ``[0, vocab_size)`` raises a :class:`~glomo_pyg.data.TextDataError` naming
    its source (``sources``: a name per array, e.g. its shard file) when read; a
    ``min_length`` below 2, a ``max_length`` below it or ``ends`` / ``sources`` not one
    per array raise a ``ValueError``, and end offsets that do not fit their array a
    :class:`~glomo_pyg.data.TextDataError`."""

    def __init__(self, arrays: Sequence[np.ndarray], ends: Sequence[np.ndarray], vocab_size: int,
                 max_length: int = 128, min_length: int = 8,
                 sources: Optional[Sequence[str]] = None):
        self.arrays, self.vocab_size = list(arrays), int(vocab_size)
        self.sources = list(sources) if sources is not None else \
            [f"token array {k}" for k in range(len(self.arrays))]
        check_int("min_length", min_length, 2, unit=" (context prediction needs two units)")
        check_int("max_length", max_length, min_length, unit=" (min_length)")
        if not len(self.arrays) == len(ends) == len(self.sources):
            raise ValueError(f"need one ends array and source per token array, got "
                             f"{len(self.arrays)} arrays, {len(ends)} ends, "
                             f"{len(self.sources)} sources")
        self.max_length, self.min_length = max_length, min_length
        windows = [(np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32))]
        for k, e in enumerate(ends):
            e = np.asarray(e, dtype=np.int64)
            if (np.diff(e, prepend=0) < 0).any() or (e[-1] if e.size else 0) != len(self.arrays[k]):
                raise TextDataError(f"{self.sources[k]}: its document end offsets (docs file) "
                                    f"are not sorted offsets ending at its "
                                    f"{len(self.arrays[k])} tokens; {_REBUILD}")
            s, n = _windows(e, max_length, min_length)
            windows.append((s, n, np.full(s.size, k, dtype=np.int32)))
        # window k: self.lengths[k] tokens from self.starts[k] of array self.shard[k]
        self.starts, self.lengths, self.shard = (np.concatenate(c) for c in zip(*windows))

    @classmethod
    def from_documents(cls, documents: Iterable, vocab_size: int, max_length: int = 128,
                       min_length: int = 8) -> "TokenWindows":
        docs = [_as_array(d, vocab_size).astype(TOKEN_DTYPE) for d in documents]
        tokens = np.concatenate(docs) if docs else np.zeros(0, TOKEN_DTYPE)
        ends = np.cumsum([d.size for d in docs]).astype(np.int64)
        return cls([tokens], [ends], vocab_size, max_length, min_length)

    @classmethod
    def from_shards(cls, path: str, max_length: int = 128, min_length: int = 8) -> "TokenWindows":
        """Memory-map the shard folder ``path`` (checked; an empty corpus raises)."""
        index = read_shard_index(path)
        if not index["num_tokens"]:
            raise TextDataError(f"{path}: the corpus is empty ({index['num_documents']} "
                                "documents, no tokens); build it from a corpus with text")
        arrays, ends, sources = [], [], []
        for shard in index["shards"]:
            tokens, n = os.path.join(path, shard["tokens"]), shard["num_tokens"]
            arrays.append(np.memmap(tokens, dtype=TOKEN_DTYPE, mode="r", shape=(n,)) if n
                          else np.zeros(0, TOKEN_DTYPE))
            ends.append(np.fromfile(os.path.join(path, shard["docs"]), dtype=OFFSET_DTYPE))
            sources.append(tokens)
        return cls(arrays, ends, index["vocab_size"], max_length, min_length, sources)

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def __len__(self) -> int:
        return int(self.starts.size)

    def __getitem__(self, k: int) -> Data:
        s, n, a = int(self.starts[k]), int(self.lengths[k]), int(self.shard[k])
        ids = np.asarray(self.arrays[a][s:s + n], dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise TextDataError(f"{self.sources[a]}: tokens {s}..{s + n - 1} hold ids in "
                                f"[{ids.min()}, {ids.max()}], outside the vocabulary "
                                f"[0, {self.vocab_size}); {_REBUILD}")
        return Data(x=torch.from_numpy(ids), num_nodes=n)

    def __repr__(self) -> str:
        return (f"TokenWindows({len(self)} sequences, {self.num_tokens} tokens, "
                f"max_length={self.max_length})")


class ResumableSampler(torch.utils.data.Sampler):
    """Indices ``0..n-1`` in a permutation seeded by ``(seed, epoch)`` (or in order), split
    across ranks like :class:`~torch.utils.data.DistributedSampler`, after the first
    ``skip`` of this rank's epoch (never drawing from the global random state)."""

    def __init__(self, size: int, shuffle: bool = True, seed: int = 0, num_replicas: int = 1,
                 rank: int = 0):
        if size < 1 or not 0 <= rank < num_replicas:
            raise ValueError("the dataset holds no sequences (documents shorter than "
                             "min_length?)" if size < 1 else
                             f"rank {rank} outside [0, {num_replicas})")
        self.size, self.shuffle, self.seed = size, shuffle, seed
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch, self.skip = 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return math.ceil(self.size / self.num_replicas)

    def __iter__(self) -> Iterator[int]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.size, generator=gen) if self.shuffle else \
            torch.arange(self.size)
        total = len(self) * self.num_replicas
        # (padded by wrapping, so that every rank gets the same count)
        order = torch.cat([order, order[:total - self.size]])
        mine = order[self.rank:total:self.num_replicas]
        skip, self.skip = self.skip, 0
        return iter(mine[skip:].tolist())


class ResumableLoader(torch.utils.data.DataLoader):
    """A PyG-collating :class:`~torch.utils.data.DataLoader` over a :class:`ResumableSampler`
    whose ``state_dict()`` (epoch, batches delivered) Lightning checkpoints: a run resumed
    mid-epoch sees exactly the batches it had left."""

    sampler: ResumableSampler

    def __init__(self, dataset, batch_size: int, sampler: ResumableSampler, **kwargs):
        from torch_geometric.loader.dataloader import Collater

        # (a DataLoader otherwise draws a worker seed from the global random state, which
        # would shift the model's random draws on resume)
        kwargs.setdefault("generator", torch.Generator().manual_seed(sampler.seed))
        super().__init__(dataset, batch_size=batch_size, sampler=sampler,
                         collate_fn=Collater(dataset), **kwargs)
        self._delivered, self._resume = 0, 0

    def __iter__(self):
        self._delivered, self._resume = self._resume, 0
        self.sampler.skip = self._delivered * self.batch_size
        for batch in super().__iter__():
            self._delivered += 1
            yield batch

    def state_dict(self) -> dict:
        return dict(epoch=self.sampler.epoch, delivered=self._delivered)

    def load_state_dict(self, state: dict) -> None:
        self.sampler.set_epoch(int(state["epoch"]))
        self._resume = int(state["delivered"])
