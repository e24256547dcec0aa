"""Optional dependencies, installed as extras of ``glomo-pyg``.

``pip install glomo-pyg`` brings what the graph machinery needs (torch, PyTorch
Geometric, numpy, safetensors, networkx). The rest comes with the feature that needs it:

=============  ===========================  ==============================================
extra          packages                     for
=============  ===========================  ==============================================
``train``      lightning, pyyaml            pretraining, downstream training, ``glomo
                                            pretrain`` / ``quickstart`` / YAML configs
``text``       gensim, conllu               word2vec vectors, CoNLL-U / CoNLL-X treebanks
``analysis``   matplotlib, scikit-learn     figures, the syntax scores' average precision
``all``        all of the above
=============  ===========================  ==============================================

:func:`require` imports an optional module and, when it is missing, raises
:class:`MissingExtraError` naming the package and the extra to install.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Dict

#: The extra that provides each optional top-level module.
EXTRAS: Dict[str, str] = {"lightning": "train", "yaml": "train", "gensim": "text",
                          "conllu": "text", "matplotlib": "analysis", "sklearn": "analysis"}
#: Distribution names where they differ from the module's.
PACKAGES: Dict[str, str] = {"yaml": "pyyaml", "sklearn": "scikit-learn"}


class MissingExtraError(ImportError):
    """An optional package a feature needs is not installed (the message names the
    extra that installs it)."""


def require(module: str, feature: str) -> ModuleType:
    """``module`` imported, or :class:`MissingExtraError` saying that ``feature`` needs
    its package and which extra installs it. Only the optional package's own absence is
    translated: any other import error (a broken installation) propagates as it is."""
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if top not in EXTRAS or (err.name or "").split(".")[0] != top:
            raise
        raise MissingExtraError(
            f"{feature} needs {PACKAGES.get(top, top)}, which is not installed: "
            f"pip install 'glomo-pyg[{EXTRAS[top]}]' (or 'glomo-pyg[all]')", name=top) from err
