"""The ``glomo`` command line: one parser and one handler per subcommand. Options are
checked before any work; a :class:`ValueError`, :class:`OSError` or missing extra becomes
one line naming the command (``GLOMO_TRACEBACK=1`` shows the traceback)."""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shlex
import sys
import warnings
from collections import Counter
from typing import Any, Dict, Iterator, List, Optional, Union, cast

import torch

from glomo_pyg.allocator import keep_freed_memory
from glomo_pyg.analysis.export import MAX_IMAGE_PIXELS
from glomo_pyg.analysis.export_files import ExportItem, export_graphs
from glomo_pyg.analysis.viewer import view
from glomo_pyg.analysis.viewer.inputs import valid_text
from glomo_pyg.atomic_files import atomic_write
from glomo_pyg.data.text import UNK, binary_lines, decode_utf8, tokenize
from glomo_pyg.data.word_vectors import TRAIN_RULES, train_word_vectors, write_word_vectors
from glomo_pyg.extras import MissingExtraError, require
from glomo_pyg.graphs.pruning import MIN_WEIGHT, TOP_K
from glomo_pyg.io.image_files import read_image_file
from glomo_pyg.io.paths import check_input_file, check_output_file, open_input_file
from glomo_pyg.io.releases import (
    available_releases,
    released_names,
    releases_origin,
    releases_root,
)
from glomo_pyg.logs import line_handler, logging_to
from glomo_pyg.nn.pretrained import PretrainedGraphPredictor
from glomo_pyg.publish import describe_release, push_folder, reseal_pretrained
from glomo_pyg.settings import THREADS, Rule, set_by_path
from glomo_pyg.version import __version__

# The rules of the commands' numeric options: the library's own where it has one (named by
# the flag here, before any file is read or predictor loaded)
_COUNT = Rule(int, low=1)
_FROM_ONE = Rule(int, low=1, note="counts from 1")
_TOP_K, _MIN_WEIGHT = TOP_K.replace(optional=False), MIN_WEIGHT.replace(optional=False)
# torch.manual_seed takes any integer that fits in 64 bits, signed or not
_SEED = Rule(int, low=-(1 << 63), high=(1 << 64) - 1)


def _command(sub, name: str, func, help: str, description: Optional[str] = None,
             predictor: bool = False, threads: bool = False) -> argparse.ArgumentParser:
    """The subparser ``name`` running ``func``, with ``--predictor`` and ``--threads``."""
    parser = sub.add_parser(name, help=help, description=description)
    parser.set_defaults(func=func)
    if predictor:
        parser.add_argument("--predictor", required=True, help="folder written by "
                            "save_pretrained, or a released name (glomo pretrained)")
    if threads:
        parser.add_argument("--threads", type=int, help="torch CPU threads (0: torch's default)")
    return parser


def _check_options(args: argparse.Namespace, **rules: Rule) -> None:
    """Each option that is set, as its :class:`~glomo_pyg.settings.Rule` allows (the rule's
    ``note`` says why a bound is there).

    Raises:
        ValueError: naming the flag (``--max-tokens``) and the value given."""
    for name, rule in rules.items():
        value = getattr(args, name)
        if value is not None:  # (unset: the command's or the library's default)
            rule.check("--" + name.replace("_", "-"), value)


def _set_threads(threads: Optional[int]) -> None:
    """``--threads N``: torch's CPU thread count (unset or 0 keeps torch's default)."""
    if THREADS.check("--threads", threads or 0):
        torch.set_num_threads(cast(int, threads))  # (checked: not None)


def _load_predictor(args: argparse.Namespace, **rules: Rule):
    """``--predictor`` loaded once ``--threads`` is set and the options obey ``rules``."""
    _set_threads(args.threads)
    _check_options(args, **rules)
    return PretrainedGraphPredictor.from_pretrained(args.predictor)


def _reads(predictor) -> str:
    """What ``predictor`` reads, as the commands' errors say it."""
    if predictor.modality == "pixels":
        return "pixels"
    if predictor.vocabulary is None:
        return "features"
    if UNK not in predictor.vocabulary:
        return f"words but has no {UNK!r} token"
    return "words"


