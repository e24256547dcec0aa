"""Optional dependencies, installed as extras of ``glomo-pyg`` (``train``, ``text``,
``analysis``, ``hub``, ``all``; see the README). :func:`require` imports an optional module
or raises :class:`MissingExtraError` naming the package and the extra to install."""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Dict

#: The extra that provides each optional top-level module.
EXTRAS: Dict[str, str] = {"lightning": "train", "yaml": "train", "gensim": "text",
                          "conllu": "text", "matplotlib": "analysis", "sklearn": "analysis",
                          "PIL": "analysis", "huggingface_hub": "hub"}
#: Distribution names where they differ from the module's.
PACKAGES: Dict[str, str] = {"yaml": "pyyaml", "sklearn": "scikit-learn", "PIL": "pillow",
                             "huggingface_hub": "huggingface_hub"}


class MissingExtraError(ImportError):
    """An optional package a feature needs is not installed (the message names the
    extra that installs it)."""


def require(module: str, feature: str) -> ModuleType:
    """``module`` imported, or :class:`MissingExtraError` naming the extra that ``feature``
    needs; other import errors (a broken installation) propagate as they are."""
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if top not in EXTRAS or (err.name or "").split(".")[0] != top:
            raise
        raise MissingExtraError(
            f"{feature} needs {PACKAGES.get(top, top)}, which is not installed: "
            f"pip install 'glomo-pyg[{EXTRAS[top]}]' (or 'glomo-pyg[all]')", name=top) from err
