"""What ``pip install`` brings: the version in one place, the releases the wheel carries
(found, listed with where they come from, refused by name when damaged) and a wheel built
from this tree that gives, outside the tree, the graphs the checkout gives."""
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import glomo_pyg.io.releases as releases
from glomo_pyg import PretrainedFormatError, PretrainedGraphPredictor, __version__
from glomo_pyg.cli import main

ROOT = Path(__file__).resolve().parent.parent
SMALL_RELEASE = "imagenet32-pixel-cpu"  # (the smallest: copied around by the tests)


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """An installed package's release folder (``glomo_pyg/pretrained``) holding a copy of
    the smallest repository release, with no ``$GLOMO_PRETRAINED_DIR``."""
    root = tmp_path / "site-packages" / "glomo_pyg" / "pretrained"
    shutil.copytree(ROOT / "pretrained" / SMALL_RELEASE, root / SMALL_RELEASE)
    monkeypatch.setattr(releases, "INSTALLED_ROOT", root)
    monkeypatch.delenv(releases.ENV_VAR, raising=False)
    return root


def test_the_version_lives_in_one_place(capsys):
    assert metadata.version("glomo-pyg") == __version__
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"glomo_pyg {__version__}\n"
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(ROOT / "pyproject.toml", "rb") as fh:
        pyproject = tomllib.load(fh)
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == \
        {"attr": "glomo_pyg.version.__version__"}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"dist/glomo_pyg-{__version__}-py3-none-any.whl" in readme  # (the install lines)
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(r"^## (\S+)", changelog, re.MULTILINE).group(1) == __version__


def test_releases_come_from_the_env_then_the_package_then_the_checkout(installed, tmp_path,
                                                                       monkeypatch):
    assert releases.releases_root() == installed
    assert releases.releases_origin() == "installed with the glomo_pyg package"
    assert releases.released_names() == [SMALL_RELEASE]
    monkeypatch.setenv(releases.ENV_VAR, str(tmp_path / "mine"))
    assert releases.releases_root() == tmp_path / "mine"
    assert releases.releases_origin() == f"${releases.ENV_VAR}"
    monkeypatch.delenv(releases.ENV_VAR)
    monkeypatch.setattr(releases, "INSTALLED_ROOT", tmp_path / "absent")
    assert releases.releases_root() == releases.CHECKOUT_ROOT == ROOT / "pretrained"
    assert releases.releases_origin() == "the source checkout's pretrained/ folder"


def test_glomo_pretrained_says_where_the_releases_come_from(installed, capsys):
    assert main(["pretrained"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith(SMALL_RELEASE)
    assert f"from {installed} (installed with the glomo_pyg package)" in out
    assert main(["pretrained", "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["origin"] == "installed with the glomo_pyg package"
    assert listed["path"] == str(installed / SMALL_RELEASE)
    predictor = PretrainedGraphPredictor.from_pretrained(SMALL_RELEASE)
    assert predictor.num_layers == listed["layers"]


def test_an_unknown_name_lists_the_installed_releases(installed):
    with pytest.raises(PretrainedFormatError, match=r"'imdb-text' is neither a folder nor the "
                       r"name of a released predictor; released predictors in .*"
                       rf"site-packages/glomo_pyg/pretrained .*: {SMALL_RELEASE}$"):
        PretrainedGraphPredictor.from_pretrained("imdb-text")


def _truncate(folder):
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])


def _edit_config(folder):
    config = json.loads((folder / "config.json").read_text())
    config["directions"]["forward"]["config"]["heads"] += 1
    (folder / "config.json").write_text(json.dumps(config))


def _flip_a_weight_byte(folder):
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-3] ^= 0xFF
    (folder / "model.safetensors").write_bytes(bytes(data))


@pytest.mark.parametrize("damage, match", [
    (_truncate, r"model\.safetensors"),
    (_flip_a_weight_byte, r"does not match the SHA-256 recorded"),
    (_edit_config, r"seal|changed"),
    (lambda f: (f / "model.safetensors").unlink(), r"model\.safetensors is missing"),
])
def test_a_damaged_installed_release_is_refused_by_name(installed, capsys, damage, match):
    damage(installed / SMALL_RELEASE)
    with pytest.raises(PretrainedFormatError, match=match):
        PretrainedGraphPredictor.from_pretrained(SMALL_RELEASE)
    assert main(["pretrained"]) == 1  # listed as failing, never as usable
    err = capsys.readouterr().err
    assert f"release {SMALL_RELEASE} FAILS its checks and will not load" in err


def test_a_release_without_its_config_is_not_a_release(installed):
    (installed / SMALL_RELEASE / "config.json").unlink()
    with pytest.raises(PretrainedFormatError, match="no released predictors are installed in "
                       f"{installed}"):
        PretrainedGraphPredictor.from_pretrained(SMALL_RELEASE)


def _build_wheel(tmp_path: Path) -> Path:
    """A wheel of this tree, built from a copy of it (setuptools writes scratch folders
    into the tree it builds)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE",
                 "CHANGELOG.md"):
        shutil.copy(ROOT / name, tree / name)
    for folder in ("glomo_pyg", "pretrained"):
        shutil.copytree(ROOT / folder, tree / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                           "--outdir", str(tmp_path / "dist"), str(tree)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [wheel] = (tmp_path / "dist").glob("glomo_pyg-*.whl")
    return wheel


@pytest.mark.slow
def test_a_wheel_built_from_the_tree_gives_the_checkouts_graphs(tmp_path):
    """Built without network (no build isolation), installed without dependencies into a
    folder of its own, and run from outside the tree by the CI's smoke script: the wheel
    holds the package, its releases and metadata only; every release loads by name from the
    installed copy with the checkout's bytes and graphs; ``glomo --version`` and ``glomo
    pretrained`` answer from it."""
    pytest.importorskip("build")
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(f"glomo_pyg-{__version__}.dist-info/METADATA").decode()
    description = meta.split("\n\n", 1)[1]
    assert description.startswith("# glomo_pyg")
    links = re.findall(r"\]\(([^)\s]+)\)", description)
    assert links and all(re.match(r"https?://|#", link) for link in links), links
    assert "License-File: LICENSE" in meta and "Project-URL: Paper" in meta
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-index", "--target", str(site), str(wheel)], check=True, timeout=300)
    env = dict(os.environ, PYTHONPATH=str(site), PATH=f"{site / 'bin'}:{os.environ['PATH']}")
    env.pop(releases.ENV_VAR, None)
    proc = subprocess.run([sys.executable, str(ROOT / ".ci" / "smoke_installed.py"),
                           "--checkout", str(ROOT), "--wheel", str(wheel), "--quick",
                           "--work", str(tmp_path / "work")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in sorted(p.name for p in (ROOT / "pretrained").iterdir()):
        assert f"release {name} " in proc.stdout and f"{site}/glomo_pyg/pretrained/{name}" \
            in proc.stdout
    assert "quick smoke test passed" in proc.stdout
