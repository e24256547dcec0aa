"""The data each release was trained on is described once, in its model card's Data
section, and quoted word for word by the README's release table, by every paragraph of
the README and the notebooks that says what a release was trained on, and by ``glomo
pretrained``."""
import json
import re
from pathlib import Path

from readme_text import ROOT, readme, section, table_rows

from glomo_pyg.cli import main
from glomo_pyg.io.releases import read_card
from glomo_pyg.publish import write_release

RELEASES = sorted(p.name for p in (ROOT / "pretrained").iterdir()
                  if (p / "config.json").is_file())
# a paragraph that says on what something was trained
TRAINED_ON = re.compile(r"\b(?:pre)?train(?:ed|s|ing)? on\b", re.IGNORECASE)


def one_line(text: str) -> str:
    return " ".join(text.split())


def card_data(name: str) -> str:
    return one_line(read_card(ROOT / "pretrained" / name)["data"])


def paragraphs():
    """(where, paragraph) for the README's prose and every notebook's markdown cells."""
    out = [("README.md", p) for p in re.split(r"\n\s*\n", readme())]
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        out += [(notebook.name, p) for c in cells if c["cell_type"] == "markdown"
                for p in re.split(r"\n\s*\n", "".join(c["source"]))]
    return out


def quoting_failures(pieces):
    """The paragraphs naming a release and what it was trained on without its card's words."""
    return [(where, name) for where, text in pieces for name in RELEASES
            if f"`{name}`" in text and not text.lstrip().startswith("|")
            and TRAINED_ON.search(text) and card_data(name) not in one_line(text)]


def test_every_release_has_a_data_section():
    assert RELEASES and all(card_data(name) for name in RELEASES)


def test_the_readme_table_quotes_each_card():
    rows = {re.search(r"`([^`]+)`", r[0]).group(1): r
            for r in table_rows(section("Pretrained predictors", readme()))}
    assert sorted(rows) == RELEASES
    for name, row in rows.items():
        assert row[2] == card_data(name), f"the README's row for {name}"


def test_paragraphs_on_training_data_quote_the_card():
    assert not quoting_failures(paragraphs())
    # the notebook wording of 0.7.0: its own description of the data
    old = ("`imagenet32-pixel-cpu` was pretrained on 32x32 ImageNet images; "
           "`image_size=(16, 16)` applies the same weights to 16x16 images.")
    assert quoting_failures([("05", old)]) == [("05", "imagenet32-pixel-cpu")]


def test_glomo_pretrained_quotes_each_card(capsys, monkeypatch):
    monkeypatch.setenv("GLOMO_PRETRAINED_DIR", str(ROOT / "pretrained"))
    assert main(["pretrained", "--json"]) == 0
    listed = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert sorted(listed) == RELEASES
    for name in RELEASES:
        card = read_card(ROOT / "pretrained" / name)
        assert listed[name]["data"] == card_data(name)
        assert listed[name]["summary"] == card["summary"]
    assert main(["pretrained"]) == 0
    out = capsys.readouterr().out
    for name in RELEASES:
        assert f"  {name}: {card_data(name)}\n" in out


def tiny_release(tmp_path: Path, **card) -> Path:
    from glomo_pyg import Glomo

    model = Glomo.text(12, hidden_channels=8, num_layers=1, heads=1, cnn_layers=1)
    fields = dict(name="tiny", summary="A tiny release.", modality="text", release="test",
                  quality="none", data="Ten random\nsentences.", recipe="none",
                  command="glomo pretrain\n## not a section: inside the fence",
                  hardware="a CPU", training_time="0 s", commit="0123abc")
    fields.update(card)
    return write_release(model.to_pretrained([f"w{i}" for i in range(12)]),
                         tmp_path / fields["name"], fields)


def test_read_card_inverts_write_release(tmp_path):
    folder = tiny_release(tmp_path)
    card = read_card(folder)
    assert card["name"] == "tiny" and card["summary"] == "A tiny release."
    assert card["data"] == "Ten random\nsentences." and card["recipe"] == "none"
    assert "## not a section" in card["command"] and card["hardware"] == "a CPU"
    assert card["commit"] == "0123abc"  # (the last section: Loading is not a field)


def test_read_card_of_a_missing_or_sectionless_card(tmp_path):
    assert read_card(tmp_path) == {}
    (tmp_path / "README.md").write_text("# mine\n\nOne line.\n\nMore words.\n")
    assert read_card(tmp_path) == {"name": "mine", "summary": "One line."}


def test_glomo_pretrained_prints_the_data_on_one_line(tmp_path, monkeypatch, capsys):
    tiny_release(tmp_path, data="Two\n  lines.")
    monkeypatch.setenv("GLOMO_PRETRAINED_DIR", str(tmp_path))
    assert main(["pretrained"]) == 0
    assert "  tiny: Two lines.\n" in capsys.readouterr().out
