"""What the pretraining slices (``pixel-pretrain``, ``text-pretrain``) share: ``glomo
pretrain``'s own loop stopped cleanly at a wall-clock deadline, the metrics a pretraining
key records, and the salvage of a key killed after its predictor came back."""
from __future__ import annotations

import os
import re
import time
from typing import Dict, List, Optional, Tuple

import lightning.pytorch as pl
import torch

AFTER_TRAINING_S = 30.0  # kept after training: saving the float16 predictor


class Deadline(pl.Callback):
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


class StepTimer(pl.Callback):
    """Each training step's time, from its batch's start to its end (forward, backward,
    optimiser), with the device synchronised at both ends; :meth:`steady` is the median
    of the steps after ``skip`` (compilation and the graph warm-up, whose steps do not
    train the graph predictor)."""

    def __init__(self, skip: int):
        self.skip, self.times, self._start = skip, [], 0.0

    @staticmethod
    def _sync(pl_module) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_batch_start(self, trainer, pl_module, *args) -> None:
        self._sync(pl_module)
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self._sync(pl_module)
        self.times.append(time.perf_counter() - self._start)

    def steady(self) -> Dict:
        """``step_ms`` (median, ``None`` when no step came after ``skip``), the steps it
        is taken over and the first of them."""
        steady = sorted(self.times[self.skip:])
        if not steady:
            return dict(step_ms=None, step_ms_steps=0, step_ms_from=self.skip)
        n = len(steady)
        median = steady[n // 2] if n % 2 else (steady[n // 2 - 1] + steady[n // 2]) / 2
        return dict(step_ms=round(1000 * median, 2), step_ms_steps=n, step_ms_from=self.skip)


STEADY_AFTER = 10  # steps past the graph warm-up before a step counts as steady


def pretrain_to_deadline(settings: Dict, ctx, train_seconds=None) -> Tuple[Dict, Dict]:
    """Run ``glomo pretrain`` with ``settings`` (a config mapping, its ``output_dir`` in
    ``ctx.work``) until ``train_seconds`` of training (``None``: no limit), the call's
    deadline less :data:`AFTER_TRAINING_S`, or ``train.max_steps``; then write the
    predictor in float16 to ``<ctx.out>/predictor``. Returns the run's summary and what
    stopped it (``stopped_by``, ``wall_s``, ``train_budget_s``), with the steady step
    time (:class:`StepTimer`: ``step_ms``, ``step_ms_steps``, ``step_ms_from``)."""
    from glomo_pyg import PretrainedGraphPredictor
    from glomo_pyg.logs import line_handler, logging_to
    from glomo_pyg.training import PretrainConfig, run_pretraining

    end = ctx.deadline - AFTER_TRAINING_S
    if end <= time.time():
        raise RuntimeError(f"{ctx.seconds_left():.0f} s left: no time to pretrain")
    limit = float("inf") if train_seconds is None else train_seconds
    deadline = Deadline(limit, end)
    timer = StepTimer(settings["train"].get("graph_warmup_steps", 0) + STEADY_AFTER)
    start = time.time()
    with logging_to(line_handler()):  # (the run's lines in the call's console)
        summary = run_pretraining(PretrainConfig.from_dict(settings),
                                  extra_callbacks=[deadline, timer])
    wall = time.time() - start
    predictor = PretrainedGraphPredictor.from_pretrained(
        os.path.join(settings["output_dir"], "predictor"))
    predictor.save_pretrained(os.path.join(ctx.out, "predictor"), dtype=torch.float16)
    return summary, dict(stopped_by="time" if deadline.stopped_at is not None else "max_steps",
                         wall_s=round(wall, 1), train_budget_s=round(min(limit, end - start), 1),
                         **timer.steady())


def metrics(summary: Dict, recipe: Dict, **extra) -> Dict:
    """A pretraining key's metrics: the run's summary, its steps, the steps the graph
    predictor trained (past the warm-up) and the mean time per step."""
    steps = summary.get("steps", 0)
    return dict(summary=summary, steps=steps,
                graph_steps=max(0, steps - recipe["train"]["graph_warmup_steps"]),
                seconds_per_step=round(summary["seconds"] / max(1, steps), 4), **extra)


_DONE = re.compile(r"^done: (\d+) steps in (\d+(?:\.\d+)?) s; predictor saved to ")


def salvage(slice_name: str, failure: Dict, manifest: Dict) -> Dict:
    """The metrics of a ``pretrain`` key of ``slice_name`` that was killed after its
    predictor came back: from the pretraining's ``done: N steps in S s; predictor saved``
    line in the failure's log tail. Raises ``ValueError`` when nothing can be salvaged."""
    if failure.get("key") != "pretrain":
        raise ValueError(f"{slice_name} has no run {failure.get('key')!r} to salvage")
    missing = [f for f in ("predictor/config.json", "predictor/model.safetensors")
               if f not in manifest["files"]]
    if missing:
        raise ValueError(f"the killed run's predictor did not come back ({missing} missing)")
    done = [m for m in (_DONE.match(str(line).strip()) for line in failure.get("tail") or [])
            if m]
    if not done:
        raise ValueError("the killed run's log has no 'done: N steps in S s; predictor "
                         "saved' line: it was killed before its predictor was saved")
    steps, seconds = int(done[-1].group(1)), float(done[-1].group(2))
    recipe = manifest["recipe"]
    return metrics(dict(steps=steps, seconds=seconds), recipe,
                   stopped_by="time" if steps < recipe["train"]["max_steps"] else "max_steps")


def check_metrics(metrics: Dict, where: str) -> None:
    """A returned pretraining key's metrics: the fields its report and card read, each of
    its declared type (``ValueError`` naming the field), before anything is written."""
    from benchmarks.gpu.manifest import pretraining_metrics

    pretraining_metrics(metrics, where)


# a predictor's config.json: the class of each direction's predictor, per modality
PREDICTOR_CLASSES = {"pixels": "PixelGraphPredictor", "text": "GraphPredictor"}


def check_predictor(predictor_dir: str, modality: str) -> None:
    """Refuse a returned predictor that does not read ``modality`` (``'pixels'`` or
    ``'text'``), from its ``config.json`` alone, before anything loads it: a text
    predictor returned for a pixel slice would fail deep in the graph check."""
    from benchmarks.gpu import files

    config = files.read_json(os.path.join(predictor_dir, "config.json"),
                             "the returned predictor's config")
    directions = config.get("directions")
    if not isinstance(directions, dict) or not directions:
        raise ValueError("the returned predictor's config.json has no 'directions'")
    for name, d in directions.items():
        cls = d.get("cls") if isinstance(d, dict) else None
        if cls != PREDICTOR_CLASSES[modality]:
            raise ValueError(f"the returned predictor's {name!r} direction is {cls!r}, not "
                             f"{PREDICTOR_CLASSES[modality]!r}: it does not read {modality} "
                             "(the wrong modality for this slice)")
    if modality == "text" and not isinstance(config.get("vocabulary"), list):
        raise ValueError("the returned text predictor's config.json has no vocabulary")


def hardware(manifest: Dict) -> str:
    """The model card's hardware line from a returned run's environment."""
    from benchmarks.gpu.report import md

    m = manifest["environment"]
    return (f"{md(m.get('device'))}" + (f" ({md(m['memory_gib'])} GiB)" if m.get("memory_gib")
                                        else "")
            + f"; torch {md(m.get('torch'))}, CUDA {md(m.get('cuda'))}")


def check_graph_steps(metrics: Dict, manifest: Dict, minimum: int, advice: str) -> None:
    """Refuse to release (and record) a real run whose graphs trained for fewer than
    ``minimum`` steps past the warm-up; ``advice`` says what to resize."""
    graph_steps = metrics.get("graph_steps", 0)
    if graph_steps < minimum and not manifest.get("dry_run"):
        raise ValueError(f"the graphs trained for {graph_steps} steps past the warm-up "
                         f"(fewer than {minimum}): not released and not recorded; {advice}")


def card_command(slice_name: str, salvaged: bool) -> str:
    """The model card's command: the slice's prepare, GPU call and ingest."""
    return (f"python -m benchmarks.gpu prepare {slice_name}\n"
            "# one GPU call, carrying .gpu/:\n"
            f"python -m benchmarks.gpu run {slice_name} --budget-s 510 --carry .gpu --out $OUT\n"
            "python -m benchmarks.gpu ingest FOLDER_THE_CALL_RETURNED"
            + (" --salvage" if salvaged else ""))


def steady_step_lines(metrics: Dict, target_ms: Optional[float] = None) -> List[str]:
    """The results' line of a run's steady step time (none when it was not measured),
    with the target where there is one."""
    if metrics.get("step_ms") is None:
        return []
    verdict = "" if target_ms is None else \
        f"; target <= {target_ms:.0f} ms: " + ("met" if metrics["step_ms"] <= target_ms
                                                else "not met")
    return [f"- steady step {metrics['step_ms']} ms (median of {metrics['step_ms_steps']} "
            f"steps from step {metrics['step_ms_from']}, each between device "
            f"synchronisations{verdict})"]


def stopped_by(metrics: Dict) -> str:
    """How a run's training ended, for its model card."""
    return "stopped by the wall clock" if metrics.get("stopped_by") == "time" else \
        "ran to max_steps"
