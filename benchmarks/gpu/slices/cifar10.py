"""``cifar10`` (repeatable): paper Table 3's downstream runs with the released pixel
predictor ``imagenet32-pixel``: CIFAR ResNet-18 (then ResNet-34) with the input stage
off (``baseline``: the same gate and widths, no graphs), with GLoMo graphs (``glomo``)
and with uniform graphs (``uniform``); the same recipe, data and seeds for every
variant, keys interleaved by seed so every call adds complete pairs.

Every run trains and tests through the library
(:func:`~glomo_pyg.training.image_classification.train_image_classifier`,
:func:`~glomo_pyg.training.image_classification.evaluate`); the recipe's ``train`` is
an :class:`~glomo_pyg.training.image_classification.ImageTrainConfig`. It is a fast
public-style one: bf16-mixed, channels-last, batch 512, Nesterov SGD with a one-cycle
(linear up, linear down) schedule, label smoothing, random flips and crops. The frozen
predictor's work is not redone every epoch: the GLoMo stage's propagations are computed
once per image and orientation (the graphs are directional, so a mirrored image has
graphs of its own) and kept in GPU memory in float16 (uniform graphs are running means,
computed on the fly); the random crops (4 pixels of zero padding,
``crop_target='stage'``) cut the stage's output :math:`H'` rather than the pixels, for
every variant alike, so they need no new graphs. The best validation epoch (42,000 /
8,000 seeded split of the training images) is evaluated once on the 10,000 test images.

The ledger's first run (recipe ``d602614c0db1f8f5``) was trained by this slice's own
loop before it moved to the library (which keeps the momentum constant as that loop
did, but keeps a last partial batch an epoch); it is reported as a run of an earlier
recipe.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Dict, List, Optional

import torch

from benchmarks.gpu import data
from benchmarks.gpu.report import md
from benchmarks.gpu.slices.common import cifar, release_folder, release_sha256

ARCHIVES = (data.CIFAR,)
RESULTS = "cifar10.md"
KEYS_PER_PROCESS = None  # one process for the call: the propagations are computed once
RELEASE = "imagenet32-pixel"
VARIANTS = {"baseline": "none", "glomo": "learned", "uniform": "uniform"}
PAPER = {(18, "baseline"): 90.93, (18, "glomo"): 91.55, (18, "uniform"): 91.07,
         (34, "baseline"): 91.42, (34, "glomo"): 91.70}
TARGETS = dict(baseline_acc=92.5, run_s=35.0, stage_s=30.0, epoch_ratio=1.5,
               glomo_minus_baseline=0.6, glomo_minus_uniform=0.5)
KEY_FIELDS = ("depths", "seeds")  # more seeds or depths keep the recorded runs
# A run's time on an H100 until the ledger has timings of the recipe: the profile's
# ResNet-18 epoch of 42,000 images with the precomputed stage (1.2 s; 24 epochs: 29 s),
# plus validation, the test and cuDNN's autotuning; ResNet-34 about twice that.
PRIOR_RUN_S = {18: 60.0, 34: 110.0}


def _train_config(**settings) -> Dict:
    """An :class:`ImageTrainConfig` as the recipe records it: every field, so a setting
    the library adds changes the recipe's digest."""
    from glomo_pyg.training.image_classification import ImageTrainConfig

    config = ImageTrainConfig(**settings)
    config.validate()
    return dataclasses.asdict(config)


def recipe(dry_run: bool) -> Dict:
    r = dict(predictor=dict(release=RELEASE, sha256=release_sha256(RELEASE)), width=64,
             depths=[18, 34], seeds={"18": 10, "34": 5}, side=32,
             split=dict(validation=8000, seed=0),
             train=_train_config(epochs=24, batch_size=512, lr=0.4, momentum=0.9,
                                 weight_decay=5e-4, warmup_fraction=0.25,
                                 label_smoothing=0.1, flip=True, crop_padding=4,
                                 crop_target="stage", eval_batch_size=1024),
             precision="bf16-mixed",
             # estimate_s: the propagations of 102,000 images at the profile's
             # transfer-forward rate on an H100 (939 images/s: 109 s)
             stage=dict(precompute=["learned"], dtype="float16", batch=256, estimate_s=120))
    if dry_run:  # an untrained toy predictor and toy sizes: the same code in seconds
        r.update(predictor=dict(toy=dict(hidden_channels=8, num_layers=1, heads=2,
                                         cnn_layers=1, num_positions=4)),
                 width=4, depths=[18], seeds={"18": 2}, side=8,
                 split=dict(validation=8, seed=0), precision="32-true",
                 train=_train_config(**dict(r["train"], epochs=2, batch_size=8,
                                            eval_batch_size=16, crop_padding=1)),
                 stage=dict(r["stage"], batch=8))
    return r


