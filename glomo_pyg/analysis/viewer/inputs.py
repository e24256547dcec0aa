"""The viewer's check of text at its door: strings that are valid UTF-8, the error naming
the argument (files and images are checked by :mod:`glomo_pyg.io.paths` and
:mod:`glomo_pyg.io.image_files`)."""
from __future__ import annotations


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
