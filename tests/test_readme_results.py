"""The README's results table quotes its results files: every decimal number (and every
number written with thousands separators) in a row's "measured" column occurs in the files
that row links."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# 0.646, +1.10, -0.26, 2,289 (signs and separators are compared without)
NUMBER = re.compile(r"(?<![\w.])[+-]?\d[\d,]*\.\d+|\b\d{1,3}(?:,\d{3})+\b")
LINK = re.compile(r"\((benchmarks/results/[^)]+\.md)\)")


def result_rows():
    lines = (ROOT / "README.md").read_text().splitlines()
    return [line for line in lines if line.startswith("| ") and LINK.search(line)]


def quoted_numbers(cell: str):
    return [n.lstrip("+-").replace(",", "") for n in NUMBER.findall(cell)]


def test_the_table_has_its_rows():
    assert len(result_rows()) >= 8


@pytest.mark.parametrize("row", result_rows(), ids=lambda r: r.split("|")[1].strip()[:40])
def test_each_measured_number_is_in_its_results_file(row):
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    files = [ROOT / link for link in LINK.findall(row)]
    assert all(f.exists() for f in files), files
    text = " ".join(f.read_text() for f in files).replace(",", "")
    missing = [n for n in quoted_numbers(cells[2]) if n not in text]
    assert not missing, f"{[f.name for f in files]} do not hold {missing}"


def test_the_rule_catches_a_number_that_is_not_there():
    assert quoted_numbers("a +0.646 gain over 2,289 steps") == ["0.646", "2289"]
    row = "| task | scale | 123.456 | | [x](benchmarks/results/quickstart.md) |"
    text = (ROOT / "benchmarks/results/quickstart.md").read_text().replace(",", "")
    assert "123.456" not in text and quoted_numbers(row.split("|")[3]) == ["123.456"]
