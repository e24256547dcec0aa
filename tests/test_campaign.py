"""The GPU campaign's harness (``benchmarks.gpu``) on the CPU: the profile slice's dry
run end to end once (prepare, run, ingest), then what each step refuses."""
import glob
import json
import os
import shlex
import shutil
import sys
import types

import pytest
import torch

from benchmarks.gpu import campaign, data, files, ingest, ledger, limits, report, runner, schedule
from benchmarks.gpu.__main__ import main
from benchmarks.gpu.ingest import IngestError
from benchmarks.gpu.ledger import LedgerError
from benchmarks.gpu.slices import profile

ROOT = runner.ROOT
PROFILE_KEYS = list(profile.KEYS)


def quiet(*args):
    pass


def _carry_name(tag: str = "") -> str:
    return os.path.join(ROOT, f".gpu-test-{os.getpid()}{tag}")


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    """The profile slice's dry run, once: prepare (toy data), run (each key in its own
    process, gensim and conllu blocked as on the GPU machine)."""
    base = tmp_path_factory.mktemp("profile-dry-run")
    carry = _carry_name()
    ledger_path = str(base / "ledger.jsonl")
    out, work = str(base / "out"), str(base / "work")
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("GLOMO_GPU_BLOCK_MODULES", "gensim,conllu")
            description = runner.prepare("profile", carry, None, ledger_path, dry_run=True,
                                         log=quiet)
            manifest = runner.run("profile", 600, carry, out, dry_run=True, work=work)
        yield types.SimpleNamespace(carry=carry, description=description, manifest=manifest,
                                    out=out, ledger=ledger_path)
    finally:
        shutil.rmtree(carry, ignore_errors=True)


@pytest.fixture
def returned(dry, tmp_path):
    """A fresh copy of the folder the dry run returned."""
    folder = str(tmp_path / "returned")
    shutil.copytree(dry.out, folder)
    return folder


def _ingest(folder, tmp_path, **kw):
    kw.setdefault("ledger_path", str(tmp_path / "ledger.jsonl"))
    kw.setdefault("results_dir", str(tmp_path / "results"))
    kw.setdefault("dry_run", True)
    return ingest.ingest(folder, log=quiet, **kw)


def _edit_manifest(folder, edit):
    path = os.path.join(folder, files.MANIFEST)
    with open(path, encoding="utf-8") as fh:
        manifest = json.load(fh)
    edit(manifest)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh)


# -- the dry run --------------------------------------------------------------------------

def test_dry_run_runs_every_key_of_the_profile_recipe(dry):
    m = dry.manifest
    assert m["format"] == runner.FORMAT and m["slice"] == "profile" and m["dry_run"] is True
    recipe = profile.recipe(True)
    assert m["recipe"] == recipe and m["recipe_digest"] == campaign.recipe_hash(recipe)
    assert m["failures"] == [] and m["skipped"] == []
    assert [r["key"] for r in m["runs"]] == profile.keys(recipe) == PROFILE_KEYS
    for r in m["runs"]:
        assert r["status"] == "ok", r
        assert r["seconds"] >= 0
        metrics = r["metrics"]
        if r["key"] == "cuda-tests":
            assert metrics["tests"] >= 1 and metrics["failures"] == metrics["errors"] == 0
            if not torch.cuda.is_available():
                assert metrics["skipped"] == metrics["tests"] and metrics["passed"] == 0
            continue
        for field in ("median_ms", "mean_ms", "first_step_s", "top"):
            assert field in metrics, (r["key"], field)
        assert metrics["median_ms"] > 0 and metrics["steps"] == recipe["steps"]
    assert m["environment"]["device"].startswith("CPU")
    assert m["commit"] == dry.description["commit"] and ingest._known_commit(m["commit"])


def test_dry_run_returns_what_a_call_may_return(dry):
    returned = dict(files.check_limits(dry.out))
    assert files.MANIFEST in returned and "run.log" in returned
    listed = dry.manifest["files"]
    assert set(listed) == set(returned) - {files.MANIFEST, files.CONSOLE}
    for rel, meta in listed.items():
        assert meta == dict(bytes=returned[rel], sha256=files.sha256(os.path.join(dry.out, rel)))


def test_prepare_describes_the_slice_and_fits_the_carry_limit(dry):
    d = dry.description
    assert d["slice"] == "profile" and d["dry_run"] is True and d["keys"] == PROFILE_KEYS
    assert set(d["archives"]) == set(profile.ARCHIVES)
    travel = d["travel_bytes"]["tree"] + d["travel_bytes"]["carry"]
    assert 0 < travel < 64 * limits.MIB
    assert os.path.exists(os.path.join(dry.carry, runner.MARKER))
    with open(os.path.join(dry.carry, runner.SLICE_FILE), encoding="utf-8") as fh:
        assert json.load(fh)["recipe_digest"] == campaign.recipe_hash(profile.recipe(True))
    # the carry folder is ignored by git: it never shows in git status
    rel = os.path.relpath(dry.carry, ROOT)
    assert rel not in runner.git("status", "--porcelain", "--untracked-files=all")


# -- ingest -------------------------------------------------------------------------------

def test_ingest_round_trip(dry, returned, tmp_path):
    ledger_path = str(tmp_path / "ledger.jsonl")
    results = tmp_path / "results"
    results.mkdir()
    speed = results / profile.RESULTS
    speed.write_text("# Speed\n\nA dated CPU section, written by hand.\n\n## 2025\n\nkept\n")
    new = _ingest(returned, tmp_path, ledger_path=ledger_path, results_dir=str(results))
    lines = ledger.read(ledger_path)
    assert lines == new and len(lines) == len(dry.manifest["runs"]) == len(PROFILE_KEYS)
    digest = campaign.recipe_hash(profile.recipe(True))
    for line in lines:
        assert line["slice"] == "profile" and line["recipe"] == digest
        assert line["commit"] == dry.manifest["commit"] and line["device"].startswith("CPU")
        assert line["run"] == dry.manifest["run"] and line["dry_run"] is True
    assert [l["key"] for l in lines] == PROFILE_KEYS

    text = speed.read_text()
    assert text.startswith("# Speed\n")
    assert "<!-- gpu:profile begin" in text and "<!-- gpu:profile end -->" in text
    assert "A dated CPU section, written by hand.\n\n## 2025\n\nkept\n" in text
    assert text.index("<!-- gpu:profile end -->") < text.index("A dated CPU section")
    for key in PROFILE_KEYS:
        assert f"| {key} | CPU" in text
    # regenerating from the same ledger changes nothing
    assert report.regenerate(ledger.read(ledger_path), str(results), True, quiet) == []
    assert speed.read_text() == text

    # the slice is done: prepare has nothing to carry, and the plan moves on
    carry = _carry_name("-done")
    with pytest.raises(ValueError, match="nothing to prepare"):
        runner.prepare("profile", carry, None, ledger_path, dry_run=True, log=quiet)
    assert not os.path.exists(carry)
    assert schedule.pending_by_slice(lines, dry_run=True)["profile"] == []
    assert schedule.pending_by_slice(lines, dry_run=False)["profile"]  # dry runs are not real


def test_ingest_writes_a_new_results_file(returned, tmp_path):
    _ingest(returned, tmp_path)
    text = (tmp_path / "results" / profile.RESULTS).read_text()
    assert text.startswith("# GPU campaign: profile\n\n<!-- gpu:profile begin")
    assert "<!-- gpu:profile end -->" in text
    # the speed slice shares the file: its block says it is pending
    assert "<!-- gpu:speed begin" in text and "Pending: no run" in text.split("gpu:speed")[1]


