"""Saved predictors are sealed as a whole (config, vocabulary, weights): every edit is
refused on load naming the keys that changed; reseal_pretrained / glomo reseal seal a
deliberate edit; older formats load only when asked for (allow_unsealed=True), with a
warning; a folder in the releases root loads only sealed, however it is named."""
import json
import os
import shutil
import warnings

import pytest
import torch
from bundles import edit_config

from glomo_pyg import (
    GraphPredictor,
    PretrainedFormatError,
    PretrainedGraphPredictor,
    load_pretrained,
    save_pretrained,
)
from glomo_pyg.cli import main
from glomo_pyg.io.pretrained import UnsealedPredictorWarning
from glomo_pyg.nn.pixel import PixelGraphPredictor
from glomo_pyg.publish import reseal_pretrained

VOCAB = [f"w{i}" for i in range(12)]


def text_predictor(path):
    torch.manual_seed(0)
    parts = [GraphPredictor(num_tokens=12, hidden_channels=8, num_layers=2, heads=2,
                            cnn_layers=1, direction=d) for d in ("forward", "backward")]
    save_pretrained(PretrainedGraphPredictor(*parts, VOCAB, trained_length=16), path)
    return path


def pixel_predictor(path):
    torch.manual_seed(0)
    save_pretrained(PretrainedGraphPredictor(PixelGraphPredictor(
        height=4, width=4, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1)), path)
    return path


def refused(path, *keys):
    with pytest.raises(PretrainedFormatError) as info:
        load_pretrained(path)
    message = str(info.value)
    assert "config.json: it was edited after it was sealed" in message, message
    assert "glomo reseal" in message
    for key in keys:
        assert key in message, (key, message)
    return message


def forward_config(**values):
    return lambda c: c["directions"]["forward"]["config"].update(values)


@pytest.mark.parametrize("change,keys", [
    (forward_config(sparse=False), ["changed: directions.forward.config.sparse"]),
    (forward_config(include_self=True), ["directions.forward.config.include_self"]),
    (lambda c: c["vocabulary"].__setitem__(slice(0, 2), ["w1", "w0"]), ["changed: vocabulary"]),
    (lambda c: c.update(vocabulary=[f"v{i}" for i in range(12)]), ["changed: vocabulary"]),
    (lambda c: c.update(trained_length=64), ["changed: trained_length"]),
    (lambda c: c["weights"].update(sha256="0" * 64), ["changed: weights"]),
    (lambda c: c.update(note="hello"), ["added: note"]),
    (lambda c: c.pop("trained_length"), ["removed: trained_length"]),
    (lambda c: c["directions"].pop("backward"), ["removed: directions.backward.cls"]),
])
def test_every_edit_of_a_sealed_text_predictor_is_refused_naming_the_key(tmp_path, change,
                                                                        keys):
    path = text_predictor(tmp_path / "p")
    edit_config(path, change, seal=False)
    refused(path, *keys)


def test_an_edited_pixel_statistic_is_refused(tmp_path):
    path = pixel_predictor(tmp_path / "p")
    edit_config(path, forward_config(pixel_mean=[0.5, 0.5, 0.5]), seal=False)
    refused(path, "changed: directions.forward.config.pixel_mean")


def test_a_damaged_seal_is_named(tmp_path):
    path = text_predictor(tmp_path / "p")
    edit_config(path, lambda c: c["seal"].update(sha256="0" * 64), seal=False)
    with pytest.raises(PretrainedFormatError, match="its seal was edited"):
        load_pretrained(path)
    edit_config(path, lambda c: c.pop("seal"), seal=False)
    with pytest.raises(PretrainedFormatError, match="has no valid seal"):
        load_pretrained(path)


def test_a_deliberate_edit_is_sealed_again_and_then_loads(tmp_path):
    path = text_predictor(tmp_path / "p")
    edit_config(path, lambda c: c["vocabulary"].__setitem__(slice(0, 2), ["w1", "w0"]),
                seal=False)
    refused(path, "vocabulary")
    assert reseal_pretrained(path) == path
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predictor = load_pretrained(path)
    assert predictor.encode(["w0"]).tolist() == [1]  # the edit holds, deliberately


