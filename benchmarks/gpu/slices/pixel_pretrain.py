"""``pixel-pretrain``: pixel-graph pretraining on one 32x32 ImageNet shard (50,000
images) with ``configs/cifar10-gpu.yaml`` to a wall-clock budget; its predictor becomes
the release ``imagenet32-pixel``.

One key, ``pretrain``: ``glomo pretrain``'s own loop (Lightning, bf16-mixed, the
config's layout) stopped cleanly at the call's deadline (or after ``train_seconds`` of
training, where the recipe sets it) or at ``max_steps``.
The call returns the predictor in float16 (``predictor/``) and the pretraining summary
in its metrics, and nothing else: every second of the call goes to training.

The graphs' check is made by ``ingest`` on the CPU machine, from the returned predictor
and the same shard (rebuilt from the project's data folder): per direction, layer and
head, the weight on the 4-neighbourhood of a pixel against uniform graphs over the same
sources and against the untrained predictor, and dead heads (:func:`pixel_graph_check`
of the CIFAR reproduction), on the first ``CPU_CHECK_IMAGES`` images of the
pretraining's own validation split. (The first GPU run checked on the GPU after
training; the check outlasted its reserve and the call killed the key.)

A key killed after its predictor came back can still be recorded with ``ingest
--salvage``: :func:`salvage` rebuilds its metrics from the pretraining's last log line.
"""
from __future__ import annotations

import math
import os
import tempfile
import time
from typing import Dict, List

import torch

from benchmarks.gpu import data
from benchmarks.gpu.report import md
from benchmarks.gpu.runner import finite
from benchmarks.gpu.slices.common import config

# the slice's own check of recorded metrics, which ingest reads as mod.check_metrics
from benchmarks.gpu.slices.pretraining import (
    card_command,
    check_graph_steps,
    check_metrics,  # noqa: F401
    check_predictor,
    hardware,
    metrics,
    pretrain_to_deadline,
    steady_step_lines,
    stopped_by,
)
from benchmarks.gpu.slices.pretraining import salvage as salvage_pretraining

ARCHIVES = (data.IMAGENET[0],)
RESULTS = "cifar10.md"
RELEASE = "imagenet32-pixel"
RETURNED_FILES = 4  # manifest.json, run.log, predictor/config.json, predictor/model.safetensors
WHOLE_CALL = True   # trains until the call's deadline: it never shares a call
CHECK_IMAGES = 64        # (part of the recipe the first GPU run used)
CPU_CHECK_IMAGES = 16    # the check at ingest: about 5 s an image on 2 CPU cores
MIN_GRAPH_STEPS = 100   # steps past the warm-up a released predictor's graphs trained
STEP_TARGET_MS = 150.0  # a steady step, so that 3,000 steps fit one call


def recipe(dry_run: bool) -> Dict:
    cfg = config("cifar10-gpu.yaml")
    # graph_warmup_steps 100 instead of the config's 300: at the one timing so far (up to
    # 1.1 s a step, start-up included) a budget of 360 s is about 330 steps, and the graph
    # predictor is frozen during the warm-up (ingest refuses to release graphs that
    # trained for fewer than MIN_GRAPH_STEPS steps)
    # train_seconds None: train until the call's deadline (less the save). The first run
    # (recipe acc3e34a, 360 s, sharing its call with the profile) stopped at step 560 of
    # 3000 with graphs barely local: this recipe takes a whole call.
    train = dict(cfg["train"], validate_every=250, log_every=25, graph_stats_every=250,
                 progress_bar=False, graph_warmup_steps=100)
    train.pop("accelerator", None)
    r = dict(config="cifar10-gpu.yaml", corpus=dict(cfg["corpus"], path=None),
             model=cfg["model"], train=train, train_seconds=None, seed=0,
             check_images=CHECK_IMAGES)
    if dry_run:
        r["model"] = dict(r["model"], hidden_channels=8, num_layers=1, heads=2, cnn_layers=1,
                          num_positions=4)
        r["corpus"] = dict(r["corpus"], crop=8, validation_fraction=0.1)
        r["train"] = dict(train, batch_size=4, max_steps=4, graph_warmup_steps=1,
                          checkpoint_every=2, validate_every=2, graph_stats_every=2,
                          log_every=1)
        r.update(train_seconds=60, check_images=4)
    return r


def keys(recipe: Dict) -> List[str]:
    return ["pretrain"]