def test_replace_block_keeps_the_rest_and_is_idempotent():
    text = "# Title\n\nintro\n\n<!-- gpu:x begin (old) -->\nold\n<!-- gpu:x end -->\n\nrest\n"
    new = report.replace_block(text, "x", ["one", "two"])
    assert new.startswith("# Title\n\nintro\n\n<!-- gpu:x begin") and "old" not in new
    assert new.endswith("one\ntwo\n<!-- gpu:x end -->\n\nrest\n")
    assert report.replace_block(new, "x", ["one", "two"]) == new


def test_ingest_refuses_a_folder_twice(returned, tmp_path):
    ledger_path = str(tmp_path / "ledger.jsonl")
    _ingest(returned, tmp_path)
    before = open(ledger_path).read()
    with pytest.raises(LedgerError, match="already records run"):
        _ingest(returned, tmp_path)
    assert open(ledger_path).read() == before
    with pytest.raises(SystemExit, match="benchmarks.gpu ingest: the ledger already records"):
        main(["ingest", returned, "--dry-run", "--ledger", ledger_path,
              "--results-dir", str(tmp_path / "results")])


def _change_a_byte(path):
    with open(path, "r+b") as fh:
        first = fh.read(1)
        fh.seek(0)
        fh.write(b"X" if first != b"X" else b"Y")


def _append(path):
    with open(path, "a") as fh:
        fh.write("more\n")


def _extra(folder):
    with open(os.path.join(folder, "extra.txt"), "w") as fh:
        fh.write("not listed\n")


def _deep(folder):
    os.makedirs(os.path.join(folder, "a", "b", "c"))
    with open(os.path.join(folder, "a", "b", "c", "x.txt"), "w") as fh:
        fh.write("x\n")


def _nine(folder):
    for i in range(9 - len(files.listing(folder))):
        with open(os.path.join(folder, f"f{i}.txt"), "w") as fh:
            fh.write("x\n")
    assert len(files.listing(folder)) == 9


def _set(**fields):
    return lambda m: m.update(fields)


def _recipe_edited(m):
    m["recipe"]["steps"] += 1


def _foreign_recipe(m):
    m["recipe"]["steps"] += 1
    m["recipe_digest"] = campaign.recipe_hash(m["recipe"])


def _foreign_key(m):
    m["runs"][0]["key"] = "resnet50-step"


REFUSALS = {
    "changed-bytes": (lambda f: _change_a_byte(os.path.join(f, "run.log")),
                      "size or SHA-256 differs"),
    "appended-bytes": (lambda f: _append(os.path.join(f, "run.log")), "size or SHA-256 differs"),
    "unlisted-file": (_extra, "extra.txt is not listed in the manifest"),
    "listed-file-deleted": (lambda f: os.remove(os.path.join(f, "run.log")),
                            "run.log is listed in the manifest but did not come back"),
    "nine-files": (_nine, "holds 9 files; a call returns at most 8"),
    "three-folders-down": (_deep, "lies 3 folders down"),
    "no-manifest": (lambda f: os.remove(os.path.join(f, files.MANIFEST)), "is missing"),
    "foreign-commit": (lambda f: _edit_manifest(f, _set(commit="f" * 40)), "foreign commit"),
    "short-commit": (lambda f: _edit_manifest(f, lambda m: m.update(commit=m["commit"][:10])),
                     "foreign commit"),
    "recipe-edited": (lambda f: _edit_manifest(f, _recipe_edited),
                      "recipe does not match its own digest"),
    "foreign-recipe": (lambda f: _edit_manifest(f, _foreign_recipe), "foreign recipe"),
    "format": (lambda f: _edit_manifest(f, _set(format="glomo-gpu-slice/0")),
               "not a campaign manifest"),
    "foreign-key": (lambda f: _edit_manifest(f, _foreign_key),
                    r"runs \['resnet50-step'\] are not runs of the recipe"),
    "unknown-slice": (lambda f: _edit_manifest(f, _set(slice="nope")), "unknown slice 'nope'"),
    "no-runs-field": (lambda f: _edit_manifest(f, lambda m: m.pop("runs")), "has no 'runs'"),
    "not-json": (lambda f: _append(os.path.join(f, files.MANIFEST)), "not valid JSON"),
    "symlink": (lambda f: os.symlink(os.path.join(f, "run.log"), os.path.join(f, "link.log")),
                "is not a plain file"),
    "path-separator-in-listing": (lambda f: _edit_manifest(f, _listed_outside),
                                  "listed in the manifest but did not come back"),
    "pickle": (lambda f: _pickled(f, "result.pkl"), "is a pickle"),
    "torch-save": (lambda f: _pickled(f, "weights.safetensors", torch_save=True), "is a pickle"),
    "duplicate-run": (lambda f: _edit_manifest(f, lambda m: m["runs"].append(m["runs"][0])),
                      "already records run"),
}


def _listed_outside(m):
    m["files"]["../../outside.txt"] = dict(bytes=1, sha256="0" * 64)


def _pickled(folder, name, torch_save=False):
    """A listed (digest-correct) file that only unpickling would read."""
    import pickle

    path = os.path.join(folder, name)
    if torch_save:
        torch.save({"x": torch.zeros(1)}, path)
    else:
        with open(path, "wb") as fh:
            pickle.dump({"x": 1}, fh)
    _edit_manifest(folder, lambda m: m["files"].update(
        {name: dict(bytes=os.path.getsize(path), sha256=files.sha256(path))}))


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_ingest_refuses(case, returned, tmp_path):
    damage, message = REFUSALS[case]
    damage(returned)
    with pytest.raises(ValueError, match=message):  # (IngestError or LedgerError)
        _ingest(returned, tmp_path)
    assert not os.path.exists(tmp_path / "ledger.jsonl")  # refused before writing
    assert not os.path.exists(tmp_path / "results")


def test_a_folder_returned_from_elsewhere_is_listed_then_ingested_like_any(returned,
                                                                         tmp_path):
    """A call folder placed in the shared returns folder: plan lists it until the ledger
    has its run; a damaged one is refused there too, and changes nothing."""
    returns = tmp_path / "gpu-returns"
    placed = returns / "from-elsewhere"
    shutil.copytree(returned, placed)
    ledger_path = str(tmp_path / "ledger.jsonl")
    assert [f for f, _ in schedule.returned_folders(str(returns), [])] == [str(placed)]
    damaged = returns / "damaged"
    shutil.copytree(returned, damaged)
    _change_a_byte(str(damaged / "run.log"))
    with pytest.raises(IngestError, match="size or SHA-256 differs"):
        _ingest(str(damaged), tmp_path, ledger_path=ledger_path)
    assert not os.path.exists(ledger_path) and not os.path.exists(tmp_path / "results")
    shutil.rmtree(damaged)
    _ingest(str(placed), tmp_path, ledger_path=ledger_path)
    assert schedule.returned_folders(str(returns), ledger.read(ledger_path)) == []


def test_ingest_refuses_a_file_over_the_size_limit(returned, tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "RETURN_FILE_BYTES", 64)
    with pytest.raises(IngestError, match="a call returns files of at most"):
        _ingest(returned, tmp_path)
    assert not os.path.exists(tmp_path / "ledger.jsonl")


