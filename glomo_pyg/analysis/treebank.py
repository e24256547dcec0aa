"""Gold dependency trees from CoNLL-U and CoNLL-X files.

Token IDs and heads are parsed by the ``conllu`` library's field parsers; this module
adds what an evaluation needs on top of them: multiword-token ranges (``1-2``) and empty nodes (``8.1``) are
skipped, so a sentence is its sequence of syntactic words, and every structural fault
(wrong column count, a non-integer or out-of-range head, a cycle, no root) is reported
as a :class:`TreebankFormatError` naming the file and line.
"""
from __future__ import annotations

import os
import unicodedata
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from glomo_pyg.data.text import TextDataError, decode_utf8, binary_lines
from glomo_pyg.extras import require

ParseException = require("conllu.exceptions", "Reading treebanks").ParseException
DEFAULT_FIELD_PARSERS = require("conllu.parser", "Reading treebanks").DEFAULT_FIELD_PARSERS

FORMATS = ("conllu", "conllx")
MAX_LINE_BYTES = 1 << 20  # a token line longer than this is not a treebank line
# Columns of the two formats (both have ten; only the names of 4, 5, 9 and 10 differ).
CONLLU_FIELDS = ("id", "form", "lemma", "upos", "xpos", "feats", "head", "deprel", "deps", "misc")
CONLLX_FIELDS = ("id", "form", "lemma", "cpostag", "postag", "feats", "head", "deprel",
                 "phead", "pdeprel")


class TreebankFormatError(ValueError):
    """A treebank file that is not well-formed CoNLL-U / CoNLL-X (message names file and line)."""


