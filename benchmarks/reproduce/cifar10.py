"""Reproduce paper Table 3 (ImageNet 32x32 -> CIFAR-10 ResNet) with one command.

    python -m benchmarks.reproduce.cifar10 --data-dir ~/.cache/glomo-data [--reduced]

``--data-dir`` holds ``imagenet32/`` (Downsampled-ImageNet batches) and
``cifar-10-batches-py/`` (build them with ``python ../shared/data/build.py imagenet32 DIR``
and ``... cifar10 DIR``). Stages, each cached in ``--output-dir`` (default
``runs/cifar10-full`` / ``runs/cifar10-reduced``), so an interrupted reproduction (or one
spread over several short GPU allocations) continues where it stopped:

1. **pretraining** (``pretrain/``): ``glomo pretrain`` on the ImageNet images with
   ``configs/cifar10-gpu.yaml`` (full) or ``configs/cifar10-cpu.yaml`` (reduced), resumed
   from its last checkpoint; ``--predictor DIR`` uses an already trained predictor;
2. **pixel graphs** (``pixel_graphs.json``): per direction, layer and head, the weight the
   graphs put on the 4-neighbourhood of a pixel (the pixel analogue of the quickstart
   check) against uniform graphs over the same sources, and dead heads, on 64 CIFAR
   validation images; the same for the untrained predictor;
3. **split** (``split.json``): the seeded 42,000 / 8,000 train / validation split of the
   CIFAR-10 training images (indices and image counts recorded; a cached split for other
   data, with indices out of range or overlapping train and validation is refused; the
   reduced run uses a fixed subset);
4. **downstream** (``downstream.json``, one entry per ``resnet<depth>/<variant>/seed<s>``):
   :class:`~glomo_pyg.GlomoResNet` with ``graph='none'`` (baseline), ``'learned'`` (GLoMo)
   and ``'uniform'``, the identical recipe (:mod:`glomo_pyg.training.image_classification`),
   the same seeds; the epoch with the best validation accuracy is evaluated once on the
   10,000 test images (reduced: a fixed subset). ``--variants ... glomo-window
   uniform-window`` adds the same two graph variants cut to the predictor's pretraining
   window (``GlomoTransfer(max_distance=...)``: row and column offsets of at most
   ``--max-distance``, by default the recorded crop side minus 1), for predictors
   pretrained on crops smaller than the CIFAR images. Lightning checkpoints in ``runs/``
   (``<run>.ckpt`` after every epoch and on SIGTERM/SIGINT, ``<run>.best.ckpt`` the best
   validation epoch); the runs are stored with their recipe, image counts and the
   predictor's digest, and a cache made with others is refused (as is a checkpoint of
   another recipe, seed or training set);
5. ``benchmarks/results/cifar10.md``: a table shaped like paper Table 3 (mean +- std over
   seeds beside the paper's numbers), paired differences with 95% confidence intervals,
   epoch times, the pixel-graph check, and ``benchmarks/results/cifar10_graphs.png``: for
   one test image, the incoming weights of the centre and the bottom-right pixel in every
   graph (paper Fig. 4).

``--reduced`` is the CPU configuration (about an hour on 2 cores): pretraining on 16x16
crops of 20,000 ImageNet images, a 2-layer x 4-head predictor, ResNet-18 of width 16,
5,000 / 1,000 CIFAR train / validation images and 2,000 test images, 8 epochs, flips only
(so the GLoMo stage's propagations are precomputed once per image and orientation),
3 seeds. Its numbers are **not** a reproduction of the paper's; the full configuration
(the default, for a GPU) is.

Options, output paths and the input folders are checked before any stage; bad input and
damaged caches stop with one line naming them (``GLOMO_TRACEBACK=1`` shows the
traceback).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import math
import os
import re
import sys
import time
from typing import Dict, List, Optional, Tuple

import torch

from benchmarks.common import (
    as_script,
    cached_runs,
    check_common_arguments,
    file_digest,
    hardware,
    read_cache,
    run_reporting_errors,
    write_runs,
)
from benchmarks.statistics import mean_sd, paired_difference
from glomo_pyg.analysis import untrained_copy
from glomo_pyg.atomic_files import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "configs")
# Paper Table 3, CIFAR-10 test accuracy (%), mean +- std over 5 runs.
PAPER = {("resnet18", "baseline"): (90.93, 0.33), ("resnet18", "glomo"): (91.55, 0.23),
         ("resnet18", "uniform"): (91.07, 0.24), ("resnet34", "baseline"): (91.42, None),
         ("resnet34", "glomo"): (91.70, None)}
VARIANTS = {"baseline": "none", "glomo": "learned", "uniform": "uniform",
            "glomo-window": "learned", "uniform-window": "uniform"}
LABELS = {"baseline": "ResNet (same gate, no graphs)", "glomo": "ResNet + GLoMo",
          "uniform": "ResNet + uniform graphs",
          "glomo-window": "ResNet + GLoMo, graphs cut to the pretraining window",
          "uniform-window": "ResNet + uniform graphs over the same window"}
DEFAULT_VARIANTS = ("baseline", "glomo", "uniform")
# paired differences written up, where both variants ran
PAIRS = (("glomo", "baseline"), ("glomo", "uniform"), ("uniform", "baseline"),
         ("glomo-window", "glomo"), ("glomo-window", "baseline"),
         ("glomo-window", "uniform-window"), ("glomo-window", "uniform"),
         ("uniform-window", "uniform"))


@dataclasses.dataclass
class Setup:
    config: str
    train_images: Optional[int]  # None: all 42,000 of the split
    val_images: Optional[int]
    test_images: Optional[int]
    width: int
    depths: tuple
    epochs: int
    batch_size: int
    lr: float
    crop_padding: int
    precompute: bool  # precompute the stage's propagations (needs crop_padding=0)
    seeds: int
    pretrain_overrides: Optional[Dict] = None


FULL = Setup(config="cifar10-gpu.yaml", train_images=None, val_images=None, test_images=None,
             width=64, depths=(18,), epochs=18, batch_size=512, lr=0.4, crop_padding=4,
             precompute=False, seeds=3)
REDUCED = Setup(config="cifar10-cpu.yaml", train_images=5000, val_images=1000,
                test_images=2000, width=16, depths=(18,), epochs=8, batch_size=128, lr=0.2,
                crop_padding=0, precompute=True, seeds=3)
# Seconds: the test suite's end-to-end check of this script on tiny files.
SMOKE = Setup(config="cifar10-cpu.yaml", train_images=8, val_images=4, test_images=4, width=4,
              depths=(18,), epochs=1, batch_size=4, lr=0.05, crop_padding=0, precompute=True,
              seeds=1, pretrain_overrides=dict(
                  corpus=dict(max_images=8, crop=8),
                  model=dict(hidden_channels=8, num_layers=1, heads=2, cnn_layers=1,
                             num_positions=4),
                  train=dict(batch_size=4, max_steps=2, graph_warmup_steps=1, threads=0,
                             checkpoint_every=1, validate_every=1, graph_stats_every=1)))


def log(*args):
    print(time.strftime("[%H:%M:%S]"), *args, flush=True)


def check_arguments(args) -> None:
    """Every option and input folder checked before any stage (pretraining takes hours)."""
    check_common_arguments(args, (args.results, args.figure))
    if args.max_distance is not None and args.max_distance < 1:
        raise ValueError(f"--max-distance must be >= 1, got {args.max_distance}")
    if args.max_distance is not None and not any(
            v.endswith("-window") for v in args.variants or ()):
        raise ValueError("--max-distance applies to the *-window variants; add glomo-window "
                         "and/or uniform-window to --variants")
    if args.pretrain_steps is not None and args.pretrain_steps < 1:
        raise ValueError(f"--pretrain-steps must be >= 1, got {args.pretrain_steps}")
    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0 (0: torch's default), got {args.threads}")
    mode = "smoke" if args.smoke else "reduced" if args.reduced else "full"
    out = args.output_dir or f"runs/cifar10-{mode}"
    cached = os.path.exists(os.path.join(out, "pretrain", "pretrain.json"))  # stage 1 done
    needed = ([] if args.stop_after == "pretrain" else ["cifar-10-batches-py"]) + \
        ([] if args.predictor or cached else ["imagenet32"])
    for name in needed:
        if not os.path.isdir(os.path.join(args.data_dir, name)):
            raise ValueError(f"{os.path.join(args.data_dir, name)} is not a folder (--data-dir "
                             "must hold imagenet32/ and cifar-10-batches-py/)")


def checked_split(split: Dict, counts: Dict, path: str) -> Dict:
    """A cached ``split.json``: index lists in range, train and validation disjoint, made
    for data of the same size."""
    if split.get("counts") != counts:
        raise ValueError(f"{path} was made for other data ({split.get('counts')}, now "
                         f"{counts}); delete it to draw the split again")
    for key, size in (("train", counts["train"]), ("validation", counts["train"]),
                      ("test", counts["test"])):
        idx = split.get(key)
        if not isinstance(idx, list) or not idx or not all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < size for i in idx):
            raise ValueError(f"{path}: '{key}' must be a non-empty list of image indices in "
                             f"[0, {size}); delete it to draw the split again")
    if set(split["train"]) & set(split["validation"]):
        raise ValueError(f"{path}: training and validation images overlap; delete it")
    return split


def pretrain(args, setup: Setup, out: str) -> str:
    """Stage 1: the pretrained predictor's folder (trained here unless --predictor)."""
    if args.predictor:
        return args.predictor
    import yaml

    from glomo_pyg.training import PretrainConfig, run_pretraining
    from glomo_pyg.training.pretrain.config import set_by_path
    from glomo_pyg.training.pretrain.trainer import last_checkpoint

    folder = os.path.join(out, "pretrain")
    predictor = os.path.join(folder, "predictor")
    if os.path.exists(os.path.join(folder, "pretrain.json")):
        if args.pretrain_steps is not None:
            steps = read_cache(os.path.join(folder, "config.json"),
                               "pretraining settings").get("train", {}).get("max_steps")
            if steps != args.pretrain_steps:
                raise ValueError(f"{folder} holds a pretraining of {steps} steps, not "
                                 f"--pretrain-steps {args.pretrain_steps}; delete it to "
                                 "pretrain again, or leave out --pretrain-steps")
        log(f"pretraining: cached ({predictor})")
        return predictor
    with open(os.path.join(CONFIGS, setup.config)) as fh:
        data = yaml.safe_load(fh)
    data["output_dir"] = folder
    set_by_path(data, "corpus.path", os.path.join(args.data_dir, "imagenet32"))
    for section, values in (setup.pretrain_overrides or {}).items():
        for key, value in values.items():
            set_by_path(data, f"{section}.{key}", value)
    if args.pretrain_steps is not None:
        set_by_path(data, "train.max_steps", args.pretrain_steps)
    set_by_path(data, "train.progress_bar", False)
    if args.accelerator != "auto":
        set_by_path(data, "train.accelerator", args.accelerator)
    if args.threads:
        set_by_path(data, "train.threads", args.threads)
    config = PretrainConfig.from_dict(data)
    log(f"pretraining ({setup.config}) in {folder}")
    run_pretraining(config, resume=last_checkpoint(folder) is not None)
    return predictor


