"""The structure of the package: no import cycle, no file I/O in glomo_pyg.nn, io uses
nothing private from nn. Checked on the source with ast (function-level imports
included; TYPE_CHECKING blocks, which never run, excluded)."""
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
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bad = [a.name for a in node.names if a.name.split(".")[0] in FILE_MODULES]
            elif isinstance(node, ast.ImportFrom) and node.module:
                bad = [node.module] if node.module.split(".")[0] in FILE_MODULES or \
                    node.module.startswith("glomo_pyg.io") else []
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


def test_io_uses_nothing_private_from_nn():
    problems = []
    for name, path in modules().items():
        if not name.startswith("glomo_pyg.io"):
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith("glomo_pyg.nn"):
                problems += [f"{name}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert not problems, problems


def test_analysis_statistics_do_not_need_lightning():
    tree = ast.parse(open(os.path.join(ROOT, "analysis", "statistics.py")).read())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert not [n for n in names if n.startswith("lightning") or "training" in n]
