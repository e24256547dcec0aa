"""The one tokenizer of text (``glomo pretrain``'s vocabularies, ``encode(text,
tokenize=True)``, the viewer): no dependency, so that every layer may use it."""
from __future__ import annotations

import re
import unicodedata
from typing import List

_BREAK = re.compile(r"<br\s*/?\s*>", re.IGNORECASE)
_TOKEN = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*|([^\w\s])\1*|_+", re.UNICODE)


def tokenize(text: str, lower: bool = True) -> List[str]:
    """Split ``text`` into word-level tokens: ``<br>`` tags as spaces, NFKC, lower-cased
    (``lower``), words with inner apostrophes or hyphens, and every other non-space
    character on its own (a run of one punctuation character as one token)."""
    text = unicodedata.normalize("NFKC", _BREAK.sub(" ", text))
    if lower:
        text = text.lower()
    # (group 1: a punctuation run, kept as one character)
    return [m.group(1) or m.group(0) for m in _TOKEN.finditer(text)]
