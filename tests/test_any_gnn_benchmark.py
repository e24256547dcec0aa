"""``python -m benchmarks.any_gnn`` on toy CIFAR-10 (random images, the released
``imagenet32-pixel-cpu``): every graph variant trains, fixed graphs attached on access
equal the stored transform's output, the report pairs every learned graph with every
fixed one, and a second call finds every run cached."""
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader

import benchmarks.any_gnn as bench
import glomo_pyg.data.images as images_module
from glomo_pyg.transforms import ChainGraphs, GraphsDataset, GridGraphs, UniformGraphs, image_data


def fake_cifar(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    fake = {"train": (torch.randint(0, 256, (40, 3, 32, 32), dtype=torch.uint8, generator=gen),
                      torch.arange(40) % 10),
            "test": (torch.randint(0, 256, (12, 3, 32, 32), dtype=torch.uint8, generator=gen),
                     torch.arange(12) % 10)}
    monkeypatch.setattr(images_module, "load_cifar10", lambda root, split: fake[split])


@pytest.mark.parametrize("task", ["cifar10", "imdb"])
def test_fixed_graphs_on_access_batch_as_a_stored_dataset(task, tmp_path):
    """The batches a shuffled loader draws from samples with their fixed graph attached on
    access equal those drawn from the graphs stored in a ``GraphsDataset``."""
    gen = torch.Generator().manual_seed(1)
    if task == "cifar10":
        raw = [image_data(torch.randint(0, 256, (3, 4, 4), dtype=torch.uint8, generator=gen),
                          y=torch.tensor([k % 3])) for k in range(7)]
        variants = (GridGraphs(4, 4), GridGraphs(4, 4, relations="offset"), UniformGraphs(),
                    ChainGraphs())
    else:
        raw = [Data(x=torch.randint(0, 50, (n,), generator=gen), y=torch.tensor([n % 2]))
               for n in (5, 1, 9, 3, 4, 2, 8)]
        variants = (UniformGraphs(), ChainGraphs())
    for i, graphs in enumerate(variants):
        lazy = bench.FixedGraphSamples(raw, graphs, task)
        stored = GraphsDataset(str(tmp_path / str(i)), raw, graphs)
        stored = [bench.pixel_features(d) for d in stored] if task == "cifar10" else stored
        assert len(lazy) == len(stored) == 7
        draws = [list(DataLoader(data, batch_size=3, shuffle=True,
                                 generator=torch.Generator().manual_seed(5)))
                 for data in (lazy, stored)]
        for a, b in zip(*draws):
            for key in ("x", "y", "edge_index", "edge_weight", "edge_type", "batch"):
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key])
    assert "edge_index" not in raw[0]


def test_main_trains_every_image_graph_and_caches_its_runs(monkeypatch, tmp_path):
    fake_cifar(monkeypatch)
    monkeypatch.setitem(bench.CIFAR_REDUCED, "train", 16)
    monkeypatch.setitem(bench.CIFAR_REDUCED, "validation", 8)
    monkeypatch.setitem(bench.CIFAR_REDUCED, "test", 8)
    results = tmp_path / "any_gnn.md"
    argv = ["--data-dir", str(tmp_path), "--task", "cifar10", "--seeds", "2", "--epochs", "1",
            "--lrs", "0.001", "--image-graphs", "glomo-heads", "grid-offsets", "uniform",
            "--work", str(tmp_path / "work"), "--results", str(results), "--device", "cpu"]
    calls = []
    train_run = bench.train_run
    monkeypatch.setattr(bench, "train_run", lambda *a, **k: calls.append(a[2]) or
                        train_run(*a, **k))
    bench.main(argv)
    # the stock GNN over 6 graphs and the task-learned one, PickConv over glomo, grid and
    # learned; x 2 seeds, with their own numbers of relations
    assert sorted(calls) == sorted([2, 16, 2, 2, 8, 2, 2] * 2 + [2, 2, 2] * 2)
    text = results.read_text()
    for name, relations in (("glomo", 2), ("glomo-heads", 16), ("grid", 2), ("chain", 2),
                            ("grid-offsets", 8), ("uniform", 2)):
        assert f"| {name} | {relations} | " in text
    for learned in ("glomo", "glomo-heads"):
        for fixed in ("grid", "chain", "grid-offsets", "uniform"):
            assert f"| {learned} − {fixed} | " in text
    assert "| glomo − glomo-heads" not in text
    for fixed in ("grid", "chain", "grid-offsets", "uniform"):
        assert f"| learned − {fixed} | " in text
    assert text.count("| glomo − learned | ") == 2  # for each model
    assert "**`PickConv`**" in text
    assert text.count("uniform | 2 | 65280 |") == 1  # 16x16: 256 * 255 edges
    # again: every run is found in the cache, the report is the same
    calls.clear()
    bench.main(argv)
    assert calls == []
    first, second = ("\n" + results.read_text()).split("\n## ")[1:]
    assert first.split("\n", 3)[3].strip() == second.split("\n", 3)[3].strip()  # (after timing)


