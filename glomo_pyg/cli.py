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
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
