"""Released predictors: write_release (float16 weights and a model card), loading by
name, ``glomo pretrained``, and the checks every release in the repository passes."""
import json
import os
import struct
from pathlib import Path

import pytest
import torch
from bundles import write_config
from reference import batch_vector

import glomo_pyg.io.releases as releases
from glomo_pyg import Glomo, PretrainedFormatError, PretrainedGraphPredictor, load_pretrained
from glomo_pyg.cli import main
from glomo_pyg.io.releases import (
    CARD_SECTIONS,
    MAX_RELEASES_BYTES,
    MAX_WEIGHTS_BYTES,
    RELEASE_FILES,
    release_path,
    released_names,
    releases_root,
)
from glomo_pyg.publish import write_release

TOKENS = 40
VOCAB = [f"tok{i}" for i in range(TOKENS)]
REPOSITORY_RELEASES = Path(__file__).resolve().parent.parent / "pretrained"


def text_predictor():
    model = Glomo.text(TOKENS, hidden_channels=16, num_layers=2, heads=2, cnn_layers=1)
    with torch.no_grad():  # away from the initialisation, so the graphs differ by unit
        for t in model.parameters():
            t.add_(0.3 * torch.randn_like(t))
    return model.to_pretrained(VOCAB)


def card(name="tiny-text", **changes):
    out = dict(name=name, summary="A tiny text predictor for the tests.", modality="text",
               hardware="2 CPU cores", data="random tokens", recipe="none: random weights",
               command="glomo pretrain --set train.max_steps=1", commit="0123abc",
               training_time="0 s", quality="| metric | value |\n|---|---|\n| none | - |",
               release="CPU release")
    out.update(changes)
    return out


def header_dtypes(file):
    data = Path(file).read_bytes()
    header = json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])
    return {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}


def dense_graphs(predictor):
    x = torch.randint(0, TOKENS, (23,), generator=torch.Generator().manual_seed(1))
    graphs = predictor(x, batch_vector([9, 14]))
    return torch.cat([g.to_dense().flatten() for g in graphs if g is not None])


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("GLOMO_PRETRAINED_DIR", str(tmp_path / "releases"))
    return tmp_path / "releases"


def test_write_release_stores_float16_and_loads_as_float32(root):
    predictor = text_predictor()
    folder = write_release(predictor, root / "tiny-text", card())
    assert folder == root / "tiny-text"
    assert sorted(os.listdir(folder)) == sorted(RELEASE_FILES)
    dtypes = header_dtypes(folder / "model.safetensors")
    floating = {k for k, t in predictor.predictors.state_dict().items() if t.is_floating_point()}
    assert floating and {dtypes[k] for k in floating} == {"F16"}
    loaded = PretrainedGraphPredictor.from_pretrained(folder)
    assert all(t.dtype == torch.float32 for t in loaded.parameters())
    assert loaded.vocabulary == VOCAB and not loaded.training
    want, got = dense_graphs(predictor), dense_graphs(loaded)
    assert want.abs().sum() > 0
    assert ((got - want).norm() / want.norm()).item() < 5e-3
    # about half the float32 file
    predictor.save_pretrained(root.parent / "f32")
    assert (folder / "model.safetensors").stat().st_size < \
        0.6 * (root.parent / "f32" / "model.safetensors").stat().st_size
    readme = (folder / "README.md").read_text()
    assert readme.startswith("---\nlibrary_name: glomo-pyg\n")  # (the Hub's front matter)
    assert releases.card_body(readme).startswith(
        "# tiny-text\n\nA tiny text predictor for the tests.\n")
    positions = [readme.index(f"\n## {title}\n") for title in CARD_SECTIONS.values()]
    assert positions == sorted(positions)
    # from a saved folder, and again over the earlier release
    predictor.save_pretrained(root.parent / "saved")
    write_release(root.parent / "saved", folder, card(summary="Rewritten."))
    assert "Rewritten." in (folder / "README.md").read_text()
    assert sorted(os.listdir(root)) == ["tiny-text"]  # no temporaries left


