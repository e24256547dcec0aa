"""The GPU campaign's harness (``benchmarks.gpu``) on the CPU: the profile slice's dry
run end to end once (prepare, run, ingest), then what each step refuses."""
import glob
import json
import os
import shutil
import types

import pytest
import torch

from benchmarks.gpu import campaign, data, files, ingest, ledger, limits, report, runner
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
    assert m["recipe"] == recipe and m["recipe_digest"] == campaign.digest(recipe)
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
        assert json.load(fh)["recipe_digest"] == campaign.digest(profile.recipe(True))
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
    digest = campaign.digest(profile.recipe(True))
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
    assert campaign.next_slice(lines, dry_run=True) != "profile"
    assert campaign.next_slice(lines, dry_run=False) == "profile"  # dry runs are not real ones


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
    m["recipe_digest"] = campaign.digest(m["recipe"])


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
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_ingest_refuses(case, returned, tmp_path):
    damage, message = REFUSALS[case]
    damage(returned)
    with pytest.raises(IngestError, match=message):
        _ingest(returned, tmp_path)
    assert not os.path.exists(tmp_path / "ledger.jsonl")  # refused before writing
    assert not os.path.exists(tmp_path / "results")


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
                                  recipe_digest=campaign.digest(real)))
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
                                recipe_digest=campaign.digest(profile.recipe(False))))
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
    assert marked and set(profile.CUDA_TEST_FILES) == marked
    assert len(profile.CUDA_TEST_FILES) == len(marked)
    assert profile.recipe(False)["tests"] == ["-m", "cuda", *profile.CUDA_TEST_FILES]


def test_recipes_and_digests():
    dry, real = profile.recipe(True), profile.recipe(False)
    assert campaign.digest(dry) != campaign.digest(real)
    assert campaign.digest(dict(reversed(list(real.items())))) == campaign.digest(real)
    assert len(campaign.digest(real)) == 16
    assert all(profile.min_seconds(k, real) >= 30 for k in PROFILE_KEYS)
    assert set(campaign.ORDER) == set(campaign.MODULES) | set(campaign.NOT_BUILT)
    assert campaign.next_slice([]) == campaign.next_slice([], dry_run=True) == "profile"


def test_plan_names_the_next_slice(tmp_path, capsys):
    main(["plan", "--dry-run", "--ledger", str(tmp_path / "ledger.jsonl"),
          "--shared-data", str(tmp_path)])
    out = capsys.readouterr().out
    assert "ledger: 0 runs" in out and "next: profile" in out
    assert "python -m benchmarks.gpu prepare profile" in out and "MiB" in out



def _recorded(keys_by_slice, dry_run=True):
    """Ledger lines recording ``keys_by_slice`` ({slice: keys}) under the current recipes."""
    lines = []
    for name, keys in keys_by_slice.items():
        recipe = campaign.slice_module(name).recipe(dry_run)
        lines += [dict(slice=name, recipe=campaign.digest(recipe), key=k, run="r", metrics={})
                  for k in keys]
    return lines


def test_call_plan_lets_a_short_slice_share_its_call():
    """One slice takes the whole call, unless its pending keys need under half of it:
    then the next runnable slice gets what is left (the case of the first GPU session,
    whose profile left only the CUDA tests pending)."""
    real = profile.recipe(False)
    pixel = campaign.slice_module("pixel-pretrain")
    assert campaign.call_plan([], False) == [("profile", 510.0)]
    lines = _recorded({"profile": [k for k in profile.keys(real) if k != "cuda-tests"]},
                      dry_run=False)
    # pixel pretraining trains to the call's deadline: it goes first, alone
    assert pixel.WHOLE_CALL and campaign.call_plan(lines, False) == [("pixel-pretrain", 510.0)]
    lines += _recorded({"pixel-pretrain": ["pretrain"]}, dry_run=False)
    call = campaign.call_plan(lines, False)
    need = campaign.SETUP_S + profile.min_seconds("cuda-tests", real)
    assert call[0] == ("profile", need) and call[1][1] is None and len(call) == 2
    assert call[1][0] == campaign.next_slice(
        _recorded({"profile": profile.keys(real), "pixel-pretrain": ["pretrain"]},
                  dry_run=False), False) == "cifar10"
    # a smaller call: the same keys need more than half of it, so they have it alone
    assert campaign.call_plan(lines, False, budget_s=2 * need - 1) == [("profile",
                                                                       2 * need - 1)]
    command = runner.chained_command(call, [".gpu", ".gpu-2"])
    assert command.count("python3 -m benchmarks.gpu run") == 2
    assert f'--budget-s {need:.0f} --carry .gpu --out "$OUT/profile"' in command
    assert "$((t0 + 510 - $(date +%s)))" in command and len(command) <= 2000


