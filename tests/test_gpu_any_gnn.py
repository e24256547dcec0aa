"""The GPU campaign's any-gnn slices (``benchmarks/gpu/slices/any_gnn.py``) on the CPU:
their recipes and keys, their place in the schedule, a dry run of their keys through
``run_key`` on toy data, and the rendering of their results blocks."""
import json
import math
import os
import time

import pytest
import torch

from benchmarks.gpu import campaign, data, ingest, ledger, limits, report, runner, schedule
from benchmarks.gpu.__main__ import main
from benchmarks.gpu.slices import any_gnn

NAMES = ("any-gnn-imdb", "any-gnn-cifar10")


def quiet(*args):
    pass


def _mod(name):
    return campaign.slice_module(name)


# -- registration and schedule -----------------------------------------------------------

def test_both_slices_are_registered_with_their_own_archive():
    for name, task in zip(NAMES, ("imdb", "cifar10")):
        assert name in campaign.ORDER and campaign.MODULES[name] == "any_gnn"
        mod = _mod(name)
        assert mod is _mod(name) and mod.TASK == task and mod.RESULTS == "any_gnn.md"
        assert mod.ARCHIVES == any_gnn.ARCHIVES_OF[task] and len(mod.ARCHIVES) == 1
        assert getattr(mod, "KEYS_PER_PROCESS", 1) is None
        assert mod.recipe(False)["task"] == task
    # the slices of every other module are the modules themselves
    from benchmarks.gpu.slices import imdb
    assert campaign.slice_module("imdb") is imdb
    with pytest.raises(ValueError, match="not 'any-gnn'"):
        any_gnn.slice_for("any-gnn")


def test_each_call_carries_within_the_limit():
    """Why two slices: both archives and the tree would be over a call's 64 MiB."""
    shared = os.path.join(os.path.dirname(runner.ROOT), "shared", "data")
    sizes = {a: os.path.getsize(os.path.join(shared, a)) for a in (data.IMDB, data.CIFAR)
             if os.path.isfile(os.path.join(shared, a))}
    if len(sizes) < 2:
        pytest.skip("the project's data folder is not here")
    tree = runner.travelling_bytes()
    assert tree + sum(sizes.values()) > limits.CARRY_BYTES
    for name in NAMES:
        assert tree + sum(sizes[a] for a in _mod(name).ARCHIVES) < limits.CARRY_BYTES


def test_the_schedule_runs_any_gnn_after_the_papers_results_and_before_the_fillers():
    order = [s.slice for s in schedule.STAGES]
    last_imdb = max(i for i, s in enumerate(order) if s == "imdb")
    for name in NAMES:
        assert last_imdb < order.index(name) < order.index("profile") < order.index("speed")
    assert schedule.NEEDS["any-gnn-imdb"] == "imdb"
    assert schedule.NEEDS["any-gnn-cifar10"] == "cifar10"
    assert {s.slice for s in schedule.STAGES} == set(campaign.ORDER)
    assert set(campaign.ORDER) == set(campaign.MODULES) | set(campaign.NOT_BUILT)


def _recorded(names, dry_run=False):
    lines = []
    for name in names:
        recipe = _mod(name).recipe(dry_run)
        lines += [dict(slice=name, recipe=campaign.recipe_digest(name, recipe), key=k,
                       run="r", metrics={}) for k in _mod(name).keys(recipe)]
    return lines


def test_any_gnn_waits_for_the_papers_runs_of_its_task():
    real = {n: _mod(n).recipe(False) for n in NAMES}
    if not all(_mod(n).keys(r) for n, r in real.items()):
        pytest.skip("a release any-gnn uses is not in this checkout")
    lim = limits.JobLimits()
    # nothing recorded: neither any-gnn slice is in the next allocation
    assert all(p.slice not in NAMES for c in schedule.allocation([], False, lim)
               for p in c.parts)
    paper = ("profile", "pixel-pretrain", "cifar10", "text-pretrain")
    calls = schedule.allocation(_recorded(paper), False, lim)  # imdb pending
    assert calls[0].parts[0].slice == "imdb"
    assert all(p.slice != "any-gnn-imdb" for c in calls for p in c.parts)
    calls = schedule.allocation(_recorded(paper + ("imdb",)), False, lim)
    first = calls[0].parts[0]
    assert first.slice == "any-gnn-imdb" and first.keys[0] == "imdb/glomo/seed0"
    # its estimate: the reviews, GLoMo's datasets once, then each run
    est = any_gnn.estimate_seconds(first.keys, real["any-gnn-imdb"], [])
    assert first.seconds == schedule.SETUP_S + est <= calls[0].budget_s
    assert est == any_gnn.DATA_S["imdb"] + any_gnn.GRAPHS_S[("imdb", "glomo")] + \
        any_gnn.RUN_S[("imdb", "glomo")] * len(first.keys)
    assert schedule.ordered_pending("any-gnn-cifar10", []) == \
        _mod("any-gnn-cifar10").keys(real["any-gnn-cifar10"])


