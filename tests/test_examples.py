"""The runnable example works on a saved predictor (the README's own blocks:
test_readme_snippets.py)."""
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