def test_ingest_refuses_a_dry_run_as_a_real_one(returned, tmp_path):
    with pytest.raises(IngestError, match="holds a dry run; ingest it with --dry-run"):
        _ingest(returned, tmp_path, dry_run=False)
    with pytest.raises(SystemExit, match="benchmarks.gpu ingest: .* holds a dry run"):
        main(["ingest", returned, "--ledger", str(tmp_path / "ledger.jsonl"),
              "--results-dir", str(tmp_path / "results")])
    assert not os.path.exists(tmp_path / "ledger.jsonl")


def test_ingest_refuses_a_real_run_as_a_dry_one(returned, tmp_path):
    _edit_manifest(returned, _set(dry_run=False))
    with pytest.raises(IngestError, match="holds a real run; ingest it without --dry-run"):
        _ingest(returned, tmp_path)


def test_ingest_refuses_a_real_run_of_a_dirty_tree(returned, tmp_path):
    real = profile.recipe(False)
    _edit_manifest(returned, _set(dry_run=False, dirty=True, recipe=real,
                                  recipe_digest=campaign.recipe_hash(real)))
    with pytest.raises(IngestError, match="uncommitted changes"):
        _ingest(returned, tmp_path, dry_run=False)


def test_a_dry_run_never_enters_the_campaigns_ledger(returned, tmp_path, monkeypatch):
    # the campaign's ledger and results folder, moved to tmp (nothing real is at risk)
    real_ledger, real_results = tmp_path / "real" / "ledger.jsonl", tmp_path / "real-results"
    monkeypatch.setattr(ingest, "default_ledger", lambda: str(real_ledger))
    monkeypatch.setattr(report, "RESULTS_DIR", str(real_results))
    for ledger_path, results_dir in ((None, str(tmp_path / "results")),
                                     (str(real_ledger), str(tmp_path / "results")),
                                     (str(tmp_path / "ledger.jsonl"), None),
                                     (str(tmp_path / "ledger.jsonl"), str(real_results))):
        with pytest.raises(IngestError, match="a dry run never enters the campaign's ledger"):
            ingest.ingest(returned, ledger_path, results_dir, dry_run=True, log=quiet)
    assert sorted(os.listdir(tmp_path)) == ["returned"]


# -- prepare ------------------------------------------------------------------------------

def test_prepare_refuses_a_carry_folder_outside_the_checkout(tmp_path):
    with pytest.raises(ValueError, match="must lie inside the checkout"):
        runner.prepare("profile", str(tmp_path / "carry"), None, str(tmp_path / "l.jsonl"),
                       dry_run=True, log=quiet)
    with pytest.raises(ValueError, match="must lie inside the checkout"):
        runner.prepare("profile", ROOT, None, str(tmp_path / "l.jsonl"), dry_run=True,
                       log=quiet)
    assert not os.path.exists(tmp_path / "carry")


def test_prepare_refuses_a_carry_folder_git_does_not_ignore(tmp_path):
    carry = os.path.join(ROOT, f"gpu-test-{os.getpid()}")
    with pytest.raises(SystemExit, match="benchmarks.gpu prepare: the carry folder .* is not "
                                         "ignored by git"):
        main(["prepare", "profile", "--dry-run", "--carry", carry,
              "--ledger", str(tmp_path / "l.jsonl")])
    assert not os.path.exists(carry)


def test_prepare_keeps_a_folder_it_did_not_make(tmp_path):
    carry = _carry_name("-foreign")
    os.makedirs(carry)
    try:
        with open(os.path.join(carry, "precious.txt"), "w") as fh:
            fh.write("mine\n")
        with pytest.raises(ValueError, match="was not made by prepare"):
            runner.prepare("profile", carry, None, str(tmp_path / "l.jsonl"), dry_run=True,
                           log=quiet)
        assert os.listdir(carry) == ["precious.txt"]
    finally:
        shutil.rmtree(carry)


def test_prepare_replaces_a_folder_it_made(tmp_path):
    carry = _carry_name("-again")
    try:
        runner.prepare("profile", carry, None, str(tmp_path / "l.jsonl"), dry_run=True,
                       log=quiet)
        with open(os.path.join(carry, "stale.txt"), "w") as fh:
            fh.write("from before\n")
        d = runner.prepare("profile", carry, None, str(tmp_path / "l.jsonl"), dry_run=True,
                           log=quiet)
        assert sorted(os.listdir(carry)) == sorted([runner.MARKER, runner.SLICE_FILE, "data"])
        assert sorted(os.listdir(os.path.join(carry, "data"))) == sorted(d["archives"])
    finally:
        shutil.rmtree(carry, ignore_errors=True)


def test_prepare_refuses_to_carry_more_than_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "CARRY_BYTES", 1000)
    carry = _carry_name("-big")
    try:
        with pytest.raises(ValueError, match="over the .* limit"):
            runner.prepare("profile", carry, None, str(tmp_path / "l.jsonl"), dry_run=True,
                           log=quiet)
        # a refused prepare leaves nothing that run would take for a prepared slice
        assert not os.path.exists(os.path.join(carry, runner.SLICE_FILE))
    finally:
        shutil.rmtree(carry, ignore_errors=True)


def test_a_real_prepare_refuses_a_dirty_tree(tmp_path):
    stray = os.path.join(ROOT, f"campaign-test-stray-{os.getpid()}.txt")
    carry = _carry_name("-dirty")
    assert not os.path.exists(stray)
    try:
        with open(stray, "w") as fh:
            fh.write("an untracked file git does not ignore\n")
        assert os.path.basename(stray) in runner.git("status", "--porcelain")
        with pytest.raises(ValueError, match="uncommitted changes"):
            runner.prepare("profile", carry, str(tmp_path / "no-data"),
                           str(tmp_path / "l.jsonl"), dry_run=False, log=quiet)
        assert not os.path.exists(carry)
    finally:
        os.remove(stray)
        shutil.rmtree(carry, ignore_errors=True)


def test_prepare_names_unknown_and_unbuilt_slices(tmp_path):
    args = ["--dry-run", "--ledger", str(tmp_path / "l.jsonl"), "--carry", _carry_name("-x")]
    with pytest.raises(SystemExit, match="benchmarks.gpu prepare: unknown slice 'nope'; the "
                                         "campaign's slices are profile, "):
        main(["prepare", "nope", *args])
    with pytest.MonkeyPatch.context() as mp:  # (every slice is built today)
        mp.setattr(campaign, "NOT_BUILT", {"speed": "its module is not written"})
        with pytest.raises(SystemExit, match="benchmarks.gpu prepare: slice 'speed' is part "
                                             "of the campaign but not built yet: its module"):
            main(["prepare", "speed", *args])
    assert not os.path.exists(_carry_name("-x"))


# -- run ----------------------------------------------------------------------------------

def _run_refused(carry, out, name="profile", dry_run=True, budget=600, match=""):
    with pytest.raises(ValueError, match=match):
        runner.run(name, budget, carry, str(out), dry_run=dry_run, work=str(out) + "-work")
    assert not os.path.exists(os.path.join(out, "run.log"))  # before any item ran
    assert not os.path.exists(os.path.join(out, files.MANIFEST))
    assert not os.path.exists(str(out) + "-work")


def test_run_refuses_another_slice(dry, tmp_path):
    _run_refused(dry.carry, tmp_path / "out", name="cifar10",
                 match="prepares 'profile', not 'cifar10': run prepare cifar10 first")


def test_run_refuses_another_dry_run_flag(dry, tmp_path):
    _run_refused(dry.carry, tmp_path / "out", dry_run=False,
                 match="was prepared with --dry-run; run it the same way")


