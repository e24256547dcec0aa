"""``prepare`` (CPU machine) and ``run`` (GPU machine) of one slice.

``prepare`` fills one git-ignored folder (``.gpu/`` by default) with exactly what the
slice needs beside the tree: its data archives, and ``slice.json`` (the slice, its
recipe and digest, the keys the ledger does not have yet, the commit). ``run`` reads it
there, builds the data, runs the keys in order, each in its own process with the time
left (a hung or crashed run costs only itself), stops before ``--budget-s``, and writes
``manifest.json`` beside what the runs wrote: the environment, every run's metrics and
seconds, and the size and SHA-256 of every file that comes back.
"""
from __future__ import annotations

import datetime
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Dict, List, Optional, Tuple

from benchmarks.gpu import campaign, data, files, ledger, limits

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARRY = ".gpu"
SLICE_FILE = "slice.json"
MARKER = ".glomo-gpu-carry"  # a carry folder holds this: prepare empties only such folders
RESERVE_S = 15.0  # kept for the manifest and the digests after the last run
FORMAT = "glomo-gpu-slice/1"


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True,
                              text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as err:
        raise ValueError(f"git {' '.join(args)} failed in {ROOT} ({err}); the campaign "
                         "records the commit that ran, so it needs the git checkout") from None


def travelling_bytes() -> int:
    """Bytes of the working tree a call carries: tracked files and untracked files git
    does not ignore."""
    names = git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    total = 0
    for name in filter(None, names):
        path = os.path.join(ROOT, name)
        if os.path.isfile(path) and not os.path.islink(path):
            total += os.path.getsize(path)
    return total


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(top, n)) for top, _, names in os.walk(folder)
               for n in names)


def carry_folder(path: str) -> str:
    """``path`` as a carry folder: inside the checkout and ignored by git (else it would
    travel twice, or be committed)."""
    full = os.path.abspath(path)
    if os.path.commonpath([full, ROOT]) != ROOT or full == ROOT:
        raise ValueError(f"the carry folder {path} must lie inside the checkout {ROOT}")
    rel = os.path.relpath(full, ROOT)
    if subprocess.run(["git", "check-ignore", "-q", rel + "/"], cwd=ROOT).returncode != 0:
        raise ValueError(f"the carry folder {rel}/ is not ignored by git: add it to .gitignore "
                         "(it would travel as part of the tree, or be committed)")
    return full


def _chosen_keys(name: str, digest: str, todo: List[str],
                 keys: Optional[List[str]]) -> List[str]:
    """The keys a call runs: ``keys`` (checked to be distinct pending keys) or ``todo``."""
    if keys is not None:
        unknown = [k for k in keys if k not in todo]
        if unknown or len(set(keys)) != len(keys) or not keys:
            raise ValueError(f"slice {name!r}: --keys must name distinct pending runs of its "
                             f"recipe {digest}; not pending: {unknown or 'none given'}")
        todo = list(keys)
    if not todo:
        raise ValueError(f"slice {name!r}: the ledger records every run of its recipe "
                         f"{digest}; nothing to prepare")
    return todo


def _checked_commit(dry_run: bool) -> Tuple[str, bool]:
    """The commit of HEAD and whether the tree is dirty (refused unless ``dry_run``)."""
    commit = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=normal"))
    if dirty and not dry_run:
        raise ValueError("the working tree has uncommitted changes: commit them first, so the "
                         "ledger's commit is the code that ran (git status)")
    return commit, dirty


def _empty_carry(carry: str) -> str:
    """The carry folder, emptied (refused unless prepare made it) and marked; its path."""
    folder = carry_folder(carry)
    if os.path.exists(folder):
        if os.listdir(folder) and not os.path.exists(os.path.join(folder, MARKER)):
            raise ValueError(f"{carry} exists and was not made by prepare; move it away")
        shutil.rmtree(folder)
    os.makedirs(os.path.join(folder, "data"))
    open(os.path.join(folder, MARKER), "w").close()
    return folder


def _copy_archives(mod, folder: str, shared_data: Optional[str], dry_run: bool) -> List[str]:
    """The slice's data archives written into ``folder``/data (toy ones on a dry run)."""
    if dry_run:
        return data.write_toy_archives(list(mod.ARCHIVES), os.path.join(folder, "data"))
    source = shared_data or os.path.join(os.path.dirname(ROOT), "shared", "data")
    paths = []
    for archive in mod.ARCHIVES:
        src = os.path.join(source, archive)
        if not os.path.isfile(src):
            raise ValueError(f"{src} is missing (--shared-data: the project's data folder)")
        paths.append(os.path.join(folder, "data", archive))
        shutil.copyfile(src, paths[-1])
    return paths


