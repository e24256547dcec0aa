"""``glomo pretrain``'s run: corpus, checks, training, resume policy, saved predictor."""
from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import warnings
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

import lightning.pytorch as pl
import torch

from glomo_pyg.atomic_files import atomic_write, write_json
from glomo_pyg.data.tokens import read_shard_index
from glomo_pyg.io.paths import (
    check_input_path,
    check_output_folder,
    locked_folder,
    open_regular_file,
)
from glomo_pyg.logs import job_output, warn_log_argument
from glomo_pyg.training.checkpoints import (
    CHECKPOINT_KEY,
    check_checkpoint_matches,
    find_resume_checkpoint,
    newest_checkpoint_file,
    set_aside_damaged,
    stale_temporary_files,
)
from glomo_pyg.training.interrupts import GracefulInterrupt, interruptible
from glomo_pyg.training.pretrain.callbacks import RunRecord
from glomo_pyg.training.pretrain.config import (
    IMAGE_FORMATS,
    INIT_VECTORS_PARTS,
    PretrainConfig,
    short_repr,
)
from glomo_pyg.training.pretrain.corpus import (
    check_fingerprint,
    corpus_fingerprint,
    corpus_is_prepared,
    image_fingerprint,
    install_prepared_corpus,
    prepare_corpus,
    read_json,
    with_corpus_defaults,
)
from glomo_pyg.training.pretrain.data import (
    ImagePretrainingData,
    TextPretrainingData,
    load_pretraining_images,
)
from glomo_pyg.training.pretrain.module import GlomoPretraining, recorded_model_settings
from glomo_pyg.training.pretrain.trainer import (
    build_trainer,
    check_model_builds,
    check_trainer_builds,
    is_launcher_child,
)
from glomo_pyg.training.pretrain.vectors import (
    TRAIN_VECTORS,
    check_init_vectors,
    embedding_width,
    initial_token_embeddings,
    train_init_vectors,
)
from glomo_pyg.training.utils import quiet_lightning, rank_zero_info

logger = logging.getLogger(__name__)

# train settings a resumed run must keep: the checkpoint's optimiser state and data
# position were made with them (Lightning restores the optimiser's own lr)
RESUME_FIXED_TRAIN = ("optimizer", "lr", "graph_lr_scale", "weight_decay", "momentum",
                      "batch_size", "seed")  # (the seed draws the validation split)
# model settings that change only the speed (the same graphs)
RESUME_FREE_MODEL = ("layout",)


def _resume_refusal(config: PretrainConfig, before: Any, source: str,
                    remedy: str = "") -> Optional[str]:
    """Why the run may not resume from a checkpoint of the settings ``before``, or None."""
    if not isinstance(before, dict):
        return f"{source} is damaged (its settings are not a mapping){remedy}"
    now = config.to_dict()
    if isinstance(before.get("corpus"), dict):
        # the corpus may move (another machine): its fingerprint checks the content
        before = dict(before, corpus=dict(with_corpus_defaults(before["corpus"], now["corpus"]),
                                          path=now["corpus"]["path"]))
    if isinstance(before.get("model"), dict):
        before = dict(before, model={k: v for k, v in before["model"].items()
                                     if k not in RESUME_FREE_MODEL})
    now = dict(now, model={k: v for k, v in now["model"].items() if k not in RESUME_FREE_MODEL})
    changed = [k for k in ("model", "corpus") if before.get(k) != now[k]]
    if changed:
        return (f"the checkpoint was trained with other {' and '.join(changed)} settings "
                f"({source}); resume with the same ones (only train settings such as "
                "max_steps, and model.layout, may change)")
    saved = before.get("train") if isinstance(before.get("train"), dict) else {}
    used = [k for k in RESUME_FIXED_TRAIN  # (Adam ignores momentum)
            if k != "momentum" or "sgd" in (saved.get("optimizer"), now["train"]["optimizer"])]
    fixed = [f"train.{k} {short_repr(saved[k])} -> {short_repr(now['train'][k])}"
             for k in used if k in saved and saved[k] != now["train"][k]]
    if fixed:
        return (f"cannot resume with changed {', '.join(fixed)}: the checkpoint's optimiser "
                f"state and data position were made with the saved ones ({source}); start a "
                "new output_dir to change them")
    return None


