"""Sphinx configuration for the glomo_pyg documentation.

Build (warnings are errors, as in tests/test_docs.py)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # document the working tree, installed or not

# Importing the package imports torch; keep a docs build off the other cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from glomo_pyg.version import __version__  # noqa: E402

project = "glomo_pyg"
author = "glomo_pyg contributors"
copyright = "glomo_pyg contributors"
version = release = __version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_parser",  # the Markdown guides (design.md, text.md, ...)
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
templates_path: list[str] = []

# -- autodoc / napoleon -------------------------------------------------------------
autoclass_content = "both"          # class docstring + __init__ docstring (constructor args)
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"show-inheritance": True}
# Methods without a docstring of their own (forward, training_step, configure_optimizers
# of torch / Lightning subclasses) are left out instead of repeating the base class's
# documentation (Lightning's uses directives of its own docs, e.g. ``testcode``).
autodoc_inherit_docstrings = False
# Documented names keep the path users import them from (glomo_pyg.GlomoConv, not
# glomo_pyg.nn.conv.GlomoConv).
add_module_names = True

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True
# PyTorch Geometric's docstring style: a "Shapes:" section holding a bullet list of
# input/output shapes. Rendered as a plain rubric with its content kept as written.
napoleon_custom_sections = ["Shapes"]

# -- MyST (the Markdown guides) -------------------------------------------------------
# The guides link to sections of each other (training.md#graph-health): generate the
# GitHub-style anchors for those headings.
myst_heading_anchors = 3

# -- HTML ---------------------------------------------------------------------------
html_theme = "alabaster"
html_title = f"glomo_pyg {__version__}"
html_static_path: list[str] = []
html_theme_options = {"description": "GLoMo's learned relational graphs for PyTorch Geometric"}


def _document_forward(app, what, name, obj, skip, options):
    # A module's forward() has no docstring of its own (its class docstring describes
    # the call), but its signature belongs in the reference.
    if (skip and what == "class" and name == "forward"
            and getattr(obj, "__module__", "").startswith("glomo_pyg.")):
        return False
    return None


def setup(app):
    app.connect("autodoc-skip-member", _document_forward)