def _file_digests(paths: List[str]) -> Dict[str, Dict]:
    """The size and SHA-256 of each file, by its base name."""
    return {os.path.basename(path): dict(bytes=os.path.getsize(path), sha256=files.sha256(path))
            for path in paths}


def _prepare_extra(mod, folder: str, paths: List[str], recipe: Dict, log) -> Dict[str, Dict]:
    """Size and SHA-256 of what ``mod.prepare_extra`` made in ``folder``/extra to carry."""
    # (made here, carried: e.g. word vectors, no gensim there)
    if not hasattr(mod, "prepare_extra"):
        return {}
    extra = os.path.join(folder, "extra")
    os.makedirs(extra)
    mod.prepare_extra(extra, paths, recipe, log)
    return _file_digests([os.path.join(extra, n) for n in sorted(os.listdir(extra))])


def _ledger_name(ledger_path: Optional[str]) -> str:
    """The ledger's path, relative to the checkout when inside it."""
    ledger_file = os.path.abspath(ledger_path or default_ledger())
    return (os.path.relpath(ledger_file, ROOT)
            if os.path.commonpath([ledger_file, ROOT]) == ROOT else ledger_file)


def _check_travel(folder: str, carry: str) -> Tuple[int, int]:
    """Bytes of the tree and of ``folder`` a call carries (over the limit: folder removed)."""
    tree, carried = travelling_bytes(), folder_bytes(folder)
    if tree + carried > limits.CARRY_BYTES:
        shutil.rmtree(folder)  # (else run would take it for a prepared slice)
        raise ValueError(f"the call would carry {(tree + carried) / limits.MIB:.1f} MiB (tree "
                         f"{tree / limits.MIB:.1f} + {carry} {carried / limits.MIB:.1f}), over "
                         f"the {limits.CARRY_BYTES // limits.MIB} MiB limit")
    return tree, carried


def prepare(name: str, carry: str = CARRY, shared_data: Optional[str] = None,
            ledger_path: Optional[str] = None, dry_run: bool = False, log=print,
            keys: Optional[List[str]] = None) -> Dict:
    """Fill ``carry`` for slice ``name``; returns the slice description it wrote. The
    call runs ``keys`` in that order (each a pending key of the recipe), by default
    every pending key in the campaign's order (:func:`schedule.ordered_pending`)."""
    from benchmarks.gpu import schedule

    mod = campaign.slice_module(name)
    recipe = mod.recipe(dry_run)
    digest = campaign.recipe_digest(name, recipe)
    todo = schedule.ordered_pending(name, ledger.read(ledger_path or default_ledger()),
                                    dry_run)
    keys = _chosen_keys(name, digest, todo, keys)
    commit, dirty = _checked_commit(dry_run)
    folder = _empty_carry(carry)
    paths = _copy_archives(mod, folder, shared_data, dry_run)
    archives = _file_digests(paths)
    extra = _prepare_extra(mod, folder, paths, recipe, log)
    description = dict(format=FORMAT, slice=name, recipe=recipe,
                       recipe_digest=digest, keys=keys, commit=commit,
                       ledger=_ledger_name(ledger_path),
                       dirty=dirty, dry_run=dry_run, archives=archives, extra=extra,
                       prepared=datetime.datetime.now(datetime.timezone.utc).isoformat(
                           timespec="seconds"))
    files.write_json(os.path.join(folder, SLICE_FILE), description)
    tree, carried = _check_travel(folder, carry)
    description["travel_bytes"] = dict(tree=tree, carry=carried)
    log(f"prepared {name} ({len(keys)} pending runs: {', '.join(keys[:6])}"
        f"{' ...' if len(keys) > 6 else ''}) in {os.path.relpath(folder, ROOT)}/: the call "
        f"carries {(tree + carried) / limits.MIB:.1f} of {limits.CARRY_BYTES // limits.MIB} MiB "
        f"(tree {tree / limits.MIB:.1f}, {carry} {carried / limits.MIB:.1f})")
    return description


def default_ledger() -> str:
    return os.path.join(ROOT, "benchmarks", "results", "gpu", "ledger.jsonl")


def device_command(name: str, budget_s: int = int(limits.LIMITS.call_budget_s),
                   carry: str = CARRY, python: str = "python3") -> str:
    """The command the device call runs for slice ``name`` (``python``: the device's
    interpreter; a local rehearsal passes ``shlex.quote(sys.executable)``)."""
    return (f"set -o pipefail; PYTHONUNBUFFERED=1 {python} -m benchmarks.gpu run "
            f"{name} --budget-s {budget_s} --carry {carry} --out \"$OUT\" 2>&1 | "
            f"tee \"$OUT/{files.CONSOLE}\"")


