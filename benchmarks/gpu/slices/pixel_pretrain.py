"""``pixel-pretrain``: pixel-graph pretraining on one 32x32 ImageNet shard (50,000
images) with ``configs/cifar10-gpu.yaml`` to a wall-clock budget, then the graphs'
check and picture; its predictor becomes the release ``imagenet32-pixel``.

One key, ``pretrain``: ``glomo pretrain``'s own loop (Lightning, bf16-mixed, the
config's layout) stopped cleanly at ``train_seconds`` of training or at
``max_steps``; then, on 64 held-out images of the shard, per direction, layer and head,
the weight on the 4-neighbourhood of a pixel against uniform graphs over the same
sources and against the untrained predictor, dead heads (:func:`pixel_graph_check`
of the CIFAR reproduction), and the paper's Fig. 4 for one held-out image. It returns
the predictor in float16 (``predictor/``), the picture (``graphs.png``) and the
pretraining summary in its metrics. ``ingest`` writes the release.
"""
from __future__ import annotations

import math
import os
import time
from typing import Dict, List

import lightning.pytorch as pl
import torch

from benchmarks.gpu import data
from benchmarks.gpu.slices.common import config

ARCHIVES = (data.IMAGENET[0],)
RESULTS = "cifar10.md"
RELEASE = "imagenet32-pixel"
CHECK_IMAGES = 64
AFTER_TRAINING_S = 75.0  # kept after training: saving, the graph check, the figure
MIN_GRAPH_STEPS = 100   # steps past the warm-up a released predictor's graphs trained


