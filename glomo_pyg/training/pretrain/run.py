"""``glomo pretrain``'s run: corpus, checks, training, resume policy and the saved
predictor (the package docstring tells the whole story)."""
from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
import warnings
from typing import Any, Dict, List, Optional

import lightning.pytorch as pl
import torch

from glomo_pyg.atomic_files import atomic_write
from glomo_pyg.data.tokens import read_shard_index
from glomo_pyg.nn.settings import MAX_VOCABULARY
from glomo_pyg.io.paths import check_input_path, locked_folder, open_regular_file
from glomo_pyg.training.checkpoints import (CHECKPOINT_KEY, check_checkpoint_matches,
                                            set_aside_damaged,
                                            find_resume_checkpoint, newest_checkpoint_file,
                                            stale_temporary_files)
from glomo_pyg.training.interrupts import GracefulInterrupt, TrainingInterrupted
from glomo_pyg.training.pretraining import GlomoPretraining
from glomo_pyg.training.utils import quiet_lightning
from glomo_pyg.training.pretrain.config import (IMAGE_FORMATS, INIT_VECTORS_PARTS, PretrainConfig,
                                                TrainConfig, short_repr)
from glomo_pyg.training.pretrain.corpus import (check_fingerprint, corpus_fingerprint,
                                                corpus_is_prepared, image_fingerprint,
                                                install_prepared_corpus, prepare_corpus,
                                                read_json, with_corpus_defaults, write_json)
from glomo_pyg.training.pretrain.callbacks import RunRecord
from glomo_pyg.training.pretrain.data import (ImagePretrainingData, TextPretrainingData,
                                              load_pretraining_images)
from glomo_pyg.training.pretrain.trainer import (build_trainer, check_model_builds,
                                                 check_trainer_builds, is_launcher_child)
from glomo_pyg.training.pretrain.vectors import (TRAIN_VECTORS, check_init_vectors,
                                                 embedding_width, initial_token_embeddings,
                                                 train_init_vectors)


def _read_syntax_treebank(t: TrainConfig):
    """The trees of ``train.syntax_treebank`` (read before the corpus is prepared)."""
    from glomo_pyg.analysis.treebank import TreebankFormatError, read_treebank

    path = os.path.expanduser(t.syntax_treebank)
    try:
        trees = read_treebank(path, max_sentences=t.syntax_sentences)
    except (OSError, TreebankFormatError) as err:
        raise ValueError(f"train.syntax_treebank: {err}") from None
    if not trees:
        raise ValueError(f"train.syntax_treebank: {path} holds no sentences")
    return trees


# train settings a resumed run must keep: the optimiser state and the data position
# in the checkpoint were made with them (Lightning restores the optimiser's own lr)
RESUME_FIXED_TRAIN = ("optimizer", "lr", "graph_lr_scale", "weight_decay", "momentum",
                      "batch_size", "seed")  # (the seed draws the validation split)
# model settings that change only the speed (the same graphs), so a resume may change them
RESUME_FREE_MODEL = ("layout",)


def _check_resume_settings(config: PretrainConfig, before: Any, source: str, out: str,
                           remedy: str = "") -> None:
    """Refuse to resume a run whose checkpoint was made with other model or corpus
    settings, or other train settings that its optimiser state and data position depend
    on. ``before`` is the settings mapping recorded in ``source`` (the checkpoint, or
    ``config.json`` for checkpoints written before checkpoints recorded them)."""
    if not isinstance(before, dict):
        raise ValueError(f"{source} is damaged (its settings are not a mapping){remedy}")
    now = config.to_dict()
    if isinstance(before.get("corpus"), dict):
        before = dict(before, corpus=with_corpus_defaults(before["corpus"], now["corpus"]))
        # where the corpus lies may change (another machine): its fingerprint checks the
        # content; a text corpus's prepared tokens are tied to their path (corpus.json)
        before["corpus"] = dict(before["corpus"], path=now["corpus"]["path"])
    if isinstance(before.get("model"), dict):
        before = dict(before, model={k: v for k, v in before["model"].items()
                                     if k not in RESUME_FREE_MODEL})
    now = dict(now, model={k: v for k, v in now["model"].items() if k not in RESUME_FREE_MODEL})
    changed = [k for k in ("model", "corpus") if before.get(k) != now[k]]
    if changed:
        raise ValueError(f"{out}: the checkpoint was trained with other {' and '.join(changed)} "
                         f"settings ({source}); resume with the same ones (only "
                         "train settings such as max_steps, and model.layout, may change)")
    saved_train = before.get("train") if isinstance(before.get("train"), dict) else {}
    used = [k for k in RESUME_FIXED_TRAIN  # (Adam ignores momentum)
            if k != "momentum" or "sgd" in (saved_train.get("optimizer"), now["train"]["optimizer"])]
    fixed = [f"train.{k} {short_repr(saved_train[k])} -> {short_repr(now['train'][k])}"
             for k in used if k in saved_train and saved_train[k] != now["train"][k]]
    if fixed:
        raise ValueError(f"{out}: cannot resume with changed {', '.join(fixed)}: the "
                         "checkpoint's optimiser state and data position were made with the "
                         f"saved ones ({source}); start a new output_dir to change them")


