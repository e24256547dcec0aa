"""Finding and loading released predictors by name, with untrusted release folders: a
release's name is bound to what it seals (a copy under another name is refused, on load
and in ``glomo pretrained``), a broken ``$GLOMO_PRETRAINED_DIR`` or a name holding a NUL
is named, and a model card is read with a bound and never from a FIFO."""
import contextlib
import json
import os
import re
import shutil
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
import torch

import glomo_pyg.io.releases as releases
from glomo_pyg import Glomo, PretrainedFormatError, PretrainedGraphPredictor, load_pretrained
from glomo_pyg.cli import main
from glomo_pyg.io.paths import NotRegularFileError
from glomo_pyg.io.releases import read_card
from glomo_pyg.publish import write_release

REPOSITORY_RELEASES = Path(__file__).resolve().parent.parent / "pretrained"
PIXEL_RELEASE = "imagenet32-pixel-cpu"  # (the smallest repository release: 0.2 MiB)
TOKENS = 12


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("GLOMO_PRETRAINED_DIR", str(tmp_path / "releases"))
    (tmp_path / "releases").mkdir()
    monkeypatch.chdir(tmp_path)  # (no folder of a release's name in the working directory)
    return tmp_path / "releases"


def card(name="tiny-text", **changes):
    out = dict(name=name, summary="A tiny text release.", modality="text", release="test",
               quality="none", data="random tokens", recipe="none", command="glomo pretrain",
               hardware="a CPU", training_time="0 s", commit="0123abc")
    out.update(changes)
    return out


def tiny_release(root: Path, name: str = "tiny-text") -> Path:
    torch.manual_seed(0)
    model = Glomo.text(TOKENS, hidden_channels=8, num_layers=1, heads=1, cnn_layers=1)
    return write_release(model.to_pretrained([f"w{i}" for i in range(TOKENS)]), root / name,
                         card(name))


def listing(capsys):
    """``glomo pretrained --json``: its exit status and its entries by name."""
    status = main(["pretrained", "--json"])
    return status, {i["name"]: i for i in json.loads(capsys.readouterr().out)}


# --- 1. a release's name is bound to what it seals ----------------------------------------
def test_a_repository_release_copied_under_another_name_is_refused(root, capsys):
    shutil.copytree(REPOSITORY_RELEASES / PIXEL_RELEASE, root / "imdb-text-cpu")
    refused = f"is the released predictor '{PIXEL_RELEASE}'.*found under the name 'imdb-text-cpu'"
    with pytest.raises(PretrainedFormatError, match=refused):
        PretrainedGraphPredictor.from_pretrained("imdb-text-cpu")
    with pytest.raises(PretrainedFormatError, match=refused):  # by path: the same folder
        load_pretrained(root / "imdb-text-cpu")
    status, entries = listing(capsys)
    assert status == 1 and "error" in entries["imdb-text-cpu"]
    assert PIXEL_RELEASE in entries["imdb-text-cpu"]["error"]
    assert main(["pretrained"]) == 1
    out = capsys.readouterr()
    assert "imdb-text-cpu" not in out.out and "release imdb-text-cpu FAILS" in out.err
    # the card made to match does not help: the name is read from the sealed config
    readme = root / "imdb-text-cpu" / "README.md"
    readme.write_text(readme.read_text().replace(f"# {PIXEL_RELEASE}", "# imdb-text-cpu")
                      .replace("## Modality\n\npixels", "## Modality\n\ntext"))
    with pytest.raises(PretrainedFormatError, match=refused):
        PretrainedGraphPredictor.from_pretrained("imdb-text-cpu")


