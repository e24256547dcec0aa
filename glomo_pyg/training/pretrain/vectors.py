"""Initial token embeddings of a pretraining run (``train.init_vectors``): word vectors
read from a GloVe/word2vec file, or trained on the corpus first."""
from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from glomo_pyg.data.text import TextDataError, tokenize
from glomo_pyg.training.pretrain.config import CorpusConfig, PretrainConfig
from glomo_pyg.training.pretrain.corpus import iter_documents


def embedding_width(model: Dict[str, Any]) -> int:
    """The token embeddings' width of the text model built from ``model`` settings."""
    import inspect

    from glomo_pyg.nn.glomo import Glomo

    default = inspect.signature(Glomo.text).parameters["hidden_channels"].default
    return model.get("hidden_channels", default)


def _read_init_vectors(path: str, vocabulary: Optional[List[str]] = None,
                       max_words: Optional[int] = None, width: Optional[int] = None
                       ) -> Tuple[List[str], np.ndarray]:
    """The words and vectors of ``train.init_vectors`` (those of ``vocabulary``); a file
    that cannot be read, holds none of them or vectors not ``width`` wide raises
    :class:`ValueError` naming it."""
    from glomo_pyg.data.word_vectors import read_word_vectors

    path = os.path.expanduser(path)
    try:
        words, vectors = read_word_vectors(path, vocabulary=vocabulary, max_words=max_words)
        problem = None
    except (OSError, TextDataError) as err:
        words, vectors, problem = [], None, err
    if not words:
        problem = problem or (f"{path} holds no vectors" if vocabulary is None else
                              f"{path} has a vector for none of the {len(vocabulary)} "
                              "vocabulary words (another language or tokenisation?)")
    elif width is not None and vectors.shape[1] != width:
        problem = (f"{path} holds {vectors.shape[1]}-d vectors, but the token embeddings are "
                   f"model.hidden_channels = {width} wide; train vectors of that width "
                   f"(glomo word-vectors --dim {width})")
    if problem:
        raise ValueError(f"train.init_vectors: {problem}")
    return words, vectors


def check_init_vectors(config: PretrainConfig) -> None:
    """Refuse ``train.init_vectors`` before the corpus is prepared when the file is
    missing, unreadable or of another width than the embeddings."""
    _read_init_vectors(config.train.init_vectors, max_words=1,
                       width=embedding_width(config.model))


TRAIN_VECTORS = "word2vec"  # train.init_vectors: train them on the corpus first


def train_init_vectors(corpus: CorpusConfig, dim: int, out: str, seed: int = 0,
                       workers: int = 1, log=print) -> str:
    """``train.init_vectors: word2vec``: word2vec vectors ``dim`` wide (gensim CBOW, window
    5, 5 epochs, words seen ``corpus.min_count`` times) trained on the corpus's documents,
    tokenised as the pretraining corpus is, written to ``<out>/word_vectors.txt`` (GloVe
    text format, atomically). A file already there is reused when it has that width.
    Returns its path."""
    from glomo_pyg.data.word_vectors import (read_word_vectors, train_word_vectors,
                                             write_word_vectors)

    path = os.path.join(out, "word_vectors.txt")
    if os.path.exists(path):
        try:
            words, vectors = read_word_vectors(path, max_words=1)
        except (OSError, TextDataError):
            words = []
        if words and vectors.shape[1] == dim:
            log(f"word vectors: reusing {path}")
            return path
        log(f"word vectors: {path} is unreadable or of another width; training them again")
    start = time.time()
    docs = [d for d in (tokenize(doc, corpus.lower) for doc in iter_documents(corpus)) if d]
    words, vectors = train_word_vectors(docs, dim=dim, min_count=corpus.min_count,
                                        workers=workers, seed=seed)
    write_word_vectors(path, words, vectors)
    log(f"word vectors: {len(words)} x {dim} from {len(docs)} documents "
        f"({sum(map(len, docs))} tokens, {time.time() - start:.0f} s), written to {path}")
    return path


def initial_token_embeddings(path: str, vocabulary: List[str], dim: int,
                             seed: int = 0) -> Tuple[torch.Tensor, float]:
    """``train.init_vectors``: the ``[len(vocabulary), dim]`` weights that every token
    embedding of a text model starts from, and the share of the vocabulary the file has.

    Words the file has take its vector, the others small random vectors and ``<pad>``
    zeros (:func:`~glomo_pyg.data.word_vectors.embedding_matrix`, drawn with ``seed``).
    The matrix is then rescaled to the embeddings' own initial scale (std
    ``dim ** -0.5``, :class:`~glomo_pyg.nn.UnitEncoder`): the layers after the embeddings
    were initialised for inputs of that size, so only the directions (which words are
    alike) come from the file. An extension: the paper learns its embeddings from
    random initial values."""
    from glomo_pyg.data.word_vectors import embedding_matrix

    # (the width was checked before the corpus was prepared: check_init_vectors)
    words, vectors = _read_init_vectors(path, vocabulary)
    try:
        weight, found = embedding_matrix(vocabulary, words, vectors, seed=seed)
        std = float(weight.double().std()) if weight.numel() > 1 else 0.0
        problem = None if np.any(vectors) and std > 0 else (
            "it carries no directions to start from (every vector zero, or embeddings that "
            "do not vary: every value equal)")
    except ValueError as err:
        problem = err
    if problem:
        raise ValueError(f"train.init_vectors: {path}: {problem}")
    return (weight.double() * (dim ** -0.5 / std)).float(), found