def test_unknown_image_graph_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.parse(["--data-dir", str(tmp_path), "--image-graphs", "grid-diagonal"])
    assert "invalid choice" in capsys.readouterr().err


def test_learned_graph_weight_is_chosen_on_validation(monkeypatch, tmp_path):
    """``--learned-weights``: the learning rate is chosen with the first weight, then each
    weight runs seed 0 at that rate and the best validation's weight runs every seed."""
    fake_cifar(monkeypatch)
    for split, n in (("train", 16), ("validation", 8), ("test", 8)):
        monkeypatch.setitem(bench.CIFAR_REDUCED, split, n)
    score = {0.01: 0.5, 0.1: 0.7, 1.0: 0.6}
    calls = []

    def fake_run(task, splits, relations, setup, seed, lr, device, tokens, conv="graphconv",
                 learn_orders=None, learning=bench.LEARNING):
        learned = learn_orders is not None
        calls.append((seed, lr, learning.weight if learned else None))
        return dict(epoch=0, validation=score[learning.weight] if learned else 0.4 + lr,
                    test=0.3, seconds=0.0)

    monkeypatch.setattr(bench, "train_run", fake_run)
    results = tmp_path / "any_gnn.md"
    argv = ["--data-dir", str(tmp_path), "--task", "cifar10", "--seeds", "3", "--epochs", "1",
            "--lrs", "0.001", "0.003", "--graphs", "grid", "learned", "--models", "graphconv",
            "--learned-weights", "0.01", "0.1", "1", "--work", str(tmp_path / "work"),
            "--results", str(results), "--device", "cpu"]
    bench.main(argv)
    learned = [c for c in calls if c[2] is not None]
    # rates with the first weight; then weights 0.1 and 1 at the rate kept; seeds 1, 2 at 0.1
    assert learned == [(0, 0.001, 0.01), (0, 0.003, 0.01), (0, 0.003, 0.1), (0, 0.003, 1.0),
                       (1, 0.003, 0.1), (2, 0.003, 0.1)]
    assert [c for c in calls if c[2] is None] == [(0, 0.001, None), (0, 0.003, None),
                                                  (1, 0.003, None), (2, 0.003, None)]
    text = results.read_text()
    assert "`learned`'s L_GL weight 0.1, chosen on validation at that rate (seed 0: " \
           "0.01: 0.5000, 0.1: 0.7000, 1: 0.6000)" in text
    assert "the L_GL weight chosen among 0.01, 0.1, 1." in text
    calls.clear()
    bench.main(argv)
    assert calls == []   # every run, each weight's included, is cached


@pytest.mark.parametrize("weights", [["-0.1"], ["nan"], ["inf"]])
def test_bad_learned_weights_are_refused(tmp_path, capsys, weights):
    with pytest.raises(SystemExit):
        bench.parse(["--data-dir", str(tmp_path), "--learned-weights", *weights])
    assert "--learned-weights" in capsys.readouterr().err