@torch.no_grad()
def pixel_graph_check(predictor, images: torch.Tensor, chunk: int = 8) -> Dict:
    """Per direction, layer and head: weight on the 4-neighbourhood, share of targets
    without edges, weighted edge distance (averaged over chunks of ``chunk`` images, as
    the sparse edges of 1024-pixel images are large), the uniform graphs' values and
    the dead heads."""
    from glomo_pyg.analysis.statistics import DEAD_HEAD_SHARE, graph_health
    from glomo_pyg.pixels import image_units

    sums: Dict[str, Dict] = {}
    chunks = 0
    for start in range(0, len(images), chunk):
        graphs = predictor.eval()(*image_units(images[start:start + chunk]))
        chunks += 1
        for d in predictor.directions:
            h = graph_health(getattr(graphs, d))
            acc = sums.setdefault(d, dict(neighbour=0, empty=0, distance=0,
                                          uniform_neighbour=0.0, uniform_distance=0.0))
            acc["neighbour"] = acc["neighbour"] + h.adjacent
            acc["empty"] = acc["empty"] + h.empty
            acc["distance"] = acc["distance"] + h.distance
            acc["uniform_neighbour"] += h.uniform_adjacent
            acc["uniform_distance"] += h.uniform_distance
    out = {}
    for d, acc in sums.items():
        empty = acc["empty"] / chunks
        out[d] = dict(neighbour=(acc["neighbour"] / chunks).tolist(), empty=empty.tolist(),
                      distance=(acc["distance"] / chunks).tolist(),
                      uniform_neighbour=acc["uniform_neighbour"] / chunks,
                      uniform_distance=acc["uniform_distance"] / chunks,
                      dead_heads=[tuple(x) for x in (empty > DEAD_HEAD_SHARE).nonzero().tolist()])
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True,
                        help="folder holding imagenet32/ and cifar-10-batches-py/")
    parser.add_argument("--reduced", action="store_true", help="the CPU configuration")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)  # tests only
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--depths", type=int, nargs="+", choices=(18, 34), default=None)
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=None,
                        help=f"default: {' '.join(DEFAULT_VARIANTS)}")
    parser.add_argument("--max-distance", type=int, default=None,
                        help="the *-window variants' window: largest row or column offset "
                        "kept (default: the predictor's recorded pretraining crop side - 1)")
    parser.add_argument("--pretrain-steps", type=int, default=None,
                        help="pretraining steps instead of the config's max_steps (to fit a "
                        "GPU budget; recorded with the pretraining settings)")
    parser.add_argument("--predictor", default=None, help="a saved pixel predictor to use "
                        "instead of pretraining one")
    parser.add_argument("--accelerator", default="auto", help="'cpu', 'gpu' or 'auto'")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.add_argument("--stop-after", choices=("pretrain", "graphs", "downstream"),
                        default=None, help="stop after this stage (e.g. to fit a GPU call)")
    parser.add_argument("--results", default="benchmarks/results/cifar10.md")
    parser.add_argument("--figure", default="benchmarks/results/cifar10_graphs.png")
    args = parser.parse_args(argv)
    run_reporting_errors("benchmarks.reproduce.cifar10", run, args, argv)


