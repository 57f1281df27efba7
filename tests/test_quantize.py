"""int8 drafters (taps.quantize): the layers really run int8, outputs stay close, decoding with a
quantized drafter stays exact, and what cannot be quantized is refused clearly."""

import pytest
import torch

from taps.decode import DecodeConfig, generate
from taps.drafters import load_drafter
from taps.drafters.grown import GrownConfig, GrownDrafter
from taps.quantize import auto_scheme, load_dtype, quantize_linears, quantized_layers, scheme_of
from taps.target import Target
from taps.weightonly import _int8_kernel_is_exact
from tiny import hf_greedy, tiny_model

PROMPT = [5, 17, 33, 2, 9, 41]
needs_w8a8 = pytest.mark.skipif(not _int8_kernel_is_exact(), reason="this CPU's int8 kernel saturates: w8a8 is refused")


def test_int8_replaces_every_linear_and_stays_close():
    model = tiny_model("qwen2", seed=1)
    x = torch.tensor([PROMPT])
    with torch.inference_mode():
        before = model(x).logits  # [1, T, vocab]
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert quantize_linears(model, "int8") is model and quantized_layers(model) == n_linear
    with torch.inference_mode():
        after = model(x).logits
    assert not torch.equal(before, after)  # really int8
    assert (after - before).abs().max() < 0.05 * before.abs().max()


def test_none_leaves_the_model_alone_and_bad_requests_are_refused():
    model = tiny_model("llama")
    assert quantize_linears(model, "none") is model and quantized_layers(model) == 0
    with pytest.raises(ValueError, match="unknown drafter quantization 'int3'"):
        quantize_linears(model, "int3")
    assert scheme_of(model) == "none" and scheme_of(None) == "none"
    with pytest.raises(ValueError, match="needs a float32 model"):
        quantize_linears(tiny_model("llama").to(torch.bfloat16), "int8")
    with pytest.raises(ValueError, match="no weights to quantize"):
        load_drafter("oracle", Target(model), quantize="int8")  # it runs the target itself


def test_w8a8_is_refused_in_the_drafters_words_where_the_int8_kernel_saturates(monkeypatch):
    monkeypatch.setattr("taps.weightonly._int8_kernel_is_exact", lambda: False)  # as on a CPU without VNNI
    with pytest.raises(ValueError, match=r"--drafter-quant w8a8 needs .* use --drafter-quant int8$"):
        quantize_linears(tiny_model("llama"), "w8a8")


@pytest.mark.parametrize("scheme", ["int8", "int4", pytest.param("w8a8", marks=needs_w8a8)])
@pytest.mark.parametrize("method", ["chain", "ddtree", "taps"])
@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
def test_decoding_with_a_quantized_drafter_equals_greedy(method, scheme):
    """A grown drafter over the target's own weights (a drafter that would accept nearly
    everything) in int8 (dynamic), int4 (weight-only) or w8a8: still token for token plain greedy."""
    model = tiny_model("qwen2", seed=0)
    target = Target(model)
    base = tiny_model("qwen2", seed=0)
    drafter = GrownDrafter(base, GrownConfig(base="tiny", mask_token_id=95, block_size=6), target)
    drafter.model = quantize_linears(drafter.model, scheme)  # as load_drafter does for a trained drafter
    assert scheme_of(drafter.model) == scheme
    ref = hf_greedy(model, PROMPT, 40)
    res = generate(target, PROMPT, DecodeConfig(method, budget=8, max_new_tokens=40, stop_ids=()), drafter)
    assert res.token_ids == ref
    assert res.stats.tau > 1.2  # the draft was used