def _check_reads(predictor, wanted: str, needs: str,
                 advice: Optional[Dict[str, str]] = None) -> None:
    """Refuse a predictor that does not read ``wanted``, which ``needs`` needs.

    Raises:
        ValueError: naming what it reads instead, with ``advice`` for that where given."""
    reads = _reads(predictor)
    if reads != wanted:
        remedy = (advice or {}).get(reads)
        raise ValueError(f"{needs} needs a predictor that reads {wanted}; this one reads "
                         f"{reads}" + (f"; {remedy}" if remedy else ""))


def _lines(path: str, option: str, limit: int):
    """``(number, text)`` of each UTF-8 line (at most ``limit`` bytes) of the file ``path``."""
    try:
        with open_input_file(path, option) as fh:
            for number, offset, data in binary_lines(fh, path, limit):
                yield number, decode_utf8(data, path, number, offset)
    except OSError as err:
        raise OSError(f"cannot read {path}: {err}") from None


def _nth(items, number: int, option: str, source: str, noun: str):
    """The ``number``-th of ``items`` (counted from 1), as ``option`` picks it."""
    count = 0
    for count, item in enumerate(items, 1):
        if count == number:
            return item
    raise ValueError(f"{option} {number} is out of range: {source} holds {count} {noun}(s), "
                     f"fewer than {number} {noun}s")


def _add_quickstart(sub) -> None:
    # no defaults here: the unset options keep QuickstartConfig's, declared there
    q = _command(sub, "quickstart", _quickstart, threads=True,
                 help="pretrain on built-in synthetic data and score the graphs")
    for name, kind in (("steps", int), ("batch-size", int), ("seed", int), ("lr", float)):
        q.add_argument(f"--{name}", type=kind)
    q.add_argument("--graph-lr-scale", type=float,
                   help="learning-rate factor of the graph predictor (see docs/training.md)")
    q.add_argument("--graph-warmup-steps", type=int,
                   help="steps during which the graph predictor is frozen")
    q.add_argument("--accelerator", help="Lightning accelerator: cpu, gpu, auto")
    # the command writes by default, the library (QuickstartConfig.output_dir) does not
    q.add_argument("--output-dir", default="runs/quickstart", help="write CSV logs, "
                   "quickstart.json and predictor/ here; '' writes nothing (default: %(default)s)")
    q.add_argument("--no-progress", action="store_true", help="no progress bar")


def _quickstart(args: argparse.Namespace) -> int:
    from glomo_pyg.training.quickstart import QuickstartConfig, predictor_dir, run_quickstart

    _set_threads(args.threads)
    given = {name: getattr(args, name) for name in ("steps", "batch_size", "seed", "lr",
                                                    "graph_lr_scale", "graph_warmup_steps",
                                                    "accelerator")}
    config = QuickstartConfig(**{k: v for k, v in given.items() if v is not None},
                              output_dir=args.output_dir or None,
                              progress_bar=not args.no_progress)
    print(f"glomo quickstart: pretraining GLoMo for {config.steps} steps on a synthetic corpus "
          f"with planted long-range dependencies (seed {config.seed})", flush=True)
    result = run_quickstart(config)
    print(result.format())
    baseline = max(result.recovery.uniform, result.recovery.previous_token)
    ratio = result.chosen_precision / baseline if baseline else float("inf")
    print(f"\nchosen graph vs best baseline: {result.chosen_precision:.3f} vs {baseline:.3f} "
          f"({ratio:.1f}x)")
    if config.output_dir:
        print(f"\npretrained graph predictor saved to {predictor_dir(config.output_dir)}; load it "
              "with PretrainedGraphPredictor.from_pretrained (see examples/transfer.py)")
    return 0


