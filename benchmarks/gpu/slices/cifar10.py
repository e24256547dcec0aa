"""``cifar10`` (repeatable): paper Table 3's downstream runs with the released pixel
predictor ``imagenet32-pixel``: CIFAR ResNet-18 (then ResNet-34) with the input stage
off (``baseline``: the same gate and widths, no graphs), with GLoMo graphs (``glomo``)
and with uniform graphs (``uniform``); the same recipe, data and seeds for every
variant, keys interleaved by seed so every call adds complete pairs.

The recipe is a fast public-style one, run entirely on the GPU: the uint8 images live in
GPU memory, bf16 autocast, channels-last, batch 512, Nesterov SGD with a triangular
(linear up, linear down) schedule, label smoothing, random flips and translations. The
frozen predictor's work is not redone every epoch: the GLoMo stage's propagations are
computed once per image and orientation (the graphs are directional, so a mirrored image
has graphs of its own) and kept in GPU memory in float16 (uniform graphs are running
means, computed on the fly); the random translation (up to
4 pixels, zero fill) is applied to the stage's output :math:`H'` rather than to the
pixels, for every variant alike, so it needs no new graphs. The best validation epoch
(42,000 / 8,000 seeded split of the training images) is evaluated once on the 10,000
test images.
"""
from __future__ import annotations

import math
import os
import time
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from benchmarks.gpu import data
from benchmarks.gpu.report import md
from benchmarks.gpu.slices.common import cifar

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


def _release_digest() -> Optional[str]:
    from glomo_pyg.io.releases import releases_root

    path = os.path.join(str(releases_root()), RELEASE, "model.safetensors")
    if not os.path.isfile(path):
        return None
    from benchmarks.gpu.files import sha256

    return sha256(path)


