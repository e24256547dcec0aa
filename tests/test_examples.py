"""The runnable example of the README works on a saved predictor."""
import runpy
import sys
from pathlib import Path

import pytest

from glomo_pyg import GraphPredictor, PretrainedGraphPredictor
from glomo_pyg.data import Vocabulary
from glomo_pyg.training.quickstart import QuickstartConfig

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "transfer.py"


def run_example(monkeypatch, *args):
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), *args])
    return runpy.run_path(str(EXAMPLE), run_name="__main__")


def test_transfer_example_trains_with_a_saved_predictor(tmp_path, monkeypatch, capsys):
    c = QuickstartConfig().corpus
    tokens = Vocabulary(c["num_filler"], c["num_slots"], c["num_values"]).tokens()
    predictor = PretrainedGraphPredictor(
        *(GraphPredictor(num_tokens=len(tokens), hidden_channels=16, num_layers=2, heads=2,
                         direction=d, cnn_layers=1) for d in ("forward", "backward")), tokens)
    predictor.save_pretrained(tmp_path)
    before = {k: v.clone() for k, v in predictor.state_dict().items()}
    env = run_example(monkeypatch, str(tmp_path))
    out = capsys.readouterr().out
    losses = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("step")]
    assert len(losses) == 8 and losses[-1] < losses[0]
    assert "GlomoTransfer(64, out_channels=128" in out
    frozen = env["model"].glomo.predictor.state_dict()
    assert all((frozen[k] == v).all() for k, v in before.items())


def test_transfer_example_explains_a_missing_predictor(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="run `glomo quickstart` first"):
        run_example(monkeypatch, str(tmp_path / "absent"))


def readme_blocks():
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


@pytest.mark.slow
def test_readme_code_blocks_run(tmp_path, monkeypatch):
    blocks = readme_blocks()
    assert len(blocks) == 6
    exec(compile(blocks[0], "README usage", "exec"), {})
    # the released predictors, by name (the repository's pretrained/ folder)
    env = {}
    exec(compile(blocks[2], "README releases", "exec"), env)
    assert env["predictor"].vocabulary is not None and env["pixels"].vocabulary is None
    # the pixel example at a smaller width (same code path)
    pixels = blocks[5].replace("hidden_channels=128, num_layers=3, heads=8",
                               "hidden_channels=16, num_layers=2, heads=2")
    assert pixels != blocks[5]
    env = {}
    exec(compile(pixels, "README pixels", "exec"), env)
    assert env["logits"].shape == (8, 10)
    # the transfer example as printed: a released predictor, loaded by name
    env = {}
    exec(compile(blocks[1], "README transfer", "exec"), env)
    import torch
    num_tokens = env["predictor"].num_tokens
    model = env["Classifier"](num_tokens)
    x = torch.randint(0, num_tokens, (12,))
    batch = torch.tensor([0] * 5 + [1] * 7)
    assert model(x, batch).shape == (2, 2)

    # GLoMo graphs for a stock PyG layer: the transform on two sentences
    env = {}
    exec(compile(blocks[3], "README any GNN", "exec"), env)
    batch, graphs = env["batch"], env["graphs"]
    assert graphs.relations == ["forward", "backward"] and batch.num_graphs == 2
    assert env["h"].shape == (batch.num_nodes, 32)
    per_target = torch.bincount(batch.edge_index[1] * 2 + batch.edge_type)
    assert per_target.max() <= 4  # top_k=4 per target and direction

    # the viewer example, on the released text predictor: one offline page
    monkeypatch.chdir(tmp_path)
    env = {}
    exec(compile(blocks[4], "README viewer", "exec"), env)
    page = (tmp_path / "graphs.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and '"kind":"text"' in page
