"""Word vectors in the GloVe / word2vec text format, and training them with gensim.

The text format is one word per line followed by its numbers, separated by single
spaces (``the 0.418 0.24968 -0.41242 ...``); words cannot contain spaces. word2vec's
variant starts with a header line ``<count> <dim>``; :func:`read_word_vectors` accepts
both (GloVe's 840B file once its few lines with spaces in the word are deleted). These
vectors are the "transfer feature only" features of the paper's downstream baselines; no
pretrained GloVe can be fetched on the machines this project is built on, so
:func:`train_word_vectors` trains word2vec on an unlabelled corpus instead (the same
role).
"""
from __future__ import annotations

import numbers
import re
from collections import Counter
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from glomo_pyg.atomic_files import atomic_write
from glomo_pyg.data.text import TextDataError, binary_lines, decode_utf8

MAX_LINE_BYTES = 1 << 20  # a 300-d vector line is about 4 KB
MAX_DIM = MAX_LINE_BYTES // 2  # no line of the text format could hold more numbers
# the widest vectors that train_word_vectors makes: write_word_vectors spends up to 13
# bytes per number ("-1.23457e-05 "), and its lines must stay readable (MAX_LINE_BYTES)
MAX_TRAIN_DIM = MAX_LINE_BYTES // 16
# word2vec threads (gensim starts one Python thread each)
MAX_WORKERS = 1024
# word2vec's C settings are 32-bit ints (a larger window made a gensim worker die while
# training waited for it forever)
MAX_WINDOW = (1 << 31) - 1
MAX_SEED = (1 << 32) - 1
# word2vec passes (5 by default; tens for small corpora): more is a typo that would keep
# training for hours to days (every epoch reads the whole corpus) instead of failing
MAX_EPOCHS = 10_000
_COUNT = re.compile(r"[0-9]{1,18}")


def read_word_vectors(path: str, vocabulary: Optional[Sequence[str]] = None,
                      max_words: Optional[int] = None) -> Tuple[List[str], np.ndarray]:
    """Words and an ``[n, dim]`` float32 array from a GloVe or word2vec text file: UTF-8
    (a leading byte-order mark dropped), ``word x1 ... xdim`` per line (blank lines
    skipped), one ``dim`` set by the first line or by word2vec's header ``<count> <dim>``,
    whose count must match. A line that breaks these rules, a number that does not parse
    or is not finite in float32 (``nan``, ``inf``, ``1e39``), or text that is not UTF-8
    raises a :class:`~glomo_pyg.data.TextDataError` naming the file and line.

    With ``vocabulary``, only those words are kept (in the file's order; other lines'
    numbers are not parsed); ``max_words`` stops after that many, leaving the rest unread.
    A word that occurs twice keeps its first vector."""
    if max_words is not None and (isinstance(max_words, bool) or
                                  not isinstance(max_words, numbers.Integral) or max_words < 1):
        raise ValueError(f"max_words must be a positive integer or None, got {max_words!r}")
    wanted = set(vocabulary) if vocabulary is not None else None
    words: List[str] = []
    rows: List[np.ndarray] = []
    seen = set()
    dim = declared = dim_line = None
    count = 0  # vector lines, kept or not
    with open(path, "rb") as fh:
        for number, offset, data in binary_lines(fh, path, MAX_LINE_BYTES):
            line = decode_utf8(data, path, number, offset).rstrip("\n\r").rstrip(" ")
            if not line:
                continue
            parts = line.split(" ")
            if number == 1 and len(parts) == 2 and all(_COUNT.fullmatch(p) for p in parts):
                declared, dim, dim_line = int(parts[0]), int(parts[1]), 1
                if not 1 <= dim <= MAX_DIM:
                    raise TextDataError(f"{path}:1: the word2vec header declares dimension "
                                        f"{dim}; it must lie in [1, {MAX_DIM}] (a line holds "
                                        f"at most {MAX_LINE_BYTES} bytes)")
                continue
            if dim is None:
                dim, dim_line = len(parts) - 1, number
            if dim < 1 or len(parts) != dim + 1 or not parts[0]:
                what = f"{dim} numbers after the word" if dim else "a word and its numbers"
                raise TextDataError(
                    f"{path}:{number}: expected {what} (the dimension set by line {dim_line}), "
                    f"got {len(parts) - 1} fields in {line[:50]!r}; words cannot contain "
                    "spaces (a line that starts with a space has no word) and all vectors "
                    "have one dimension: fix or delete the line")
            count += 1
            word = parts[0]
            if word in seen or (wanted is not None and word not in wanted):
                continue
            try:
                with np.errstate(over="ignore", invalid="ignore"):
                    row = np.asarray(parts[1:], dtype=np.float32)
            except ValueError:
                row = None
            if row is None or not np.isfinite(row).all():
                raise TextDataError(f"{path}:{number}: non-finite or non-numeric vector "
                                    "entries (nan, inf, or beyond float32's range of 3.4e38); "
                                    "fix or delete the line")
            rows.append(row)
            words.append(word)
            seen.add(word)
            if max_words is not None and len(words) >= max_words:
                break
        else:
            if declared is not None and count != declared:
                raise TextDataError(f"{path}: the word2vec header (line 1) declares {declared} "
                                    f"vectors, the file has {count}; fix the header")
    if dim is None:
        raise TextDataError(f"{path}: no word vectors in the file (empty?)")
    return words, (np.stack(rows) if rows else np.zeros((0, dim), np.float32))


