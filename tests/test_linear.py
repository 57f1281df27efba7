"""The linear-layer backend: same numbers as torch's, training untouched, clear errors."""

import copy

import pytest
import torch
import torch.nn.functional as F

from taps.linear import (
    OneDNNLinear,
    PackedOneDNNLinear,
    bf16_native,
    current_linear,
    default_dtype,
    linear_backend,
    linear_in_use,
    onednn_available,
    use_linear,
)
from tiny import tiny_model

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN linear")


@needs_onednn
@pytest.mark.parametrize("backend, layer_class", [("onednn-packed", PackedOneDNNLinear), ("onednn", OneDNNLinear)])
def test_onednn_layer_matches_torch_for_any_number_of_rows(backend, layer_class):
    layer = torch.nn.Linear(64, 96)
    use_linear(layer, backend)
    assert type(layer) is layer_class and linear_backend(layer) == backend
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        layer.to(dtype)
        for rows in (1, 3, 16, 100):
            x = torch.randn(1, rows, 64, dtype=dtype)
            with torch.no_grad():
                torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=tol, atol=tol)
    # bf16 runs oneDNN only where the CPU has native bf16 kernels (avx512_bf16, AMX), else F.linear
    assert linear_backend(layer) == (backend if bf16_native() else "torch")


@needs_onednn
def test_packed_copy_follows_the_weight_and_copies_without_it():
    layer = use_linear(torch.nn.Linear(64, 96), "onednn-packed")
    x = torch.randn(1, 5, 64)
    with torch.no_grad():
        before = layer(x)  # packs
    twin = copy.deepcopy(layer)  # an opaque packed tensor cannot be copied: the copy packs anew
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.5)
    layer(x).square().sum().backward()
    optimizer.step()  # changes the weight in place: the packed copy must not go stale
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(twin(x), before)
        assert not torch.allclose(layer(x), before)


@needs_onednn
def test_a_layer_stays_plain_when_a_packed_copy_would_leave_too_little_memory(monkeypatch, caplog):
    import taps.linear

    layer = use_linear(torch.nn.Linear(64, 96), "onednn-packed")
    monkeypatch.setattr(taps.linear, "MIN_FREE_BYTES", 1 << 60)  # no machine has that much to spare
    x = torch.randn(1, 5, 64)
    with torch.no_grad(), caplog.at_level("WARNING", logger="taps"):
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-4, atol=1e-4)
        layer(x)
    assert layer._packed is None and "TAPS_LINEAR=onednn" in caplog.text
    monkeypatch.setattr(taps.linear, "MIN_FREE_BYTES", 0)
    layer.weight.data = layer.weight.data.clone()  # a new weight: the layer packs when there is room
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-4, atol=1e-4)
    assert layer._packed is not None


@needs_onednn
def test_switch_keeps_parameters_and_training_uses_autograd():
    model = tiny_model("qwen2")
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as in SmolLM2 and the 0.5B
    use_linear(model, "onednn-packed")
    assert linear_backend(model) == "onednn-packed"
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the switch copies nothing
    ids = torch.randint(0, 96, (1, 12))
    with torch.no_grad():
        fast = model(ids).logits
    loss = model(ids).logits.logsumexp(-1).mean()  # grad enabled: torch's F.linear, which has a backward
    loss.backward()
    assert model.model.layers[0].mlp.up_proj.weight.grad is not None
    use_linear(model, "torch")
    assert linear_backend(model) == "torch" and type(model.lm_head) is torch.nn.Linear
    with torch.no_grad():
        torch.testing.assert_close(fast, model(ids).logits, rtol=1e-3, atol=1e-3)


def test_backend_choice_is_validated(monkeypatch):
    monkeypatch.setenv("TAPS_LINEAR", "torch")
    assert current_linear() == "torch" and linear_in_use("float32") == "torch"
    monkeypatch.delenv("TAPS_LINEAR")
    # the default by dtype: packed for bfloat16 (native kernels only), plain weights for float32
    assert linear_in_use("bfloat16") == ("onednn-packed" if bf16_native() else "torch")
    assert linear_in_use("float32") == current_linear() == ("onednn" if onednn_available() else "torch")
    assert linear_backend(use_linear(torch.nn.Linear(2, 2).to(torch.bfloat16))) == linear_in_use("bfloat16")
    monkeypatch.setenv("TAPS_LINEAR", "blas")
    with pytest.raises(ValueError, match="TAPS_LINEAR='blas' is not a linear backend"):
        current_linear()
    with pytest.raises(ValueError, match="unknown linear backend"):
        use_linear(torch.nn.Linear(2, 2), "blas")


def test_the_default_dtype_is_bfloat16_only_where_it_runs_natively(monkeypatch):
    import taps.linear
    from taps.bench import BenchConfig

    for native, dtype in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(taps.linear, "bf16_native", lambda native=native: native)
        assert default_dtype() == default_dtype("cpu") == dtype
        assert default_dtype("cuda") == "bfloat16"  # accelerators have bfloat16 kernels
        assert BenchConfig().dtype == dtype  # resolved on creation: records name the dtype that ran
        assert BenchConfig(dtype="bfloat16").dtype == "bfloat16"


@needs_onednn
@pytest.mark.skipif(not bf16_native(), reason="bfloat16 runs oneDNN only where the CPU has native bf16 kernels")
def test_a_few_bfloat16_rows_on_a_large_weight_run_as_padded_rows(monkeypatch):
    """Fewer than PAD_ROWS bfloat16 rows on a weight of PAD_MIN_WEIGHTS or more run as PAD_ROWS rows: each row's
    result is that row's in any batch (oneDNN's rows are independent), so it equals the same row beside other
    rows; a weight under the size runs its rows as they come."""
    import taps.linear

    monkeypatch.setattr(taps.linear, "PAD_MIN_WEIGHTS", 64 * 96)
    layer = use_linear(torch.nn.Linear(64, 96), "onednn-packed").to(torch.bfloat16)
    calls = []
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda x, *a: calls.append(x.shape[0]) or real(x, *a))
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        batch = layer(x)  # [4, 96]
        for rows in (1, 2, 3):
            got = layer(x[:rows])
            assert got.shape == (rows, 96) and torch.equal(got, batch[:rows])
        assert calls == [4, 4, 4, 4]
        assert layer(x[None, :2]).shape == (1, 2, 96)  # leading dimensions kept
        monkeypatch.setattr(taps.linear, "PAD_MIN_WEIGHTS", 64 * 96 + 1)
        calls.clear()
        layer(x[:1])
        assert calls == [1]
