"""The GPU sections of the results files, generated from the ledger.

Each slice owns one block of its results file, between ``<!-- gpu:SLICE begin -->`` and
``<!-- gpu:SLICE end -->``, right after the file's title: regenerating replaces the
block and leaves the rest of the file (the dated CPU sections) as it is.
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Optional

from benchmarks.gpu import campaign
from benchmarks.gpu.runner import ROOT
from glomo_pyg.atomic_files import atomic_write

RESULTS_DIR = os.path.join(ROOT, "benchmarks", "results")

# what a string embedded in generated Markdown must not bring: HTML, table cells, code
# spans, comment markers (a block's end marker would split the generated block)
_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "\\|", "`": "\\`", "\n": " ",
            "\r": " "}


def md(value) -> str:
    """``value`` as text to embed in generated Markdown (a run, a date, a device, a
    version, a key): no HTML, table cell, code span, line or comment marker of its own."""
    text = "".join(_ESCAPES.get(c, c) for c in str(value))
    while "--" in text:
        text = text.replace("--", "-&#45;")
    return text


def code(value, limit: int = 90) -> str:
    """``value`` inside a Markdown code span (no backtick or line break can end it)."""
    text = str(value)[:limit].replace("`", "'").replace("\n", " ").replace("\r", " ")
    return f"`{text}`"


class ReportError(ValueError):
    """A generated block that would not stay one block."""


def _begin(name: str) -> str:
    return f"<!-- gpu:{name} begin (generated from benchmarks/results/gpu/ledger.jsonl by " \
           "python -m benchmarks.gpu ingest; do not edit) -->"


def _end(name: str) -> str:
    return f"<!-- gpu:{name} end -->"


def replace_block(text: str, name: str, body: List[str]) -> str:
    block = "\n".join([_begin(name), *body, _end(name)]) + "\n"
    head = f"<!-- gpu:{name} begin"
    if head in text:
        start = text.index(head)
        end = text.index(_end(name), start) + len(_end(name))
        return text[:start] + block.rstrip("\n") + text[end:]
    ends = list(re.finditer(r"<!-- gpu:\S+ end -->", text))
    if ends:  # after the other slices' blocks, in the order they were added
        end = ends[-1].end()
        return text[:end] + "\n\n" + block.rstrip("\n") + text[end:]
    lines = text.split("\n")
    at = 1 if lines and lines[0].startswith("# ") else 0  # after the title
    return "\n".join(lines[:at] + ["", block] + lines[at:]).replace("\n\n\n\n", "\n\n")


def earlier_runs(mod, lines: List[Dict]) -> List[str]:
    """Runs of a slice recorded under recipes it no longer has: the slice's own
    ``report_earlier(lines)`` where it has one, else one line per run."""
    out = ["#### Runs of earlier recipes of this slice", ""]
    if hasattr(mod, "report_earlier"):
        return out + mod.report_earlier(lines)
    return out + [f"- {md(l['key'])}: run {md(l['run'])}, recipe {md(l['recipe'])}, "
                  f"{md(l['date'])}, {md(l['device'])} (the ledger holds its metrics)"
                  for l in lines] + [""]


_TAG = re.compile(r"<[/!?]?[A-Za-z]")  # the start of an HTML tag or declaration


def no_html(name: str, lines: List[str]) -> List[str]:
    """Markdown lines a run returned, refused if they hold an HTML tag outside a code
    span (a returned ``<script>`` would run wherever the results file is rendered)."""
    for line in lines:
        if not isinstance(line, str) or _TAG.search(re.sub(r"`[^`]*`", "", line)):
            raise ReportError(f"{name} returned a results line that is not plain Markdown: "
                              f"{str(line)[:80]!r}")
    return lines


def _no_markers(name: str, body: List[str]) -> List[str]:
    """Refuse a body that holds a comment marker: whatever a slice embeds, the block
    stays one block (a ``<!-- gpu:... end -->`` inside it would duplicate it)."""
    for line in body:
        if "<!--" in line or "-->" in line:
            raise ReportError(f"the generated block of {name} would hold a comment marker: "
                              f"{line[:80]!r}")
    return body


def render(lines: List[Dict], results_dir: Optional[str] = None,
           dry_run: bool = False) -> Dict[str, str]:
    """Every built slice's results file as regenerated from ``lines``, for the files
    that change: ``{path: new text}``; nothing is written."""
    folder = results_dir or RESULTS_DIR
    changed: Dict[str, str] = {}
    for name in campaign.ORDER:
        if name in campaign.NOT_BUILT:
            continue
        mod = campaign.slice_module(name)
        recipe = mod.recipe(dry_run)
        digest = campaign.recipe_digest(name, recipe)
        mine = [l for l in lines if l["slice"] == name and l["recipe"] == digest]
        path = os.path.join(folder, mod.RESULTS)
        if not mine and not os.path.exists(path) and path not in changed:
            continue
        why = getattr(mod, "blocked", lambda r: None)(recipe)
        body = mod.report(mine, recipe) if mine else [
            f"### GPU campaign: {name}", "",
            f"Pending: no run of this slice's recipe ({digest}) is in the "
            "ledger yet" + (f"; it {why}." if why else "."), ""]
        earlier = [l for l in lines if l["slice"] == name and l not in mine]
        if earlier:  # runs of an earlier recipe stay visible (and in the ledger)
            body += earlier_runs(mod, earlier)
        text = changed.get(path) or (open(path, encoding="utf-8").read() if
                                     os.path.exists(path) else f"# GPU campaign: {name}\n")
        new = replace_block(text, name, _no_markers(name, body))
        if new != text:
            changed[path] = new
    return changed


def regenerate(lines: List[Dict], results_dir: Optional[str] = None, dry_run: bool = False,
               log=print) -> List[str]:
    """Rewrite every built slice's block from ``lines``; returns the files written."""
    written = []
    for path, new in render(lines, results_dir, dry_run).items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with atomic_write(path) as fh:
            fh.write(new)
        written.append(path)
        log(f"results: {path}")
    return written