def keys(recipe: Dict) -> List[str]:
    if not recipe["predictor"].get("toy") and not recipe["predictor"].get("sha256"):
        return []  # no released predictor yet: pixel-pretrain comes first
    return [f"resnet{d}/{v}/seed{s}" for d in recipe["depths"]
            for s in range(recipe["seeds"][str(d)]) for v in VARIANTS]


def blocked(recipe: Dict) -> Optional[str]:
    if not recipe["predictor"].get("toy") and not recipe["predictor"].get("sha256"):
        return f"needs the release pretrained/{RELEASE} (the pixel-pretrain slice makes it)"
    return None


def _depth(key: str) -> int:
    return int(key.split("/")[0][len("resnet"):])


def _precomputed(key: str, recipe: Dict) -> bool:
    return VARIANTS.get(key.split("/")[1]) in recipe["stage"]["precompute"]


def min_seconds(key: str, recipe: Dict) -> float:
    """A run's time, plus (GLoMo, before this process has them) the propagations'."""
    if recipe["train"]["epochs"] < 5:
        return 5.0
    run = PRIOR_RUN_S[_depth(key)]
    if _precomputed(key, recipe) and key.split("/")[1] not in _STATE.get("stages", {}):
        run += recipe["stage"]["estimate_s"]
    return run


def estimate_seconds(keys: List[str], recipe: Dict, recorded: List[Dict]) -> float:
    """``keys`` run in one process: each run, and the propagations once, timed as the
    slowest recorded run of the recipe at that depth (and the slowest propagations) with
    10% to spare, or by the priors before any is recorded."""
    if recipe["train"]["epochs"] < 5:
        return 5.0 * len(keys)

    def slowest(values: List, prior: float) -> float:
        values = [v for v in values if isinstance(v, (int, float))]
        return 1.1 * max(values) if values else prior

    runs = {d: slowest([l["metrics"].get("seconds") for l in recorded
                        if _depth(l["key"]) == d], PRIOR_RUN_S[d]) for d in PRIOR_RUN_S}
    stage = slowest([l["metrics"].get("propagations_s") or None for l in recorded],
                    recipe["stage"]["estimate_s"])
    return sum(runs[_depth(k)] for k in keys) + \
        stage * len({k.split("/")[1] for k in keys if _precomputed(k, recipe)})


def _predictor(recipe: Dict, device: str):
    from glomo_pyg import Glomo, PretrainedGraphPredictor

    if recipe["predictor"].get("toy"):
        torch.manual_seed(0)
        p = Glomo.image(in_channels=3, height=recipe["side"], width=recipe["side"],
                        **recipe["predictor"]["toy"]).to_pretrained()
    else:
        p = PretrainedGraphPredictor.from_pretrained(release_folder(recipe["predictor"]))
    return p.to(device).eval().set_layout("auto")


_STATE: Dict = {}  # per process: data, predictor and each variant's propagations, built once


def _splits(ctx) -> Dict:
    """The train / validation / test images (uint8, host memory: a batch is 1.5 MB to
    copy) and labels, and the predictor, read once per process."""
    if "splits" not in _STATE:
        from glomo_pyg.data.images import train_validation_split

        r = ctx.recipe
        images, labels = cifar(ctx.data_dir, "train", side=r["side"])
        train_idx, val_idx = train_validation_split(len(images), r["split"]["validation"],
                                                    r["split"]["seed"])
        _STATE["splits"] = dict(train=(images[train_idx], labels[train_idx]),
                                val=(images[val_idx], labels[val_idx]),
                                test=cifar(ctx.data_dir, "test", side=r["side"]))
        _STATE["predictor"] = _predictor(r, ctx.device)
    return _STATE["splits"]


def _propagations(model, variant: str, ctx) -> tuple:
    """The variant's precomputed propagations (``{}`` where its stage runs on the fly)
    on the device, computed on its first key in this process and kept (they depend on
    the frozen predictor and the pixels alone; the stage's gate and mixing weights are
    each run's own), and the seconds this key spent on them."""
    from glomo_pyg.training.image_classification import precompute_propagations

    s, stages = ctx.recipe["stage"], _STATE.setdefault("stages", {})
    if VARIANTS[variant] not in s["precompute"]:
        return {}, 0.0
    if variant in stages:
        return stages[variant], 0.0
    start, splits = time.time(), _splits(ctx)

    def of(images: torch.Tensor) -> torch.Tensor:
        return precompute_propagations(model, images, s["batch"], getattr(torch, s["dtype"]),
                                       storage=None)

    stages[variant] = dict(train=(of(splits["train"][0]), of(splits["train"][0].flip(3))),
                           val=of(splits["val"][0]), test=of(splits["test"][0]))
    if ctx.device == "cuda":
        torch.cuda.synchronize()
    return stages[variant], round(time.time() - start, 3)