def test_run_refuses_a_short_budget_and_no_out(dry, tmp_path, monkeypatch):
    _run_refused(dry.carry, tmp_path / "out", budget=20, match="--budget-s must be at least")
    monkeypatch.delenv("OUT", raising=False)
    with pytest.raises(ValueError, match=r"--out is not given and \$OUT is not set"):
        runner.run("profile", 600, dry.carry, None, dry_run=True)


def test_run_refuses_a_changed_archive_or_recipe(dry, tmp_path):
    carry = str(tmp_path / "carry")
    shutil.copytree(dry.carry, carry)
    archive = os.path.join(carry, "data", profile.ARCHIVES[0])
    _append(archive)
    _run_refused(carry, tmp_path / "out", match="not the archive prepare carried")
    path = os.path.join(carry, runner.SLICE_FILE)
    description = files.read_json(path, "slice")
    files.write_json(path, dict(description, recipe_digest="0" * 16))
    _run_refused(carry, tmp_path / "out2", match="is not the prepared one")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU machine may run a real slice")
def test_a_real_run_needs_a_gpu(dry, tmp_path):
    carry = str(tmp_path / "carry")
    shutil.copytree(dry.carry, carry)
    path = os.path.join(carry, runner.SLICE_FILE)
    description = files.read_json(path, "slice")
    files.write_json(path, dict(description, dry_run=False,
                                recipe_digest=campaign.recipe_hash(profile.recipe(False))))
    _run_refused(carry, tmp_path / "out", dry_run=False, match="no GPU here")
    with pytest.raises(SystemExit, match="benchmarks.gpu run: no GPU here"):
        main(["run", "profile", "--budget-s", "600", "--carry", carry,
              "--out", str(tmp_path / "out")])


# -- the ledger ---------------------------------------------------------------------------

def _line(key="k1", **kw):
    line = dict(slice="profile", recipe="0123456789abcdef", key=key, run="r1", commit="c" * 40,
                date="2026-01-01T00:00:00+00:00", device="CPU", versions={}, seconds=1.0,
                metrics={"median_ms": 1.0}, dry_run=True)
    line.update(kw)
    return line


def _write(path, *texts):
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("".join(t + "\n" for t in texts))


def test_ledger_read(tmp_path):
    path = str(tmp_path / "ledger.jsonl")
    assert ledger.read(path) == []
    _write(path, json.dumps(_line("a")), "", json.dumps(_line("b")))
    assert [l["key"] for l in ledger.read(path)] == ["a", "b"]
    assert ledger.recorded_keys(ledger.read(path), "profile", "0123456789abcdef") == {"a", "b"}
    assert ledger.recorded_keys(ledger.read(path), "profile", "other") == set()
    _write(path, json.dumps(_line("a")), "{not json")
    with pytest.raises(LedgerError, match=r"ledger.jsonl:2 is not JSON"):
        ledger.read(path)
    bad = _line("a")
    del bad["commit"], bad["metrics"]
    _write(path, json.dumps(bad))
    with pytest.raises(LedgerError, match=r"ledger.jsonl:1: missing commit, metrics"):
        ledger.read(path)
    _write(path, json.dumps(_line("a", device="")))
    with pytest.raises(LedgerError, match="device must be a non-empty string"):
        ledger.read(path)
    _write(path, json.dumps(_line("a", dry_run="yes")))
    with pytest.raises(LedgerError, match="dry_run must be true or false"):
        ledger.read(path)
    _write(path, "[1, 2]")
    with pytest.raises(LedgerError, match="must be a JSON object"):
        ledger.read(path)
    _write(path, json.dumps(_line("a")), json.dumps(_line("a", run="r2")))
    with pytest.raises(LedgerError, match=r"ledger.jsonl:2 repeats run"):
        ledger.read(path)
    # the same key of another recipe is another run
    _write(path, json.dumps(_line("a")), json.dumps(_line("a", recipe="fedcba9876543210")))
    assert len(ledger.read(path)) == 2


def test_ledger_append(tmp_path):
    path = str(tmp_path / "sub" / "ledger.jsonl")
    ledger.append(path, [_line("a"), _line("b")])
    ledger.append(path, [_line("c")])
    assert [l["key"] for l in ledger.read(path)] == ["a", "b", "c"]
    assert os.listdir(tmp_path / "sub") == ["ledger.jsonl"]  # no temporary file left
    before = open(path).read()
    with pytest.raises(LedgerError, match="already records run"):
        ledger.append(path, [_line("d"), _line("d", run="r2")])  # twice within the new lines
    with pytest.raises(LedgerError, match="already records run"):
        ledger.append(path, [_line("e"), _line("a")])  # one the ledger holds
    with pytest.raises(LedgerError, match="new line 2: missing"):
        ledger.append(path, [_line("f"), {"slice": "profile"}])
    assert open(path).read() == before  # refused before writing anything
    assert os.listdir(tmp_path / "sub") == ["ledger.jsonl"]


# -- the profile slice, the plan ----------------------------------------------------------

def test_cuda_test_files_are_the_files_of_the_cuda_tests():
    mark = "@pytest.mark." + "cuda"  # (spelt apart: this file is not one of them)
    marked = set()
    for path in glob.glob(os.path.join(ROOT, "tests", "*.py")):
        with open(path, encoding="utf-8") as fh:
            if mark in fh.read():
                marked.add(os.path.relpath(path, ROOT).replace(os.sep, "/"))
    later = campaign.slice_module("cuda-tests")
    listed = [*profile.CUDA_TEST_FILES, *later.FILES]
    assert marked and set(listed) == marked and len(listed) == len(marked)
    assert profile.recipe(False)["tests"] == ["-m", "cuda", *profile.CUDA_TEST_FILES]
    assert later.keys(later.recipe(False)) == later.keys(later.recipe(True)) == list(later.FILES)


def test_a_newly_marked_file_keeps_the_recorded_cuda_tests():
    later = campaign.slice_module("cuda-tests")
    recipe = later.recipe(False)
    grown = dict(recipe, files=[*recipe["files"], "tests/test_new.py"])
    assert campaign.recipe_digest("cuda-tests", grown) == \
        campaign.recipe_digest("cuda-tests", recipe)
    recorded = set(recipe["files"])
    assert campaign.pending("cuda-tests", grown, recorded) == ["tests/test_new.py"]
    # the profile's recorded recipe is the one the ledger holds
    ledger = [json.loads(l) for l in open(os.path.join(ROOT, "benchmarks", "results", "gpu",
                                                       "ledger.jsonl"), encoding="utf-8")]
    digest = campaign.recipe_digest("profile", profile.recipe(False))
    assert {l["key"] for l in ledger if l["slice"] == "profile" and l["recipe"] == digest} \
        == set(profile.keys(profile.recipe(False)))


def test_recipes_and_digests():
    dry, real = profile.recipe(True), profile.recipe(False)
    assert campaign.recipe_hash(dry) != campaign.recipe_hash(real)
    assert campaign.recipe_hash(dict(reversed(list(real.items())))) == campaign.recipe_hash(real)
    assert len(campaign.recipe_hash(real)) == 16
    assert all(profile.min_seconds(k, real) >= 30 for k in PROFILE_KEYS)
    assert set(campaign.ORDER) == set(campaign.MODULES) | set(campaign.NOT_BUILT)
    assert {s.slice for s in schedule.STAGES} == set(campaign.ORDER)


