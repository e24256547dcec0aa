"""The ``glomo`` command line."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional


def _quickstart(args: argparse.Namespace) -> int:
    import torch

    from glomo_pyg.training.quickstart import QuickstartConfig, run_quickstart

    if args.threads:
        torch.set_num_threads(args.threads)
    config = QuickstartConfig(steps=args.steps, batch_size=args.batch_size, seed=args.seed,
                              lr=args.lr, graph_lr_scale=args.graph_lr_scale,
                              graph_warmup_steps=args.graph_warmup_steps,
                              accelerator=args.accelerator, output_dir=args.output_dir or None,
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
        from glomo_pyg.training.quickstart import predictor_dir
        print(f"\npretrained graph predictor saved to {predictor_dir(config.output_dir)}; load it "
              "with PretrainedGraphPredictor.from_pretrained (see examples/transfer.py)")
    return 0


def _parse_value(text: str):
    import yaml

    return yaml.safe_load(text)


def _pretrain(args: argparse.Namespace) -> int:
    import yaml

    from glomo_pyg.training.text_pretraining import PretrainConfig, run_pretraining, set_by_path

    data = {}
    if args.config:
        try:
            with open(args.config) as fh:
                data = yaml.safe_load(fh) or {}
        except (OSError, yaml.YAMLError) as err:
            raise SystemExit(f"glomo pretrain: cannot read {args.config}: {err}")
        if not isinstance(data, dict):
            raise SystemExit(f"glomo pretrain: {args.config} must hold a mapping")
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"glomo pretrain: --set expects key=value, got {item!r}")
        set_by_path(data, key, _parse_value(value))
    if args.output_dir:
        data["output_dir"] = args.output_dir
    try:
        config = PretrainConfig.from_dict(data)
    except (TypeError, ValueError) as err:
        raise SystemExit(f"glomo pretrain: {err}")
    if args.print_config:
        print(yaml.safe_dump(config.to_dict(), sort_keys=False))
        return 0
    run_pretraining(config, resume=args.resume, prepare_only=args.prepare_only)
    return 0


def _word_vectors(args: argparse.Namespace) -> int:
    from glomo_pyg.data.text import tokenize
    from glomo_pyg.data.word_vectors import train_word_vectors, write_word_vectors
    from glomo_pyg.training.text_pretraining import CorpusConfig, iter_documents

    corpus = CorpusConfig(path=args.corpus, format=args.format, one_per_line=args.one_per_line,
                          max_documents=args.max_documents)
    docs = [tokenize(d) for d in iter_documents(corpus)]
    print(f"glomo word-vectors: {len(docs)} documents, {sum(map(len, docs))} tokens; "
          f"word2vec dim {args.dim}, {args.epochs} epochs", flush=True)
    words, vectors = train_word_vectors(docs, dim=args.dim, window=args.window,
                                        min_count=args.min_count, epochs=args.epochs,
                                        workers=args.workers, seed=args.seed)
    write_word_vectors(args.output, words, vectors)
    print(f"{len(words)} vectors written to {args.output} (GloVe text format)")
    return 0


def _syntax(args: argparse.Namespace) -> int:
    import json
    import os

    import torch

    from glomo_pyg.analysis import TreebankFormatError, compare_with_syntax, read_treebank
    from glomo_pyg.io import PretrainedFormatError
    from glomo_pyg.nn.pretrained import PretrainedGraphPredictor

    if args.threads:
        torch.set_num_threads(args.threads)
    for name in ("max_sentences", "select_sentences", "batch_size", "max_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise SystemExit(f"glomo syntax: --{name.replace('_', '-')} must be >= 1")
    try:
        predictor = PretrainedGraphPredictor.from_pretrained(args.predictor)
        trees = read_treebank(args.treebank, args.format, args.max_sentences)
        select = read_treebank(args.select_treebank, args.format, args.select_sentences) \
            if args.select_treebank else None
    except (OSError, TreebankFormatError, PretrainedFormatError, ValueError) as err:
        raise SystemExit(f"glomo syntax: {err}")
    if predictor.vocabulary is None:
        raise SystemExit("glomo syntax: the predictor has no vocabulary (it reads features, "
                         "not words)")
    print(f"glomo syntax: {len(trees)} gold trees from {args.treebank}"
          + (f"; graph chosen on {len(select)} trees from {args.select_treebank}" if select
             else ""), flush=True)
    try:
        result = compare_with_syntax(predictor, trees, select, lower=not args.cased,
                                     exclude_punct=not args.include_punct, metric=args.metric,
                                     untrained=not args.no_untrained, seed=args.seed,
                                     batch_size=args.batch_size, max_tokens=args.max_tokens)
    except ValueError as err:
        raise SystemExit(f"glomo syntax: {err}")
    print(result.format())
    if args.json:
        folder = os.path.dirname(os.path.abspath(args.json))
        os.makedirs(folder, exist_ok=True)
        tmp = args.json + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(dict(predictor=args.predictor, treebank=args.treebank,
                           select_treebank=args.select_treebank, **result.to_dict()), fh)
        os.replace(tmp, args.json)
        print(f"scores written to {args.json}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="glomo", description="GLoMo latent graphs for PyG")
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quickstart", help="pretrain on built-in synthetic data and score the graphs")
    q.add_argument("--steps", type=int, default=1000)
    q.add_argument("--batch-size", type=int, default=32)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--lr", type=float, default=3e-3)
    q.add_argument("--graph-lr-scale", type=float, default=1.0,
                   help="learning-rate factor of the graph predictor (see docs/training.md)")
    q.add_argument("--graph-warmup-steps", type=int, default=150,
                   help="steps during which the graph predictor is frozen")
    q.add_argument("--accelerator", default="cpu", help="Lightning accelerator: cpu, gpu, auto")
    q.add_argument("--output-dir", default="runs/quickstart",
                   help="write CSV logs, quickstart.json and the pretrained predictor "
                        "(predictor/) here; '' writes nothing (default: runs/quickstart)")
    q.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    q.add_argument("--no-progress", action="store_true", help="no progress bar")
    q.set_defaults(func=_quickstart)

    p = sub.add_parser("pretrain", help="pretrain GLoMo on a text corpus (Lightning)",
                       description="Pretrain GLoMo on a text corpus. Settings come from a YAML "
                                   "file (sections corpus, model, train; see --print-config) "
                                   "and --set overrides.")
    p.add_argument("--config", help="YAML configuration file")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a setting, e.g. --set train.max_steps=500 (repeatable)")
    p.add_argument("--output-dir", help="run folder (corpus cache, checkpoints, logs, predictor)")
    p.add_argument("--resume", action="store_true",
                   help="continue from <output-dir>/checkpoints/last.ckpt")
    p.add_argument("--print-config", action="store_true", help="print the resolved settings")
    p.add_argument("--prepare-only", action="store_true",
                   help="tokenise the corpus and build the vocabulary, then stop (run once "
                        "before a multi-node job whose nodes share the output folder)")
    p.set_defaults(func=_pretrain)

    w = sub.add_parser("word-vectors", help="train word2vec vectors (GloVe text format)")
    w.add_argument("--corpus", required=True, help="text file or folder, or the aclImdb folder")
    w.add_argument("--format", default="text", choices=("text", "aclimdb"))
    w.add_argument("--one-per-line", action="store_true")
    w.add_argument("--output", required=True)
    w.add_argument("--dim", type=int, default=300)
    w.add_argument("--window", type=int, default=5)
    w.add_argument("--min-count", type=int, default=5)
    w.add_argument("--epochs", type=int, default=5)
    w.add_argument("--workers", type=int, default=2)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--max-documents", type=int, default=None)
    w.set_defaults(func=_word_vectors)

    y = sub.add_parser("syntax", help="score a predictor's graphs against gold dependency trees",
                       description="Score every graph of a saved predictor against gold "
                                   "dependency trees (CoNLL-U or CoNLL-X): attachment of the "
                                   "heaviest source, directed and undirected, and average "
                                   "precision, beside the adjacent-word, uniform and untrained "
                                   "baselines (docs/syntax.md).")
    y.add_argument("--predictor", required=True, help="folder written by save_pretrained")
    y.add_argument("--treebank", required=True, help="gold trees to report on (e.g. EWT dev)")
    y.add_argument("--select-treebank",
                   help="gold trees on which the single graph is chosen (e.g. EWT train)")
    y.add_argument("--format", choices=("conllu", "conllx"),
                   help="default: from the extension (.conll/.conllx: CoNLL-X)")
    y.add_argument("--max-sentences", type=int, help="only the first N trees of --treebank")
    y.add_argument("--select-sentences", type=int, default=2000,
                   help="only the first N trees of --select-treebank (default 2000)")
    y.add_argument("--metric", default="undirected", choices=("undirected", "directed", "ap"),
                   help="what the graph is chosen by")
    y.add_argument("--include-punct", action="store_true", help="score punctuation targets too")
    y.add_argument("--cased", action="store_true",
                   help="do not lower-case words (for a predictor trained on cased text)")
    y.add_argument("--no-untrained", action="store_true", help="skip the untrained baseline")
    y.add_argument("--seed", type=int, default=0, help="seed of the untrained baseline")
    y.add_argument("--batch-size", type=int, default=64)
    y.add_argument("--max-tokens", type=int, default=512,
                   help="skip (and count) sentences of more tokens: memory is O(tokens^2)")
    y.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    y.add_argument("--json", help="also write all scores to this JSON file")
    y.set_defaults(func=_syntax)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