def run_key(key: str, ctx) -> Dict:
    from glomo_pyg import GlomoResNet, GlomoTransfer
    from glomo_pyg.training.image_classification import (
        ImageTrainConfig,
        evaluate,
        train_image_classifier,
    )

    depth, variant, seed = _depth(key), key.split("/")[1], int(key.rsplit("seed", 1)[1])
    r, device = ctx.recipe, torch.device(ctx.device)
    torch.backends.cudnn.benchmark = True  # fixed shapes: the fastest convolutions
    splits = _splits(ctx)
    torch.manual_seed(seed)
    model = GlomoResNet(GlomoTransfer(_STATE["predictor"], 3, graph=VARIANTS[variant]),
                        depth=depth, width=r["width"]).to(device)
    propagations, stage_s = _propagations(model, variant, ctx)
    config = ImageTrainConfig(**r["train"])
    start = time.time()
    result = train_image_classifier(
        model, splits["train"], splits["val"], config, seed=seed, device=device,
        precision=r["precision"], train_propagations=propagations.get("train"),
        val_propagations=propagations.get("val"))
    test = evaluate(model, *splits["test"], config.eval_batch_size, propagations.get("test"),
                    device)
    metrics = dict(test_acc=test, best_val=result["best_val"], best_epoch=result["best_epoch"],
                   val_curve=result["val_curve"], train_loss=result["train_loss"],
                   epoch_s=[round(s, 3) for s in result["epoch_seconds"]],
                   diverged_at_epoch=result["diverged_at_epoch"],
                   seconds=round(time.time() - start, 1), propagations_s=stage_s,
                   trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
                   images=[len(splits[k][0]) for k in ("train", "val", "test")])
    ctx.log(f"{key}: test {test:.4f} (validation {result['best_val']:.4f} at epoch "
            f"{result['best_epoch'] + 1}); {metrics['seconds']} s"
            + (f" + {stage_s} s of propagations" if stage_s else ""))
    return metrics


def _mean(values: List[float]) -> float:
    from benchmarks.statistics import mean_sd

    return mean_sd(values)[0]


def _target_lines(acc: Dict, runs: Dict[str, Dict], lines: List[Dict]) -> List[str]:
    """The targets met or not, from ResNet-18's runs (none without its baseline)."""
    from benchmarks.statistics import paired_difference

    base = acc.get((18, "baseline"))
    if not base:
        return []
    m = _mean(list(base.values()))
    per_run = [l["metrics"]["seconds"] for k, l in runs.items()
               if k.startswith("resnet18/baseline/")]
    prop = [l["metrics"]["propagations_s"] for l in lines
            if l["metrics"].get("propagations_s")]
    out = ["", f"Targets: ResNet-18 baseline >= {TARGETS['baseline_acc']}%: "
           f"{'met' if m >= TARGETS['baseline_acc'] else 'not met'} ({m:.2f}); within "
           f"{TARGETS['run_s']:.0f} s per run, its test included: "
           f"{'met' if max(per_run) <= TARGETS['run_s'] else 'not met'} "
           f"(at most {max(per_run):.0f} s)"
           + (f"; the GLoMo stage's propagations within {TARGETS['stage_s']:.0f} s: "
              f"{'met' if max(prop) <= TARGETS['stage_s'] else 'not met'} (at most "
              f"{max(prop):.0f} s)" if prop else "") + "."]
    epochs = {v: [e for k, l in runs.items() if k.startswith(f"resnet18/{v}/")
                  for e in l["metrics"]["epoch_s"]] for v in ("baseline", "glomo")}
    if epochs["glomo"]:
        ratio = _mean(epochs["glomo"]) / _mean(epochs["baseline"])
        out.append(f"GLoMo epoch <= {TARGETS['epoch_ratio']}x the baseline's: "
                   f"{'met' if ratio <= TARGETS['epoch_ratio'] else 'not met'} ({ratio:.2f}x, "
                   "propagations apart).")
    for a, b, key in (("glomo", "baseline", "glomo_minus_baseline"),
                      ("glomo", "uniform", "glomo_minus_uniform")):
        x, y = acc.get((18, a), {}), acc.get((18, b), {})
        seeds = sorted(set(x) & set(y))
        if len(seeds) >= 2:
            m, lo, hi, n = paired_difference([x[q] for q in seeds], [y[q] for q in seeds])
            out.append(f"ResNet-18 {a} − {b} >= +{TARGETS[key]}: "
                       f"{'met' if m >= TARGETS[key] and lo > 0 else 'not met'} "
                       f"({m:+.2f} [{lo:+.2f}, {hi:+.2f}], {n} seeds; met means the mean "
                       "reaches it and the interval excludes 0).")
    return out


