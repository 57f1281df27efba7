"""A drafter (or assistant) in int8: its linear layers dynamically quantized, per output channel.

Why: on a CPU a draft is a forward of a whole model over a few rows, bound by reading its
weights; int8 weights are a quarter of float32's. On the 2-core AVX2 machine taps is developed
on, the grown 0.5B drafter's call fell from 297 to 120 ms (128-token context; 456 to 212 ms at
2,048) at about the same tau. Lossless for the output: the drafter only proposes, the float32
target verifies every token (docs/method.md section 4), so a less exact drafter can cost acceptance,
never correctness. The target itself is never quantized.

PyTorch's dynamic quantization (`torch.ao.quantization.quantize_dynamic`, fbgemm/x86 int8
kernels) quantizes each activation on the fly and each weight once, per output channel. Upstream
marks `torch.ao.quantization` deprecated; it is present and fast in the pinned torch 2.13.0, and
taps silences the notice here rather than in every user's log. (torch's weight-only
`_weight_int8pack_mm` ran 14x slower than float32 on this AVX2 CPU: not an alternative.)

"int4" is weight-only instead (taps.weightonly, the target's `--target-quant int4` kernel): a
quarter of bfloat16's bytes, in the drafter's own dtype; beside an int4 target it keeps the
draft from costing more than the verification (results/quantized-targets).

"w8a8" is the target's `--target-quant w8a8` kernel (taps.weightonly): int8 weights prepacked for
oneDNN, each activation row rounded to int8, the products VNNI/AMX's, and the layers that read one
input (q, k, v; gate, up) one product. The drafter runs it in float32 activations, as int8 does:
its adapters' rank-16 products in bfloat16 cost three times float32's. Only where the int8 kernel
sums exactly (AVX-512 VNNI or AMX), as for a target.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from taps.weightonly import (
    PRODUCTS,
    WeightOnlyLinear,
    _int8_kernel_is_exact,
    has_amx,
    quantize_weights,
    target_quant_of,
    w4a8_kernel,
)

# --drafter-quant: auto (`auto_scheme`); as loaded; dynamic int8 linears; weight-only int4; and the
# target's kernels whose activations are rounded too (w8a8: int8 x int8, w4a8: int4 x int8)
SCHEMES = ("auto", "none", "int8", "int4", *PRODUCTS)


def auto_scheme(kind_default: str, device: torch.device | str) -> str:
    """What --drafter-quant auto runs for a drafter whose kind asks for `kind_default` on the CPU
    ("int8" for drafters with a network of their own: grown, sibling): that on the CPU where this
    PyTorch has the x86/fbgemm engine, else "none". Measured (the 1.5B's shipped grown drafter beside
    the bfloat16 target, one draft after 256 tokens, 2-core AMD EPYC with avx512_bf16): 104 ms
    unquantized (bfloat16, packed oneDNN layers) against 44 ms int8; after 1,024 tokens 128 against
    58. DFlash-layout drafters share the target's dtype and embeddings: "none".

    Where the CPU has AMX and taps' w4a8 kernel does not run (below), "int8" becomes "w8a8": beside the
    1.5B's w8a8 target (2-core Intel Xeon with AMX, taps:32, 10 HumanEval + 10 MT-Bench prompts
    interleaved, 128 tokens) a round's draft took 67 against 74 ms (HumanEval) and 64 against 68
    (MT-Bench), tokens/s 1.08x [1.01-1.15] and 1.04x [0.99-1.05] of int8's; beside the bfloat16 target
    1.06x [1.03-1.10] and 1.02x [1.00-1.04] (results/quantized-targets/xeon-amx/drafter-quant-*.jsonl).
    Elsewhere unmeasured: int8 stays.

    Where taps' own w4a8 kernel runs (taps.vnni: AVX-512 VNNI), "int8" becomes "w4a8" beside any
    target, AMX or not: on a 2-core Zen 5 EPYC (10 HumanEval + 10 MT-Bench, one run each,
    results/quantized-targets/zen5/drafter-quant), beside the w4a8 target a draft 27 against 36 ms at
    level acceptance, taps:32 1.10x [1.07-1.17] / 1.14x [1.07-1.24] int8's tokens/s; beside the bfloat16
    target (head in int4 too, session 48) 23.1 / 20.5 against 34.6 / 32.2 ms, taps:32 1.12x [1.09-1.16] /
    1.11x [1.07-1.13]. On the Xeon with AMX (session 49, results/quantized-targets/xeon-amx) against
    w8a8: beside the w4a8 target (5 + 5 prompts, kernel-ab/) taps:32 1.11x [1.07-1.14] / 1.12x
    [1.07-1.16]; beside the bfloat16 target (10 + 10, drafter-quant/) a draft 46 / 38 against 62 / 59 ms a
    round at level tau, taps:32 1.03x [0.98-1.07] / 1.07x [1.02-1.09], though its session (made second in
    the process) also ran the same target's plain decoding 0.94x / 0.95x."""
    if torch.device(device).type != "cpu" or not _int8_engine():
        return "none"
    if kind_default == "int8" and w4a8_kernel() == "vnni":
        return "w4a8"
    if kind_default == "int8" and has_amx():
        return "w8a8" if _int8_kernel_is_exact() else "int8"
    return kind_default


