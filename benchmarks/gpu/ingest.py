"""``ingest DIR``: check what a call returned, add it to the ledger, regenerate results.

Refused, each with a named error and before anything is written: a folder that breaks
the limits of what a call returns (links, special files, names with anything but letters,
digits, '.', '_' and '-', too deep, too many, too large), a file that would need
unpickling, a manifest that is not this campaign's, a commit
that is not in this repository's history (or was dirty, for a real run), a recipe that
is not the slice's current one, a file whose size or digest differs from the manifest's
(or that the manifest does not list), a dry run into the real ledger, and a run the
ledger already records.
"""
from __future__ import annotations

import os
import subprocess
from typing import Dict, List, Optional

from benchmarks.gpu import campaign, files, ledger, report
from benchmarks.gpu.runner import FORMAT, ROOT, default_ledger


class IngestError(ValueError):
    """A returned folder that may not enter the ledger."""


def _known_commit(commit: str) -> bool:
    def ok(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True).returncode == 0
    return len(commit) == 40 and ok("cat-file", "-e", f"{commit}^{{commit}}") and \
        ok("merge-base", "--is-ancestor", commit, "HEAD")


def _same(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder


PICKLE_SUFFIXES = (".pkl", ".pickle", ".pt", ".pth", ".ckpt", ".joblib", ".bin")


def _is_pickle(path: str) -> bool:
    """A file that only unpickling (``torch.load``, ``pickle``) would read: by its name,
    or by its first bytes (a pickle's protocol header, or the zip ``torch.save`` writes)."""
    if path.lower().endswith(PICKLE_SUFFIXES):
        return True
    with open(path, "rb") as fh:
        head = fh.read(4)
    return (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5) or \
        head == b"PK\x03\x04"


def check(folder: str, dry_run: bool = False) -> Dict:
    """The manifest of ``folder`` once every check has passed."""
    if not os.path.isdir(folder):
        raise IngestError(f"{folder} is not a folder")
    try:
        returned = dict(files.check_limits(folder))
        manifest = files.read_json(os.path.join(folder, files.MANIFEST), "the run's manifest")
    except ValueError as err:
        raise IngestError(str(err)) from None
    if manifest.get("format") != FORMAT:
        raise IngestError(f"{folder}/{files.MANIFEST} is not a campaign manifest ({FORMAT})")
    for field in ("run", "slice", "recipe", "recipe_digest", "commit", "environment", "date",
                  "runs", "files"):
        if field not in manifest:
            raise IngestError(f"{folder}/{files.MANIFEST} has no {field!r}")
    if not isinstance(manifest["environment"], dict) or not isinstance(manifest["run"], str):
        raise IngestError(f"{folder}/{files.MANIFEST}: 'environment' must be an object and "
                          "'run' a string")
    if bool(manifest.get("dry_run")) != dry_run:
        raise IngestError(f"{folder} holds a {'dry' if manifest.get('dry_run') else 'real'} "
                          f"run; ingest it {'with' if manifest.get('dry_run') else 'without'} "
                          "--dry-run (dry runs never enter the campaign's ledger)")
    name = manifest["slice"]
    try:
        mod = campaign.slice_module(name)
    except ValueError as err:
        raise IngestError(f"{folder}: {err}") from None
    commit = manifest["commit"]
    if not isinstance(commit, str) or not _known_commit(commit):
        raise IngestError(f"{folder} ran at commit {commit!r}, which is not in this "
                          "repository's history (a foreign commit)")
    if manifest.get("dirty") and not dry_run:
        raise IngestError(f"{folder} ran on a tree with uncommitted changes: its code is not "
                          f"commit {commit[:10]}")
    recipe = mod.recipe(dry_run)
    if not isinstance(manifest["recipe"], dict) or \
            campaign.recipe_digest(name, manifest["recipe"]) != manifest["recipe_digest"]:
        raise IngestError(f"{folder}: the manifest's recipe does not match its own digest")
    current = campaign.recipe_digest(name, recipe)
    if manifest["recipe_digest"] != current:
        raise IngestError(f"{folder} ran slice {name} with recipe {manifest['recipe_digest']}, "
                          f"not the slice's current recipe {current} (a foreign recipe)")
    listed = manifest["files"]
    if not isinstance(listed, dict):
        raise IngestError(f"{folder}/{files.MANIFEST}: 'files' must be an object")
    for rel in returned:
        if rel not in listed and rel not in (files.MANIFEST, files.CONSOLE):
            raise IngestError(f"{folder}/{rel} is not listed in the manifest")
        if _is_pickle(os.path.join(folder, rel)):
            raise IngestError(f"{folder}/{rel} is a pickle (or torch.save archive): a returned "
                              "folder is untrusted and nothing in it is ever unpickled")
    for rel, meta in listed.items():
        path = os.path.join(folder, rel)
        if rel not in returned:
            raise IngestError(f"{path} is listed in the manifest but did not come back")
        if not isinstance(meta, dict) or meta.get("bytes") != returned[rel] or \
                meta.get("sha256") != files.sha256(path):
            raise IngestError(f"{path}: its size or SHA-256 differs from the manifest's")
    if not isinstance(manifest["runs"], list) or not all(
            isinstance(r, dict) and isinstance(r.get("key"), str) and
            isinstance(r.get("metrics"), dict) for r in manifest["runs"]):
        raise IngestError(f"{folder}/{files.MANIFEST}: 'runs' must be a list of runs with a "
                          "key and metrics")
    keys = set(mod.keys(manifest["recipe"]))
    foreign = [r["key"] for r in manifest["runs"] if r["key"] not in keys]
    if foreign:
        raise IngestError(f"{folder}: runs {foreign} are not runs of the recipe")
    return manifest


def ledger_lines(manifest: Dict) -> List[Dict]:
    env = manifest["environment"]
    versions = {k: env.get(k) for k in ("python", "torch", "cuda", "cudnn", "lightning",
                                        "torch_geometric", "triton", "numpy")}
    return [dict(slice=manifest["slice"], recipe=manifest["recipe_digest"], key=r["key"],
                 run=manifest["run"], commit=manifest["commit"], date=manifest["date"],
                 device=str(env.get("device")), versions=versions, seconds=r.get("seconds"),
                 metrics=r["metrics"], dry_run=bool(manifest.get("dry_run")))
            for r in manifest["runs"]]


def salvaged_runs(manifest: Dict) -> List[Dict]:
    """The failed keys of ``manifest`` whose product came back and whose slice can
    rebuild their metrics from what came back (``salvage(failure, manifest)``), as runs
    marked ``salvaged`` in their metrics. A failure the slice cannot salvage is an
    :class:`IngestError` naming why."""
    mod = campaign.slice_module(manifest["slice"])
    failures = manifest.get("failures") or []
    if not failures:
        raise IngestError("--salvage: the run has no failed key to salvage")
    if not hasattr(mod, "salvage"):
        raise IngestError(f"--salvage: slice {manifest['slice']} cannot salvage a failed key")
    runs = []
    for f in failures:
        try:
            metrics = mod.salvage(f, manifest)
        except ValueError as err:
            raise IngestError(f"--salvage: {f.get('key')} cannot be salvaged: {err}") from None
        metrics["salvaged"] = dict(status=f.get("status"), returncode=f.get("returncode"))
        runs.append(dict(key=f["key"], seconds=f.get("seconds"), metrics=metrics))
    return runs


def ingest(folder: str, ledger_path: Optional[str] = None, results_dir: Optional[str] = None,
           releases_root: Optional[str] = None, dry_run: bool = False, log=print,
           salvage: bool = False, shared_data: Optional[str] = None) -> List[Dict]:
    """Check ``folder``, append its runs to the ledger, write what the slice releases,
    and regenerate the results files. Returns the new ledger lines.

    ``salvage`` also records the failed keys whose product came back (a key killed
    after saving what it makes), marked as salvaged; ``shared_data`` is the project's
    data folder (default ``../shared/data``) for slices that measure at ingest."""
    path = ledger_path or default_ledger()
    if dry_run and (_same(path, default_ledger()) or _inside(path, report.RESULTS_DIR) or
                    _inside(results_dir or report.RESULTS_DIR, report.RESULTS_DIR)):
        raise IngestError("a dry run never enters the campaign's ledger or results files: "
                          "give --ledger and --results-dir outside benchmarks/results")
    manifest = check(folder, dry_run)
    mod = campaign.slice_module(manifest["slice"])
    if dry_run and hasattr(mod, "ingest") and (
            releases_root is None or _inside(releases_root, os.path.join(ROOT, "pretrained"))):
        raise IngestError(f"a dry run of {manifest['slice']} never writes the project's "
                          "releases: give --releases-root outside pretrained/")
    if salvage:
        manifest = dict(manifest, runs=manifest["runs"] + salvaged_runs(manifest),
                        failures=[])
    new = ledger_lines(manifest)
    ledger.check_new(path, new)  # runs the ledger already has: refused before any write
    if hasattr(mod, "ingest") and new:  # (a refused release leaves the ledger as it was)
        mod.ingest(new, folder, manifest, releases_root, log,
                   shared_data=shared_data or os.path.join(os.path.dirname(ROOT), "shared",
                                                           "data"))
    ledger.append(path, new)
    log(f"ledger {path}: {len(new)} runs added from {folder} ({manifest['slice']}, "
        f"{manifest['environment'].get('device')})")
    if manifest.get("failures"):
        log(f"not added (failed or timed out): {[f['key'] for f in manifest['failures']]}"
            + ("; --salvage records those whose product came back" if
               hasattr(mod, "salvage") else ""))
    report.regenerate(ledger.read(path), results_dir, dry_run, log)
    return new
