"""Word vectors in the GloVe / word2vec text format, and training them with gensim.

The text format is one word per line followed by its numbers, separated by single
spaces (``the 0.418 0.24968 -0.41242 ...``). word2vec's variant starts with a header line
``<count> <dim>``; :func:`read_word_vectors` accepts both, so real GloVe files
(``glove.840B.300d.txt``) load unchanged. These vectors are the "transfer feature only"
features of the paper's downstream baselines; no pretrained GloVe can be fetched on the
machines this project is built on, so :func:`train_word_vectors` trains word2vec on an
unlabelled corpus instead (the same role).
"""
from __future__ import annotations

import os
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch


def read_word_vectors(path: str, vocabulary: Optional[Sequence[str]] = None,
                      max_words: Optional[int] = None) -> Tuple[List[str], np.ndarray]:
    """Words and an ``[n, dim]`` float32 array from a GloVe or word2vec text file.

    With ``vocabulary``, only those words are kept (the file's order). Malformed lines
    (wrong count of numbers, non-numbers) raise a :class:`ValueError` naming the line;
    words that occur twice keep their first vector (GloVe's 840B file has a few).
    """
    wanted = set(vocabulary) if vocabulary is not None else None
    words: List[str] = []
    rows: List[np.ndarray] = []
    seen = set()
    dim = None
    with open(path, encoding="utf-8", errors="strict") as fh:
        for number, line in enumerate(fh, 1):
            parts = line.rstrip("\n\r").rstrip(" ").split(" ")
            if number == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                dim = int(parts[1])  # word2vec header: count, dim
                continue
            if len(parts) < 2:
                if not line.strip():
                    continue
                raise ValueError(f"{path}:{number}: expected a word and its numbers")
            # GloVe's large files have words with spaces in them: the numbers are the tail
            d = dim if dim is not None else len(parts) - 1
            if len(parts) - 1 < d or d < 1:
                raise ValueError(f"{path}:{number}: expected {d} numbers, got {len(parts) - 1}")
            word, numbers = " ".join(parts[:len(parts) - d]), parts[len(parts) - d:]
            if dim is None:
                dim = d
            if word in seen or (wanted is not None and word not in wanted):
                continue
            try:
                rows.append(np.asarray(numbers, dtype=np.float32))
            except ValueError:
                raise ValueError(f"{path}:{number}: non-numeric vector entries") from None
            words.append(word)
            seen.add(word)
            if max_words is not None and len(words) >= max_words:
                break
    if dim is None:
        raise ValueError(f"{path}: no word vectors in the file")
    return words, (np.stack(rows) if rows else np.zeros((0, dim), np.float32))


def write_word_vectors(path: str, words: Sequence[str], vectors, header: bool = False) -> None:
    """Write the GloVe text format (``header=True``: word2vec's, with ``<count> <dim>``
    first), atomically. Words must not contain spaces or newlines."""
    vectors = vectors.detach().cpu().numpy() if isinstance(vectors, torch.Tensor) else \
        np.asarray(vectors)
    if vectors.ndim != 2 or vectors.shape[0] != len(words):
        raise ValueError(f"need one vector per word: {len(words)} words, vectors "
                         f"{vectors.shape}")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        if header:
            fh.write(f"{len(words)} {vectors.shape[1]}\n")
        for word, vec in zip(words, vectors):
            if not word or any(c in word for c in " \n\r"):
                raise ValueError(f"word {word!r} cannot be written in the text format")
            fh.write(word + " " + " ".join(f"{v:.6g}" for v in vec) + "\n")
    os.replace(tmp, path)


def embedding_matrix(vocabulary: Sequence[str], words: Sequence[str], vectors: np.ndarray,
                     seed: int = 0, scale: Optional[float] = None) -> Tuple[torch.Tensor, float]:
    """``[len(vocabulary), dim]`` embedding weights: the file's vector for words it has,
    small random vectors (normal, std ``scale`` = the vectors' own std by default) for
    the others and zeros for ``<pad>``. Returns the matrix and the fraction of the
    vocabulary found in the file."""
    index: Dict[str, int] = {w: i for i, w in enumerate(words)}
    dim = vectors.shape[1]
    std = scale if scale is not None else (float(vectors.std()) if vectors.size else 0.0)
    std = std if std > 0 else 0.1
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
    ``[n, dim]`` vectors. ``documents`` is iterated ``epochs + 1`` times (a list, or a
    re-iterable corpus object)."""
    from gensim.models import Word2Vec

    docs = documents if isinstance(documents, list) else _Reiterable(documents)
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
