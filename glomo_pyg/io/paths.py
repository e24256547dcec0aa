"""Checks on output paths, made before any long work starts."""
from __future__ import annotations

import os


def check_output_file(path: str) -> None:
    """Raise :class:`ValueError` if ``path`` cannot be written as a file: it is a
    directory or another non-regular file (written files replace what is there, so a
    device such as ``/dev/null`` would be lost), a folder on its way is a file, or the
    nearest existing folder is not writable. Missing folders are fine (they are created
    when the file is written)."""
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory; give a file name")
    if os.path.exists(path) and not os.path.isfile(path):  # the file would replace it
        raise ValueError(f"{path} is not a regular file (a FIFO, device or socket); give a "
                         "file name")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):  # the folders to be created
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"{path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"{path}: {parent} is not writable")


def check_output_folder(path: str) -> None:
    """Raise :class:`ValueError` if ``path`` exists and is not a folder."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{path} is a file, not a folder")