def load_pixel_predictor(predictor_dir: str) -> Tuple:
    """The pixel predictor in ``predictor_dir`` (in the fused layout, FlexAttention, for
    these 1024-unit images without gradients) and its pretraining summary and settings
    (empty if absent)."""
    from glomo_pyg import PretrainedGraphPredictor

    predictor = PretrainedGraphPredictor.from_pretrained(predictor_dir).eval().set_layout("auto")
    if predictor.vocabulary is not None or "height" not in \
            predictor.predictor(predictor.directions[0]).config():
        raise ValueError(f"{predictor_dir} is not a pixel predictor (it reads words or "
                         "features); pretrain one on images (corpus.format imagenet32)")
    run_dir = os.path.dirname(os.path.abspath(predictor_dir))
    summary_path, config_path = (os.path.join(run_dir, "pretrain.json"),
                                 os.path.join(run_dir, "config.json"))
    pretrain_summary = read_cache(summary_path, "pretraining summary") \
        if os.path.exists(summary_path) else {}
    pretrain_config = read_cache(config_path, "pretraining settings") \
        if os.path.exists(config_path) else {}
    return predictor, pretrain_summary, pretrain_config


def image_split(args, setup: Setup, out: str) -> Tuple:
    """CIFAR-10's train, validation and test images and labels, the split cached in
    ``split.json``."""
    from glomo_pyg.data.images import load_cifar10, train_validation_split

    cifar = os.path.join(args.data_dir, "cifar-10-batches-py")
    images, labels = load_cifar10(cifar, "train")
    test_images, test_labels = load_cifar10(cifar, "test")
    split_path = os.path.join(out, "split.json")
    counts = dict(train=len(images), test=len(test_images))
    if os.path.exists(split_path):
        split = checked_split(read_cache(split_path, "image split"), counts, split_path)
    else:
        train_idx, val_idx = train_validation_split(len(images), 8000 if len(images) > 8000
                                                    else len(images) // 5, seed=0)
        train_idx, val_idx = train_idx.tolist(), val_idx.tolist()
        if setup.train_images:
            train_idx = train_idx[:setup.train_images]
        if setup.val_images:
            val_idx = val_idx[:setup.val_images]
        test_idx = list(range(len(test_images)))
        if setup.test_images:
            perm = torch.randperm(len(test_images), generator=torch.Generator().manual_seed(1))
            test_idx = sorted(perm[:setup.test_images].tolist())
        split = dict(seed=0, counts=counts, train=train_idx, validation=val_idx, test=test_idx)
        write_json(split_path, split)
    train = (images[split["train"]], labels[split["train"]])
    val = (images[split["validation"]], labels[split["validation"]])
    test = (test_images[split["test"]], test_labels[split["test"]])
    log(f"CIFAR-10: {len(train[0])} train / {len(val[0])} validation / {len(test[0])} test")
    return train, val, test


def graph_check(predictor, images: torch.Tensor, out: str) -> Dict:
    """The pixel graph check of the learned and an untrained predictor on up to 64
    validation images, cached in ``pixel_graphs.json``."""
    graphs_path = os.path.join(out, "pixel_graphs.json")
    check = read_cache(graphs_path, "pixel graph check") if os.path.exists(graphs_path) else None
    if check is not None and not (isinstance(check.get("learned"), dict) and all(
            isinstance(v, dict) and {"neighbour", "uniform_neighbour", "dead_heads"} <= set(v)
            for v in check["learned"].values())):
        raise ValueError(f"{graphs_path} (pixel graph check) is damaged; delete it")
    if check is None:
        sample = images[:min(64, len(images))]
        t0 = time.time()
        learned = pixel_graph_check(predictor, sample)
        untrained = untrained_copy(predictor)
        check = dict(images=len(sample), learned=learned,
                     untrained=pixel_graph_check(untrained, sample),
                     seconds=round(time.time() - t0, 1))
        write_json(graphs_path, check)
    for d, v in check["learned"].items():
        layers = [sum(row) / len(row) for row in v["neighbour"]]
        log(f"pixel graphs ({d}): 4-neighbourhood weight per layer "
            f"{', '.join(f'{x:.3f}' for x in layers)} vs uniform {v['uniform_neighbour']:.4f}; "
            f"dead heads {v['dead_heads']}")
    return check


def graph_window(args, predictor, predictor_dir: str, variants, side: int, runs: Dict,
                 runs_path: str) -> Optional[int]:
    """The ``max_distance`` of the *-window variants: ``--max-distance``, else the
    pretraining crop side minus 1; refused if it keeps every pair or differs from the
    cached window runs'."""
    window = args.max_distance
    windowed = any(v.endswith("-window") for v in variants)
    if window is None and windowed:
        if predictor.trained_size is None:
            raise ValueError(f"{predictor_dir} records no pretraining image size (saved before "
                             "glomo_pyg recorded it): give --max-distance for the *-window "
                             "variants (the crop side minus 1)")
        window = min(predictor.trained_size) - 1
    if windowed and window is not None and window >= side - 1:
        raise ValueError(f"a window of {window} keeps every pair of {side}-pixel images: the "
                         "*-window variants would repeat glomo and uniform (was the predictor "
                         "pretrained on whole images?)")
    other = sorted({runs[k].get("max_distance") for k in runs if "-window/" in k} - {window})
    if other and window is not None:  # one window per cache: its pairs must be like for like
        raise ValueError(f"{runs_path} holds window runs with max_distance {other[0]}, not "
                         f"{window}: give --max-distance {other[0]} or another --output-dir")
    return window


def train_variants(setup: Setup, variants, predictor, data, recipe, window, runs: Dict,
                   runs_path: str, settings: Dict, out: str, device) -> None:
    """Every (depth, seed, variant) run not in ``runs``, each recorded as it ends."""
    from glomo_pyg import GlomoResNet, GlomoTransfer
    from glomo_pyg.training.image_classification import (
        evaluate,
        precompute_propagations,
        train_image_classifier,
    )

    train, val, test = data
    cache: Dict[str, Dict] = {}
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)

    def propagations(model: GlomoResNet, variant: str):
        if not setup.precompute or variant == "baseline":
            return None, None, None
        if variant not in cache:
            t0 = time.time()
            cache[variant] = dict(
                train=precompute_propagations(model, train[0]),
                mirrored=precompute_propagations(model, train[0].flip(3)),
                val=precompute_propagations(model, val[0]),
                test=precompute_propagations(model, test[0]))
            log(f"{variant}: propagations precomputed in {time.time() - t0:.0f} s")
        c = cache[variant]
        return (c["train"], c["mirrored"]), c["val"], c["test"]

    for depth in setup.depths:
        for seed in range(setup.seeds):
            for variant in variants:
                key = f"resnet{depth}/{variant}/seed{seed}"
                if key in runs:
                    continue
                torch.manual_seed(seed)
                transfer = GlomoTransfer(predictor, 3, graph=VARIANTS[variant],
                                         max_distance=window if variant.endswith("-window")
                                         else None)
                model = GlomoResNet(transfer, depth=depth, width=setup.width).to(device)
                train_prop, val_prop, test_prop = propagations(model, variant)
                log(f"{key}: training")
                result = train_image_classifier(
                    model, train, val, recipe, seed=seed, device=device,
                    checkpoint=os.path.join(out, "runs", key.replace("/", "_") + ".ckpt"),
                    train_propagations=train_prop, val_propagations=val_prop)
                test_acc = evaluate(model, test[0], test[1], recipe.eval_batch_size, test_prop,
                                    device)
                runs[key] = dict(test_acc=test_acc, best_val=result["best_val"],
                                 best_epoch=result["best_epoch"], val_curve=result["val_curve"],
                                 epoch_seconds=result["epoch_seconds"],
                                 diverged_at_epoch=result["diverged_at_epoch"],
                                 trainable=sum(p.numel() for p in model.parameters()
                                               if p.requires_grad))
                if variant.endswith("-window"):
                    runs[key]["max_distance"] = window
                write_runs(runs_path, settings, runs)
                log(f"{key}: test {test_acc:.4f} (validation {result['best_val']:.4f} at "
                    f"epoch {result['best_epoch'] + 1})")


