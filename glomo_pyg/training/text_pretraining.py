"""``glomo pretrain``: GLoMo pretraining on a real text corpus or image set with Lightning.

One configuration (YAML file and/or command-line overrides, :class:`PretrainConfig`)
drives the whole run:

1. **Corpus** (once per output folder): documents are read (a text file or folder, or
   the aclImdb layout), tokenised (:func:`~glomo_pyg.data.tokenize`), a vocabulary is
   built (``min_count``/``max_size``) and the corpus is written as memory-mapped token
   shards (``<output>/tokens``). Later runs and resumed runs reuse them.
2. **Training**: :class:`~glomo_pyg.training.GlomoPretraining` under a Lightning
   ``Trainer`` (progress bar, bf16 autocast on GPU, DDP over devices and nodes through
   Lightning's own strategy), CSV or TensorBoard logs with graph statistics
   (:class:`~glomo_pyg.training.GraphStatistics`), periodic and final checkpoints
   (``<output>/checkpoints``; Lightning writes them atomically). ``resume=True``
   continues from ``last.ckpt`` exactly where it stopped: weights, optimiser, schedule,
   step, random state, and the position inside the epoch's data order. Checkpoints are
   loaded with ``weights_only=True`` (nothing unpickled).
3. **Result**: the pretrained graph predictor with its vocabulary,
   ``save_pretrained(<output>/predictor)``.

Images (``corpus.format: cifar10`` or ``imagenet32``, paper Sec. 3.5) skip step 1: the
uint8 images are read from their pickle batches (:mod:`glomo_pyg.data.images`, never
unpickling anything but plain data) and every image is one sequence of pixel units;
``model`` then holds the options of :meth:`Glomo.image <glomo_pyg.Glomo.image>`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional

import lightning.pytorch as pl
import numpy as np
import torch

from glomo_pyg.data.aclimdb import read_aclimdb
from glomo_pyg.data.text import WordVocabulary, read_text_documents, tokenize
from glomo_pyg.data.tokens import (ResumableLoader, ResumableSampler, TokenWindows,
                                   read_shard_index, write_token_shards)
from glomo_pyg.training.graph_statistics import GraphStatistics
from glomo_pyg.training.pretraining import GlomoPretraining
from glomo_pyg.training.utils import quiet_lightning

TEXT_FORMATS = ("text", "aclimdb")
IMAGE_FORMATS = ("cifar10", "imagenet32")
CORPUS_FORMATS = TEXT_FORMATS + IMAGE_FORMATS
LOGGERS = ("csv", "tensorboard")


@dataclass
class CorpusConfig:
    """Where the documents come from and how they become training sequences."""

    path: Optional[str] = None  # text file or folder, the aclImdb folder, or an image folder
    # 'text', 'aclimdb' (train/unsup + train/{pos,neg}, no test), or images: 'cifar10'
    # (cifar-10-batches-py, training batches) or 'imagenet32' (Downsampled-ImageNet batches)
    format: str = "text"
    one_per_line: bool = False  # text: one document per line instead of per file
    lower: bool = True
    min_count: int = 3
    max_size: Optional[int] = 30000
    max_length: int = 128
    min_length: int = 8
    max_documents: Optional[int] = None  # an even spread of this many documents (reduced runs)
    validation_fraction: float = 0.01
    shard_tokens: int = 1 << 26
    max_images: Optional[int] = None  # images: an even spread of this many (reduced runs)
    flip: bool = True  # images: random horizontal flips while training
    # images: pretrain on random crops of this side (the predictor, convolutional and with
    # offset-only position terms, is saved for the full image size); cheaper per image
    crop: Optional[int] = None


@dataclass
class TrainConfig:
    """Optimisation and the Lightning trainer."""

    batch_size: int = 32
    max_steps: int = 10000
    lr: float = 1e-3
    graph_lr_scale: float = 1.0
    graph_warmup_steps: int = 500
    weight_decay: float = 0.0
    optimizer: str = "adam"  # or 'sgd' (the reference code: lr 8, momentum 0.2, clip 0.25)
    momentum: float = 0.0  # SGD only
    grad_clip: float = 1.0
    seed: int = 0
    accelerator: str = "auto"
    devices: Any = "auto"
    num_nodes: int = 1
    strategy: str = "auto"  # 'ddp' for several devices or nodes
    precision: Optional[str] = None  # default: 'bf16-mixed' on GPU, '32-true' on CPU
    num_workers: int = 0
    threads: int = 0  # torch CPU threads (0: torch's default); set to the cores you really have
    checkpoint_every: int = 1000
    validate_every: int = 1000
    log_every: int = 50
    graph_stats_every: int = 200
    logger: str = "csv"
    progress_bar: bool = True
    # optional syntax monitoring: a CoNLL-U/CoNLL-X file (not the split you report on)
    syntax_treebank: Optional[str] = None
    syntax_sentences: int = 500
    syntax_every: int = 500


IMAGE_MODEL_DEFAULTS = dict(hidden_channels=128, num_layers=3, heads=8, cnn_layers=3,
                            num_positions=64)


@dataclass
class PretrainConfig:
    output_dir: str = "runs/pretrain"
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    model: Dict[str, Any] = field(default_factory=lambda: dict(
        hidden_channels=256, num_layers=3, heads=8, cnn_layers=4, context_length=3,
        num_positions=20))
    train: TrainConfig = field(default_factory=TrainConfig)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "PretrainConfig":
        data = dict(data or {})
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown configuration keys {sorted(unknown)}; expected "
                             "output_dir, corpus, model, train")
        out = cls()
        if "output_dir" in data:
            out.output_dir = str(data["output_dir"])
        for name, kind in (("corpus", CorpusConfig), ("train", TrainConfig)):
            section = data.get(name) or {}
            allowed = {f.name for f in dataclasses.fields(kind)}
            bad = set(section) - allowed
            if bad:
                raise ValueError(f"unknown {name} settings {sorted(bad)}; allowed: "
                                 f"{sorted(allowed)}")
            setattr(out, name, dataclasses.replace(getattr(out, name), **section))
        if out.corpus.format in IMAGE_FORMATS:  # Glomo.image's options, not the text ones
            out.model = dict(IMAGE_MODEL_DEFAULTS)
        if "model" in data:
            out.model = dict(out.model, **(data["model"] or {}))
        out.validate()
        return out

    def validate(self) -> None:
        c, t = self.corpus, self.train
        if c.format not in CORPUS_FORMATS:
            raise ValueError(f"corpus.format must be one of {CORPUS_FORMATS}, got {c.format!r}")
        if t.logger not in LOGGERS:
            raise ValueError(f"train.logger must be one of {LOGGERS}, got {t.logger!r}")
        if not 0 <= c.validation_fraction < 1:
            raise ValueError("corpus.validation_fraction must lie in [0, 1)")
        for name in ("batch_size", "max_steps", "checkpoint_every", "validate_every",
                     "log_every", "graph_stats_every", "syntax_sentences", "syntax_every"):
            if getattr(t, name) < 1:
                raise ValueError(f"train.{name} must be >= 1")
        if t.threads < 0:
            raise ValueError("train.threads must be >= 0 (0: torch's default)")
        if c.format in IMAGE_FORMATS:
            for key in ("height", "width", "in_channels", "num_tokens", "modality"):
                if key in self.model:
                    raise ValueError(f"model.{key} is set from the images; remove it")
            if c.max_images is not None and c.max_images < 2:
                raise ValueError("corpus.max_images must be >= 2")
            if c.crop is not None and c.crop < 2:
                raise ValueError("corpus.crop must be >= 2 (pixels per side)")
            return
        for key in ("num_tokens", "padding_idx"):
            if key in self.model:
                raise ValueError(f"model.{key} is set from the vocabulary; remove it")

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def set_by_path(data: Dict[str, Any], dotted: str, value: Any) -> None:
    """``set_by_path(cfg, 'train.lr', 0.01)``: a command-line override of a nested key."""
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ValueError(f"{dotted}: {key} is not a section")
    node[keys[-1]] = value


# --- corpus ------------------------------------------------------------------------------
def _all_documents(corpus: CorpusConfig) -> Iterator[str]:
    if corpus.path is None:
        raise ValueError("corpus.path is not set: a text file or folder, or the aclImdb folder")
    path = os.path.expanduser(corpus.path)
    if corpus.format == "aclimdb":
        # unlabelled and labelled training reviews; the test reviews stay unseen
        return (r.text for r in read_aclimdb(path, "train", ("unsup", "pos", "neg")))
    return read_text_documents(path, one_per_line=corpus.one_per_line)


def iter_documents(corpus: CorpusConfig) -> Iterator[str]:
    """The corpus's documents; with ``max_documents`` (= M of N), the documents at
    positions ``floor(k * N / M)``, spread evenly over the whole corpus (so a reduced
    aclImdb run sees unlabelled, positive and negative reviews in their proportions,
    not just the first folder)."""
    if corpus.max_documents is None:
        yield from _all_documents(corpus)
        return
    if corpus.max_documents < 1:
        raise ValueError(f"corpus.max_documents must be >= 1, got {corpus.max_documents}")
    total = sum(1 for _ in _all_documents(corpus))
    take = min(total, corpus.max_documents)
    wanted = iter([k * total // take for k in range(take)])
    nxt = next(wanted, None)
    for k, doc in enumerate(_all_documents(corpus)):
        if k == nxt:
            yield doc
            nxt = next(wanted, None)
            if nxt is None:
                return


def prepare_corpus(corpus: CorpusConfig, folder: str, log=print):
    """Vocabulary and token shards in ``folder`` (built once: two passes over the
    documents, counting then encoding; reused when present and built from the same
    corpus settings)."""
    os.makedirs(folder, exist_ok=True)
    vocab_path, shards, meta_path = (os.path.join(folder, "vocabulary.json"),
                                     os.path.join(folder, "tokens"),
                                     os.path.join(folder, "corpus.json"))
    settings = {k: v for k, v in dataclasses.asdict(corpus).items()
                if k not in ("max_length", "min_length", "validation_fraction")}
    if os.path.exists(meta_path) and os.path.exists(vocab_path) and os.path.isdir(shards):
        with open(meta_path) as fh:
            built = json.load(fh)
        if built.get("settings") != settings:
            raise ValueError(f"{folder} holds a corpus built with other settings "
                             f"({built.get('settings')}); use another output_dir")
        read_shard_index(shards)
        return WordVocabulary.load(vocab_path), shards
    start = time.time()
    counts: Counter = Counter()
    num_docs = 0
    for doc in iter_documents(corpus):
        counts.update(tokenize(doc, corpus.lower))
        num_docs += 1
    if not num_docs:
        raise ValueError(f"{corpus.path}: no documents")
    vocab = WordVocabulary.build(counts, corpus.min_count, corpus.max_size)
    log(f"corpus: {num_docs} documents, {sum(counts.values())} tokens, {len(counts)} distinct; "
        f"vocabulary {len(vocab)} (min_count {corpus.min_count}, max_size {corpus.max_size})")
    if os.path.isdir(shards):
        import shutil
        shutil.rmtree(shards)  # left by an interrupted preparation (no corpus.json yet)
    index = write_token_shards((vocab.encode(tokenize(d, corpus.lower)).numpy()
                                for d in iter_documents(corpus)),
                               shards, len(vocab), corpus.shard_tokens)
    vocab.save(vocab_path)
    unknown = sum(c for w, c in counts.items() if w not in vocab)
    meta = dict(settings=settings, documents=num_docs, tokens=index["num_tokens"],
                unknown_fraction=unknown / max(1, sum(counts.values())),
                seconds=round(time.time() - start, 1))
    tmp = meta_path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(meta, fh, indent=1)
    os.replace(tmp, meta_path)  # written last: marks the corpus complete
    log(f"token shards: {index['num_tokens']} tokens in {len(index['shards'])} shard(s), "
        f"{meta['unknown_fraction']:.2%} unknown, {meta['seconds']} s")
    return vocab, shards


class TextPretrainingData(pl.LightningDataModule):
    """Training and validation sequences from token shards; the training loader is a
    :class:`~glomo_pyg.data.ResumableLoader` split across the trainer's ranks."""

    def __init__(self, shards: str, max_length: int, min_length: int, batch_size: int,
                 validation_fraction: float, seed: int, num_workers: int = 0):
        super().__init__()
        self.windows = TokenWindows.from_shards(shards, max_length, min_length)
        if len(self.windows) < 2:
            raise ValueError(f"{shards}: fewer than 2 training sequences of >= {min_length} "
                             "tokens; use a larger corpus or a smaller corpus.min_length")
        gen = torch.Generator().manual_seed(seed)
        order = torch.randperm(len(self.windows), generator=gen).tolist()
        n_val = int(len(order) * validation_fraction)
        self.val_ids, self.train_ids = order[:n_val], sorted(order[n_val:])
        self.batch_size, self.seed, self.num_workers = batch_size, seed, num_workers

    def train_dataloader(self):
        world = self.trainer.world_size if self.trainer is not None else 1
        rank = self.trainer.global_rank if self.trainer is not None else 0
        data = torch.utils.data.Subset(self.windows, self.train_ids)
        sampler = ResumableSampler(len(data), shuffle=True, seed=self.seed,
                                   num_replicas=world, rank=rank)
        return ResumableLoader(data, self.batch_size, sampler, num_workers=self.num_workers)

    def val_dataloader(self):
        from torch_geometric.loader import DataLoader

        if not self.val_ids:
            return []
        return DataLoader(torch.utils.data.Subset(self.windows, self.val_ids),
                          batch_size=self.batch_size, num_workers=self.num_workers,
                          generator=torch.Generator().manual_seed(self.seed))


