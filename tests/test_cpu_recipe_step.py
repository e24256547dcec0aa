"""benchmarks.cpu_recipe_step on a tiny config: every case runs in its own process and
the table reports them; bad options are refused before any case runs."""
import pytest
import yaml

from benchmarks import cpu_recipe_step

TINY = dict(corpus=dict(max_size=50, max_length=8),
            model=dict(hidden_channels=8, num_layers=1, heads=2, cnn_layers=1,
                       context_length=2, num_positions=2, layout="auto"),
            train=dict(batch_size=2, lr=0.5, momentum=0.2, grad_clip=0.25))


@pytest.mark.slow
def test_every_case_is_measured_and_reported(tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    results = tmp_path / "step.md"
    cpu_recipe_step.main(["--config", str(config), "--threads", "1", "--steps", "1",
                          "--rounds", "1", "--results", str(results)])
    text = results.read_text()
    assert text.startswith("# A training step of the CPU recipe")
    for malloc, layout in cpu_recipe_step.CASES:
        assert f"| {malloc} | {layout} | " in text
    assert "| system | sparse | " in text and "| 1.00x |" in text


@pytest.mark.parametrize("extra, message", [(["--steps", "0"], "must be >= 1"),
                                            (["--config", "/nonexistent.yaml"], "no such file")])
def test_bad_options_are_refused(extra, message):
    with pytest.raises(SystemExit, match=message):
        cpu_recipe_step.main(["--results", ""] + extra)
