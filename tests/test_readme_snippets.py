"""Every python block of the README runs as printed, as a user runs it: in a fresh Python
process, from an empty folder outside the source tree, with the package as installed (no
quickstart run first, no file of the checkout). CI also runs them from the installed
wheel (``.ci/smoke_installed.py``)."""
import json
import os
import re
import subprocess
import sys

import pytest
from readme_text import readme, section_blocks

# what each section's block must have computed (checked in its own namespace, after it)
CHECKS = {
    "Usage": "assert out.shape == (70, 64)",
    "Add pretrained graphs to your model": "assert logits.shape == (2, 2)",
    "Pretrained predictors": "assert predictor.vocabulary and pixels.vocabulary is None",
    "Graphs for any PyG layer": "assert graphs.relations == ['forward', 'backward']\n"
                                "assert batch.num_graphs == 2\n"
                                "assert h.shape == (batch.num_nodes, 32)\n"
                                "per_target = batch.edge_index[1] * 2 + batch.edge_type\n"
                                "assert torch.bincount(per_target).max() <= 4  # top_k=4",
    "See what was learned": "page = open('graphs.html').read()\n"
                            "assert page.startswith('<!DOCTYPE html>') and "
                            "'\"kind\":\"text\"' in page",
    "Graphs over pixels": "assert logits.shape == (4, 10)",
}
RUNNER = r"""
import json, os, sys
import glomo_pyg
where = os.path.realpath(glomo_pyg.__file__)
assert not where.startswith(os.getcwd()), f"glomo_pyg imported from the folder: {where}"
for i, (title, code, check) in enumerate(json.load(sys.stdin)):
    env = {"__name__": "__main__"}
    exec(compile(code, f"README.md, {title}, python block {i + 1}", "exec"), env)
    exec(compile(check, f"the check of python block {i + 1}", "exec"), env)
    print(f"block {i + 1} ({title}) ran", flush=True)
"""


def blocks():
    return section_blocks(readme())


def test_each_check_names_a_section_with_a_block():
    titles = [title for title, _ in blocks()]
    assert len(titles) >= 6 and set(CHECKS) <= set(titles)


def test_no_block_needs_a_folder_of_the_checkout():
    # a user has the installed package and the releases it ships, not runs/ or examples/
    local = re.compile(r"""["'](?:\.{0,2}/|runs/|examples/|pretrained/|benchmarks/)""")
    assert not [title for title, code in blocks() if local.search(code)]
    assert local.search('from_pretrained("runs/quickstart/predictor")')  # (0.7.0's)


@pytest.mark.slow
def test_every_block_runs_as_printed_outside_the_tree(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "GLOMO_PRETRAINED_DIR")}
    payload = json.dumps([(title, code, CHECKS.get(title, "")) for title, code in blocks()])
    proc = subprocess.run([sys.executable, "-c", RUNNER], input=payload, cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert proc.stdout.count(" ran\n") == len(blocks())
