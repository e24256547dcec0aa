"""Word-level text: a documented tokenizer, a vocabulary, and plain-text readers.

Tokenizer rules (:func:`tokenize`), applied in this order:

1. HTML line breaks (``<br>``, ``<br/>``, ``<br />``, any case) become spaces; IMDB
   reviews are full of them.
2. Text is lower-cased (``lower=True``, the default) and Unicode-normalised (NFKC), so
   ``ﬁ`` and ``fi`` are one word.
3. Tokens are, left to right: words of letters and digits with inner apostrophes or
   hyphens kept (``don't``, ``well-known``, ``1990s``), and every other non-space
   character on its own (``!``, ``.``, ``"``, ``(``). Runs of the same punctuation
   collapse to one token (``!!!`` -> ``!``; ``...`` -> ``.``).

The rules are deterministic and language-agnostic enough for English corpora of any
size; they are what the pretraining corpus and the downstream task must share.

Files are read as UTF-8 (a leading byte-order mark is dropped, CRLF and CR line ends
become LF); text that is not UTF-8, a document or line over the size limit, or a
malformed file raises a :class:`TextDataError` naming the file (and the line and byte
offset where there is one).
"""
from __future__ import annotations

import codecs
import json
import os
import re
import unicodedata
from collections import Counter
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from glomo_pyg.atomic_files import atomic_write
from glomo_pyg.io.paths import check_input_path

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIALS = (PAD, UNK, BOS, EOS)

_BREAK = re.compile(r"<br\s*/?\s*>", re.IGNORECASE)
_TOKEN = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*|([^\w\s])\1*|_+", re.UNICODE)
MAX_DOCUMENT_BYTES = 1 << 26  # default size limit of one document (a file, or a line)


class TextDataError(ValueError):
    """A text input (corpus file, vocabulary, word vectors, review, token shards) that is
    malformed, corrupt, empty or not UTF-8; the message names the file, and the line where
    there is one, and what to do."""


def decode_utf8(data: bytes, path: str, line: Optional[int] = None, offset: int = 0,
            errors: str = "strict") -> str:
    """``data`` (the bytes at ``offset`` of ``path``, on ``line``) as UTF-8; a leading
    byte-order mark at offset 0 is dropped."""
    if offset == 0 and data.startswith(codecs.BOM_UTF8):
        data, offset = data[3:], 3
    try:
        return data.decode("utf-8", errors)
    except UnicodeDecodeError as err:
        where = f"{path}:{line}" if line else path
        raise TextDataError(f"{where}: not UTF-8 text (byte {data[err.start]:#04x} at byte "
                            f"offset {offset + err.start}); convert the file to UTF-8") from None


def binary_lines(fh, path: str, limit: int) -> Iterator[Tuple[int, int, bytes]]:
    """``(line number, byte offset, bytes)`` of each line of the binary file ``fh``; a line
    over ``limit`` bytes raises (never read whole)."""
    number, offset = 0, 0
    while True:
        data = fh.readline(limit + 1)
        if not data:
            return
        number += 1
        if len(data) > limit:
            raise TextDataError(f"{path}:{number}: line longer than {limit} bytes (at byte "
                                f"offset {offset}); not a text file of this kind?")
        yield number, offset, data
        offset += len(data)


def read_document(path: str, max_bytes: int = MAX_DOCUMENT_BYTES,
                   errors: str = "strict") -> str:
    """A whole file as one document: UTF-8, at most ``max_bytes`` bytes, line ends as LF."""
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise TextDataError(f"{path}: more than {max_bytes} bytes in one document; split the "
                            "file (or read it a document per line, or raise max_bytes)")
    return _newlines(decode_utf8(data, path, errors=errors))


def _newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def tokenize(text: str, lower: bool = True) -> List[str]:
    """Split ``text`` into word-level tokens by the rules in the module docstring."""
    if not isinstance(text, str):
        raise TypeError(f"tokenize expects a str, got {type(text).__name__}")
    text = unicodedata.normalize("NFKC", _BREAK.sub(" ", text))
    if lower:
        text = text.lower()
    out = []
    for match in _TOKEN.finditer(text):
        token = match.group(0)
        out.append(match.group(1) or token)  # a punctuation run as one character
    return out


