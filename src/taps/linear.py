"""The kernel behind the models' linear layers on the CPU: oneDNN, else PyTorch's default.

Why it matters: verifying a draft tree is a forward over a few rows (the tree's nodes), and
speculative decoding pays off only if those rows cost little more than one. PyTorch's float32
`F.linear` on the CPU calls MKL's sgemm, which on the 2-core AVX2 machine taps is developed on
costs 2.6-2.9x one row for 4-16 rows; oneDNN's inner product costs 1.5-2.0x and is faster for
one row too. Qwen2.5-Coder-1.5B, one forward after a 200-token context, fp32 (ms):

    rows                   1     4     8    16    32
    torch (MKL)          591  1576  1541  1691  2576
    onednn               501   738   868  1000  1292

oneDNN is faster still on several rows when the weight is first reordered into its blocked
layout ("packed"), and slower on one row (the 1536x8960 down projection: 2.3 ms plain, 4.5
packed). So `onednn-packed` (opt-in) runs one-row calls (plain decoding) on the plain weight and
calls of 2..64 rows (tree verification, the drafter's block) on a packed copy, made on the
first such call: it costs a second copy of the weights in memory. (Long prefills gain nothing
from packing and use the plain weight.) Same model,
after a 200-token context, interleaved medians of three (ms):

    rows                   1     8    16    32
    onednn               406   871   985  1328
    packed (every call)  499   672   811  1249

bfloat16: on CPUs with native bfloat16 dot products (avx512_bf16, AMX; `bf16_native`) oneDNN
serves bfloat16 too, and there the packed layout wins from one row on. Same model, bfloat16, on
a 2-core AMD EPYC with avx512_bf16 (float32 plain decoding: ~290 ms a token), medians of four (ms):

    rows                   1     8    16    32    64
    torch                226   254   327   484   722
    onednn               232   249   321   424   760
    onednn-packed        145   152   209   354   633

(Since session 56, a packed weight of 2M or more runs calls of one to three bfloat16 rows as four: on a Zen 4 EPYC
one or two rows took longer than four there; `PackedOneDNNLinear` has the numbers.)
Without native kernels oneDNN would emulate bfloat16, so there bfloat16 runs PyTorch's own kernel.
The switch is made once per loaded model (`use_linear`) and applies to inference only: with
autograd recording, or for tensors in other dtypes or not on the CPU, a layer runs PyTorch's own
`F.linear`, so training and other dtypes are unchanged. Choose with the environment variable
TAPS_LINEAR=onednn-packed|onednn|torch. The default follows the model's dtype: onednn-packed for
bfloat16 (where oneDNN serves it, packing is faster at every row count: the table above; again
with torch 2.13 on the same kind of CPU, one forward after 256 tokens: 1 row 181 -> 134 ms, 8
rows 205 -> 143; end to end results/linear-default), onednn for float32 (packing loses on
one row there, so it would buy faster trees with a second copy of every weight). A packed copy is
made only while it leaves MIN_FREE_BYTES of memory available (`_room_for`); without room a layer
stays on its plain weight, said once. Writes through `.data` (PEFT's merge_and_unload) do not bump
a weight's version and would leave a copy stale: the copy is made on a layer's first inference
call, so weights must be final by then (taps merges adapters at load, before any call).
"""

from __future__ import annotations

