"""Lightning data modules of pretraining (token shards or images), with seeded splits."""
from __future__ import annotations

import warnings
from typing import List, Optional, Tuple, Union

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
                      "larger corpus)", RuntimeWarning, stacklevel=3)  # (setup's caller)
    if n_val > count - n_val:
        warnings.warn(f"corpus.validation_fraction {validation_fraction} keeps only "
                      f"{count - n_val} of {count} {unit} for training", RuntimeWarning,
                      stacklevel=3)
    return order[:n_val], sorted(order[n_val:])


# what a data module's setup opens: token windows, or images as pixel units
Units = Union[TokenWindows, "ImageUnits"]


class TextPretrainingData(pl.LightningDataModule):
    """Training and validation sequences from token shards, resumable and split by rank.

    Lightning's contract: the constructor only records its arguments; :meth:`setup` opens
    the shards (memory-mapped) and draws the seeded split, once per process. The shards
    are made beforehand (``glomo pretrain --prepare-only``, or
    :func:`~glomo_pyg.training.pretrain.prepare_corpus`): there is nothing to download or
    build in :meth:`prepare_data`.

    Args:
        shards (str): the token shards' folder (``<output_dir>/tokens`` of a run).
        max_length (int): the longest training sequence (tokens).
        min_length (int): the shortest one.
        batch_size (int): sequences per batch.
        validation_fraction (float): share of the sequences held out for validation.
        seed (int): the seed of the split and of the training order.
        num_workers (int): data-loader worker processes. (default: :obj:`0`)
    """

    unit = "sequences"  # (what the split's warnings count)

    def __init__(self, shards: str, max_length: int, min_length: int, batch_size: int,
                 validation_fraction: float, seed: int, num_workers: int = 0):
        super().__init__()
        self.shards, self.max_length, self.min_length = shards, max_length, min_length
        self._record(batch_size, validation_fraction, seed, num_workers)

    def _record(self, batch_size: int, validation_fraction: float, seed: int,
                num_workers: int) -> None:
        self.batch_size, self.seed, self.num_workers = batch_size, seed, num_workers
        self.validation_fraction = validation_fraction
        self._workers = dict(worker_init_fn=_ignore_interrupts) if num_workers else {}
        self._opened: Optional[Tuple[Units, List[int], List[int]]] = None  # (by setup)

    def _open(self) -> Units:
        windows = TokenWindows.from_shards(self.shards, self.max_length, self.min_length)
        if len(windows) < 2:
            raise ValueError(f"{self.shards}: fewer than 2 training sequences of >= "
                             f"{self.min_length} tokens; use a larger corpus or a smaller "
                             "corpus.min_length")
        return windows

    def setup(self, stage: Optional[str] = None) -> None:
        """Open the data and draw the seeded split (once: a later call keeps them, so that
        a caller may set up early to check the data and count it)."""
        if self._opened is None:
            windows = self._open()
            self._opened = (windows, *_split(len(windows), self.validation_fraction,
                                             self.seed, self.unit))

    def _setup_done(self) -> Tuple[Units, List[int], List[int]]:
        if self._opened is None:  # (not an empty split: a caller would not notice)
            raise RuntimeError(f"{type(self).__name__}.setup() has not run yet: the data "
                               "and its split are read there, not in the constructor")
        return self._opened

    @property
    def windows(self) -> Units:
        """The training units (token windows, or images), once :meth:`setup` ran."""
        return self._setup_done()[0]

    @property
    def val_ids(self) -> List[int]:
        """The validation units' indices (seeded), once :meth:`setup` ran."""
        return self._setup_done()[1]

    @property
    def train_ids(self) -> List[int]:
        """The training units' indices (sorted), once :meth:`setup` ran."""
        return self._setup_done()[2]

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
    """Training and validation images (a seeded split, drawn in :meth:`setup`), batched as
    pixel units."""

    unit = "images"

    def __init__(self, images: torch.Tensor, batch_size: int, validation_fraction: float,
                 seed: int, num_workers: int = 0):
        pl.LightningDataModule.__init__(self)
        self.images = images
        self._record(batch_size, validation_fraction, seed, num_workers)

    def _open(self) -> Units:
        return ImageUnits(self.images)