def load_pretraining_images(corpus: CorpusConfig) -> torch.Tensor:
    """The uint8 ``[n, C, H, W]`` training images of an image corpus (labels unused),
    an even spread of ``max_images`` of them when set."""
    from glomo_pyg.data.images import load_cifar10, load_imagenet32

    if corpus.path is None:
        raise ValueError("corpus.path is not set: the cifar-10-batches-py or imagenet32 folder")
    path = os.path.expanduser(corpus.path)
    images = load_cifar10(path, "train")[0] if corpus.format == "cifar10" else \
        load_imagenet32(path)[0]
    if corpus.max_images is not None and corpus.max_images < len(images):
        take = corpus.max_images
        images = images[torch.arange(take) * len(images) // take]
    return images


class ImageUnits(torch.utils.data.Dataset):
    """Each image as a PyG ``Data`` whose ``x`` is its ``[H W, C]`` uint8 pixel units."""

    def __init__(self, images: torch.Tensor):
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        from torch_geometric.data import Data

        img = self.images[i]
        return Data(x=img.permute(1, 2, 0).reshape(-1, img.size(0)))


class ImagePretrainingData(TextPretrainingData):
    """Training and validation images (a seeded split), batched as pixel units."""

    def __init__(self, images: torch.Tensor, batch_size: int, validation_fraction: float,
                 seed: int, num_workers: int = 0):
        pl.LightningDataModule.__init__(self)
        self.windows = ImageUnits(images)
        gen = torch.Generator().manual_seed(seed)
        order = torch.randperm(len(images), generator=gen).tolist()
        n_val = int(len(order) * validation_fraction)
        self.val_ids, self.train_ids = order[:n_val], sorted(order[n_val:])
        self.batch_size, self.seed, self.num_workers = batch_size, seed, num_workers


class _RandomState(pl.Callback):
    """Saves and restores every random generator training uses (Python, NumPy, torch CPU
    and CUDA) in the checkpoint, so a resumed run draws the same positions."""

    def state_dict(self) -> Dict[str, Any]:
        state = dict(python=list(random.getstate()[1]), python_version=random.getstate()[0],
                     python_gauss=random.getstate()[2], numpy=np.random.get_state()[1].tolist(),
                     numpy_pos=int(np.random.get_state()[2]), torch=torch.get_rng_state())
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        random.setstate((state["python_version"], tuple(state["python"]), state["python_gauss"]))
        np.random.set_state(("MT19937", np.asarray(state["numpy"], dtype=np.uint32),
                             state["numpy_pos"], 0, 0.0))
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


def _precision(train: TrainConfig) -> str:
    if train.precision:
        return train.precision
    gpu = train.accelerator in ("gpu", "cuda") or (train.accelerator == "auto" and
                                                   torch.cuda.is_available())
    return "bf16-mixed" if gpu else "32-true"


def build_trainer(config: PretrainConfig, extra_callbacks: Optional[List[pl.Callback]] = None
                  ) -> pl.Trainer:
    from lightning.pytorch.callbacks import ModelCheckpoint

    t = config.train
    checkpoints = ModelCheckpoint(dirpath=os.path.join(config.output_dir, "checkpoints"),
                                  filename="step{step}", auto_insert_metric_name=False,
                                  every_n_train_steps=t.checkpoint_every, save_top_k=-1,
                                  save_last=True)
    if t.logger == "tensorboard":
        from lightning.pytorch.loggers import TensorBoardLogger
        logger = TensorBoardLogger(config.output_dir, name="logs")
    else:
        from lightning.pytorch.loggers import CSVLogger
        logger = CSVLogger(config.output_dir, name="logs")
    callbacks = [checkpoints, GraphStatistics(t.graph_stats_every), _RandomState(),
                 *(extra_callbacks or [])]
    return pl.Trainer(max_steps=t.max_steps, accelerator=t.accelerator, devices=t.devices,
                      num_nodes=t.num_nodes, strategy=t.strategy, precision=_precision(t),
                      gradient_clip_val=t.grad_clip or None, logger=logger, callbacks=callbacks,
                      log_every_n_steps=t.log_every, val_check_interval=t.validate_every,
                      check_val_every_n_epoch=None, enable_progress_bar=t.progress_bar,
                      enable_model_summary=False, use_distributed_sampler=False,
                      default_root_dir=config.output_dir)


def last_checkpoint(output_dir: str) -> Optional[str]:
    path = os.path.join(output_dir, "checkpoints", "last.ckpt")
    return path if os.path.exists(path) else None


def _is_launcher_child() -> bool:
    """True in the processes Lightning's DDP launcher starts besides the first (they run
    this same command again)."""
    return int(os.environ.get("LOCAL_RANK", 0)) > 0 or int(os.environ.get("NODE_RANK", 0)) > 0


def run_pretraining(config: PretrainConfig, resume: bool = False,
                    extra_callbacks: Optional[List[pl.Callback]] = None, log=print,
                    prepare_only: bool = False) -> Dict[str, Any]:
    """Prepare the corpus, train, and save the predictor. Returns a summary (also written
    to ``<output>/pretrain.json``). ``prepare_only`` stops after the corpus (tokens and
    vocabulary): do that once before a multi-node run whose nodes share the folder."""
    from glomo_pyg.io.pretrained import save_pretrained

    config.validate()
    if _is_launcher_child():
        log = lambda *args, **kwargs: None  # noqa: E731 (the first process reports)
    out = config.output_dir
    os.makedirs(out, exist_ok=True)
    ckpt = last_checkpoint(out) if resume else None
    if resume and ckpt is None:
        log(f"--resume: no checkpoint in {out}/checkpoints yet; starting from scratch")
    if not resume and last_checkpoint(out) is not None and not _is_launcher_child():
        raise FileExistsError(f"{out} already holds a run (checkpoints/last.ckpt); pass "
                              "--resume to continue it or choose another output_dir")
    saved_config = os.path.join(out, "config.json")
    if ckpt is not None and os.path.exists(saved_config):
        with open(saved_config) as fh:
            before = json.load(fh)
        changed = [k for k in ("model", "corpus") if before.get(k) != config.to_dict()[k]]
        if changed:
            raise ValueError(f"{out}: the checkpoint was trained with other {' and '.join(changed)} "
                             f"settings ({saved_config}); resume with the same ones (only "
                             "train settings such as max_steps may change)")
    if not _is_launcher_child():
        with open(saved_config + ".tmp", "w") as fh:
            json.dump(config.to_dict(), fh, indent=1)
        os.replace(saved_config + ".tmp", saved_config)
    c, t = config.corpus, config.train
    images = c.format in IMAGE_FORMATS
    if images:
        vocab, pixels = None, load_pretraining_images(c)
        log(f"images: {len(pixels)} of {tuple(pixels.shape[1:])} from {c.path}")
        if prepare_only:
            return dict(images=len(pixels))
    else:
        vocab, shards = prepare_corpus(config.corpus, out, log)
        if prepare_only:
            return dict(vocabulary=len(vocab), tokens=read_shard_index(shards)["num_tokens"])
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
        extra_callbacks = list(extra_callbacks or [])
        if t.syntax_treebank and not images:
            from glomo_pyg.analysis.treebank import read_treebank
            from glomo_pyg.training.syntax_monitor import SyntaxMonitor

            trees = read_treebank(os.path.expanduser(t.syntax_treebank),
                                  max_sentences=t.syntax_sentences)
            extra_callbacks.append(SyntaxMonitor(trees, vocab.tokens(), t.syntax_every,
                                                 lower=c.lower))
        with quiet_lightning():
            trainer = build_trainer(config, extra_callbacks)
        log(f"trainer: {type(trainer.accelerator).__name__}, {trainer.num_devices} device(s) x "
            f"{trainer.num_nodes} node(s), {type(trainer.strategy).__name__}, precision "
            f"{trainer.precision}")
        unit = "images" if images else f"sequences of <= {c.max_length} tokens"
        log(f"pretraining: {len(data.train_ids)} training / {len(data.val_ids)} validation "
            f"{unit}, {t.max_steps} steps of {t.batch_size}"
            + (f", resuming from {ckpt}" if ckpt else ""))
        start = time.time()
        with warnings.catch_warnings(), quiet_lightning():
            warnings.filterwarnings("ignore", ".*does not have many workers.*")
            warnings.filterwarnings("ignore", ".*isinstance.treespec, LeafSpec.*")
            warnings.filterwarnings("ignore", ".*Checkpoint directory .* exists and is not empty.*")
            warnings.filterwarnings("ignore", ".*Total length of .* across ranks is zero.*")
            trainer.fit(module, datamodule=data, ckpt_path=ckpt, weights_only=True)
        seconds = time.time() - start
        size = dict(images=len(pixels)) if images else dict(tokens=data.windows.num_tokens,
                                                             vocabulary=len(vocab))
        summary = dict(steps=trainer.global_step, seconds=round(seconds, 1), **size,
                       train_loss=float(trainer.callback_metrics.get("train_loss", float("nan"))),
                       val_loss=float(trainer.callback_metrics.get("val_loss", float("nan"))))
        if trainer.is_global_zero:
            predictor = module.model.cpu().to_pretrained(vocab.tokens() if vocab else None)
            if images and crop != full:  # trained on crops: the same weights at full size
                predictor = predictor.resized(*full)
            save_pretrained(predictor, os.path.join(out, "predictor"))
            with open(os.path.join(out, "pretrain.json"), "w") as fh:
                json.dump(summary, fh, indent=1)
            log(f"done: {summary['steps']} steps in {seconds:.0f} s; predictor saved to "
                f"{os.path.join(out, 'predictor')}")
        return summary
    finally:
        torch.set_num_threads(threads)