def _make_last_the_newest(folder: str, ckpt: str, damaged: List[str]) -> None:
    """Set the ``damaged`` checkpoints aside and make ``last.ckpt`` a copy of ``ckpt``."""
    set_aside_damaged(damaged)
    last = os.path.join(folder, "last.ckpt")
    if os.path.abspath(ckpt) == os.path.abspath(last):
        return
    with open_regular_file(ckpt, "rb", "checkpoint") as src, atomic_write(last, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 24)
    if not damaged:  # (with damaged files, the warning said this already)
        rank_zero_info(logger, f"{last} is now a copy of {ckpt}, the newest complete checkpoint")


def run_pretraining(config: PretrainConfig, resume: bool = False,
                    extra_callbacks: Optional[List[pl.Callback]] = None,
                    log: Optional[Callable[[str], None]] = None,
                    prepare_only: bool = False) -> Dict[str, Any]:
    """Prepare the corpus, train, and save the predictor; returns a summary (also written
    to ``<output>/pretrain.json``). ``prepare_only`` stops after the corpus (do that once
    before a multi-node run whose nodes share the folder). ``resume`` continues from the
    newest usable checkpoint once it passed its checks.

    Its messages are INFO records of the ``glomo_pyg.training.pretrain`` loggers, from
    the process of global rank 0; Lightning's progress bar is drawn (``train.progress_bar``)
    only when they are enabled, and Lightning's own loggers are held at WARNING or the
    ``glomo_pyg`` logger's level. Where the application set up no logging, they are
    printed on standard output for the duration of the call
    (:func:`glomo_pyg.logs.job_output`; docs/training.md, "Logging"). ``log`` is
    deprecated: a callable that receives them instead.

    Raises:
        TrainingInterrupted: SIGTERM or SIGINT while training (a checkpoint is written).
        FolderLockedError: another run is writing into the output folder.
    """
    if log is not None:
        warn_log_argument("run_pretraining")
    with job_output(log):
        config.validate()
        if is_launcher_child():  # the launching process checked and holds the lock for all
            return _run_pretraining(config, resume, extra_callbacks, prepare_only)
        check_output_folder(config.output_dir)
        if config.corpus.path is not None:
            check_input_path(config.corpus.path, "corpus.path")
        with locked_folder(config.output_dir, "glomo pretrain run"):  # (freed at exit too)
            return _run_pretraining(config, resume, extra_callbacks, prepare_only)


def _resume_point(config: PretrainConfig, resume: bool, child: bool):
    """``(checkpoint, contents, damaged checkpoints, step)`` to resume from, checked."""
    out, max_steps = config.output_dir, config.train.max_steps
    folder, saved_config = os.path.join(out, "checkpoints"), os.path.join(out, "config.json")
    os.makedirs(out, exist_ok=True)
    existing = newest_checkpoint_file(folder)
    if not resume and existing is not None and not child:
        raise FileExistsError(f"{out} already holds a run ({existing}); pass --resume to "
                              "continue it or choose another output_dir")
    damaged: List[str]
    found, damaged = None, []  # (checkpoints found damaged, set aside once checks pass)
    if resume:
        for tmp in stale_temporary_files(folder) if not child else []:
            rank_zero_info(logger, f"removing {tmp}: an unfinished checkpoint write of a "
                           "killed run")
            os.unlink(tmp)
        found = find_resume_checkpoint(folder, damaged)
        if found is None:
            rank_zero_info(logger, f"--resume: no checkpoint in {folder} yet; starting from "
                           "scratch")
    ckpt, contents = found if found is not None else (None, None)
    step = int(contents.get("global_step", 0)) if contents is not None else 0
    recorded = (contents.get(CHECKPOINT_KEY) or {}).get("settings") if contents else None
    refusal = None
    if step > max_steps:
        refusal = (f"{ckpt} is at step {step}, past train.max_steps ({max_steps}); raise "
                   "max_steps to continue the run")
    elif recorded is not None:  # the checkpoint's own record: config.json is only a copy
        refusal = _resume_refusal(config, recorded, cast(str, ckpt))  # (a record: a checkpoint)
    elif ckpt is not None and os.path.exists(saved_config):  # older checkpoints
        skip = ("delete it to skip this check (it is rewritten from the current settings; "
                "the checkpoint itself is still checked against the model and corpus)")
        refusal = _resume_refusal(config, read_json(saved_config, skip), saved_config,
                                  remedy=f"; {skip}")
    if refusal:
        raise ValueError(f"{out}: {refusal}")
    return ckpt, contents, damaged, step