def run(args, argv=None) -> None:
    """The reproduction for parsed ``args`` (see :func:`main`); the library's messages
    (each epoch of a run: ``glomo_pyg`` log records) are printed like :func:`log`'s lines
    meanwhile."""
    from glomo_pyg.logs import line_handler, logging_to

    handler = line_handler()
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%H:%M:%S"))
    with logging_to(handler):
        _run_stages(args, argv)


def _run_stages(args, argv) -> None:
    check_arguments(args)
    setup = dataclasses.replace(SMOKE if args.smoke else REDUCED if args.reduced else FULL)
    if args.seeds is not None:
        setup.seeds = args.seeds
    if args.epochs is not None:
        setup.epochs = args.epochs
    if args.depths:
        setup.depths = tuple(args.depths)
    variants = tuple(dict.fromkeys(args.variants or DEFAULT_VARIANTS))
    if args.threads:
        torch.set_num_threads(args.threads)
    mode = "smoke" if args.smoke else "reduced" if args.reduced else "full"
    out = args.output_dir or f"runs/cifar10-{mode}"
    os.makedirs(out, exist_ok=True)
    command = "python -m benchmarks.reproduce.cifar10 " + " ".join(
        sys.argv[1:] if argv is None else argv)
    started = time.time()
    from glomo_pyg.training.image_classification import ImageTrainConfig

    device = torch.device("cuda" if args.accelerator in ("auto", "gpu") and
                          torch.cuda.is_available() else "cpu")
    predictor_dir = pretrain(args, setup, out)
    if args.stop_after == "pretrain":
        return
    predictor, pretrain_summary, pretrain_config = load_pixel_predictor(predictor_dir)
    train, val, test = image_split(args, setup, out)
    check = graph_check(predictor, val[0], out)
    if args.stop_after == "graphs":
        return
    runs_path = os.path.join(out, "downstream.json")
    recipe = ImageTrainConfig(epochs=setup.epochs, batch_size=setup.batch_size, lr=setup.lr,
                              crop_padding=setup.crop_padding)
    settings = dict(dataclasses.asdict(recipe), width=setup.width,
                    precompute=setup.precompute,
                    images=[len(train[0]), len(val[0]), len(test[0])],
                    predictor=file_digest(os.path.join(predictor_dir, "model.safetensors")))
    runs = cached_runs(runs_path, settings, log)
    window = graph_window(args, predictor, predictor_dir, variants, max(train[0].shape[2:]),
                          runs, runs_path)
    train_variants(setup, variants, predictor, (train, val, test), recipe, window, runs,
                   runs_path, settings, out, device)
    if args.stop_after == "downstream":
        return
    figure(predictor, test[0][0], args.figure)
    write_results(args, setup, mode, command, runs, check, pretrain_summary, pretrain_config,
                  len(train[0]), len(val[0]), len(test[0]), device, time.time() - started)


