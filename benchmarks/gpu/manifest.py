"""The schema of a returned ``manifest.json``, checked before ingest writes anything.

A returned folder is untrusted (it may come from a shared folder): it may carry raw
outputs, never verdicts. Every field ingest reads is checked here for its type, range
and character set; strings that reach the results files and model cards are plain
(no Markdown, HTML or comment syntax), and the verdicts ingest computes itself (the
graph and syntax checks, the salvage marker) are refused when a run returns them.
"""
from __future__ import annotations

import datetime
import re
from typing import Any, Dict, List

RUN = re.compile(r"[0-9a-f]{12}\Z")        # runner: uuid4().hex[:12]
COMMIT = re.compile(r"[0-9a-f]{40}\Z")
DIGEST = re.compile(r"[0-9a-f]{16}\Z")     # campaign.recipe_hash
SHA256 = re.compile(r"[0-9a-f]{64}\Z")
DATE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?(Z|[+-]\d\d:\d\d)\Z")
# device names, versions, keys, statuses: printable, with none of < > | ` " \ and no "--"
PLAIN = re.compile(r"[A-Za-z0-9 .,:;_+=/()\[\]@#%&*~^{}!?'$-]{1,120}\Z")
KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
# what ingest computes: a run that returns one is refused (it would replace ingest's own)
VERDICTS = ("check", "check_images", "check_device", "syntax", "syntax_text",
            "syntax_sentences", "salvaged")
MAX_RUNS, MAX_TAIL, MAX_TAIL_CHARS = 1000, 100, 20000


class ManifestError(ValueError):
    """A manifest field of the wrong type, range or character set."""


def _fail(field: str, expected: str, value: Any) -> None:
    shown = repr(value)
    raise ManifestError(f"manifest field {field!r} must be {expected}, got "
                        f"{shown[:60] + '...' if len(shown) > 60 else shown}")


def plain(value: Any, field: str, optional: bool = False, dashes: bool = False) -> None:
    """``dashes``: allow '--' (a host name; it is never embedded in Markdown)."""
    if optional and value is None:
        return
    if not isinstance(value, str) or not PLAIN.match(value) or (
            "--" in value and not dashes):
        _fail(field, "a plain string (at most 120 letters, digits, spaces and .,:;_+=/()[]"
              "@#%&*~^{}!?'$-, no '--')", value)


def number(value: Any, field: str, optional: bool = False, minimum: float = 0.0) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        _fail(field, f"a finite number >= {minimum:g}" + (" or null" if optional else ""),
              value)


def integer(value: Any, field: str, optional: bool = False, minimum: int = 0) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        _fail(field, f"an integer >= {minimum}" + (" or null" if optional else ""), value)


def matches(value: Any, pattern: "re.Pattern", field: str, expected: str) -> None:
    if not isinstance(value, str) or not pattern.match(value):
        _fail(field, expected, value)


def _date(value: Any) -> None:
    matches(value, DATE, "date", "an ISO-8601 time with its offset "
            "(YYYY-MM-DDTHH:MM:SS+00:00)")
    try:
        datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        _fail("date", "a valid ISO-8601 time", value)


def _environment(env: Any) -> None:
    if not isinstance(env, dict):
        _fail("environment", "an object", env)
    plain(env.get("device"), "environment.device")
    for k, v in env.items():
        matches(k, KEY, "environment key", "an identifier")
        if isinstance(v, str):
            plain(v, f"environment.{k}", dashes=k == "host")
        elif v is not None and not isinstance(v, (bool, int, float)):
            _fail(f"environment.{k}", "a plain string, a number, true/false or null", v)


def _metrics(metrics: Any, where: str) -> None:
    if not isinstance(metrics, dict):
        _fail(f"{where}.metrics", "an object", metrics)
    for k in metrics:
        matches(k, KEY, f"{where}.metrics key", "an identifier")
    forged = [k for k in VERDICTS if k in metrics]
    if forged:
        raise ManifestError(f"manifest field '{where}.metrics' holds {forged}: verdicts are "
                            "computed by ingest, never taken from a returned folder")


def _runs(runs: Any) -> None:
    if not isinstance(runs, list) or len(runs) > MAX_RUNS:
        _fail("runs", f"a list of at most {MAX_RUNS} runs", runs)
    for i, r in enumerate(runs):
        if not isinstance(r, dict):
            _fail(f"runs[{i}]", "an object", r)
        plain(r.get("key"), f"runs[{i}].key")
        number(r.get("seconds"), f"runs[{i}].seconds", optional=True)
        _metrics(r.get("metrics"), f"runs[{i}]")


