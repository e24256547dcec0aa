"""The pretraining corpus, prepared once per output folder as a vocabulary and
memory-mapped token shards; fingerprints of a corpus or an image set, which a resumed run
must match."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
import warnings
from collections import Counter
from typing import Any, Dict, Iterator

import torch

from glomo_pyg.atomic_files import write_json
from glomo_pyg.data.corpora import read_corpus_documents
from glomo_pyg.data.text import SPECIALS, WordVocabulary, tokenize
from glomo_pyg.data.tokens import read_shard_index, write_token_shards
from glomo_pyg.io.paths import open_regular_file
from glomo_pyg.nn.settings import MAX_VOCABULARY
from glomo_pyg.training.checkpoints import CHECKPOINT_KEY, CheckpointMismatchError
from glomo_pyg.training.pretrain.config import CorpusConfig
from glomo_pyg.training.utils import rank_zero_info

logger = logging.getLogger(__name__)


def read_json(path: str, advice: str) -> Any:
    """A JSON file of the run folder; a damaged one raises ValueError naming it."""
    try:  # (a FIFO or device in the run folder would block the read)
        with open_regular_file(path, "r", "run file", encoding="utf-8") as fh:
            return json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is damaged (not valid JSON: {err}); {advice}") from None


def iter_documents(corpus: CorpusConfig) -> Iterator[str]:
    """The corpus's documents (:func:`~glomo_pyg.data.corpora.read_corpus_documents`)."""
    return read_corpus_documents(corpus.path, corpus.format, corpus.one_per_line,
                                 corpus.max_documents, corpus.column)


# corpus settings added after runs were first saved, with the behaviour those runs had
_ADDED_CORPUS_SETTINGS = dict(max_images=None, flip=True, crop=None, column=None)


def with_corpus_defaults(saved: Dict[str, Any], keys) -> Dict[str, Any]:
    """Saved corpus settings completed with the settings added since, among ``keys``."""
    return {**{k: v for k, v in _ADDED_CORPUS_SETTINGS.items() if k in keys}, **saved}


CORPUS_FILES = ("tokens", "vocabulary.json", "corpus.json")  # (corpus.json marks it complete)


def corpus_is_prepared(folder: str) -> bool:
    """Whether ``folder`` holds a complete prepared corpus (of any settings)."""
    tokens, vocab, meta = (os.path.join(folder, name) for name in CORPUS_FILES)
    return os.path.exists(meta) and os.path.exists(vocab) and os.path.isdir(tokens)


def install_prepared_corpus(staging: str, folder: str) -> None:
    """Move a corpus prepared in ``staging`` into ``folder``; ``corpus.json`` last."""
    meta = os.path.join(folder, "corpus.json")
    if os.path.exists(meta):
        os.unlink(meta)
    for name in CORPUS_FILES:
        target = os.path.join(folder, name)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        os.replace(os.path.join(staging, name), target)


def _warn_if_one_document(corpus: CorpusConfig, num_docs: int) -> None:
    """A text file read whole is one document: likely meant a document per line."""
    if num_docs == 1 and corpus.format == "text" and not corpus.one_per_line and \
            corpus.column is None and os.path.isfile(os.path.expanduser(str(corpus.path))):
        warnings.warn(f"corpus.path {corpus.path} is one file, read as one document "
                      "(corpus.one_per_line is false): every training sequence is cut from "
                      "that one text; set corpus.one_per_line=true if it holds a document "
                      "per line", RuntimeWarning, stacklevel=4)


