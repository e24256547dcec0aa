"""A pretraining corpus read by its format (``glomo pretrain``'s ``corpus.format``): the
documents of a text corpus or the images of an image corpus, each optionally thinned to
an even spread over the whole corpus."""
from __future__ import annotations

import os
from typing import Iterator, Optional, Tuple

import torch

from glomo_pyg.data.aclimdb import read_aclimdb
from glomo_pyg.data.text import read_text_documents

TEXT_FORMATS = ("text", "aclimdb")
IMAGE_FORMATS = ("cifar10", "imagenet32")


def _corpus_path(path: Optional[str], format: str, formats: Tuple[str, ...], kind: str,
                 where: str, limit_name: str, limit: Optional[int]) -> str:
    """``corpus.path`` (user-expanded), checked with ``corpus.format`` and the size limit."""
    if path is None or format not in formats or (limit is not None and limit < 1):
        raise ValueError(f"corpus.path is not set: {where}" if path is None else
                         f"{kind} corpus's format must be one of {formats}, got {format!r}"
                         if format not in formats else
                         f"corpus.{limit_name} must be >= 1, got {limit}")
    return os.path.expanduser(path)


def _all_documents(path: str, format: str, one_per_line: bool) -> Iterator[str]:
    if format == "aclimdb":
        # unlabelled and labelled training reviews; the test reviews stay unseen
        return (r.text for r in read_aclimdb(path, "train", ("unsup", "pos", "neg")))
    return read_text_documents(path, one_per_line=one_per_line)


def read_corpus_documents(path: Optional[str], format: str = "text", one_per_line: bool = False,
                          max_documents: Optional[int] = None) -> Iterator[str]:
    """The documents of the text corpus at ``path`` in ``format``; with ``max_documents``
    (M of N), those at positions ``floor(k * N / M)``, spread evenly over the corpus."""
    path = _corpus_path(path, format, TEXT_FORMATS, "a text",
                        "a text file or folder, or the aclImdb folder", "max_documents",
                        max_documents)
    if max_documents is None:
        yield from _all_documents(path, format, one_per_line)
        return
    total = sum(1 for _ in _all_documents(path, format, one_per_line))
    take = min(total, max_documents)
    wanted = {k * total // take for k in range(take)}
    for k, doc in enumerate(_all_documents(path, format, one_per_line)):
        if k in wanted:
            yield doc


def read_image_corpus(path: Optional[str], format: str,
                      max_images: Optional[int] = None) -> torch.Tensor:
    """The uint8 ``[n, C, H, W]`` training images of the image corpus at ``path``
    (``format`` ``'cifar10'`` or ``'imagenet32'``); an even spread of ``max_images``."""
    from glomo_pyg.data.images import load_cifar10, load_imagenet32

    path = _corpus_path(path, format, IMAGE_FORMATS, "an image",
                        "the cifar-10-batches-py or imagenet32 folder", "max_images", max_images)
    images = load_cifar10(path, "train")[0] if format == "cifar10" else load_imagenet32(path)[0]
    if max_images is not None and max_images < len(images):
        images = images[torch.arange(max_images) * len(images) // max_images]
    return images