def write_word_vectors(path: str, words: Sequence[str], vectors, header: bool = False) -> None:
    """Write the GloVe text format (``header=True``: word2vec's, with ``<count> <dim>``
    first), atomically; missing folders on the way are created. Words must not contain
    spaces or newlines, and every line must stay readable by :func:`read_word_vectors`
    (at most :data:`MAX_LINE_BYTES`)."""
    vectors = vectors.detach().cpu().numpy() if isinstance(vectors, torch.Tensor) else \
        np.asarray(vectors)
    if vectors.ndim != 2 or vectors.shape[0] != len(words) or vectors.shape[1] < 1 or \
            not np.isfinite(vectors).all():
        raise ValueError(f"need one vector per word, with no nan or inf values (they could "
                         f"not be read back): {len(words)} words, vectors {vectors.shape}")
    for word in words:
        if not isinstance(word, str) or not word or any(c in word for c in " \n\r"):
            raise ValueError(f"word {word!r} cannot be written in the text format")
    with atomic_write(path) as fh:  # a failed write leaves nothing behind
        if header:
            fh.write(f"{len(words)} {vectors.shape[1]}\n")
        for word, vec in zip(words, vectors):
            line = word + " " + " ".join(f"{v:.6g}" for v in vec) + "\n"
            if len(line.encode("utf-8")) > MAX_LINE_BYTES:
                raise ValueError(f"the line of word {word[:40]!r} would take "
                                 f"{len(line.encode('utf-8'))} bytes, more than the "
                                 f"{MAX_LINE_BYTES} a reader of this format accepts "
                                 f"({vectors.shape[1]}-d vectors are too wide)")
            fh.write(line)


def embedding_matrix(vocabulary: Sequence[str], words: Sequence[str], vectors: np.ndarray,
                     seed: int = 0, scale: Optional[float] = None) -> Tuple[torch.Tensor, float]:
    """``[len(vocabulary), dim]`` embedding weights: the file's vector for words it has,
    small random vectors (normal, std ``scale`` = the vectors' own std by default) for
    the others and zeros for ``<pad>``. Returns the matrix and the fraction of the
    vocabulary found in the file. ``vectors`` is ``[len(words), dim]`` (e.g. from
    :func:`read_word_vectors`); values or a scale that float32 cannot hold are refused."""
    for name, value in (("vocabulary", vocabulary), ("words", words)):
        if isinstance(value, str) or not isinstance(value, Sequence) or \
                not all(isinstance(w, str) for w in value):
            raise ValueError(f"{name} must be a sequence of str tokens, got "
                             f"{type(value).__name__}")
    limit = float(np.finfo(np.float32).max)
    if not isinstance(vectors, np.ndarray) or vectors.ndim != 2 or \
            vectors.shape[0] != len(words) or vectors.shape[1] < 1 or \
            not np.issubdtype(vectors.dtype, np.floating) or not np.isfinite(vectors).all() \
            or (vectors.size and float(np.abs(vectors).max()) > limit):
        got = f"{vectors.shape} {vectors.dtype}" if isinstance(vectors, np.ndarray) else \
            type(vectors).__name__
        raise ValueError(f"vectors must be a floating-point numpy array [len(words), dim] = "
                         f"[{len(words)}, dim], got {got}, of finite values (no NaN or inf) "
                         "within float32's range (beyond float32's range: too large to be "
                         "features)")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)
                              or not 0 < scale < np.inf):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    index: Dict[str, int] = {w: i for i, w in enumerate(words)}
    dim = vectors.shape[1]
    # (the std in float64: float32 overflows to inf on huge but finite vectors)
    std = float(scale) if scale is not None else \
        (float(vectors.std(dtype=np.float64)) if vectors.size else 0.0)
    # the random rows are drawn as std * N(0, 1); |N(0, 1)| stays far below 16
    if std * 16 > limit:
        raise ValueError(f"the word vectors' scale ({std:g}) is too large for float32 "
                         "features (random rows for the other words would overflow)")
    std = std if std > 0 else 0.1  # (all-zero or no vectors: a small default)
    gen = torch.Generator().manual_seed(seed)
    out = torch.randn(len(vocabulary), dim, generator=gen) * std
    found = 0
    for i, word in enumerate(vocabulary):
        if word in index:
            out[i] = torch.from_numpy(vectors[index[word]])
            found += 1
        elif word == "<pad>":
            out[i] = 0.0
    return out, found / max(1, len(vocabulary))


