"""Gold dependency trees from CoNLL-U and CoNLL-X files (docs/syntax.md), token IDs and
heads parsed by the ``conllu`` library's field parsers."""
from __future__ import annotations

import os
import unicodedata
from dataclasses import dataclass, field
from itertools import groupby
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

from glomo_pyg.data.text import TextDataError, binary_lines, decode_utf8
from glomo_pyg.extras import require
from glomo_pyg.io.paths import NotRegularFileError, open_regular_file
from glomo_pyg.settings import Rule, check_int

ParseException = require("conllu.exceptions", "Reading treebanks").ParseException
DEFAULT_FIELD_PARSERS = require("conllu.parser", "Reading treebanks").DEFAULT_FIELD_PARSERS

FORMATS = ("conllu", "conllx")
MAX_LINE_BYTES = 1 << 20  # a token line longer than this is not a treebank line


class TreebankFormatError(ValueError):
    """A treebank file that is not well-formed CoNLL-U / CoNLL-X (message names file and line)."""


@dataclass
class GoldTree:
    """One sentence: its syntactic words, their gold heads (``heads[k]``: the 1-based index
    of word ``k``'s head, ``0`` for the root) and tags (UPOS, or CoNLL-X's coarse tag)."""

    words: List[str]
    heads: List[int]
    tags: List[str]
    sent_id: str = ""
    line: int = 0  # line of the sentence's first token in the file
    punct: List[bool] = field(default_factory=list)

    def __post_init__(self):
        if not self.punct:
            self.punct = [is_punctuation(w, t) for w, t in zip(self.words, self.tags)]

    def __len__(self) -> int:
        return len(self.words)

    def arcs(self) -> List[Tuple[int, int]]:
        """``(head, dependent)`` pairs as 0-based word indices (the root arc left out)."""
        return [(h - 1, d) for d, h in enumerate(self.heads) if h > 0]


PUNCT_TAGS = frozenset({"PUNCT", ".", ",", ":", "``", "''", "-LRB-", "-RRB-", "#", "$",
                        "$,", "$.", "$("})  # UPOS, Penn, STTS


def is_punctuation(form: str, tag: str) -> bool:
    """A punctuation tag (UPOS ``PUNCT``, Penn or STTS), or a form made only of Unicode
    punctuation characters, as the CoNLL-X shared task's evaluation script decides; a
    form of just ``_`` is withheld, not punctuation."""
    if tag in PUNCT_TAGS:
        return True
    return bool(form) and form != "_" and \
        all(unicodedata.category(c).startswith("P") for c in form)


def _text_lines(path: str) -> Iterator[Tuple[int, str]]:
    """``(line number, text)`` of the regular file ``path``, read as UTF-8 by line."""
    try:
        with open_regular_file(path, "rb", "treebank") as fh:
            for number, offset, data in binary_lines(fh, path, MAX_LINE_BYTES):
                yield number, decode_utf8(data, path, number, offset)
    except (TextDataError, NotRegularFileError) as err:
        raise TreebankFormatError(f"{path} is a directory, not a treebank file" if
                                  os.path.isdir(path) else str(err)) from None


def _parsed(columns: List[str], i: int, name: str):
    """Column ``i`` by the ``conllu`` parser of ``name`` ('id' or 'head'); None if invalid."""
    try:
        return DEFAULT_FIELD_PARSERS[name](columns, i)
    except (ParseException, ValueError):
        return None


def _blocks(lines: Iterable[Tuple[int, str]]) -> Iterator[List[Tuple[int, str]]]:
    """Sentence blocks of ``(line number, text)``; blank lines separate sentences."""
    stripped = ((number, text.rstrip("\r\n")) for number, text in lines)
    for filled, block in groupby(stripped, key=lambda line: bool(line[1].strip())):
        if filled:
            yield list(block)


def _check_tree(path: str, heads: List, raw: List[str], lines: List[int]) -> None:
    """Every head an integer in ``[0, n]`` other than the word itself, and no cycle."""
    n = len(heads)
    for k, h in enumerate(heads):
        if not isinstance(h, int) or not 0 <= h <= n or h == k + 1:
            what = "not an integer" if not isinstance(h, int) else \
                "its own head" if h == k + 1 else "out of range"
            raise TreebankFormatError(f"{path}:{lines[k]}: head {raw[k]!r} of word {k + 1} is "
                                      f"{what}: expected an integer in [0, {n}], not the word")
    reaches_root = [False] * n  # following heads from every word must end at 0
    for start in range(n):
        trail: Dict[int, int]
        trail, k = {}, start  # word: its position on the trail
        while k >= 0 and not reaches_root[k]:
            if k in trail:
                cycle = sorted(w + 1 for w in list(trail)[trail[k]:])
                raise TreebankFormatError(f"{path}:{lines[k]}: the heads form a cycle through "
                                          f"words {cycle}" + ("" if 0 in heads else " (the "
                                                              "sentence has no root, no head 0)"))
            trail[k] = len(trail)
            k = heads[k] - 1
        for w in trail:
            reaches_root[w] = True


def read_treebank(path: str, format: Optional[str] = None,
                  max_sentences: Optional[int] = None) -> List[GoldTree]:
    """Gold trees of a CoNLL-U (``format='conllu'``) or CoNLL-X (``'conllx'``) file (by
    default by the extension: ``.conll``/``.conllx`` are CoNLL-X). The words are the
    syntactic words ``1..n`` (ranges and empty nodes skipped); columns are tab-separated.

    Raises:
        TreebankFormatError: naming the file and line: text that is not UTF-8, a line over
            :data:`MAX_LINE_BYTES` bytes, a wrong column count, a word id out of order, a
            head that is not an integer, out of range or the word itself, a cycle, a
            sentence without a root; or ``path`` is a directory.
    """
    if format is None:
        format = "conllx" if path.lower().endswith((".conll", ".conllx")) else "conllu"
    Rule(str, choices=FORMATS).check("format", format)
    check_int("max_sentences", max_sentences, optional=True)
    trees: List[GoldTree] = []
    for block in _blocks(_text_lines(path)):
        words: List[str]
        words, heads, raw, tags, numbers, sent_id = [], [], [], [], [], ""
        for number, text in block:
            if text.startswith("#"):
                key, _, value = text[1:].partition("=")
                if key.strip() == "sent_id":
                    sent_id = value.strip()
                continue
            columns = text.split("\t")
            if len(columns) != 10:
                raise TreebankFormatError(f"{path}:{number}: expected 10 tab-separated columns "
                                          f"({format}), found {len(columns)}")
            tid = _parsed(columns, 0, "id")
            if isinstance(tid, tuple) and len(tid) == 3 and tid[1] in ("-", "."):
                continue  # a (1, '-', 2) range or an (8, '.', 1) empty node
            if tid != len(words) + 1:
                raise TreebankFormatError(f"{path}:{number}: word id {columns[0]!r} out of "
                                          f"order or not a word id (expected {len(words) + 1})")
            words.append(columns[1])
            heads.append(_parsed(columns, 6, "head"))
            raw.append(columns[6])
            tags.append("" if columns[3] == "_" else columns[3])  # UPOS or CoNLL-X CPOSTAG
            numbers.append(number)
        if not words:
            continue  # a block of comments only
        _check_tree(path, heads, raw, numbers)
        trees.append(GoldTree(words, heads, tags,
                              sent_id or f"{os.path.basename(path)}:{block[0][0]}", numbers[0]))
        if max_sentences is not None and len(trees) >= max_sentences:
            break
    return trees
