"""IMDB's 50,000 labelled reviews with GLoMo's graphs as a dataset: on disk
(``GraphsOnDiskDataset``) and in memory (``GraphsDataset``): peak memory, build time and
load time.

    python -m benchmarks.graphs_dataset --data-dir ~/.cache/glomo-data
        [--output-dir runs/graphs_dataset] [--max-tokens 256] [--limit N]
        [--chunk-size 1024] [--memory-limit N] [--results FILE]

The reviews (``train`` and ``test``, ``pos`` and ``neg``: ``glomo_pyg.data.read_aclimdb``)
are encoded with the released predictor's vocabulary as the text classifier encodes them
(``encode_documents``: lower-cased words, the first ``--max-tokens``) one at a time, as a
stream, and given ``GlomoGraphs(--predictor, merge='mean', top_k=8)``'s edges. Each phase
runs in a fresh process, so its peak resident memory (``VmHWM``) is its own:

* ``build-disk``: the on-disk dataset made from nothing (chunk files of ``--chunk-size``);
* ``load-disk``: opened again (the stream read and digested, every chunk reused) and
  iterated once, sample by sample, then once through PyG's ``DataLoader`` (batches of 64,
  shuffled);
* ``build-memory`` / ``load-memory``: the same for ``GraphsDataset`` on the first
  ``--memory-limit`` reviews (all by default), which must hold every sample and graph.

Each phase also reports the memory after its set-up (the predictor loaded, the review
texts read), so what the dataset itself adds is visible. Results are appended to
``--results`` (default ``benchmarks/results/graphs_dataset.md``; ``''``: print only).
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from typing import Dict, Iterator, List, Optional

import torch
from torch_geometric.data import Data

from benchmarks.common import append_results, hardware
from benchmarks.speed.measure import _status_kib

PHASES = ("build-disk", "load-disk", "build-memory", "load-memory")
SPLITS = (("train", "pos"), ("train", "neg"), ("test", "pos"), ("test", "neg"))


def rss_mib(field: str = "VmRSS") -> float:
    """The process's resident memory now (``VmHWM``: its peak), from /proc/self/status."""
    return _status_kib(field) / 1024


def reviews(data_dir: str, limit: Optional[int]):
    """``(text, label)`` of the labelled reviews, train then test, ``pos`` then ``neg``."""
    from glomo_pyg.data import read_aclimdb

    out = []
    for split, kind in SPLITS:
        out += [(r.text, r.label) for r in read_aclimdb(data_dir, split, (kind,))]
    return out[:limit]


def stream(texts, vocabulary, max_tokens: Optional[int]) -> Iterator[Data]:
    """The reviews encoded one at a time, as ``encode_documents`` encodes them."""
    from glomo_pyg.training.text_classification import encode_documents

    for text, label in texts:
        yield encode_documents([text], [label], vocabulary, max_tokens)[0]


def run_phase(args) -> Dict:
    from glomo_pyg.data import WordVocabulary
    from glomo_pyg.logs import LineFormatter, logging_to
    from glomo_pyg.transforms import GlomoGraphs, GraphsDataset, GraphsOnDiskDataset

    graphs = GlomoGraphs(args.predictor, merge="mean", top_k=8)
    vocabulary = WordVocabulary(graphs.predictor.vocabulary)
    memory = args.phase.endswith("memory")
    texts = reviews(args.data_dir, args.memory_limit if memory else args.limit)
    out: Dict = {"phase": args.phase, "samples": len(texts), "setup_rss_mib": rss_mib()}
    root = os.path.join(args.output_dir, "memory" if memory else "disk")
    start = time.perf_counter()
    if memory:
        dataset = GraphsDataset(root, list(stream(texts, vocabulary, args.max_tokens)), graphs)
    else:
        chunks = logging.StreamHandler(sys.stderr)  # (log: a line per chunk, on stderr)
        chunks.setFormatter(LineFormatter())
        with logging_to(chunks):
            dataset = GraphsOnDiskDataset(root, stream(texts, vocabulary, args.max_tokens),
                                          graphs, chunk_size=args.chunk_size,
                                          log=args.phase == "build-disk")
    out["open_s"] = time.perf_counter() - start
    if args.phase.startswith("load"):
        out.update(iterate(dataset))
    out["peak_rss_mib"] = rss_mib("VmHWM")
    folder = dataset.folder if not memory else dataset.processed_dir
    out["disk_mib"] = sum(os.path.getsize(os.path.join(folder, n))
                          for n in os.listdir(folder)) / 2 ** 20
    return out


