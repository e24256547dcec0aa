import os
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
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