def test_16_bit_weights_widen_and_nothing_else_does(tmp_path):
    from safetensors.torch import save

    predictor = text_predictor()
    predictor.save_pretrained(tmp_path / "half", dtype=torch.float16)
    assert set(header_dtypes(tmp_path / "half" / "model.safetensors").values()) <= {"F16", "I64"}
    loaded = load_pretrained(tmp_path / "half")
    assert all(t.dtype == torch.float32 for t in loaded.parameters())
    with pytest.raises(ValueError, match="dtype must be None or one of"):
        predictor.save_pretrained(tmp_path / "x", dtype=torch.float64)
    # a float64 tensor where the module holds float32 is still refused
    tensors = {k: v.double() if v.is_floating_point() else v
               for k, v in predictor.predictors.state_dict().items()}
    payload = save(tensors)
    (tmp_path / "half" / "model.safetensors").write_bytes(payload)
    config = json.loads((tmp_path / "half" / "config.json").read_text())
    import hashlib
    config["weights"].update(bytes=len(payload), sha256=hashlib.sha256(payload).hexdigest())
    write_config(tmp_path / "half", config)  # resealed, as an attacker could
    with pytest.raises(PretrainedFormatError, match="unexpected dtypes"):
        load_pretrained(tmp_path / "half")


@pytest.mark.parametrize("change,match", [
    (dict(quality=""), r"lacks the fields \['quality'\]"),
    (dict(commit="  ", hardware=None), r"lacks the fields \['hardware', 'commit'\]"),
    (dict(colour="blue"), r"unknown card fields \['colour'\]"),
    (dict(summary="two\nlines"), "summary must be one line"),
    (dict(modality="audio"), "modality must be one of"),
    (dict(modality="pixels"), "the card says modality 'pixels', the predictor reads text"),
    (dict(recipe="# Recipe\nsteps"), r"fields \['recipe'\] hold '#' or '##' headings"),
])
def test_card_fields_are_checked(root, change, match):
    values = card()
    for key, value in change.items():
        if value is None:
            del values[key]
        else:
            values[key] = value
    with pytest.raises(ValueError, match=match):
        write_release(text_predictor(), root / "tiny-text", values)
    assert not root.exists() or os.listdir(root) == []


@pytest.mark.parametrize("name", ["Tiny", "-tiny", ".tiny", "tiny_text", "tiny/text", ""])
def test_bad_names_are_refused(root, name):
    with pytest.raises(ValueError, match="release name|lacks the fields"):
        write_release(text_predictor(), root / "x", card(name=name))


def test_folder_must_be_named_after_the_release_and_hold_only_a_release(root):
    with pytest.raises(ValueError, match="must be named after the release, 'tiny-text'"):
        write_release(text_predictor(), root / "other", card())
    (root / "tiny-text").mkdir(parents=True)
    (root / "tiny-text" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="is not a release folder"):
        write_release(text_predictor(), root / "tiny-text", card())
    assert os.listdir(root / "tiny-text") == ["notes.txt"]