class WordVocabulary:
    """Token strings <-> ids, with special tokens first (``<pad>`` = 0, ``<unk>`` = 1,
    ``<bos>``, ``<eos>``), then words by descending count (ties alphabetical).

    Build with :meth:`build` from token lists or a :class:`collections.Counter`; save
    with :meth:`save` (JSON) or hand :meth:`tokens` to
    :class:`~glomo_pyg.PretrainedGraphPredictor`, which stores it with the predictor.
    """

    def __init__(self, tokens: Sequence[str], specials: Sequence[str] = SPECIALS):
        tokens = list(tokens)
        missing = [s for s in specials if s not in tokens]
        if missing or len(set(tokens)) != len(tokens):
            raise ValueError(f"vocabulary tokens must be unique and include the special tokens "
                             f"{list(specials)} (missing: {missing})")
        self._tokens = tokens
        self._ids: Dict[str, int] = {t: i for i, t in enumerate(tokens)}
        self.specials = tuple(specials)

    @classmethod
    def build(cls, documents: Union[Counter, Iterable[Sequence[str]]], min_count: int = 1,
              max_size: Optional[int] = None, specials: Sequence[str] = SPECIALS
              ) -> "WordVocabulary":
        """Words seen at least ``min_count`` times, the ``max_size`` most frequent
        (specials included in the size)."""
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        if max_size is not None and max_size <= len(specials):
            raise ValueError(f"max_size must exceed the {len(specials)} special tokens")
        counts = documents if isinstance(documents, Counter) else Counter(
            t for doc in documents for t in doc)
        words = sorted((w for w, c in counts.items() if c >= min_count and w not in specials),
                       key=lambda w: (-counts[w], w))
        if max_size is not None:
            words = words[:max_size - len(specials)]
        return cls(list(specials) + words, specials)

    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, token: str) -> bool:
        return token in self._ids

    @property
    def pad_id(self) -> int:
        return self._ids[PAD]

    @property
    def unk_id(self) -> int:
        return self._ids[UNK]

    def tokens(self) -> List[str]:
        return list(self._tokens)

    def id(self, token: str) -> int:
        return self._ids.get(token, self._ids[UNK])

    def encode(self, tokens: Sequence[str]) -> torch.Tensor:
        """Ids of ``tokens`` (int64), unknown words as ``<unk>``."""
        if isinstance(tokens, str):  # would be read character by character
            raise TypeError("encode takes a sequence of tokens, not a string: split it "
                            "first (e.g. glomo_pyg.data.text.tokenize)")
        return torch.tensor([self.id(t) for t in tokens], dtype=torch.long)

    def decode(self, ids: Iterable[int]) -> List[str]:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self._tokens):
                raise IndexError(f"token id {i} outside the vocabulary [0, {len(self._tokens)})")
            out.append(self._tokens[i])
        return out

    def save(self, path: str) -> None:
        """JSON ``{"format": "glomo-vocabulary", "tokens": [...], "specials": [...]}``,
        written atomically."""
        with atomic_write(path) as fh:
            json.dump(dict(format="glomo-vocabulary", version=1, specials=list(self.specials),
                           tokens=self._tokens), fh, ensure_ascii=False)

    @classmethod
    def load(cls, path: str) -> "WordVocabulary":
        """A vocabulary saved by :meth:`save`; anything else raises a
        :class:`TextDataError` naming the file."""
        try:
            data = json.loads(read_document(path))
            ok = isinstance(data, dict) and data.get("format") == "glomo-vocabulary"
            tokens, specials = (data.get("tokens"), data.get("specials", list(SPECIALS))) \
                if ok else (None, None)
            if not (isinstance(tokens, list) and isinstance(specials, list) and
                    all(isinstance(t, str) for t in tokens + specials)):
                raise ValueError("not a glomo vocabulary (format 'glomo-vocabulary', tokens "
                                 "and specials lists of strings); save the vocabulary with "
                                 "WordVocabulary.save")
            return cls(tokens, specials)
        except TextDataError:
            raise
        except (OSError, ValueError, RecursionError) as err:
            raise TextDataError(f"{path}: not a readable vocabulary file: {err}") from None

    def __eq__(self, other) -> bool:
        return isinstance(other, WordVocabulary) and self._tokens == other._tokens

    def __repr__(self) -> str:
        return f"WordVocabulary({len(self)} tokens)"


def read_text_documents(path: str, one_per_line: bool = False,
                        suffixes: Sequence[str] = (".txt",), errors: str = "strict",
                        max_bytes: int = MAX_DOCUMENT_BYTES) -> Iterator[str]:
    """Documents of a plain-text corpus: ``path`` is a file or a folder (searched
    recursively, files with one of ``suffixes``, in sorted order). A file is one document,
    or one document per non-empty line with ``one_per_line`` (e.g. a Wikipedia dump
    flattened to a line per article).

    Files are read as UTF-8: invalid bytes raise a :class:`TextDataError` naming the file,
    line and byte offset (``errors="replace"`` replaces them instead). A document (file,
    or line) over ``max_bytes`` bytes raises, so no input is read into memory unbounded."""
    if errors not in ("strict", "replace"):
        raise ValueError(f"errors must be 'strict' or 'replace', got {errors!r}")
    check_input_path(path, "corpus")  # a FIFO or device: a named error, never a hang
    if os.path.isfile(path):
        files = [path]
    elif os.path.isdir(path):
        files = sorted(os.path.join(root, name) for root, _, names in os.walk(path)
                       for name in names if name.endswith(tuple(suffixes)))
        if not files:
            raise ValueError(f"{path}: no files ending in {tuple(suffixes)}")
    else:
        raise FileNotFoundError(f"{path}: no such file or folder")
    for name in files:
        if not os.path.isfile(name):
            raise TextDataError(f"{name}: not a regular file; remove it from the corpus")
        if not one_per_line:
            yield read_document(name, max_bytes, errors)
            continue
        with open(name, "rb") as fh:
            for number, offset, data in binary_lines(fh, name, max_bytes):
                line = _newlines(decode_utf8(data, name, number, offset, errors))
                if line.strip():
                    yield line