@pytest.mark.slow
def test_chained_call_dry_run_end_to_end(tmp_path):
    """The chained call exactly as plan prints it, run by bash on the CPU (dry run): two
    prepared slices, each into its own folder under $OUT with a budget it keeps, both
    folders ingested, within what a call returns."""
    import subprocess

    pixel = campaign.slice_module("pixel-pretrain")
    call = [("profile", 40.0), ("pixel-pretrain", None)]
    carries = [_carry_name("-c1"), _carry_name("-c2")]
    rel = [os.path.relpath(c, ROOT) for c in carries]
    out = tmp_path / "out"
    out.mkdir()
    try:
        for (name, _), carry in zip(call, carries):
            runner.prepare(name, carry, None, str(tmp_path / "l0.jsonl"), dry_run=True, log=quiet)
        command = runner.chained_command(call, rel, budget_s=240, dry_run=True)
        env = dict(os.environ, OUT=str(out), GLOMO_GPU_BLOCK_MODULES="gensim,conllu")
        proc = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
    finally:
        for carry in carries:
            shutil.rmtree(carry, ignore_errors=True)
    files.check_limits(str(out))
    console = (out / files.CONSOLE).read_text()
    assert "slice profile" in console and "slice pixel-pretrain" in console
    assert "budget 40 s" in console
    shared = str(tmp_path / "shared")
    data.write_toy_archives(list(pixel.ARCHIVES), shared)
    kw = dict(ledger_path=str(tmp_path / "ledger.jsonl"), results_dir=str(tmp_path / "res"),
              releases_root=str(tmp_path / "rel"), shared_data=shared)
    new = _ingest(str(out / "profile"), tmp_path, **kw) + _ingest(str(out / "pixel-pretrain"),
                                                                  tmp_path, **kw)
    assert {l["slice"] for l in new} == {"profile", "pixel-pretrain"}
    assert os.path.isdir(os.path.join(kw["releases_root"], pixel.RELEASE))


# -- the other slices' dry runs: prepare, run, ingest (a release, the results) ------------

@pytest.mark.slow
@pytest.mark.parametrize("name", ["pixel-pretrain", "cifar10", "text-pretrain", "imdb", "speed"])
def test_dry_run_of_slice_end_to_end(name, tmp_path):
    from glomo_pyg import PretrainedGraphPredictor

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
    new = ingest.ingest(str(tmp_path / "out"), ledger_path, results, releases, True, log=quiet,
                        shared_data=shared)
    assert [l["key"] for l in new] == ([fail] if fail else mod.keys(recipe))
    new = ledger.read(ledger_path)
    assert sorted(l["key"] for l in new) == sorted(mod.keys(recipe))
    text = open(os.path.join(results, mod.RESULTS), encoding="utf-8").read()
    assert f"<!-- gpu:{name} begin" in text and f"<!-- gpu:{name} end -->" in text
    if name == "pixel-pretrain":
        (line,) = new
        assert line["metrics"]["steps"] == recipe["train"]["max_steps"]
        check = line["metrics"]["check"]  # made by ingest, on the CPU
        assert set(check) == {"learned", "untrained"} and set(check["learned"]) == {
            "forward", "backward"}
        assert line["metrics"]["check_device"] == "CPU (at ingest)"
        assert line["metrics"]["check_images"] == 2 and "salvaged" not in line["metrics"]
        predictor = PretrainedGraphPredictor.from_pretrained(
            os.path.join(releases, mod.RELEASE))
        assert predictor.trained_size == (recipe["corpus"]["crop"],) * 2
        card = open(os.path.join(releases, mod.RELEASE, "README.md"), encoding="utf-8").read()
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
            os.path.join(releases, mod.RELEASE))
        assert predictor.trained_length == recipe["corpus"]["max_length"]
        assert len(predictor.vocabulary) == m["summary"]["vocabulary"]
        card = open(os.path.join(releases, mod.RELEASE, "README.md"), encoding="utf-8").read()
        assert line["commit"] in card and m["syntax_text"] in card
        assert f"max_distance={recipe['corpus']['max_length'] - 1}" in card
        assert f"{len(predictor.vocabulary)}-word lower-cased vocabulary" in card
        assert "ran to max_steps after" in card and "wall clock" not in card
        assert "chosen graph" in text and "imdb-gpu-release.yaml" in text
        assert sorted(manifest["files"]) == ["predictor/config.json",
                                             "predictor/model.safetensors", "run.log"]
    elif name == "cifar10":
        accs = [l["metrics"]["test_acc"] for l in new]
        assert all(0 <= a <= 1 for a in accs)
        assert "glomo − baseline" in text
        assert any(l["metrics"]["propagations_s"] > 0 for l in new if "/glomo/" in l["key"])
    elif name == "imdb":
        assert all(0 <= l["metrics"]["test_acc"] <= 1 for l in new)
        assert "glomo − baseline" in text and recipe["predictor"]["release"] in text
        assert set(manifest["carried"]) == {"embedding.npy", "embedding.json"}
    else:  # speed: each section's table, as benchmarks.speed writes it
        assert all(l["metrics"]["lines"][0].startswith("### ") for l in new)
        assert "##### Fused layout" in text
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


def test_translate_moves_maps_and_fills_with_zeros():
    from benchmarks.gpu.slices.cifar10 import translate

    maps = torch.arange(2 * 3 * 5 * 5, dtype=torch.float32).view(2, 3, 5, 5) + 1
    shift = torch.tensor([[1, -2], [0, 0]])
    out = translate(maps, shift, 2)
    assert torch.equal(out[1], maps[1])
    # image 0 moved one row down and two columns left
    assert torch.equal(out[0, :, 1:, :3], maps[0, :, :4, 2:])
    assert (out[0, :, 0, :] == 0).all() and (out[0, :, :, 3:] == 0).all()
    assert torch.equal(translate(maps, torch.zeros(2, 2, dtype=torch.long), 2), maps)
    assert torch.equal(translate(maps, shift, 0), maps)


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
    summary = run_pretraining(PretrainConfig.from_dict(settings), extra_callbacks=[deadline],
                              log=quiet)
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

    assert campaign.ORDER.index("text-pretrain") < campaign.ORDER.index("imdb")
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
    assert campaign.digest(gpu) != campaign.digest(cpu)