def train_word_vectors(documents: Iterable[Sequence[str]], dim: int = 300, window: int = 5,
                       min_count: int = 5, epochs: int = 5, workers: int = 2, seed: int = 0,
                       sg: bool = False) -> Tuple[List[str], np.ndarray]:
    """word2vec (gensim) on tokenised documents; returns words (most frequent first) and
    ``[n, dim]`` vectors. ``documents`` (lists of str tokens) is iterated ``epochs + 2``
    times (a list, or a re-iterable corpus object). Settings that are not positive
    integers (``dim`` at most :data:`MAX_TRAIN_DIM`, ``window`` at most :data:`MAX_WINDOW`,
    ``epochs`` at most :data:`MAX_EPOCHS`, ``workers`` at most :data:`MAX_WORKERS`), a
    seed outside ``[0, 2**32 - 1]``, documents that are not token lists, or a corpus with no word that occurs
    ``min_count`` times raise a :class:`ValueError` before gensim runs."""
    for name, value, low, high in (
            ("dim", dim, 1, MAX_TRAIN_DIM), ("window", window, 1, MAX_WINDOW),
            ("min_count", min_count, 1, None), ("epochs", epochs, 1, MAX_EPOCHS),
            ("workers", workers, 1, MAX_WORKERS), ("seed", seed, 0, MAX_SEED)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or \
                value < low or (high is not None and value > high):
            kind = f"an integer in [0, {high}]" if low == 0 else \
                "a positive integer" + (f" <= {high}" if high is not None else "")
            raise ValueError(f"{name} must be {kind}, got {value!r}")
    docs = documents if isinstance(documents, list) else _Reiterable(documents)
    counts: Counter = Counter()
    for doc in docs:
        if isinstance(doc, (str, bytes)) or not all(isinstance(t, str) for t in doc):
            raise ValueError("documents must be lists of str tokens (tokenize the text "
                             f"first), got {type(doc).__name__} {str(doc)[:40]!r}")
        counts.update(doc)
    if max(counts.values(), default=0) < min_count:
        raise ValueError(f"no word occurs min_count={min_count} times (the corpus holds no "
                         f"tokens, or the most frequent of its {len(counts)} words occurs "
                         f"{max(counts.values(), default=0)} times); lower min_count or use "
                         "a larger corpus")
    from glomo_pyg.extras import require

    Word2Vec = require("gensim.models", "Training word2vec vectors").Word2Vec

    model = Word2Vec(sentences=docs, vector_size=dim, window=window, min_count=min_count,
                     workers=workers, seed=seed, epochs=epochs, sg=int(sg))
    words = list(model.wv.index_to_key)
    return words, np.asarray(model.wv.vectors, dtype=np.float32)


class _Reiterable:
    def __init__(self, documents):
        if iter(documents) is documents:
            raise TypeError("train_word_vectors needs a list or a re-iterable corpus, not a "
                            "one-shot iterator (word2vec passes over it several times)")
        self.documents = documents

    def __iter__(self):
        return iter(self.documents)
