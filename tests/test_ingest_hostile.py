"""``python -m benchmarks.gpu ingest`` against a hostile returned folder: verdicts are
computed, never taken; each file is read once; the manifest is checked against its schema
before anything is written; the writes are all or none; embedded strings are escaped."""
import hashlib
import json
import os
import shutil
import subprocess

import pytest
import torch

from benchmarks.gpu import campaign, files, ingest, ledger, manifest, report
from benchmarks.gpu.__main__ import main
from benchmarks.gpu.ingest import IngestError
from benchmarks.gpu.ledger import LedgerError
from benchmarks.gpu.runner import FORMAT, ROOT, default_ledger
from benchmarks.gpu.slices import pixel_pretrain

HEAD = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                      text=True, check=True).stdout.strip()
ENV = dict(device="CPU (x86_64, 2 threads)", python="3.12.3", torch="2.11.0+cpu",
           numpy="2.5.2", cuda=None, host="box", cpus=2, lightning="2.6.6",
           torch_geometric="2.8.0", triton=None)
PRETRAIN_METRICS = dict(summary=dict(steps=4, seconds=2.0, val_loss=5.0), steps=4,
                        graph_steps=3, seconds_per_step=0.5, stopped_by="max_steps",
                        step_ms=None)
FAKE_CHECK = dict(check=dict(learned={}, untrained={}), check_images=2,
                  check_device="CPU (at ingest)")


def quiet(*args):
    pass


def _pixel_predictor(folder):
    from benchmarks.gpu.slices.common import untrained_pixel_predictor

    model = pixel_pretrain.recipe(True)["model"]
    untrained_pixel_predictor(model, side=8).save_pretrained(folder, dtype=torch.float16)


def _write(folder, slice_name="profile", runs=None, predictor=None, raw=None, **fields):
    """A returned folder of ``slice_name``'s dry run, digests right; ``raw(text)`` edits
    the manifest's JSON text (what json.dump cannot write)."""
    os.makedirs(folder)
    with open(os.path.join(folder, "run.log"), "w") as fh:
        fh.write("ran\n")
    if predictor == "pixels":
        _pixel_predictor(os.path.join(folder, "predictor"))
    elif predictor == "text":
        shutil.copytree(os.path.join(ROOT, "pretrained", "imdb-text-cpu"),
                        os.path.join(folder, "predictor"))
        os.remove(os.path.join(folder, "predictor", "README.md"))
    recipe = campaign.slice_module(slice_name).recipe(True)
    if runs is None:
        runs = [dict(key="pixel-pretrain-step", seconds=1.0, status="ok",
                     metrics=dict(median_ms=1.5, steps=3))]
    m = dict(format=FORMAT, run="0123456789ab", slice=slice_name, recipe=recipe,
             recipe_digest=campaign.recipe_digest(slice_name, recipe), carried={},
             commit=HEAD, dirty=False, dry_run=True, environment=dict(ENV),
             date="2026-11-27T12:00:00+00:00", budget_s=600, data_s=1.0, runs=runs,
             failures=[], skipped=[], wall_s=2.0)
    m.update(fields)
    m["files"] = {rel: dict(bytes=size, sha256=files.sha256(os.path.join(folder, rel)))
                  for rel, size in files.listing(folder)}
    text = json.dumps(m)
    with open(os.path.join(folder, files.MANIFEST), "w") as fh:
        fh.write(raw(text) if raw else text)
    return folder


def _pixel(folder, **kw):
    return _write(folder, "pixel-pretrain", predictor=kw.pop("predictor", "pixels"),
                  runs=kw.pop("runs", [dict(key="pretrain", seconds=3.0, status="ok",
                                            metrics=json.loads(json.dumps(PRETRAIN_METRICS)))]),
                  **kw)


@pytest.fixture
def state(tmp_path, monkeypatch):
    """Where ingest writes, already holding a ledger, results and a release."""
    monkeypatch.setattr(pixel_pretrain, "graph_check", lambda *a, **k: dict(FAKE_CHECK))
    kw = dict(ledger_path=str(tmp_path / "state" / "ledger.jsonl"),
              results_dir=str(tmp_path / "state" / "results"),
              releases_root=str(tmp_path / "state" / "releases"), dry_run=True, log=quiet,
              shared_data=str(tmp_path / "no-data"))
    ingest.ingest(_write(str(tmp_path / "first")), **kw)
    ingest.ingest(_pixel(str(tmp_path / "first-pixel")),
                  **dict(kw, ledger_path=str(tmp_path / "state" / "other.jsonl")))
    return kw