def recipe(dry_run: bool) -> Dict:
    r = dict(predictor=dict(release=RELEASE, sha256=_release_digest()), width=64,
             depths=[18, 34], seeds={"18": 10, "34": 5}, side=32,
             split=dict(validation=8000, seed=0),
             train=dict(epochs=24, batch=512, lr=0.4, momentum=0.9, nesterov=True,
                        weight_decay=5e-4, warmup_fraction=0.25, label_smoothing=0.1,
                        flip=True, translate=4, eval_batch=1024),
             # estimate_s: the propagations of 102,000 images at the profile's
             # transfer-forward rate on an H100 (939 images/s: 109 s)
             stage=dict(precompute=["learned"], dtype="float16", batch=256, estimate_s=120))
    if dry_run:  # an untrained toy predictor and toy sizes: the same code in seconds
        r.update(predictor=dict(toy=dict(hidden_channels=8, num_layers=1, heads=2,
                                         cnn_layers=1, num_positions=4)),
                 width=4, depths=[18], seeds={"18": 2}, side=8,
                 split=dict(validation=8, seed=0),
                 train=dict(r["train"], epochs=2, batch=8, eval_batch=16, translate=1),
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
        from benchmarks.gpu.files import sha256
        from glomo_pyg.io.releases import release_path

        folder = release_path(RELEASE)
        if sha256(os.path.join(folder, "model.safetensors")) != recipe["predictor"]["sha256"]:
            raise ValueError(f"{folder} is not the release the recipe names")
        p = PretrainedGraphPredictor.from_pretrained(folder)
    return p.to(device).eval().set_layout("auto")


def translate(maps: torch.Tensor, shift: torch.Tensor, pad: int) -> torch.Tensor:
    """``maps`` ``[B, C, H, W]`` moved by ``shift`` ``[B, 2]`` (rows, columns; each in
    ``[-pad, pad]``) pixels each, zero-filled: a random crop of the map padded by ``pad``
    (given, so the step needs no device-to-host read)."""
    b, c, h, w = maps.shape
    p = pad
    if p == 0:
        return maps
    padded = F.pad(maps, (p, p, p, p))
    rows = (torch.arange(h, device=maps.device) + p).view(1, h) - shift[:, :1]  # [B, H]
    cols = (torch.arange(w, device=maps.device) + p).view(1, w) - shift[:, 1:]  # [B, W]
    index = torch.arange(b, device=maps.device).view(b, 1, 1)
    out = padded.permute(0, 2, 3, 1)[index, rows.view(b, h, 1), cols.view(b, 1, w)]
    return out.permute(0, 3, 1, 2)


class Stage:
    """A variant's stage propagations for a set of images, computed once (``None`` for
    the baseline, which has none), and the stage's output for a batch of them."""

    def __init__(self, model, images: torch.Tensor, recipe: Dict, mirrored: bool):
        self.model = model
        self.cache, self.mirror = None, None
        if model.transfer.graph not in recipe["stage"]["precompute"]:
            return  # computed on the fly (none: no graphs; uniform: running means, cheap)
        dtype = getattr(torch, recipe["stage"]["dtype"])
        self.cache = self._compute(images, recipe, dtype)
        if mirrored:
            self.mirror = self._compute(images.flip(3), recipe, dtype)

    @torch.no_grad()
    def _compute(self, images, recipe, dtype) -> torch.Tensor:
        """``[n, D, K, H W, C]``, written chunk by chunk into one preallocated tensor (a
        list and a ``cat`` would hold it twice: 56 GiB at the full configuration)."""
        from glomo_pyg.pixels import image_units

        cache = None
        for start in range(0, len(images), recipe["stage"]["batch"]):
            chunk = images[start:start + recipe["stage"]["batch"]]
            with torch.autocast("cuda", torch.bfloat16, enabled=chunk.is_cuda):
                x, batch = image_units(chunk)
                p = self.model.transfer.propagations(self.model.stage_input(chunk), x, batch)
            d, k, _, c = p.shape
            p = p.view(d, k, len(chunk), -1, c).permute(2, 0, 1, 3, 4)
            if cache is None:
                cache = torch.empty((len(images), *p.shape[1:]), dtype=dtype, device=p.device)
            cache[start:start + len(chunk)] = p
        return cache

    def __call__(self, images: torch.Tensor, index: torch.Tensor,
                 flip: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.cache is None:
            return self.model.stage(images)
        p = self.cache[index]
        if flip is not None and self.mirror is not None:
            p = torch.where(flip.view(-1, 1, 1, 1, 1), self.mirror[index], p)
        b, d, k, t, c = p.shape
        return self.model.stage(images, propagated=p.float().permute(1, 2, 0, 3, 4).reshape(
            d, k, b * t, c))


@torch.no_grad()
def accuracy(model, stage: Stage, images, labels, batch: int) -> float:
    model.eval()
    correct = 0
    for start in range(0, len(images), batch):
        index = torch.arange(start, min(start + batch, len(images)), device=images.device)
        with torch.autocast("cuda", torch.bfloat16, enabled=images.is_cuda):
            logits = model.classify(stage(images[index], index))
        correct += int((logits.argmax(-1) == labels[index]).sum())
    return correct / len(images)


def train_run(model, splits: Dict, stages: Dict, recipe: Dict, seed: int, log) -> Dict:
    """One run of the recipe; returns accuracies, curves and times."""
    t = recipe["train"]
    (images, labels), device = splits["train"], splits["train"][0].device
    n = len(images)
    steps = n // t["batch"]  # (the last partial batch dropped: a new order every epoch)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=t["lr"], momentum=t["momentum"],
                                nesterov=t["nesterov"], weight_decay=t["weight_decay"])
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=t["lr"], total_steps=t["epochs"] * steps,
        pct_start=t["warmup_fraction"], anneal_strategy="linear", div_factor=25.0,
        final_div_factor=1e3, cycle_momentum=False)
    gen = torch.Generator(device=device).manual_seed(seed)
    best, best_state, curve, epoch_s = -1.0, None, [], []
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for epoch in range(t["epochs"]):
        model.train()
        sync()
        start = time.time()
        order = torch.randperm(n, device=device, generator=gen)
        for step in range(steps):
            index = order[step * t["batch"]:(step + 1) * t["batch"]]
            x = images[index]
            flip = torch.rand(len(index), device=device, generator=gen) < 0.5 if t["flip"] \
                else torch.zeros(len(index), dtype=torch.bool, device=device)
            x = torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)
            shift = torch.randint(-t["translate"], t["translate"] + 1, (len(index), 2),
                                  device=device, generator=gen)
            with torch.autocast("cuda", torch.bfloat16, enabled=device.type == "cuda"):
                h = translate(stages["train"](x, index, flip), shift, t["translate"])
                loss = F.cross_entropy(model.classify(h).float(), labels[index],
                                       label_smoothing=t["label_smoothing"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        sync()
        epoch_s.append(round(time.time() - start, 3))
        acc = accuracy(model, stages["val"], *splits["val"], t["eval_batch"])
        curve.append(acc)
        if acc > best:
            best, best_epoch = acc, epoch
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if not math.isfinite(float(loss.detach())):  # a result too: the best epoch before
            diverged = epoch + 1
            log(f"  diverged at epoch {diverged}: the best validation epoch is evaluated")
            break
    else:
        diverged = None
    log(f"  last epoch: loss {float(loss.detach()):.3f}, validation {acc:.4f}; "
        f"{epoch_s[-1]:.2f} s/epoch")
    model.load_state_dict(best_state)
    test = accuracy(model, stages["test"], *splits["test"], t["eval_batch"])
    return dict(test_acc=test, best_val=best, best_epoch=best_epoch, val_curve=curve,
                epoch_s=epoch_s, diverged_at_epoch=diverged)


_STATE: Dict = {}  # per process: data, predictor and each variant's stage, built once


def _splits(ctx) -> Dict:
    if "splits" not in _STATE:
        from glomo_pyg.data.images import train_validation_split

        r, device = ctx.recipe, torch.device(ctx.device)
        images, labels = cifar(ctx.data_dir, "train", side=r["side"])
        test = cifar(ctx.data_dir, "test", side=r["side"])
        train_idx, val_idx = train_validation_split(len(images), r["split"]["validation"],
                                                    r["split"]["seed"])
        _STATE["splits"] = dict(
            train=(images[train_idx].to(device), labels[train_idx].to(device)),
            val=(images[val_idx].to(device), labels[val_idx].to(device)),
            test=(test[0].to(device), test[1].to(device)))
        _STATE["predictor"] = _predictor(r, ctx.device)
    return _STATE["splits"]


def run_key(key: str, ctx) -> Dict:
    from glomo_pyg import GlomoResNet, GlomoTransfer

    depth, variant, seed = key.split("/")
    depth, seed = int(depth[len("resnet"):]), int(seed[len("seed"):])
    r, device = ctx.recipe, torch.device(ctx.device)
    torch.backends.cudnn.benchmark = True  # fixed shapes: the fastest convolutions
    splits = _splits(ctx)
    torch.manual_seed(seed)
    model = GlomoResNet(GlomoTransfer(_STATE["predictor"], 3, graph=VARIANTS[variant]),
                        depth=depth, width=r["width"]).to(device)
    if device.type == "cuda":
        model.resnet.to(memory_format=torch.channels_last)
    stage_s = 0.0
    stages = _STATE.setdefault("stages", {})
    if variant not in stages:  # computed once per process and kept (GPU memory)
        t0 = time.time()
        stages[variant] = {name: Stage(model, images, r, mirrored=name == "train")
                           for name, (images, _) in splits.items()}
        if device.type == "cuda":
            torch.cuda.synchronize()
        stage_s = round(time.time() - t0, 3)
    for stage in stages[variant].values():
        # the propagations depend on the frozen predictor and the pixels alone; the
        # stage's gate and mixing weights are this run's own parameters
        stage.model = model
    start = time.time()
    result = train_run(model, splits, stages[variant], r, seed, ctx.log)
    result.update(seconds=round(time.time() - start, 1), propagations_s=stage_s,
                  trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
                  images=[len(splits[k][0]) for k in ("train", "val", "test")])
    ctx.log(f"{key}: test {result['test_acc']:.4f} (validation {result['best_val']:.4f} at "
            f"epoch {result['best_epoch'] + 1}); {result['seconds']} s"
            + (f" + {stage_s} s of propagations" if stage_s else ""))
    return result




def _target_lines(acc: Dict, runs: Dict[str, Dict], lines: List[Dict]) -> List[str]:
    """The targets met or not, from ResNet-18's runs (none without its baseline)."""
    from benchmarks.statistics import paired_difference

    base = acc.get((18, "baseline"))
    if not base:
        return []
    out: List[str] = []
    m = sum(base.values()) / len(base)
    per_run = [l["metrics"]["seconds"] for k, l in runs.items()
               if k.startswith("resnet18/baseline/")]
    prop = [l["metrics"]["propagations_s"] for l in lines
            if l["metrics"].get("propagations_s")]
    out += ["", f"Targets: ResNet-18 baseline >= {TARGETS['baseline_acc']}%: "
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
        ratio = (sum(epochs["glomo"]) / len(epochs["glomo"])) / \
            (sum(epochs["baseline"]) / len(epochs["baseline"]))
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


def report(lines: List[Dict], recipe: Dict) -> List[str]:
    from benchmarks.statistics import mean_sd, paired_difference

    t = recipe["train"]
    runs = {l["key"]: l for l in lines}
    devices = sorted({md(l["device"]) for l in lines})
    out = ["### GPU campaign: Table 3 downstream (CIFAR-10, full configuration)", "",
           f"Generated from the ledger: {len(lines)} runs on {', '.join(devices)}. Predictor: "
           + (f"release `{recipe['predictor'].get('release')}` (SHA-256 "
              f"{str(recipe['predictor'].get('sha256'))[:12]})"
              if not recipe["predictor"].get("toy")
              else "an untrained toy predictor (dry run)") + ". Recipe (every variant): ResNet "
           f"width {recipe['width']}, {t['epochs']} epochs, batch {t['batch']}, Nesterov SGD, "
           f"triangular schedule to lr {t['lr']}, weight decay {t['weight_decay']}, label "
           f"smoothing {t['label_smoothing']}, flips and translations of up to "
           f"{t['translate']} pixels (applied to the stage's output), bf16, channels-last; "
           f"{' / '.join(f'{n:,}' for n in lines[0]['metrics']['images'])} train / "
           "validation / test images; the best validation "
           "epoch evaluated once on test. The stage's propagations are computed once per "
           "image and orientation (s below, apart from the runs).", "",
           "| model | paper | test accuracy (mean ± std) | seeds | s per run | epoch s | "
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
            epochs = [s for l in mine for s in l["metrics"]["epoch_s"]]
            prop = [l["metrics"]["propagations_s"] for l in mine if l["metrics"]["propagations_s"]]
            out.append(f"| ResNet-{depth} {variant} | {PAPER.get((depth, variant), '-')} | "
                       f"{m:.2f}" + (f" ± {sd:.2f}" if len(values) > 1 else "") +
                       f" | {len(values)} | "
                       f"{sum(l['metrics']['seconds'] for l in mine) / len(mine):.1f} | "
                       f"{sum(epochs) / len(epochs):.2f} | "
                       f"{(sum(prop) / len(prop)) if prop else 0:.1f} |")
    out.append("")
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