def recipe(dry_run: bool) -> Dict:
    cfg = config("cifar10-gpu.yaml")
    # graph_warmup_steps 100 instead of the config's 300: at the one timing so far (up to
    # 1.1 s a step, start-up included) a budget of 360 s is about 330 steps, and the graph
    # predictor is frozen during the warm-up (ingest refuses to release graphs that
    # trained for fewer than MIN_GRAPH_STEPS steps)
    train = dict(cfg["train"], validate_every=250, log_every=25, graph_stats_every=250,
                 progress_bar=False, graph_warmup_steps=100)
    train.pop("accelerator", None)
    r = dict(config="cifar10-gpu.yaml", corpus=dict(cfg["corpus"], path=None),
             model=cfg["model"], train=train, train_seconds=360, seed=0,
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


class _Deadline(pl.Callback):
    """Stops training cleanly (the step finishes, the predictor is saved) once ``seconds``
    of training have passed or at the absolute time ``end`` (``time.time()``), whichever
    comes first: set-up and the sanity check, before training starts, count against
    ``end`` but not against ``seconds``."""

    def __init__(self, seconds: float, end: float = float("inf")):
        self.seconds, self.end, self.start, self.stopped_at = seconds, end, None, None

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = time.time()

    def on_train_batch_end(self, trainer, *args) -> None:
        now = time.time()
        if (now - self.start >= self.seconds or now >= self.end) and not trainer.should_stop:
            trainer.should_stop = True
            self.stopped_at = trainer.global_step


def run_key(key: str, ctx) -> Dict:
    from benchmarks.reproduce.cifar10 import figure, pixel_graph_check, untrained_copy
    from glomo_pyg import PretrainedGraphPredictor
    from glomo_pyg.data.images import load_imagenet32
    from glomo_pyg.training import PretrainConfig, run_pretraining
    from glomo_pyg.training.text_pretraining import ImagePretrainingData

    r = ctx.recipe
    folder = os.path.join(ctx.work, "pretrain")
    settings = dict(output_dir=folder, corpus=dict(r["corpus"], path=os.path.join(
        ctx.data_dir, "imagenet32")), model=r["model"],
        train=dict(r["train"], seed=r["seed"], accelerator="gpu" if ctx.device == "cuda" else "cpu"))
    end = ctx.deadline - AFTER_TRAINING_S
    if end <= time.time():
        raise RuntimeError(f"{ctx.seconds_left():.0f} s left: no time to pretrain")
    deadline = _Deadline(r["train_seconds"], end)
    start = time.time()
    summary = run_pretraining(PretrainConfig.from_dict(settings), extra_callbacks=[deadline],
                              log=lambda *a: print(*a, flush=True))
    wall = time.time() - start
    predictor = PretrainedGraphPredictor.from_pretrained(os.path.join(folder, "predictor"))
    predictor.save_pretrained(os.path.join(ctx.out, "predictor"), dtype=torch.float16)
    out = dict(summary=summary, wall_s=round(wall, 1),
               train_budget_s=round(min(r["train_seconds"], end - start), 1),
               stopped_by="time" if deadline.stopped_at is not None else "max_steps",
               steps=summary.get("steps"),
               graph_steps=max(0, summary.get("steps", 0) - r["train"]["graph_warmup_steps"]),
               seconds_per_step=round(summary["seconds"] / max(1, summary["steps"]), 4))
    if ctx.seconds_left() < 30:  # the predictor is out; the check can be made on the CPU
        print(f"{ctx.seconds_left():.0f} s left: the graph check and figure are skipped")
        return out
    predictor = predictor.to(ctx.device).eval().set_layout("auto")
    # held-out images: the first of the pretraining's own (seeded) validation split
    images = load_imagenet32(os.path.join(ctx.data_dir, "imagenet32"))[0]
    split = ImagePretrainingData(images, 1, r["corpus"]["validation_fraction"], r["seed"])
    sample = images[torch.as_tensor(split.val_ids[:r["check_images"]])]
    t0 = time.time()
    check = dict(learned=pixel_graph_check(predictor, sample.to(ctx.device)))
    untrained = untrained_copy(predictor).to(ctx.device).eval()
    check["untrained"] = pixel_graph_check(untrained, sample.to(ctx.device))
    check_s = time.time() - t0
    out.update(check=check, check_images=len(sample), check_s=round(check_s, 1))
    if ctx.seconds_left() > 20:
        figure(predictor.cpu(), sample[0], os.path.join(ctx.out, "graphs.png"))
    return out


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
    lines = [f"- {s.get('steps')} steps in {s.get('seconds')} s of training "
             f"({metrics['seconds_per_step']} s/step; stopped by {metrics['stopped_by']}); "
             f"final validation loss "
             f"{'n/a' if val is None else f'{val:.3f}'} nats per sub-pixel (uniform "
             f"{math.log(256):.3f})", "",
             f"Weight on a pixel's 4-neighbourhood (left and above for forward graphs, right "
             f"and below for backward), head-averaged per layer, on {metrics['check_images']} "
             "held-out ImageNet 32x32 images (the pretraining's validation split):", "",
             "| direction | layer | learned | untrained | uniform | dead heads |",
             "|---|---|---|---|---|---|"]
    if "check" not in metrics:
        return lines[:1] + ["", "(The graph check did not fit in the call: "
                            "`python -m benchmarks.release_cpu pixels` measures it on a CPU.)"]
    for d, v in _layer_means(metrics["check"]).items():
        for layer, value in enumerate(v["learned"]):
            dead = [h for (l, h) in v["dead"] if l == layer]
            lines.append(f"| {d} | {layer} | {value:.4f} | {v['untrained'][layer]:.4f} | "
                         f"{v['uniform']:.4f} | {dead or 'none'} |")
    return lines


def report(lines: List[Dict], recipe: Dict) -> List[str]:
    out = ["### GPU campaign: pixel-graph pretraining (ImageNet 32x32, full configuration)", ""]
    for l in lines:
        out += [f"Run {l['run']} on {l['device']} (commit {l['commit'][:10]}, {l['date']}; "
                f"torch {l['versions'].get('torch')}, CUDA {l['versions'].get('cuda')}); "
                f"released as `pretrained/{RELEASE}`:", ""]
        out += quality_lines(l["metrics"]) + [""]
    return out


def ingest(lines: List[Dict], folder: str, manifest: Dict, releases_root, log) -> None:
    from glomo_pyg.io.releases import releases_root as default_root, write_release

    (line,) = lines
    graph_steps = line["metrics"].get("graph_steps", 0)
    if graph_steps < MIN_GRAPH_STEPS and not manifest.get("dry_run"):
        raise ValueError(f"the graphs trained for {graph_steps} steps past the warm-up "
                         f"(fewer than {MIN_GRAPH_STEPS}): not released and not recorded; "
                         "size the recipe's train_seconds and graph_warmup_steps from the "
                         "profile's pixel-pretrain-step time")
    m = manifest["environment"]
    root = releases_root or str(default_root())
    card = dict(
        name=RELEASE, modality="pixels", release="GPU release",
        summary="Pixel graphs for 32x32 RGB images: 3 layers x 8 heads x 2 directions, "
                "pretrained on 50,000 Tiny-ImageNet 32x32 images.",
        hardware=f"{m.get('device')}"
                 + (f" ({m['memory_gib']} GiB)" if m.get("memory_gib") else "")
                 + f"; torch {m.get('torch')}, CUDA {m.get('cuda')}",
        data="Tiny ImageNet training images box-downsampled to 32x32 (JPEG quality 90), the "
             "even-numbered half (50,000 images, 200 classes; labels unused).",
        recipe=f"`configs/cifar10-gpu.yaml` (width 128, 3 layers x 8 heads, 64 predicted "
               f"pixels per image, grid position term, keep-alive 0.05, batch 64, Adam "
               f"3e-3, graph warm-up {manifest['recipe']['train']['graph_warmup_steps']} "
               f"steps, bf16-mixed) stopped after {line['metrics']['train_budget_s']:.0f} s "
               f"of training; seed {manifest['recipe']['seed']}.",
        command="python -m benchmarks.gpu prepare pixel-pretrain\n"
                "# one GPU call, carrying .gpu/:\n"
                "python -m benchmarks.gpu run pixel-pretrain --budget-s 510 --carry .gpu "
                "--out $OUT\n"
                "python -m benchmarks.gpu ingest FOLDER_THE_CALL_RETURNED",
        commit=line["commit"],
        training_time=f"{line['metrics']['summary'].get('seconds')} s of training "
                      f"({line['metrics']['steps']} steps), {line['seconds']} s in all",
        quality="\n".join(quality_lines(line["metrics"])))
    path = write_release(os.path.join(folder, "predictor"), os.path.join(root, RELEASE), card)
    log(f"released {path}")
