"""Every model default is declared once, in glomo_pyg.nn.settings (ModelSettings, read
through TEXT_DEFAULTS and IMAGE_DEFAULTS): the factories, the emitters, the pretraining
configuration and the command line read it, and a second literal default fails here."""
import ast
import dataclasses
import inspect
import os

import pytest

from glomo_pyg import Glomo, GraphPredictor
from glomo_pyg.nn.emitter import EMITTERS
from glomo_pyg.nn.feature_predictor import FeatureGraphEmitter, FeaturePredictor
from glomo_pyg.nn.pixel import PixelGraphPredictor
from glomo_pyg.nn.scorer import GraphScorer
from glomo_pyg.nn.settings import IMAGE_DEFAULTS, SAVED_SETTINGS, TEXT_DEFAULTS, ModelSettings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = {f.name for f in dataclasses.fields(ModelSettings)}
# the modules that build models from settings: none may spell a model default itself
BUILDERS = ("glomo_pyg/nn/glomo.py", "glomo_pyg/training/pretrain/config.py",
            "glomo_pyg/training/pretrain/module.py", "glomo_pyg/training/quickstart.py",
            "glomo_pyg/cli.py")
# settings dicts that describe a model of their own, not a default of Glomo.text: the
# quickstart's small model (minutes on a CPU)
OWN_MODELS = {("glomo_pyg/training/quickstart.py", "QuickstartConfig")}
# parameters named like a setting that choose at run time: which direction of a
# bidirectional model a method reads (Glomo.features)
RUN_TIME = {"direction"}


def _defaults(function):
    return {name: p.default for name, p in inspect.signature(function).parameters.items()
            if name in SETTINGS and p.default is not inspect.Parameter.empty}


@pytest.mark.parametrize("function, defaults", [
    (Glomo.text, TEXT_DEFAULTS), (Glomo.__init__, TEXT_DEFAULTS),
    (Glomo.image, IMAGE_DEFAULTS), (GraphPredictor.__init__, TEXT_DEFAULTS),
    (FeaturePredictor.__init__, TEXT_DEFAULTS), (FeatureGraphEmitter.__init__, TEXT_DEFAULTS),
    (GraphScorer.__init__, TEXT_DEFAULTS), (PixelGraphPredictor.__init__, IMAGE_DEFAULTS),
], ids=lambda v: getattr(v, "__qualname__", ""))
def test_signature_defaults_are_the_declared_ones(function, defaults):
    found = _defaults(function)
    assert found, "no setting found in the signature"
    for name, value in found.items():
        want = getattr(defaults, name)
        assert value is None or value == want, \
            f"{function.__qualname__}({name}={value!r}): the declared default is {want!r}"


def _literal(node) -> bool:
    """A number, string or boolean spelled in the source (``1 << 22``, ``-1``, a tuple
    of them); ``None`` (use the declared default) is not one."""
    if isinstance(node, ast.Constant):
        return node.value is not None
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    if isinstance(node, ast.BinOp):
        return _literal(node.left) and _literal(node.right)
    if isinstance(node, (ast.Tuple, ast.List)):
        return bool(node.elts) and all(map(_literal, node.elts))
    return False


def literal_defaults(source: str, path: str = ""):
    """``(line, name)`` of every model setting given a literal default in ``source``: a
    parameter default, a class attribute (a dataclass field) or a ``dict(...)`` / ``{...}``
    entry (a settings mapping)."""
    found = []

    def visit(node, owner):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.ClassDef) else owner
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                args = child.args
                positional = args.posonlyargs + args.args
                pairs = list(zip(positional[len(positional) - len(args.defaults):],
                                 args.defaults))
                pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d]
                found.extend((d.lineno, a.arg) for a, d in pairs
                             if a.arg in SETTINGS - RUN_TIME and _literal(d))
            elif isinstance(child, ast.AnnAssign) and isinstance(node, ast.ClassDef) and \
                    isinstance(child.target, ast.Name) and child.target.id in SETTINGS and \
                    child.value is not None and _literal(child.value):
                found.append((child.lineno, child.target.id))
            if (path, owner) not in OWN_MODELS:
                if isinstance(child, ast.Call) and getattr(child.func, "id", None) == "dict":
                    found.extend((k.value.lineno, k.arg) for k in child.keywords
                                 if k.arg in SETTINGS and _literal(k.value))
                elif isinstance(child, ast.Dict):
                    found.extend((v.lineno, k.value) for k, v in zip(child.keys, child.values)
                                 if isinstance(k, ast.Constant) and k.value in SETTINGS and
                                 _literal(v))
            visit(child, name)

    visit(ast.parse(source), None)
    return found


@pytest.mark.parametrize("path", BUILDERS)
def test_no_module_that_builds_models_spells_a_model_default(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
        found = literal_defaults(fh.read(), path)
    assert not found, f"{path}: literal model defaults (read them from glomo_pyg.nn." \
                      f"settings instead): {found}"


def test_the_scan_catches_a_second_literal_default():
    with open(os.path.join(ROOT, "glomo_pyg/nn/glomo.py"), encoding="utf-8") as fh:
        source = fh.read()
    bad = source.replace("hidden_channels: int = _T.hidden_channels",
                         "hidden_channels: int = 256", 1)
    assert bad != source
    assert [name for _, name in literal_defaults(bad)] == ["hidden_channels"]
    for snippet in ("class C:\n    heads: int = 4\n", "model = dict(num_layers=2)\n",
                    "model = {'block_size': 1 << 20}\n", "f = lambda dropout=0.1: 0\n",
                    "def f(*, position_period=-2.0): pass\n"):
        assert literal_defaults(snippet), snippet
    assert not literal_defaults("def f(heads=None, x=3): pass\nd = dict(heads=h)\n")


def test_the_pretraining_configuration_reads_the_declared_defaults():
    from glomo_pyg.training.pretrain.config import PretrainConfig

    text = PretrainConfig().model
    assert text and all(v == getattr(TEXT_DEFAULTS, k) for k, v in text.items())
    image = PretrainConfig.from_dict(dict(corpus=dict(format="cifar10"))).model
    assert image and all(v == getattr(IMAGE_DEFAULTS, k) for k, v in image.items())
    assert text["hidden_channels"] == 512 and image["hidden_channels"] == 128


def test_the_quickstart_flags_default_to_its_config():
    from glomo_pyg.cli import build_parser
    from glomo_pyg.training.quickstart import QuickstartConfig

    args = vars(build_parser().parse_args(["quickstart"]))
    fields = {f.name for f in dataclasses.fields(QuickstartConfig)}
    shared = {k: v for k, v in args.items() if k in fields and k != "output_dir"}
    assert {"steps", "batch_size", "lr", "seed", "accelerator"} <= set(shared)
    assert all(v is None for v in shared.values()), shared  # QuickstartConfig's own


def test_saved_settings_are_the_emitters_arguments():
    """What a saved predictor stores: every constructor argument of every registered
    emitter (FeatureGraphEmitter passes the scorer's on), and nothing else."""
    names = set()
    for cls in (*EMITTERS.values(), GraphScorer):
        names |= {name for name, p in inspect.signature(cls.__init__).parameters.items()
                  if p.kind is not p.VAR_KEYWORD and name != "self"}
    assert set(SAVED_SETTINGS) == names & SETTINGS
    assert names - SETTINGS == {"in_channels"} - SETTINGS  # the scorer's width: derived
