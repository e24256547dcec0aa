"""A pretraining corpus read by its format (``glomo pretrain``'s ``corpus.format``): the
documents of a text corpus or the images of an image corpus, each optionally thinned to
an even spread over the whole corpus. A text corpus that is a table (CSV, TSV, JSON
lines) is read by its ``corpus.column``, never as running text."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
from typing import Generator, Iterator, List, Optional, Tuple

import torch

from glomo_pyg.data.aclimdb import read_aclimdb
from glomo_pyg.data.text import (
    MAX_DOCUMENT_BYTES,
    TextDataError,
    binary_lines,
    decode_utf8,
    open_text,
    read_text_documents,
)

TEXT_FORMATS = ("text", "aclimdb")
IMAGE_FORMATS = ("cifar10", "imagenet32")
#: Tables a text corpus may be, by file name ending: read by ``corpus.column``.
TABLE_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
_NAMES = dict(csv="a CSV file", tsv="a TSV file", jsonl="a JSON-lines file")
_SNIFF_BYTES = 1 << 16  # of the first line, enough to tell a JSON object


def _corpus_path(path: Optional[str], format: str, formats: Tuple[str, ...], kind: str,
                 where: str, limit_name: str, limit: Optional[int]) -> str:
    """``corpus.path`` (user-expanded), checked with ``corpus.format`` and the size limit."""
    if path is None or format not in formats or (limit is not None and limit < 1):
        raise ValueError(f"corpus.path is not set: {where}" if path is None else
                         f"{kind} corpus's format must be one of {formats}, got {format!r}"
                         if format not in formats else
                         f"corpus.{limit_name} must be >= 1, got {limit}")
    path = os.path.expanduser(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"corpus.path: {path} does not exist (give {where})")
    return path


def table_kind(path: str) -> Optional[str]:
    """``'csv'``, ``'tsv'`` or ``'jsonl'`` when the file ``path`` holds records rather than
    running text (by its name's ending, or a first line that is a JSON object), else
    ``None``."""
    kind = TABLE_SUFFIXES.get(os.path.splitext(path)[1].lower())
    if kind is not None or not os.path.isfile(path):
        return kind
    with open_text(path) as fh:
        first = decode_utf8(fh.readline(_SNIFF_BYTES), path, errors="replace").strip()
    if not first.startswith("{"):
        return None
    try:
        return "jsonl" if isinstance(json.loads(first), dict) else None
    except (ValueError, RecursionError):
        return None


def _all_documents(path: str, format: str, one_per_line: bool,
                   column: Optional[str]) -> Iterator[str]:
    if format == "aclimdb":
        # unlabelled and labelled training reviews; the test reviews stay unseen
        return (r.text for r in read_aclimdb(path, "train", ("unsup", "pos", "neg")))
    kind = table_kind(path)
    if kind is not None and column is not None:
        return read_table_column(path, column, kind)
    if kind is not None or column is not None:
        raise ValueError(_table_advice(path, kind, column))
    return read_text_documents(path, one_per_line=one_per_line)


def _table_advice(path: str, kind: Optional[str], column: Optional[str]) -> str:
    """Why a table without ``corpus.column``, or ``corpus.column`` without a table, is
    refused, and what to set."""
    if kind is None:
        what = "a folder" if os.path.isdir(path) else "not a CSV, TSV or JSON-lines file"
        return (f"corpus.column ({column!r}) reads one CSV, TSV or JSON-lines file (ending in "
                f"{', '.join(TABLE_SUFFIXES)}), but corpus.path {path} is {what}; remove "
                "corpus.column to read plain text")
    columns = _columns(path, kind)
    example = columns[0] if len(columns) == 1 else _longest_column(path, kind) or "text"
    return (f"corpus.path {path} is {_NAMES[kind]} (columns: {', '.join(columns) or 'none'}): "
            f"read as plain text its header, ids and labels would be trained on; set "
            f"corpus.column to the column that holds the text (e.g. --set "
            f"corpus.column={example})")


def _first_records(path: str, kind: str, count: int = 2) -> List[dict]:
    with contextlib.closing(read_table_records(path, kind)) as records:
        return [r for _, r in zip(range(count), records)]


def _columns(path: str, kind: str) -> List[str]:
    if kind == "jsonl":
        return sorted({k for r in _first_records(path, kind) for k in r})
    with _csv_reader(path, kind) as (reader, _):
        return [str(f) for f in reader.fieldnames or ()]


def _longest_column(path: str, kind: str) -> Optional[str]:
    """The column whose value in the first record is the longest text (the likely one)."""
    first = (_first_records(path, kind) or [{}])[0]
    texts = {k: len(v) for k, v in first.items() if isinstance(v, str)}
    return max(texts, key=lambda k: texts[k]) if texts else None


@contextlib.contextmanager
def _csv_reader(path: str, kind: str):
    """A :class:`csv.DictReader` of the CSV or TSV file ``path`` (UTF-8, fields of up to a
    document's size), and its file."""
    limit = csv.field_size_limit()
    csv.field_size_limit(max(limit, MAX_DOCUMENT_BYTES))  # (reviews exceed 128 KiB)
    try:
        with io.TextIOWrapper(open_text(path), encoding="utf-8-sig", newline="") as fh:
            yield csv.DictReader(fh, delimiter="\t" if kind == "tsv" else ","), fh
    finally:
        csv.field_size_limit(limit)


def _json_records(path: str) -> Generator[dict, None, None]:
    with open_text(path) as fh:
        for number, offset, data in binary_lines(fh, path, MAX_DOCUMENT_BYTES):
            line = decode_utf8(data, path, number, offset).strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as err:
                record = err
            if not isinstance(record, dict):
                raise TextDataError(f"{path}:{number}: not a JSON object ({record}); a "
                                    "JSON-lines corpus holds one object per line")
            yield record


def read_table_records(path: str, kind: str) -> Generator[dict, None, None]:
    """The records of a CSV, TSV (header row first) or JSON-lines file ``path``; a
    malformed one raises a :class:`~glomo_pyg.data.TextDataError` naming its line."""
    if kind == "jsonl":
        yield from _json_records(path)
        return
    with _csv_reader(path, kind) as (reader, _):
        try:
            yield from reader
        except (csv.Error, UnicodeDecodeError) as err:
            raise TextDataError(f"{path}:{reader.line_num}: not readable as "
                                f"{_NAMES[kind]} ({err})") from None


def read_table_column(path: str, column: str, kind: str) -> Iterator[str]:
    """Each non-empty text in ``column`` of the table ``path``, a document each."""
    for number, record in enumerate(read_table_records(path, kind), 1):
        if column not in record:
            columns = ", ".join(map(str, record))
            raise ValueError(f"corpus.column {column!r}: record {number} of {path} has no "
                             f"such column (its columns: {columns})")
        text = record[column]
        if text is not None and not isinstance(text, str):
            raise TextDataError(f"{path}: record {number}'s {column!r} is "
                                f"{type(text).__name__}, not text")
        if text and text.strip():
            yield text


def read_corpus_documents(path: Optional[str], format: str = "text", one_per_line: bool = False,
                          max_documents: Optional[int] = None,
                          column: Optional[str] = None) -> Iterator[str]:
    """The documents of the text corpus at ``path`` in ``format``; with ``max_documents``
    (M of N), those at positions ``floor(k * N / M)``, spread evenly over the corpus. A
    CSV, TSV or JSON-lines file (:func:`table_kind`) is read by its ``column``, a
    document per record, and refused without one."""
    path = _corpus_path(path, format, TEXT_FORMATS, "a text",
                        "a text file or folder, or the aclImdb folder", "max_documents",
                        max_documents)
    if max_documents is None:
        yield from _all_documents(path, format, one_per_line, column)
        return
    total = sum(1 for _ in _all_documents(path, format, one_per_line, column))
    take = min(total, max_documents)
    wanted = {k * total // take for k in range(take)}
    for k, doc in enumerate(_all_documents(path, format, one_per_line, column)):
        if k in wanted:
            yield doc


def read_image_corpus(path: Optional[str], format: str,
                      max_images: Optional[int] = None) -> torch.Tensor:
    """The uint8 ``[n, C, H, W]`` training images of the image corpus at ``path``
    (``format`` ``'cifar10'`` or ``'imagenet32'``); an even spread of ``max_images``."""
    from glomo_pyg.data.images import load_cifar10, load_imagenet32

    path = _corpus_path(path, format, IMAGE_FORMATS, "an image",
                        "the cifar-10-batches-py or imagenet32 folder", "max_images", max_images)
    images = load_cifar10(path, "train")[0] if format == "cifar10" else load_imagenet32(path)[0]
    if max_images is not None and max_images < len(images):
        images = images[torch.arange(max_images) * len(images) // max_images]
    return images