def min_seconds(key: str, recipe: Dict) -> float:
    return 20.0 if recipe["train"]["max_steps"] < 10 else 300.0


def run_key(key: str, ctx) -> Dict:
    r = ctx.recipe
    settings = dict(output_dir=os.path.join(ctx.work, "pretrain"), corpus=dict(
        r["corpus"], path=os.path.join(ctx.data_dir, "imagenet32")), model=r["model"],
        train=dict(r["train"], seed=r["seed"],
                   accelerator="gpu" if ctx.device == "cuda" else "cpu"))
    summary, stop = pretrain_to_deadline(settings, ctx, r["train_seconds"])
    return metrics(summary, r, **stop)


def salvage(failure: Dict, manifest: Dict) -> Dict:
    """The metrics of a ``pretrain`` key that was killed after its predictor came back
    (:func:`~benchmarks.gpu.slices.pretraining.salvage`)."""
    return salvage_pretraining("pixel-pretrain", failure, manifest)


def graph_check(predictor_dir: str, recipe: Dict, shared_data: str, images: int,
                log=print) -> Dict:
    """The 4-neighbourhood check of the predictor in ``predictor_dir`` and of its
    untrained copy on the CPU, on the first ``images`` images of the pretraining's own
    (seeded) validation split of the shard rebuilt from ``shared_data``."""
    from benchmarks.reproduce.cifar10 import pixel_graph_check
    from glomo_pyg import PretrainedGraphPredictor
    from glomo_pyg.analysis import untrained_copy
    from glomo_pyg.data.images import load_imagenet32
    from glomo_pyg.training.pretrain.data import ImagePretrainingData

    archive = os.path.join(shared_data, ARCHIVES[0])
    if not os.path.isfile(archive):
        raise ValueError(f"{archive} is missing: the graph check rebuilds the pretraining's "
                         "shard from it (--shared-data: the project's data folder)")
    with tempfile.TemporaryDirectory(prefix="glomo-check-") as tmp:
        built = data.build([archive], tmp, log=log)[ARCHIVES[0]]
        all_images = load_imagenet32(built)[0]
    split = ImagePretrainingData(all_images, 1, recipe["corpus"]["validation_fraction"],
                                 recipe["seed"])
    split.setup("fit")  # (the split is drawn there, as in the run)
    sample = all_images[torch.as_tensor(split.val_ids[:images])]
    predictor = PretrainedGraphPredictor.from_pretrained(predictor_dir).eval()
    start = time.time()
    with torch.no_grad():
        check = dict(learned=pixel_graph_check(predictor, sample))
        check["untrained"] = pixel_graph_check(untrained_copy(predictor).eval(), sample)
    log(f"graph check: {len(sample)} held-out images on the CPU in {time.time() - start:.0f} s")
    return dict(check=check, check_images=len(sample), check_device="CPU (at ingest)")


def _layer_means(check: Dict) -> Dict:
    out = {}
    for kind in ("learned", "untrained"):
        for d, v in check[kind].items():
            out.setdefault(d, {})[kind] = [sum(row) / len(row) for row in v["neighbour"]]
            out[d]["uniform"] = v["uniform_neighbour"]
            if kind == "learned":
                out[d]["dead"] = v["dead_heads"]
    return out


def quality_lines(metrics: Dict) -> List[str]:
    """The 4-neighbourhood table of a run's metrics (results file and model card)."""
    s = metrics["summary"]
    val = s.get("val_loss")
    loss = ("not returned (the run was killed after saving its predictor)" if
            metrics.get("salvaged") else "n/a" if val is None else
            f"{val:.3f} nats per sub-pixel (uniform {math.log(256):.3f})")
    lines = [f"- {s.get('steps')} steps in {s.get('seconds')} s of training "
             f"({metrics['seconds_per_step']} s/step, compilation and validation included; "
             f"stopped by {metrics['stopped_by']}); final validation loss {loss}"]
    lines += steady_step_lines(metrics, STEP_TARGET_MS)
    if "check" not in metrics:
        return lines + ["", "(No graph check is recorded for this run.)"]
    lines += ["", f"Weight on a pixel's 4-neighbourhood (left and above for forward graphs, "
              f"right and below for backward), head-averaged per layer, on "
              f"{metrics['check_images']} held-out ImageNet 32x32 images (the pretraining's "
              "validation split)"
              + (f", measured on the {metrics['check_device']}" if metrics.get("check_device")
                 else "") + ":", "",
              "| direction | layer | learned | untrained | uniform | dead heads |",
              "|---|---|---|---|---|---|"]
    for d, v in _layer_means(metrics["check"]).items():
        for layer, value in enumerate(v["learned"]):
            dead = [h for (l, h) in v["dead"] if l == layer]
            lines.append(f"| {d} | {layer} | {value:.4f} | {v['untrained'][layer]:.4f} | "
                         f"{v['uniform']:.4f} | {dead or 'none'} |")
    return lines


