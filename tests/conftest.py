import os
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
if os.environ.get("PYTEST_XDIST_WORKER"):
    # one intra-op thread per worker (and per process a test starts): `-n auto` starts a
    # worker per core, and each taking a thread per core would oversubscribe them
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def pytest_collection_modifyitems(items):
    """Tests that use the profile slice's dry run (``dry``, a 40 s module fixture) are
    slow however quick their own body: ``pytest -m "not slow"`` must not build it."""
    for item in items:
        if "dry" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
