"""The kernel behind the models' float32 linear layers on the CPU: oneDNN, else PyTorch's default.

Why it matters: verifying a draft tree is a forward over a few rows (the tree's nodes), and
speculative decoding pays off only if those rows cost little more than one. PyTorch's float32
`F.linear` on the CPU calls MKL's sgemm, which on the 2-core AVX2 machine taps is developed on
costs 2.6-2.9x one row for 4-16 rows; oneDNN's inner product costs 1.5-2.0x and is faster for
one row too. Qwen2.5-Coder-1.5B, one forward after a 200-token context, fp32 (ms):

    rows            1     4     8    16    32
    torch (MKL)   591  1576  1541  1691  2576
    onednn        501   738   868  1000  1292

The switch is made once per loaded model (`use_linear`) and applies to inference only: with
autograd recording, or for tensors that are not float32 on the CPU, a layer runs PyTorch's own
`F.linear`, so training and other dtypes are unchanged. Choose with the environment variable
TAPS_LINEAR=onednn|torch; the default is onednn where this PyTorch build has it.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

BACKENDS = ("onednn", "torch")
ENV = "TAPS_LINEAR"


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def current_linear() -> str:
    """The backend chosen by TAPS_LINEAR, else onednn where available, else torch."""
    choice = os.environ.get(ENV, "").strip().lower()
    if not choice:
        return "onednn" if onednn_available() else "torch"
    if choice not in BACKENDS:
        raise ValueError(f"{ENV}={choice!r} is not a linear backend; choose one of {', '.join(BACKENDS)}")
    if choice == "onednn" and not onednn_available():
        raise ValueError(f"{ENV}=onednn, but this PyTorch build has no oneDNN (mkldnn) linear; use {ENV}=torch")
    return choice


def linear_in_use(dtype: str) -> str:
    """The kernel a model loaded in `dtype` (e.g. "bfloat16") really runs: oneDNN serves float32 only."""
    return current_linear() if dtype == "float32" else "torch"


class OneDNNLinear(nn.Linear):
    """An `nn.Linear` whose float32 CPU inference runs oneDNN's inner product.

    Same parameters as the layer it replaces (tied weights stay tied); only `forward` differs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.device.type != "cpu" or x.dtype != torch.float32 or self.weight.dtype != torch.float32:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [None], "")


def use_linear(model: nn.Module, backend: str | None = None) -> nn.Module:
    """Switch every plain `nn.Linear` of `model` to `backend` (default: `current_linear()`), in place."""
    backend = current_linear() if backend is None else backend
    if backend not in BACKENDS:
        raise ValueError(f"unknown linear backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    new_class = OneDNNLinear if backend == "onednn" else nn.Linear
    for module in model.modules():
        if type(module) in (nn.Linear, OneDNNLinear):
            module.__class__ = new_class  # same state, other forward: no copy of the weights
    return model


def linear_backend(model: nn.Module) -> str:
    """The backend of `model`'s linear layers: onednn if any runs oneDNN (a float32 one), else torch."""
    fast = any(type(m) is OneDNNLinear and m.weight.dtype == torch.float32 for m in model.modules())
    return "onednn" if fast else "torch"
