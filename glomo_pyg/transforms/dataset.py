"""A PyG ``InMemoryDataset`` of samples with a graph transform's edges, made once and
cached as safetensors under a key of the transform (its predictor's digest included) and
the samples: another predictor, option or sample set never reads old graphs."""
from __future__ import annotations

import hashlib
import json
import os
from typing import Callable, Dict, List, Optional, Sequence

from torch import Tensor
from torch_geometric.data import Data, InMemoryDataset

from glomo_pyg.atomic_files import atomic_write
from glomo_pyg.digests import add_tensor
from glomo_pyg.transforms.base import UnitGraphs

_PREFIX = "graphs-"


def samples_digest(samples: Sequence[Data]) -> str:
    """SHA-256 (hex) of every tensor attribute of every sample (names, dtypes, shapes,
    values); other attributes are refused (the cache stores tensors only)."""
    h = hashlib.sha256()
    for i, data in enumerate(samples):
        if not isinstance(data, Data):
            raise TypeError(f"sample {i}: expected a torch_geometric Data, got "
                            f"{type(data).__name__}")
        for key, value in sorted(data.to_dict().items()):
            if not isinstance(value, Tensor):
                raise TypeError(f"sample {i}: attribute {key!r} is a {type(value).__name__}; "
                                f"GraphsDataset caches tensor attributes only")
            add_tensor(h, f"{i}:{key}", value)
    return h.hexdigest()


class GraphsDataset(InMemoryDataset):
    r"""``samples`` with ``graphs``' edges (:class:`~glomo_pyg.transforms.GlomoGraphs` or
    a fixed graph), as a PyG ``InMemoryDataset``.

    The graphs are made once, ``graphs.batch_size`` samples per predictor call, and
    stored in ``root/processed/graphs-<key>.safetensors`` where ``key`` digests the
    transform (:attr:`~glomo_pyg.transforms.GlomoGraphs.cache_key`: the predictor's
    weights and every option) and the samples; a later dataset with the same key loads
    them without running the predictor, any other key makes its own file. The file is
    read as safetensors (nothing is unpickled) and its recorded key is compared before
    use; a damaged or foreign file is rebuilt.

    Args:
        root: the dataset folder (``processed/`` is made inside).
        samples: ``Data`` objects whose attributes are all tensors (``x`` as the
            transform reads it, ``y``, ...).
        graphs: the graph transform.
        transform: applied on access, as in PyG.
        force_reload: rebuild even if a cache exists.
    """

    def __init__(self, root: str, samples: Sequence[Data], graphs: UnitGraphs,
                 transform: Optional[Callable] = None, force_reload: bool = False,
                 log: bool = False):
        if not isinstance(graphs, UnitGraphs):
            raise TypeError(f"graphs must be a graph transform of glomo_pyg.transforms, got "
                            f"{type(graphs).__name__}")
        self.samples, self.graphs = list(samples), graphs
        if not self.samples:
            raise ValueError("GraphsDataset needs at least one sample")
        self.key = hashlib.sha256(f"{graphs.cache_key}:{samples_digest(self.samples)}"
                                  .encode()).hexdigest()[:32]
        super().__init__(root, transform, force_reload=force_reload, log=log)
        if not self._read():
            self.process()
            self._read(strict=True)

    @property
    def raw_file_names(self) -> List[str]:
        return []

    @property
    def processed_file_names(self) -> List[str]:
        return [f"{_PREFIX}{self.key}.safetensors"]

    def download(self) -> None:  # the samples are given
        pass

    def _process(self) -> None:
        # PyG's own _process unpickles processed/pre_transform.pt to compare transforms;
        # the key in the file name does that job here, and _read checks it.
        if self.force_reload or not os.path.exists(self.processed_paths[0]):
            self.process()

    def process(self) -> None:
        data, slices = self.collate(self.graphs(self.samples))
        tensors = {f"data.{k}": v.contiguous() for k, v in data.to_dict().items()}
        tensors.update({f"slices.{k}": v.contiguous() for k, v in slices.items()})
        from safetensors.torch import save

        payload = save(tensors, metadata={"key": self.key,
                                          "relations": json.dumps(self.graphs.relations)})
        with atomic_write(self.processed_paths[0], "wb") as fh:
            fh.write(payload)

    def _read(self, strict: bool = False) -> bool:
        """Load the cache; ``False`` if it is missing, damaged or of another key."""
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(self.processed_paths[0], "pt") as f:
                if (f.metadata() or {}).get("key") != self.key:
                    raise ValueError("the cache was written under another key")
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except (OSError, ValueError, SafetensorError) as err:
            if strict:
                raise RuntimeError(f"could not read back {self.processed_paths[0]}: {err}") \
                    from err
            return False
        parts: Dict[str, Dict[str, Tensor]] = {"data": {}, "slices": {}}
        for name, t in tensors.items():
            kind, _, key = name.partition(".")
            parts.setdefault(kind, {})[key] = t
        self.data, self.slices = Data.from_dict(parts["data"]), parts["slices"]
        return True

    @property
    def relations(self) -> List[str]:
        return self.graphs.relations
