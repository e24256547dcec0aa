"""Execute the tutorial notebooks top to bottom and save them with their outputs.

    python notebooks/execute.py                      # every notebook
    python notebooks/execute.py 03_analysing_text_graphs.ipynb

Each notebook runs in a fresh Jupyter kernel (nbclient) with the notebooks folder as its
working directory; its outputs, and in ``metadata.glomo_pyg`` the SHA-256 of its code
cells, the date, the run time and the versions, are written back into the file.
``tests/test_notebooks.py`` checks that the committed outputs belong to the committed
code (the hash) and runs every notebook again.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import pathlib
import platform
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent


def code_hash(nb) -> str:
    """SHA-256 over the sources of the code cells, in order."""
    digest = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            digest.update(cell.source.encode("utf-8") + b"\0")
    return digest.hexdigest()


def execute(path: pathlib.Path, timeout: int = 600, cwd: pathlib.Path = HERE):
    """Run ``path`` in a fresh kernel; returns the executed notebook and its run time."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(str(path), as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return nb, time.perf_counter() - start


def main(argv=None) -> int:
    import nbformat
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="notebook file names (default: all)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = parser.parse_args(argv)
    paths = [HERE / n for n in args.names] if args.names else sorted(HERE.glob("*.ipynb"))
    for path in paths:
        nb, seconds = execute(path, args.timeout)
        nb.metadata["glomo_pyg"] = dict(
            code_sha256=code_hash(nb), seconds=round(seconds, 1),
            executed=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            python=platform.python_version(), torch=torch.__version__,
            threads=torch.get_num_threads(), cpu=platform.processor() or platform.machine())
        nbformat.write(nb, str(path))
        print(f"{path.name}: executed in {seconds:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