def _load_yaml(stream):
    """``yaml.safe_load`` that also refuses aliases (a YAML bomb) and duplicate keys."""
    yaml = require("yaml", "Reading YAML configurations")

    class StrictLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise yaml.composer.ComposerError(
                    None, None, "aliases (*name) are not allowed in a configuration",
                    self.peek_event().start_mark)
            return super().compose_node(parent, index)

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, (str, int, float, bool)) or key is None:
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r}", key_node.start_mark)
                    seen.add(key)
            return super().construct_mapping(node, deep)

    return yaml.load(stream, Loader=StrictLoader)


def _add_pretrain(sub) -> None:
    p = _command(sub, "pretrain", _pretrain, help="pretrain GLoMo on a text corpus (Lightning)",
                 description="Pretrain GLoMo on a text corpus. Settings come from a YAML file "
                             "(sections corpus, model, train; see --print-config) and --set "
                             "overrides.")
    p.add_argument("--config", help="YAML configuration file")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a setting, e.g. --set train.max_steps=500 (repeatable)")
    p.add_argument("--output-dir", help="run folder (corpus cache, checkpoints, logs, predictor)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest usable checkpoint in "
                        "<output-dir>/checkpoints (last.ckpt, or a newer periodic one)")
    p.add_argument("--print-config", action="store_true", help="print the resolved settings")
    p.add_argument("--prepare-only", action="store_true",
                   help="tokenise the corpus and build the vocabulary, then stop (run once "
                        "before a multi-node job whose nodes share the output folder)")


def _pretrain_settings(args: argparse.Namespace, yaml) -> dict:
    """The YAML file's settings with the ``--set`` overrides applied."""
    data: Dict[str, Any] = {}
    if args.config:
        try:
            with open(args.config, encoding="utf-8") as fh:
                data = _load_yaml(fh) or {}
            problem: Union[str, Exception, None] = \
                None if isinstance(data, dict) else "it must hold a mapping"
        except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as err:
            problem = "nested too deeply" if isinstance(err, RecursionError) else err
        if problem is not None:
            raise ValueError(f"cannot read {args.config}: {problem}")
    for item in args.set or []:
        key, sep, value = item.partition("=")
        problem = None if sep else f"expects key=value, got {item!r}"
        try:
            if sep:
                set_by_path(data, key.strip(), _load_yaml(value))
        except (ValueError, yaml.YAMLError, RecursionError) as err:
            problem = f"{key.strip()}: the value is nested too deeply" \
                if isinstance(err, RecursionError) else f"{item}: {err}"
        if problem is not None:
            raise ValueError(f"--set {problem}")
    if args.output_dir:
        data["output_dir"] = args.output_dir
    return data


def _pretrain(args: argparse.Namespace) -> int:
    yaml = require("yaml", "Reading YAML configurations")

    from glomo_pyg.training.interrupts import TrainingInterrupted
    from glomo_pyg.training.pretrain.config import PretrainConfig
    from glomo_pyg.training.pretrain.run import run_pretraining
    from glomo_pyg.training.pretrain.trainer import is_launcher_child

    config = PretrainConfig.from_dict(_pretrain_settings(args, yaml))
    if args.print_config:
        print(yaml.safe_dump(config.to_dict(), sort_keys=False))
        return 0
    try:
        run_pretraining(config, resume=args.resume, prepare_only=args.prepare_only)
    except TrainingInterrupted as err:
        if not is_launcher_child():  # the first process says it
            command = list(args.argv) + ([] if "--resume" in args.argv else ["--resume"])
            print(f"glomo pretrain: {err}.\nTo continue, run: "
                  f"{shlex.join(['glomo', *command])}", file=sys.stderr, flush=True)
        return err.exit_code
    return 0


def _add_word_vectors(sub) -> None:
    w = _command(sub, "word-vectors", _word_vectors,
                 help="train word2vec vectors (GloVe text format)")
    w.add_argument("--corpus", required=True, help="text file or folder, or the aclImdb folder")
    w.add_argument("--format", default="text", choices=("text", "aclimdb"))
    w.add_argument("--one-per-line", action="store_true")
    w.add_argument("--output", required=True)
    for name, default in (("dim", 300), ("window", 5), ("min-count", 5), ("epochs", 5),
                          ("workers", 2), ("seed", 0), ("max-documents", None)):
        w.add_argument(f"--{name}", type=int, default=default)