def _make_last_the_newest(folder: str, ckpt: str, log, damaged: List[str]) -> None:
    """After a resume's checks passed: the ``damaged`` checkpoints are set aside as
    ``NAME.damaged`` (find_resume_checkpoint's warning said so: one message for the
    decision), and ``last.ckpt`` becomes a copy of ``ckpt``, the newest complete
    checkpoint, when it is older or missing (a kill while it was rewritten), so the run
    folder's own pointer to its state is right again, also when there is nothing left to
    train. Written atomically."""
    set_aside_damaged(damaged)
    last = os.path.join(folder, "last.ckpt")
    if os.path.abspath(ckpt) == os.path.abspath(last):
        return
    with open_regular_file(ckpt, "rb", "checkpoint") as src, atomic_write(last, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 24)
    if not damaged:  # (with damaged files, the warning said this already)
        log(f"{last} is now a copy of {ckpt}, the newest complete checkpoint")


def _metric(trainer: pl.Trainer, name: str) -> Optional[float]:
    """A logged metric as a float, or None (not NaN: the summary is strict JSON) when it
    was not logged, e.g. no validation ran."""
    value = trainer.callback_metrics.get(name)
    return float(value) if value is not None and math.isfinite(float(value)) else None


def run_pretraining(config: PretrainConfig, resume: bool = False,
                    extra_callbacks: Optional[List[pl.Callback]] = None, log=print,
                    prepare_only: bool = False) -> Dict[str, Any]:
    """Prepare the corpus, train, and save the predictor. Returns a summary (also written
    to ``<output>/pretrain.json``). ``prepare_only`` stops after the corpus (tokens and
    vocabulary): do that once before a multi-node run whose nodes share the folder.

    ``resume`` continues from the newest usable checkpoint of ``<output>/checkpoints``
    after checking it against the settings it records (model, corpus, and the train
    settings its optimiser state and data position depend on) and against the corpus
    (fingerprint).
    SIGTERM or SIGINT while training writes a checkpoint and raises
    :class:`~glomo_pyg.training.interrupts.TrainingInterrupted`.

    The output folder is locked while the run writes into it: a second run into the
    same folder raises :class:`~glomo_pyg.io.paths.FolderLockedError` at once."""
    config.validate()
    if is_launcher_child():  # the launching process holds the lock for all of them
        return _run_pretraining(config, resume, extra_callbacks, log, prepare_only)
    out = config.output_dir
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"output_dir {out} is a file, not a folder")
    if config.corpus.path is not None:
        check_input_path(config.corpus.path, "corpus.path")
    with locked_folder(out, "glomo pretrain run"):  # (freed at exit, also on a crash)
        return _run_pretraining(config, resume, extra_callbacks, log, prepare_only)