import functools
import logging
import os

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger("taps")
PACK_HINT = 16  # the row count oneDNN tunes the packed layout for; 4-64 measured alike here
# Packing pays for 2..PACK_MAX_ROWS rows; at 200 rows plain and packed cost the same, so a long
# prefill does not make (and keep) a packed copy, e.g. of an assistant that otherwise runs one row.
PACK_MAX_ROWS = 64
# bfloat16 calls of fewer than PAD_ROWS rows on a packed weight of at least PAD_MIN_WEIGHTS run as PAD_ROWS rows, the
# rest zeros (PackedOneDNNLinear says what was measured)
PAD_ROWS = 4
PAD_MIN_WEIGHTS = 2_000_000
ENV = "TAPS_LINEAR"
MIN_FREE_BYTES = 2 << 30  # memory a packed copy must leave available (taps.linear docstring)


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def current_linear(dtype: torch.dtype = torch.float32) -> str:
    """The backend chosen by TAPS_LINEAR, else the default for a model in `dtype` where oneDNN is
    available (onednn-packed for bfloat16, onednn otherwise; the module docstring says why), else torch."""
    choice = os.environ.get(ENV, "").strip().lower()
    if not choice:
        return ("onednn-packed" if dtype == torch.bfloat16 else "onednn") if onednn_available() else "torch"
    if choice not in BACKENDS:
        raise ValueError(f"{ENV}={choice!r} is not a linear backend; choose one of {', '.join(BACKENDS)}")
    if choice != "torch" and not onednn_available():
        raise ValueError(f"{ENV}={choice}, but this PyTorch build has no oneDNN (mkldnn) linear; use {ENV}=torch")
    return choice


@functools.cache
def bf16_native() -> bool:
    """Whether oneDNN has native bfloat16 kernels here (avx512_bf16 / AMX); without them it emulates."""
    return onednn_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def default_dtype(device: str | None = None) -> str:
    """The dtype a model named by the user loads in when none is given: "bfloat16" on an accelerator
    and on CPUs with native bfloat16 kernels, "float32" on other CPUs.

    Without native kernels bfloat16 is faster for one row only; the several rows of a tree, a draft
    block or a prefill run emulated and cost far more than in float32, so speculation cannot pay.
    Qwen2.5-Coder-1.5B, one forward of N rows from an empty cache, 2-core AMD EPYC with AVX2 only,
    medians of two after a warm-up (ms):

        rows          1      8     32     256
        float32     303    695   1233    6976
        bfloat16    216   1330   4956   40513
    """
    if device is not None and torch.device(device).type != "cpu":
        return "bfloat16"
    return "bfloat16" if bf16_native() else "float32"


def _served_dtypes() -> tuple[torch.dtype, ...]:
    return (torch.float32, torch.bfloat16) if bf16_native() else (torch.float32,)


def _inference(layer: nn.Linear, x: torch.Tensor) -> bool:
    """Whether oneDNN serves this call: CPU inference (autograd needs F.linear's backward) in float32,
    or in bfloat16 where the CPU has native bfloat16 kernels."""
    return (
        not torch.is_grad_enabled()
        and x.device.type == "cpu"
        and x.dtype == layer.weight.dtype
        and x.dtype in _served_dtypes()
    )


def linear_in_use(dtype: str, backend: str | None = None) -> str:
    """The kernel a model loaded in `dtype` (e.g. "bfloat16") with `backend` (None: `current_linear` of it)
    really runs: oneDNN serves float32, and bfloat16 only on CPUs with native bfloat16 kernels."""
    served = getattr(torch, dtype, None)
    return (backend or current_linear(served)) if served in _served_dtypes() else "torch"


