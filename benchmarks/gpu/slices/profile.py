"""``profile``: where a step's time goes at the full configurations, before the long
slices are sized. Keys:

- ``pixel-pretrain-step``: one pretraining step of ``configs/cifar10-gpu.yaml`` (batch 64
  of 32x32 images, 3 layers x 8 heads x 2 directions, bf16 autocast, its layout), on
  CIFAR training images, graph predictor training (past its warm-up);
- ``text-pretrain-step``: the same for ``configs/imdb-gpu.yaml`` (batch 64 of 128 tokens,
  random ids over its 30,000-word vocabulary);
- ``transfer-forward``: the graphs and propagations of the GLoMo input stage
  (:class:`~glomo_pyg.GlomoTransfer`, 24 graphs) for 128 CIFAR images, no gradients;
- ``resnet18-step-{baseline,glomo,glomo-precomputed}``: a ResNet-18 (width 64) SGD step
  at batch 512 with the stage off, on the fly, and with its propagations precomputed;
- ``cuda-tests``: the test suite's CUDA-only tests (marked ``cuda``: fused gradients,
  bf16 autocast of the fused pixel and text models, loading onto the GPU).

Each step is timed in steady state: the first step (compilation) apart, a warm-up, then
each step between synchronisations (median); peak memory of a step; top kernels. The
predictors are untrained (the graphs' sparsity is that of initialisation).
"""
from __future__ import annotations

import os
import subprocess
import sys
import types
import xml.etree.ElementTree as ET
from typing import Dict, List

import torch

from benchmarks.gpu import data
from benchmarks.gpu.measure import time_steps
from benchmarks.gpu.report import code, md
from benchmarks.gpu.runner import ROOT
from benchmarks.gpu.slices.common import cifar, config, pixel_units, untrained_pixel_predictor

ARCHIVES = (data.CIFAR,)
RESULTS = "speed.md"
KEYS = ("pixel-pretrain-step", "resnet18-step-baseline", "resnet18-step-glomo",
        "resnet18-step-glomo-precomputed", "transfer-forward", "text-pretrain-step",
        "cuda-tests")
# the files of the suite's tests marked `cuda` that this recipe runs; files marked later run
# in the ``cuda-tests`` slice, which adds them without voiding the runs recorded here
# (tests/test_campaign.py checks that the two lists hold every marked file)
CUDA_TEST_FILES = ("tests/test_fused.py", "tests/test_pretrained_io.py")
TARGET_PIXEL_MS = 150.0  # the target: at most 150 ms per step on an H100


def recipe(dry_run: bool) -> Dict:
    pixel, text = config("cifar10-gpu.yaml"), config("imdb-gpu.yaml")
    r = dict(pixel=dict(model=pixel["model"], batch=pixel["train"]["batch_size"],
                        lr=pixel["train"]["lr"], grad_clip=pixel["train"]["grad_clip"],
                        optimizer=pixel["train"].get("optimizer", "adam")),
             text=dict(model=text["model"], batch=text["train"]["batch_size"],
                       length=text["corpus"]["max_length"], vocabulary=text["corpus"]["max_size"],
                       lr=text["train"]["lr"], momentum=text["train"]["momentum"],
                       grad_clip=text["train"]["grad_clip"], optimizer=text["train"]["optimizer"]),
             transfer=dict(images=128), resnet=dict(depth=18, width=64, batch=512, lr=0.4),
             side=32, warmup=5, steps=20, profile_steps=3,
             tests=["-m", "cuda", *CUDA_TEST_FILES])
    if dry_run:  # toy sizes: the same code paths in seconds on a CPU
        small = dict(hidden_channels=8, num_layers=1, heads=2, cnn_layers=1, num_positions=4)
        r["pixel"] = dict(r["pixel"], model=dict(r["pixel"]["model"], **small), batch=2)
        r["text"] = dict(r["text"], model=dict(r["text"]["model"], **small), batch=2, length=16,
                         vocabulary=50)
        r.update(transfer=dict(images=2), resnet=dict(depth=18, width=4, batch=2, lr=0.1),
                 side=8, warmup=0, steps=1, profile_steps=1,
                 tests=["-m", "cuda", *CUDA_TEST_FILES])
    return r