def _word_vectors(args: argparse.Namespace) -> int:
    from glomo_pyg.training.pretrain.config import CorpusConfig
    from glomo_pyg.training.pretrain.corpus import iter_documents

    # checked before anything is read or written
    _check_options(args, **TRAIN_RULES, max_documents=_COUNT)
    check_output_file(args.output)
    corpus = os.path.realpath(args.corpus)
    if os.path.commonpath([corpus, os.path.realpath(args.output)]) == corpus:
        # (the vectors would replace the corpus, or be read as a document by the next run)
        raise ValueError(f"--output {args.output} is the corpus or lies inside the corpus "
                         f"folder {args.corpus}; write it elsewhere")
    documents = iter_documents(CorpusConfig(path=args.corpus, format=args.format,
                                            one_per_line=args.one_per_line,
                                            max_documents=args.max_documents))
    docs = [tokens for tokens in map(tokenize, documents) if tokens]
    most = max(Counter(w for doc in docs for w in doc).values(), default=0)
    if most < args.min_count:
        raise ValueError(f"no word of {args.corpus} occurs --min-count {args.min_count} times "
                         f"(the most frequent: {most}); lower --min-count" if docs else
                         f"{args.corpus}: no documents with words")
    print(f"glomo word-vectors: {len(docs)} documents, {sum(map(len, docs))} tokens; "
          f"word2vec dim {args.dim}, {args.epochs} epochs", flush=True)
    words, vectors = train_word_vectors(docs, dim=args.dim, window=args.window,
                                        min_count=args.min_count, epochs=args.epochs,
                                        workers=args.workers, seed=args.seed)
    write_word_vectors(args.output, words, vectors)
    print(f"{len(words)} vectors written to {args.output} (GloVe text format)")
    return 0


def _add_syntax(sub) -> None:
    y = _command(sub, "syntax", _syntax, predictor=True, threads=True,
                 help="score a predictor's graphs against gold dependency trees",
                 description="Score every graph of a saved predictor against gold dependency "
                             "trees (CoNLL-U or CoNLL-X), beside the adjacent-word, uniform "
                             "and untrained baselines (docs/syntax.md).")
    y.add_argument("--treebank", required=True, help="gold trees to report on (e.g. EWT dev)")
    y.add_argument("--select-treebank",
                   help="gold trees on which the single graph is chosen (e.g. EWT train)")
    y.add_argument("--format", choices=("conllu", "conllx"),
                   help="default: from the extension (.conll/.conllx: CoNLL-X)")
    y.add_argument("--max-sentences", type=int, help="only the first N trees of --treebank")
    y.add_argument("--select-sentences", type=int, default=2000,
                   help="only the first N trees of --select-treebank (default %(default)s)")
    y.add_argument("--metric", default="undirected", choices=("undirected", "directed", "ap"),
                   help="what the graph is chosen by")
    y.add_argument("--include-punct", action="store_true", help="score punctuation targets too")
    y.add_argument("--beyond-adjacent", action="store_true", help="score only targets with a "
                   "gold neighbour but not their adjacent word, beside the word at distance 2 "
                   "(docs/syntax.md)")
    y.add_argument("--cased", action="store_true",
                   help="do not lower-case words (for a predictor trained on cased text)")
    y.add_argument("--no-untrained", action="store_true", help="skip the untrained baseline")
    y.add_argument("--seed", type=int, default=0, help="seed of the untrained baseline")
    y.add_argument("--batch-size", type=int, default=64)
    y.add_argument("--max-tokens", type=int, default=512,
                   help="skip (and count) sentences of more tokens: memory is O(tokens^2)")
    y.add_argument("--json", help="also write all scores to this JSON file")