class OneDNNLinear(nn.Linear):
    """An `nn.Linear` whose CPU inference (float32; bfloat16 where native) runs oneDNN's inner product.

    Same parameters as the layer it replaces (tied weights stay tied); only `forward` differs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _inference(self, x):
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [None], "")


def _room_for(nbytes: int) -> bool:
    """Whether a copy of `nbytes` leaves MIN_FREE_BYTES of memory available (Linux's MemAvailable;
    elsewhere, where it is not read, yes)."""
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return True
    return available - nbytes >= MIN_FREE_BYTES


@functools.cache
def _say_no_room() -> None:
    log.warning("taps.linear: too little free memory to keep packed copies of more weights; the other layers "
                "run on their plain weights, slower (TAPS_LINEAR=onednn skips packing and this message)")


class PackedOneDNNLinear(OneDNNLinear):
    """A `OneDNNLinear` that runs calls of 2..PACK_MAX_ROWS rows (1..PACK_MAX_ROWS in bfloat16) on a
    packed copy of its weight.

    The copy is made on the first such call, if memory allows (`_room_for`), and made again
    whenever the weight's version changed since (an optimizer step or `load_state_dict` bumps
    it). Writes through `.data` do not bump it and leave the copy stale: for weights that stay
    fixed once inference starts.

    A bfloat16 call of fewer than PAD_ROWS rows on a weight of PAD_MIN_WEIGHTS or more runs as PAD_ROWS rows, zeros
    after its own, and keeps its rows of the result: oneDNN's packed kernel took longer for one or two rows than for
    four there. Measured on a 2-core AMD EPYC Zen 4 (avx512_bf16, session 56: results/quantized-targets/zen4,
    bf16-rows.py and the README's per-shape timings), one packed product, ms a call for 1 row / padded to 4 / 4 rows:
    151936 x 1536 (the 1.5B's head) 17.15 / 15.61 / 15.30, 1536 x 8960 1.146 / 1.034 / 0.964, 8960 x 1536 1.239 /
    1.204 / 1.116, 1536 x 1536 0.277 / 0.270 / 0.253; smaller weights lose to the padding's copy (256 x 1536 0.079 /
    0.089, SmolLM2's 576 x 576 0.101 / 0.124), SmolLM2's head (49152 x 576) is level (2.96 / 3.04). A row's result
    does not depend on the rows beside it (oneDNN's rows are independent products), so padding changes which
    kernel runs, not what a row of a batch of four computes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        # float32: one row runs faster on the plain weight; bfloat16: packed wins from one row on
        fewest = 1 if x.dtype == torch.bfloat16 else 2
        if not _inference(self, x) or not fewest <= rows <= PACK_MAX_ROWS:  # a long prefill: plain is as fast
            return super().forward(x)
        key = (self.weight.data_ptr(), self.weight._version)
        if getattr(self, "_packed_key", None) != key:
            self._packed = None  # no copy (no room) until packed
            if _room_for(self.weight.numel() * self.weight.element_size()):
                self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACK_HINT)
            else:
                _say_no_room()
            self._packed_key = key
        if self._packed is None:
            return super().forward(x)
        if x.dtype == torch.bfloat16 and rows < PAD_ROWS and self.weight.numel() >= PAD_MIN_WEIGHTS:
            flat = x.reshape(rows, x.shape[-1])  # [rows, in]
            padded = torch.cat([flat, flat.new_zeros(PAD_ROWS - rows, flat.shape[1])])  # [PAD_ROWS, in]
            out = torch.ops.mkldnn._linear_pointwise(padded, self._packed, self.bias, "none", [None], "")[:rows]
            return out.reshape(*x.shape[:-1], out.shape[-1])
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [None], "")

    def __getstate__(self) -> dict:
        # The packed copy is an opaque oneDNN tensor that cannot be copied or pickled; it is a
        # cache, so copies (deepcopy, pickle) leave it out and pack again on first use.
        return {k: v for k, v in super().__getstate__().items() if k not in ("_packed", "_packed_key")}


CLASSES = {"onednn-packed": PackedOneDNNLinear, "onednn": OneDNNLinear, "torch": nn.Linear}
BACKENDS = tuple(CLASSES)


def use_linear(model: nn.Module, backend: str | None = None) -> nn.Module:
    """Switch every plain `nn.Linear` of `model` to `backend` (default: `current_linear` of the model's
    dtype), in place."""
    if backend is None:
        first = next(model.parameters(), None)
        backend = current_linear(torch.float32 if first is None else first.dtype)
    if backend not in BACKENDS:
        raise ValueError(f"unknown linear backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    new_class = CLASSES[backend]
    for module in model.modules():
        if type(module) in CLASSES.values():
            module.__class__ = new_class  # same state, other forward: no copy of the weights
            module.__dict__.pop("_packed", None)
            module.__dict__.pop("_packed_key", None)
    return model


def linear_backend(model: nn.Module) -> str:
    """The backend of `model`'s oneDNN-served linear layers (the first found), else torch."""
    for module in model.modules():
        if isinstance(module, OneDNNLinear) and module.weight.dtype in _served_dtypes():
            return "onednn-packed" if type(module) is PackedOneDNNLinear else "onednn"
    return "torch"