@dataclass
class GoldTree:
    """One sentence: its syntactic words in order and their gold heads.

    ``heads[k]`` is the 1-based index of word ``k``'s head, ``0`` for the root.
    ``tags[k]`` is the UPOS tag (CoNLL-U) or the coarse tag (CoNLL-X).
    """

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
    punctuation characters, as the CoNLL-X shared task's evaluation script decides
    (so ``&`` and ``%`` count as punctuation whatever their tag). A form of just ``_`` is
    a withheld form, not punctuation."""
    if tag in PUNCT_TAGS:
        return True
    return bool(form) and form != "_" and \
        all(unicodedata.category(c).startswith("P") for c in form)


def _guess_format(path: str) -> str:
    return "conllx" if path.lower().endswith((".conll", ".conllx")) else "conllu"


def _text_lines(path: str) -> Iterator[Tuple[int, str]]:
    """``(line number, text)`` of each line of ``path``: UTF-8 (a leading byte-order mark
    dropped), read a line at a time, each at most :data:`MAX_LINE_BYTES` bytes."""
    try:
        with open(path, "rb") as fh:
            for number, offset, data in binary_lines(fh, path, MAX_LINE_BYTES):
                yield number, decode_utf8(data, path, number, offset)
    except (TextDataError, IsADirectoryError) as err:
        raise TreebankFormatError(f"{path} is a directory, not a treebank file" if
                                  isinstance(err, IsADirectoryError) else str(err)) from None


def _parse_columns(columns: List[str], fields: Sequence[str], where: str) -> Dict[str, object]:
    """ID and HEAD parsed by the ``conllu`` library's field parsers, FORM and the tag as
    they are, from already split columns (the library's ``parse_line`` also splits on
    runs of spaces, which would shift the columns of a form such as ``New  York``). The
    columns an evaluation does not read (FEATS, DEPS, MISC, ...) are not parsed."""
    token: Dict[str, object] = {}
    for i, name in enumerate(fields):
        if name in ("id", "head"):
            try:
                token[name] = DEFAULT_FIELD_PARSERS[name](columns, i)
            except (ParseException, ValueError):
                token[name] = None
            word = isinstance(token["id"], int)  # (a range or empty node has no head)
            if not isinstance(token[name], int) and (word if name == "head" else
                                                     token[name] is None):
                raise TreebankFormatError(f"{where}: {name} {columns[i]!r} is not an integer "
                                          "(for 'id': a word id, a range or an empty node)")
        else:
            token[name] = None if columns[i] == "_" and name != "form" else columns[i]
    return token


def _blocks(lines: Iterable[Tuple[int, str]]) -> Iterator[Tuple[int, List[Tuple[int, str]]]]:
    """Sentence blocks as ``(first line number, [(line number, text), ...])``; blank
    lines separate sentences."""
    block: List[Tuple[int, str]] = []
    for number, text in lines:
        text = text.rstrip("\r\n")
        if text.strip():
            block.append((number, text))
        elif block:
            yield block[0][0], block
            block = []
    if block:
        yield block[0][0], block


def _check_tree(path: str, line: int, heads: List[int], lines: List[int]) -> None:
    n = len(heads)
    for k, h in enumerate(heads):
        if not 0 <= h <= n or h == k + 1:
            raise TreebankFormatError(f"{path}:{lines[k]}: head {h} of word {k + 1} is out of "
                                      f"range [0, {n}] or the word itself (not its own head)")
    # every word must reach the root: following heads from any word ends at 0 (without a
    # root, some heads form a cycle)
    state = [0] * n  # 0 unvisited, 1 on the current path, 2 reaches the root
    for start in range(n):
        path_words, k = [], start
        while k >= 0 and state[k] == 0:
            state[k] = 1
            path_words.append(k)
            k = heads[k] - 1
        if k >= 0 and state[k] == 1:
            cycle = sorted(w + 1 for w in path_words[path_words.index(k):])
            raise TreebankFormatError(f"{path}:{lines[k]}: the heads form a cycle through "
                                      f"words {cycle}" + ("" if 0 in heads else
                                                          " (the sentence has no root, no head 0)"))
        for w in path_words:
            state[w] = 2


def read_treebank(path: str, format: Optional[str] = None,
                  max_sentences: Optional[int] = None) -> List[GoldTree]:
    """Gold trees of a CoNLL-U (``format='conllu'``) or CoNLL-X (``'conllx'``) file;
    by default the format follows the extension (``.conll``/``.conllx``: CoNLL-X).

    Comment lines (``#``) are skipped; in CoNLL-U, ``# sent_id`` is kept. Multiword-token
    ranges and empty nodes are skipped: the words are the syntactic words ``1..n``,
    which must be numbered consecutively. The file is read a line at a time as UTF-8 (a
    leading byte-order mark is dropped). Raises :class:`TreebankFormatError` with the
    file and line for text that is not UTF-8, a line over :data:`MAX_LINE_BYTES` bytes,
    a wrong column count (columns are separated by tabs only), a non-integer head, a
    head out of range, a word that is its own head, a cycle, or a sentence without a
    root; and for a directory given as ``path``.
    Punctuation (:attr:`GoldTree.punct`) is decided by :func:`is_punctuation`.
    """
    format = format or _guess_format(path)
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    if max_sentences is not None and max_sentences < 1:
        raise ValueError(f"max_sentences must be >= 1, got {max_sentences}")
    fields = CONLLU_FIELDS if format == "conllu" else CONLLX_FIELDS
    tag_field = "upos" if format == "conllu" else "cpostag"
    trees: List[GoldTree] = []
    for first, block in _blocks(_text_lines(path)):
        words, heads, tags, numbers, sent_id = [], [], [], [], ""
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
            token = _parse_columns(columns, fields, f"{path}:{number}")
            tid, head = token["id"], token["head"]
            if isinstance(tid, tuple) and len(tid) == 3 and tid[1] in ("-", "."):
                continue  # a (1, '-', 2) range or an (8, '.', 1) empty node
            if tid != len(words) + 1:
                raise TreebankFormatError(f"{path}:{number}: word id {columns[0]!r} out of "
                                          f"order or not a word id (expected {len(words) + 1})")
            words.append(token["form"] if token["form"] is not None else "_")
            heads.append(head)
            tags.append(token[tag_field] or "")
            numbers.append(number)
        if not words:
            continue  # a block of comments only
        _check_tree(path, first, heads, numbers)
        trees.append(GoldTree(words, heads, tags, sent_id or f"{os.path.basename(path)}:{first}",
                              numbers[0]))
        if max_sentences is not None and len(trees) >= max_sentences:
            break
    return trees
