"""The structure of the package: layers that import only downward, no import cycle, no
private name imported across modules, no file I/O in glomo_pyg.nn. Checked on the source
with ast (function-level imports included; TYPE_CHECKING blocks, which never run,
excluded)."""
import ast
import os
from typing import Dict, List, Set

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "glomo_pyg")


def modules() -> Dict[str, str]:
    out = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported(path: str, known: Set[str]) -> List[str]:
    """Modules of glomo_pyg that the file at ``path`` imports (anywhere in it)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and
            _is_type_checking(node) for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "glomo_pyg"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                node.module.split(".")[0] == "glomo_pyg":
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names
                    if f"{node.module}.{a.name}" in known]
    return [m for m in out if m in known]


def import_graph() -> Dict[str, Set[str]]:
    """Edges module -> module it makes Python execute: the imported module and its
    parent packages, except packages that contain the importer (already running) and
    the root package (always initialised first)."""
    mods = modules()
    graph = {}
    for name, path in mods.items():
        edges = set()
        for target in imported(path, set(mods)):
            parts = target.split(".")
            for k in range(2, len(parts) + 1):
                prefix = ".".join(parts[:k])
                if prefix != name and not name.startswith(prefix + "."):
                    edges.add(prefix)
        graph[name] = edges & set(mods)
    return graph


def test_no_import_cycle_inside_glomo_pyg():
    graph = import_graph()
    state: Dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


# The layers, lowest first (docs/design.md, "Architecture"): a module imports its own
# layer and those below it, never one above. The package's __init__ (the public names)
# sits above them all.
LAYERS = [
    ("base", ["version", "extras", "threads", "allocator", "atomic_files", "settings", "digests",
              "tokenizer", "graph_names", "devices", "logs"]),
    ("batches and orders", ["sequences", "ordering"]),
    ("kernels", ["kernels", "flex", "pixels", "graph_conversion", "pruning", "score_blocks"]),
    ("graphs", ["graphs"]),
    ("io", ["io"]),
    ("nn", ["nn"]),
    ("publish", ["publish"]),
    ("transforms", ["transforms"]),
    ("data", ["data"]),
    ("analysis", ["analysis", "evaluation"]),
    ("training", ["training"]),
    ("cli", ["cli"]),
]


def layer_of(module: str) -> int:
    """Index in :data:`LAYERS` of a ``glomo_pyg.X...`` module (by ``X``)."""
    top = module.split(".")[1]
    for index, (_, tops) in enumerate(LAYERS):
        if top in tops:
            return index
    raise AssertionError(f"{module} is in no layer: add glomo_pyg.{top} to LAYERS")


def upward_imports() -> List[str]:
    graph = import_graph()
    return [f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
            for m in sorted(graph) if m != "glomo_pyg"
            for t in sorted(graph[m]) if t != "glomo_pyg" and layer_of(t) > layer_of(m)]


def private_imports() -> List[str]:
    """``from glomo_pyg.X import _name`` outside module X itself."""
    problems = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                    node.module.split(".")[0] == "glomo_pyg" and node.module != name:
                problems += [f"{name} imports {node.module}.{a.name}" for a in node.names
                             if a.name.startswith("_") and not a.name.startswith("__")]
    return problems


def test_every_module_imports_only_its_own_layer_and_those_below():
    for name in modules():
        if name != "glomo_pyg":
            layer_of(name)  # every module has a layer
    assert not upward_imports(), "upward imports: " + "; ".join(upward_imports())


def test_no_private_name_is_imported_across_modules():
    assert not private_imports(), private_imports()


def graph_modules() -> Dict[str, str]:
    """The modules of the graphs package (or a lone ``graphs.py``), by dotted name."""
    return {name: path for name, path in modules().items()
            if name == "glomo_pyg.graphs" or name.startswith("glomo_pyg.graphs.")}


def graph_private_reads() -> List[str]:
    """Reads of a graph's private attributes or methods (``self._x`` and ``_x`` methods
    of the classes of the ``glomo_pyg.graphs`` package: graphs, frames, storages)
    outside that package, on anything but ``self``/``cls``: library code builds and
    reads graphs through their public interface (``from_storage``, ``from_trusted_*``,
    ``storages``, ``fused_layers``, ``normalization``, ...)."""
    private = set()
    for path in graph_modules().values():
        tree = ast.parse(open(path, encoding="utf-8").read())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                        node.value.id == "self" and node.attr.startswith("_") and \
                        not node.attr.startswith("__"):
                    private.add(node.attr)
                elif isinstance(node, ast.FunctionDef) and node.name.startswith("_") and \
                        not node.name.startswith("__"):
                    private.add(node.name)
    assert private, "found no private names in the graphs package: is the check reading it?"
    problems = []
    for name, path in modules().items():
        if name in graph_modules():
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Attribute) and node.attr in private and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                problems.append(f"{name}:{node.lineno}: .{node.attr}")
    return problems


def test_no_module_outside_graphs_reads_a_private_attribute_of_a_graph():
    assert not graph_private_reads(), graph_private_reads()


def test_the_layer_checks_find_a_planted_upward_and_private_import(tmp_path, monkeypatch):
    pkg = tmp_path / "glomo_pyg"
    (pkg / "nn").mkdir(parents=True)
    (pkg / "training").mkdir()
    for init in (pkg, pkg / "nn", pkg / "training"):
        (init / "__init__.py").write_text("")
    (pkg / "graphs.py").write_text("")
    (pkg / "training" / "loop.py").write_text("def _helper():\n    pass\n")
    # a function-level import is an import all the same
    (pkg / "nn" / "layer.py").write_text(
        "import glomo_pyg.graphs\n\ndef f():\n    from glomo_pyg.training.loop import _helper\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", str(pkg))
    assert upward_imports() == ["glomo_pyg.nn.layer (nn) imports glomo_pyg.training (training)",
                                "glomo_pyg.nn.layer (nn) imports glomo_pyg.training.loop "
                                "(training)"]
    assert private_imports() == ["glomo_pyg.nn.layer imports glomo_pyg.training.loop._helper"]
    with pytest.raises(AssertionError, match="upward imports"):
        test_every_module_imports_only_its_own_layer_and_those_below()
    (pkg / "stray.py").write_text("")
    with pytest.raises(AssertionError, match="glomo_pyg.stray is in no layer"):
        test_every_module_imports_only_its_own_layer_and_those_below()


def test_the_cycle_check_finds_a_planted_cycle(tmp_path, monkeypatch):
    pkg = tmp_path / "glomo_pyg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from glomo_pyg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("from glomo_pyg.sub.b import g\n")
    (pkg / "sub" / "b.py").write_text("import glomo_pyg.a\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", str(pkg))
    graph = import_graph()
    assert "glomo_pyg.sub" in graph["glomo_pyg.a"] and "glomo_pyg.a" in graph["glomo_pyg.sub.b"]
    with pytest.raises(AssertionError, match="import cycles"):
        test_no_import_cycle_inside_glomo_pyg()


FILE_MODULES = {"os", "pathlib", "json", "pickle", "shutil", "tempfile", "io", "safetensors",
                "yaml", "glob"}


def test_no_file_io_in_nn():
    problems = []
    for name, path in modules().items():
        if not name.startswith("glomo_pyg.nn"):
            continue
        tree = ast.parse(open(path, encoding="utf-8").read())
        skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and
                _is_type_checking(node) for n in ast.walk(node)}  # (never run)
        for node in ast.walk(tree):
            if id(node) in skip:
                bad = []
            elif isinstance(node, ast.Import):
                bad = [a.name for a in node.names if a.name.split(".")[0] in FILE_MODULES]
            elif isinstance(node, ast.ImportFrom) and node.module:
                bad = [node.module] if node.module.split(".")[0] in FILE_MODULES else []
            elif isinstance(node, ast.Call):
                f = node.func
                bad = ["open()"] if isinstance(f, ast.Name) and f.id == "open" else \
                    [f"torch.{f.attr}()"] if isinstance(f, ast.Attribute) and \
                    f.attr in ("save", "load") and isinstance(f.value, ast.Name) and \
                    f.value.id == "torch" else []
            else:
                bad = []
            problems += [f"{name}:{node.lineno}: {b}" for b in bad]
    assert not problems, problems


def test_persistence_is_reached_through_imports_not_registered():
    """Saving and loading a predictor reach glomo_pyg.io through imports one can read
    (nn.pretrained imports the format; io imports nothing of nn), and no module keeps a
    registry of functions that another module fills at import time."""
    graph = import_graph()
    assert "glomo_pyg.io.pretrained" in graph["glomo_pyg.nn.pretrained"]
    assert not [m for m in graph if m.startswith("glomo_pyg.io") and
                any(t.startswith("glomo_pyg.nn") for t in graph[m])]
    registering = [name for name, path in modules().items()
                   if "def register_persistence" in open(path, encoding="utf-8").read() or
                   "def register_scheme" in open(path, encoding="utf-8").read()]
    assert not registering, registering


def test_analysis_statistics_do_not_need_lightning():
    tree = ast.parse(open(os.path.join(ROOT, "analysis", "statistics.py")).read())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert not [n for n in names if n.startswith("lightning") or "training" in n]


def test_the_private_read_check_finds_a_planted_read(tmp_path, monkeypatch):
    pkg = tmp_path / "glomo_pyg"
    (pkg / "nn").mkdir(parents=True)
    (pkg / "graphs").mkdir()
    (pkg / "graphs" / "__init__.py").write_text("")
    (pkg / "graphs" / "storage.py").write_text(
        "class FusedStorage:\n    def __init__(self):\n        self._fused = None\n\n"
        "    def _helper(self):\n        return self._fused\n")
    (pkg / "nn" / "use.py").write_text(
        "def f(g, self=None):\n    g._helper()\n    return g._fused, self._fused\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", str(pkg))
    assert graph_private_reads() == ["glomo_pyg.nn.use:2: ._helper",
                                     "glomo_pyg.nn.use:3: ._fused"]


MAX_FUNCTION_LINES = 60


def long_functions(roots: List[str]) -> List[str]:
    """Functions (and methods) of more than :data:`MAX_FUNCTION_LINES` lines, docstring
    included, in the Python files under ``roots``."""
    found = []
    for root in roots:
        for folder, _, files in os.walk(root):
            for name in (f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                            node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                        found.append(f"{path}:{node.lineno} {node.name}")
    return found


def test_no_function_is_longer_than_a_screen(tmp_path):
    benchmarks = os.path.join(os.path.dirname(ROOT), "benchmarks")
    assert not long_functions([ROOT, benchmarks]), long_functions([ROOT, benchmarks])
    planted = tmp_path / "long.py"
    planted.write_text("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    assert long_functions([str(tmp_path)]) == [f"{planted}:1 f"]
