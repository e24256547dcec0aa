"""Checks made at the viewer's door, each error naming the argument it is about: strings
that are valid text, input files that are regular files (opened without blocking), output
paths that can take the page, and images of more than 8 bits scaled to 8."""
from __future__ import annotations

import os
from typing import BinaryIO, Union

import numpy as np

from glomo_pyg.io.paths import open_regular

PathLike = Union[str, os.PathLike]


def valid_text(value: str, name: str) -> str:
    """``value`` if it encodes as UTF-8; else a :class:`ValueError` naming ``name`` (and,
    for a byte of ``argv`` that is not UTF-8, which Python makes a lone surrogate, the byte)."""
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


def open_input_file(path: PathLike, name: str) -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file (not a FIFO, device,
    socket or folder, refused at once without blocking, nor a name with a NUL)."""
    path = os.fspath(path)
    try:
        return os.fdopen(open_regular(path, name), "rb")
    except ValueError:  # NotRegularFileError, or os.open refusing a NUL
        problem = f"holds a NUL character: {path!r} is not a file name" if "\0" in path else \
            f"{path} is a directory, not a file" if os.path.isdir(path) else \
            f"{path} is not a regular file (a FIFO, device or socket)"
        raise ValueError(f"{name} {problem}") from None


def check_input_file(path: PathLike, name: str) -> str:
    """Refuse ``path`` unless it is a regular file (see :func:`open_input_file`)."""
    path = os.fspath(path)
    open_input_file(path, name).close()
    return path


def check_output_path(path: PathLike, name: str) -> str:
    """Refuse, before any work, a page path that cannot be written as a file: empty, with
    a NUL, ending in a separator, an existing folder or non-regular file (the page would
    replace it), or under a file. Missing folders are fine (they are created)."""
    path = os.fspath(path)
    hint = ": give the page's file name (e.g. graphs.html)"
    parent = os.path.dirname(os.path.abspath(path)) if path and "\0" not in path else os.sep
    while not os.path.lexists(parent):  # the folders that will be created
        parent = os.path.dirname(parent)
    problem = (
        "is empty" + hint if not path else
        f"holds a NUL character: {path!r} is not a file name" if "\0" in path else
        f"{path} is a directory" + hint if os.path.isdir(path) else
        f"{path} ends with a separator" + hint if path.endswith((os.sep, os.altsep or "/")) else
        f"{path} is not a regular file (a FIFO, device or socket): the page would replace it"
        + hint if os.path.lexists(path) and not os.path.isfile(path) else
        f"{path}: {parent} is a file, not a folder" if not os.path.isdir(parent) else None)
    if problem:
        raise ValueError(f"{name} {problem}")
    return path


def to_uint8(pixels: np.ndarray, where: str) -> np.ndarray:
    """``pixels`` (a PIL image's array of more than 8 bits, or float) scaled to the 8 bits
    the page shows, where Pillow would clip or truncate them (docs/analysis.md): unsigned
    by their maximum, signed (mode ``I``) as 16-bit within [0, 65535], floats by 255 within
    [0, 1], else min-max; NaN or inf is refused."""
    if pixels.dtype == np.uint8:
        return pixels
    floating = np.issubdtype(pixels.dtype, np.floating)
    if not (floating or np.issubdtype(pixels.dtype, np.integer)) or \
            (floating and not np.isfinite(pixels).all()):
        raise ValueError(f"{where} holds NaN or infinite pixel values, or pixels that are not "
                         f"numbers ({pixels.dtype})")
    values = pixels.astype(np.float64)
    if np.issubdtype(pixels.dtype, np.unsignedinteger):
        top = float(np.iinfo(pixels.dtype).max)
    else:
        top = 1.0 if floating else float(np.iinfo(np.uint16).max)
        if values.size and (values.min() < 0 or values.max() > top):
            low, high = values.min(), values.max()  # min-max; a constant image is 0
            values, top = (values - low) / (high - low) if high > low else values * 0, 1.0
    return np.rint(values * (255 / top)).astype(np.uint8)
