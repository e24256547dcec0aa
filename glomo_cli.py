"""The ``glomo`` executable's entry point, outside the package so that ``glomo --version``
answers from the installed metadata without importing torch or PyG (importing
``glomo_pyg`` imports both); everything else is :func:`glomo_pyg.cli.console_main`."""
from __future__ import annotations

import sys
from importlib.metadata import version


def main() -> int:
    """Run ``glomo`` with the process's arguments."""
    if sys.argv[1:] == ["--version"]:  # (the parser's own --version prints the same line)
        print(f"glomo_pyg {version('glomo-pyg')}")
        return 0
    from glomo_pyg.cli import console_main

    return console_main()