def report_earlier(lines: List[Dict]) -> List[str]:
    """Runs of earlier recipes, each with its quality table (the release they made may
    have been replaced since)."""
    out = []
    for l in lines:
        out += [f"Run {md(l['run'])} (recipe {md(l['recipe'])}) on {md(l['device'])} (commit "
                f"{md(l['commit'][:10])}, {md(l['date'])})"
                + (" (salvaged: its metrics come from the log)" if l["metrics"].get("salvaged")
                   else "") + ":", ""]
        out += quality_lines(l["metrics"]) + [""]
    return out


def report(lines: List[Dict], recipe: Dict) -> List[str]:
    out = ["### GPU campaign: pixel-graph pretraining (ImageNet 32x32, full configuration)", ""]
    for l in lines:
        out += [f"Run {md(l['run'])} on {md(l['device'])} (commit {md(l['commit'][:10])}, "
                f"{md(l['date'])}; torch {md(l['versions'].get('torch'))}, CUDA "
                f"{md(l['versions'].get('cuda'))}); "
                f"released as `pretrained/{RELEASE}`"
                + (" (salvaged: the key was killed after its predictor was saved, so its "
                   "metrics come from the log)" if l["metrics"].get("salvaged") else "")
                + ":", ""]
        out += quality_lines(l["metrics"]) + [""]
    return out


def ingest(lines: List[Dict], folder: str, manifest: Dict, releases_root, log,
           shared_data: str) -> None:
    from glomo_pyg.io.releases import releases_root as default_root
    from glomo_pyg.publish import write_release

    (line,) = lines
    metrics = line["metrics"]
    check_graph_steps(metrics, manifest, MIN_GRAPH_STEPS,
                      "size the recipe's train_seconds and graph_warmup_steps from the "
                      "profile's pixel-pretrain-step time")
    predictor_dir = os.path.join(folder, "predictor")  # (ingest's private copy)
    check_predictor(predictor_dir, "pixels")
    # always measured here (a returned folder carries no verdict: the manifest's schema
    # refuses one); recorded in the ledger line, which ingest writes after
    images = 2 if manifest.get("dry_run") else CPU_CHECK_IMAGES
    # (a NaN is recorded as null: the ledger is strict JSON)
    metrics.update(finite(graph_check(predictor_dir, manifest["recipe"], shared_data, images,
                                      log)))
    root = releases_root or str(default_root())
    recipe = manifest["recipe"]
    card = dict(
        name=RELEASE, modality="pixels", release="GPU release",
        summary="Pixel graphs for 32x32 RGB images: 3 layers x 8 heads x 2 directions; the "
                "full pixel configuration on a GPU.",  # (the data: its own section)
        hardware=hardware(manifest),
        data="Tiny ImageNet training images box-downsampled to 32x32 (JPEG quality 90), the "
             "even-numbered half (50,000 images, 200 classes; labels unused).",
        recipe=f"`configs/cifar10-gpu.yaml` (width 128, 3 layers x 8 heads, 64 predicted "
               f"pixels per image, grid position term, keep-alive 0.05, batch 64, Adam "
               f"3e-3, graph warm-up {recipe['train']['graph_warmup_steps']} steps, "
               f"bf16-mixed) {stopped_by(metrics)} after "
               f"{metrics['summary']['seconds']:.0f} s of training, at step "
               f"{metrics['steps']} of {recipe['train']['max_steps']}; seed {recipe['seed']}.",
        command=card_command("pixel-pretrain", bool(metrics.get("salvaged"))),
        commit=line["commit"],
        training_time=f"{metrics['summary'].get('seconds')} s of training "
                      f"({metrics['steps']} steps), {line['seconds']} s in all",
        quality="\n".join(quality_lines(metrics)))
    path = write_release(predictor_dir, os.path.join(root, RELEASE), card)
    log(f"released {path}")
