"""Real-model exactness: SmolLM2-135M in float32 equals transformers' greedy `generate`."""

import json
import subprocess
import sys

import pytest
import torch

from taps.decode import DecodeConfig, default_stop_ids, generate
from taps.drafters import load_drafter
from taps.target import Target

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Say hello in one short sentence.",
]


@pytest.fixture(scope="module")
def target(smollm2):
    model, tokenizer = smollm2
    return Target(model, tokenizer, feature_layers=(1, 15, 27))


@pytest.fixture(scope="module")
def references(target):
    """prompt ids -> greedy continuation, from transformers itself (stops at the model's EOS)."""
    out = {}
    for text in PROMPTS:
        ids = target.encode(text)
        seq = target.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=40)[0]
        out[text] = (ids, seq[len(ids):].tolist())
    return out


# ddtree with the noisy drafter (branching trees, partly accepted: KV commits gather non-contiguous
# nodes) is the fast set's real-model exactness check; the other pairs are slow
@pytest.mark.parametrize("method, drafter", [
    pytest.param(m, d, marks=() if (m, d) == ("ddtree", "noisy") else pytest.mark.slow)
    for m in ("chain", "ddtree", "taps") for d in ("oracle", "noisy", "random")
])
@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
def test_greedy_equals_transformers_generate(target, references, drafter, method):
    d = load_drafter(drafter, target, block_len=7)
    for text, (ids, ref) in references.items():
        res = generate(target, ids, DecodeConfig(method, budget=8, max_new_tokens=40), d)
        assert res.token_ids == ref, text
        assert res.stats.rounds > 1


def test_reference_covers_the_eos_boundary(target, references):
    # the short prompt must end on EOS inside the 40 tokens, so the stop boundary is exercised
    _, ref = references[PROMPTS[1]]
    assert ref[-1] in default_stop_ids(target) and len(ref) < 40


@pytest.mark.slow  # loads SmolLM2 again in a subprocess
def test_cli_generate_json_matches_library(references):
    text = PROMPTS[0]
    proc = subprocess.run(
        [sys.executable, "-m", "taps.cli", "generate", "--target", "smollm2-135m", "--drafter", "noisy",
         "--method", "ddtree", "--budget", "8", "--dtype", "float32", "--max-new-tokens", "12", "--json",
         "--prompt", text],
        capture_output=True, text=True, check=True,
    )
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["token_ids"] == references[text][1][:12]
    assert record["method"] == "ddtree"
    for key in ("rounds", "tau", "new_tokens", "seconds", "tokens_per_second", "accepted_per_round"):
        assert key in record["stats"]


def test_cli_reports_bad_input_clearly():
    proc = subprocess.run(
        [sys.executable, "-m", "taps.cli", "generate", "--target", "no-such-model-here/", "--method", "ar",
         "--prompt", "hi"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2
    assert "taps: error:" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_without_a_drafter_names_the_choices(monkeypatch, tmp_path):
    from taps import cli
    from taps.drafters import loading

    monkeypatch.setattr(loading, "SHIPPED", tmp_path)  # as if taps shipped no drafter for the target
    assert cli.main(["generate", "--method", "chain", "--prompt", "hi"]) == 2