def test_plan_prints_both_calls_of_an_allocation(tmp_path, capsys):
    main(["plan", "--dry-run", "--ledger", str(tmp_path / "ledger.jsonl"),
          "--shared-data", str(tmp_path), "--returns", str(tmp_path / "none")])
    out = capsys.readouterr().out
    assert "ledger: 0 runs" in out and "next: pixel-pretrain" in out
    assert "call 1: timeout_s 540, --budget-s 510" in out and "call 2: timeout_s 220" in out
    assert "--carry .gpu-call1-pixel-pretrain" in out and "--carry .gpu-call2-profile" in out
    assert "plan --prepare --dry-run" in out and "MiB" in out


def _recorded(keys_by_slice, dry_run=True):
    """Ledger lines recording ``keys_by_slice`` ({slice: keys}) under the current recipes."""
    lines = []
    for name, keys in keys_by_slice.items():
        recipe = campaign.slice_module(name).recipe(dry_run)
        lines += [dict(slice=name, recipe=campaign.recipe_digest(name, recipe), key=k, run="r",
                       metrics={}) for k in keys]
    return lines


def _parts(calls):
    return [[(p.slice, len(p.keys), p.budget_s) for p in c.parts] for c in calls]


def test_allocation_uses_both_calls_in_the_order_of_first_answers():
    """The real recipes: a whole call for pixel pretraining, then fillers in what the
    allocation has left (CIFAR-10 waits for the new pixel release); once it is recorded,
    ResNet-18 seeds 0-4 come first, packed into both calls by their estimates."""
    real = profile.recipe(False)
    lim = limits.JobLimits()
    profiled = _recorded({"profile": [k for k in profile.keys(real) if k != "cuda-tests"]},
                         dry_run=False)  # (the ledger's state: the CUDA tests pending)
    calls = schedule.allocation(profiled, False, lim)
    assert [c.timeout_s for c in calls] == [540, 900 - 120 - 540 - 20]
    assert calls[0].budget_s == 510 and calls[1].budget_s == 190
    assert _parts(calls) == [[("pixel-pretrain", 1, None)], [("profile", 1, None)]]
    assert calls[1].parts[0].keys == ["cuda-tests"] and calls[1].parts[0].carry == \
        ".gpu-call2-profile"
    done = _recorded({"pixel-pretrain": ["pretrain"],
                      "profile": profile.keys(real)}, dry_run=False)
    calls = schedule.allocation(done, False, lim)
    first = calls[0].parts[0]
    assert first.slice == "cifar10" and first.keys[0] == "resnet18/baseline/seed0"
    assert all(k.startswith("resnet18/") and int(k[-1]) < 5 for k in first.keys)
    cifar10 = campaign.slice_module("cifar10")
    stage = cifar10.recipe(False)["stage"]["estimate_s"]
    # priors: 60 s a ResNet-18 run, the propagations once (120 s), 30 s to start
    assert first.seconds == schedule.SETUP_S + 60 * len(first.keys) + stage <= 510
    second = calls[1].parts[0]
    assert second.slice == "cifar10" and not set(second.keys) & set(first.keys)
    assert second.keys[0] == schedule.ordered_pending("cifar10", done)[len(first.keys)]
    # text pretraining trains to a deadline: never in the shorter second call
    assert all(p.slice != "text-pretrain" for c in calls[1:] for p in c.parts)
    # a warm machine and a longer allocation: no start-up, three calls' worth
    long = limits.JobLimits(allocation_s=2000)
    assert [c.timeout_s for c in schedule.allocation(done, False, long, warm=True,
                                                     calls=3)] == [540, 540, 540]


def test_allocation_estimates_from_recorded_runs_and_respects_the_limits():
    """Measured run times replace the priors; a part that would carry or return too much
    is left for a later call; an allocation too short for a call has none."""
    real = profile.recipe(False)
    done = _recorded({"pixel-pretrain": ["pretrain"], "profile": profile.keys(real)},
                     dry_run=False)
    timed = _recorded({"cifar10": ["resnet18/baseline/seed0", "resnet18/glomo/seed0"]},
                      dry_run=False)
    for line in timed:
        line["metrics"] = dict(seconds=30.0, propagations_s=20.0 if "glomo" in line["key"]
                               else 0.0)
    calls = schedule.allocation(done + timed, False, limits.JobLimits())
    first = calls[0].parts[0]
    assert first.seconds == pytest.approx(schedule.SETUP_S + 33 * len(first.keys) + 22)
    assert len(first.keys) == 13  # (30 + 22 + 13 x 33 = 481 <= 510 < 514)
    assert schedule.allocation([], False, limits.JobLimits(allocation_s=100)) == []
    tiny = limits.JobLimits(carry_bytes=10)
    assert schedule.allocation(done, False, tiny, tree_bytes=5,
                               carry_bytes=lambda n: 20) == []
    # a slice that needs another's release waits while that one has pending runs
    assert all(p.slice not in ("cifar10", "imdb") for c in schedule.allocation([], False)
               for p in c.parts)


def test_adding_seeds_or_depths_keeps_the_recorded_runs(monkeypatch):
    from benchmarks.gpu.slices import cifar10

    recipe = cifar10.recipe(False)
    more = dict(recipe, seeds={"18": 20, "34": 10}, depths=[18, 34, 50])
    assert campaign.recipe_digest("cifar10", more) == campaign.recipe_digest("cifar10", recipe)
    other = dict(recipe, width=32)
    assert campaign.recipe_digest("cifar10", other) != campaign.recipe_digest("cifar10", recipe)
    # the profile has no key fields: its digest, and the runs recorded under it, unchanged
    assert campaign.recipe_digest("profile", profile.recipe(False)) == \
        campaign.recipe_hash(profile.recipe(False))


def test_order_of_pending_keys_follows_the_stages():
    from benchmarks.gpu.slices import cifar10

    recipe = cifar10.recipe(False)
    if not cifar10.keys(recipe):
        pytest.skip("no pixel release in this checkout")
    keys = schedule.ordered_pending("cifar10", [])
    seeds = [int(k.rsplit("seed", 1)[1]) for k in keys]
    assert keys[:15] == [f"resnet18/{v}/seed{s}" for s in range(5) for v in cifar10.VARIANTS]
    assert all(k.startswith("resnet34/") for k in keys[15:30]) and min(seeds[30:]) == 5
    assert sorted(keys) == sorted(cifar10.keys(recipe))


def test_prepare_carries_the_keys_it_is_given(tmp_path):
    carry = _carry_name("-keys")
    try:
        d = runner.prepare("profile", carry, None, str(tmp_path / "l.jsonl"), dry_run=True,
                           log=quiet, keys=["transfer-forward", "cuda-tests"])
        assert d["keys"] == ["transfer-forward", "cuda-tests"]
        for bad in (["nope"], ["cuda-tests", "cuda-tests"], []):
            with pytest.raises(ValueError, match="--keys must name distinct pending runs"):
                runner.prepare("profile", carry, None, str(tmp_path / "l.jsonl"),
                               dry_run=True, log=quiet, keys=bad)
    finally:
        shutil.rmtree(carry, ignore_errors=True)


def test_job_limits_are_settings():
    assert limits.from_environment({}) == limits.JobLimits()
    lim = limits.from_environment({"GLOMO_GPU_ALLOCATION_S": "1800",
                                   "GLOMO_GPU_RETURN_FILES": "16"})
    assert lim.allocation_s == 1800.0 and lim.return_files == 16
    with pytest.raises(ValueError, match="GLOMO_GPU_CALL_S='ten' is not a number"):
        limits.from_environment({"GLOMO_GPU_CALL_S": "ten"})
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(ValueError, match="startup_s must be a finite number"):
            limits.from_environment({"GLOMO_GPU_STARTUP_S": bad})
    with pytest.raises(ValueError, match="call_s must be at least 60"):
        limits.JobLimits(call_s=30)


