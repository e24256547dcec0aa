"""Lightning data modules of pretraining (token shards or images), with seeded splits."""
from __future__ import annotations

import warnings

import lightning.pytorch as pl
import torch

from glomo_pyg.data.corpora import read_image_corpus
from glomo_pyg.data.tokens import ResumableLoader, ResumableSampler, TokenWindows
from glomo_pyg.training.pretrain.config import CorpusConfig


def _ignore_interrupts(worker_id: int) -> None:
    """Data-loader workers leave Ctrl+C to the training process, which stops cleanly."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _split(count: int, validation_fraction: float, seed: int, unit: str):
    """A seeded (validation, sorted training) split of ``range(count)``."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = int(count * validation_fraction)
    if n_val == 0 and validation_fraction > 0:
        warnings.warn(f"corpus.validation_fraction {validation_fraction} of {count} {unit} "
                      "holds none: the run reports no validation loss; raise it (or use a "
                      "larger corpus)", RuntimeWarning, stacklevel=4)
    if n_val > count - n_val:
        warnings.warn(f"corpus.validation_fraction {validation_fraction} keeps only "
                      f"{count - n_val} of {count} {unit} for training", RuntimeWarning,
                      stacklevel=4)
    return order[:n_val], sorted(order[n_val:])


class TextPretrainingData(pl.LightningDataModule):
    """Training and validation sequences from token shards, resumable and split by rank."""

    def __init__(self, shards: str, max_length: int, min_length: int, batch_size: int,
                 validation_fraction: float, seed: int, num_workers: int = 0):
        windows = TokenWindows.from_shards(shards, max_length, min_length)
        if len(windows) < 2:
            raise ValueError(f"{shards}: fewer than 2 training sequences of >= {min_length} "
                             "tokens; use a larger corpus or a smaller corpus.min_length")
        self._setup(windows, "sequences", batch_size, validation_fraction, seed, num_workers)

    def _setup(self, windows, unit: str, batch_size: int, validation_fraction: float,
               seed: int, num_workers: int) -> None:
        pl.LightningDataModule.__init__(self)
        self.windows, self.batch_size, self.seed, self.num_workers = windows, batch_size, seed, \
            num_workers
        self.val_ids, self.train_ids = _split(len(windows), validation_fraction, seed, unit)
        self._workers = dict(worker_init_fn=_ignore_interrupts) if num_workers else {}

    def train_dataloader(self):
        world, rank = (self.trainer.world_size, self.trainer.global_rank) \
            if self.trainer is not None else (1, 0)
        data = torch.utils.data.Subset(self.windows, self.train_ids)
        sampler = ResumableSampler(len(data), shuffle=True, seed=self.seed,
                                   num_replicas=world, rank=rank)
        return ResumableLoader(data, self.batch_size, sampler, num_workers=self.num_workers,
                               **self._workers)

    def val_dataloader(self):
        from torch_geometric.loader import DataLoader

        if not self.val_ids:
            return []
        return DataLoader(torch.utils.data.Subset(self.windows, self.val_ids),
                          batch_size=self.batch_size, num_workers=self.num_workers,
                          generator=torch.Generator().manual_seed(self.seed), **self._workers)


def load_pretraining_images(corpus: CorpusConfig) -> torch.Tensor:
    """The uint8 ``[n, C, H, W]`` training images of an image corpus."""
    return read_image_corpus(corpus.path, corpus.format, corpus.max_images)


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
        self._setup(ImageUnits(images), "images", batch_size, validation_fraction, seed,
                    num_workers)