def test_a_repository_release_under_its_own_name_loads(root, capsys):
    shutil.copytree(REPOSITORY_RELEASES / PIXEL_RELEASE, root / PIXEL_RELEASE)
    assert PretrainedGraphPredictor.from_pretrained(PIXEL_RELEASE).modality == "pixels"
    status, entries = listing(capsys)
    assert status == 0 and entries[PIXEL_RELEASE]["modality"] == "pixels"
    # an alias inside the releases folder is another name: refused, by name and listed
    (root / "pixels").symlink_to(root / PIXEL_RELEASE, target_is_directory=True)
    with pytest.raises(PretrainedFormatError, match="found under the name 'pixels'"):
        PretrainedGraphPredictor.from_pretrained("pixels")
    status, entries = listing(capsys)
    assert status == 1 and "error" in entries["pixels"] and "error" not in entries[PIXEL_RELEASE]


@pytest.mark.parametrize("name", sorted(p.name for p in REPOSITORY_RELEASES.iterdir()
                                        if (p / "config.json").is_file())
                         if REPOSITORY_RELEASES.is_dir() else [])
def test_each_repository_release_is_bound_to_its_own_name(name):
    config = json.loads((REPOSITORY_RELEASES / name / "config.json").read_text())
    assert releases.UNSEALED_RELEASE_NAMES[config["weights"]["sha256"]] == name
    assert releases.release_problem(name, REPOSITORY_RELEASES / name, config,
                                    read_card(REPOSITORY_RELEASES / name)["modality"]) is None
    assert "found under the name 'other'" in releases.release_problem(
        "other", REPOSITORY_RELEASES / name, config, "text")


def test_write_release_seals_the_name_modality_and_card(root, capsys):
    folder = tiny_release(root)
    config = json.loads((folder / "config.json").read_text())
    sealed = config[releases.RELEASE_KEY]
    assert sealed["name"] == "tiny-text" and sealed["modality"] == "text"
    assert list(config)[-1] == "seal"  # (the seal covers the release entry too)
    assert PretrainedGraphPredictor.from_pretrained("tiny-text").modality == "text"
    shutil.copytree(folder, root / "other-text")
    with pytest.raises(PretrainedFormatError, match="'tiny-text'.*its sealed config.json.*"
                                                    "found under the name 'other-text'"):
        PretrainedGraphPredictor.from_pretrained("other-text")
    readme = folder / "README.md"
    readme.write_text(readme.read_text().replace("A tiny text release.", "Something else."))
    with pytest.raises(PretrainedFormatError, match="README.md is not the model card sealed"):
        PretrainedGraphPredictor.from_pretrained("tiny-text")
    readme.unlink()
    with pytest.raises(PretrainedFormatError, match="README.md is missing"):
        PretrainedGraphPredictor.from_pretrained("tiny-text")
    status, entries = listing(capsys)
    assert status == 1 and set(entries) == {"tiny-text", "other-text"}
    assert all("error" in e for e in entries.values())


def test_a_release_without_a_sealed_name_must_match_its_card(root):
    torch.manual_seed(0)
    model = Glomo.text(TOKENS, hidden_channels=8, num_layers=1, heads=1, cnn_layers=1)
    model.to_pretrained([f"w{i}" for i in range(TOKENS)]).save_pretrained(root / "mine")
    PretrainedGraphPredictor.from_pretrained("mine")  # no card: nothing to hold it to
    (root / "mine" / "README.md").write_text("# theirs\n\nA card.\n")
    with pytest.raises(PretrainedFormatError, match="the model card of 'theirs'.*found under "
                                                    "the name 'mine'"):
        PretrainedGraphPredictor.from_pretrained("mine")
    (root / "mine" / "README.md").write_text("# mine\n\nA card.\n\n## Modality\n\npixels\n")
    with pytest.raises(PretrainedFormatError, match="says modality 'pixels'.*reads text"):
        PretrainedGraphPredictor.from_pretrained("mine")
    (root / "mine" / "README.md").write_text("# mine\n\nA card.\n\n## Modality\n\ntext\n")
    PretrainedGraphPredictor.from_pretrained("mine")