def chained_command(slices: List[Tuple[str, Optional[float]]], carries: List[str],
                    budget_s: int = int(limits.LIMITS.call_budget_s),
                    dry_run: bool = False, python: str = "python3") -> str:
    """One device call running several prepared slices in turn, each into ``$OUT/NAME``
    (ingest each folder): a slice with a budget gets it, one with ``None`` gets what is
    left of ``budget_s`` since the call began; the console log covers them all.
    ``python`` as in :func:`device_command`."""
    runs = []
    for (name, budget), carry in zip(slices, carries):
        seconds = f"{budget:.0f}" if budget is not None else \
            f"$((t0 + {budget_s} - $(date +%s)))"
        runs.append(f"{python} -m benchmarks.gpu run {name} --budget-s {seconds} "
                    f"--carry {carry} --out \"$OUT/{name}\"" + (" --dry-run" if dry_run else ""))
    return ("set -o pipefail; export PYTHONUNBUFFERED=1; t0=$(date +%s); { "
            + "; ".join(runs) + f"; }} 2>&1 | tee \"$OUT/{files.CONSOLE}\"")


def environment(device: str) -> Dict:
    import numpy
    import torch

    env = dict(python=platform.python_version(), torch=torch.__version__,
               numpy=numpy.__version__, cuda=torch.version.cuda, host=platform.node(),
               cpus=os.cpu_count())
    for module in ("lightning", "torch_geometric", "triton"):
        try:
            env[module] = __import__(module).__version__
        except ImportError:
            env[module] = None
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(device=props.name, capability=f"{props.major}.{props.minor}",
                   memory_gib=round(props.total_memory / 2**30, 1),
                   multiprocessors=props.multi_processor_count,
                   cudnn=torch.backends.cudnn.version())
    else:
        env["device"] = f"CPU ({platform.processor() or platform.machine()}, " \
                        f"{torch.get_num_threads()} threads)"
    return env


def finite(value):
    """``value`` with non-finite floats as None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


class _Log:
    def __init__(self, path: str):
        self.fh = open(path, "a", encoding="utf-8")

    def __call__(self, *args) -> None:
        text = time.strftime("[%H:%M:%S] ") + " ".join(str(a) for a in args)
        print(text, flush=True)
        self.fh.write(text + "\n")
        self.fh.flush()


def _run_item(ctx: campaign.Context, keys: List[str], log) -> List[Dict]:
    """``keys`` in order in one process, killed at ``ctx.deadline``; its output goes to the
    log. The process records each key's metrics as soon as the key is done, so a kill or a
    crash loses only the key in progress. Returns one result per key it started."""
    ctx_path = os.path.join(ctx.work, f"item-{uuid.uuid4().hex[:8]}.json")
    result_path = ctx_path[:-5] + ".result.json"
    files.write_json(ctx_path, dict(ctx.to_json(), keys=keys, result=result_path))
    start = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.gpu", "_item", ctx_path],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True,
                            preexec_fn=_die_with_parent)
    timed_out = threading.Event()

    def watchdog():
        if _wait(proc, ctx.deadline - time.time()) is None:
            timed_out.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    threading.Thread(target=watchdog, daemon=True).start()
    tail: List[str] = []
    for line in proc.stdout:
        line = line.rstrip("\n")
        if "\r" in line:  # progress bars: keep their last state only
            line = line.rsplit("\r", 1)[-1]
        log(f"  {keys[0] if len(keys) == 1 else ctx.slice}: {line}")
        tail = (tail + [line])[-20:]
    proc.wait()
    try:  # what the run left behind (compile workers, data loaders) goes with it
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    done = files.read_json(result_path, "results of the runs") if os.path.exists(result_path) \
        else dict(results=[])
    out = [dict(r, status="ok") for r in done["results"]] + \
        [dict(r, status="failed") for r in done.get("failed", [])]
    started = done.get("started")
    if started is not None and started not in {r["key"] for r in out}:
        status = "timeout" if timed_out.is_set() else "failed"
        out.append(dict(key=started, status=status, returncode=proc.returncode, tail=tail,
                        seconds=round(time.time() - done.get("started_at", start), 1)))
    elif not out and proc.returncode != 0:  # (died before its first key)
        out.append(dict(key=keys[0], status="timeout" if timed_out.is_set() else "failed",
                        returncode=proc.returncode, tail=tail,
                        seconds=round(time.time() - start, 1)))
    return out


def _die_with_parent() -> None:
    """In the child, before it runs: killed when the runner dies (the device tool spares
    processes of a new session, which would hold the GPU after a killed call)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _wait(proc, timeout: float):
    try:
        return proc.wait(timeout=max(0.0, timeout))
    except subprocess.TimeoutExpired:
        return None