def _snapshot(root):
    out = {}
    for top, dirs, names in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(top, d), root) + "/"] = None
        for n in names:
            with open(os.path.join(top, n), "rb") as fh:
                out[os.path.relpath(os.path.join(top, n), root)] = fh.read()
    return out


def _unchanged(tmp_path, before):
    assert _snapshot(str(tmp_path / "state")) == before


# -- verdicts: computed by ingest, never taken from the folder ---------------------------

@pytest.mark.parametrize("field", manifest.VERDICTS)
def test_a_returned_verdict_is_refused(field, tmp_path, state):
    before = _snapshot(str(tmp_path / "state"))
    forged = dict(PRETRAIN_METRICS, **{field: {"forward": "excellent"}})
    folder = _pixel(str(tmp_path / "r"), runs=[dict(key="pretrain", seconds=3.0,
                                                    metrics=forged)])
    with pytest.raises(IngestError, match=f"holds \\['{field}'\\]: verdicts are computed"):
        ingest.ingest(folder, **state)
    _unchanged(tmp_path, before)


def test_the_graph_check_is_always_made_at_ingest(tmp_path, state, monkeypatch):
    seen = []
    monkeypatch.setattr(pixel_pretrain, "graph_check",
                        lambda d, *a, **k: seen.append(d) or dict(FAKE_CHECK))
    (line,) = ingest.ingest(_pixel(str(tmp_path / "r")),
                            **dict(state, ledger_path=str(tmp_path / "l.jsonl")))
    assert len(seen) == 1 and line["metrics"]["check_device"] == "CPU (at ingest)"


# -- each file read once, into ingest's own copy ------------------------------------------

def test_a_file_swapped_after_its_check_is_never_read(tmp_path, state, monkeypatch):
    folder = _pixel(str(tmp_path / "r"))
    weights = os.path.join(folder, "predictor", "model.safetensors")
    listed = files.read_json(os.path.join(folder, files.MANIFEST), "m")["files"]
    copy = files.copy_private

    def copy_then_swap(src_folder, rel, private, limit):
        got = copy(src_folder, rel, private, limit)
        if rel in ("predictor/model.safetensors", files.MANIFEST):  # swapped once read
            with open(os.path.join(src_folder, rel), "r+b") as fh:
                fh.seek(100)
                fh.write(b"\x00SWAPPED\x00")
        return got

    seen = []

    def check(predictor_dir, *a, **k):
        with open(os.path.join(predictor_dir, "model.safetensors"), "rb") as fh:
            seen.append((predictor_dir, hashlib.sha256(fh.read()).hexdigest()))
        return dict(FAKE_CHECK)

    monkeypatch.setattr(files, "copy_private", copy_then_swap)
    monkeypatch.setattr(pixel_pretrain, "graph_check", check)
    ingest.ingest(folder, **dict(state, ledger_path=str(tmp_path / "l.jsonl")))
    ((used, digest),) = seen
    assert not used.startswith(folder)  # the private copy, not the returned folder
    assert digest == listed["predictor/model.safetensors"]["sha256"] != files.sha256(weights)


# -- the schema: refused before anything is written ---------------------------------------

def _failures(value):
    return lambda f: _write(f, failures=value)


def _pixel_metrics(**changes):
    return lambda f: _pixel(f, runs=[dict(key="pretrain", seconds=3.0,
                                          metrics=dict(PRETRAIN_METRICS, **changes))])


def _summary(**changes):
    return _pixel_metrics(summary=dict(PRETRAIN_METRICS["summary"], **changes))


def _env(**changes):
    return lambda f: _write(f, environment=dict(ENV, **changes))