# --- 2. $GLOMO_PRETRAINED_DIR at a symlink loop ------------------------------------------
def test_a_symlink_loop_as_the_releases_folder_is_named(tmp_path, monkeypatch):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    monkeypatch.setenv("GLOMO_PRETRAINED_DIR", str(loop))
    monkeypatch.chdir(tmp_path)
    named = re.escape(f"GLOMO_PRETRAINED_DIR={str(loop)!r}: the releases folder {loop} cannot "
                      "be listed: its path runs into a loop of symbolic links; point "
                      "GLOMO_PRETRAINED_DIR at a folder of release folders, or unset it")
    with pytest.raises(ValueError, match=named):
        PretrainedGraphPredictor.from_pretrained("imdb-text-cpu")
    with pytest.raises(ValueError, match=named):
        releases.released_names()
    with pytest.raises(SystemExit, match="glomo pretrained: " + named):
        main(["pretrained"])


# --- 3. a NUL in the name ------------------------------------------------------------------
@pytest.mark.parametrize("given", ["good\x00", Path("good\x00"), "pretrained/x\x00y"])
def test_a_name_holding_a_nul_is_neither_a_file_nor_a_release(root, given):
    with pytest.raises(PretrainedFormatError, match=re.escape(
            f"load_pretrained: the predictor's path or release name {os.fspath(given)!r} "
            "holds a NUL character: it is neither a file name nor a released predictor's")):
        PretrainedGraphPredictor.from_pretrained(given)


# --- 4. model cards are read with a bound, never from a FIFO ------------------------------
def test_a_huge_card_is_refused_unread(root, capsys):
    folder = tiny_release(root)
    with open(folder / "README.md", "r+b") as fh:
        fh.truncate(3 * 2**30)  # (sparse: no disk)
    too_big = re.escape(f"{folder / 'README.md'} has {3 * 2**30} bytes, more than the 256 KiB "
                        "a model card may have")
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(ValueError, match=too_big):
            read_card(folder)
        assert main(["pretrained"]) == 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, peak  # a whole read would take 3 GiB
    assert time.perf_counter() - start < 10  # refused by its size, not read
    out = capsys.readouterr()
    assert "release tiny-text FAILS" in out.err and "256 KiB a model card may have" in out.err
    with pytest.raises(PretrainedFormatError, match=too_big):
        PretrainedGraphPredictor.from_pretrained("tiny-text")


def test_write_release_keeps_its_card_within_the_bound(root, monkeypatch):
    monkeypatch.setattr(releases, "MAX_CARD_BYTES", 100)
    with pytest.raises(ValueError, match="the model card would have .* bytes, more than the"):
        tiny_release(root)
    assert os.listdir(root) == []


def test_a_fifo_card_is_refused_at_once(root, capsys):
    folder = tiny_release(root)
    (folder / "README.md").unlink()
    os.mkfifo(folder / "README.md")
    done = {}

    def read():  # (in a thread: a blocking open or read would hang the test run)
        try:
            read_card(folder)
        except NotRegularFileError as err:
            done["error"] = str(err)
        done["status"] = main(["pretrained"])

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # (let a blocked open return, so the test run can end)
        with contextlib.suppress(OSError):
            os.close(os.open(folder / "README.md", os.O_WRONLY | os.O_NONBLOCK))
    assert not worker.is_alive() and "is a FIFO, not a regular file" in done["error"]
    assert done["status"] == 1 and "release tiny-text FAILS" in capsys.readouterr().err


def test_saving_and_resealing_refuse_a_path_with_a_nul_by_name(tmp_path):
    from glomo_pyg.publish import reseal_pretrained

    predictor = PretrainedGraphPredictor.from_pretrained("imdb-text-cpu")
    bad = str(tmp_path / "a\x00b")
    with pytest.raises(ValueError, match=r"save_pretrained: .*holds a NUL character"):
        predictor.save_pretrained(bad)
    with pytest.raises(ValueError, match=r"reseal_pretrained: .*holds a NUL character"):
        reseal_pretrained(bad)
    assert os.listdir(tmp_path) == []