def _recipe_line(lines: List[Dict], recipe: Dict) -> str:
    """Where the runs ran, the predictor and the recipe every variant trains with."""
    return (f"Generated from the ledger: {len(lines)} runs on "
            f"{', '.join(sorted({md(l['device']) for l in lines}))}. Predictor: "
            + (f"release `{recipe['predictor'].get('release')}` (SHA-256 "
               f"{str(recipe['predictor'].get('sha256'))[:12]})"
               if not recipe["predictor"].get("toy") else "an untrained toy predictor (dry run)")
            + f". Recipe (every variant): ResNet width {recipe['width']}, "
            f"`train_image_classifier` ({recipe['precision']}, channels-last, Nesterov SGD, "
            "one-cycle schedule) with `ImageTrainConfig` "
            + ", ".join(f"{k} {v}" for k, v in recipe["train"].items())
            + f"; {' / '.join(f'{n:,}' for n in lines[0]['metrics']['images'])} train / "
            "validation / test images; the best validation epoch evaluated once on test. "
            "The stage's propagations are computed once per image and orientation (s below, "
            "apart from the runs).")


def _table(runs: Dict[str, Dict], recipe: Dict) -> tuple:
    """The accuracy table's lines and each depth and variant's test accuracy by seed."""
    from benchmarks.statistics import mean_sd

    out = ["| model | paper | test accuracy (mean ± std) | seeds | s per run | epoch s | "
           "propagations s |", "|---|---|---|---|---|---|---|"]
    acc: Dict = {}
    for depth in recipe["depths"]:
        for variant in VARIANTS:
            mine = [l for k, l in sorted(runs.items()) if k.startswith(f"resnet{depth}/{variant}/")]
            if not mine:
                continue
            values = [100 * l["metrics"]["test_acc"] for l in mine]
            acc[(depth, variant)] = {int(l["key"].rsplit("seed", 1)[1]): v
                                     for l, v in zip(mine, values)}
            m, sd = mean_sd(values)
            prop = [l["metrics"]["propagations_s"] for l in mine if l["metrics"]["propagations_s"]]
            out.append(f"| ResNet-{depth} {variant} | {PAPER.get((depth, variant), '-')} | "
                       f"{m:.2f}" + (f" ± {sd:.2f}" if len(values) > 1 else "") +
                       f" | {len(values)} | {_mean([l['metrics']['seconds'] for l in mine]):.1f}"
                       f" | {_mean([s for l in mine for s in l['metrics']['epoch_s']]):.2f} | "
                       f"{_mean(prop) if prop else 0:.1f} |")
    return out, acc


def report(lines: List[Dict], recipe: Dict) -> List[str]:
    from benchmarks.statistics import paired_difference

    runs = {l["key"]: l for l in lines}
    table, acc = _table(runs, recipe)
    out = ["### GPU campaign: Table 3 downstream (CIFAR-10, full configuration)", "",
           _recipe_line(lines, recipe), "", *table, ""]
    for depth in recipe["depths"]:
        for a, b in (("glomo", "baseline"), ("glomo", "uniform"), ("uniform", "baseline")):
            x, y = acc.get((depth, a), {}), acc.get((depth, b), {})
            seeds = sorted(set(x) & set(y))
            if not seeds:
                continue
            m, lo, hi, n = paired_difference([x[s] for s in seeds], [y[s] for s in seeds])
            ci = f" [{lo:+.2f}, {hi:+.2f}]" if n > 1 else ""
            out.append(f"- ResNet-{depth}, {a} − {b}: {m:+.2f} points{ci} (paired over "
                       f"{n} seeds, 95% t interval)")
    return out + _target_lines(acc, runs, lines) + [""]


def report_earlier(lines: List[Dict]) -> List[str]:
    """Runs of earlier recipes, one line each with its test accuracy and times."""
    return [f"- {md(l['key'])}: test {100 * l['metrics']['test_acc']:.2f}%, "
            f"{l['metrics']['seconds']} s ({_mean(l['metrics']['epoch_s']):.2f} s an epoch); "
            f"run {md(l['run'])}, recipe {md(l['recipe'])}, {md(l['date'])}, "
            f"{md(l['device'])}" for l in lines] + [""]