MALFORMED = {
    "failure-not-an-object": (_failures(["boom"]), r"'failures\[0\]' must be an object"),
    "failure-key-a-number": (_failures([dict(key=3, status="failed")]),
                             r"'failures\[0\].key' must be a plain string"),
    "failure-tail-an-object": (_failures([dict(key="pretrain", status="timeout",
                                               tail={"a": 1})]), r"failures\[0\].tail"),
    "lone-surrogate-in-run": (lambda f: _write(f, raw=lambda t: t.replace(
        '"0123456789ab"', '"0123456789a\\ud800"')), "not UTF-8"),
    "summary-seconds-a-string": (_summary(seconds="long"), "summary.seconds' must be a finite"),
    "summary-not-an-object": (_pixel_metrics(summary=[1]), "summary' must be an object"),
    "steps-null": (_pixel_metrics(steps=None), r"\.steps' must be an integer"),
    "stopped-by-other": (_pixel_metrics(stopped_by="<b>"), "stopped_by"),
    "overflowing-number": (lambda f: _write(f, raw=lambda t: t.replace(
        '"median_ms": 1.5', '"median_ms": 1e999')), "1e999 is not a finite number"),
    "nan": (lambda f: _write(f, raw=lambda t: t.replace('"median_ms": 1.5',
                                                        '"median_ms": NaN')), "NaN is not JSON"),
    "commit-revision-expression": (lambda f: _write(f, commit="HEAD~" + "0" * 35),
                                   "40 lowercase hex"),
    "commit-upper-case": (lambda f: _write(f, commit=HEAD.upper()), "40 lowercase hex"),
    "run-end-marker": (lambda f: _write(f, run="<!-- gpu:pixel-pretrain end -->"),
                       "'run' must be 12 lowercase hex"),
    "date-table": (lambda f: _write(f, date="2026-11-27\n| a | b |\n|---|---|"),
                   "'date' must be an ISO-8601"),
    "date-impossible": (lambda f: _write(f, date="2026-13-45T12:00:00+00:00"), "valid ISO"),
    "device-script": (_env(device="<script>alert(1)</script>"), "environment.device"),
    "device-comment": (_env(device="H100 -- x"), "environment.device"),
    "version-pipe": (_env(torch="2.11|x"), "environment.torch"),
    "version-backtick": (_env(cuda="`x`"), "environment.cuda"),
    "environment-nested": (_env(extra={"a": 1}), "environment.extra"),
    "deep-nesting": (lambda f: _write(f, raw=lambda t: t.replace(
        '"carried": {}', '"carried": ' + "[" * 5000 + "]" * 5000)), "nested deeper than"),
    "seconds-negative": (lambda f: _write(f, runs=[dict(key="pixel-pretrain-step",
                                                         seconds=-1, metrics={})]),
                         r"runs\[0\].seconds"),
    "metrics-key-markup": (lambda f: _write(f, runs=[dict(key="pixel-pretrain-step",
                                                           metrics={"<b>": 1})]),
                           "metrics key"),
    "files-bytes-a-string": (lambda f: _write(f, raw=lambda t: t.replace(
        '"bytes": 4', '"bytes": "4"')), r"files\['run.log'\].bytes"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_manifest_is_refused_and_nothing_changes(case, tmp_path, state):
    make, message = MALFORMED[case]
    before = _snapshot(str(tmp_path / "state"))
    folder = str(tmp_path / "r")
    make(folder)
    with pytest.raises(IngestError, match=message):
        ingest.ingest(folder, **state)
    with pytest.raises(SystemExit, match="^benchmarks.gpu ingest: "):  # no traceback
        main(["ingest", folder, "--dry-run", "--ledger", state["ledger_path"],
              "--results-dir", state["results_dir"], "--releases-root",
              state["releases_root"]])
    _unchanged(tmp_path, before)


def test_a_plain_manifest_is_accepted_as_the_runner_writes_it(tmp_path):
    m = json.loads(json.dumps(dict(format=FORMAT, run="0123456789ab", slice="profile",
                                   recipe={}, recipe_digest="0" * 16, commit=HEAD,
                                   environment=ENV, date="2026-11-27T12:00:00+00:00",
                                   runs=[], files={})))
    assert manifest.check(m) is m


# -- the wrong modality -------------------------------------------------------------------

def test_a_text_predictor_for_the_pixel_slice_is_refused(tmp_path, state):
    before = _snapshot(str(tmp_path / "state"))
    folder = _pixel(str(tmp_path / "r"), predictor="text")
    with pytest.raises(IngestError, match="wrong modality"):
        ingest.ingest(folder, **dict(state, ledger_path=str(tmp_path / "state" / "x.jsonl")))
    _unchanged(tmp_path, before)


def test_a_pixel_predictor_for_the_text_slice_is_refused(tmp_path, state):
    folder = _write(str(tmp_path / "r"), "text-pretrain", predictor="pixels",
                    runs=[dict(key="pretrain", seconds=3.0, metrics=PRETRAIN_METRICS)])
    with pytest.raises(IngestError, match="wrong modality"):
        ingest.ingest(folder, **dict(state, ledger_path=str(tmp_path / "state" / "x.jsonl")))


# -- all or none ---------------------------------------------------------------------------

def _raise(*args, **kwargs):
    raise RuntimeError("killed midway")


def _rename_of_results_fails(monkeypatch):
    """``os.rename`` failing when the new results file would take its place: after the
    release was renamed into place and the old results file renamed aside."""
    rename, calls = os.rename, []

    def flaky(src, dst):
        calls.append(str(dst))
        if os.path.basename(str(dst)) == pixel_pretrain.RESULTS and \
                calls.count(str(dst)) == 1:  # (once: undoing it renames it back)
            raise OSError("killed midway")
        return rename(src, dst)
    monkeypatch.setattr(ingest.os, "rename", flaky)
    return calls


@pytest.mark.parametrize("where", ["release", "results", "ledger", "rename"])
def test_ingest_writes_all_or_none(where, tmp_path, state, monkeypatch):
    """A pixel run into a ledger that holds runs, over an earlier release: killed while
    releasing, regenerating the results, staging the ledger or renaming into place, the
    ledger, results and releases are exactly as before."""
    from glomo_pyg import publish

    kw = dict(state, ledger_path=state["ledger_path"])
    before = _snapshot(str(tmp_path / "state"))
    folder = _pixel(str(tmp_path / "r"), run="abcdef012345")  # (a new block in the results)
    if where == "release":
        monkeypatch.setattr(publish, "write_release", _raise)
    elif where == "results":
        monkeypatch.setattr(report, "render", _raise)
    elif where == "ledger":
        monkeypatch.setattr(ledger, "staged", _raise)
    else:
        calls = _rename_of_results_fails(monkeypatch)
    with pytest.raises((RuntimeError, OSError), match="killed midway"):
        ingest.ingest(folder, **kw)
    if where == "rename":
        release = os.path.join(kw["releases_root"], pixel_pretrain.RELEASE)
        assert release in calls  # the new release was in place, then undone
    _unchanged(tmp_path, before)
    monkeypatch.undo()
    monkeypatch.setattr(pixel_pretrain, "graph_check", lambda *a, **k: dict(FAKE_CHECK))
    (line,) = ingest.ingest(folder, **kw)  # and the same folder then goes in whole
    assert [l["key"] for l in ledger.read(kw["ledger_path"])][-1] == "pretrain"
    assert os.path.isfile(os.path.join(kw["releases_root"], pixel_pretrain.RELEASE,
                                       "README.md"))
    assert not [n for n in os.listdir(kw["releases_root"]) if n.startswith(".")]


# -- the ledger and the Markdown ---------------------------------------------------------

@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, '{"a": Infinity}',
                                  '{"a": 1e999}'])
