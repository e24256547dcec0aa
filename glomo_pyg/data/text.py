"""Word-level text: the tokenizer (its rules: docs/text.md), a vocabulary, and plain-text
readers. Files are read as UTF-8 (a leading byte-order mark dropped, line ends as LF);
malformed input raises a :class:`TextDataError` naming the file (and line and offset)."""
from __future__ import annotations

import codecs
import json
import os
from collections import Counter
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from glomo_pyg.atomic_files import atomic_write
from glomo_pyg.io.paths import check_input_path
from glomo_pyg.settings import Rule, check_int
from glomo_pyg.tokenizer import tokenize as tokenize  # (re-exported: its home for users)

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIALS = (PAD, UNK, BOS, EOS)

MAX_DOCUMENT_BYTES = 1 << 26  # default size limit of one document (a file, or a line)


class TextDataError(ValueError):
    """A text input (corpus, vocabulary, word vectors, review, token shards) that is
    malformed, corrupt, empty or not UTF-8; the message names the file (and line)."""


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
    """``(line number, byte offset, bytes)`` of each line of ``fh``, at most ``limit`` bytes."""
    offset = 0
    for number, data in enumerate(iter(lambda: fh.readline(limit + 1), b""), 1):
        if len(data) > limit:
            raise TextDataError(f"{path}:{number}: line longer than {limit} bytes (at byte "
                                f"offset {offset}); not a text file of this kind?")
        yield number, offset, data
        offset += len(data)


def open_text(path: str):
    """``path`` opened in binary; a FIFO or other non-regular file raises (never blocks)."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise TextDataError(f"{path}: not a regular file; remove it (or give the file itself)")
    return open(path, "rb")


def read_document(path: str, max_bytes: int = MAX_DOCUMENT_BYTES,
                  errors: str = "strict") -> str:
    """A whole file as one document: UTF-8, at most ``max_bytes`` bytes, line ends as LF."""
    with open_text(path) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise TextDataError(f"{path}: more than {max_bytes} bytes in one document; split the "
                            "file (or read it a document per line, or raise max_bytes)")
    return _newlines(decode_utf8(data, path, errors=errors))


def _newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


class WordVocabulary:
    """Token strings <-> ids, with special tokens first (``<pad>`` = 0, ``<unk>`` = 1,
    ``<bos>``, ``<eos>``), then words by descending count (ties alphabetical)."""

    def __init__(self, tokens: Sequence[str], specials: Sequence[str] = SPECIALS):
        tokens, specials = list(tokens), tuple(specials)
        missing = [s for s in specials if s not in tokens]
        if not all(isinstance(t, str) for t in tokens + list(specials)) or missing or \
                len(set(tokens)) != len(tokens):
            raise ValueError(f"vocabulary tokens and specials must be lists of strings, the "
                             f"tokens unique and including the special tokens "
                             f"{list(specials)} (missing: {missing})")
        self._tokens = tokens
        self._ids: Dict[str, int] = {t: i for i, t in enumerate(tokens)}
        self.specials = specials

    @classmethod
    def build(cls, documents: Union[Counter, Iterable[Sequence[str]]], min_count: int = 1,
              max_size: Optional[int] = None, specials: Sequence[str] = SPECIALS
              ) -> "WordVocabulary":
        """Words seen at least ``min_count`` times, the ``max_size`` most frequent
        (specials included in the size).

        Raises:
            ValueError: ``min_count`` not a positive integer, ``max_size`` neither ``None``
                nor an integer above the number of ``specials``."""
        check_int("min_count", min_count)
        check_int("max_size", max_size, len(specials) + 1, optional=True,
                  unit=f" (above the {len(specials)} special tokens)")
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
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < len(self)]
        if bad:
            raise IndexError(f"token id {bad[0]} outside the vocabulary [0, {len(self)})")
        return [self._tokens[i] for i in ids]

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
            if not isinstance(data, dict) or data.get("format") != "glomo-vocabulary" or \
                    not isinstance(data.get("tokens"), list):
                raise ValueError("not a glomo vocabulary (format 'glomo-vocabulary', a tokens "
                                 "list); save the vocabulary with WordVocabulary.save")
            return cls(data["tokens"], data.get("specials", SPECIALS))
        except (OSError, ValueError, TypeError, RecursionError) as err:
            raise TextDataError(f"{path}: not a readable vocabulary file: {err}") from None

    def __eq__(self, other) -> bool:
        return isinstance(other, WordVocabulary) and self._tokens == other._tokens

    def __repr__(self) -> str:
        return f"WordVocabulary({len(self)} tokens)"


def read_text_documents(path: str, one_per_line: bool = False,
                        suffixes: Sequence[str] = (".txt",), errors: str = "strict",
                        max_bytes: int = MAX_DOCUMENT_BYTES) -> Iterator[str]:
    """Documents of a plain-text file or folder (its files ending in ``suffixes``, sorted,
    recursively): a file each, or each non-empty line with ``one_per_line``. Invalid UTF-8
    (unless ``errors="replace"``) or a document over ``max_bytes`` bytes raises a
    :class:`TextDataError` naming the file, line and byte offset; ``errors`` other than
    those two a ``ValueError``."""
    Rule(str, choices=("strict", "replace")).check("errors", errors, typed=True)
    check_input_path(path, "corpus")  # a FIFO or device: a named error, never a hang
    files = [path]  # (a missing path: open() raises FileNotFoundError naming it)
    if os.path.isdir(path):
        files = sorted(os.path.join(root, name) for root, _, names in os.walk(path)
                       for name in names if name.endswith(tuple(suffixes)))
        if not files:
            raise ValueError(f"{path}: no files ending in {tuple(suffixes)}")
    for name in files:
        if not one_per_line:
            yield read_document(name, max_bytes, errors)
            continue
        with open_text(name) as fh:
            for number, offset, data in binary_lines(fh, name, max_bytes):
                line = _newlines(decode_utf8(data, name, number, offset, errors))
                if line.strip():
                    yield line
