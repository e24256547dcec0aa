"""Optional dependencies: the core works without them, and each feature that needs one
names the extra to install."""
import json
import os
import re
import subprocess
import sys

import pytest

from glomo_pyg.extras import EXTRAS, PACKAGES, MissingExtraError, require

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run in a fresh interpreter in which the optional packages cannot be imported (a finder
# whose modules fail to load: torch probes some of them with find_spec at import time).
_WITHOUT_EXTRAS = r'''
import importlib.abc, importlib.machinery, json, sys
BLOCKED = set(sys.argv[1].split(","))

class _Fail(importlib.abc.Loader):
    def create_module(self, spec):
        raise ModuleNotFoundError(f"No module named {spec.name!r}", name=spec.name)
    def exec_module(self, module):
        pass

class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            return importlib.machinery.ModuleSpec(name, _Fail())

sys.meta_path.insert(0, _Block())
import torch
from glomo_pyg import GlomoConv, PretrainedGraphPredictor
from glomo_pyg.extras import MissingExtraError

out = {}
conv = GlomoConv(4, heads=2)
x = torch.randn(5, 4)
edge_index = torch.tensor([[0, 1, 2], [1, 2, 3]])
out["conv"] = list(conv(x, edge_index, torch.ones(3)).shape)
predictor = PretrainedGraphPredictor.from_pretrained("imagenet32-pixel-cpu")
from glomo_pyg.pixels import image_units
graphs = predictor(*image_units(torch.randint(0, 256, (1, 3, 32, 32), dtype=torch.uint8)))
out["graphs"] = graphs.forward.num_layers

def error(fn):
    try:
        fn()
    except MissingExtraError as err:
        return str(err)
    return None

def figure():
    from glomo_pyg.analysis.figures import plot_graph_heatmaps
    plot_graph_heatmaps(graphs.forward)

def word2vec():
    from glomo_pyg.data.word_vectors import train_word_vectors
    train_word_vectors([["a", "b", "a"]] * 5, dim=4, min_count=1)

out["train"] = error(lambda: __import__("glomo_pyg.training"))
out["treebank"] = error(lambda: __import__("glomo_pyg.analysis.treebank"))
out["figure"] = error(figure)
out["word2vec"] = error(word2vec)
out["image"] = error(lambda: __import__("glomo_pyg.analysis", fromlist=["view"]).view(
    predictor, image="picture.png"))
print(json.dumps(out))
'''


def _run(code, *args, blocked=",".join(sorted(EXTRAS))):  # noqa: B008 (an immutable str)
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", code, blocked, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_core_works_without_extras_and_each_feature_names_its_extra():
    proc = _run(_WITHOUT_EXTRAS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["conv"] == [5, 4] and out["graphs"] == 2
    for key, extra, package in [("train", "train", "lightning"), ("treebank", "text", "conllu"),
                                ("figure", "analysis", "matplotlib"),
                                ("word2vec", "text", "gensim"),
                                ("image", "analysis", "pillow")]:
        assert out[key] is not None, f"{key}: no MissingExtraError"
        assert f"glomo-pyg[{extra}]" in out[key] and f"needs {package}" in out[key], out[key]


@pytest.mark.slow
def test_the_cli_names_the_extra_and_lists_releases_without_it():
    code = _WITHOUT_EXTRAS.split("import torch\n")[0] + (
        "from glomo_pyg.cli import main\n"
        "sys.argv = ['glomo'] + sys.argv[2:]\n"
        "sys.exit(main())\n")
    proc = _run(code, "quickstart")
    assert proc.returncode != 0
    assert "glomo quickstart:" in proc.stderr and "glomo-pyg[train]" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = _run(code, "pretrained")
    assert proc.returncode == 0 and "imagenet32-pixel-cpu" in proc.stdout, proc.stderr[-2000:]


def test_require_names_the_package_and_the_extra(monkeypatch):
    assert require("conllu", "x") is sys.modules["conllu"]
    monkeypatch.setitem(sys.modules, "sklearn", None)  # "installed" as absent
    with pytest.raises(MissingExtraError, match=r"Scoring needs scikit-learn, which is not "
                       r"installed: pip install 'glomo-pyg\[analysis\]'") as err:
        require("sklearn", "Scoring")
    assert isinstance(err.value, ImportError) and err.value.name == "sklearn"
    monkeypatch.setitem(sys.modules, "numpy_absent", None)  # not an extra: no advice
    with pytest.raises(ModuleNotFoundError) as err:
        require("numpy_absent", "x")
    assert not isinstance(err.value, MissingExtraError)


def test_require_lets_other_import_errors_through(monkeypatch, tmp_path):
    # a broken installation of an optional package is not reported as a missing extra
    (tmp_path / "gensim").mkdir()
    (tmp_path / "gensim" / "__init__.py").write_text("import a_module_gensim_lacks\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if n == "gensim" or n.startswith("gensim.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ModuleNotFoundError) as err:
        require("gensim", "x")
    assert not isinstance(err.value, MissingExtraError)
    assert err.value.name == "a_module_gensim_lacks"


def test_extras_in_pyproject_match_the_table():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        project = tomllib.load(fh)["project"]
    extras = project["optional-dependencies"]
    core = " ".join(project["dependencies"])

    def expanded(extra: str) -> list:
        """An extra's requirements, the extras it names (``glomo-pyg[a,b]``) expanded."""
        out = []
        for d in extras[extra]:
            composed = re.fullmatch(r"glomo-pyg\[([a-z,]+)\]", d)
            out += [r for e in composed.group(1).split(",") for r in expanded(e)] \
                if composed else [d]
        return out

    for module, extra in EXTRAS.items():
        package = PACKAGES.get(module, module)
        assert any(d.startswith(package) for d in extras[extra]), (module, extra)
        for bundle in ("all", "test"):  # CI installs [test]: every feature is tested
            assert any(d.startswith(package) for d in expanded(bundle)), (module, bundle)
        assert package not in core
    assert "tqdm" not in core  # unused (PyG brings it for itself)
    # composed, not repeated: each requirement is listed by one extra only
    listed = [d.split(">")[0].split("=")[0].split("<")[0] for e in extras for d in extras[e]
              if not d.startswith("glomo-pyg[")]
    assert len(listed) == len(set(listed)), sorted(listed)
    assert set(expanded("all")) == {d for e in ("train", "text", "analysis", "tensorboard",
                                                "hub") for d in extras[e]}
    # nothing the library never imports: PyG runs without torch-scatter / torch-sparse
    assert not [d for e in extras for d in extras[e] if d.startswith(("torch-scatter",
                                                                       "torch-sparse"))]
    versions = [c.rsplit(":: ", 1)[1] for c in project["classifiers"]
                if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert versions == ["3.11"] and project["requires-python"] == ">=3.11"  # what CI runs
