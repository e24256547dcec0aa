"""benchmarks.graphs_dataset end to end on a tiny aclImdb (written by the test), with the
released CPU text predictor: every phase runs and the report holds each one's numbers."""
import pytest

from tests.fake_data import write_aclimdb


@pytest.mark.slow
def test_graphs_dataset_benchmark_runs_every_phase(tmp_path):
    from benchmarks import graphs_dataset as bench

    write_aclimdb(tmp_path, counts=(("train", 3), ("test", 2)), unlabelled=0)
    results = tmp_path / "graphs_dataset.md"
    bench.main(["--data-dir", str(tmp_path), "--output-dir", str(tmp_path / "work"),
                "--max-tokens", "8", "--chunk-size", "3", "--results", str(results)])
    text = results.read_text()
    assert "10 reviews, the first 8 tokens" in text
    rows = [line for line in text.splitlines() if line.startswith("| Graphs")]
    assert [r.split(" | ")[1] for r in rows] == ["build", "load", "build", "load"]
    assert all(r.split(" | ")[2] == "10" for r in rows)
    assert "80 tokens" in text  # 10 reviews of 18 words, cut to 8
