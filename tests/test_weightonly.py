"""A quantized target (taps.weightonly): the kernels' rows are independent, every method equals
the quantized model's own greedy decoding, sampling follows its own law, and what cannot run is
refused with a clear message."""

import copy
import os

import pytest
import torch

from stats import chi_square_pvalue
from taps.decode import DecodeConfig, generate
from taps.drafters import TEST_DRAFTERS, load_drafter
from taps.methods import every_method
from taps.target import Target
from taps.verify import SamplingConfig
from taps.weightonly import (
    W4A8Product,
    W8A8Product,
    WeightOnlyLinear,
    _int8_kernel_is_exact,
    _round_rows,
    check_target_quant,
    quantize_weights,
    target_quant_of,
    w4a8_kernel,
    w8a8_kernel,
)
from tiny import tiny_model

PROMPT = [5, 17, 33, 2, 9, 41]
# w8a8 runs only where the int8 kernel sums exactly (VNNI or AMX); elsewhere taps refuses it (tested below)
needs_w8a8 = pytest.mark.skipif(not _int8_kernel_is_exact(), reason="this CPU's int8 kernel saturates: w8a8 is refused")
# w4a8 needs AVX-512 VNNI (taps.vnni, built at first use) or AMX with torchao's CPU kernels; elsewhere refused (below)
W4A8 = w4a8_kernel() is not None
needs_w4a8 = pytest.mark.skipif(not W4A8, reason="w4a8 needs AVX-512 VNNI and a C++ compiler, or AMX and torchao")
SCHEMES = ["int8", "int4", pytest.param("w8a8", marks=needs_w8a8), pytest.param("w4a8", marks=needs_w4a8)]
RUNNABLE = ["int8", "int4"] + ["w8a8"] * _int8_kernel_is_exact() + ["w4a8"] * W4A8
ROUNDED = [pytest.param("w8a8", marks=needs_w8a8), pytest.param("w4a8", marks=needs_w4a8)]  # activations rounded too