def _check_before_corpus(config: PretrainConfig, fresh: bool, prepare_only: bool):
    """Fail before the corpus is prepared if the model, trainer or vectors would."""
    check_model_builds(config)
    if not prepare_only:  # (a corpus may be prepared without the cluster/GPU)
        check_trainer_builds(config)
    c, t = config.corpus, config.train
    if t.graph_warmup_steps and t.graph_warmup_steps >= t.max_steps:
        message = (f"train.graph_warmup_steps ({t.graph_warmup_steps}) >= train.max_steps "
                   f"({t.max_steps}): the graph predictor is frozen during the warm-up, so "
                   "the saved graphs will be those of its random initialisation")
        # (once: the glomo command shows warnings as one line each, outside the progress bar)
        warnings.warn(message, RuntimeWarning, stacklevel=4)  # (the caller of run_pretraining)
    trees = None  # train.syntax_treebank's, read before the corpus is prepared
    if t.syntax_treebank and not prepare_only and c.format not in IMAGE_FORMATS:
        from glomo_pyg.analysis.treebank import TreebankFormatError, read_treebank

        path = os.path.expanduser(t.syntax_treebank)
        try:
            trees, problem = read_treebank(path, max_sentences=t.syntax_sentences), None
        except (OSError, TreebankFormatError) as err:
            trees, problem = [], err
        if not trees:
            raise ValueError(f"train.syntax_treebank: {problem or f'{path} holds no sentences'}")
    if t.init_vectors not in (None, TRAIN_VECTORS) and fresh and not prepare_only:
        check_init_vectors(config)
    return trees


def _prepare_text(config: PretrainConfig, contents, ckpt, prepare_only: bool,
                  child: bool) -> SimpleNamespace:
    """The token shards and vocabulary (prepared aside and checked first on a resume)."""
    out, c = config.output_dir, config.corpus
    staging = tempfile.mkdtemp(prefix=".corpus-", dir=out) if contents is not None and \
        not prepare_only and not child and not corpus_is_prepared(out) else None
    try:
        vocab, shards = prepare_corpus(c, staging or out)
        if prepare_only:
            return SimpleNamespace(prepared=dict(
                vocabulary=len(vocab), tokens=read_shard_index(shards)["num_tokens"]))
        fingerprint = corpus_fingerprint(vocab, shards)
        where = f"the corpus ({c.path}, prepared in {os.path.join(out, 'tokens')})"
        if staging is not None:
            check_fingerprint(contents, ckpt, fingerprint, where)
            install_prepared_corpus(staging, out)
            shards = os.path.join(out, "tokens")
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return SimpleNamespace(images=False, vocab=vocab, shards=shards, fingerprint=fingerprint,
                           where=where, prepared=None)


def _prepare_images(config: PretrainConfig, prepare_only: bool) -> SimpleNamespace:
    c = config.corpus
    pixels = load_pretraining_images(c)
    rank_zero_info(logger, f"images: {len(pixels)} of {tuple(pixels.shape[1:])} from {c.path}")
    full = tuple(pixels.shape[2:])  # (a crop too large: GlomoPretraining says so)
    return SimpleNamespace(images=True, vocab=None, pixels=pixels, full=full,
                           crop=(c.crop, c.crop) if c.crop is not None else full,
                           fingerprint=image_fingerprint(pixels) if not prepare_only else None,
                           where=f"corpus.path ({c.path})",
                           prepared=dict(images=len(pixels)) if prepare_only else None)


def _data_and_module(config: PretrainConfig, corpus: SimpleNamespace
                     ) -> Tuple[TextPretrainingData, GlomoPretraining, Dict[str, Any]]:
    c, t = config.corpus, config.train
    data: TextPretrainingData
    if corpus.images:
        data = ImagePretrainingData(corpus.pixels, t.batch_size, c.validation_fraction,
                                    t.seed, t.num_workers)
        model_kwargs = dict(config.model, modality="image", in_channels=corpus.pixels.size(1),
                            height=corpus.crop[0], width=corpus.crop[1])
    else:
        data = TextPretrainingData(corpus.shards, c.max_length, c.min_length, t.batch_size,
                                   c.validation_fraction, t.seed, t.num_workers)
        model_kwargs = dict(config.model, num_tokens=len(corpus.vocab),
                            padding_idx=corpus.vocab.pad_id)
    data.setup("fit")  # (now, not in trainer.fit: a corpus too small fails before training)
    module = GlomoPretraining(**model_kwargs, lr=t.lr, graph_lr_scale=t.graph_lr_scale,
                              graph_warmup_steps=t.graph_warmup_steps,
                              weight_decay=t.weight_decay, optimizer=t.optimizer,
                              momentum=t.momentum, flip=c.flip,
                              image_size=corpus.full if corpus.images else None)
    return data, module, model_kwargs