def test_size_limits(root, monkeypatch):
    predictor = text_predictor()
    monkeypatch.setattr(releases, "MAX_WEIGHTS_BYTES", 1000)
    with pytest.raises(ValueError, match="more than the .* MiB a release may hold"):
        write_release(predictor, root / "tiny-text", card())
    assert not (root / "tiny-text").exists()
    # the header pushes the file over: refused before anything is written
    size = sum(t.numel() * 2 for t in predictor.predictors.state_dict().values())
    monkeypatch.setattr(releases, "MAX_WEIGHTS_BYTES", size + 8)
    with pytest.raises(ValueError, match="weights file has"):
        write_release(predictor, root / "tiny-text", card())
    assert not root.exists() or os.listdir(root) == []
    monkeypatch.setattr(releases, "MAX_WEIGHTS_BYTES", MAX_WEIGHTS_BYTES)
    write_release(predictor, root / "tiny-text", card())
    one = sum(f.stat().st_size for f in (root / "tiny-text").iterdir())
    monkeypatch.setattr(releases, "MAX_RELEASES_BYTES", one + one // 2)
    write_release(predictor, root / "tiny-text", card())  # replacing it does not count twice
    with pytest.raises(ValueError, match="would take .* MiB with this one"):
        write_release(predictor, root / "second", card(name="second"))
    assert sorted(os.listdir(root)) == ["tiny-text"]


def test_load_by_name(root, tmp_path, monkeypatch):
    assert released_names() == [] and releases_root() == root
    with pytest.raises(PretrainedFormatError, match="'tiny-text' is neither a folder nor the "
                       "name of a released predictor; no released predictors are installed"):
        PretrainedGraphPredictor.from_pretrained("tiny-text")
    predictor = text_predictor()
    write_release(predictor, root / "tiny-text", card())
    write_release(predictor, root / "tiny.v2", card(name="tiny.v2"))
    assert released_names() == ["tiny-text", "tiny.v2"]
    assert release_path("tiny-text") == root / "tiny-text"
    with pytest.raises(ValueError, match="'nope' is not a released predictor; released "
                       "predictors in .*: tiny-text, tiny.v2"):
        release_path("nope")
    loaded = PretrainedGraphPredictor.from_pretrained("tiny-text", vocabulary=VOCAB)
    assert torch.equal(dense_graphs(loaded), dense_graphs(load_pretrained("tiny.v2")))
    with pytest.raises(PretrainedFormatError, match="'tiny' is neither a folder nor the name "
                       "of a released predictor; released predictors in .*: tiny-text, tiny.v2"):
        PretrainedGraphPredictor.from_pretrained("tiny")
    # paths stay paths: a missing one is reported as before, an existing folder wins
    monkeypatch.chdir(tmp_path)
    for path in ("./tiny-text", str(tmp_path / "tiny-text"), "sub/tiny-text"):
        with pytest.raises(PretrainedFormatError, match="does not exist"):
            PretrainedGraphPredictor.from_pretrained(path)
    with pytest.raises(PretrainedFormatError, match="does not exist"):
        PretrainedGraphPredictor.from_pretrained(Path("tiny-text"))
    (tmp_path / "tiny-text").mkdir()
    with pytest.raises(PretrainedFormatError, match="config.json is missing"):
        PretrainedGraphPredictor.from_pretrained("tiny-text")


def test_glomo_pretrained_lists_the_releases(root, capsys):
    assert main(["pretrained"]) == 0
    assert "no released predictors are installed" in capsys.readouterr().out
    assert main(["pretrained", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    write_release(text_predictor(), root / "tiny-text", card())
    model = Glomo.image(height=4, width=6, hidden_channels=8, num_layers=1, heads=2,
                        cnn_layers=1, bidirectional=False)
    write_release(model.to_pretrained(), root / "tiny-pixels",
                  card(name="tiny-pixels", modality="pixels", summary="Tiny pixel graphs."))
    assert main(["pretrained"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["NAME", "MODALITY"]
    pixels = next(line for line in out if line.startswith("tiny-pixels"))
    text = next(line for line in out if line.startswith("tiny-text"))
    assert "pixels" in pixels and "1 x 1 x 2" in pixels and "4x6 pixels" in pixels
    assert pixels.endswith("Tiny pixel graphs.")
    assert "text" in text and "2 x 2 x 2" in text and f"{TOKENS} tokens" in text
    assert " KiB " in text and text.endswith("A tiny text predictor for the tests.")
    assert main(["pretrained", "--json"]) == 0
    listing = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert listing["tiny-pixels"]["units"] == [4, 6]
    assert listing["tiny-text"] == dict(
        name="tiny-text", modality="text", directions=2, layers=2, heads=2, units=TOKENS,
        weights_bytes=(root / "tiny-text" / "model.safetensors").stat().st_size,
        summary="A tiny text predictor for the tests.", data="random tokens",
        path=str(root / "tiny-text"),
        origin="$GLOMO_PRETRAINED_DIR")


def repository_releases():
    if not REPOSITORY_RELEASES.is_dir():
        return []
    return sorted(p.name for p in REPOSITORY_RELEASES.iterdir() if p.is_dir())


def test_the_repository_releases_are_within_the_limits():
    total = sum(f.stat().st_size for f in REPOSITORY_RELEASES.rglob("*") if f.is_file()) \
        if REPOSITORY_RELEASES.is_dir() else 0
    assert total <= MAX_RELEASES_BYTES == 16 << 20


@pytest.mark.parametrize("name", repository_releases())
def test_repository_release(name, monkeypatch):
    monkeypatch.delenv("GLOMO_PRETRAINED_DIR", raising=False)
    folder = REPOSITORY_RELEASES / name
    assert sorted(os.listdir(folder)) == sorted(RELEASE_FILES)
    readme = (folder / "README.md").read_text(encoding="utf-8")
    assert readme.startswith("---\n") and releases.card_body(readme).startswith(f"# {name}\n")
    for title in CARD_SECTIONS.values():
        assert f"\n## {title}\n" in readme, f"{name}/README.md lacks the section {title!r}"
    weights = folder / "model.safetensors"
    assert weights.stat().st_size <= MAX_WEIGHTS_BYTES == 6 << 20
    assert sum(f.stat().st_size for f in folder.iterdir()) <= 16 << 20
    assert set(header_dtypes(weights).values()) - {"BF16", "F16"} <= {"I64", "I32", "BOOL", "U8"}
    assert name in released_names()
    predictor = PretrainedGraphPredictor.from_pretrained(name)
    assert all(t.dtype == torch.float32 for t in predictor.parameters())