def iterate(dataset) -> Dict:
    """Seconds to read every sample once, in order, then once in shuffled batches."""
    from torch_geometric.loader import DataLoader

    start, tokens, edges = time.perf_counter(), 0, 0
    for data in dataset:
        tokens, edges = tokens + data.num_nodes, edges + data.num_edges
    out = {"iterate_s": time.perf_counter() - start, "tokens": tokens, "edges": edges}
    start = time.perf_counter()
    loader = DataLoader(dataset, batch_size=64, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    assert sum(batch.num_edges for batch in loader) == edges
    out["loader_s"] = time.perf_counter() - start
    return out


def child(args, phase: str) -> Dict:
    cmd = [sys.executable, "-m", "benchmarks.graphs_dataset", "--phase", phase,
           "--data-dir", args.data_dir, "--output-dir", args.output_dir,
           "--chunk-size", str(args.chunk_size), "--predictor", args.predictor]
    for name in ("max_tokens", "limit", "memory_limit"):
        if getattr(args, name) is not None:
            cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    print("running", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(result), flush=True)
    return result


def report(args, results: List[Dict]) -> List[str]:
    by = {r["phase"]: r for r in results}
    cap = f"the first {args.max_tokens} tokens" if args.max_tokens else "every token"
    lines = [f"## {datetime.date.today()}: {by['build-disk']['samples']} reviews, {cap}",
             "", f"- command: `python -m benchmarks.graphs_dataset {' '.join(args.argv)}`",
             f"- hardware: {hardware()}; torch {torch.__version__}; load average "
             f"{args.load_before:.2f} (1 min) before the run", "",
             "| dataset | phase | samples | s (open) | s (iterate) | s (DataLoader) | "
             "peak RSS MiB | RSS after set-up MiB | on disk MiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        kind = "GraphsDataset" if r["phase"].endswith("memory") else "GraphsOnDiskDataset"
        lines.append(f"| {kind} | {r['phase'].split('-')[0]} | {r['samples']} | "
                     f"{r['open_s']:.1f} | {_num(r.get('iterate_s'))} | "
                     f"{_num(r.get('loader_s'))} | {r['peak_rss_mib']:.0f} | "
                     f"{r['setup_rss_mib']:.0f} | {r['disk_mib']:.0f} |")
    load = by.get("load-disk")
    if load:
        lines += ["", f"{load['tokens']} tokens, {load['edges']} edges."]
    return lines + [""]


def _num(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1f}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.path.expanduser("~/.cache/glomo-data"))
    parser.add_argument("--output-dir", default="runs/graphs_dataset")
    parser.add_argument("--predictor", default="imdb-text-cpu")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--limit", type=int, default=None, help="the first N reviews only")
    parser.add_argument("--memory-limit", type=int, default=None,
                        help="reviews of the in-memory dataset (default: --limit); 0: skip it")
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--results", default="benchmarks/results/graphs_dataset.md")
    parser.add_argument("--phase", choices=PHASES, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    if args.memory_limit is None:
        args.memory_limit = args.limit
    if args.phase:
        print(json.dumps(run_phase(args)))
        return
    args.load_before = os.getloadavg()[0]  # (how quiet the machine was)
    phases = PHASES if args.memory_limit != 0 else PHASES[:2]
    for name in ("disk", "memory"):  # (each build starts from nothing)
        shutil.rmtree(os.path.join(args.output_dir, name), ignore_errors=True)
    lines = report(args, [child(args, phase) for phase in phases])
    print("\n".join(lines))
    if args.results:
        append_results(args.results, lines)


if __name__ == "__main__":
    main()