def test_estimates_use_the_recorded_runs():
    recipe = _mod("any-gnn-cifar10").recipe(False)
    keys = ["cifar10/grid/seed0", "cifar10/grid/seed1"]
    prior = any_gnn.estimate_seconds(keys, recipe, [])
    assert prior == any_gnn.DATA_S["cifar10"] + any_gnn.GRAPHS_S[("cifar10", "grid")] + \
        2 * any_gnn.RUN_S[("cifar10", "grid")]
    recorded = [dict(key="cifar10/grid/seed0", metrics=dict(train_s=100.0, graphs_s=50.0,
                                                            data_s=0.0)),
                dict(key="cifar10/glomo/seed0", metrics=dict(train_s=900.0, graphs_s=900.0,
                                                             data_s=10.0))]
    assert any_gnn.estimate_seconds(keys, recipe, recorded) == pytest.approx(
        11.0 + 55.0 + 2 * 110.0)
    assert any_gnn.min_seconds("cifar10/glomo/seed0", recipe) == \
        any_gnn.RUN_S[("cifar10", "glomo")] + any_gnn.GRAPHS_S[("cifar10", "glomo")] + \
        any_gnn.DATA_S["cifar10"]


def test_plan_lists_the_slices_pending(capsys, tmp_path):
    main(["plan", "--returns", str(tmp_path / "none")])
    out = capsys.readouterr().out
    for name in NAMES:
        line = next(l for l in out.splitlines() if l.strip().startswith(name + " "))
        assert "pending" in line or "blocked" in line
    assert "any-gnn-imdb    recipe" in out and "carries aclImdb.tar.xz" in out


# -- recipes and keys --------------------------------------------------------------------

def test_recipes_keys_and_digests():
    from benchmarks.any_gnn import CIFAR_FULL, FULL

    imdb, cifar = (_mod(n).recipe(False) for n in NAMES)
    assert imdb["predictor"]["release"] == "imdb-text-cpu"
    assert cifar["predictor"]["release"] == "imagenet32-pixel"
    assert imdb["data"]["length"] == FULL.review_length == 400
    assert cifar["data"]["side"] == FULL.image_side == 32
    assert cifar["data"]["validation"] == CIFAR_FULL["validation"]
    assert imdb["train"] == dict(epochs=FULL.epochs, batch=FULL.batch_size, lr=1e-3,
                                 optimizer="adam")
    # the stock GNN's graphs, PickConv's (pick-...) and the task-learned one, by graph
    assert imdb["graphs"] == ["glomo", "pick-glomo", "chain", "pick-chain", "learned",
                              "pick-learned"]
    assert cifar["graphs"] == ["glomo", "pick-glomo", "grid", "pick-grid", "chain", "learned",
                               "pick-learned"]
    assert any_gnn.variant("pick-learned") == ("pick", "learned")
    assert any_gnn.variant("chain") == ("graphconv", "chain")
    if imdb["predictor"]["sha256"]:
        assert _mod("any-gnn-imdb").keys(imdb) == [
            f"imdb/{g}/seed{s}" for g in imdb["graphs"] for s in range(5)]
    if cifar["predictor"]["sha256"]:
        assert len(_mod("any-gnn-cifar10").keys(cifar)) == 35
        assert _mod("any-gnn-cifar10").keys(cifar)[:6] == [
            "cifar10/glomo/seed0", "cifar10/glomo/seed1", "cifar10/glomo/seed2",
            "cifar10/glomo/seed3", "cifar10/glomo/seed4", "cifar10/pick-glomo/seed0"]
    for name, recipe in zip(NAMES, (imdb, cifar)):
        digest = campaign.recipe_digest(name, recipe)
        assert digest == campaign.recipe_digest(name, _mod(name).recipe(False))  # stable
        assert len(digest) == 16
        more = dict(recipe, seeds=10, graphs=recipe["graphs"] + ["uniform"])
        assert campaign.recipe_digest(name, more) == digest  # more seeds keep the runs
        other = dict(recipe, train=dict(recipe["train"], lr=3e-3))
        assert campaign.recipe_digest(name, other) != digest
        assert campaign.recipe_digest(name, _mod(name).recipe(True)) != digest
        assert all(_mod(name).min_seconds(k, recipe) >= 100 for k in _mod(name).keys(recipe))
    assert campaign.recipe_digest("any-gnn-imdb", imdb) != \
        campaign.recipe_digest("any-gnn-cifar10", cifar)


