"""The recipe runner's configurations and learning-curve summaries (no training)."""
import argparse
import os

from benchmarks.text_recipes import RECIPES, config_for, read_curves, summarise
from glomo_pyg.training import PretrainConfig


def test_every_recipe_is_a_valid_configuration(tmp_path):
    args = argparse.Namespace(data_dir=str(tmp_path), syntax_every=100, steps=50,
                              output_dir=str(tmp_path / "out"))
    for name in RECIPES:
        config = PretrainConfig.from_dict(config_for(name, args))
        assert config.train.max_steps == 50 and config.output_dir.endswith(name)


def test_curves_and_summary_from_a_csv_log(tmp_path):
    folder = tmp_path / "logs" / "version_0"
    os.makedirs(folder)
    (folder / "metrics.csv").write_text(
        "step,train_loss,syntax/forward/best,syntax/forward/layer0,syntax/forward/previous_word,"
        "health/forward/layer0/head0/empty,health/forward/layer0/head0/adjacent,"
        "health/forward/layer0/head1/empty,health/forward/layer0/head1/adjacent,"
        "health/forward/dead_heads\n"
        "10,6.0,,,,,,,,\n"
        "20,5.5,0.3,0.2,0.4,0.0,0.5,0.6,0.1,1\n")
    curves = read_curves(str(tmp_path))
    assert curves["train_loss"] == [(10, 6.0), (20, 5.5)]
    summary = summarise(curves)
    assert summary["step"] == 20 and summary["syntax_best"] == 0.3
    assert summary["syntax_layers"] == [0.2] and summary["syntax_adjacent"] == 0.4
    assert summary["dead_heads"] == 1 and summary["max_empty"] == 0.6
    assert abs(summary["adjacent"] - 0.3) < 1e-12


def test_fixed_diagnostic_graphs():
    import torch

    from benchmarks.text_diagnostics import fixed_graphs

    x = torch.zeros(5, dtype=torch.long)
    batch = torch.tensor([0, 0, 0, 1, 1])
    _, prev = fixed_graphs(x, batch, "previous", layers=1, heads=2)
    ei, w, eh = prev.layer(0)
    assert sorted(zip(eh.tolist(), ei[0].tolist(), ei[1].tolist())) == \
        [(0, 0, 1), (0, 1, 2), (0, 3, 4), (1, 0, 1), (1, 1, 2), (1, 3, 4)]
    assert torch.all(w == 1)
    _, local = fixed_graphs(x, batch, "local", layers=1, heads=2, direction="backward")
    ei, _, eh = local.layer(0)
    assert sorted(zip(eh.tolist(), ei[0].tolist(), ei[1].tolist())) == \
        [(0, 1, 0), (0, 2, 1), (0, 4, 3), (1, 2, 0)]  # head 1: distance 2
