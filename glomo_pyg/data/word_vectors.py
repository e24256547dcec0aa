"""Word vectors in the GloVe / word2vec text format (``the 0.418 0.24968 ...``, word2vec's
with a ``<count> <dim>`` header), and training them with gensim: the "transfer feature
only" features of the paper's downstream baselines (docs/text.md)."""
from __future__ import annotations

import numbers
import re
from collections import Counter
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from glomo_pyg.atomic_files import atomic_write
from glomo_pyg.data.text import TextDataError, binary_lines, decode_utf8, open_text
from glomo_pyg.settings import Rule, check_int

MAX_LINE_BYTES = 1 << 20  # a 300-d vector line is about 4 KB
MAX_DIM = MAX_LINE_BYTES // 2  # no line of the text format could hold more numbers
# written at up to 13 bytes per number ("-1.23457e-05 "), lines must stay readable
MAX_TRAIN_DIM = MAX_LINE_BYTES // 16
MAX_WORKERS = 1024  # gensim starts a Python thread per worker
# word2vec's C settings are 32-bit ints (a larger window made a gensim worker die while
# training waited for it forever)
MAX_WINDOW = (1 << 31) - 1
MAX_SEED = (1 << 32) - 1
MAX_EPOCHS = 10_000  # more is a typo that would train for days instead of failing
#: The integer settings of :func:`train_word_vectors` (and of ``glomo word-vectors``).
TRAIN_RULES = dict(dim=Rule(int, low=1, high=MAX_TRAIN_DIM),
                   window=Rule(int, low=1, high=MAX_WINDOW), min_count=Rule(int, low=1),
                   epochs=Rule(int, low=1, high=MAX_EPOCHS),
                   workers=Rule(int, low=1, high=MAX_WORKERS),
                   seed=Rule(int, low=0, high=MAX_SEED))
_COUNT = re.compile(r"[0-9]{1,18}")


def _vector(entries: List[str], path: str, number: int) -> np.ndarray:
    """The float32 vector of line ``number``, refused unless every entry is a number that
    is finite in float32."""
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            row = np.asarray(entries, dtype=np.float32)
    except ValueError:
        row = np.full(1, np.nan)
    if not np.isfinite(row).all():
        raise TextDataError(f"{path}:{number}: non-finite or non-numeric vector entries (nan, "
                            "inf, or beyond float32's range of 3.4e38); fix or delete the line")
    return row


def read_word_vectors(path: str, vocabulary: Optional[Sequence[str]] = None,
                      max_words: Optional[int] = None) -> Tuple[List[str], np.ndarray]:
    """Words and an ``[n, dim]`` float32 array from a GloVe or word2vec text file (one
    ``dim`` set by the first line or by word2vec's header, whose count must match): only
    the words of ``vocabulary`` when given, at most ``max_words``, the first vector of a
    repeated word.

    Raises:
        ValueError: ``max_words`` neither ``None`` nor a positive integer.
        TextDataError: a malformed line, a number not finite in float32, text that is not
            UTF-8 (naming the file and line), no vectors, or a word2vec header whose count
            the file does not hold."""
    max_words = check_int("max_words", max_words, optional=True)
    wanted = set(vocabulary) if vocabulary is not None else None
    index: Dict[str, int] = {}  # the words kept, in order
    rows: List[np.ndarray] = []
    dim = declared = dim_line = None
    count, complete = 0, True  # vector lines, kept or not
    with open_text(path) as fh:
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
            if word in index or (wanted is not None and word not in wanted):
                continue
            index[word] = len(rows)
            rows.append(_vector(parts[1:], path, number))
            if len(rows) == max_words:
                complete = False
                break
    if dim is None:
        raise TextDataError(f"{path}: no word vectors in the file (empty?)")
    if complete and declared is not None and count != declared:
        raise TextDataError(f"{path}: the word2vec header (line 1) declares {declared} "
                            f"vectors, the file has {count}; fix the header")
    return list(index), (np.stack(rows) if rows else np.zeros((0, dim), np.float32))