def _syntax(args: argparse.Namespace) -> int:
    from glomo_pyg.analysis import compare_with_syntax, read_treebank

    if args.json:
        check_output_file(args.json)
    predictor = _load_predictor(args, max_sentences=_COUNT, select_sentences=_COUNT,
                                batch_size=_COUNT, seed=_SEED,
                                max_tokens=Rule(int, low=2, note="a sentence of one token has "
                                                                 "nothing to score"))
    _check_reads(predictor, "words", "scoring against gold trees")
    trees = read_treebank(args.treebank, args.format, args.max_sentences)
    select = read_treebank(args.select_treebank, args.format, args.select_sentences) \
        if args.select_treebank else None
    for path, read in ((args.treebank, trees), (args.select_treebank, select)):
        if read is not None and not read:
            raise ValueError(f"{path} holds no sentences")
    print(f"glomo syntax: {len(trees)} gold trees from {args.treebank}"
          + (f"; graph chosen on {len(select)} trees from {args.select_treebank}" if select
             else ""), flush=True)
    result = compare_with_syntax(predictor, trees, select, lower=not args.cased,
                                 exclude_punct=not args.include_punct, metric=args.metric,
                                 untrained=not args.no_untrained, seed=args.seed,
                                 batch_size=args.batch_size, max_tokens=args.max_tokens,
                                 beyond_adjacent=args.beyond_adjacent)
    print(result.format())
    if args.json:
        with atomic_write(args.json) as fh:
            json.dump(dict(predictor=args.predictor, treebank=args.treebank,
                           select_treebank=args.select_treebank, **result.to_dict()), fh,
                      allow_nan=False)
        print(f"scores written to {args.json}")
    return 0


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
EXPORT_LINE_BYTES = 1 << 22  # one document per line: 4 MiB is far beyond any review


def _add_export(sub) -> None:
    e = _command(sub, "export", _export, predictor=True, threads=True,
                 help="write a predictor's graphs to GraphML / JSON edge lists",
                 description="Write every graph of each line of a text file, or each image of "
                             "a folder, and a statistics table into --output (docs/analysis.md).")
    source = e.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="UTF-8 text file, one document per line")
    source.add_argument("--images", help="folder of PNG/JPEG images (RGB), each read at its "
                        "own size up to --max-units pixels")
    e.add_argument("--output", required=True, help="directory to write (new, empty or an earlier "
                   "export; published as a whole when complete)")
    e.add_argument("--formats", nargs="+", default=["graphml", "json"],
                   choices=("graphml", "json"))
    e.add_argument("--max-samples", type=int, default=100, help="first N lines or images")
    e.add_argument("--max-tokens", type=int, default=256, help="tokens kept per line")
    e.add_argument("--max-units", type=int, default=MAX_IMAGE_PIXELS,
                   help="largest image in pixels (the viewer's limit too)")
    e.add_argument("--min-weight", type=float, default=0.0, help="leave out lighter edges")
    e.add_argument("--top-k", type=int, help="keep the k heaviest edges into each unit")
    e.add_argument("--max-distance", type=int, metavar="D",
                   help="cut every graph to sources at most D units (pixels: rows and "
                   "columns) away; without it, longer inputs than the predictor's distance "
                   "term learned are warned about")
    e.add_argument("--max-edges", type=int, default=2_000_000,
                   help="refuse a sample with more edges (thin with --min-weight/--top-k)")
    e.add_argument("--batch-size", type=int, default=16)
    e.add_argument("--cased", action="store_true", help="do not lower-case the text")
    e.add_argument("--verbose", action="store_true", help="one line per sample")


def _export_text_items(path: str, predictor, max_samples: int, max_tokens: int, lower: bool):
    items, short = [], 0
    for number, line in _lines(path, "--text", EXPORT_LINE_BYTES):
        tokens = tokenize(line, lower)[:max_tokens]
        if len(tokens) == 1:
            short += 1
        elif tokens:
            items.append(ExportItem(predictor.encode(tokens, unknown=UNK), f"{path}:{number}",
                                    tokens))
        if len(items) == max_samples:
            break
    if short:
        print(f"{short} line(s) of a single token skipped (no graph edges possible)")
    return items