def _int8_engine() -> str | None:
    """PyTorch's quantized engine the int8 kernels run on here (x86, else fbgemm), or None."""
    engines = torch.backends.quantized.supported_engines
    return next((e for e in ("x86", "fbgemm") if e in engines), None)


def check_scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown drafter quantization {scheme!r}; choose one of {', '.join(SCHEMES)}")
    return scheme


def load_dtype(scheme: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype to load a drafter or assistant in, before `quantize_linears(model, scheme)`, beside a
    target in `dtype`: int8 kernels read float32 weights, so an int8 drafter loads in float32 whatever
    the target's dtype (it only proposes tokens; the target verifies every one in its own)."""
    return torch.float32 if check_scheme(scheme) in ("int8", *PRODUCTS) else dtype


def quantize_linears(model: nn.Module, scheme: str) -> nn.Module:
    """`model` with every linear layer in `scheme` (in place; "none" returns it untouched; "auto" is
    resolved before, by `auto_scheme`).

    Refused, clearly, where it cannot work: int8 kernels need a float32 model on the CPU and a
    PyTorch build with the x86/fbgemm engine."""
    if check_scheme(scheme) == "none":
        return model
    if scheme in ("int4", *PRODUCTS):
        # a drafter only proposes: its rows need not be exact, nor its head finer than its layers
        return quantize_weights(model, scheme, rowwise=False, option="--drafter-quant", fine_head=False)
    from taps.linear import use_linear

    params = list(model.parameters())
    if any(p.dtype != torch.float32 or p.device.type != "cpu" for p in params):
        raise ValueError(f"{scheme} drafter quantization needs a float32 model on the CPU; "
                         f"this one has {sorted({f'{p.dtype} on {p.device.type}' for p in params})} (a DFlash-layout drafter shares the target's dtype: use --dtype float32)")  # fmt: skip
    engine = _int8_engine()
    if engine is None:
        raise ValueError(f"{scheme} drafter quantization needs PyTorch's x86 or fbgemm engine; this build has "
                         f"{torch.backends.quantized.supported_engines}")
    torch.backends.quantized.engine = engine
    use_linear(model, "torch")  # plain nn.Linear classes: quantize_dynamic matches types exactly
    with warnings.catch_warnings():  # upstream's deprecation notices (see the module docstring): import, each layer
        warnings.filterwarnings("ignore", message=".*torch.ao.quantization is deprecated.*")
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        return quantize_dynamic(model, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)


def quantized_layers(model: nn.Module | None) -> int:
    """How many of `model`'s layers run int8 dynamic or weight-only quantization (0 for None: a test drafter)."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    return 0 if model is None else sum(isinstance(m, (DynamicLinear, WeightOnlyLinear)) for m in model.modules())


def scheme_of(model: nn.Module | None) -> str:
    """The --drafter-quant scheme `model` runs: "int8", "int4" or "none" (also for None: a test drafter)."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    if model is None:
        return "none"
    return "int8" if any(isinstance(m, DynamicLinear) for m in model.modules()) else target_quant_of(model)