def test_plan_lists_returned_folders_the_ledger_lacks(tmp_path, capsys):
    returns = tmp_path / "gpu-returns"
    known = returns / "known"
    chained = returns / "chained" / "profile"
    broken = returns / "broken"
    for folder, run in ((known, "aaa"), (chained, "bbb")):
        folder.mkdir(parents=True)
        (folder / files.MANIFEST).write_text(json.dumps(dict(run=run, slice="profile")))
    broken.mkdir()
    (broken / files.MANIFEST).write_text("[" * 5000 + "]" * 5000)
    (returns / "README.md").write_text("not a folder")
    lines = [dict(run="aaa")]
    found = dict(schedule.returned_folders(str(returns), lines))
    assert set(found) == {str(chained), str(broken)}
    assert "run 'bbb'" in found[str(chained)] and "unreadable" in found[str(broken)]
    ledger_path = tmp_path / "l.jsonl"
    main(["plan", "--dry-run", "--ledger", str(ledger_path), "--returns", str(returns)])
    out = capsys.readouterr().out
    assert "returned call folders the ledger lacks" in out and str(chained) in out


def test_step_timer_takes_the_median_after_the_warm_up():
    from benchmarks.gpu.slices.pretraining import StepTimer

    timer = StepTimer(skip=2)
    assert timer.steady() == dict(step_ms=None, step_ms_steps=0, step_ms_from=2)
    timer.times = [9.0, 8.0, 0.3, 0.1, 0.2, 0.4]
    assert timer.steady() == dict(step_ms=250.0, step_ms_steps=4, step_ms_from=2)
    from benchmarks.gpu.slices.pretraining import steady_step_lines

    (line,) = steady_step_lines(timer.steady(), 150.0)
    assert "steady step 250.0 ms (median of 4 steps from step 2" in line and "not met" in line
    assert "; target <= 300 ms: met)" in steady_step_lines(timer.steady(), 300.0)[0]
    assert steady_step_lines(dict(step_ms=None)) == []


@pytest.mark.slow
def test_allocation_dry_run_end_to_end(tmp_path):
    """A whole allocation as plan schedules it, rehearsed on the CPU: both calls'
    parts prepared first (as ``plan --prepare`` does), then each call's command run by
    bash exactly as printed, each part into its own folder under that call's $OUT, and
    every folder ingested. Call 1 is pixel pretraining alone (it trains to its deadline);
    call 2 packs the fillers into what the allocation has left."""
    import subprocess

    lim = limits.JobLimits(allocation_s=420, startup_s=0, call_s=240, gap_s=0)
    ledger0 = str(tmp_path / "l0.jsonl")
    calls = schedule.allocation([], True, lim, calls=2)
    assert [[p.slice for p in c.parts] for c in calls] == [["pixel-pretrain"],
                                                            ["profile", "speed"]]
    assert [c.timeout_s for c in calls] == [240, 180]
    for call in calls:
        for part in call.parts:
            part.carry = _carry_name(f"-{part.carry}")
    outs = []
    try:
        for call in calls:  # (both prepared before the first runs)
            for part in call.parts:
                runner.prepare(part.slice, part.carry, None, ledger0, dry_run=True, log=quiet,
                               keys=part.keys)
        for call in calls:
            out = tmp_path / f"out{call.number}"
            out.mkdir()
            command = runner.chained_command(
                [(p.slice, p.budget_s) for p in call.parts],
                [os.path.relpath(p.carry, ROOT) for p in call.parts], budget_s=call.budget_s,
                dry_run=True, python=shlex.quote(sys.executable))
            assert len(command) <= 2000
            env = dict(os.environ, OUT=str(out), GLOMO_GPU_BLOCK_MODULES="gensim,conllu")
            proc = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=call.timeout_s + 60)
            assert proc.returncode == 0, proc.stderr[-2000:]
            files.check_limits(str(out))
            outs.append(out)
    finally:
        for call in calls:
            for part in call.parts:
                shutil.rmtree(part.carry, ignore_errors=True)
    console = (outs[1] / files.CONSOLE).read_text()
    budget = calls[1].parts[0].budget_s
    assert "slice profile" in console and "slice speed" in console
    assert f"budget {budget:.0f} s" in console
    pixel = campaign.slice_module("pixel-pretrain")
    shared = str(tmp_path / "shared")
    data.write_toy_archives(list(pixel.ARCHIVES), shared)
    kw = dict(ledger_path=str(tmp_path / "ledger.jsonl"), results_dir=str(tmp_path / "res"),
              releases_root=str(tmp_path / "rel"), shared_data=shared)
    new = []
    for call, out in zip(calls, outs):
        for part in call.parts:
            new += _ingest(str(out / part.slice), tmp_path, **kw)
    assert {l["slice"] for l in new} == {"pixel-pretrain", "profile", "speed"}
    assert os.path.isdir(os.path.join(kw["releases_root"], pixel.RELEASE))
    assert "step_ms" in next(l for l in new if l["slice"] == "pixel-pretrain")["metrics"]


# -- the other slices' dry runs: prepare, run, ingest (a release, the results) ------------

def _check_cifar10_results(recipe, new, text):
    """The cifar10 slice's runs: trained and tested by the library, with its history."""
    for l in new:
        m = l["metrics"]
        assert set(m) == {"test_acc", "best_val", "best_epoch", "val_curve", "train_loss",
                          "epoch_s", "diverged_at_epoch", "seconds", "propagations_s",
                          "trainable", "images"}
        assert 0 <= m["test_acc"] <= 1 and m["diverged_at_epoch"] is None
        assert len(m["val_curve"]) == len(m["epoch_s"]) == recipe["train"]["epochs"]
        assert m["best_val"] == m["val_curve"][m["best_epoch"]] and m["trainable"] > 0
    assert recipe["train"]["crop_target"] == "stage" and recipe["train"]["crop_padding"]
    assert "glomo − baseline" in text and "`ImageTrainConfig` epochs 2, batch_size 8" in text
    assert any(l["metrics"]["propagations_s"] > 0 for l in new if "/glomo/" in l["key"])