def test_a_missing_release_blocks_the_slice(tmp_path, monkeypatch):
    monkeypatch.setenv("GLOMO_PRETRAINED_DIR", str(tmp_path))
    recipe = _mod("any-gnn-cifar10").recipe(False)
    assert recipe["predictor"]["sha256"] is None and _mod("any-gnn-cifar10").keys(recipe) == []
    assert "pretrained/imagenet32-pixel" in any_gnn.blocked(recipe)
    assert "any-gnn-cifar10" not in schedule.pending_by_slice([], dry_run=False)


def test_cifar_samples_are_benchmarks_any_gnns(monkeypatch):
    """The slice's CIFAR-10 samples are ``benchmarks.any_gnn.cifar_samples``' at the
    recipe's sizes (those of its --full; here on 60 random images, sizes scaled down)."""
    import types

    import benchmarks.any_gnn as bench
    import glomo_pyg.data.images as images_module

    gen = torch.Generator().manual_seed(0)
    fake = {"train": (torch.randint(0, 256, (50, 3, 32, 32), dtype=torch.uint8, generator=gen),
                      torch.arange(50) % 10),
            "test": (torch.randint(0, 256, (20, 3, 32, 32), dtype=torch.uint8, generator=gen),
                     (torch.arange(20) * 3 + 1) % 10)}  # (not the training labels' pattern)
    monkeypatch.setattr(images_module, "load_cifar10", lambda root, split: fake[split])
    monkeypatch.setitem(bench.CIFAR_FULL, "validation", 7)
    monkeypatch.setitem(bench.CIFAR_FULL, "test", 11)
    recipe = any_gnn.task_recipe("cifar10", False)
    recipe["data"] = dict(recipe["data"], validation=7, test=11, side=16)
    mine = any_gnn.cifar_samples("unused", recipe)
    setup = bench.Setup(train=None, validation=7, test=11, review_length=0, image_side=16,
                        epochs=1)
    theirs = bench.cifar_samples(types.SimpleNamespace(data_dir="unused", full=True), setup)
    assert [len(mine[k]) for k in ("train", "validation", "test")] == [43, 7, 11]
    for split in mine:
        assert len(mine[split]) == len(theirs[split])
        for a, b in zip(mine[split], theirs[split]):
            assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and torch.equal(a.pos, b.pos)
    # every sample keeps the label of its own image (16x16: the 2x2 means of the image)
    picked = {}
    for split, source in (("train", "train"), ("validation", "train"), ("test", "test")):
        pooled = torch.nn.functional.avg_pool2d(fake[source][0].float(), 2).round()
        picked[split] = []
        for sample in mine[split]:
            image = sample.x.float().view(16, 16, 3).permute(2, 0, 1)
            match = [j for j in range(len(pooled)) if torch.equal(pooled[j], image)]
            assert len(match) == 1 and int(sample.y) == int(fake[source][1][match[0]]), split
            picked[split].append(match[0])
    # the seeded split, spelled out (seed 0 over 50 training images, seed 1 over 20 test)
    assert picked["validation"] == [44, 39, 7, 6, 17, 29, 21]
    assert picked["train"][:3] == [37, 33, 10] and len(set(picked["train"])) == 43
    assert picked["test"] == [5, 13, 2, 11, 19, 18, 1, 9, 4, 7, 0]


# -- the dry run of the keys through run_key ----------------------------------------------

@pytest.fixture(scope="module")
def toy_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("any-gnn-data")
    paths = data.write_toy_archives([data.IMDB, data.CIFAR], str(folder / "archives"))
    data.build(paths, str(folder / "data"), log=quiet)
    return folder