def write_word_vectors(path: str, words: Sequence[str], vectors, header: bool = False) -> None:
    """Write the GloVe text format (``header=True``: word2vec's, with ``<count> <dim>``
    first), atomically; missing folders on the way are created. Words must not contain
    spaces or newlines, and every line must stay readable by :func:`read_word_vectors`
    (at most :data:`MAX_LINE_BYTES`).

    Raises:
        ValueError: before anything is written, a word the format cannot hold, vectors
            that are not one finite row per word; while writing, a line too long to read."""
    vectors = vectors.detach().cpu().numpy() if isinstance(vectors, torch.Tensor) else \
        np.asarray(vectors)
    bad = [w for w in words if not isinstance(w, str) or not w or any(c in w for c in " \n\r")]
    if bad:
        raise ValueError(f"word {bad[0]!r} cannot be written in the text format")
    if vectors.ndim != 2 or vectors.shape[0] != len(words) or vectors.shape[1] < 1 or \
            not np.isfinite(vectors).all():
        raise ValueError(f"need one vector per word, with no nan or inf values (they could "
                         f"not be read back): {len(words)} words, vectors {vectors.shape}")
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
    """``[len(vocabulary), dim]`` embedding weights (the vector of ``words`` for words it
    has, random normal rows of std ``scale``, default the vectors' own, for the others,
    zeros for ``<pad>``) and the fraction of the vocabulary found among ``words``."""
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
    # (the std in float64: float32 overflows to inf on huge but finite vectors)
    std = scale if scale is not None else \
        (float(vectors.std(dtype=np.float64)) if vectors.size else 0.0)
    # the random rows are drawn as std * N(0, 1); |N(0, 1)| stays far below 16
    if isinstance(std, bool) or not isinstance(std, numbers.Real) or \
            not (std > 0 or scale is None) or not std * 16 <= limit:
        raise ValueError(f"scale must be a positive finite number, not too large for float32 "
                         f"features (random rows would overflow), got {std!r}"
                         + (" (the word vectors' own std)" if scale is None else ""))
    index = {w: i for i, w in enumerate(words)}
    std = float(std) if std > 0 else 0.1  # (all-zero or no vectors: a small default)
    gen = torch.Generator().manual_seed(seed)
    out = torch.randn(len(vocabulary), vectors.shape[1], generator=gen) * std
    for i, word in enumerate(vocabulary):
        if word in index:
            out[i] = torch.from_numpy(vectors[index[word]])
        elif word == "<pad>":
            out[i] = 0.0
    return out, sum(w in index for w in vocabulary) / max(1, len(vocabulary))


def train_word_vectors(documents: Iterable[Sequence[str]], dim: int = 300, window: int = 5,
                       min_count: int = 5, epochs: int = 5, workers: int = 2, seed: int = 0,
                       sg: bool = False) -> Tuple[List[str], np.ndarray]:
    """word2vec (gensim) on tokenised documents (a list or re-iterable corpus of lists of
    str tokens, iterated ``epochs + 2`` times); returns words (most frequent first) and
    ``[n, dim]`` vectors.

    Raises:
        ValueError: before gensim runs, settings outside their :data:`TRAIN_RULES`,
            documents that are not token lists, or no word that occurs ``min_count`` times.
        TypeError: a one-shot iterator of documents."""
    given: Dict[str, Any] = dict(dim=dim, window=window, min_count=min_count, epochs=epochs,
                                 workers=workers, seed=seed)
    # (check_int, not Rule.check: a numpy integer is as good as an int here)
    dim, window, min_count, epochs, workers, seed = (
        check_int(name, given[name], rule.low, rule.high) for name, rule in TRAIN_RULES.items())
    if iter(documents) is documents:
        raise TypeError("train_word_vectors needs a list or a re-iterable corpus, not a "
                        "one-shot iterator (word2vec passes over it several times)")
    counts: Counter = Counter()
    for doc in documents:
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

    model = require("gensim.models", "Training word2vec vectors").Word2Vec(
        sentences=documents, vector_size=dim, window=window, min_count=min_count,
        workers=workers, seed=seed, epochs=epochs, sg=int(sg))
    return list(model.wv.index_to_key), np.asarray(model.wv.vectors, dtype=np.float32)