def figure(predictor, image: torch.Tensor, path: str) -> None:
    """Paper Fig. 4: one image and, for every graph, the incoming weights of the centre
    pixel and of the bottom-right pixel as heat maps over the image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from glomo_pyg.pixels import image_units

    _, h, w = image.shape
    with torch.no_grad():
        graphs = predictor.eval()(*image_units(image.unsqueeze(0)))
    targets = {"centre": (h // 2) * w + w // 2, "bottom-right": h * w - 1}
    panels = [(d, l, k) for d in predictor.directions for l in range(predictor.num_layers)
              for k in range(predictor.heads)]
    cols = predictor.heads
    rows = len(panels) // cols
    fig, axes = plt.subplots(2 * rows, cols + 1, figsize=(1.6 * (cols + 1), 1.6 * 2 * rows),
                             squeeze=False)
    rgb = image.permute(1, 2, 0).numpy()
    for r in range(2 * rows):
        axes[r][0].imshow(rgb)
        axes[r][0].set_xticks([])
        axes[r][0].set_yticks([])
    for t_i, (name, target) in enumerate(targets.items()):
        ty, tx = divmod(target, w)
        for p, (d, l, k) in enumerate(panels):
            dense = getattr(graphs, d).to_dense(layer=l)[0, k]  # [T, T], [i, j] = G_ij
            weights = dense[:, target].view(h, w).numpy()
            row, col = t_i * rows + p // cols, p % cols + 1
            ax = axes[row][col]
            ax.imshow(weights, cmap="viridis", vmin=0)
            ax.scatter([tx], [ty], marker="x", c="red", s=12)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"{name} {dict(forward='fw', backward='bw')[d]} L{l} h{k}",
                         fontsize=6)
        axes[t_i * rows][0].set_title(f"image ({name} x)", fontsize=6)
    fig.suptitle("Incoming graph weights of one pixel (red x), every graph", fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log(f"figure written to {path}")


def _mean_std(values: List[float]) -> str:
    m, sd = mean_sd(values)
    return f"{100 * m:.2f}" if len(values) < 2 else f"{100 * m:.2f} ± {100 * sd:.2f}"


def _graph_check_lines(check: Dict) -> List[str]:
    """The pixel graph check as a table."""
    lines = ["", f"Pixel graphs on {check['images']} CIFAR validation images: weight on the "
             "4-neighbourhood of a pixel (left and above for forward graphs, right and below "
             "for backward), head-averaged per layer, against uniform graphs over the same "
             "sources; dead heads = heads with more than half of their targets without edges.",
             "", "| direction | layer | learned | untrained | uniform | dead heads |",
             "|---|---|---|---|---|---|"]
    for d, v in check["learned"].items():
        u = check["untrained"][d]
        for l, row in enumerate(v["neighbour"]):
            dead = [h for (ll, h) in v["dead_heads"] if ll == l]
            lines.append(f"| {d} | {l} | {sum(row) / len(row):.4f} | "
                         f"{sum(u['neighbour'][l]) / len(row):.4f} | "
                         f"{v['uniform_neighbour']:.4f} | {dead or 'none'} |")
    return lines


def _run_lines(mode: str, command: str, device, seconds: float) -> List[str]:
    """The section's title, the command, the hardware and the time of this invocation."""
    return [f"## {datetime.date.today().isoformat()}: {mode} configuration"
            + (" (reduced CPU run: NOT a reproduction of the paper)" if mode != "full" else ""),
            "", f"- command: `{command}`", f"- hardware: {hardware(device.type)}; torch "
            f"{torch.__version__}", f"- whole run (this invocation): {seconds / 60:.1f} min"]