def quantized(scheme, family="llama", **kw):
    return quantize_weights(copy.deepcopy(tiny_model(family, **kw)), scheme)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_row_is_the_same_alone_or_in_a_tree_and_close_to_the_float_layer(scheme, dtype):
    """What makes a quantized target verifiable: row i of a batched call equals the call on row i
    alone, bit for bit (a tree's rows are plain decoding's rows), for every row count up to 64."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(128, 96, bias=True).to(dtype)
    layer = WeightOnlyLinear(linear, scheme)
    x = torch.randn(64, 128, dtype=dtype)
    alone = torch.cat([layer(x[i : i + 1]) for i in range(64)])  # [64, 96]
    for rows in (2, 7, 16, 33, 64):
        assert torch.equal(layer(x[:rows]), alone[:rows]), rows
    # the kernels multiply by the dequantized weight that `.weight` shows; it is close to the float one
    torch.testing.assert_close(layer(x).float(), (x.float() @ layer.weight.float().T + linear.bias.float()),
                               rtol=0.02, atol=0.05)
    error = (layer.weight.float() - linear.weight.float()).abs().max() / linear.weight.float().abs().max()
    assert error < {"int8": 0.02, "int4": 0.1, "w8a8": 0.02, "w4a8": 0.1}[scheme]  # bfloat16 rounding adds ~0.4% to int8


def hf_greedy(model, n):
    out = model.generate(torch.tensor([PROMPT]), attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
                         do_sample=False, max_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return out[0, len(PROMPT):].tolist()


@pytest.fixture(scope="module", params=SCHEMES)
def model(request):
    return quantized(request.param)


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
@pytest.mark.parametrize("drafter", list(TEST_DRAFTERS))
@pytest.mark.parametrize("method", [m for m in every_method() if "rollout" not in m])
def test_every_method_equals_the_quantized_models_greedy_generate(model, drafter, method):
    ref = hf_greedy(model, 40)
    target = Target(model, feature_layers=(0, 2))
    d = load_drafter(drafter, target, block_len=6) if method != "ar" else None
    res = generate(target, PROMPT, DecodeConfig(method=method, budget=8, max_new_tokens=40, stop_ids=()), d)
    assert res.token_ids == ref


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
@pytest.mark.parametrize("attention", ["kernel", "loop"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_in_bfloat16_too_every_tree_method_equals_its_own_greedy_generate(scheme, attention, monkeypatch):
    """Row-exact linears and row-wise attention (taps.rowwise, its AVX-512 kernel where the CPU has one
    and its loop over rows): a quantized target's trees are plain decoding's bits even in bfloat16,
    where a float target's are not (docs/method.md section 10). (transformers' generate feeds the
    prompt's last token with the others, in one causal call of bfloat16 SDPA, so its bits may differ
    from the row-wise float32 call of plain decoding.)"""
    import taps.rowwise

    if attention == "kernel" and taps.rowwise.kernel() is None:
        pytest.skip("taps' row-wise attention kernel needs AVX2 or AVX-512 and a C++ compiler")
    if attention == "loop":
        monkeypatch.setattr(taps.rowwise, "kernel", lambda: None)
    assert bfloat16_trees_leave_greedy(scheme, rowwise=True) == []


def bfloat16_trees_leave_greedy(scheme, rowwise):
    """The tree methods whose output differs from plain greedy decoding (taps' `ar`, which feeds
    the prompt as they do: all but its last token at once) on the tiny Qwen2 in bfloat16."""
    model = quantize_weights(copy.deepcopy(tiny_model("qwen2")).to(torch.bfloat16), scheme, rowwise=rowwise)
    target = Target(model, feature_layers=(0, 2))
    ref = generate(target, PROMPT, DecodeConfig(method="ar", max_new_tokens=40, stop_ids=())).token_ids
    differ = []
    for method in ("chain", "ddtree", "taps"):
        d = load_drafter("noisy", target, block_len=6)
        res = generate(target, PROMPT, DecodeConfig(method=method, budget=16, max_new_tokens=40, stop_ids=()), d)
        differ += [method] if res.token_ids != ref else []
    return differ


@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
@needs_w8a8
def test_the_negative_control_w8a8_with_batched_attention_leaves_its_greedy():
    """Without taps.rowwise, w8a8's activation rounding turns SDPA's many-row last bits into other
    tokens (the tiny model's int8, int4 and w4a8 happen to survive it; SmolLM2's w8a8 does not either)."""
    assert bfloat16_trees_leave_greedy("w8a8", rowwise=False) != []


def test_the_negative_control_a_float_target_decodes_otherwise(model):
    """The identity above is not vacuous: the same model in float differs from each quantized self
    somewhere in 40 tokens (else the quantization would not have been tested at all); w8a8 rounds
    the activations of int8's weights, so its logits differ from int8's too, and w4a8's from int4's."""
    float_output = hf_greedy(tiny_model("llama"), 40)
    assert all(hf_greedy(quantized(scheme), 40) != float_output for scheme in RUNNABLE)
    for pair in [("int8", "w8a8"), ("int4", "w4a8")]:
        if pair[1] in RUNNABLE:
            with torch.inference_mode():
                logits = [quantized(scheme)(torch.tensor([PROMPT])).logits for scheme in pair]
            assert not torch.equal(*logits)


@pytest.mark.slow  # 1,000 generations
@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
@pytest.mark.parametrize("method", ["ddtree", "taps"])
@pytest.mark.parametrize("scheme", ["int8", *ROUNDED])
def test_sampling_follows_the_quantized_models_own_law(method, scheme):
    # int4 packs outputs in 16s, w4a8 in 32s: no 8-token head; 32 tokens' pairs, the rare ones pooled
    vocab, prompt = 32 if scheme == "w4a8" else 8, [1, 4, 2]
    model = quantized(scheme, vocab=vocab, seed=3)
    sampling = SamplingConfig(1.0)
    with torch.inference_mode():
        first = sampling.probs(model(torch.tensor([prompt])).logits[0, -1:])[0]
        law = {}
        for a in range(vocab):
            second = sampling.probs(model(torch.tensor([[*prompt, a]])).logits[0, -1:])[0]
            law.update({(a, b): float(first[a] * second[b]) for b in range(vocab)})
    target = Target(model)
    drafter = load_drafter("noisy", target, block_len=3)
    samples = [tuple(generate(target, prompt, DecodeConfig(method, budget=4, max_new_tokens=2, sampling=sampling,
                                                           stop_ids=(), seed=seed), drafter).token_ids)
               for seed in range(1000)]
    assert chi_square_pvalue(samples, law) > 1e-3


@pytest.mark.parametrize("scheme", ROUNDED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["llama", "qwen2"])  # Qwen2's q, k, v have biases
def test_shared_products_give_every_layer_its_own_bits(family, dtype, scheme, monkeypatch):
    """w8a8's and w4a8's shared products (q, k, v in one, gate and up in one: SharedInput) change no bit: the
    logits of a prompt and of every tree row, and each layer's output in any call order, equal
    the model quantized layer by layer."""
    model = tiny_model(family).to(dtype)
    with torch.no_grad():  # biases start at zero: make them count
        for m in model.modules():
            if isinstance(m, torch.nn.Linear) and m.bias is not None:
                m.bias.normal_(0, 0.5)
    shared = quantize_weights(copy.deepcopy(model), scheme)
    monkeypatch.setattr("taps.weightonly.SHARED_INPUTS", ())
    alone = quantize_weights(copy.deepcopy(model), scheme)
    members = [m for m in shared.modules() if isinstance(m, WeightOnlyLinear) and m.shared is not None]
    assert len(members) == 5 * 3 and not any(m.shared is not None for m in alone.modules()
                                             if isinstance(m, WeightOnlyLinear))
    ids = torch.tensor([PROMPT + [3, 8, 60, 1]])
    with torch.inference_mode():
        assert torch.equal(shared(ids).logits, alone(ids).logits)
    assert hf_greedy(shared, 24) == hf_greedy(alone, 24)
    trees = [generate(Target(m), PROMPT, DecodeConfig(method="taps", budget=16, max_new_tokens=24, stop_ids=()),
                      load_drafter("noisy", Target(m), block_len=6)).token_ids for m in (shared, alone)]
    assert trees[0] == trees[1] == hf_greedy(alone, 24)
    # each member returns the product of the tensor it is given, whatever the order of calls
    attn, attn_alone = shared.model.layers[1].self_attn, alone.model.layers[1].self_attn
    x, y = torch.randn(2, 5, 64, dtype=dtype), torch.randn(2, 5, 64, dtype=dtype)
    with torch.inference_mode():
        for name, arg in [("k_proj", x), ("q_proj", x), ("q_proj", x), ("v_proj", y), ("k_proj", x), ("v_proj", x)]:
            assert torch.equal(getattr(attn, name)(arg), getattr(attn_alone, name)(arg)), name
    assert torch.equal(attn.v_proj.weight, attn_alone.v_proj.weight)


def test_what_cannot_run_is_refused_before_any_layer_changes():
    model = tiny_model("llama", vocab=8)
    with pytest.raises(ValueError, match=r"int4 needs layers with inputs a multiple of 32 and outputs a multiple of "
                                         r"16; .*\(64, 8\).*use --target-quant int8"):
        quantize_weights(model, "int4")
    assert target_quant_of(model) == "none"  # untouched
    with pytest.raises(ValueError, match="runs on PyTorch's CPU kernels; drop it on cuda"):
        check_target_quant("int8", "cuda")
    with pytest.raises(ValueError, match="unknown target quantization 'int3'"):
        check_target_quant("int3")
    assert target_quant_of(quantize_weights(model, "int8")) == "int8"


def test_the_exactness_probe_passes_here_and_fails_a_kernel_that_saturates(monkeypatch):
    from taps import weightonly

    flags = open("/proc/cpuinfo").read().split() if os.path.exists("/proc/cpuinfo") else []
    if any(flag in flags for flag in ("avx512_vnni", "avx_vnni", "amx_int8")):
        assert weightonly._int8_kernel_is_exact()  # this CPU sums int8 products exactly
    exact = weightonly._qlinear

    def saturating(xq, packed, scales, zero_points):  # pre-VNNI x86: u8 x s8 pairs summed in int16, saturated
        out = exact(xq, packed, scales, zero_points)
        return out.clamp(-(2**15), 2**15 - 1)

    monkeypatch.setattr(weightonly, "_qlinear", saturating)
    weightonly._int8_kernel_is_exact.cache_clear()
    try:
        assert not weightonly._int8_kernel_is_exact()
    finally:
        weightonly._int8_kernel_is_exact.cache_clear()


def test_w8a8_is_refused_where_the_int8_kernel_is_not_exact(monkeypatch):
    monkeypatch.setattr("taps.weightonly._int8_kernel_is_exact", lambda: False)  # as on a CPU without VNNI
    with pytest.raises(ValueError, match="int8 kernel saturates .* use --target-quant int8"):
        quantize_weights(tiny_model("llama"), "w8a8")


@pytest.fixture
def fresh_w4a8_probe():
    """w4a8_kernel and vnni.load probed anew inside the test and after it (they are cached per process)."""
    from taps import vnni

    load = vnni.load  # the cached function itself: a test may replace the module's name
    w4a8_kernel.cache_clear(), load.cache_clear()
    yield
    w4a8_kernel.cache_clear(), load.cache_clear()


def test_w4a8_is_refused_where_no_kernel_runs(monkeypatch, fresh_w4a8_probe):
    model = tiny_model("llama")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: False)  # an AVX2 CPU (AMD Zen 3)
    with pytest.raises(ValueError, match=r"w4a8 needs a CPU with AVX-512 VNNI .* use --drafter-quant int4 or int8"):
        quantize_weights(model, "w4a8", option="--drafter-quant")
    w4a8_kernel.cache_clear()
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: True)
    monkeypatch.setattr("taps.vnni.load", lambda: "its build failed (no compiler)")  # VNNI, no g++
    with pytest.raises(ValueError, match=r"w4a8's AVX-512 VNNI kernel .*no compiler.*install a C\+\+ compiler"):
        quantize_weights(model, "w4a8")
    w4a8_kernel.cache_clear()
    monkeypatch.setenv("TAPS_W4A8_KERNEL", "torchao")  # asked for torchao's; PyPI's has no CPU kernels
    monkeypatch.setitem(__import__("sys").modules, "torchao", None)  # import fails: as if not installed
    with pytest.raises(ValueError, match=r"w4a8 needs torchao built with its CPU kernels.*make install-torchao"):
        quantize_weights(model, "w4a8")
    w4a8_kernel.cache_clear()
    monkeypatch.setenv("TAPS_W4A8_KERNEL", "fast")
    with pytest.raises(ValueError, match=r"TAPS_W4A8_KERNEL='fast': choose auto, torchao or vnni"):
        quantize_weights(model, "w4a8")
    assert target_quant_of(model) == "none"  # untouched


def test_auto_prefers_taps_kernel_and_falls_back_to_torchaos_on_amx(monkeypatch, fresh_w4a8_probe):
    """auto takes taps.vnni wherever it runs, AMX or not (measured: w4a8_kernel's docstring), and
    torchao's only where taps.vnni does not run and the CPU has AMX; $TAPS_W4A8_KERNEL=torchao asks
    for torchao's alone. Both kernels stubbed: this is the choice, not the kernels."""
    import sys
    import types

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    monkeypatch.setitem(sys.modules, "torchao", types.ModuleType("torchao"))  # imports: as if built with its kernels
    monkeypatch.setattr("taps.weightonly._rows_independent", lambda kernel: True)
    monkeypatch.setattr("taps.vnni.load", lambda: None)
    assert w4a8_kernel() == "vnni"
    w4a8_kernel.cache_clear()
    monkeypatch.setenv("TAPS_W4A8_KERNEL", "torchao")
    assert w4a8_kernel() == "torchao"
    w4a8_kernel.cache_clear()
    monkeypatch.delenv("TAPS_W4A8_KERNEL")
    monkeypatch.setattr("taps.vnni.load", lambda: "its build failed (no compiler)")
    assert w4a8_kernel() == "torchao"
    w4a8_kernel.cache_clear()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert w4a8_kernel() is None  # torchao's kernel is a scalar loop without AMX: not taken


@pytest.mark.parametrize("kernel", ["vnni", "torchao"])
def test_each_w4a8_kernel_that_runs_here_keeps_rows_independent(kernel, monkeypatch, fresh_w4a8_probe):
    """Whichever kernel auto picks, the other one stays exact where it runs ($TAPS_W4A8_KERNEL asks
    for it): row i of 1-64 rows equals row i alone, bit for bit, in float32 and bfloat16."""
    monkeypatch.setenv("TAPS_W4A8_KERNEL", kernel)
    if w4a8_kernel() != kernel:
        pytest.skip(f"w4a8's {kernel} kernel does not run here")
    torch.manual_seed(0)
    product = W4A8Product(torch.randn(96, 256), kernel)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(64, 256, dtype=dtype)
        alone = torch.cat([product(x[i : i + 1]) for i in range(64)])  # [64, 96]
        for rows in (2, 4, 5, 16, 33, 64):
            assert torch.equal(product(x[:rows]), alone[:rows]), (dtype, rows)


@needs_w4a8
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vnni_kernel_sums_the_worst_case_exactly_and_rounds_rows_as_w8a8(dtype):
    """taps.vnni on extreme codes (0 and 15, minimums -15..0, activations near +-127 after rounding):
    with unit scales every total is an integer below 2^24 times the row's scale, so the kernel must
    equal int64 arithmetic on `_round_rows`' codes; a wrong nibble order, a saturating product, a
    dropped minimum or a row rounded otherwise would not."""
    from taps import vnni

    if vnni.load() is not None:
        pytest.skip(vnni.load())
    g = torch.Generator().manual_seed(0)
    n, k, group = 64, 256, 32
    codes = (torch.randint(0, 2, (n, k), generator=g) * 15).to(torch.uint8)  # [N, K]
    low = -torch.randint(0, 16, (n, k // group), generator=g)  # [N, K/g]: w = low + code
    rows = torch.randn(33, k, generator=g).to(dtype)  # [33, K]
    rows[:, 0] = 9.0  # the peak of every row: its scale 9/127, so many codes near +-127
    x, x_scale = _round_rows(rows)  # the same codes the kernel makes
    ints = x.long() @ (codes.long() + low.repeat_interleave(group, 1)).T  # [33, N]
    want = (ints.float() * x_scale).to(dtype)
    got = vnni.linear(rows, vnni.pack(codes, torch.ones(n, k // group), low, group), group)
    assert got.dtype == dtype and torch.equal(got, want)
    without_low = ((x.long() @ codes.long().T).float() * x_scale).to(dtype)
    assert not torch.equal(got, without_low)  # negative control: the minimums count


@needs_w8a8
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_w8a8_kernels_give_the_same_bits(dtype):
    """taps.vnni's int8 product and oneDNN's sum the same int8 products exactly and scale them in the same
    order, so w8a8 is one model whichever multiplies (w8a8_kernel picks by speed): equal bits for 1-64 rows,
    extreme weights (+-127) and rows near +-127 after rounding among them; a row alone as batched."""
    from taps import vnni

    if vnni.load() is not None:
        pytest.skip(vnni.load())
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 256, generator=g)  # [N, K]
    weight[:32] = torch.randint(0, 2, (32, 256), generator=g) * 2.0 - 1  # every code +-127
    onednn, ours = W8A8Product(weight, "onednn"), W8A8Product(weight, "vnni")
    rows = torch.randn(64, 256, generator=g).to(dtype)
    rows[:, 0] = 9.0  # the peak of every row: its scale 9/127, so many codes near +-127
    alone = torch.cat([ours(rows[i : i + 1]) for i in range(64)])  # [64, 96]
    for n in (1, 2, 7, 8, 9, 33, 64):
        assert torch.equal(ours(rows[:n]), onednn(rows[:n])), n
        assert torch.equal(ours(rows[:n]), alone[:n]), n


@pytest.fixture
def fresh_w8a8_probe():
    """w8a8_kernel probed anew inside the test and after it (cached per process)."""
    w8a8_kernel.cache_clear()
    yield
    w8a8_kernel.cache_clear()


def test_w8a8_takes_taps_kernel_off_amx_where_it_runs_and_the_weight_fits(monkeypatch, fresh_w8a8_probe):
    """auto: taps.vnni's int8 product where the CPU has no AMX, the kernel runs and the weight fits its
    layout; oneDNN's on AMX, for odd shapes or where taps.vnni does not build; $TAPS_W8A8_KERNEL asks
    for one, and a wrong value is refused. The kernel stubbed: this is the choice, not the kernel."""
    from taps import vnni

    monkeypatch.setattr("taps.vnni.load", lambda: None)
    choices = []
    for env, amx in [("auto", False), ("auto", True), ("vnni", True), ("onednn", False)]:
        w8a8_kernel.cache_clear()
        monkeypatch.setenv("TAPS_W8A8_KERNEL", env)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda amx=amx: amx, raising=False)
        choices.append(w8a8_kernel())
    assert choices == ["vnni", "onednn", "vnni", "onednn"]
    assert vnni.fits8(64, 256) and not vnni.fits8(48, 256) and not vnni.fits8(64, 264)
    if _int8_kernel_is_exact():  # oneDNN's product here: an odd shape takes it, where auto says vnni
        w8a8_kernel.cache_clear()
        monkeypatch.setenv("TAPS_W8A8_KERNEL", "vnni")
        assert W8A8Product(torch.randn(48, 256)).kernel == "onednn"
    w8a8_kernel.cache_clear()
    monkeypatch.setenv("TAPS_W8A8_KERNEL", "auto")
    monkeypatch.setattr("taps.vnni.load", lambda: "its build failed (no compiler)")
    assert w8a8_kernel() == "onednn"
    w8a8_kernel.cache_clear()
    monkeypatch.setenv("TAPS_W8A8_KERNEL", "fast")
    with pytest.raises(ValueError, match=r"TAPS_W8A8_KERNEL='fast': choose auto, onednn or vnni"):
        w8a8_kernel()
    for scheme in ("w8a8", "w4a8"):  # before any model loads (w4a8's head is w8a8)
        with pytest.raises(ValueError, match=r"TAPS_W8A8_KERNEL='fast'"):
            check_target_quant(scheme)


@needs_w4a8
def test_w4a8_on_the_vnni_kernel_keeps_the_head_in_int8():
    """Under taps.vnni the LM head is w8a8 (a 4-bit file's head is finer than 4 bits), the rest w4a8."""
    model = quantized("w4a8", vocab=64)
    schemes = {name: m.scheme for name, m in model.named_modules() if isinstance(m, WeightOnlyLinear)}
    head = "w8a8" if w4a8_kernel() == "vnni" else "w4a8"
    assert schemes.pop("lm_head") == head and set(schemes.values()) == {"w4a8"} and target_quant_of(model) == "w4a8"


@needs_w4a8
def test_a_w4a8_drafter_runs_its_head_in_int4_too():
    """A drafter only proposes: --drafter-quant w4a8 quantizes its head with its layers (the draft's
    largest product), where a target's stays int8 (the test above)."""
    from taps.quantize import quantize_linears

    model = quantize_linears(copy.deepcopy(tiny_model("llama", vocab=64)), "w4a8")
    schemes = {m.scheme for m in model.modules() if isinstance(m, WeightOnlyLinear)}
    assert schemes == {"w4a8"} and model.get_output_embeddings().scheme == "w4a8"


@needs_w4a8
def test_w4a8_refuses_a_model_whose_layers_do_not_fit_its_kernel():
    with pytest.raises(ValueError, match=r"w4a8 needs layers with inputs a multiple of 32 and outputs a multiple of "
                                         r"32; .*\(64, 8\).*use --target-quant w8a8"):
        quantize_weights(tiny_model("llama", vocab=8), "w4a8")


@pytest.mark.slow  # SmolLM2 quantized twice, four methods each
@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
@pytest.mark.parametrize("scheme", SCHEMES)
def test_smollm2_quantized_every_method_equals_its_own_greedy(smollm2, scheme):
    import taps

    model, tokenizer = smollm2
    model = quantize_weights(copy.deepcopy(model), scheme)
    spec = taps.load(model, "noisy", tokenizer=tokenizer, method="chain")
    ids = spec.encode("Write a Python function that checks whether a number is prime.")
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=48)[0, len(ids):].tolist()
    for method in ("ar", "chain", "ddtree", "taps"):
        assert spec.generate(ids, method=method, max_new_tokens=48).token_ids == out, method


@pytest.mark.slow  # SmolLM2 in w8a8 with batched attention
@needs_w8a8
@pytest.mark.filterwarnings("ignore:.*LatencyProfile")
def test_without_rowwise_attention_w8a8_trees_leave_their_own_greedy(smollm2):
    """The negative control of the test above: with SDPA over the tree's rows at once, last-bit
    differences flip w8a8's activation rounding and, at some near-tie, a token (chain, here)."""
    import taps

    model, tokenizer = smollm2
    model = quantize_weights(copy.deepcopy(model), "w8a8", rowwise=False)
    spec = taps.load(model, "noisy", tokenizer=tokenizer, method="chain")
    ids = spec.encode("Write a Python function that checks whether a number is prime.")
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=48)[0, len(ids):].tolist()
    assert any(spec.generate(ids, method=m, max_new_tokens=48).token_ids != out for m in ("chain", "ddtree", "taps"))


def test_the_cli_refuses_a_quantized_target_on_an_accelerator(capsys):
    from taps.cli import main

    assert main(["generate", "--prompt", "hi", "--target-quant", "int4", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "int4 runs on PyTorch's CPU kernels" in err and "Traceback" not in err
