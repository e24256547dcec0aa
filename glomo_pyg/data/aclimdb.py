"""Reader for the Large Movie Review Dataset layout (``aclImdb/``, Maas et al. 2011;
docs/text.md); a file that breaks it raises a :class:`~glomo_pyg.data.TextDataError`."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import List, Sequence

from glomo_pyg.data.text import TextDataError, read_document

SPLITS = ("train", "test")
KINDS = ("pos", "neg", "unsup")
LABELS = {"pos": 1, "neg": 0, "unsup": -1}
RATINGS = {"pos": range(7, 11), "neg": range(1, 5), "unsup": range(0, 1)}
_NAME = re.compile(r"([0-9]{1,18})_(-?[0-9]{1,18})\.txt")


@dataclass(frozen=True)
class Review:
    """One review: its text, label (1 positive, 0 negative, -1 unlabelled), star rating
    (1-10; 0 for unlabelled reviews) and file id."""

    text: str
    label: int
    rating: int
    id: int
    path: str


def _parse_name(name: str, folder: str, kind: str):
    match = _NAME.fullmatch(name)
    review_id, rating = (int(match[1]), int(match[2])) if match else (None, None)
    if rating not in RATINGS[kind]:
        problem = f"rating {rating} does not belong in {kind}/" if match else \
            "not an aclImdb review file name (<id>_<rating>.txt)"
        raise TextDataError(f"{os.path.join(folder, name)}: {problem} (pos: 7-10, neg: 1-4, "
                            "unsup: 0); move, rename or remove the file")
    return review_id, rating, name


def read_aclimdb(root: str, split: str = "train", kinds: Sequence[str] = ("pos", "neg")
                 ) -> List[Review]:
    """Reviews of ``split`` (``'train'`` or ``'test'``) of the kinds asked for, in a fixed
    order (kind as given, then file id). ``root`` is the ``aclImdb`` folder (or its parent);
    ``'unsup'`` exists only in ``train``."""
    if split not in SPLITS or any(k not in KINDS for k in kinds) or \
            (split == "test" and "unsup" in kinds):
        raise ValueError(f"need a split in {SPLITS} and kinds among {KINDS} (aclImdb has "
                         f"unlabelled reviews only in train/unsup), got split={split!r}, "
                         f"kinds={list(kinds)}")
    if not os.path.isdir(os.path.join(root, split)) and \
            os.path.isdir(os.path.join(root, "aclImdb", split)):
        root = os.path.join(root, "aclImdb")
    reviews = []
    for kind in kinds:
        folder = os.path.join(root, split, kind)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"{folder}: missing; expected the official aclImdb layout "
                                    f"({root}/{{train,test}}/{{pos,neg}}, train/unsup)")
        for review_id, rating, name in sorted(_parse_name(name, folder, kind) for name in
                                              os.listdir(folder) if name.endswith(".txt")):
            path = os.path.join(folder, name)
            reviews.append(Review(read_document(path), LABELS[kind], rating, review_id, path))
    return reviews
