"""Every tutorial notebook runs top to bottom (code cells executed in order, in-process)."""
import json
import pathlib

import pytest
import torch

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, capsys):
    torch.set_num_threads(2)
    cells = json.loads(path.read_text())["cells"]
    namespace = {"__name__": "__notebook__"}
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), f"{path.name}[cell {i}]", "exec"), namespace)
    out = capsys.readouterr().out
    assert "True" in out  # the dense cross-check in section 2
    result = namespace["result"]
    assert result.chosen_precision > 0.5


def test_there_is_a_notebook():
    assert NOTEBOOKS
