"""Initial token embeddings of a pretraining run (``train.init_vectors``)."""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, List, Optional, Tuple, Union, cast

import numpy as np
import torch

from glomo_pyg.data.text import TextDataError, tokenize
from glomo_pyg.nn.settings import TEXT_DEFAULTS
from glomo_pyg.training.pretrain.config import CorpusConfig, PretrainConfig
from glomo_pyg.training.pretrain.corpus import iter_documents
from glomo_pyg.training.utils import rank_zero_info

logger = logging.getLogger(__name__)


def embedding_width(model: Dict[str, Any]) -> int:
    """The token embeddings' width of the text model built from ``model`` settings."""
    return model.get("hidden_channels", TEXT_DEFAULTS.hidden_channels)


def _read_init_vectors(path: str, vocabulary: Optional[List[str]] = None,
                       width: Optional[int] = None, seed: int = 0
                       ) -> Optional[Tuple[torch.Tensor, float]]:
    """With ``vocabulary``: the embedding matrix and share found; else the file checked."""
    from glomo_pyg.data.word_vectors import embedding_matrix, read_word_vectors

    path = os.path.expanduser(path)
    words: List[str]
    problem: Union[str, OSError, TextDataError, None]
    words, out, std, problem = [], None, 0.0, None
    try:
        words, vectors = read_word_vectors(path, vocabulary=vocabulary,
                                           max_words=None if vocabulary is not None else 1)
        if words and vocabulary is not None:
            out = embedding_matrix(vocabulary, words, vectors, seed=seed)
            std = float(out[0].double().std()) if out[0].numel() > 1 else 0.0
    except (OSError, TextDataError) as err:  # (these name the file)
        problem = err
    except ValueError as err:  # (embedding_matrix's)
        problem = f"{path}: {err}"
    if problem is None and not words:
        problem = (f"{path} holds no vectors" if vocabulary is None else
                   f"{path} has a vector for none of the {len(vocabulary)} vocabulary words "
                   "(another language or tokenisation?)")
    elif problem is None and vocabulary is None and vectors.shape[1] != width:
        problem = (f"{path} holds {vectors.shape[1]}-d vectors, but the token embeddings are "
                   f"model.hidden_channels = {width} wide; train vectors of that width "
                   f"(glomo word-vectors --dim {width})")
    elif problem is None and vocabulary is not None and not (np.any(vectors) and std > 0):
        problem = (f"{path}: it carries no directions to start from (every vector zero, or "
                   "embeddings that do not vary: every value equal)")
    if problem:
        raise ValueError(f"train.init_vectors: {problem}")
    return out


def check_init_vectors(config: PretrainConfig) -> None:
    """Refuse a missing, unreadable or too narrow ``train.init_vectors`` file early."""
    _read_init_vectors(cast(str, config.train.init_vectors),  # (set: the caller checks)
                       width=embedding_width(config.model))


TRAIN_VECTORS = "word2vec"  # train.init_vectors: train them on the corpus first


def train_init_vectors(corpus: CorpusConfig, dim: int, out: str, seed: int = 0,
                       workers: int = 1) -> str:
    """``train.init_vectors: word2vec``: word2vec vectors ``dim`` wide trained on the
    corpus's documents, written to ``<out>/word_vectors.txt`` (reused when it has that
    width); returns its path."""
    from glomo_pyg.data.word_vectors import (
        read_word_vectors,
        train_word_vectors,
        write_word_vectors,
    )

    path = os.path.join(out, "word_vectors.txt")
    if os.path.exists(path):
        try:
            words, vectors = read_word_vectors(path, max_words=1)
        except (OSError, TextDataError):
            words = []
        if words and vectors.shape[1] == dim:
            rank_zero_info(logger, f"word vectors: reusing {path}")
            return path
        rank_zero_info(logger, f"word vectors: {path} is unreadable or of another width; "
                       "training them again")
    start = time.time()
    docs = [d for d in (tokenize(doc, corpus.lower) for doc in iter_documents(corpus)) if d]
    words, vectors = train_word_vectors(docs, dim=dim, min_count=corpus.min_count,
                                        workers=workers, seed=seed)
    write_word_vectors(path, words, vectors)
    rank_zero_info(logger, f"word vectors: {len(words)} x {dim} from {len(docs)} documents "
                   f"({sum(map(len, docs))} tokens, {time.time() - start:.0f} s), written to "
                   f"{path}")
    return path


def initial_token_embeddings(path: str, vocabulary: List[str], dim: int,
                             seed: int = 0) -> Tuple[torch.Tensor, float]:
    """The ``[len(vocabulary), dim]`` start of every token embedding from ``train.init_vectors``
    and the share of the vocabulary found: rescaled to std ``dim ** -0.5``, so that only the
    directions come from the file (an extension: the paper starts from random values)."""
    # (with a vocabulary: the matrix, or ValueError)
    weight, found = cast(Tuple[torch.Tensor, float],
                         _read_init_vectors(path, vocabulary, seed=seed))
    std = float(weight.double().std())
    return (weight.double() * (dim ** -0.5 / std)).float(), found