def _pretrain_lines(pretrain_summary: Dict, pretrain_config: Dict) -> List[str]:
    """The pretraining run and the predictor's shape, where known."""
    corpus = pretrain_config.get("corpus", {})
    model = pretrain_config.get("model", {})
    lines = []
    if pretrain_summary:
        lines.append(
            f"- pretraining: {pretrain_summary.get('images')} ImageNet 32x32 images "
            f"(Tiny ImageNet, box-downsampled, JPEG q90)"
            + (f", random {corpus.get('crop')}x{corpus.get('crop')} crops" if corpus.get("crop")
               else "")
            + f"; {pretrain_summary.get('steps')} steps in {pretrain_summary.get('seconds')} s; "
            f"final validation loss {pretrain_summary.get('val_loss') or float('nan'):.3f} nats "
            f"per sub-pixel (uniform: {math.log(256):.3f})")
    if model:
        lines.append(f"- predictor: {model.get('num_layers')} layers x {model.get('heads')} heads "
                     f"x 2 directions, width {model.get('hidden_channels')}, position "
                     f"{model.get('position')}")
    return lines


def _recipe_lines(setup, n_train: int, n_val: int, n_test: int) -> List[str]:
    """The CIFAR-10 splits and the downstream recipe every variant trains with."""
    return [f"- CIFAR-10: {n_train} train / {n_val} validation / {n_test} test images "
            "(these CIFAR pixels went through JPEG quality 75 once: close to, not identical "
            "with, the official files)",
            f"- recipe (every variant): ResNet width {setup.width}, {setup.epochs} epochs, "
            f"batch {setup.batch_size}, SGD Nesterov 0.9, one-cycle peak lr {setup.lr}, "
            f"weight decay 5e-4, flips" + (f" + random crops (pad {setup.crop_padding})"
                                           if setup.crop_padding else " only")
            + "; the best validation epoch is evaluated once on test", ""]