@pytest.mark.parametrize("name", NAMES)
def test_dry_run_of_every_key_gives_ledger_lines(name, toy_data, tmp_path, monkeypatch):
    mod = _mod(name)
    recipe = mod.recipe(True)
    keys = mod.keys(recipe)
    assert keys == [f"{mod.TASK}/{g}/seed0" for g in recipe["graphs"]]
    monkeypatch.setattr(any_gnn, "_STATE", {})
    torch.set_num_threads(1)
    ctx = campaign.Context(slice=name, recipe=recipe, dry_run=True,
                           data_dir=str(toy_data / "data"), out=str(tmp_path / "out"),
                           work=str(tmp_path / "work"), deadline=time.time() + 600,
                           device="cpu", log=quiet)
    runs = []
    for key in keys:
        start = time.time()
        metrics = runner.finite(mod.run_key(key, ctx))
        runs.append(dict(key=key, seconds=round(time.time() - start, 1), metrics=metrics))
        # one graph's datasets at a time: the earlier graph's cache folder is gone (PickConv
        # reuses the stock GNN's datasets; the task-learned graph stores none)
        folder = os.path.join(str(tmp_path / "work"), "any-gnn", mod.TASK)
        held = os.listdir(folder) if os.path.isdir(folder) else []
        base = any_gnn.variant(key.split("/")[1])[1]
        assert held == ([] if base == "learned" else [base])
    for r in runs:
        m = r["metrics"]
        assert 0 <= m["test_acc"] <= 1 and 0 <= m["val_acc"] <= 1 and m["best_epoch"] == 0
        assert m["relations"] == ["forward", "backward"] and m["edges_per_sample"] > 0
        assert m["samples"] == ([32, 8, 40] if mod.TASK == "imdb" else [32, 8, 20])
        assert m["graphs_s"] >= 0 and m["train_s"] >= 0
    assert runs[0]["metrics"]["data_s"] > 0 and runs[1]["metrics"]["data_s"] == 0
    assert runs[0]["metrics"]["graph_key"] == runs[1]["metrics"]["graph_key"]  # pick-glomo
    assert runs[0]["metrics"]["graph_key"] != runs[2]["metrics"]["graph_key"]
    manifest = dict(slice=name, recipe_digest=campaign.recipe_digest(name, recipe), run="0" * 12,
                    commit="c" * 40, date="2026-11-27T00:00:00+00:00", dry_run=True,
                    environment=runner.environment("cpu"), runs=runs)
    lines = ingest.ledger_lines(manifest)
    for i, line in enumerate(lines):
        ledger.check_line(json.loads(json.dumps(line, allow_nan=False)), f"line {i}")
    body = mod.report(lines, recipe)
    text = "\n".join(body)
    assert "pending" not in text and "GLoMo − chain" in text and "GLoMo − learned" in text
    assert "pick-glomo − pick-learned" in text
    rendered = report.replace_block("# any\n", name, body)
    assert f"<!-- gpu:{name} begin" in rendered and f"<!-- gpu:{name} end -->" in rendered


# -- the results blocks (rendering of fabricated ledger lines, not results) ---------------

def _line(name, key, test, val=0.8, **metrics):
    return dict(slice=name, recipe="0123456789abcdef", key=key, run="r1", commit="c" * 40,
                date="2026-11-27T00:00:00+00:00", device="NVIDIA H100 80GB HBM3",
                versions={}, seconds=100.0, dry_run=False,
                metrics=dict(dict(test_acc=test, val_acc=val, best_epoch=3, train_s=90.0,
                                  graphs_s=0.0, data_s=0.0, edges_per_sample=3976.0,
                                  relations=["forward", "backward"], graph_key="k" * 32,
                                  samples=[22500, 2500, 25000]), **metrics))


def test_report_renders_pending_graphs_and_pairs():
    recipe = _mod("any-gnn-imdb").recipe(False)
    body = any_gnn.report([], recipe)
    text = "\n".join(body)
    assert "| glomo | 0 | pending |" in text and "| chain | 0 | pending |" in text
    assert "| GLoMo − chain | pending |" in text and "Left out: uniform" in text
    body = any_gnn.report([_line("any-gnn-imdb", "imdb/glomo/seed0", 0.85)], recipe)
    text = "\n".join(body)
    assert "| glomo | 1 of 5 | 85.00 | 80.00 | 3976 | 90 |" in text
    assert "| chain | 0 | pending |" in text and "| GLoMo − chain | pending |" in text
    body = any_gnn.report([_line("any-gnn-imdb", "imdb/glomo/seed0", 0.85),
                           _line("any-gnn-imdb", "imdb/chain/seed0", 0.84)], recipe)
    assert "| GLoMo − chain | +1.00 | (one pair) | 1 | |" in "\n".join(body)


