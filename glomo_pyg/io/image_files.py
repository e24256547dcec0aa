"""Image files read at the library's doors (``glomo export --images``, the viewer): a
regular file (never a FIFO), its size checked from the header before decoding, any PIL
mode made uint8 RGB."""
from __future__ import annotations

import os
from typing import Union

import numpy as np

from glomo_pyg.extras import require
from glomo_pyg.io.paths import open_input_file


def read_image_file(path: Union[str, os.PathLike], max_pixels: int, too_large: str,
                    what: str = "image") -> np.ndarray:
    """The image file ``path`` as uint8 ``[H, W, 3]`` (:func:`pil_pixels`), or a
    :class:`ValueError`: ``'<path> is <W>x<H> pixels; <too_large>'`` beyond ``max_pixels``
    (read from the header, before decoding), ``'cannot read image <path>: ...'`` for a
    file Pillow cannot decode."""
    Image = require("PIL.Image", f"reading an {what} file")
    name = os.fspath(path)
    try:
        with open_input_file(path, what) as fh, Image.open(fh) as img:
            width, height = img.width, img.height
            pixels = pil_pixels(img, f"image {name}") if width * height <= max_pixels \
                else None
    except (Image.DecompressionBombError, Image.UnidentifiedImageError, OSError) as err:
        raise ValueError(f"cannot read image {name}: {err}") from None
    if pixels is None:
        raise ValueError(f"{name} is {width}x{height} pixels; {too_large}")
    return pixels


def pil_pixels(img, where: str) -> np.ndarray:
    """A PIL image as uint8 ``[H, W, 3]``; modes ``I;16``, ``I``, ``F`` by :func:`to_uint8`."""
    if img.mode == "F" or img.mode.startswith("I"):
        grey = to_uint8(np.asarray(img), where)
        return np.repeat(grey[:, :, None], 3, axis=2)
    return np.asarray(img.convert("RGB"), dtype=np.uint8)


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