def _start_token_embeddings(config: PretrainConfig, vocab, module: GlomoPretraining,
                            model_kwargs: Dict[str, Any]) -> float:
    """Set ``train.init_vectors`` into the embeddings; returns the share found."""
    c, t = config.corpus, config.train
    width = embedding_width(model_kwargs)
    source = t.init_vectors if t.init_vectors != TRAIN_VECTORS else train_init_vectors(
        c, width, config.output_dir, t.seed, max(1, torch.get_num_threads()))
    weight, found = initial_token_embeddings(cast(str, source),  # (set: the caller checks)
                                             vocab.tokens(), width, t.seed)
    module.model.set_token_embeddings(weight, INIT_VECTORS_PARTS[t.init_vectors_parts])
    only = {"graph": "; g's only", "features": "; f's only"}.get(t.init_vectors_parts, "")
    rank_zero_info(logger, f"token embeddings start from {source} ({found:.1%} of the "
                   f"vocabulary found{only})")
    return found


def _trainer(config: PretrainConfig, corpus: SimpleNamespace, data, module: GlomoPretraining,
             trees, extra_callbacks: Optional[List[pl.Callback]], ckpt: Optional[str],
             child: bool, start_step: int = 0
             ) -> Tuple[pl.Trainer, GracefulInterrupt, RunRecord]:
    """The run's trainer with the caller's callbacks and the run's own."""
    t, monitor = config.train, []
    if trees:  # checked now rather than when its first score is due
        from glomo_pyg.training.syntax_monitor import SyntaxMonitor

        try:
            monitor = [SyntaxMonitor(trees, corpus.vocab.tokens(), t.syntax_every,
                                     lower=config.corpus.lower).check(module.model)]
        except ValueError as err:
            raise ValueError(f"train.syntax_treebank: {err}") from None
    interrupt = GracefulInterrupt(os.path.join(config.output_dir, "checkpoints", "last.ckpt"),
                                  quiet=child or not logger.isEnabledFor(logging.WARNING))
    record = RunRecord(corpus.fingerprint, config.to_dict())
    # (the bar follows the run's messages: silencing them silences it)
    trainer = build_trainer(config, [*(extra_callbacks or []), *monitor, record, interrupt],
                            start_step, progress_bar=t.progress_bar and
                            logger.isEnabledFor(logging.INFO))
    rank_zero_info(logger, f"trainer: {type(trainer.accelerator).__name__}, "
                   f"{trainer.num_devices} device(s) x {trainer.num_nodes} node(s), "
                   f"{type(trainer.strategy).__name__}, precision {trainer.precision}")
    unit = "images" if corpus.images else f"sequences of <= {config.corpus.max_length} tokens"
    rank_zero_info(logger, f"pretraining: {len(data.train_ids)} training / "
                   f"{len(data.val_ids)} validation {unit}, {t.max_steps} steps of "
                   f"{t.batch_size}" + (f", resuming from {ckpt}" if ckpt else ""))
    return trainer, interrupt, record


def _save_result(config: PretrainConfig, corpus: SimpleNamespace, trainer: pl.Trainer,
                 module: GlomoPretraining, data, seconds: float,
                 found_vectors: Optional[float]) -> Dict[str, Any]:
    """The summary; the first process also saves it and the predictor."""
    from glomo_pyg.nn.pretrained import save_pretrained

    out, images = config.output_dir, corpus.images
    size = dict(images=len(corpus.pixels)) if images else dict(
        tokens=data.windows.num_tokens, vocabulary=len(corpus.vocab))
    summary = dict(steps=trainer.global_step, seconds=round(seconds, 1), **size)
    for k in ("train_loss", "val_loss"):  # None if not logged (not NaN: strict JSON)
        value = float(trainer.callback_metrics.get(k, math.nan))
        summary[k] = value if math.isfinite(value) else None
    if found_vectors is not None:
        summary["init_vectors_found"] = round(found_vectors, 4)
    if trainer.is_global_zero:
        predictor = module.model.cpu().to_pretrained(
            corpus.vocab.tokens() if corpus.vocab else None,
            trained_length=None if images else config.corpus.max_length,
            lowercase=None if images else config.corpus.lower,
            trained_size=corpus.crop if images else None)
        if images and corpus.crop != corpus.full:  # trained on crops: same weights, full size
            predictor = predictor.resized(*corpus.full)
        save_pretrained(predictor, os.path.join(out, "predictor"))
        write_json(os.path.join(out, "pretrain.json"), summary)
        rank_zero_info(logger, f"done: {summary['steps']} steps in {seconds:.0f} s; predictor "
                       f"saved to {os.path.join(out, 'predictor')}")
    return summary