def keys(recipe: Dict) -> List[str]:
    return list(KEYS)


def min_seconds(key: str, recipe: Dict) -> float:
    if recipe["steps"] < 10:  # the dry run
        return 2.0
    return {"cuda-tests": 120.0, "transfer-forward": 30.0}.get(key, 60.0)


def _autocast(device: str):
    return torch.autocast("cuda", torch.bfloat16, enabled=device == "cuda")


def _pretraining_step(module, batches, grad_clip: float, device: str):
    """One optimiser step of a :class:`~glomo_pyg.training.GlomoPretraining` module on
    the next of ``batches`` (rotated), as its Lightning loop takes it under bf16-mixed."""
    optimizer = module.configure_optimizers()["optimizer"]
    params = [p for p in module.parameters() if p.requires_grad]
    state = dict(i=0)

    def step():
        data = batches[state["i"] % len(batches)]
        state["i"] += 1
        with _autocast(device):
            x, batch = module.model_input(data, train=True)
            loss = module.model(x, batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def pixel_step(recipe: Dict, ctx) -> Dict:
    from glomo_pyg.training import GlomoPretraining

    r = recipe["pixel"]
    side = recipe["side"]
    images = cifar(ctx.data_dir, side=side)[0]
    module = GlomoPretraining(**dict(r["model"], modality="image", in_channels=3, height=side,
                                     width=side), lr=r["lr"], graph_warmup_steps=0,
                              optimizer=r["optimizer"], flip=True).to(ctx.device)
    batches = []
    for i in range(4):  # a few real batches, rotated (not one buffer over and over)
        chunk = images[(torch.arange(r["batch"]) + i * r["batch"]) % len(images)].to(ctx.device)
        x, batch = pixel_units(chunk)
        batches.append(types.SimpleNamespace(x=x, batch=batch, num_graphs=r["batch"]))
    out = time_steps(_pretraining_step(module, batches, r["grad_clip"], ctx.device),
                     ctx.device, recipe["warmup"], recipe["steps"], recipe["profile_steps"])
    out.update(batch=r["batch"], units=side * side,
               images_per_s=round(r["batch"] / out["median_ms"] * 1e3, 1),
               target_ms=TARGET_PIXEL_MS)
    return out


def text_step(recipe: Dict, ctx) -> Dict:
    from glomo_pyg.training import GlomoPretraining

    r = recipe["text"]
    module = GlomoPretraining(**r["model"], num_tokens=r["vocabulary"], padding_idx=0,
                              lr=r["lr"], graph_warmup_steps=0, optimizer=r["optimizer"],
                              momentum=r["momentum"]).to(ctx.device)
    gen = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(4):  # Zipf-like ids, as words are: most are frequent ones
        ranks = torch.distributions.Pareto(1.0, 1.0).sample((r["batch"] * r["length"],))
        x = ranks.long().clamp(max=r["vocabulary"] - 1).clamp(min=1)
        x = x[torch.randperm(len(x), generator=gen)].to(ctx.device)
        batch = torch.arange(r["batch"], device=ctx.device).repeat_interleave(r["length"])
        batches.append(types.SimpleNamespace(x=x, batch=batch, num_graphs=r["batch"]))
    out = time_steps(_pretraining_step(module, batches, r["grad_clip"], ctx.device),
                     ctx.device, recipe["warmup"], recipe["steps"], recipe["profile_steps"])
    out.update(batch=r["batch"], length=r["length"],
               tokens_per_s=round(r["batch"] * r["length"] / out["median_ms"] * 1e3, 1))
    return out


def _resnet(recipe: Dict, graph: str, device: str):
    from glomo_pyg import GlomoResNet, GlomoTransfer

    predictor = untrained_pixel_predictor(recipe["pixel"]["model"],
                                          recipe["side"]).eval().set_layout("auto")
    torch.manual_seed(0)
    r = recipe["resnet"]
    return GlomoResNet(GlomoTransfer(predictor, 3, graph=graph), depth=r["depth"],
                       width=r["width"]).to(device)


def transfer_forward(recipe: Dict, ctx) -> Dict:
    model = _resnet(recipe, "learned", ctx.device)
    n = recipe["transfer"]["images"]
    pixels = cifar(ctx.data_dir, side=recipe["side"])[0]
    images = [pixels[i * n:(i + 1) * n].to(ctx.device) for i in range(3)]
    state = dict(i=0)

    @torch.no_grad()
    def forward():
        chunk = images[state["i"] % len(images)]
        state["i"] += 1
        with _autocast(ctx.device):
            x, batch = pixel_units(chunk)
            return model.transfer.propagations(model.stage_input(chunk), x, batch)
    out = time_steps(forward, ctx.device, recipe["warmup"], recipe["steps"],
                     recipe["profile_steps"])
    predictor = model.transfer.predictor
    out.update(images=n, graphs=len(predictor.directions) * predictor.num_layers * predictor.heads,
               images_per_s=round(n / out["median_ms"] * 1e3, 1))
    return out


def resnet_step(recipe: Dict, ctx, variant: str) -> Dict:
    import torch.nn.functional as F

    graph = {"baseline": "none", "glomo": "learned", "glomo-precomputed": "learned"}[variant]
    model = _resnet(recipe, graph, ctx.device)
    if ctx.device == "cuda":
        model.resnet.to(memory_format=torch.channels_last)
    r = recipe["resnet"]
    images, labels = cifar(ctx.data_dir, side=recipe["side"])
    pick = torch.arange(r["batch"] * 4) % len(images)
    images, labels = images[pick].to(ctx.device), labels[pick].to(ctx.device)
    cache = None
    if variant == "glomo-precomputed":  # the stage's propagations, once per image
        from glomo_pyg.training.image_classification import precompute_propagations

        cache = precompute_propagations(model, images, batch_size=128,
                                        device=torch.device(ctx.device)).to(ctx.device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=r["lr"], momentum=0.9, nesterov=True,
                                weight_decay=5e-4)
    state = dict(i=0)

    def step():
        part = slice((state["i"] % 4) * r["batch"], (state["i"] % 4 + 1) * r["batch"])
        state["i"] += 1
        prop = None
        if cache is not None:
            p = cache[part].float()  # [B, D, K, HW, C] -> [D, K, B HW, C]
            b, d, k, t, c = p.shape
            prop = p.permute(1, 2, 0, 3, 4).reshape(d, k, b * t, c)
        model.train()
        with _autocast(ctx.device):
            loss = F.cross_entropy(model(images[part], propagated=prop).float(), labels[part])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    out = time_steps(step, ctx.device, recipe["warmup"], recipe["steps"], recipe["profile_steps"])
    epoch_steps = -(-42000 // r["batch"])  # the full recipe's 42,000 training images
    out.update(batch=r["batch"], images_per_s=round(r["batch"] / out["median_ms"] * 1e3, 1),
               epoch_s_estimate=round(epoch_steps * out["median_ms"] / 1e3, 2))
    return out


def cuda_tests(tests: List[str], ctx) -> Dict:
    """Run pytest with arguments ``tests`` on the GPU machine: the counts of its JUnit
    report; raises (the key stays pending) when a test fails."""
    junit = os.path.join(ctx.work, "junit-cuda.xml")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
           f"--junitxml={junit}", *tests]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          timeout=max(10.0, ctx.seconds_left() - 5))
    print(proc.stdout[-3000:], proc.stderr[-2000:], flush=True)
    counts = dict(tests=0, failures=0, errors=0, skipped=0)
    failed = []
    if os.path.exists(junit):
        root = ET.parse(junit).getroot()
        for suite in root.iter("testsuite"):
            for k in counts:
                counts[k] += int(suite.get(k, 0))
        failed = [f"{c.get('classname')}.{c.get('name')}" for c in root.iter("testcase")
                  if c.find("failure") is not None or c.find("error") is not None]
    if proc.returncode not in (0, 5) or counts["failures"] or counts["errors"]:
        # not recorded: the key stays pending until the tests pass (5: none collected)
        raise RuntimeError(f"CUDA tests failed: {failed or proc.returncode}")
    return dict(counts, passed=counts["tests"] - counts["failures"] - counts["errors"]
                - counts["skipped"], failed=failed[:20], returncode=proc.returncode,
                command=" ".join(cmd[1:]))