def prepare_corpus(corpus: CorpusConfig, folder: str):
    """Vocabulary and token shards in ``folder``, reused if built with the same settings
    (what it made: INFO records of this module's logger)."""
    os.makedirs(folder, exist_ok=True)
    shards, vocab_path, meta_path = (os.path.join(folder, name) for name in CORPUS_FILES)
    settings = {k: v for k, v in dataclasses.asdict(corpus).items()
                if k not in ("max_length", "min_length", "validation_fraction")}
    if corpus_is_prepared(folder):
        built = read_json(meta_path, f"delete it and {shards} to rebuild the corpus (a "
                                      "run resumed on a rebuilt corpus is checked against "
                                      "its checkpoint's corpus fingerprint)")
        saved = built.get("settings") if isinstance(built, dict) else None
        if not isinstance(saved, dict) or with_corpus_defaults(saved, settings) != settings:
            raise ValueError(f"{folder} holds a corpus built with other settings ({saved}; "
                             f"{meta_path}); use another output_dir, or delete {meta_path} "
                             f"and {shards} to rebuild it")
        read_shard_index(shards)
        return WordVocabulary.load(vocab_path), shards
    start = time.time()
    counts: Counter = Counter()
    num_docs = 0
    for doc in iter_documents(corpus):
        counts.update(tokenize(doc, corpus.lower))
        num_docs += 1
    vocab = WordVocabulary.build(counts, corpus.min_count, corpus.max_size)
    few = len(vocab) <= len(SPECIALS)
    if few or len(vocab) > MAX_VOCABULARY:  # (a saved predictor may hold no more)
        raise ValueError(f"{corpus.path}: the vocabulary of {num_docs} documents ({len(counts)} "
                         f"distinct words, corpus.min_count={corpus.min_count}) " + (
                             "would hold only the special tokens; lower min_count or use a "
                             "larger corpus" if few else f"has {len(vocab)} entries, more "
                             f"than a saved predictor may hold ({MAX_VOCABULARY}); set "
                             "corpus.max_size"))
    _warn_if_one_document(corpus, num_docs)
    rank_zero_info(logger, f"corpus: {num_docs} document{'s' if num_docs != 1 else ''}, "
                   f"{sum(counts.values())} tokens, {len(counts)} distinct; vocabulary "
                   f"{len(vocab)} (min_count {corpus.min_count}, max_size {corpus.max_size})")
    if os.path.isdir(shards):
        shutil.rmtree(shards)  # left by an interrupted preparation (no corpus.json yet)
    index = write_token_shards((vocab.encode(tokenize(d, corpus.lower)).numpy()
                                for d in iter_documents(corpus)),
                               shards, len(vocab), corpus.shard_tokens)
    vocab.save(vocab_path)
    unknown = sum(c for w, c in counts.items() if w not in vocab)
    meta = dict(settings=settings, documents=num_docs, tokens=index["num_tokens"],
                unknown_fraction=unknown / max(1, sum(counts.values())),
                seconds=round(time.time() - start, 1))
    write_json(meta_path, meta)  # written last: marks the corpus complete
    rank_zero_info(logger, f"token shards: {index['num_tokens']} tokens in "
                   f"{len(index['shards'])} shard(s), {meta['unknown_fraction']:.2%} unknown, "
                   f"{meta['seconds']} s")
    return vocab, shards


def corpus_fingerprint(vocab: WordVocabulary, shards: str) -> Dict[str, Any]:
    """What identifies a prepared text corpus: sizes and hashes of vocabulary and shards."""
    index, digest = read_shard_index(shards), hashlib.sha256()
    for shard in index["shards"]:
        for key in ("tokens", "docs"):
            with open_regular_file(os.path.join(shards, shard[key]), "rb", "token shard") as fh:
                for chunk in iter(lambda: fh.read(1 << 24), b""):
                    digest.update(chunk)
    words = json.dumps(vocab.tokens(), ensure_ascii=False).encode("utf-8")
    return dict(vocabulary=len(vocab), vocabulary_sha256=hashlib.sha256(words).hexdigest(),
                documents=int(index["num_documents"]), tokens=int(index["num_tokens"]),
                tokens_sha256=digest.hexdigest())


def image_fingerprint(images: torch.Tensor, sample: int = 4096) -> Dict[str, Any]:
    """What identifies an image corpus: count, shape, and a hash of up to ``sample``."""
    step = max(1, len(images) // sample)
    data = images[::step].contiguous().numpy().tobytes()
    return dict(images=len(images), shape=list(images.shape[1:]),
                sample_sha256=hashlib.sha256(data).hexdigest())


def check_fingerprint(contents: Dict[str, Any], path: str, current: Dict[str, Any],
                       where: str) -> None:
    stored = (contents.get(CHECKPOINT_KEY) or {}).get("corpus")
    if stored is None:
        rank_zero_info(logger, f"note: {path} records no corpus fingerprint (written by an "
                       "older glomo_pyg); the corpus cannot be checked against it")
        return
    if stored == current:
        return
    diff = [f"{k} changed" if k.endswith("sha256") else
            f"{k} {stored.get(k)!r} -> {current.get(k)!r}"
            for k in sorted(set(stored) | set(current)) if stored.get(k) != current.get(k)]
    ids = ", so its token ids would mean other words" if any(
        k.startswith("vocabulary") and stored.get(k) != current.get(k) for k in current) else ""
    raise CheckpointMismatchError(
        f"the corpus changed since {path} was written ({', '.join(diff)}): {where} no "
        f"longer holds the data the run was trained on{ids}. Restore the original corpus "
        "(and its tokens folder) to resume, or start a new run in another output_dir")