def _accuracy_table(setup, runs: Dict) -> List[str]:
    """Test accuracy of each depth and variant run, beside the paper's."""
    lines = ["| model | paper | this run (mean ± std) | seeds | epoch s (mean) |",
             "|---|---|---|---|---|"]
    for depth in setup.depths:
        for variant in VARIANTS:
            keys = sorted(k for k in runs if k.startswith(f"resnet{depth}/{variant}/"))
            if not keys:
                continue
            accs = [runs[k]["test_acc"] for k in keys]
            epochs = [s for k in keys for s in runs[k]["epoch_seconds"]]
            paper = PAPER.get((f"resnet{depth}", variant))
            paper_s = "-" if paper is None else (f"{paper[0]:.2f}" + (
                f" ± {paper[1]:.2f}" if paper[1] is not None else ""))
            label = LABELS[variant]
            if variant.endswith("-window"):
                label += f" (offsets <= {runs[keys[0]].get('max_distance')})"
            lines.append(f"| ResNet-{depth}: {label} | {paper_s} | {_mean_std(accs)} | "
                         f"{len(keys)} | {sum(epochs) / len(epochs):.1f} |")
    return lines


def _seed_accuracies(runs: Dict, depth: int, variant: str) -> Dict[int, float]:
    """Test accuracy of each seed of one depth and variant."""
    return {int(k.rsplit("seed", 1)[1]): runs[k]["test_acc"] for k in runs
            if k.startswith(f"resnet{depth}/{variant}/")}