def _fit(trainer: pl.Trainer, module: GlomoPretraining, data, ckpt: Optional[str],
         interrupt: GracefulInterrupt) -> None:
    """Trains ``module``; a signal's exit becomes :class:`TrainingInterrupted`."""
    with interruptible(trainer, interrupt), quiet_lightning():
        trainer.fit(module, datamodule=data, ckpt_path=ckpt, weights_only=True)


def _saved_summary(config: PretrainConfig, trainer: pl.Trainer, start_step: int,
                   ckpt: Optional[str]) -> Optional[Dict[str, Any]]:
    """The saved summary of a resumed run that had nothing left to train, else ``None``."""
    out = config.output_dir
    summary = os.path.join(out, "pretrain.json")
    if trainer.global_step == start_step and ckpt is not None and \
            os.path.exists(summary) and os.path.isdir(os.path.join(out, "predictor")):
        # nothing left to train: the saved summary and predictor, if of this end
        saved = read_json(summary, "delete it; it is rewritten by a run that trains")
        if isinstance(saved, dict) and saved.get("steps") == trainer.global_step:
            rank_zero_info(logger, f"{ckpt} is already at train.max_steps "
                           f"({config.train.max_steps}): nothing to train")
            return saved
    return None


def _run_pretraining(config: PretrainConfig, resume: bool,
                     extra_callbacks: Optional[List[pl.Callback]],
                     prepare_only: bool) -> Dict[str, Any]:
    child = is_launcher_child()  # (its messages: muted by rank_zero_info)
    out, t = config.output_dir, config.train
    folder = os.path.join(out, "checkpoints")
    ckpt, contents, damaged, start_step = _resume_point(config, resume, child)
    if not child and ckpt is None:  # (resumed runs: once the checkpoint passed its checks)
        write_json(os.path.join(out, "config.json"), config.to_dict())
    trees = _check_before_corpus(config, ckpt is None, prepare_only)
    corpus = _prepare_images(config, prepare_only) if config.corpus.format in \
        IMAGE_FORMATS else _prepare_text(config, contents, ckpt, prepare_only, child)
    if prepare_only:
        return corpus.prepared
    threads = torch.get_num_threads()  # restored on return: no lasting side effect
    if t.threads:
        torch.set_num_threads(t.threads)
    try:
        pl.seed_everything(t.seed, workers=True, verbose=False)
        data, module, model_kwargs = _data_and_module(config, corpus)
        found_vectors = None
        if t.init_vectors is not None and ckpt is None:  # (a resumed run has its weights)
            found_vectors = _start_token_embeddings(config, corpus.vocab, module,
                                                    model_kwargs)
        if contents is not None:
            check_fingerprint(contents, ckpt, corpus.fingerprint, corpus.where)
            check_checkpoint_matches(  # (this version's flat hyperparameters, or 0.7's)
                contents, ckpt, module, module.model_settings, ignore=RESUME_FREE_MODEL,
                saved_settings=recorded_model_settings(contents.get("hyper_parameters")))
            contents = None  # let go of the memory-mapped file
            if not child:
                write_json(os.path.join(out, "config.json"), config.to_dict())
                _make_last_the_newest(folder, ckpt, damaged)
                ckpt = os.path.join(folder, "last.ckpt")
        trainer, interrupt, record = _trainer(config, corpus, data, module, trees,
                                              extra_callbacks, ckpt, child, start_step)
        _fit(trainer, module, data, ckpt, interrupt)
        saved = _saved_summary(config, trainer, start_step, ckpt)
        if saved is not None:
            return saved
        return _save_result(config, corpus, trainer, module, data, record.seconds(),
                            found_vectors)
    finally:
        torch.set_num_threads(threads)
