"""The README quotes its sources, number for number.

The rule (``readme_text.quotes``): a number a cell writes is one its source writes, rounded
to the decimals the cell shows (signs and thousands separators aside).

- Results table: each row's "scale" and "measured" numbers come from the *answer* of the
  results file it links (its text before the first section or generated block: what the
  file says now, not an older run below it); its "paper" numbers from anywhere in it.
- Released predictors: each row's "quality" numbers come from the model card it links.
"""
import re

import pytest
from readme_text import (
    ROOT,
    numbers,
    opening_answer,
    quotes,
    readme,
    section,
    table_rows,
)

LINK = re.compile(r"\]\(((?:benchmarks/results|pretrained)/[^)]+\.md)\)")


def rows(title):
    return [(row, LINK.search(" | ".join(row))) for row in table_rows(section(title, readme()))]


def unquoted(cells, source_text):
    pool = numbers(source_text)
    return [n for cell in cells for n in numbers(cell) if not quotes(n, pool)]


def result_rows():
    return [(row, ROOT / link.group(1)) for row, link in rows("Results")]


def release_rows():
    return [(row, ROOT / link.group(1)) for row, link in rows("Pretrained predictors")]


def test_the_tables_have_their_rows_and_links():
    assert len(result_rows()) >= 10 and len(release_rows()) >= 3
    assert all(path.is_file() for _, path in result_rows() + release_rows())


@pytest.mark.parametrize("row, path", [pytest.param(*r, id=r[0][0][:40])
                                       for r in result_rows()])
def test_each_result_quotes_its_file(row, path):
    task, scale, measured, paper, _ = row
    text = path.read_text(encoding="utf-8")
    missing = unquoted([scale, measured], opening_answer(text))
    assert not missing, f"{path.name}'s answer does not say {missing} ({task})"
    missing = unquoted([paper], text)
    assert not missing, f"{path.name} does not say {missing} ({task})"


@pytest.mark.parametrize("row, path", [pytest.param(*r, id=r[0][0][:40])
                                       for r in release_rows()])
def test_each_release_quality_quotes_its_model_card(row, path):
    missing = unquoted([row[-1]], path.read_text(encoding="utf-8"))
    assert not missing, f"{path} does not say {missing}"


def test_the_rule():
    assert numbers("a +0.646 gain over 2,289 steps, ResNet-18 on 16x16, 8.6x") == \
        ["0.646", "2289", "18", "16", "8.6"]
    assert quotes("0.10", ["0.0969"]) and quotes("438", ["438.2"]) and quotes("2289", ["2289"])
    assert quotes("5.55", ["5.545"]) and not quotes("5.55", ["5.5"])  # (fewer decimals)
    assert not quotes("0.1", ["0.16"]) and not quotes("560", ["2289", "3000"])
    # an answer stops at the first section or generated block (older runs follow it)
    text = "answer: 2,289 steps\n\n<!-- generated -->\n560 steps\n## Runs\n561\n"
    assert numbers(opening_answer(text)) == ["2289"]
    # the stale row of 0.7.0: the answer of cifar10.md does not say it
    stale = ["pixel-graph pretraining", "one H100 call (560 of 3,000 steps)",
             "undertrained: weight on the 4-neighbourhood 1.3-6x uniform's", "", ""]
    answer = opening_answer((ROOT / "benchmarks/results/cifar10.md").read_text())
    assert unquoted(stale[1:3], answer) == ["560", "3000", "1.3"]  # ("6 seeds" is there)