def test_an_int8_grown_drafter_loads_in_float32_beside_a_bfloat16_target():
    """int8 kernels read float32 weights; a grown drafter reads only token ids, so it may run in
    float32 int8 while the target verifies in bfloat16 (the fast pair on CPUs with bf16 kernels)."""
    assert load_dtype("none", torch.bfloat16) == torch.bfloat16
    assert load_dtype("int8", torch.bfloat16) == torch.float32
    assert load_dtype("int4", torch.bfloat16) == torch.bfloat16  # weight-only: the drafter's own dtype
    assert load_dtype("w8a8", torch.bfloat16) == torch.float32  # float32 activations: its adapters' products
    target = Target(tiny_model("qwen2", seed=0).to(torch.bfloat16))
    base = tiny_model("qwen2", seed=0)
    cfg = GrownConfig(base="tiny", mask_token_id=95, block_size=6)
    drafter = GrownDrafter(base, cfg, target, dtype=load_dtype("int8", target.dtype))
    drafter.model = quantize_linears(drafter.model, "int8")
    ar = generate(target, PROMPT, DecodeConfig("ar", max_new_tokens=30, stop_ids=()))
    res = generate(target, PROMPT, DecodeConfig("chain", budget=5, max_new_tokens=30, stop_ids=()), drafter)
    assert res.token_ids[:5] == ar.token_ids[:5]  # bfloat16: exact only in float32, so the first tokens
    assert res.stats.tau > 1.2  # the float32 drafter's proposals were accepted by the bfloat16 target


def test_auto_picks_int8_where_it_pays_and_names_what_ran():
    """--drafter-quant auto (the default): each kind's own choice on the CPU, none on an accelerator;
    test drafters have nothing to quantize; a benchmark's settings say the precision that ran."""
    from taps.bench import BenchConfig
    from taps.drafters import KINDS, resolve_quant, shipped_drafter

    for name, kind in KINDS.items():
        folder = shipped_drafter("smollm2-135m", name)
        assert resolve_quant("auto", folder, "cpu") == auto_scheme(kind.auto_quant, "cpu")
        assert resolve_quant("auto", folder, "cuda") == "none" and resolve_quant("none", folder, "cpu") == "none"
    assert KINDS["grown"].auto_quant == "int8" and KINDS["dflash"].auto_quant == "none"
    assert resolve_quant("auto", "oracle", "cpu") == "none" and resolve_quant("auto", None, "cpu") == "none"
    assert resolve_quant("auto", "qwen2.5-coder-0.5b", "cpu") == auto_scheme("int8", "cpu")  # a sibling
    assert BenchConfig(target="qwen2.5-coder-1.5b").drafter_quant == auto_scheme("int8", "cpu")
    assert load_drafter("oracle", Target(tiny_model("llama")), quantize="auto").block_len > 1


@pytest.mark.parametrize("amx", [False, True])
def test_auto_runs_a_drafter_on_taps_w4a8_kernel_where_it_runs(monkeypatch, amx):
    """Where taps.vnni runs, auto's int8 becomes w4a8, AMX or not (measured: auto_scheme's docstring);
    where w4a8 runs on torchao's kernel or not at all, w8a8 (AMX) or int8 stays; never off the CPU."""
    from taps.bench import BenchConfig
    from taps.drafters import resolve_quant, shipped_drafter

    folder = shipped_drafter("qwen2.5-coder-1.5b")
    monkeypatch.setattr("taps.quantize.has_amx", lambda: amx)
    before = "w8a8" if amx and _int8_kernel_is_exact() else "int8"  # auto's choice without taps.vnni
    for kernel, expected in [("vnni", "w4a8"), ("torchao", before), (None, before)]:
        monkeypatch.setattr("taps.quantize.w4a8_kernel", lambda kernel=kernel: kernel)
        assert resolve_quant("auto", folder, "cpu") == expected, kernel
        assert resolve_quant("auto", folder, "cuda") == "none"
    monkeypatch.setattr("taps.quantize.w4a8_kernel", lambda: "vnni")
    monkeypatch.setattr("taps.bench.check_target_quant", lambda scheme, device=None: scheme)
    assert BenchConfig(target="qwen2.5-coder-1.5b", target_quant="w4a8").drafter_quant == "w4a8"