def run_key(key: str, ctx) -> Dict:
    recipe = ctx.recipe
    if key == "pixel-pretrain-step":
        return pixel_step(recipe, ctx)
    if key == "text-pretrain-step":
        return text_step(recipe, ctx)
    if key == "transfer-forward":
        return transfer_forward(recipe, ctx)
    if key.startswith("resnet18-step-"):
        return resnet_step(recipe, ctx, key[len("resnet18-step-"):])
    if key == "cuda-tests":
        return cuda_tests(recipe["tests"], ctx)
    raise ValueError(f"profile has no run {key!r}")


def report(lines: List[Dict], recipe: Dict) -> List[str]:
    by = {l["key"]: l for l in lines}
    out = ["### GPU campaign: profile (steady state, full configurations)", "",
           "Generated from the ledger. Each step: the first (compilation) apart, warm-up, "
           "then each step timed between synchronisations; median ms; peak = memory a step "
           "allocates above what was held before it. Untrained predictors.", "",
           "| run | device | commit | median ms | first step s | peak MiB | throughput | "
           "top operation (share) |", "|---|---|---|---|---|---|---|---|"]
    for key in KEYS:
        l = by.get(key)
        if l is None:
            out.append(f"| {key} | pending | | | | | | |")
            continue
        m = l["metrics"]
        if key == "cuda-tests":
            out.append(f"| {key} | {md(l['device'])} | {md(l['commit'][:10])} | | | | "
                       f"{md(m.get('passed'))} passed, "
                       f"{m.get('failures', 0) + m.get('errors', 0)} failed, "
                       f"{m.get('skipped')} skipped | |")
            continue
        rate = next((f"{m[k]:.0f} {k.replace('_per_s', '')}/s" for k in
                     ("images_per_s", "tokens_per_s") if m.get(k)), "")
        top = m.get("top") or [{}]
        out.append(f"| {key} | {md(l['device'])} | {md(l['commit'][:10])} | "
                   f"{md(m.get('median_ms'))} | {md(m.get('first_step_s'))} | "
                   f"{md(m.get('peak_mib'))} | {rate} | "
                   f"{code(top[0].get('name', ''), 40)} ({top[0].get('share', 0):.0%}) |")
    pixel = by.get("pixel-pretrain-step")
    if pixel:
        ms = pixel["metrics"]["median_ms"]
        out += ["", f"Target: pixel pretraining step <= {TARGET_PIXEL_MS:.0f} ms on an H100: "
                f"**{'met' if ms <= TARGET_PIXEL_MS else 'not met'}** ({ms} ms on "
                f"{md(pixel['device'])})."]
    for key in KEYS:
        l = by.get(key)
        if l is None or not l["metrics"].get("top"):
            continue
        top = l["metrics"]["top"]
        kernels = all(t.get("kind") == "kernel" for t in top)
        if not kernels:  # recorded before kernels were told apart from operators
            seen, rows = set(), []
            for t in top:
                if (t["name"], t["ms_per_step"]) not in seen:
                    seen.add((t["name"], t["ms_per_step"]))
                    rows.append(t)
            top = rows
        out += ["", f"Top {'kernels' if kernels else 'operations'} of `{key}` (device time "
                "per step):", "", "| operation | ms/step | share | calls/step |",
                "|---|---|---|---|"]
        out += [f"| {code(t['name'], 90)} | {md(t['ms_per_step'])} | {t['share']:.1%} | "
                f"{t['calls_per_step']:g} |" for t in top[:8]]
        if not kernels:
            out += ["", "(Recorded before the profiler's operators and kernels were told "
                    "apart: a kernel's time was counted on its launching operator too, so "
                    "each share is of about twice the device time and reads about half its "
                    "true size; repeated rows are dropped.)"]
    return out + [""]
