"""The Sphinx documentation builds with warnings as errors and covers the public API."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import glomo_pyg

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.slow
def test_docs_build_without_warnings(tmp_path):
    out = tmp_path / "html"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(DOCS), str(out)],
        capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr

    api_index = out / "api" / "index.html"
    assert api_index.exists()
    assert "GlomoConv" in api_index.read_text(encoding="utf-8")
    # every name of glomo_pyg.__all__ has an entry on the top-level page
    top_level = (out / "api" / "glomo_pyg.html").read_text(encoding="utf-8")
    missing = [name for name in glomo_pyg.__all__
               if name != "__version__" and f'id="glomo_pyg.{name}"' not in top_level]
    assert not missing, missing
    assert (out / "how_glomo_works.html").exists()


def test_relative_links_in_the_markdown_files_point_to_files_that_exist():
    root = DOCS.parent
    pages = [root / "README.md", *root.glob("docs/*.md"), *root.glob("benchmarks/*.md"),
             *root.glob("benchmarks/results/*.md")]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s#]+)", page.read_text(encoding="utf-8")):
            if not re.match(r"[a-z]+:", target) and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(root)}: {target}")
    assert not broken, broken