def _export_image_items(folder: str, max_samples: int, max_units: int):
    if not os.path.isdir(folder):
        raise ValueError(f"{folder} is not a directory")
    names = sorted(n for n in os.listdir(folder) if n.lower().endswith(IMAGE_SUFFIXES)
                   and os.path.isfile(os.path.join(folder, n)))[:max_samples]
    too_large = (f"more than --max-units {max_units} (graphs grow with the square of the "
                 "pixel count; downscale it or raise --max-units)")
    items = []
    for path in (os.path.join(folder, name) for name in names):
        rgb = read_image_file(path, max_units, too_large)
        items.append(ExportItem(torch.from_numpy(rgb.copy()).permute(2, 0, 1).contiguous(),
                                path))
    return items


def _export(args: argparse.Namespace) -> int:
    predictor = _load_predictor(args, max_samples=_COUNT, batch_size=_COUNT, max_edges=_COUNT,
                                max_units=_COUNT, top_k=_TOP_K, min_weight=_MIN_WEIGHT,
                                max_distance=_COUNT,
                                max_tokens=Rule(int, low=2, note="a graph over one token has "
                                                                 "no edges"))
    _check_reads(predictor, "words" if args.text else "pixels",
                 "--text" if args.text else "--images",
                 advice=dict(pixels="use --images", words="use --text"))
    items = _export_text_items(args.text, predictor, args.max_samples, args.max_tokens,
                               not args.cased) if args.text else \
        _export_image_items(args.images, args.max_samples, args.max_units)
    if not items:
        raise ValueError("no input to export (empty file or no images)")
    print(f"glomo export: {len(items)} sample(s) -> {args.output}", flush=True)
    summary = export_graphs(predictor, items, args.output, formats=args.formats,
                            batch_size=args.batch_size, min_weight=args.min_weight,
                            top_k=args.top_k, max_edges=args.max_edges,
                            max_distance=args.max_distance)  # (--verbose: a line each)
    edges = sum(s["num_edges"] for s in summary["samples"])
    print(f"{len(summary['samples'])} sample(s), {edges} edges written; statistics in "
          f"{args.output}/statistics.md")
    return 0


def _add_pretrained(sub) -> None:
    r = _command(sub, "pretrained", _pretrained, help="list the released pretrained predictors",
                 description="List the released predictors and where they come from: "
                             "$GLOMO_PRETRAINED_DIR if set, else those installed with the "
                             "package, else a source checkout's pretrained/ folder "
                             "(docs/pretrained.md).")
    r.add_argument("--json", action="store_true", help="print the list as JSON")
    r.add_argument("--push", nargs=2, metavar=("DIR", "REPO"),
                   help="instead, upload the predictor folder (or release) DIR as it is to "
                   "the Hugging Face Hub repository REPO ('owner/name'; the [hub] extra)")


def _size(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 100 << 10 else f"{size / 1024:.0f} KiB"


def _release_info(name: str) -> Dict[str, Any]:
    try:
        return describe_release(name)
    except ValueError as err:  # (PretrainedFormatError is one)
        return dict(name=name, error=str(err))


def _pretrained(args: argparse.Namespace) -> int:
    """List the releases; one that fails its checks is named (exit status 1), not hidden."""
    if args.push:
        return _push(args)
    names = released_names()
    infos = [_release_info(name) for name in names]
    good = [i for i in infos if "error" not in i]
    if args.json:
        print(json.dumps(infos, indent=2))
    elif not infos:
        print(f"glomo pretrained: {available_releases(names)}")
    else:
        rows = [("NAME", "MODALITY", "DIRS x LAYERS x HEADS", "UNITS", "WEIGHTS", "SUMMARY")] + [
            (i["name"], i["modality"], f"{i['directions']} x {i['layers']} x {i['heads']}",
             f"{i['units'][0]}x{i['units'][1]} pixels" if i["modality"] == "pixels" else
             f"{i['units']} tokens", _size(i["weights_bytes"]), i["summary"]) for i in good]
        widths = [max(map(len, column)) for column in zip(*rows)]
        for row in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths)) + "  " + row[-1])
        print("\ntrained on (each model card's Data section):")
        for i in good:
            print(f"  {i['name']}: {i['data'] or '(the card has no Data section)'}")
        print(f"\nfrom {releases_root()} ({releases_origin()}); load one with "
              "PretrainedGraphPredictor.from_pretrained(NAME)")
        for i in infos:
            if "error" in i:
                print(f"glomo pretrained: release {i['name']} FAILS its checks and will not "
                      f"load: {i['error']}", file=sys.stderr)
    return 1 if len(good) < len(infos) else 0


