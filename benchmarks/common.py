"""Shared bits of the benchmark scripts: hardware description and result files."""
from __future__ import annotations

import hashlib
import json
import os
import platform
from typing import Dict

import torch

from glomo_pyg.atomic_files import atomic_write


def hardware(device: str = "cpu") -> str:
    """What the numbers were measured on."""
    if device != "cpu":
        return torch.cuda.get_device_name()
    name = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            name = next(line.split(":", 1)[1].strip() for line in fh
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    threads = torch.get_num_threads()
    return f"{name}, {threads} torch thread{'s' if threads != 1 else ''}"


def append_results(path: str, lines) -> str:
    """Append a markdown section to a results file and return its text."""
    text = "\n".join(lines) + "\n"
    with open(path, "a") as fh:
        fh.write(text)
    return text


def read_cache(path: str, what: str) -> Dict:
    """A JSON cache of this script (a mapping); a damaged one stops with its name."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} ({what}) is damaged ({err}); delete it to recompute") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} ({what}) is damaged (not a mapping); delete it to recompute")
    return data


def file_digest(path: str) -> str:
    """SHA-256 (first 16 hex digits) of a file: ties cached runs to their inputs."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def text_digest(text: str) -> str:
    """SHA-256 (first 16 hex digits) of a string, as :func:`file_digest` of a file."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_runs(path: str, settings: Dict, log=print) -> Dict:
    """The runs cached in ``path`` (``{"settings": ..., "runs": {...}}``), valid only for
    the ``settings`` (and input digests) they were made with: other settings raise
    :class:`ValueError` naming what differs. A file written before settings were recorded
    (a bare mapping of runs) is reused with a warning."""
    if not os.path.exists(path):
        return {}
    cached = read_cache(path, "cached runs")
    if "settings" not in cached:
        log(f"warning: {path} does not record the settings its runs were made with; its "
            "runs are reused unchecked")
        return cached
    if cached["settings"] != settings:
        saved = cached["settings"] if isinstance(cached["settings"], dict) else {}
        differ = sorted(k for k in set(settings) | set(saved)
                        if settings.get(k) != saved.get(k))
        raise ValueError(f"{path} holds runs made with other settings or inputs "
                         f"({', '.join(map(str, differ))}); use another --output-dir or "
                         "delete it")
    runs = cached.get("runs")
    if not isinstance(runs, dict):
        raise ValueError(f"{path} (cached runs) is damaged; delete it to recompute")
    return runs


def write_runs(path: str, settings: Dict, runs: Dict) -> None:
    """Write ``runs`` with their ``settings`` through a temporary file renamed into place."""
    with atomic_write(path) as fh:
        json.dump(dict(settings=settings, runs=runs), fh, indent=1)


def as_script(main) -> None:
    """Run a reproduction's ``main()`` as a script: in a process whose ``malloc`` keeps
    freed memory for reuse, as the ``glomo`` command does
    (:func:`glomo_pyg.allocator.keep_freed_memory`; ``GLOMO_MALLOC=system`` leaves it)."""
    from glomo_pyg.allocator import keep_freed_memory

    try:
        keep_freed_memory()
    except ValueError as err:
        raise SystemExit(str(err)) from None
    main()


def run_reporting_errors(name: str, function, *args) -> None:
    """``function(*args)``; bad input (a ``ValueError`` or ``OSError``: files, options,
    caches) ends with one line naming it instead of a traceback (``GLOMO_TRACEBACK=1``
    shows the traceback)."""
    try:
        function(*args)
    except (ValueError, OSError) as err:
        if os.environ.get("GLOMO_TRACEBACK"):
            raise
        raise SystemExit(f"{name}: {err}") from None


def check_common_arguments(args, output_files) -> None:
    """The options both reproductions share, checked before any stage: ``--seeds`` and
    ``--epochs`` (None or >= 1), ``--accelerator``, ``--output-dir`` and the files the
    run will write (``output_files``)."""
    from glomo_pyg.io.paths import check_output_file, check_output_folder
    from glomo_pyg.training.pretrain.config import _accelerators

    for name in ("seeds", "epochs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be >= 1, got {value}")
    if args.accelerator not in _accelerators():
        raise ValueError(f"--accelerator must be one of {_accelerators()}, got "
                         f"{args.accelerator!r}")
    for path in output_files:
        check_output_file(path)
    check_output_folder(args.output_dir or ".")