def _check_prepared(name: str, carry: str, dry_run: bool) -> Tuple[Dict, object, Dict,
                                                                    List[str], List[str]]:
    """The prepared slice in ``carry``, checked against this tree: its description, the
    slice module, the recipe, the keys left to run and the carried archives."""
    folder = os.path.abspath(carry)
    description = files.read_json(os.path.join(folder, SLICE_FILE), "the prepared slice")
    if description.get("format") != FORMAT or description.get("slice") != name:
        raise ValueError(f"{carry}/{SLICE_FILE} prepares {description.get('slice')!r}, not "
                         f"{name!r}: run prepare {name} first")
    if bool(description.get("dry_run")) != dry_run:
        raise ValueError(f"{carry} was prepared "
                         f"{'with' if description.get('dry_run') else 'without'}"
                         f" --dry-run; run it the same way")
    mod = campaign.slice_module(name)
    recipe = mod.recipe(dry_run)
    digest = campaign.recipe_digest(name, recipe)
    if digest != description.get("recipe_digest"):
        raise ValueError(f"the tree's recipe for {name} ({digest}) is not the "
                         f"prepared one ({description.get('recipe_digest')}): prepare again")
    keys = list(description["keys"])
    carried = os.path.join(ROOT, description.get("ledger", "")) if description.get("ledger") \
        else None
    if carried and os.path.isfile(carried):  # a stale prepare: never rerun a recorded run
        recorded = ledger.recorded_keys(ledger.read(carried), name, digest)
        keys = [k for k in keys if k not in recorded]
        if not keys:
            raise ValueError(f"{carried} records every run {carry}/{SLICE_FILE} prepared: "
                             "run prepare again")
    archives = []
    for archive, meta in description["archives"].items():
        path = os.path.join(folder, "data", archive)
        if not os.path.isfile(path) or files.sha256(path) != meta["sha256"]:
            raise ValueError(f"{path} is missing or not the archive prepare carried")
        archives.append(path)
    for n, meta in description.get("extra", {}).items():
        path = os.path.join(folder, "extra", n)
        if not os.path.isfile(path) or files.sha256(path) != meta["sha256"]:
            raise ValueError(f"{path} is missing or not the file prepare carried")
    return description, mod, recipe, keys, archives


def _run_keys(mod, keys: List[str], log, **context) -> Tuple[List[Dict], List[Dict], List[str]]:
    """Run ``keys`` (in processes of the slice's ``KEYS_PER_PROCESS``) while time is left:
    the runs that succeeded, those that failed and the keys left for a later call."""
    runs, failures = [], []
    todo = keys
    per_process = getattr(mod, "KEYS_PER_PROCESS", 1)  # None: all keys in one process
    while todo:
        ctx = campaign.Context(**context)
        if ctx.seconds_left() < mod.min_seconds(todo[0], context["recipe"]):
            break
        batch = todo if per_process is None else todo[:per_process]
        log(f"{', '.join(batch) if len(batch) < 4 else f'{len(batch)} runs'}: starting "
            f"({ctx.seconds_left():.0f} s left)")
        results = _run_item(ctx, batch, log)
        for result in results:
            log(f"{result['key']}: {result['status']} in {result['seconds']} s")
            (runs if result["status"] == "ok" else failures).append(finite(result))
        started = {r["key"] for r in results}
        todo = [k for k in todo if k not in started]
        if per_process is None or not results:  # (the process ran what time allowed)
            break
    return runs, failures, todo


def _listed_files(out: str) -> Dict[str, Dict]:
    """Size and SHA-256 of every returned file but the manifest, the console and links."""
    listed = {}
    for top, _, names in os.walk(out):
        for n in names:
            rel = os.path.relpath(os.path.join(top, n), out)
            if rel not in (files.MANIFEST, files.CONSOLE) and not os.path.islink(
                    os.path.join(out, rel)):
                listed[rel] = dict(bytes=os.path.getsize(os.path.join(out, rel)),
                                   sha256=files.sha256(os.path.join(out, rel)))
    return listed