def _push(args: argparse.Namespace) -> int:
    """``--push DIR REPO``: upload DIR's predictor files in one commit; print where."""
    if args.json:
        raise ValueError("--push prints where it pushed to: give it without --json")
    pushed = push_folder(*args.push)
    print(f"glomo pretrained: pushed {args.push[0]} ({', '.join(pushed.files)}) to "
          f"{pushed.url} (commit {pushed.commit}); load it with "
          f'PretrainedGraphPredictor.from_pretrained("hf://{pushed.repo_id}")')
    return 0


def _add_view(sub) -> None:
    v = _command(sub, "view", _view, predictor=True,
                 help="write an interactive page of every graph of a sentence or an image",
                 description="One self-contained HTML page (no network): a head view and a "
                             "matrix view of every graph of a sentence, or an image's "
                             "incoming weights under the pointer (docs/analysis.md).")
    source = v.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="a sentence")
    source.add_argument("--text-file", help="a text file; --line picks the line")
    source.add_argument("--image", help=f"an image file of at most {MAX_IMAGE_PIXELS} pixels "
                        "(read at its own size, as glomo export reads it)")
    source.add_argument("--treebank", help="a CoNLL-U/CoNLL-X file: --sentence with gold arcs")
    v.add_argument("--line", type=int, default=1, help="line of --text-file (from 1)")
    v.add_argument("--sentence", type=int, default=1, help="sentence of --treebank (from 1)")
    v.add_argument("--min-weight", type=float, default=0.01,
                   help="leave out lighter edges (default 0.01)")
    v.add_argument("--top-k", type=int, help="keep each target's K heaviest sources (images: 8)")
    v.add_argument("--max-distance", type=int, metavar="D",
                   help="cut every graph to sources at most D units (pixels: rows and "
                   "columns) away; without it, longer inputs than the predictor's distance "
                   "term learned are warned about")
    v.add_argument("--cased", action="store_true", help="do not lower-case words")
    v.add_argument("--output", required=True, help="the page to write (e.g. graphs.html)")


def _view(args: argparse.Namespace) -> int:
    # before the predictor loads: valid text, input paths that are regular files (a FIFO
    # would hang the read), an output path writable as a file
    check_output_file(args.output, "--output", example="graphs.html")
    if "\0" in args.predictor:
        raise ValueError("--predictor holds a NUL character: it is not a folder or a name")
    _check_options(args, line=_FROM_ONE, sentence=_FROM_ONE, top_k=_TOP_K,
                   min_weight=_MIN_WEIGHT, max_distance=_COUNT)
    if args.text is not None:
        valid_text(args.text, "--text")
    for option in ("text_file", "image", "treebank"):
        if getattr(args, option) is not None:
            check_input_file(getattr(args, option), "--" + option.replace("_", "-"))
    predictor = PretrainedGraphPredictor.from_pretrained(args.predictor)
    pixel, given = predictor.modality == "pixels", args.image is not None
    if pixel != given:  # (named by the command's flags, not view()'s keywords)
        raise ValueError(f"{args.predictor} is a pixel predictor: give --image FILE" if pixel
                         else f"{args.predictor} reads text: give --text, --text-file or "
                         f"--treebank, not --image")
    text, gold = args.text, None
    if args.text_file is not None:
        text = _nth((line for _, line in _lines(args.text_file, "--text-file", 1 << 20)),
                    args.line, "--line", args.text_file, "line")
    if args.treebank is not None:
        from glomo_pyg.analysis.treebank import read_treebank  # (conllu: the [text] extra)

        gold = _nth(read_treebank(args.treebank, max_sentences=args.sentence), args.sentence,
                    "--sentence", args.treebank, "sentence")
        text = list(gold.words) if args.cased else [w.lower() for w in gold.words]
    page = view(predictor, text, image=args.image, gold=gold, min_weight=args.min_weight,
                top_k=args.top_k, lower=not args.cased, max_distance=args.max_distance)
    page.save(args.output)
    print(f"glomo view: {args.output} ({os.path.getsize(args.output) / 2**20:.1f} MB; open it "
          "in a browser, offline)")
    return 0