def test_resealing_never_leaves_a_predictor_that_does_not_load(tmp_path):
    path = text_predictor(tmp_path / "p")
    edit_config(path, forward_config(hidden_channels=16), seal=False)  # not the weights'
    before = (path / "config.json").read_bytes()
    with pytest.raises(PretrainedFormatError, match="shape|size|tensor"):
        reseal_pretrained(path)
    assert (path / "config.json").read_bytes() == before  # put back
    with pytest.raises(PretrainedFormatError, match="does not exist"):
        reseal_pretrained(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PretrainedFormatError, match="missing"):
        reseal_pretrained(tmp_path / "empty")


def unsealed_format_2(path):
    """What save_pretrained wrote before predictors were sealed."""
    config = json.loads((path / "config.json").read_text())
    config.pop("seal")
    config["format_version"] = 2
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_format_2_loads_only_when_asked_for_and_reseals(tmp_path, capsys):
    path = unsealed_format_2(text_predictor(tmp_path / "p"))
    with pytest.raises(PretrainedFormatError, match="format version 2, which is not sealed.*"
                                                    "glomo reseal.*allow_unsealed=True"):
        load_pretrained(path)
    with pytest.raises(PretrainedFormatError, match="not sealed"):
        PretrainedGraphPredictor.from_pretrained(path)
    with pytest.warns(UnsealedPredictorWarning, match="format version 2.*glomo reseal"):
        load_pretrained(path, allow_unsealed=True)
    with pytest.warns(UnsealedPredictorWarning):
        PretrainedGraphPredictor.from_pretrained(path, allow_unsealed=True)
    assert main(["reseal", str(path)]) == 0
    assert "sealed" in capsys.readouterr().out
    assert json.loads((path / "config.json").read_text())["format_version"] == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_pretrained(path)
    with pytest.raises(SystemExit, match="glomo reseal: .*does not exist"):
        main(["reseal", str(tmp_path / "nothing")])


def test_a_released_predictor_loads_only_sealed(tmp_path, monkeypatch):
    root = tmp_path / "releases"
    text_predictor(root / "tiny-text")
    monkeypatch.setenv("GLOMO_PRETRAINED_DIR", str(root))
    PretrainedGraphPredictor.from_pretrained("tiny-text")
    unsealed_format_2(root / "tiny-text")
    with pytest.raises(PretrainedFormatError, match="not sealed.*a released predictor must "
                                                    "always be sealed"):
        PretrainedGraphPredictor.from_pretrained("tiny-text")
    (tmp_path / "link").symlink_to(root / "tiny-text")
    monkeypatch.chdir(root)
    # however the release is named, even when asked for unsealed, its seal is required
    for name in (str(root / "tiny-text"), root / "tiny-text", "./tiny-text",
                 os.path.join("..", "releases", "tiny-text"), str(tmp_path / "link")):
        with pytest.raises(PretrainedFormatError, match="not sealed"):
            load_pretrained(name, allow_unsealed=True)
    shutil.copytree(root / "tiny-text", tmp_path / "mine")  # outside the root: the user's own
    with pytest.warns(UnsealedPredictorWarning):
        load_pretrained(tmp_path / "mine", allow_unsealed=True)


def test_glomo_pretrained_names_releases_that_fail_their_seal(tmp_path, monkeypatch, capsys):
    root = tmp_path / "releases"
    for name in ("good-text", "bad-text"):
        text_predictor(root / name)
        (root / name / "README.md").write_text(f"# {name}\n\nA test release.\n")
    monkeypatch.setenv("GLOMO_PRETRAINED_DIR", str(root))
    unsealed_format_2(root / "bad-text")
    assert main(["pretrained"]) == 1
    out = capsys.readouterr()
    assert "good-text" in out.out and "A test release." in out.out
    assert "bad-text" in out.err and "not sealed" in out.err, out.err
    assert main(["pretrained", "--json"]) == 1
    infos = json.loads(capsys.readouterr().out)
    assert [i["name"] for i in infos] == ["bad-text", "good-text"]
    assert "not sealed" in infos[0]["error"] and "error" not in infos[1]


def test_a_tiny_weights_entry_says_what_is_wrong(tmp_path):
    path = text_predictor(tmp_path / "p")
    (path / "model.safetensors").write_bytes(b"12345")
    edit_config(path, lambda c: c["weights"].update(bytes=5))  # resealed, as an attacker could
    with pytest.raises(PretrainedFormatError, match=r"weights.bytes must be .*a safetensors "
                                                    r"file has at least 8\), got 5"):
        load_pretrained(path)


def test_copies_stay_sealed(tmp_path):
    path = text_predictor(tmp_path / "p")
    shutil.copytree(path, tmp_path / "copy")
    load_pretrained(tmp_path / "copy")  # the seal covers content, not the place