def test_a_hostile_ledger_line_is_a_ledger_error(text, tmp_path):
    path = tmp_path / "ledger.jsonl"
    path.write_text(text + "\n")
    with pytest.raises(LedgerError, match="ledger.jsonl:1 is not JSON"):
        ledger.read(str(path))


def test_the_committed_ledger_still_reads():
    # Every committed line parses (the ledger only grows: 7 runs when this test was written).
    with open(default_ledger()) as f:
        lines = [line for line in f if line.strip()]
    assert len(ledger.read(default_ledger())) == len(lines) >= 7


def test_markdown_escapes_what_it_embeds():
    assert report.md("<script>x</script>") == "&lt;script&gt;x&lt;/script&gt;"
    assert report.md("a|b`c\nd") == "a\\|b\\`c d"
    assert "--" not in report.md("<!-- gpu:x end -->") and "<" not in report.md("<!--")
    assert report.md("NVIDIA H100 80GB HBM3") == "NVIDIA H100 80GB HBM3"
    assert report.code("a`b\nc") == "`a'b c`"


def test_a_block_never_holds_a_comment_marker(tmp_path):
    digest = campaign.recipe_digest("pixel-pretrain", pixel_pretrain.recipe(True))
    line = dict(slice="pixel-pretrain", recipe=digest, key="pretrain", run="<!-- x -->",
                commit="0" * 40, date="d", device="<script>", versions={}, seconds=1.0,
                metrics=dict(PRETRAIN_METRICS), dry_run=True)
    text = "\n".join(report.render([line], str(tmp_path), True)[
        os.path.join(str(tmp_path), pixel_pretrain.RESULTS)].split("\n"))
    assert text.count("<!-- gpu:pixel-pretrain end -->") == 1
    assert "<script>" not in text and "&lt;script&gt;" in text
    with pytest.raises(report.ReportError, match="comment marker"):
        report._no_markers("speed", ["ok", "x <!-- gpu:speed end --> y"])


def test_returned_markdown_lines_hold_no_html():
    from benchmarks.gpu.report import ReportError, no_html

    fine = ["| op | ms |", "| `kernel<128, 2>` | 1.0 |", "time <= 150 ms, a < b"]
    assert no_html("speed x", fine) == fine
    for bad in ("<script>alert(1)</script>", "x <img src=x onerror=y>", "</table>",
                "<!doctype html>"):
        with pytest.raises(ReportError, match="speed x returned a results line that is not"):
            no_html("speed x", [bad])