def _add_reseal(sub) -> None:
    s = _command(sub, "reseal", _reseal,
                 help="seal a saved predictor again after a deliberate edit",
                 description="Record a saved predictor's bundle as it is now (after an edit "
                             "made on purpose, or for a format-2 predictor), then load it with "
                             "every check; the old config comes back if that fails.")
    s.add_argument("predictor", help="the folder save_pretrained wrote")


def _reseal(args: argparse.Namespace) -> int:
    reseal_pretrained(args.predictor)
    print(f"sealed {args.predictor} as it is now (it loads)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``glomo`` parser, a subparser per command."""
    parser = argparse.ArgumentParser(prog="glomo", description="GLoMo latent graphs for PyG")
    parser.add_argument("--version", action="version", version=f"glomo_pyg {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_quickstart, _add_pretrain, _add_word_vectors, _add_syntax, _add_export,
                _add_pretrained, _add_view, _add_reseal):
        add(sub)
    return parser


#: The library's keywords a warning may advise, as the flags of the commands that have them.
_KEYWORD_FLAGS = {"max_distance": ("--max-distance", ("export", "view"))}


def _as_flags(message: str, command: str) -> str:
    """``message`` with each ``keyword=value`` of :data:`_KEYWORD_FLAGS` written as the
    command's flag (``max_distance=15`` -> ``--max-distance 15``)."""
    for keyword, (flag, commands) in _KEYWORD_FLAGS.items():
        if command in commands:
            message = re.sub(rf"\b{keyword}=(\d+)", rf"{flag} \1", message)
    return message


@contextlib.contextmanager
def _warnings_as_lines(command: str) -> Iterator[None]:
    """Show each warning once as ``glomo <command>: warning: <message>`` on stderr, through
    tqdm when a progress bar may be drawn (its line then stays outside the bar), instead
    of Python's two lines with the caller's source."""
    def show(message, category, filename, lineno, file=None, line=None) -> None:
        text = f"glomo {command}: warning: {_as_flags(str(message), command)}"
        try:
            from tqdm import tqdm  # type: ignore[import-untyped]

            tqdm.write(text, file=sys.stderr)
        except ImportError:
            print(text, file=sys.stderr)

    shown = warnings.showwarning
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    # bad input (files, settings) or a missing optional package: one line naming it
    expected = () if os.environ.get("GLOMO_TRACEBACK") else \
        (ValueError, OSError, MissingExtraError)
    try:
        # the library's log records as the command's lines (--verbose: its DEBUG ones too)
        level = logging.DEBUG if getattr(args, "verbose", False) else logging.INFO
        with _warnings_as_lines(args.command), logging_to(line_handler(), level):
            return args.func(args)
    except KeyboardInterrupt:
        print(f"\nglomo {args.command}: interrupted", file=sys.stderr)
        return 130
    except expected as err:
        raise SystemExit(f"glomo {args.command}: {err}") from None


def console_main() -> int:
    """The ``glomo`` executable: :func:`main` with :func:`keep_freed_memory` set."""
    try:
        keep_freed_memory()
    except ValueError as err:
        raise SystemExit(f"glomo: {err}") from None
    return main()


if __name__ == "__main__":
    sys.exit(console_main())
