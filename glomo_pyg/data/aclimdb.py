"""Reader for the official Large Movie Review Dataset layout (``aclImdb/``, Maas et al.
2011): ``{train,test}/{pos,neg}`` labelled reviews and ``train/unsup`` unlabelled ones,
one review per file named ``<id>_<rating>.txt``."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Sequence

SPLITS = ("train", "test")
KINDS = ("pos", "neg", "unsup")
LABELS = {"pos": 1, "neg": 0, "unsup": -1}


@dataclass(frozen=True)
class Review:
    """One review: its text, label (1 positive, 0 negative, -1 unlabelled), star rating
    (1-10; 0 for unlabelled reviews) and file id."""

    text: str
    label: int
    rating: int
    id: int
    path: str


def _parse_name(name: str, folder: str):
    stem = name[:-4]
    try:
        review_id, rating = stem.split("_")
        return int(review_id), int(rating)
    except ValueError:
        raise ValueError(f"{os.path.join(folder, name)}: not an aclImdb review file name "
                         "(<id>_<rating>.txt)") from None


def read_aclimdb(root: str, split: str = "train", kinds: Sequence[str] = ("pos", "neg")
                 ) -> List[Review]:
    """Reviews of ``split`` (``'train'`` or ``'test'``) of the kinds asked for, in a fixed
    order (kind as given, then file id). ``root`` is the ``aclImdb`` folder (or its parent).
    ``'unsup'`` exists only in ``train`` (50,000 unlabelled reviews)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"kinds must be among {KINDS}, got {bad}")
    if split == "test" and "unsup" in kinds:
        raise ValueError("aclImdb has unlabelled reviews only in train/unsup")
    if not os.path.isdir(os.path.join(root, split)) and \
            os.path.isdir(os.path.join(root, "aclImdb", split)):
        root = os.path.join(root, "aclImdb")
    reviews = []
    for kind in kinds:
        folder = os.path.join(root, split, kind)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"{folder}: missing; expected the official aclImdb layout "
                                    f"({root}/{{train,test}}/{{pos,neg}}, train/unsup)")
        entries = []
        for name in os.listdir(folder):
            if name.endswith(".txt"):
                review_id, rating = _parse_name(name, folder)
                entries.append((review_id, rating, name))
        for review_id, rating, name in sorted(entries):
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8", errors="replace") as fh:
                reviews.append(Review(fh.read(), LABELS[kind], rating, review_id, path))
    return reviews
