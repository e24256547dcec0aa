"""One concept, one home: each of these is defined once in the library and the benchmarks,
and the questions it answers are not asked again some other way (checked on the source
with ast)."""
import ast
import os
from typing import Dict, List

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("glomo_pyg", "benchmarks")

# name -> the one module (relative path) that defines it
HOMES = {
    "check_pruning": "glomo_pyg/graphs/pruning.py",
    "prune_rows": "glomo_pyg/graphs/pruning.py",
    "prune_edges": "glomo_pyg/graphs/pruning.py",
    "DIRECTIONS": "glomo_pyg/ordering.py",
    "digest": "glomo_pyg/digests.py",
    "weights_digest": "glomo_pyg/digests.py",
    "fingerprint": "glomo_pyg/nn/pretrained.py",
    "modality": "glomo_pyg/nn/pretrained.py",
    "check_output_file": "glomo_pyg/io/paths.py",
    "open_input_file": "glomo_pyg/io/paths.py",
    "read_image_file": "glomo_pyg/io/image_files.py",
    "to_uint8": "glomo_pyg/io/image_files.py",
    "untrained_copy": "glomo_pyg/analysis/syntax.py",
    "paired_difference": "benchmarks/statistics.py",
    "mean_sd": "benchmarks/statistics.py",
    "t_quantile_975": "benchmarks/statistics.py",
    "canonical_digest": "glomo_pyg/digests.py",
    "networkx_graph": "glomo_pyg/graph_conversion.py",
    "relation_name": "glomo_pyg/graph_names.py",
    "layer_name": "glomo_pyg/graph_names.py",
    "image_predictor": "glomo_pyg/analysis/export.py",
    "MAX_IMAGE_PIXELS": "glomo_pyg/analysis/export.py",
    "train_image_classifier": "glomo_pyg/training/image_classification.py",
    "precompute_propagations": "glomo_pyg/training/image_classification.py",
    "crop_maps": "glomo_pyg/training/image_classification.py",
    "release_sha256": "benchmarks/gpu/slices/common.py",
    "release_folder": "benchmarks/gpu/slices/common.py",
}


def sources() -> Dict[str, ast.Module]:
    out = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    out[os.path.relpath(path, ROOT)] = ast.parse(open(path, encoding="utf-8")
                                                                 .read())
    return out


def definitions(trees: Dict[str, ast.Module], name: str) -> List[str]:
    """Where ``name`` is defined: a function, class, method or property, or a module-level
    assignment (an import is not a definition, nor a typing Protocol's declaration of
    what it reads of an object)."""
    found = []
    for path, tree in trees.items():
        declared = {id(n) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and
                    any(getattr(b, "id", None) == "Protocol" for b in c.bases)
                    for n in ast.walk(c) if n is not c}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                    node.name in (name, "_" + name) and id(node) not in declared:
                found.append(f"{path}:{node.lineno}")
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id in (name, "_" + name) for t in targets):
                found.append(f"{path}:{node.lineno}")
    return found


@pytest.fixture(scope="module")
def trees():
    return sources()


@pytest.mark.parametrize("name", sorted(HOMES))
def test_each_concept_is_defined_once_in_its_home(trees, name):
    found = definitions(trees, name)
    assert len(found) == 1 and found[0].startswith(HOMES[name] + ":"), \
        f"{name} is defined at {found}; its one home is {HOMES[name]}"


def test_no_caller_guesses_a_predictors_modality(trees):
    """The predictor says what it reads (``modality``, ``image_size``); nothing asks its
    emitters whether they have a height."""
    guesses = []
    for path, tree in trees.items():
        if path == HOMES["modality"]:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("hasattr", "getattr") and len(node.args) >= 2 and \
                    isinstance(node.args[1], ast.Constant) and node.args[1].value == "height":
                guesses.append(f"{path}:{node.lineno}")
    assert not guesses, guesses


def test_the_planted_second_definition_is_found(trees):
    planted = dict(trees, **{"benchmarks/planted.py": ast.parse("def prune_rows():\n    pass\n")})
    assert len(definitions(planted, "prune_rows")) == 2
