"""The Hugging Face Hub route (``glomo_pyg.io.hub``): ``hf://owner/name`` loads, pushes, the
model card's YAML front matter, offline use and the named errors, against a Hub on
127.0.0.1 (tests/hub_server.py) with the real huggingface_hub client: no mock of it, no
network."""
import ast
import json
import os
import sys
from pathlib import Path

import pytest
import torch

hf = pytest.importorskip("huggingface_hub")
yaml = pytest.importorskip("yaml")

import huggingface_hub.constants as hf_constants  # noqa: E402
from hub_server import HubServer  # noqa: E402

from glomo_pyg import (  # noqa: E402
    Glomo,
    PretrainedFormatError,
    PretrainedGraphPredictor,
    load_pretrained,  # noqa: E402
)
from glomo_pyg.cli import main  # noqa: E402
from glomo_pyg.extras import MissingExtraError  # noqa: E402
from glomo_pyg.io import hub as hub_route  # noqa: E402
from glomo_pyg.io.hub import HubError, HubNotFoundError, HubOfflineError  # noqa: E402
from glomo_pyg.io.releases import (  # noqa: E402
    CARD_TAGS,
    RELEASE_KEY,
    card_body,
    read_card,
)
from glomo_pyg.publish import push_folder, write_release  # noqa: E402