def _check_slice_results(name, release, recipe, new, manifest, text, releases):
    """What each slice's dry run must have recorded (``new``: its ledger lines; ``text``:
    its results file)."""
    from glomo_pyg import PretrainedGraphPredictor

    if name == "pixel-pretrain":
        (line,) = new
        assert line["metrics"]["steps"] == recipe["train"]["max_steps"]
        check = line["metrics"]["check"]  # made by ingest, on the CPU
        assert set(check) == {"learned", "untrained"} and set(check["learned"]) == {
            "forward", "backward"}
        assert line["metrics"]["check_device"] == "CPU (at ingest)"
        assert line["metrics"]["check_images"] == 2 and "salvaged" not in line["metrics"]
        predictor = PretrainedGraphPredictor.from_pretrained(
            os.path.join(releases, release))
        assert predictor.trained_size == (recipe["corpus"]["crop"],) * 2
        card = open(os.path.join(releases, release, "README.md"), encoding="utf-8").read()
        assert line["commit"] in card and "| forward | 0 |" in card
        assert sorted(manifest["files"]) == ["predictor/config.json",
                                             "predictor/model.safetensors", "run.log"]
    elif name == "text-pretrain":
        (line,) = new
        m = line["metrics"]
        assert m["steps"] == recipe["train"]["max_steps"] and m["stopped_by"] == "max_steps"
        assert m["summary"]["init_vectors_found"] > 0.5  # the carried vectors were used
        assert set(manifest["carried"]) == {"init_vectors.npy", "init_vectors.json"}
        assert set(m["syntax"]) == {"forward", "backward"}  # scored by ingest, on the CPU
        assert m["syntax_sentences"] == dict(dev=20, select=recipe["syntax"]["select_sentences"])
        assert "previous word" in m["syntax_text"] and "next word" in m["syntax_text"]
        predictor = PretrainedGraphPredictor.from_pretrained(
            os.path.join(releases, release))
        assert predictor.trained_length == recipe["corpus"]["max_length"]
        assert len(predictor.vocabulary) == m["summary"]["vocabulary"]
        card = open(os.path.join(releases, release, "README.md"), encoding="utf-8").read()
        assert line["commit"] in card and m["syntax_text"] in card
        assert f"max_distance={recipe['corpus']['max_length'] - 1}" in card
        assert f"{len(predictor.vocabulary)}-word lower-cased vocabulary" in card
        assert "ran to max_steps after" in card and "wall clock" not in card
        assert "chosen graph" in text and "imdb-gpu-release.yaml" in text
        assert sorted(manifest["files"]) == ["predictor/config.json",
                                             "predictor/model.safetensors", "run.log"]
    elif name == "cifar10":
        _check_cifar10_results(recipe, new, text)
    elif name == "imdb":
        assert all(0 <= l["metrics"]["test_acc"] <= 1 for l in new)
        assert "glomo − baseline" in text and recipe["predictor"]["release"] in text
        assert set(manifest["carried"]) == {"embedding.npy", "embedding.json"}
    elif name == "cuda-tests":  # on a CPU each collected test skips; none fails
        for l in new:
            m = l["metrics"]
            assert m["tests"] >= 1 and m["failures"] == m["errors"] == 0
            assert m["skipped"] == m["tests"] or torch.cuda.is_available()
        assert "| `tests/test_compile.py` | CPU" in text
    else:  # speed: each section's table, as benchmarks.speed writes it
        assert all(l["metrics"]["lines"][0].startswith("### ") for l in new)
        assert "##### Fused layout" in text


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pixel-pretrain", "cifar10", "text-pretrain", "imdb", "speed",
                                  "cuda-tests"])
def test_dry_run_of_slice_end_to_end(name, tmp_path):
    mod = campaign.slice_module(name)
    carry = _carry_name("-" + name)
    ledger_path, results, releases = (str(tmp_path / "ledger.jsonl"), str(tmp_path / "results"),
                                      str(tmp_path / "releases"))
    # cifar10 runs every key in one process: one key fails there (injected), the next
    # ones still run, and a second call of the same (stale) prepare runs only that key
    fail = "resnet18/uniform/seed0" if name == "cifar10" else ""
    recipe = mod.recipe(True)
    # the project's data folder as ingest sees it (the same toy archives prepare carries)
    shared = str(tmp_path / "shared")
    data.write_toy_archives(list(mod.ARCHIVES) + list(getattr(mod, "INGEST_ARCHIVES", ())),
                            shared)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("GLOMO_GPU_BLOCK_MODULES", "gensim,conllu")
            mp.setenv("GLOMO_GPU_FAIL_KEYS", fail)
            description = runner.prepare(name, carry, None, ledger_path, dry_run=True, log=quiet)
            manifest = runner.run(name, 600, carry, str(tmp_path / "out"), dry_run=True,
                                  work=str(tmp_path / "work"))
            if fail:
                assert [(f["key"], f["status"]) for f in manifest["failures"]] == [
                    (fail, "failed")] and "injected" in manifest["failures"][0]["error"]
                assert [r["key"] for r in manifest["runs"]] == [
                    k for k in mod.keys(recipe) if k != fail]
                ingest.ingest(str(tmp_path / "out"), ledger_path, results, releases, True,
                              log=quiet, shared_data=shared)
                mp.setenv("GLOMO_GPU_FAIL_KEYS", "")
                shutil.rmtree(tmp_path / "out")
                manifest = runner.run(name, 600, carry, str(tmp_path / "out"), dry_run=True,
                                      work=str(tmp_path / "work2"))
                assert [r["key"] for r in manifest["runs"]] == [fail]
    finally:
        shutil.rmtree(carry, ignore_errors=True)
    assert description["keys"] == mod.keys(recipe)
    if not fail:
        assert [r["key"] for r in manifest["runs"]] == mod.keys(recipe)
    assert manifest["failures"] == [] and manifest["skipped"] == []
    files.check_limits(str(tmp_path / "out"))
    if hasattr(mod, "ingest"):  # a dry run never writes the project's releases
        with pytest.raises(IngestError, match="--releases-root"):
            ingest.ingest(str(tmp_path / "out"), ledger_path, results, None, True, log=quiet)
        # nor replaces a user's folder that bears the release's name
        mine = tmp_path / "releases" / mod.RELEASE
        mine.mkdir(parents=True)
        (mine / "notes.txt").write_text("keep me")
        with pytest.raises(IngestError, match="exists and is not a release folder"):
            ingest.ingest(str(tmp_path / "out"), ledger_path, results, releases, True,
                          log=quiet, shared_data=shared)
        assert os.listdir(mine) == ["notes.txt"] and (mine / "notes.txt").read_text() == \
            "keep me"
        assert sorted(os.listdir(tmp_path / "releases")) == [mod.RELEASE]  # nothing staged
        assert not os.path.exists(ledger_path) or ledger.read(ledger_path) == []
        shutil.rmtree(mine)
    new = ingest.ingest(str(tmp_path / "out"), ledger_path, results, releases, True, log=quiet,
                        shared_data=shared)
    assert [l["key"] for l in new] == ([fail] if fail else mod.keys(recipe))
    new = ledger.read(ledger_path)
    assert sorted(l["key"] for l in new) == sorted(mod.keys(recipe))
    text = open(os.path.join(results, mod.RESULTS), encoding="utf-8").read()
    assert f"<!-- gpu:{name} begin" in text and f"<!-- gpu:{name} end -->" in text
    _check_slice_results(name, getattr(mod, "RELEASE", None), recipe, new, manifest, text,
                         releases)
    with pytest.raises(LedgerError, match="already records"):  # never twice
        ingest.ingest(str(tmp_path / "out"), ledger_path, results, releases, True, log=quiet,
                      shared_data=shared)