def _run_pretraining(config: PretrainConfig, resume: bool,
                     extra_callbacks: Optional[List[pl.Callback]], log,
                     prepare_only: bool) -> Dict[str, Any]:
    from glomo_pyg.io.pretrained import save_pretrained

    config.validate()
    child = is_launcher_child()
    if child:
        log = lambda *args, **kwargs: None  # noqa: E731 (the first process reports)
    out = config.output_dir
    folder = os.path.join(out, "checkpoints")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"output_dir {out} is a file, not a folder")
    os.makedirs(out, exist_ok=True)
    existing = newest_checkpoint_file(folder)
    if not resume and existing is not None and not child:
        raise FileExistsError(f"{out} already holds a run ({existing}); pass --resume to "
                              "continue it or choose another output_dir")
    found, damaged = None, []  # (checkpoints found damaged, set aside once checks pass)
    if resume:
        if not child:
            for tmp in stale_temporary_files(folder):
                log(f"removing {tmp}: an unfinished checkpoint write of a killed run")
                os.unlink(tmp)
        found = find_resume_checkpoint(folder, log, damaged)
        if found is None:
            log(f"--resume: no checkpoint in {folder} yet; starting from scratch")
    ckpt, contents = found if found is not None else (None, None)
    start_step = int(contents.get("global_step", 0)) if contents is not None else 0
    if start_step > config.train.max_steps:
        raise ValueError(f"{ckpt} is at step {start_step}, past train.max_steps "
                         f"({config.train.max_steps}); raise max_steps to continue the run")
    saved_config = os.path.join(out, "config.json")
    recorded = (contents.get(CHECKPOINT_KEY) or {}).get("settings") if contents else None
    if recorded is not None:  # the checkpoint's own record: config.json is only a copy
        _check_resume_settings(config, recorded, ckpt, out)
    elif ckpt is not None and os.path.exists(saved_config):  # older checkpoints
        skip = ("delete it to skip this check (it is rewritten from the current settings; "
                "the checkpoint itself is still checked against the model and corpus)")
        _check_resume_settings(config, read_json(saved_config, skip), saved_config, out,
                               remedy=f"; {skip}")
    if not child and ckpt is None:  # (resumed runs: once the checkpoint passed its checks)
        write_json(saved_config, config.to_dict())
    check_model_builds(config)
    if not prepare_only:  # (a corpus may be prepared on a machine without the cluster/GPU)
        check_trainer_builds(config)
    c, t = config.corpus, config.train
    if t.graph_warmup_steps and t.graph_warmup_steps >= t.max_steps:
        message = (f"train.graph_warmup_steps ({t.graph_warmup_steps}) >= train.max_steps "
                   f"({t.max_steps}): the graph predictor is frozen during the warm-up, so "
                   "the saved graphs will be those of its random initialisation")
        warnings.warn(message, RuntimeWarning, stacklevel=3)  # (the caller of run_pretraining)
        log(f"warning: {message}")
    images = c.format in IMAGE_FORMATS
    trees = _read_syntax_treebank(t) if t.syntax_treebank and not images and \
        not prepare_only else None
    if t.init_vectors not in (None, TRAIN_VECTORS) and ckpt is None and not prepare_only:
        check_init_vectors(config)
    if images:
        vocab, pixels = None, load_pretraining_images(c)
        log(f"images: {len(pixels)} of {tuple(pixels.shape[1:])} from {c.path}")
        if prepare_only:
            return dict(images=len(pixels))
        fingerprint, where = image_fingerprint(pixels), f"corpus.path ({c.path})"
    else:
        # a resumed run whose prepared corpus is gone prepares it aside and checks it
        # against the checkpoint first: a refused resume leaves the run folder as it was
        staging = tempfile.mkdtemp(prefix=".corpus-", dir=out) if contents is not None and \
            not prepare_only and not child and not corpus_is_prepared(out) else None
        try:
            vocab, shards = prepare_corpus(config.corpus, staging or out, log)
            if len(vocab) > MAX_VOCABULARY:  # the saved predictor could not be loaded
                raise ValueError(f"the corpus has {len(vocab)} distinct tokens, more than a "
                                 f"saved predictor may hold ({MAX_VOCABULARY}): set "
                                 "corpus.max_size")
            if prepare_only:
                return dict(vocabulary=len(vocab), tokens=read_shard_index(shards)["num_tokens"])
            fingerprint = corpus_fingerprint(vocab, shards)
            where = f"the corpus ({c.path}, prepared in {os.path.join(out, 'tokens')})"
            if staging is not None:
                check_fingerprint(contents, ckpt, fingerprint, where, log)
                install_prepared_corpus(staging, out)
                shards = os.path.join(out, "tokens")
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
    threads = torch.get_num_threads()  # restored on return: no lasting side effect
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    try:
        pl.seed_everything(config.train.seed, workers=True, verbose=False)
        if images:
            data = ImagePretrainingData(pixels, t.batch_size, c.validation_fraction, t.seed,
                                        t.num_workers)
            full = (pixels.size(2), pixels.size(3))
            if c.crop is not None and c.crop > min(full):
                raise ValueError(f"corpus.crop {c.crop} is larger than the {full} images")
            crop = (c.crop, c.crop) if c.crop is not None else full
            model_kwargs = dict(config.model, modality="image", in_channels=pixels.size(1),
                                height=crop[0], width=crop[1])
        else:
            data = TextPretrainingData(shards, c.max_length, c.min_length, t.batch_size,
                                       c.validation_fraction, t.seed, t.num_workers)
            model_kwargs = dict(config.model, num_tokens=len(vocab), padding_idx=vocab.pad_id)
        module = GlomoPretraining(model_kwargs, lr=t.lr, graph_lr_scale=t.graph_lr_scale,
                                  graph_warmup_steps=t.graph_warmup_steps,
                                  weight_decay=t.weight_decay, optimizer=t.optimizer,
                                  momentum=t.momentum, flip=c.flip,
                                  image_size=full if images else None)
        found_vectors = None
        if t.init_vectors is not None and ckpt is None:  # (a resumed run has its weights)
            # (every process of a multi-process run trains its own vectors, written
            # atomically; DDP starts all of them from the first process's weights)
            width = embedding_width(model_kwargs)
            source = t.init_vectors if t.init_vectors != TRAIN_VECTORS else \
                train_init_vectors(c, width, out, t.seed, max(1, torch.get_num_threads()), log)
            weight, found_vectors = initial_token_embeddings(source, vocab.tokens(), width,
                                                             t.seed)
            parts = INIT_VECTORS_PARTS[t.init_vectors_parts]
            module.model.set_token_embeddings(weight, parts)
            only = {"graph": "; g's only", "features": "; f's only"}.get(
                t.init_vectors_parts, "")
            log(f"token embeddings start from {source} ({found_vectors:.1%} of the "
                f"vocabulary found{only})")
        if contents is not None:
            check_fingerprint(contents, ckpt, fingerprint, where, log)
            check_checkpoint_matches(contents, ckpt, module, model_kwargs,
                                     ignore=RESUME_FREE_MODEL)
            contents = found = None  # let go of the memory-mapped file
            if not child:
                write_json(saved_config, config.to_dict())
                _make_last_the_newest(folder, ckpt, log, damaged)
                ckpt = os.path.join(folder, "last.ckpt")
        extra_callbacks = list(extra_callbacks or [])
        if trees is not None:
            from glomo_pyg.training.syntax_monitor import SyntaxMonitor

            monitor = SyntaxMonitor(trees, vocab.tokens(), t.syntax_every, lower=c.lower)
            try:  # refused now rather than when the first score is due
                monitor.check(module.model)
            except ValueError as err:
                raise ValueError(f"train.syntax_treebank: {err}") from None
            extra_callbacks.append(monitor)
        interrupt = GracefulInterrupt(os.path.join(folder, "last.ckpt"), quiet=child)
        record = RunRecord(fingerprint, config.to_dict())
        with quiet_lightning():
            trainer = build_trainer(config, [*extra_callbacks, record, interrupt])
        log(f"trainer: {type(trainer.accelerator).__name__}, {trainer.num_devices} device(s) x "
            f"{trainer.num_nodes} node(s), {type(trainer.strategy).__name__}, precision "
            f"{trainer.precision}")
        unit = "images" if images else f"sequences of <= {c.max_length} tokens"
        log(f"pretraining: {len(data.train_ids)} training / {len(data.val_ids)} validation "
            f"{unit}, {t.max_steps} steps of {t.batch_size}"
            + (f", resuming from {ckpt}" if ckpt else ""))
        start = time.time()
        interrupt.install()
        try:
            with warnings.catch_warnings(), quiet_lightning():
                warnings.filterwarnings("ignore", ".*does not have many workers.*")
                warnings.filterwarnings("ignore", ".*isinstance.treespec, LeafSpec.*")
                warnings.filterwarnings("ignore",
                                        ".*Checkpoint directory .* exists and is not empty.*")
                warnings.filterwarnings("ignore", ".*Total length of .* across ranks is zero.*")
                trainer.fit(module, datamodule=data, ckpt_path=ckpt, weights_only=True)
        except SystemExit:
            # Lightning ends with sys.exit(1) after a KeyboardInterrupt (here: a second
            # signal, which stops at once), and with its SIGTERMException (a signal during
            # its sanity-check validation, before training)
            if interrupt.signum is None:
                raise
            detail = " (sent twice: stop at once)" if interrupt.count > 1 else ""
            raise TrainingInterrupted(interrupt.signum, trainer.global_step, None,
                                      detail) from None
        finally:
            interrupt.restore()
        summary_path = os.path.join(out, "pretrain.json")
        if trainer.global_step == start_step and ckpt is not None and \
                os.path.exists(summary_path) and os.path.isdir(os.path.join(out, "predictor")):
            saved = read_json(summary_path, "delete it; it is rewritten by a run that trains")
            if isinstance(saved, dict) and saved.get("steps") == trainer.global_step:
                log(f"{ckpt} is already at train.max_steps ({t.max_steps}): nothing to train")
                return saved
            # (else the summary and predictor are from an earlier end: saved again below)
        seconds = time.time() - start
        size = dict(images=len(pixels)) if images else dict(tokens=data.windows.num_tokens,
                                                             vocabulary=len(vocab))
        summary = dict(steps=trainer.global_step, seconds=round(seconds, 1), **size,
                       train_loss=_metric(trainer, "train_loss"),
                       val_loss=_metric(trainer, "val_loss"))
        if found_vectors is not None:
            summary["init_vectors_found"] = round(found_vectors, 4)
        if trainer.is_global_zero:
            predictor = module.model.cpu().to_pretrained(
                vocab.tokens() if vocab else None,
                trained_length=None if images else c.max_length,
                trained_size=crop if images else None)
            if images and crop != full:  # trained on crops: the same weights at full size
                predictor = predictor.resized(*full)
            save_pretrained(predictor, os.path.join(out, "predictor"))
            write_json(summary_path, summary)
            log(f"done: {summary['steps']} steps in {seconds:.0f} s; predictor saved to "
                f"{os.path.join(out, 'predictor')}")
        return summary
    finally:
        torch.set_num_threads(threads)
