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
