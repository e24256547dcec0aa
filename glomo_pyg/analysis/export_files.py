"""Files written by ``glomo export``: every graph of each input sequence or image as
GraphML and JSON edge lists, plus the statistics table, all inside one directory.

Nothing is pickled. Every file is written to a fresh temporary file in the output
directory and renamed into place, so a name in that directory that is a symbolic link
(to anywhere) is replaced, never followed, and file names are generated here, never
taken from the input.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch
from torch import Tensor

from glomo_pyg.analysis.export import edge_list, to_graphml_graph
from glomo_pyg.analysis.statistics import GraphStatisticsAccumulator
from glomo_pyg.atomic_files import atomic_write

FORMATS = ("graphml", "json")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class ExportDirectory:
    """Writes files into one directory only: names are single path components of
    ``[A-Za-z0-9_.-]``, and each file is written atomically (temporary file, then
    :func:`os.replace`, which replaces a link instead of following it)."""

    def __init__(self, path: str):
        if not isinstance(path, str) or not path or (os.path.exists(path) and
                                                     not os.path.isdir(path)):
            raise ValueError(f"the output directory {path!r} is empty or an existing file, "
                             "not a directory")
        os.makedirs(path, exist_ok=True)
        self.root = os.path.realpath(path)

    def path(self, name: str) -> str:
        full = os.path.join(self.root, name)
        if not _NAME.match(name) or name in (".", "..") or os.path.dirname(full) != self.root:
            raise ValueError(f"refusing file name {name!r}: a single plain path component "
                             f"inside {self.root} is required")
        return full

    def write(self, name: str, write) -> str:
        """Call ``write(file_object)`` on a temporary text file, then move it to ``name``
        (:func:`~glomo_pyg.atomic_files.atomic_write`)."""
        target = self.path(name)
        with atomic_write(target) as fh:
            write(fh)
        return target


@dataclass
class ExportItem:
    """One input: ``x`` is ``[T]`` token ids, ``[T, F]`` features or a ``[C, H, W]``
    image; ``labels`` names its units (tokens); ``source`` says where it came from."""

    x: Tensor
    source: str
    labels: Optional[List[str]] = None


def _image_size(predictor):
    """``(height, width)`` of a pixel predictor, ``None`` for text."""
    emitter = predictor.predictor(predictor.directions[0])
    height = getattr(emitter, "height", None)
    return None if height is None else (height, emitter.width)


def _write_graphml(graph, fh) -> None:
    import networkx as nx

    for line in nx.generate_graphml(graph):
        fh.write(line + "\n")


def _batches(items: Sequence[ExportItem], batch_size: int):
    """Groups of consecutive items of the same kind (and image size), with the
    predictor's ``(x, batch)`` input."""
    from glomo_pyg.pixels import image_units

    group: List[int] = []

    def key(item):
        return tuple(item.x.shape) if item.x.dim() == 3 else ("seq", item.x.dim())

    def flush():
        chunk = [items[k] for k in group]
        if chunk[0].x.dim() == 3:
            x, batch = image_units(torch.stack([c.x for c in chunk]))
        else:
            x = torch.cat([c.x for c in chunk])
            batch = torch.cat([torch.full((c.x.size(0),), b, dtype=torch.long)
                               for b, c in enumerate(chunk)])
        return list(group), x, batch

    for k, item in enumerate(items):
        if group and (len(group) == batch_size or key(items[group[0]]) != key(item)):
            yield flush()
            group = []
        group.append(k)
    if group:
        yield flush()


@torch.no_grad()
def export_graphs(predictor, items: Sequence[ExportItem], output_dir: str,
                  formats: Sequence[str] = FORMATS, batch_size: int = 16,
                  min_weight: float = 0.0, top_k: Optional[int] = None,
                  max_edges: int = 2_000_000, log=None) -> Dict:
    """Emit the graphs of every item with ``predictor`` (a
    :class:`~glomo_pyg.nn.PretrainedGraphPredictor`) and write, in ``output_dir``:

    * ``sample_<k>.graphml`` / ``sample_<k>.json``: every (direction, layer, head) of
      item ``k`` (see :func:`~glomo_pyg.analysis.to_graphml_graph` and
      :func:`~glomo_pyg.analysis.edge_list`);
    * ``statistics.md``, ``statistics.csv``, ``statistics.json``: the
      :class:`~glomo_pyg.analysis.GraphStatisticsTable` over all items (unthinned);
    * ``index.json``: each sample's source, unit count, edge count and files.

    An item whose export would exceed ``max_edges`` edges is refused before anything is
    written for it: thin it with ``min_weight`` or ``top_k``. Images of a size other than
    the predictor's use :meth:`~glomo_pyg.nn.PretrainedGraphPredictor.resized`.
    Returns the index.
    """
    formats = list(formats)
    if not formats or any(f not in FORMATS for f in formats):
        raise ValueError(f"formats must be a non-empty subset of {FORMATS}, got {formats}")
    for name, value in (("batch_size", batch_size), ("max_edges", max_edges)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not items:
        raise ValueError("nothing to export: no items")
    out = ExportDirectory(output_dir)
    stats = GraphStatisticsAccumulator()
    index: List[Dict] = []
    width = max(5, len(str(len(items) - 1)))
    resized: Dict = {}
    for group, x, batch in _batches(items, batch_size):
        model = predictor
        first = items[group[0]].x
        if first.dim() == 3 and tuple(first.shape[1:]) != _image_size(predictor):
            size = tuple(first.shape[1:])
            if size not in resized:
                resized[size] = predictor.resized(*size)
            model = resized[size]
        graphs = model(x, batch)
        stats.update(graphs)
        for b, k in enumerate(group):
            item = items[k]
            data = edge_list(graphs, b, item.labels, min_weight, top_k)
            edges = sum(len(p["source"]) for p in data["graphs"])
            if edges > max_edges:
                raise ValueError(f"{item.source}: {edges} edges exceed max_edges={max_edges}; "
                                 "keep fewer with min_weight/top_k (--min-weight, --top-k) or "
                                 "raise max_edges")
            stem = f"sample_{k:0{width}d}"
            files = []
            if "json" in formats:
                out.write(stem + ".json", lambda fh: json.dump(dict(source=item.source, **data),
                                                               fh))
                files.append(stem + ".json")
            if "graphml" in formats:
                graph = to_graphml_graph(graphs, b, item.labels, min_weight, top_k)
                graph.graph["source"] = item.source
                out.write(stem + ".graphml", lambda fh: _write_graphml(graph, fh))
                files.append(stem + ".graphml")
            index.append(dict(sample=k, source=item.source, num_units=data["num_units"],
                              num_edges=edges, files=files))
            if log is not None:
                log(f"{item.source}: {data['num_units']} units, {edges} edges -> "
                    + ", ".join(files))
    table = stats.table()
    out.write("statistics.md", lambda fh: fh.write(table.format() + "\n"))
    out.write("statistics.csv", lambda fh: fh.write(table.to_csv()))
    out.write("statistics.json", lambda fh: json.dump(table.to_dict(), fh))
    summary = dict(samples=index, min_weight=min_weight, top_k=top_k, formats=formats,
                   statistics=["statistics.md", "statistics.csv", "statistics.json"])
    out.write("index.json", lambda fh: json.dump(summary, fh, indent=1))
    return summary