def test_report_renders_paired_differences_with_t_intervals():
    from benchmarks.reproduce.imdb import paired_difference

    recipe = _mod("any-gnn-cifar10").recipe(False)
    glomo, grid = [0.70, 0.72, 0.71], [0.68, 0.705, 0.69]
    lines = [_line("any-gnn-cifar10", f"cifar10/glomo/seed{s}", a) for s, a in enumerate(glomo)]
    lines += [_line("any-gnn-cifar10", f"cifar10/grid/seed{s}", a) for s, a in enumerate(grid)]
    lines.append(_line("any-gnn-cifar10", "cifar10/chain/seed4", 0.5))  # no common seed
    text = "\n".join(any_gnn.report(lines, recipe))
    m, lo, hi, n = paired_difference([100 * a for a in glomo], [100 * a for a in grid])
    assert n == 3 and lo > 0
    assert f"| GLoMo − grid | {m:+.2f} | [{lo:+.2f}, {hi:+.2f}] | 3 | yes, GLoMo better |" in text
    assert "| GLoMo − chain | pending |" in text
    sd = math.sqrt(sum((100 * a - 71) ** 2 for a in glomo) / 2)
    assert f"| glomo | 3 of 5 | 71.00 ± {sd:.2f} |" in text
    assert "| chain | 1 of 5 | 50.00 |" in text
    assert "CIFAR-10" in text and "imagenet32-pixel" in text and "1M edges" in text


def test_both_blocks_share_the_results_file(tmp_path):
    """Both slices' blocks go into results/any_gnn.md between their markers; the rest of
    the file (the CPU sections) stays as it is, and regenerating changes nothing more."""
    path = tmp_path / "any_gnn.md"
    path.write_text("# Any GNN\n\n## 2026-11-27: reduced CPU configuration\n\nrows\n")
    lines = [_line("any-gnn-imdb", "imdb/glomo/seed0", 0.85)]
    recipe = _mod("any-gnn-imdb").recipe(False)
    for line in lines:
        line["recipe"] = campaign.recipe_digest("any-gnn-imdb", recipe)
    written = report.regenerate(lines, str(tmp_path), log=quiet)
    assert written == [str(path)]
    text = path.read_text()
    assert text.startswith("# Any GNN\n") and text.rstrip().endswith("rows")
    for name in NAMES:
        assert text.count(f"<!-- gpu:{name} begin") == 1 and f"<!-- gpu:{name} end -->" in text
    assert text.index("gpu:any-gnn-imdb begin") < text.index("gpu:any-gnn-cifar10 begin")
    assert "| glomo | 1 of 5 | 85.00 |" in text
    assert "Pending: no run of this slice's recipe" in text  # (cifar10: nothing recorded)
    assert report.regenerate(lines, str(tmp_path), log=quiet) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_dry_run_end_to_end(name, tmp_path):
    """prepare (toy archives), run (the call's keys in one process, as on the GPU
    machine), ingest (ledger, results block), as the campaign runs the slice."""
    import shutil

    from benchmarks.gpu.ledger import LedgerError

    mod = _mod(name)
    recipe = mod.recipe(True)
    carry = os.path.join(runner.ROOT, f".gpu-test-{os.getpid()}-{name}")
    ledger_path, results = str(tmp_path / "ledger.jsonl"), str(tmp_path / "results")
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("GLOMO_GPU_BLOCK_MODULES", "gensim,conllu")
            description = runner.prepare(name, carry, None, ledger_path, dry_run=True, log=quiet)
            manifest = runner.run(name, 600, carry, str(tmp_path / "out"), dry_run=True,
                                  work=str(tmp_path / "work"))
    finally:
        shutil.rmtree(carry, ignore_errors=True)
    assert description["keys"] == mod.keys(recipe)
    assert list(description["archives"]) == list(mod.ARCHIVES)
    assert [r["key"] for r in manifest["runs"]] == mod.keys(recipe)
    assert manifest["failures"] == [] and manifest["skipped"] == []
    new = ingest.ingest(str(tmp_path / "out"), ledger_path, results, str(tmp_path / "rel"),
                        True, log=quiet)
    assert [l["key"] for l in new] == mod.keys(recipe)
    text = open(os.path.join(results, mod.RESULTS), encoding="utf-8").read()
    assert f"<!-- gpu:{name} begin" in text and f"<!-- gpu:{name} end -->" in text
    assert "GLoMo − chain" in text
    with pytest.raises(LedgerError, match="already records"):
        ingest.ingest(str(tmp_path / "out"), ledger_path, results, str(tmp_path / "rel"),
                      True, log=quiet)
