"""Checks made at the viewer's door: strings that are valid text, input files that are
regular files (opened without blocking), output paths that can take the page, and
images of more than 8 bits (or float) scaled to the 8 bits the page shows. Each error
names the argument it is about."""
from __future__ import annotations

import os
from typing import BinaryIO, Union

import numpy as np

from glomo_pyg.io.paths import NotRegularFileError, open_regular

PathLike = Union[str, os.PathLike]


def valid_text(value: str, name: str) -> str:
    """``value`` if it encodes as UTF-8; else a :class:`ValueError` naming ``name``. A
    lone surrogate cannot be written to the page: Python makes one of each byte of
    ``argv`` that is not UTF-8 (``surrogateescape``), so that case names the byte."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        code = ord(value[err.start])
        what = f"byte {code - 0xDC00:#04x}" if 0xDC80 <= code <= 0xDCFF \
            else f"lone surrogate U+{code:04X}"
        raise ValueError(f"{name} is not valid UTF-8 ({what} at position {err.start})") \
            from None
    return value


def _no_nul(path: str, name: str) -> str:
    # the OS would refuse it anyway, but in words ("embedded null byte") naming nothing
    if "\0" in path:
        raise ValueError(f"{name} holds a NUL character: {path!r} is not a file name")
    return path


def open_input_file(path: PathLike, name: str) -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file
    (:func:`glomo_pyg.io.paths.open_regular`: non-blocking, checked on the descriptor);
    a FIFO, device, socket or folder is refused at once, naming the argument."""
    path = _no_nul(os.fspath(path), name)
    try:
        return os.fdopen(open_regular(path, name), "rb")
    except NotRegularFileError:
        kind = "a directory, not a file" if os.path.isdir(path) else \
            "not a regular file (a FIFO, device or socket)"
        raise ValueError(f"{name} {path} is {kind}") from None


def check_input_file(path: PathLike, name: str) -> str:
    """Refuse ``path`` unless it is a regular file (see :func:`open_input_file`), for
    readers that take a path."""
    path = os.fspath(path)
    open_input_file(path, name).close()
    return path


def check_output_path(path: PathLike, name: str) -> str:
    """Refuse, before any work, a page path that cannot be written as a file: empty, with
    a NUL, ending in a separator, an existing folder or non-regular file (the page would
    replace it), or under a file. Missing folders are fine (they are created)."""
    path = _no_nul(os.fspath(path), name)
    problem = "is empty" if not path else "is a directory" if os.path.isdir(path) else \
        "ends with a separator" if path.endswith((os.sep, os.altsep or os.sep)) else \
        "is not a regular file (a FIFO, device or socket): the page would replace it" \
        if os.path.lexists(path) and not os.path.isfile(path) else None
    if problem:
        raise ValueError(f"{name}{' ' + path if path else ''} {problem}: give the page's file "
                         "name (e.g. graphs.html)")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent):  # the folders that will be created
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"{name} {path}: {parent} is a file, not a folder")
    return path


def to_uint8(pixels: np.ndarray, where: str) -> np.ndarray:
    """``pixels`` (a PIL image's array of more than 8 bits, or float) as the 8 bits the
    page shows, instead of Pillow's clipping (16-bit: all white) or truncation (float in
    [0, 1]: all black). Unsigned integers are scaled by their type's maximum (16-bit: /257);
    32-bit integers (Pillow's mode ``I``) as 16-bit when within [0, 65535], else min-max;
    floats by 255 when within [0, 1], else min-max to [0, 255]; NaN or inf is refused."""
    if pixels.dtype == np.uint8:
        return pixels
    floating = np.issubdtype(pixels.dtype, np.floating)
    if not (floating or np.issubdtype(pixels.dtype, np.integer)) or \
            (floating and not np.isfinite(pixels).all()):
        raise ValueError(f"{where} holds NaN or infinite pixel values, or pixels that are not "
                         f"numbers ({pixels.dtype})")
    if floating:
        values = pixels.astype(np.float64)
        if values.size and (values.min() < 0 or values.max() > 1):
            values = _min_max(values)
        return np.rint(values * 255).astype(np.uint8)
    values = pixels.astype(np.float64)
    top = float(np.iinfo(np.uint16).max)
    if np.issubdtype(pixels.dtype, np.unsignedinteger):
        top = float(np.iinfo(pixels.dtype).max)
    elif values.size and (values.min() < 0 or values.max() > top):
        return np.rint(_min_max(values) * 255).astype(np.uint8)
    return np.rint(values * (255 / top)).astype(np.uint8)


def _min_max(values: np.ndarray) -> np.ndarray:
    """``values`` stretched to [0, 1]; a constant image is 0 (no range to show)."""
    low, high = values.min(), values.max()
    return (values - low) / (high - low) if high > low else np.zeros_like(values)