def _pair_lines(setup, runs: Dict) -> List[str]:
    """Paired test-accuracy differences of the compared variants, per depth."""
    lines = []
    for depth in setup.depths:
        for a, b in PAIRS:
            x, y = _seed_accuracies(runs, depth, a), _seed_accuracies(runs, depth, b)
            seeds = sorted(set(x) & set(y))
            if not seeds:
                continue
            m, lo, hi, n = paired_difference([x[s] for s in seeds], [y[s] for s in seeds])
            ci = "" if n < 2 else f" [{100 * lo:+.2f}, {100 * hi:+.2f}]"
            lines.append(f"- ResNet-{depth}, {a} − {b}: {100 * m:+.2f} points{ci} "
                         f"(paired over seeds {seeds}, 95% t interval)")
    return lines


def _write_first(path: str, text: str) -> None:
    """Write the run's section ``text`` into the results file, atomically: after what the
    file opens with (its answer and protocol) and before the dated runs already there,
    newest first."""
    from glomo_pyg.atomic_files import atomic_write

    header = "# ImageNet 32x32 -> CIFAR-10 (paper Sec. 3.5, Table 3)\n\n"
    previous = open(path, encoding="utf-8").read() if os.path.exists(path) else header
    if not previous.startswith(header):
        previous = header + previous
    runs = re.search(r"^## \d{4}-\d{2}-\d{2}", previous, flags=re.M)
    cut = runs.start() if runs else len(previous)
    opening = previous[:cut].rstrip("\n") + "\n\n"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_write(path) as fh:
        fh.write(opening + text.rstrip("\n") + "\n\n" + previous[cut:] if runs else
                 opening + text)


def write_results(args, setup, mode, command, runs, check, pretrain_summary, pretrain_config,
                  n_train, n_val, n_test, device, seconds) -> None:
    """Add this run's section to the top of ``args.results``."""
    lines = _run_lines(mode, command, device, seconds)
    lines += _pretrain_lines(pretrain_summary, pretrain_config)
    lines += _recipe_lines(setup, n_train, n_val, n_test)
    lines += _accuracy_table(setup, runs)
    lines.append("")
    lines += _pair_lines(setup, runs)
    lines += _graph_check_lines(check)
    lines += ["", f"Figure (paper Fig. 4): `{args.figure}`.", ""]
    _write_first(args.results, "\n".join(lines) + "\n")
    log(f"results written to {args.results}")


if __name__ == "__main__":
    as_script(main)