TOKENS = 12
VOCAB = [f"w{i}" for i in range(TOKENS)]
REPOSITORY_RELEASES = Path(__file__).resolve().parent.parent / "pretrained"
PREDICTOR_FILES = ["README.md", "config.json", "model.safetensors"]


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The loopback Hub, the client pointed at it, a fresh cache and no token."""
    server = HubServer().start()
    cache, home = tmp_path / "hf-cache", tmp_path / "hf-home"
    for key, value in dict(HF_ENDPOINT=server.url, HF_HOME=str(home), HF_HUB_CACHE=str(cache),
                           HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1",
                           HF_HUB_OFFLINE="0", HF_HUB_DISABLE_PROGRESS_BARS="1",
                           NO_PROXY="127.0.0.1").items():
        monkeypatch.setenv(key, value)
    for key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "GLOMO_PRETRAINED_DIR"):
        monkeypatch.delenv(key, raising=False)
    # (huggingface_hub reads its settings once, at import)
    for name, value in dict(
            ENDPOINT=server.url, HF_HOME=str(home), HF_HUB_CACHE=str(cache),
            HUGGINGFACE_CO_URL_TEMPLATE=server.url + "/{repo_id}/resolve/{revision}/{filename}",
            HF_TOKEN_PATH=str(home / "token"), HF_STORED_TOKENS_PATH=str(home / "stored"),
            HF_HUB_OFFLINE=False, HF_HUB_DISABLE_XET=True,
            HF_HUB_DISABLE_TELEMETRY=True).items():
        monkeypatch.setattr(hf_constants, name, value)
    server.cache = cache
    yield server
    server.stop()


def predictor(seed=0):
    torch.manual_seed(seed)
    model = Glomo.text(TOKENS, hidden_channels=8, num_layers=2, heads=2, cnn_layers=1)
    with torch.no_grad():  # away from the initialisation, so that graphs differ by seed
        for t in model.parameters():
            t.add_(0.3 * torch.randn_like(t))
    return model.to_pretrained(VOCAB)


def graphs(p):
    x = torch.randint(0, TOKENS, (17,), generator=torch.Generator().manual_seed(1))
    out = p(x, torch.tensor([0] * 8 + [1] * 9))
    return torch.cat([g.to_dense().flatten() for g in out if g is not None])


def repo_cache(hub, repo_id):
    return hub.cache / f"models--{repo_id.replace('/', '--')}"


def blobs(hub, repo_id):
    folder = repo_cache(hub, repo_id) / "blobs"
    return sorted(os.listdir(folder)) if folder.is_dir() else []


def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)


def front_matter(text):
    assert text.startswith("---\n")
    return yaml.safe_load(text[4:].split("\n---\n", 1)[0])


# --- 1. push and load ---------------------------------------------------------------------
def test_a_pushed_predictor_loads_with_the_graphs_of_its_local_folder(hub, tmp_path):
    p = predictor()
    p.save_pretrained(tmp_path / "local")
    pushed = p.push_to_hub("me/tiny", token="hf_secret")
    assert pushed.repo_id == "me/tiny" and pushed.revision == "main"
    assert pushed.url == f"{hub.url}/me/tiny" and sorted(pushed.files) == PREDICTOR_FILES
    files = hub.repos["me/tiny"].commits[pushed.commit]
    assert sorted(files) == [".gitattributes", *PREDICTOR_FILES]  # (the Hub's own first file)
    for name in ("config.json", "model.safetensors"):  # save_pretrained's bytes, as they are
        assert files[name] == (tmp_path / "local" / name).read_bytes()
    assert "Bearer hf_secret" in hub.tokens

    local = PretrainedGraphPredictor.from_pretrained(tmp_path / "local")
    remote = PretrainedGraphPredictor.from_pretrained("hf://me/tiny")
    assert torch.equal(graphs(local), graphs(remote)) and remote.vocabulary == VOCAB
    assert torch.equal(graphs(load_pretrained("hf://me/tiny")), graphs(local))
    snapshot = repo_cache(hub, "me/tiny") / "snapshots" / pushed.commit
    assert sorted(os.listdir(snapshot)) == PREDICTOR_FILES
    assert (repo_cache(hub, "me/tiny") / "refs" / "main").read_text() == pushed.commit
    assert sorted(set(hub.requested("me/tiny"))) == PREDICTOR_FILES  # (not .gitattributes)


def test_extra_files_of_a_repository_are_never_requested(hub):
    predictor().push_to_hub("me/tiny")
    hub.commit("me/tiny", {"pytorch_model.bin": b"\x80\x04 a pickle", "x.pkl": b"\x80\x04",
                           "notes/more.safetensors": b"{}"})
    loaded = PretrainedGraphPredictor.from_pretrained("hf://me/tiny")
    assert torch.equal(graphs(loaded), graphs(predictor()))
    asked = set(hub.requested("me/tiny"))
    assert asked == set(PREDICTOR_FILES)
    assert not {"pytorch_model.bin", "x.pkl", ".gitattributes"} & asked
    assert len(blobs(hub, "me/tiny")) == 3


def test_revision_loads_an_older_commit(hub):
    first = predictor(0).push_to_hub("me/tiny")
    second = predictor(1).push_to_hub("me/tiny", commit_message="Retrained")
    assert first.commit != second.commit
    older = PretrainedGraphPredictor.from_pretrained("hf://me/tiny", revision=first.commit)
    newest = PretrainedGraphPredictor.from_pretrained("hf://me/tiny")
    assert torch.equal(graphs(older), graphs(predictor(0)))
    assert torch.equal(graphs(newest), graphs(predictor(1)))
    assert not torch.equal(graphs(older), graphs(newest))


def test_a_tampered_file_on_the_hub_is_refused_by_the_seal(hub):
    pushed = predictor().push_to_hub("me/tiny")
    files = hub.repos["me/tiny"].commits[pushed.commit]
    weights = bytearray(files["model.safetensors"])
    weights[-3] ^= 0x01  # (a flip inside tensor data: safetensors alone would accept it)
    hub.commit("me/tiny", {"model.safetensors": bytes(weights)})
    with pytest.raises(PretrainedFormatError, match="hf://me/tiny.*does not match the SHA-256"):
        PretrainedGraphPredictor.from_pretrained("hf://me/tiny")
    config = json.loads(files["config.json"])
    config["directions"]["forward"]["config"]["sparse"] = \
        not config["directions"]["forward"]["config"]["sparse"]
    hub.commit("me/tiny", {"config.json": json.dumps(config).encode(),
                           "model.safetensors": files["model.safetensors"]})
    with pytest.raises(PretrainedFormatError, match="edited after it was sealed.*"
                                                    "directions.forward.config.sparse"):
        PretrainedGraphPredictor.from_pretrained("hf://me/tiny")
    # the commit pushed first still loads
    PretrainedGraphPredictor.from_pretrained("hf://me/tiny", revision=pushed.commit)


# --- 2. offline -------------------------------------------------------------------------------
def test_offline_loads_from_the_cache_and_names_what_it_lacks(hub, monkeypatch):
    pushed = predictor().push_to_hub("me/tiny")
    online = PretrainedGraphPredictor.from_pretrained("hf://me/tiny")
    asked = len(hub.log)
    offline(monkeypatch)
    for revision in (None, pushed.commit):
        cached = PretrainedGraphPredictor.from_pretrained("hf://me/tiny", revision=revision)
        assert torch.equal(graphs(cached), graphs(online))
    assert len(hub.log) == asked  # (not one request)
    for name, revision in (("hf://me/other", None), ("hf://me/tiny", "v2")):
        with pytest.raises(HubOfflineError, match="is not in the Hugging Face cache .* and "
                                                  "offline mode is on"):
            PretrainedGraphPredictor.from_pretrained(name, revision=revision)
    assert issubclass(HubOfflineError, PretrainedFormatError)
    with pytest.raises(HubOfflineError, match="cannot push.*offline mode is on"):
        predictor().push_to_hub("me/tiny")
    assert len(hub.log) == asked


def test_a_hub_that_cannot_be_reached_leaves_the_cache_to_answer(hub):
    predictor().push_to_hub("me/tiny")
    online = PretrainedGraphPredictor.from_pretrained("hf://me/tiny")
    hub.stop()
    cached = PretrainedGraphPredictor.from_pretrained("hf://me/tiny")
    assert torch.equal(graphs(cached), graphs(online))
    with pytest.raises(HubOfflineError, match="not in the Hugging Face cache.*cannot be "
                                              "reached"):
        PretrainedGraphPredictor.from_pretrained("hf://me/other")


# --- 3. named errors, nothing half-written --------------------------------------------------
def _empty_repo(hub):
    hub.create("me/empty")
    hub.commit("me/empty", {"model.safetensors": b"\0" * 16, "pytorch_model.bin": b"\x80"})
    return "hf://me/empty", None


def _oversized(hub):
    predictor().push_to_hub("me/big")
    hub.sizes[("me/big", "model.safetensors")] = 9 << 30  # (listed and announced: 9 GiB)
    return "hf://me/big", None


@pytest.mark.parametrize("case, error, match", [
    (lambda hub: ("hf://me/none", None), HubNotFoundError,
     "no model repository 'me/none' on http://127.0.0.1"),
    (lambda hub: (predictor().push_to_hub("me/tiny") and "hf://me/tiny", "v9"),
     HubNotFoundError, "has no revision 'v9'"),
    (_empty_repo, HubNotFoundError, "holds no config.json: it is not a glomo_pyg predictor"),
    (_oversized, HubError, r"model.safetensors has 9663676416 bytes, more than the 8589934592 "
     r"\(8192 MiB\).*refused before downloading anything"),
], ids=["unknown repository", "unknown revision", "no config.json", "oversized weights"])
def test_each_refusal_is_named_and_leaves_nothing_in_the_cache(hub, case, error, match):
    name, revision = case(hub)
    repo_id = name[len("hf://"):]
    with pytest.raises(error, match=match):
        PretrainedGraphPredictor.from_pretrained(name, revision=revision)
    assert hub.requested(repo_id) == [] and blobs(hub, repo_id) == []
    assert not repo_cache(hub, repo_id).exists()  # (not even a ref)


@pytest.mark.parametrize("name", ["hf://", "hf://../x", "hf://a/b/c", "hf://x", "hf://a/..",
                                  "hf://./x/y", "hf://a/b/", "hf://a\\b/c", "hf://a/b\0",
                                  "hf://a--b/c", "hf://-a/b", "hf://a/b.git", "hf://a/b@v1"])
def test_a_name_that_could_be_read_as_a_path_is_refused_unsent(hub, name):
    with pytest.raises(HubError, match="is not a Hugging Face Hub repository id"):
        PretrainedGraphPredictor.from_pretrained(name)
    assert hub.log == [] and not hub.cache.exists()


def test_revision_names_and_revision_without_a_hub_name_are_checked(hub, tmp_path):
    for revision in ("../../x", "a\0b", "", "a//b", ".hidden", "x" * 300):
        with pytest.raises(HubError, match="is not a branch, tag or commit name"):
            PretrainedGraphPredictor.from_pretrained("hf://me/tiny", revision=revision)
    with pytest.raises(TypeError, match="revision must be"):
        PretrainedGraphPredictor.from_pretrained("hf://me/tiny", revision=3)
    predictor().save_pretrained(tmp_path / "local")
    with pytest.raises(ValueError, match="revision='v1' picks a commit of a Hugging Face Hub"):
        PretrainedGraphPredictor.from_pretrained(tmp_path / "local", revision="v1")
    assert hub.log == []


def test_hf_names_are_always_the_hub_and_a_folder_named_hf_is_a_path(hub, tmp_path,
                                                                      monkeypatch):
    folder = tmp_path / "hf:" / "me" / "tiny"
    predictor().save_pretrained(folder)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HubNotFoundError):  # (the folder exists: the Hub is asked all the same)
        PretrainedGraphPredictor.from_pretrained("hf://me/tiny")
    assert PretrainedGraphPredictor.from_pretrained("./hf:/me/tiny").vocabulary == VOCAB


def test_without_huggingface_hub_the_route_names_its_extra(monkeypatch):
    for module in ("huggingface_hub", "huggingface_hub.constants", "huggingface_hub.errors"):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(MissingExtraError, match=r"pip install 'glomo-pyg\[hub\]'"):
        PretrainedGraphPredictor.from_pretrained("hf://me/tiny")
    with pytest.raises(MissingExtraError, match=r"glomo-pyg\[hub\]"):
        predictor().push_to_hub("me/tiny")
    # the core never imports it: no module-level import in the route's module
    tree = ast.parse(Path(hub_route.__file__).read_text())
    assert not [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) and
                "huggingface_hub" in ast.dump(n)]


# --- 4. pushing: checks at the door, folders, the command line ------------------------------
def test_push_checks_its_input_before_sending_anything(hub):
    p = predictor()
    for repo_id in ("../x", "a/b/c", "me", "a\\b/c", "me/ti ny"):
        with pytest.raises(HubError, match="is not a Hugging Face Hub repository id"):
            p.push_to_hub(repo_id)
    for kwargs, match in ((dict(private="yes"), "private must be"),
                          (dict(commit_message=" "), "commit_message must be"),
                          (dict(token=""), "token must be"),
                          (dict(card=dict(nmae="x")), r"unknown card fields \['nmae'\]"),
                          (dict(card=dict(modality="pixels")), "the predictor reads text"),
                          (dict(card=dict(quality="loss 0.5", metrics=[dict(
                              name="loss", type="loss", value=0.25, dataset="d",
                              dataset_type="d")])), "0.25 is not a number of the card's "
                           "Quality section"),
                          (dict(revision="../x"), "is not a branch")):
        with pytest.raises(ValueError, match=match):
            p.push_to_hub("me/tiny", **kwargs)
    with pytest.raises(TypeError):
        push_folder(3, "me/tiny")
    assert hub.log == []
    with pytest.raises(HubNotFoundError, match="has no revision 'dev'.*create the branch"):
        p.push_to_hub("me/tiny", revision="dev")


def test_the_model_card_front_matter_parses_with_the_hub_keys(hub):
    card = dict(summary="Tiny graphs for the tests.", data="random tokens",
                quality="undirected attachment 0.512 on nothing in particular",
                datasets=["stanfordnlp/imdb"], metrics=[dict(
                    name="undirected attachment", type="uuas", value=0.512,
                    dataset="nothing in particular", dataset_type="none")])
    pushed = predictor().push_to_hub("me/carded", card=card)
    text = hub.repos["me/carded"].commits[pushed.commit]["README.md"].decode()
    meta = front_matter(text)
    assert meta["library_name"] == "glomo-pyg" and meta["license"] == "mit"
    assert set(CARD_TAGS) <= set(meta["tags"]) and meta["datasets"] == ["stanfordnlp/imdb"]
    (result,) = meta["model-index"][0]["results"]
    assert meta["model-index"][0]["name"] == "me/carded"
    assert result["dataset"] == dict(name="nothing in particular", type="none")
    assert result["metrics"] == [dict(name="undirected attachment", type="uuas", value=0.512)]
    assert 'from_pretrained("hf://me/carded")' in text
    PretrainedGraphPredictor.from_pretrained("hf://me/carded")
    snapshot = repo_cache(hub, "me/carded") / "snapshots" / pushed.commit
    fields = read_card(snapshot)
    assert fields["name"] == "me/carded" and fields["quality"] == card["quality"]
    assert fields["modality"] == "text" and "library_name" not in text.split("---\n")[2]
    # no numbers given: no metrics, none made up
    bare = predictor().push_to_hub("me/bare")
    meta = front_matter(hub.repos["me/bare"].commits[bare.commit]["README.md"].decode())
    assert "model-index" not in meta and "datasets" not in meta
    assert set(meta) == {"library_name", "license", "tags"}


def test_glomo_pretrained_push_through_the_command_line(hub, tmp_path, capsys):
    p = predictor()
    p.save_pretrained(tmp_path / "mine")
    assert main(["pretrained", "--push", str(tmp_path / "mine"), "me/cli"]) == 0
    out = capsys.readouterr().out
    assert f"to {hub.url}/me/cli (commit " in out and 'from_pretrained("hf://me/cli")' in out
    (commit,) = [sha for sha, files in hub.repos["me/cli"].commits.items() if len(files) > 1]
    files = hub.repos["me/cli"].commits[commit]
    assert sorted(files) == [".gitattributes", *PREDICTOR_FILES]  # (a card written for it)
    assert front_matter(files["README.md"].decode())["library_name"] == "glomo-pyg"
    loaded = PretrainedGraphPredictor.from_pretrained("hf://me/cli")
    assert torch.equal(graphs(loaded), graphs(p))
    with pytest.raises(SystemExit, match="glomo pretrained: .*'../x' is not a Hugging Face"):
        main(["pretrained", "--push", str(tmp_path / "mine"), "../x"])
    with pytest.raises(SystemExit, match="glomo pretrained: .*holds no config.json"):
        main(["pretrained", "--push", str(tmp_path), "me/cli"])


def test_a_release_is_pushed_as_it_is_and_its_sealed_card_checked(hub, capsys):
    name = "imagenet32-pixel-cpu"  # (the smallest release)
    assert main(["pretrained", "--push", name, "me/pixels"]) == 0
    (commit,) = [sha for sha, files in hub.repos["me/pixels"].commits.items() if len(files) > 1]
    files = hub.repos["me/pixels"].commits[commit]
    for file in PREDICTOR_FILES:  # byte for byte, the sealed card included
        assert files[file] == (REPOSITORY_RELEASES / name / file).read_bytes()
    loaded = PretrainedGraphPredictor.from_pretrained("hf://me/pixels")
    assert loaded.fingerprint() == PretrainedGraphPredictor.from_pretrained(name).fingerprint()
    card = files["README.md"].replace(b"## Hardware", b"## Hardware\n\nA better GPU.")
    hub.commit("me/pixels", {"README.md": card})
    with pytest.raises(PretrainedFormatError, match="is not the model card sealed"):
        PretrainedGraphPredictor.from_pretrained("hf://me/pixels")


def test_a_folder_that_does_not_load_is_never_pushed(hub, tmp_path):
    predictor().save_pretrained(tmp_path / "mine")
    weights = tmp_path / "mine" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(PretrainedFormatError, match=f"{tmp_path / 'mine'} is not pushed: "
                                                    ".*does not match the SHA-256"):
        push_folder(tmp_path / "mine", "me/tiny")
    assert hub.log == []


# --- 5. the bundled releases' cards -------------------------------------------------------------
RELEASES = sorted(p.name for p in REPOSITORY_RELEASES.iterdir() if (p / "config.json").is_file()) \
    if REPOSITORY_RELEASES.is_dir() else []


@pytest.mark.parametrize("name", RELEASES)
def test_each_release_card_carries_the_front_matter_and_quotes_its_metrics(name):
    text = (REPOSITORY_RELEASES / name / "README.md").read_text(encoding="utf-8")
    meta = front_matter(text)
    assert meta["library_name"] == "glomo-pyg" and meta["license"] == "mit"
    assert set(CARD_TAGS) <= set(meta["tags"])
    card = read_card(REPOSITORY_RELEASES / name)
    assert card_body(text).startswith(f"# {name}\n\n{card['summary']}\n")
    for index in meta.get("model-index", []):
        assert index["name"] == name
        for result in index["results"]:
            for metric in result["metrics"]:  # (quoted from the card, never made up)
                assert str(metric["value"]) in card["quality"]
    config = json.loads((REPOSITORY_RELEASES / name / "config.json").read_text())
    assert config[RELEASE_KEY]["name"] == name  # (sealed with its card)


def test_the_front_matter_cannot_change_a_card_s_sections(tmp_path, monkeypatch):
    (tmp_path / "README.md").write_text(
        "---\n# theirs\n## Modality\n\ntext\n## Data\n\nspoofed\n---\n# mine\n\nOne line.\n\n"
        "## Modality\n\npixels\n")
    assert read_card(tmp_path) == {"name": "mine", "summary": "One line.", "modality": "pixels"}
    (tmp_path / "README.md").write_text("\ufeff \n---\nname: x\n---\n# mine\n\nOne line.\n")
    assert read_card(tmp_path) == {"name": "mine", "summary": "One line."}
    # a release's card is sealed whole: an edit to its front matter is refused on loading
    monkeypatch.setenv("GLOMO_PRETRAINED_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = Glomo.text(TOKENS, hidden_channels=8, num_layers=1, heads=1, cnn_layers=1)
    folder = write_release(model.to_pretrained(VOCAB), tmp_path / "tiny", dict(
        name="tiny", summary="A tiny release.", modality="text", release="test",
        quality="none", data="random tokens", recipe="none", command="glomo pretrain",
        hardware="a CPU", training_time="0 s", commit="0123abc"))
    readme = folder / "README.md"
    readme.write_text(readme.read_text().replace("license: mit", "license: other"))
    with pytest.raises(PretrainedFormatError, match="is not the model card sealed"):
        PretrainedGraphPredictor.from_pretrained(folder)
