"""``ingest DIR``: check what a call returned, add it to the ledger, regenerate results.

A returned folder is untrusted. Each of its files is read once into a private copy that
ingest owns, and only the copy is checked and used. Refused, each with a named error
and before anything is written: a folder that breaks the limits of what a call returns
(links, special files, names with anything but letters, digits, '.', '_' and '-', too
deep, too many, too large), a file that would need unpickling, a manifest that is not
this campaign's or breaks its schema (:mod:`benchmarks.gpu.manifest`: types, ranges,
finite numbers, plain strings, bounded depth, no verdicts), a commit that is not in
this repository's history (or was dirty, for a real run), a recipe that is not the
slice's current one, a file whose size or digest differs from the manifest's (or that
the manifest does not list), a predictor of the wrong modality, a dry run into the real
ledger, and a run the ledger already records.

What ingest writes (the release, the results files, the ledger) is staged complete and
then renamed into place together: on any error before or during those renames, nothing
changes.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from typing import Dict, List, Optional, Tuple

from benchmarks.gpu import campaign, files, ledger, limits, report
from benchmarks.gpu import manifest as schema
from benchmarks.gpu.runner import FORMAT, ROOT, default_ledger


class IngestError(ValueError):
    """A returned folder that may not enter the ledger."""


def _known_commit(commit: str) -> bool:
    def ok(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True).returncode == 0
    # exactly 40 lowercase hex: git would also resolve 'HEAD~000...' or a short name
    return isinstance(commit, str) and schema.COMMIT.match(commit) is not None and \
        ok("cat-file", "-e", f"{commit}^{{commit}}") and \
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


def _copy_returned(folder: str, returned: Dict[str, int], private: str) -> Dict[str, Tuple]:
    """Each returned file read once into ``private``: ``{rel: (bytes, sha256)}`` of the
    copies. Nothing after reads the returned folder again (a file swapped in between a
    check and a use is never seen)."""
    try:
        return {rel: files.copy_private(folder, rel, private, limits.RETURN_FILE_BYTES)
                for rel in returned}
    except (ValueError, OSError) as err:
        raise IngestError(f"{folder}: {err}") from None


def _read_manifest(folder: str, private: str) -> Dict:
    where = f"{os.path.join(folder, files.MANIFEST)} (the run's manifest)"
    path = os.path.join(private, files.MANIFEST)
    if not os.path.isfile(path):
        raise IngestError(f"{where} is missing")
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        manifest = files.parse_json(raw, where)
    except ValueError as err:
        raise IngestError(str(err)) from None
    if manifest.get("format") != FORMAT:
        raise IngestError(f"{folder}/{files.MANIFEST} is not a campaign manifest ({FORMAT})")
    try:
        return schema.check(manifest)
    except ValueError as err:
        raise IngestError(f"{folder}/{files.MANIFEST}: {err}") from None


def _check_files(folder: str, private: str, copies: Dict[str, Tuple], listed: Dict) -> None:
    for rel in copies:
        if rel not in listed and rel not in (files.MANIFEST, files.CONSOLE):
            raise IngestError(f"{folder}/{rel} is not listed in the manifest")
        if _is_pickle(os.path.join(private, rel)):
            raise IngestError(f"{folder}/{rel} is a pickle (or torch.save archive): a returned "
                              "folder is untrusted and nothing in it is ever unpickled")
    for rel, meta in listed.items():
        path = os.path.join(folder, rel)
        if rel not in copies:
            raise IngestError(f"{path} is listed in the manifest but did not come back")
        if (meta["bytes"], meta["sha256"]) != copies[rel]:
            raise IngestError(f"{path}: its size or SHA-256 differs from the manifest's")


def check(folder: str, dry_run: bool = False, private: Optional[str] = None) -> Dict:
    """The manifest of ``folder`` once every check has passed, its files copied into
    ``private`` (a folder ingest owns; a temporary one, discarded, when not given)."""
    if private is None:
        with tempfile.TemporaryDirectory(prefix="glomo-ingest-") as tmp:
            return check(folder, dry_run, tmp)
    if not os.path.isdir(folder):
        raise IngestError(f"{folder} is not a folder")
    try:
        returned = dict(files.check_limits(folder))
    except ValueError as err:
        raise IngestError(str(err)) from None
    copies = _copy_returned(folder, returned, private)
    manifest = _read_manifest(folder, private)
    if manifest.get("dry_run", False) != dry_run:
        raise IngestError(f"{folder} holds a {'dry' if manifest.get('dry_run') else 'real'} "
                          f"run; ingest it {'with' if manifest.get('dry_run') else 'without'} "
                          "--dry-run (dry runs never enter the campaign's ledger)")
    name = manifest["slice"]
    try:
        mod = campaign.slice_module(name)
    except ValueError as err:
        raise IngestError(f"{folder}: {err}") from None
    commit = manifest["commit"]
    if not _known_commit(commit):
        raise IngestError(f"{folder} ran at commit {commit!r}, which is not in this "
                          "repository's history (a foreign commit)")
    if manifest.get("dirty") and not dry_run:
        raise IngestError(f"{folder} ran on a tree with uncommitted changes: its code is not "
                          f"commit {commit[:10]}")
    recipe = mod.recipe(dry_run)
    if campaign.recipe_digest(name, manifest["recipe"]) != manifest["recipe_digest"]:
        raise IngestError(f"{folder}: the manifest's recipe does not match its own digest")
    current = campaign.recipe_digest(name, recipe)
    if manifest["recipe_digest"] != current:
        raise IngestError(f"{folder} ran slice {name} with recipe {manifest['recipe_digest']}, "
                          f"not the slice's current recipe {current} (a foreign recipe)")
    _check_files(folder, private, copies, manifest["files"])
    keys = set(mod.keys(manifest["recipe"]))
    foreign = [r["key"] for r in manifest["runs"] if r["key"] not in keys]
    if foreign:
        raise IngestError(f"{folder}: runs {foreign} are not runs of the recipe")
    try:  # the fields the slice reports and cards, where it declares them
        for i, r in enumerate(manifest["runs"]):
            getattr(mod, "check_metrics", lambda m, w: None)(r["metrics"], f"runs[{i}].metrics")
    except ValueError as err:
        raise IngestError(f"{folder}/{files.MANIFEST}: {err}") from None
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


def _makedirs(folder: str, stages: List[str]) -> None:
    """``folder`` made where missing; each folder made is noted in ``stages`` (removed
    again, when still empty, if the transaction fails)."""
    missing = []
    while not os.path.isdir(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    for made in reversed(missing):
        os.mkdir(made)
        stages.append(made)


def _discard(stages: List[str]) -> None:
    for path in reversed(stages):
        if os.path.basename(path).startswith(".ingest-"):  # a staging folder
            shutil.rmtree(path, ignore_errors=True)
        else:  # a folder ingest made: kept if the transaction put something in it
            try:
                os.rmdir(path)
            except OSError:
                pass


def _stage_file(target: str, text: str, stages: List[str]) -> str:
    """``text`` written beside ``target`` (same folder: renaming it in is atomic)."""
    folder = os.path.dirname(os.path.abspath(target))
    _makedirs(folder, stages)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".ingest",
                               dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return tmp


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def commit(moves: List[Tuple[str, str]]) -> None:
    """Rename each staged ``(source, target)`` into place, all or none: a target that
    exists is first renamed aside, and on any error every step taken is undone."""
    done: List[Tuple[str, Optional[str]]] = []
    try:
        for source, target in moves:
            backup = None
            if os.path.lexists(target):
                backup = f"{os.path.dirname(os.path.abspath(target))}/." \
                         f"{os.path.basename(target)}.ingest-old-{secrets.token_hex(6)}"
                os.rename(target, backup)
            done.append((target, backup))
            os.rename(source, target)
    except BaseException:
        for target, backup in reversed(done):
            try:  # (each step undone on its own: one that fails leaves the others undone)
                if backup is None or os.path.lexists(backup):
                    _remove(target)
                if backup is not None and os.path.lexists(backup):
                    os.rename(backup, target)
            except OSError:
                pass
        raise
    for _, backup in done:
        if backup is not None:
            _remove(backup)


def _releases_fit(stage: str, root: str) -> None:
    """The total the releases may take, checked with the staged ones (write_release
    checks it against its own folder's siblings: here the staging folder's)."""
    from glomo_pyg.io.releases import MAX_RELEASES_BYTES, RELEASE_NAME

    def size(folder: str) -> int:
        return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))
    staged = set(os.listdir(stage))
    others = [n for n in (os.listdir(root) if os.path.isdir(root) else [])
              if n not in staged and RELEASE_NAME.fullmatch(n) and
              os.path.isfile(os.path.join(root, n, "config.json"))]
    total = sum(size(os.path.join(stage, n)) for n in staged) + \
        sum(size(os.path.join(root, n)) for n in others)
    if total > MAX_RELEASES_BYTES:
        raise IngestError(f"the releases would take {total / 2**20:.1f} MiB with this one, "
                          f"more than the {MAX_RELEASES_BYTES / 2**20:g} MiB they may")


def _stage_release(mod, new, private, manifest, root, log, shared_data,
                   stages: List[str]) -> List[Tuple[str, str]]:
    """The slice's release written into a staging folder beside ``root`` (removed by
    the caller, through ``stages``); the moves that put it in place."""
    from glomo_pyg.io.releases import replaceable_release_folder

    _makedirs(os.path.abspath(root), stages)
    stage = tempfile.mkdtemp(prefix=".ingest-", dir=root)
    stages.append(stage)
    try:  # (the slice reads only ingest's private copy of the returned files)
        mod.ingest(new, private, manifest, stage, log, shared_data=shared_data)
    except IngestError:
        raise
    except ValueError as err:
        raise IngestError(f"{manifest['slice']}: {err}") from None
    _releases_fit(stage, root)
    moves = [(os.path.join(stage, n), os.path.join(root, n)) for n in sorted(os.listdir(stage))]
    # the slice wrote into the fresh staging folder: the folders it will replace are checked
    # here, so a user's folder bearing a release's name is refused, not replaced
    taken = [target for _, target in moves if not replaceable_release_folder(target)]
    if taken:
        raise IngestError(f"{', '.join(taken)} exists and is not a release folder (it holds "
                          "other files); move it away or give another --releases-root")
    return moves


def _default_releases_root() -> str:
    from glomo_pyg.io.releases import releases_root as default_root

    return str(default_root())


def ingest(folder: str, ledger_path: Optional[str] = None, results_dir: Optional[str] = None,
           releases_root: Optional[str] = None, dry_run: bool = False, log=print,
           salvage: bool = False, shared_data: Optional[str] = None) -> List[Dict]:
    """Check ``folder``, append its runs to the ledger, write what the slice releases,
    and regenerate the results files. Returns the new ledger lines.

    One transaction: the returned files are read once into a private copy, the manifest
    checked against its schema, then the release, the results files and the new ledger
    are all staged and renamed into place together; on any error nothing changes.

    ``salvage`` also records the failed keys whose product came back (a key killed
    after saving what it makes), marked as salvaged; ``shared_data`` is the project's
    data folder (default ``../shared/data``) for slices that measure at ingest."""
    path = ledger_path or default_ledger()
    if dry_run and (_same(path, default_ledger()) or _inside(path, report.RESULTS_DIR) or
                    _inside(results_dir or report.RESULTS_DIR, report.RESULTS_DIR)):
        raise IngestError("a dry run never enters the campaign's ledger or results files: "
                          "give --ledger and --results-dir outside benchmarks/results")
    with tempfile.TemporaryDirectory(prefix="glomo-ingest-") as private:
        stages: List[str] = []
        try:
            new = _transaction(folder, path, results_dir, releases_root, dry_run, log,
                               salvage, shared_data, private, stages)
        except (KeyError, TypeError, AttributeError, IndexError) as err:
            # a shape the schema let through and a slice could not read: still refused,
            # and still before anything changed
            raise IngestError(f"{folder}: a returned value has a shape ingest cannot read "
                              f"({type(err).__name__}: {err}); nothing was written") from None
        finally:
            _discard(stages)
    return new


def _transaction(folder, path, results_dir, releases_root, dry_run, log, salvage,
                 shared_data, private, stages: List[str]) -> List[Dict]:
    manifest = check(folder, dry_run, private)
    mod = campaign.slice_module(manifest["slice"])
    if dry_run and hasattr(mod, "ingest") and (
            releases_root is None or _inside(releases_root, os.path.join(ROOT, "pretrained"))):
        raise IngestError(f"a dry run of {manifest['slice']} never writes the project's "
                          "releases: give --releases-root outside pretrained/")
    if salvage:
        manifest = dict(manifest, runs=manifest["runs"] + salvaged_runs(manifest),
                        failures=[])
    new = ledger_lines(manifest)
    ledger.check_new(path, new)  # runs the ledger already has: refused before any work
    moves: List[Tuple[str, str]] = []
    if hasattr(mod, "ingest") and new:
        root = releases_root or _default_releases_root()
        moves += _stage_release(mod, new, private, manifest, root, log,
                                shared_data or os.path.join(os.path.dirname(ROOT), "shared",
                                                            "data"), stages)
    _, ledger_text = ledger.staged(path, new)  # (with what the slice measured)
    # the results from the lines as the ledger will hold them (read back as JSON)
    results = report.render([json.loads(t) for t in ledger_text.splitlines()], results_dir,
                            dry_run)
    try:
        for target, text in list(results.items()) + [(path, ledger_text)]:
            moves.append((_stage_file(target, text, stages), target))
        commit(moves)
    except BaseException:
        for source, _ in moves:  # (a staged file or release not renamed into place)
            if os.path.lexists(source):
                _remove(source)
        raise
    log(f"ledger {path}: {len(new)} runs added from {folder} ({manifest['slice']}, "
        f"{manifest['environment'].get('device')})")
    for target in results:
        log(f"results: {target}")
    if manifest.get("failures"):
        log(f"not added (failed or timed out): {[f['key'] for f in manifest['failures']]}"
            + ("; --salvage records those whose product came back" if
               hasattr(mod, "salvage") else ""))
    return new
