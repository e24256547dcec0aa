"""Files written by ``glomo export``: every graph of each input sequence or image as
GraphML and JSON edge lists, plus the statistics table, all inside one directory, which is
published as a whole (a reader finds it absent, as it was, or complete). Nothing is
pickled, and file names are generated here, never taken from the input."""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, cast

import torch
from torch import Tensor

from glomo_pyg.analysis.export import (
    concat_sequences,
    edge_list,
    image_predictor,
    to_graphml_graph,
    windowed,
)
from glomo_pyg.analysis.statistics import GraphStatisticsAccumulator
from glomo_pyg.atomic_files import atomic_write, staged_folder
from glomo_pyg.graphs import check_max_distance
from glomo_pyg.settings import check_int

logger = logging.getLogger(__name__)

FORMATS = ("graphml", "json")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# what export_graphs writes: an output folder holding only these is an earlier export
_EXPORTED = re.compile(r"sample_\d{5,}\.(graphml|json)|statistics\.(md|csv|json)|index\.json")


def check_export_folder(path: str) -> Path:
    """``path`` as the folder an export may replace as a whole: absent, empty or an
    earlier export; anything else (a file, a folder with other files) is refused."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise ValueError(f"the output directory must be a non-empty path, got {path!r}")
    target = Path(os.path.abspath(path))
    if os.path.lexists(target) and (target.is_symlink() or not target.is_dir()):
        raise ValueError(f"the output directory {path!r} is an existing file or link, not a "
                         "directory")
    others = sorted(n for n in (os.listdir(target) if target.is_dir() else [])
                    if not _EXPORTED.fullmatch(n))
    if others:
        raise ValueError(f"the output directory {path!r} holds files an export did not write "
                         f"({', '.join(others[:3])}{' ...' if len(others) > 3 else ''}); an "
                         "export replaces its folder as a whole: give a new or empty one")
    return target


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
        if not _NAME.fullmatch(name):
            raise ValueError(f"refusing file name {name!r}: a single plain path component "
                             f"inside {self.root} is required")
        return os.path.join(self.root, name)

    def write(self, name: str, write) -> str:
        """``write(file_object)`` to file ``name``, atomically; returns its path."""
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


def _batches(items: Sequence[ExportItem], batch_size: int):
    """Runs of items of one kind (and image size) as ``(indices, x, batch)``."""
    from glomo_pyg.pixels import image_units

    def kind(k: int):
        x = items[k].x
        return tuple(x.shape) if x.dim() == 3 else ("seq", x.dim())

    for _, members in groupby(range(len(items)), key=kind):
        run = list(members)
        for start in range(0, len(run), batch_size):
            group = run[start:start + batch_size]
            chunk = [items[k].x for k in group]
            yield (group, *(image_units(torch.stack(chunk)) if chunk[0].dim() == 3 else
                            concat_sequences(chunk)))


@torch.no_grad()
def export_graphs(predictor, items: Sequence[ExportItem], output_dir: str,
                  formats: Sequence[str] = FORMATS, batch_size: int = 16,
                  min_weight: float = 0.0, top_k: Optional[int] = None,
                  max_edges: int = 2_000_000, max_distance: Optional[int] = None) -> Dict:
    """Emit the graphs of every item with ``predictor`` (a
    :class:`~glomo_pyg.nn.PretrainedGraphPredictor`; each image at its own size,
    :func:`~glomo_pyg.analysis.export.image_predictor`, as the viewer reads it) and write in
    ``output_dir`` ``sample_<k>.graphml`` / ``.json``, ``k`` the item's 0-based index
    zero-padded to five digits (or as many as the last index needs): ``sample_00000.json``
    (:func:`~glomo_pyg.analysis.to_graphml_graph`,
    :func:`~glomo_pyg.analysis.edge_list`), ``statistics.md`` / ``.csv`` / ``.json`` (the
    unthinned :class:`~glomo_pyg.analysis.GraphStatisticsTable`) and ``index.json`` (each
    sample's source, units, edges and files; returned). An item of more than
    ``max_edges`` edges is refused before anything is written for it. ``max_distance``
    cuts every graph to that window first
    (:meth:`~glomo_pyg.LatentGraphs.within`); without it, inputs longer (or images
    larger) than the predictor's learned distance term saw give one ``RuntimeWarning``
    saying which window to pass.

    ``output_dir`` is written as a whole: the files are staged beside it and take its
    place at the end, so a failure or a kill part-way leaves it as it was. It must be
    absent, empty or an earlier export (``ValueError`` for a folder holding other files).
    Each sample written is a DEBUG record of this module's logger."""
    formats = list(formats)
    if not formats or any(f not in FORMATS for f in formats):
        raise ValueError(f"formats must be a non-empty subset of {FORMATS}, got {formats}")
    check_int("batch_size", batch_size)
    check_int("max_edges", max_edges)
    check_max_distance(max_distance, optional=True)
    if not items:
        raise ValueError("nothing to export: no items")
    with staged_folder(check_export_folder(output_dir)) as stage:
        return _export_items(predictor, items, ExportDirectory(str(stage)), formats,
                             batch_size, min_weight, top_k, max_edges, max_distance)


def _export_items(predictor, items: Sequence[ExportItem], out: "ExportDirectory",
                  formats: List[str], batch_size: int, min_weight: float,
                  top_k: Optional[int], max_edges: int, max_distance: Optional[int]) -> Dict:
    """:func:`export_graphs` into ``out`` (its staging folder)."""
    stats = GraphStatisticsAccumulator()
    index: List[Dict] = []
    width = max(5, len(str(len(items) - 1)))
    resized: Dict = {None: predictor, predictor.image_size: predictor}
    warned = False
    for group, x, batch in _batches(items, batch_size):
        first = items[group[0]].x
        size = tuple(first.shape[1:]) if first.dim() == 3 else None  # images: (H, W)
        if size not in resized:
            resized[size] = image_predictor(predictor, *cast(Tuple[int, int], size))
        graphs, shown = windowed(predictor, resized[size](x, batch), max_distance,
                                 "export_graphs", warn=not warned)
        warned = warned or shown
        stats.update(graphs)
        for b, k in enumerate(group):
            entry = _export_sample(out, graphs, b, items[k], f"sample_{k:0{width}d}", formats,
                                   min_weight, top_k, max_edges)
            index.append(dict(sample=k, **entry))
            # (DEBUG: a line per sample, which `glomo export --verbose` shows)
            logger.debug(f"{entry['source']}: {entry['num_units']} units, "
                         f"{entry['num_edges']} edges -> " + ", ".join(entry["files"]))
    table = stats.table()
    out.write("statistics.md", lambda fh: fh.write(table.format() + "\n"))
    out.write("statistics.csv", lambda fh: fh.write(table.to_csv()))
    out.write("statistics.json", lambda fh: json.dump(table.to_dict(), fh))
    summary = dict(samples=index, min_weight=min_weight, top_k=top_k,
                   max_distance=max_distance, formats=formats,
                   statistics=["statistics.md", "statistics.csv", "statistics.json"])
    out.write("index.json", lambda fh: json.dump(summary, fh, indent=1))
    return summary


def _export_sample(out: ExportDirectory, graphs, b: int, item: ExportItem, stem: str,
                   formats: Sequence[str], min_weight: float, top_k: Optional[int],
                   max_edges: int) -> Dict:
    """Writes the files of sample ``b`` of ``graphs``; returns its entry of ``index.json``."""
    data = edge_list(graphs, b, item.labels, min_weight, top_k)
    edges = sum(len(p["source"]) for p in data["graphs"])
    if edges > max_edges:
        raise ValueError(f"{item.source}: {edges} edges exceed max_edges={max_edges}; "
                         "keep fewer with min_weight/top_k (--min-weight, --top-k) or "
                         "raise max_edges")
    files = []
    if "json" in formats:
        record = dict(source=item.source, **data)
        out.write(stem + ".json", lambda fh, record=record: json.dump(record, fh))
        files.append(stem + ".json")
    if "graphml" in formats:
        import networkx as nx  # (optional: only for GraphML)
        graph = to_graphml_graph(graphs, b, item.labels, min_weight, top_k)
        graph.graph["source"] = item.source
        out.write(stem + ".graphml", lambda fh, graph=graph: fh.writelines(
            line + "\n" for line in nx.generate_graphml(graph)))
        files.append(stem + ".graphml")
    return dict(source=item.source, num_units=data["num_units"], num_edges=edges, files=files)
