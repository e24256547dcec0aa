"""Every tutorial notebook runs top to bottom (code cells executed in order, in-process)."""
import json
import pathlib

import pytest
import torch

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def check_five_minutes(namespace, out, tmp_path):
    assert "True" in out  # the dense cross-check in section 2
    assert namespace["result"].chosen_precision > 0.5


def check_transfer(namespace, out, tmp_path):
    # Pretrained here with a few steps (no saved predictor): the mechanics, not the quality.
    saved = pathlib.Path(namespace["PREDICTOR"])
    assert saved.name == "predictor" and (saved / "model.safetensors").is_file()
    results = namespace["results"]
    assert set(results) == {"learned", "uniform", "none"}
    assert results["none"][0] < 0.45  # no graph: chance level (0.25) at the cues
    assert all(0.0 <= acc <= 1.0 for acc, _ in results.values())
    assert "heaviest source of cue1" in out and "gamma" in out


CHECKS = {"01_glomo_in_five_minutes.ipynb": (check_five_minutes, {}),
          "02_transfer_pretrained_graphs.ipynb": (check_transfer, {
              "GLOMO_TUTORIAL_PREDICTOR": "{tmp}/absent", "GLOMO_TUTORIAL_PRETRAIN_STEPS": "30",
              "GLOMO_TUTORIAL_DOWNSTREAM_STEPS": "20"})}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, capsys, monkeypatch, tmp_path):
    assert path.name in CHECKS, f"add a check for {path.name}"
    check, env = CHECKS[path.name]
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(tmp=tmp_path))
    torch.set_num_threads(2)
    cells = json.loads(path.read_text())["cells"]
    namespace = {"__name__": "__notebook__"}
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), f"{path.name}[cell {i}]", "exec"), namespace)
    check(namespace, capsys.readouterr().out, tmp_path)


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 2