def _failures(failures: Any) -> None:
    if not isinstance(failures, list) or len(failures) > MAX_RUNS:
        _fail("failures", f"a list of at most {MAX_RUNS} failures", failures)
    for i, f in enumerate(failures):
        where = f"failures[{i}]"
        if not isinstance(f, dict):
            _fail(where, "an object", f)
        plain(f.get("key"), f"{where}.key")
        plain(f.get("status"), f"{where}.status")
        integer(f.get("returncode"), f"{where}.returncode", optional=True, minimum=-255)
        number(f.get("seconds"), f"{where}.seconds", optional=True)
        tail = f.get("tail", [])
        if not isinstance(tail, list) or len(tail) > MAX_TAIL or not all(
                isinstance(t, str) and len(t) <= MAX_TAIL_CHARS for t in tail):
            _fail(f"{where}.tail", f"a list of at most {MAX_TAIL} strings", tail)


def _files(listed: Any) -> None:
    if not isinstance(listed, dict):
        _fail("files", "an object", listed)
    for rel, meta in listed.items():
        if not isinstance(meta, dict):
            _fail(f"files[{rel!r}]", "an object", meta)
        integer(meta.get("bytes"), f"files[{rel!r}].bytes")
        matches(meta.get("sha256"), SHA256, f"files[{rel!r}].sha256", "64 lowercase hex")


REQUIRED = ("run", "slice", "recipe", "recipe_digest", "commit", "environment", "date",
            "runs", "files")


def check(m: Dict) -> Dict:
    """``m`` once every field ingest reads has its declared type, range and characters;
    else :class:`ManifestError` naming the field and what was expected."""
    for field in REQUIRED:
        if field not in m:
            raise ManifestError(f"the manifest has no {field!r}")
    matches(m["run"], RUN, "run", "12 lowercase hex digits (as the runner names a run)")
    plain(m["slice"], "slice")
    if not isinstance(m["recipe"], dict):
        _fail("recipe", "an object", m["recipe"])
    matches(m["recipe_digest"], DIGEST, "recipe_digest", "16 lowercase hex digits")
    matches(m["commit"], COMMIT, "commit",
            "40 lowercase hex digits (a full commit; anything else is a foreign commit)")
    for flag in ("dirty", "dry_run"):
        if not isinstance(m.get(flag, False), bool):
            _fail(flag, "true or false", m[flag])
    _environment(m["environment"])
    _date(m["date"])
    _runs(m["runs"])
    _failures(m.get("failures", []))
    _files(m["files"])
    return m


def pretraining_metrics(metrics: Any, where: str, salvaged: bool = False) -> None:
    """The fields a pretraining key's metrics are reported and carded with."""
    s = metrics.get("summary")
    if not isinstance(s, dict):
        _fail(f"{where}.summary", "an object", s)
    integer(s.get("steps"), f"{where}.summary.steps")
    number(s.get("seconds"), f"{where}.summary.seconds")
    if not salvaged:
        number(s.get("val_loss"), f"{where}.summary.val_loss", optional=True)
    for k in ("tokens", "vocabulary"):
        if k in s:
            integer(s[k], f"{where}.summary.{k}")
    if "init_vectors_found" in s:
        number(s["init_vectors_found"], f"{where}.summary.init_vectors_found")
    integer(metrics.get("steps"), f"{where}.steps")
    integer(metrics.get("graph_steps"), f"{where}.graph_steps")
    number(metrics.get("seconds_per_step"), f"{where}.seconds_per_step")
    if metrics.get("stopped_by") not in ("time", "max_steps"):
        _fail(f"{where}.stopped_by", "'time' or 'max_steps'", metrics.get("stopped_by"))
    number(metrics.get("step_ms"), f"{where}.step_ms", optional=True)
    if metrics.get("step_ms") is not None:
        integer(metrics.get("step_ms_steps"), f"{where}.step_ms_steps")
        integer(metrics.get("step_ms_from"), f"{where}.step_ms_from")


def runs_metrics(runs: List[Dict], check_one) -> None:
    for i, r in enumerate(runs):
        check_one(r["metrics"], f"runs[{i}].metrics")
