"""The ``glomo`` executable's entry point: ``glomo --version`` answers without importing
torch or PyG; everything else is :func:`glomo_pyg.cli.console_main`."""
from __future__ import annotations

import sys

from glomo_pyg.version import __version__


def main() -> int:
    """Run ``glomo`` with the process's arguments."""
    if sys.argv[1:] == ["--version"]:  # (the parser's own --version prints the same line)
        print(f"glomo_pyg {__version__}")
        return 0
    from glomo_pyg.cli import console_main

    return console_main()