@pytest.mark.slow
def test_salvage_records_a_pretraining_killed_after_its_predictor_came_back(tmp_path):
    """A pixel-pretrain key killed after saving its predictor (what happened to the first
    GPU run, in its graph check): plain ingest adds nothing; ``--salvage`` records it from
    the log's ``done:`` line, marked salvaged, and the check is made at ingest; a key
    killed before the predictor was saved, or whose predictor did not come back, is
    refused by name."""
    mod = campaign.slice_module("pixel-pretrain")
    carry, out = _carry_name("-salvage"), str(tmp_path / "out")
    shared = str(tmp_path / "shared")
    data.write_toy_archives(list(mod.ARCHIVES), shared)
    try:
        runner.prepare("pixel-pretrain", carry, None, str(tmp_path / "l0.jsonl"), dry_run=True,
                       log=quiet)
        runner.run("pixel-pretrain", 600, carry, out, dry_run=True, work=str(tmp_path / "w"))
    finally:
        shutil.rmtree(carry, ignore_errors=True)

    def killed(tail):
        def edit(m):
            (r,) = m["runs"]
            m["failures"] = [dict(key="pretrain", status="timeout", returncode=-9,
                                  seconds=r["seconds"], tail=tail)]
            m["runs"] = []
        return edit

    done = f"done: 4 steps in 3 s; predictor saved to {tmp_path}/pretrain/predictor"
    for n, (tail, match) in enumerate([
            (["pretraining: 36 training / 4 validation images"], "killed before its predictor"),
            ([done], None)]):
        folder = str(tmp_path / f"returned{n}")
        shutil.copytree(out, folder)
        _edit_manifest(folder, killed(["trainer: ...", done.replace("4 steps", "x steps")] + tail))
        kw = dict(ledger_path=str(tmp_path / f"l{n}.jsonl"),
                  results_dir=str(tmp_path / f"results{n}"),
                  releases_root=str(tmp_path / f"releases{n}"), shared_data=shared)
        assert _ingest(folder, tmp_path, **kw) == []  # plain ingest: nothing to record
        if match:
            with pytest.raises(IngestError, match=match):
                _ingest(folder, tmp_path, salvage=True, **kw)
            assert ledger.read(kw["ledger_path"]) == []
            continue
        (line,) = _ingest(folder, tmp_path, salvage=True, **kw)
        m = line["metrics"]
        assert (m["steps"], m["summary"]["seconds"], m["stopped_by"]) == (4, 3.0, "max_steps")
        assert m["salvaged"] == dict(status="timeout", returncode=-9)
        assert set(m["check"]) == {"learned", "untrained"}
        card = open(os.path.join(kw["releases_root"], mod.RELEASE, "README.md"),
                    encoding="utf-8").read()
        assert "--salvage" in card and "killed after saving its predictor" in card
        assert "salvaged" in open(os.path.join(kw["results_dir"], mod.RESULTS),
                                  encoding="utf-8").read()
        # the predictor did not come back: nothing to salvage
        os.remove(os.path.join(folder, "predictor", "model.safetensors"))
        _edit_manifest(folder, lambda m: m["files"].pop("predictor/model.safetensors"))
        with pytest.raises(IngestError, match="did not come back"):
            _ingest(folder, tmp_path, salvage=True, **dict(kw, ledger_path=str(tmp_path / "x")))
    with pytest.raises(IngestError, match="no failed key"):  # nothing failed
        _ingest(out, tmp_path, salvage=True, shared_data=shared,
                releases_root=str(tmp_path / "r"))


@pytest.mark.slow
def test_pixel_pretraining_stops_cleanly_at_its_time_budget(tmp_path):
    """The pixel-pretrain slice's deadline: training stops after the step in progress and
    the predictor is still saved (a budget of 0 s: one step of the 4 configured)."""
    from benchmarks.gpu import data
    from benchmarks.gpu.slices.pixel_pretrain import recipe
    from benchmarks.gpu.slices.pretraining import Deadline
    from glomo_pyg.training import PretrainConfig, run_pretraining

    archives = data.write_toy_archives([data.IMAGENET[0]], str(tmp_path / "archives"))
    data.build(archives, str(tmp_path / "data"), log=quiet)
    r = recipe(True)
    settings = dict(output_dir=str(tmp_path / "run"), model=r["model"],
                    corpus=dict(r["corpus"], path=str(tmp_path / "data" / "imagenet32")),
                    train=dict(r["train"], accelerator="cpu", threads=1))
    deadline = Deadline(0.0)
    summary = run_pretraining(PretrainConfig.from_dict(settings), extra_callbacks=[deadline])
    assert deadline.stopped_at == 1 and summary["steps"] == 1 < r["train"]["max_steps"]
    assert os.path.exists(tmp_path / "run" / "predictor" / "model.safetensors")


def test_committed_results_blocks_match_the_ledger_and_the_current_recipes(tmp_path):
    """The GPU blocks of benchmarks/results are what the committed ledger and today's
    recipes generate (a recipe changed without regenerating them would leave a stale
    digest there)."""
    results = os.path.join(ROOT, "benchmarks", "results")
    names = {campaign.slice_module(n).RESULTS for n in campaign.MODULES}
    for name in names:
        shutil.copy(os.path.join(results, name), tmp_path / name)
    written = report.regenerate(ledger.read(runner.default_ledger()), str(tmp_path),
                                log=quiet)
    assert written == [], f"run report.regenerate: {written} would change"


@pytest.mark.parametrize("name", ["pixel-pretrain", "text-pretrain"])
def test_a_pretraining_whose_graphs_barely_trained_is_not_released(name, tmp_path):
    mod = campaign.slice_module(name)
    line = dict(metrics=dict(graph_steps=mod.MIN_GRAPH_STEPS - 1), commit="c" * 40)
    with pytest.raises(ValueError, match=f"trained for {mod.MIN_GRAPH_STEPS - 1} steps past "
                                         f"the warm-up \\(fewer than {mod.MIN_GRAPH_STEPS}\\)"):
        mod.ingest([line], str(tmp_path), dict(dry_run=False, recipe=mod.recipe(False)),
                   str(tmp_path / "releases"), quiet, shared_data=str(tmp_path))
    assert not os.path.exists(tmp_path / "releases")


def test_text_pretrain_names_a_missing_treebank_and_salvages_only_its_key(tmp_path):
    from benchmarks.gpu.slices import text_pretrain

    with pytest.raises(ValueError, match=f"{data.EWT} is missing: the graphs are scored"):
        text_pretrain.syntax_check(str(tmp_path), text_pretrain.recipe(True), str(tmp_path))
    with pytest.raises(ValueError, match="text-pretrain has no run 'x' to salvage"):
        text_pretrain.salvage(dict(key="x"), dict(files={}))


def test_imdb_uses_the_best_text_release_there_is(tmp_path, monkeypatch):
    """imdb runs with the GPU text release once text-pretrain (which comes first) has made
    it, else with the CPU release; its recipe names the release and its window length."""
    from benchmarks.gpu.slices import imdb

    order = [s.slice for s in schedule.STAGES]
    assert order.index("text-pretrain") < order.index("imdb")
    assert schedule.NEEDS["imdb"] == "text-pretrain"
    monkeypatch.setenv("GLOMO_PRETRAINED_DIR", str(tmp_path))
    assert imdb.keys(imdb.recipe(False)) == []
    assert "pretrained/imdb-text, pretrained/imdb-text-cpu" in imdb.blocked(imdb.recipe(False))
    shutil.copytree(os.path.join(ROOT, "pretrained", "imdb-text-cpu"), tmp_path / "imdb-text-cpu")
    cpu = imdb.recipe(False)
    assert (cpu["predictor"]["release"], cpu["max_distance"]) == ("imdb-text-cpu", 63)
    assert imdb.blocked(cpu) is None and len(imdb.keys(cpu)) == 30
    shutil.copytree(tmp_path / "imdb-text-cpu", tmp_path / "imdb-text")
    config_path = tmp_path / "imdb-text" / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps(dict(config, trained_length=128)))
    gpu = imdb.recipe(False)
    assert (gpu["predictor"]["release"], gpu["max_distance"]) == ("imdb-text", 127)
    assert campaign.recipe_digest("imdb", gpu) != campaign.recipe_digest("imdb", cpu)