def run(name: str, budget_s: float, carry: str = CARRY, out: Optional[str] = None,
        dry_run: bool = False, work: Optional[str] = None) -> Dict:
    """Run slice ``name`` as prepared in ``carry`` within ``budget_s`` seconds; writes the
    manifest into ``out`` and returns it."""
    start = time.time()
    if budget_s < 2 * RESERVE_S:
        raise ValueError(f"--budget-s must be at least {2 * RESERVE_S:.0f}, got {budget_s}")
    out = out or os.environ.get("OUT")
    if not out:
        raise ValueError("--out is not given and $OUT is not set")
    os.makedirs(out, exist_ok=True)
    description, mod, recipe, keys, archives = _check_prepared(name, carry, dry_run)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not dry_run:
        raise ValueError("no GPU here: a real slice runs on the GPU machine (--dry-run "
                         "rehearses it on the CPU)")
    log = _Log(os.path.join(out, "run.log"))
    env = environment(device)
    log(f"slice {name} (recipe {description['recipe_digest']}, commit "
        f"{description['commit'][:10]}{' dirty' if description.get('dirty') else ''}) on "
        f"{env['device']}; torch {env['torch']}, CUDA {env['cuda']}; budget {budget_s:.0f} s")
    work = work or tempfile.mkdtemp(prefix="glomo-gpu-")
    data_dir = os.path.join(work, "data")
    os.makedirs(data_dir, exist_ok=True)
    data_start = time.time()
    data.build(archives, data_dir, log)
    data_seconds = round(time.time() - data_start, 1)
    runs, failures, skipped = _run_keys(
        mod, keys, log, slice=name, recipe=recipe, dry_run=dry_run, data_dir=data_dir,
        out=out, work=work, deadline=start + budget_s - RESERVE_S, device=device,
        extra=os.path.join(os.path.abspath(carry), "extra"))
    if skipped:
        log(f"left for a later call (not enough time): {', '.join(skipped)}")
    manifest = dict(format=FORMAT, run=uuid.uuid4().hex[:12], slice=name,
                    recipe=recipe, recipe_digest=description["recipe_digest"],
                    carried=description.get("extra", {}),
                    commit=description["commit"], dirty=description.get("dirty", False),
                    dry_run=dry_run, environment=env,
                    date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    budget_s=budget_s, data_s=data_seconds, runs=runs, failures=failures,
                    skipped=skipped)
    manifest["wall_s"] = round(time.time() - start, 1)
    log(f"done: {len(runs)} runs, {len(failures)} failed, {len(skipped)} left; "
        f"{manifest['wall_s']} s")
    log.fh.close()
    manifest["files"] = _listed_files(out)
    files.write_json(os.path.join(out, files.MANIFEST), manifest)
    files.check_limits(out)  # (the manifest is written first: a call that broke them is
    return manifest          # refused by ingest, and its manifest says what ran)


def _free_gpu_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_item(ctx_path: str) -> None:
    """The child process of :func:`_run_item`: keys of one slice, in order, while the
    time left is at least what each needs."""
    spec = files.read_json(ctx_path, "run context")
    for blocked in filter(None, os.environ.get("GLOMO_GPU_BLOCK_MODULES", "").split(",")):
        sys.modules[blocked] = None  # the dry run: packages the GPU machine's image lacks
    keys, result_path = spec.pop("keys"), spec.pop("result")
    ctx = campaign.Context(**spec, log=lambda *a: print(*a, flush=True))
    if ctx.device == "cpu":
        import torch

        torch.set_num_threads(max(1, min(os.cpu_count() or 1, 2)))
    mod = campaign.slice_module(ctx.slice)
    done: Dict = dict(results=[])
    for key in keys:
        if done["results"] and ctx.seconds_left() < mod.min_seconds(key, ctx.recipe):
            break  # (the first key was judged by the parent)
        done.update(started=key, started_at=time.time())
        files.write_json(result_path, done)
        start = time.time()
        try:
            if key in os.environ.get("GLOMO_GPU_FAIL_KEYS", "").split(","):
                raise RuntimeError(f"{key}: a failure injected by GLOMO_GPU_FAIL_KEYS")
            metrics = mod.run_key(key, ctx)
        except Exception:  # recorded; the next key still runs (an OOM frees its memory)
            import traceback

            traceback.print_exc()
            done.setdefault("failed", []).append(dict(
                key=key, seconds=round(time.time() - start, 1),
                error=traceback.format_exc(limit=8)[-4000:]))
            done.pop("started")
            files.write_json(result_path, done)
            _free_gpu_memory()
            continue
        done["results"].append(dict(key=key, seconds=round(time.time() - start, 1),
                                    metrics=finite(metrics)))
        done.pop("started")
        files.write_json(result_path, done)
