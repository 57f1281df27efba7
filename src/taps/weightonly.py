"""A quantized target: its linear layers' weights in int8 or int4, multiplied by PyTorch's own CPU
kernels, or for w4a8 torchao's or taps' own (`--target-quant`, docs/method.md section 12).

Why: on a CPU a target forward over one token or a small tree is bound by reading the weights,
so the bytes per weight set the price of every round. int8 halves bfloat16's bytes, int4 quarters
them; speculation then multiplies a cheaper round.

Weight-only, activations untouched: each weight row is quantized once at load (int8: one scale
per output channel, symmetric; int4: one scale and zero point per group of `group_size` input
features, asymmetric), and the activations stay in the model's dtype. So each row of a verified
tree is computed from its own activations alone, as in plain decoding, and lossless keeps its
meaning (docs/method.md section 10) against the quantized model as the user serves it: every
method's output is that model's own greedy output at T=0 and its own law at T>0. Dynamic
activation quantization (taps.quantize, the drafter's int8) would not do for a target: a
per-tensor activation scale depends on the other rows of the batch, so a tree's rows would not
equal plain decoding's.

Kernels: `torch._weight_int8pack_mm` (int8 weight [N, K], a scale per row N) and
`torch._weight_int4pack_mm_for_cpu` (int4 weight packed by `torch._convert_weight_to_int4pack_for_cpu`,
scales and zero points [K / group, N, 2]); both take float32 or bfloat16 activations, multiply
without materialising a dequantized weight, and give each row the same result alone or batched
(tests/test_weightonly.py checks it). torchao's CPU int4 weight-only layout calls the same int4
kernel; taking the aten ops directly adds no dependency. Measured costs are in
results/quantized-targets/.

"w8a8" is not weight-only: the weights as int8's, and each activation row quantized to int8 on
the fly by its own scale, multiplied by oneDNN's int8 inner product (`onednn::qlinear_pointwise`,
VNNI/AMX) on weights packed once into its blocked layout (`onednn::qlinear_prepack`), or off AMX by
taps.vnni's int8 product, which gives the same bits faster (`w8a8_kernel`). Why: the
weight-only kernels pay for every row (int4 dequantizes per block of 4 rows), while the int8
GEMM reads each weight once for all rows, so a tree costs little more than a token again; the
prepacked layout is what makes that true from two rows on. One 1536x8960 layer, weights out of
cache, 2 threads of a 2-core AMD EPYC (avx512_bf16), ms by rows:

    rows                    1     8    32    64
    bfloat16 (F.linear)  1.60  1.40  2.01  2.94
    int8 weight-only     0.72  1.33  4.02  7.61
    int4 weight-only     0.32  0.97  3.89  7.63
    w8a8, torch._int_mm  0.52  1.13  1.60  2.28   (plain int8 weight, oneDNN reorders it per call)
    w8a8, prepacked      0.41  0.50  0.78  1.33   (another session, same machine kind: _int_mm
                                                   0.47  1.00  1.38  1.86 beside it)

The whole 1.5B target (one forward after 256 tokens, torch profiler): the int8 products of 197
calls cost 47 ms for one row and 47 ms for eight prepacked, against 32 and 83 ms on `_int_mm`.

Rows stay independent: a row's scale is its own, and int8 products summed in int32 are exact, so
a row's result is the same bits alone or batched whatever the kernel's order. Its activations are
rounded too, so w8a8 is another model again; lossless is against it, as for int8 and int4.

"w4a8" rounds the activation rows as w8a8 does and multiplies them by int4 weights (`W4A8Product`):
half of w8a8's bytes a token, and a tree's rows on int8 products, on taps' own AVX-512 VNNI kernel
(taps.vnni), or on torchao's CPU kernel where the CPU has AMX and taps' does not run. torchao's x86
wheels (PyPI, download.pytorch.org) leave its C++ CPU kernels out: torchao 0.18.0 from PyPI
registers no CPU op (checked 2026-12-02), so `make install-torchao` builds it from source with
them (session 44).
"""

from __future__ import annotations

import functools
import os

import torch
from torch import nn

from taps import vnni

SCHEMES = ("none", "int8", "int4", "w8a8", "w4a8")  # --target-quant values
GROUP_SIZE = 32  # int4: input features per scale and zero point (GGUF's Q4_K uses sub-blocks of 32 too)
INT4_OUTPUT_TILE = 16  # int4: output features must come in multiples of this (torch's packing)
_INT4_LEVELS = 15  # codes 0..15; the kernel reads code c as (c - 8) * scale + zero
W4A8_GROUPS = (128, 64, 32)  # w4a8: inputs per scale and zero point, the first that divides a layer's (W4A8Product)
W4A8_OUTPUT_TILE = 32  # w4a8: output features must come in multiples of this (torchao's packing)


def _round_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of `rows` [R, K] rounded to int8 by its own symmetric scale (max |x| / 127): the
    codes [R, K] (float32 integers in -127..127) and the scales [R, 1] float32. A row's codes
    depend on that row alone, so a tree's rows round as plain decoding's do."""
    x = rows.float()  # rows itself when float32: never written to
    x_scale = x.abs().amax(1, keepdim=True).clamp_(min=1e-12) / 127  # [R, 1]
    # in place after the division: 149 -> 108 us for [32, 8960] (2-core Intel Xeon with AMX)
    return (x / x_scale).round_(), x_scale


def _int4_grid(weight: torch.Tensor, group: int, kept: torch.dtype = torch.float32,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [N, K] -> int4 codes [N, K] (float integers 0..15), scales and minimums [N, K / group]
    (float32 values of dtype `kept`, the codes rounded against those) of w = low + code * scale: per
    group of inputs its own range, 15 steps from its minimum to its maximum (a weight that came from
    a 4-bit file whose group uses its codes 0 and 15, as most of a Q4_K file's do, lands on its own
    grid again)."""
    n, k = weight.shape
    groups = weight.float().reshape(n, k // group, group)  # [N, K/g, g]
    low, high = groups.amin(-1), groups.amax(-1)  # [N, K/g]
    scale = ((high - low) / _INT4_LEVELS).clamp(min=1e-12).to(kept).float().clamp(min=1e-12)
    low = low.to(kept).float()
    codes = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, _INT4_LEVELS)
    return codes.reshape(n, k), scale, low


def _int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 weight [N, K] -> int8 codes [N, K] and one symmetric scale per row [N] (max |w| / 127)."""
    scale = weight.abs().amax(1).clamp(min=1e-12) / 127  # [N]
    return (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale


class W8A8Product:
    """rows [R, K] times an int8 weight packed once by `onednn.qlinear_prepack`, each row
    quantized to int8 on the fly by its own scale (`_round_rows`), so a row's result depends on
    that row alone; oneDNN sums the int8 products in int32, exactly (|sum| <= K * 255 * 127 < 2^31
    for K < 66,000), so no kernel's order of summation can change a bit (`check_target_quant`
    probes the kernel for it). The rows go in as uint8 with zero point 128, oneDNN's u8 x s8
    layout: the same integers, shifted."""

    def __init__(self, weight: torch.Tensor, kernel: str | None = None):
        qweight, scale = _int8_rows(weight.float())  # [N, K], [N]
        self.scales = scale  # [N] float32, the kernel's
        n, k = qweight.shape
        self.kernel = kernel or (w8a8_kernel() if vnni.fits8(n, k) else "onednn")
        if self.kernel == "vnni":  # the same integers in taps.vnni's layout
            if (why := vnni.load()) is not None:
                raise RuntimeError(f"taps.vnni's kernel does not run here: {why}")
            self.packed = vnni.pack8(qweight)
            return
        self.packed = torch.ops.onednn.qlinear_prepack(qweight, None)  # opaque: see WeightOnlyLinear
        self.zero_points = torch.zeros(scale.shape, dtype=torch.long)  # made once, not per call

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        if self.kernel == "vnni":
            return vnni.linear8(rows, self.packed, self.scales)  # [R, N]: rows rounded in the kernel
        codes, x_scale = _round_rows(rows)
        xq = codes.add_(128).to(torch.uint8)  # [R, K], codes 1..255
        out = _qlinear(xq, self.packed, self.scales, self.zero_points)  # [R, N] float32: each int32 sum times its scale
        return out.mul_(x_scale).to(rows.dtype)


def _qlinear(xq: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor) -> torch.Tensor:
    """oneDNN's int8 inner product: uint8 rows [R, K] (zero point 128) times a packed int8 weight
    (symmetric: `zero_points` [N] all 0), float32 out, each int32 sum multiplied by its output
    channel's float32 scale."""
    return torch.ops.onednn.qlinear_pointwise(xq, 1.0, 128, packed, scales, zero_points, None, 1.0, 0,
                                              torch.float32, "none", [], "")


class W4A8Product:
    """rows [R, K] times an int4 weight, each row rounded to int8 by its own scale as for w8a8,
    multiplied by one of two kernels (`w4a8_kernel`), each with its own grid:
    - taps' own AVX-512 VNNI kernel (taps.vnni) wherever it runs: int4's grid (w = low + code * scale,
      groups of 32: a Q4_K file's sub-blocks, so a packaged model's weights land on their own grid),
      and `quantize_weights` keeps the LM head in int8; next-token agreement of the 1.5B with its float
      model 0.97 against torchao's grid's 0.93 (results/quantized-targets/zen5);
    - torchao's `da8w4_linear_cpu` on a CPU with AMX where taps' does not run (or when asked): one
      scale and int8 zero point per group of `group` inputs and output channel (w = (code - zero) *
      scale, codes 0..15, zero kept in range so that 0 is exact), groups of up to 128.
    So w4a8 is one model per kernel; lossless holds against the model as this machine computes it,
    as for every scheme.

    Rows stay independent, bit for bit, under either kernel. torchao's: per block of at most 128
    inputs it sums int8 x (code - zero) products in int32 (exact), then takes that sum to float32
    times the row's scale times the channel's scale and adds it to the row's float32 total, blocks
    in input order; one row or 4 (AVX-512 VNNI micro-kernel) or more (AMX: the block's codes widened
    to int8 once, then one tile product) run those same float operations in the same order (read
    from its source). taps.vnni's: its docstring. tests/test_weightonly.py checks 1 to 64 rows.

    Why: reading the weight is a token's price on a CPU, and int4 reads half of int8's bytes,
    while an int8 product keeps a tree's rows nearly free, which PyTorch's own int4 kernel (`int4`)
    does not: it dequantizes per block of rows. torchao on one layer, weights out of cache, 2
    threads of a 2-core Intel Xeon with AMX, ms by rows (scratch, session 44; taps.vnni's own
    table is in its docstring):

        rows                         1     4     8    32    64
        8960x1536 w8a8            0.91  0.93  0.98  1.35  1.67
        8960x1536 w4a8, g 128     0.52  0.70  0.81  1.10  1.49
        8960x1536 w4a8, g 32      0.55  0.64  1.17  1.71  2.76
        1536x8960 w8a8            0.97  0.96  1.02  2.44  3.37
        1536x8960 w4a8, g 128     0.50  0.66  0.94  1.39  1.95

    On torchao, groups of 128 inputs (GPTQ's and AWQ's usual size) are the fastest from 5 rows on: the
    kernel's AMX block is the group up to 128. A layer whose inputs are no multiple of 128 takes
    the largest of `W4A8_GROUPS` that divides them.

    torchao's kernel comes with torchao built with its CPU kernels (`USE_CPU_KERNELS=1`: torchao's
    x86 wheels on PyPI and download.pytorch.org leave them out; docs/commands.md says how), and is
    fast only with AMX (without it the kernel falls back to a scalar loop)."""

    def __init__(self, weight: torch.Tensor, kernel: str | None = None):
        n, k = weight.shape
        self.kernel = kernel or w4a8_kernel()  # "torchao" or "vnni"
        if self.kernel == "vnni":  # int4's grid: w = low + code * scale, groups of 32
            if (why := vnni.load()) is not None:
                raise RuntimeError(f"taps.vnni's kernel does not run here: {why}")
            self.group = GROUP_SIZE
            codes, scale, low = _int4_grid(weight, self.group, vnni.SCALES)
            self.packed = vnni.pack(codes.to(torch.uint8), scale, low, self.group)
            self.scales = scale  # [N, K/g] float32
            return
        self.group = next(g for g in W4A8_GROUPS if k % g == 0)
        groups = weight.float().reshape(n, k // self.group, self.group)  # [N, K/g, g]
        low, high = groups.amin(-1).clamp(max=0), groups.amax(-1).clamp(min=0)  # [N, K/g], 0 inside
        scale = ((high - low) / _INT4_LEVELS).clamp(min=1e-12)
        zero = (-low / scale).round().clamp(0, _INT4_LEVELS)  # [N, K/g]
        codes = (groups / scale[..., None] + zero[..., None]).round().clamp(0, _INT4_LEVELS)  # [N, K/g, g]
        # weight, scales, zeros, compensation
        self.packed = torch.ops.torchao.da8w4_linear_prepack_cpu(codes.reshape(n, k).to(torch.uint8), scale,
                                                                zero.to(torch.int8))
        self.scales = scale  # [N, K/g] float32

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        if self.kernel != "torchao":
            return vnni.linear(rows, self.packed, self.group)  # [R, N]: rows rounded in the kernel
        codes, x_scale = _round_rows(rows)
        xq = codes.to(torch.int8)  # [R, K]: int8 input means symmetric to the kernel (no zero point)
        no_zero = torch.zeros(xq.shape[0], dtype=torch.int32)  # [R]: unread, but its shape is checked
        weight, scales, zeros, compensation = self.packed
        return torch.ops.torchao.da8w4_linear_cpu(xq, x_scale.reshape(-1), no_zero, weight, scales, zeros,
                                                  compensation, None, rows.dtype)  # [R, N]


PRODUCTS = {"w8a8": W8A8Product, "w4a8": W4A8Product}  # schemes whose activations are rounded too


# Linear layers that read one input, named as Llama-family blocks name them (the attention's
# projections, the MLP's gate and up): under w8a8 each set found in a module is one product.
SHARED_INPUTS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class SharedInput:
    """One w8a8 or w4a8 product for linear layers that read the same input (SHARED_INPUTS): their
    weights stacked and packed once, the input rounded to int8 once, one kernel call. Its members
    are WeightOnlyLinear layers in place of the originals. The first member called computes every
    member's output; a member then called with that same tensor takes its own slice, and one
    called with another tensor, or a second time with it, computes anew. So each call returns the
    product of the tensor it was given, provided that tensor is not changed in place between the
    calls of one block (a block that projects one hidden state three times does not); a block
    that gave its members different tensors would pay a whole shared product per call, correctly.

    Bits: each output channel is its own layer's int32 sums (exact) times its own scales, and the
    input's codes are the same whichever layer rounds them; biases are added per channel as
    before. So every member's output equals its own layer's, bit for bit, and lossless keeps its
    meaning (tests/test_weightonly.py checks a fused model against the unfused one).

    Why: a quantized 1.5B target spent ~1/3 of a forward outside the int8 products, much of it
    per layer call (the rounding's ~8 small ops, oneDNN's dispatch); one call for q, k, v and one
    for gate, up removes 84 of its 197. Qwen2.5-Coder-1.5B w8a8, bfloat16, one forward after 256
    tokens, 2-core Intel Xeon with AMX, median of 6, ms by tree nodes:

        nodes        0      7     15     31
        separate  105.7  126.7  150.7  203.2
        shared     96.9  119.0  139.2  193.2
    """

    def __init__(self, linears: list[nn.Linear], scheme: str = "w8a8"):
        self.scheme = scheme
        self.product = PRODUCTS[scheme](torch.cat([linear.weight.detach() for linear in linears]))  # [sum N, K]
        self.in_features = linears[0].in_features
        biases = [linear.bias for linear in linears]
        self.bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])  # [N], the model's dtype
        self.sizes = [linear.out_features for linear in linears]
        self.input: torch.Tensor | None = None  # the tensor `outputs` are the products of
        self.outputs: tuple[torch.Tensor, ...] = ()
        self.taken: set[int] = set()  # members that took their output of `input`

    @staticmethod
    def fits(linears: list[object]) -> bool:
        """Whether `linears` can share one product: plain linear layers of one input width, with
        a bias each or none (a zero bias in its place would turn a -0.0 into +0.0)."""
        return (all(isinstance(m, nn.Linear) for m in linears) and len({m.in_features for m in linears}) == 1
                and len({m.bias is None for m in linears}) == 1 and len({m.weight.dtype for m in linears}) == 1)

    def rows(self, index: int) -> slice:
        """Member `index`'s output channels in the stacked weight."""
        start = sum(self.sizes[:index])
        return slice(start, start + self.sizes[index])

    def products(self, x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """Every member's product of `x` [..., K] in `dtype`: [..., N_i] each, views of one output."""
        rows = x.reshape(-1, self.in_features).to(dtype)  # [R, K]
        out = self.product(rows)  # [R, sum N], made here
        if self.bias is not None:
            out.add_(self.bias)  # in place: the same sums as out + bias, one tensor fewer
        return out.reshape(*x.shape[:-1], out.shape[-1]).split(self.sizes, -1)

    def output(self, x: torch.Tensor, index: int, dtype: torch.dtype) -> torch.Tensor:
        """Member `index`'s product of `x` [..., K] -> [..., N_index] (a view of the shared output)."""
        if x is not self.input or index in self.taken:
            self.input, self.taken = x, set()
            self.outputs = self.products(x, dtype)
        self.taken.add(index)
        out = self.outputs[index]
        if len(self.taken) == len(self.sizes):  # every member has its own: hold nothing past the block
            self.input, self.outputs = None, ()
        return out


class WeightOnlyLinear(nn.Module):
    """`nn.Linear`'s forward with the weight kept in int8 or int4 (see the module docstring)."""

    def __init__(self, linear: nn.Linear, scheme: str, group_size: int = GROUP_SIZE,
                 shared: SharedInput | None = None, index: int = 0):
        super().__init__()
        dtype = linear.weight.dtype
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.scheme, self.group_size = scheme, group_size
        self.shared: SharedInput | None = None  # set for member `index` of a shared product (SharedInput)
        self.bias = None
        if linear.bias is not None and shared is None:  # a shared product adds its members' biases itself
            self.bias = nn.Parameter(linear.bias.detach(), requires_grad=False)
        if shared is not None:  # a member of a shared product: its weights are in `shared`
            if scheme != shared.scheme:
                raise ValueError(f"a shared product is {shared.scheme}'s; {scheme} layers compute alone")
            self.shared, self.index = shared, index
        if scheme in PRODUCTS:  # packed once in the kernel's layout (opaque tensors, so not buffers:
            # a quantized target is not copied or saved); a shared product's member reads its own
            # channels' scales, [N] (w8a8) or [N, K / group] (w4a8), in its dtype
            if shared is None:
                self.product = product = PRODUCTS[scheme](linear.weight.detach())
                channels = slice(None)
            else:
                product, channels = shared.product, shared.rows(index)
            self.group_size = getattr(product, "group", group_size)
            self.register_buffer("scales", product.scales[channels].to(dtype))
        elif scheme == "int8":
            qweight, scale = _int8_rows(linear.weight.detach().float())  # [N, K], [N]
            self.register_buffer("scales", scale.to(dtype))  # [N]
            self.register_buffer("qweight", qweight)
        elif scheme == "int4":
            codes, scale, low = _int4_grid(linear.weight.detach(), group_size)
            self.register_buffer("qweight", torch._convert_weight_to_int4pack_for_cpu(
                codes.to(torch.int32), 1))  # packed two codes a byte
            zero = low + 8 * scale  # so that (c - 8) * scale + zero = low + c * scale
            self.register_buffer("scales", torch.stack([scale, zero], -1).transpose(0, 1).contiguous().to(dtype))
        else:
            raise ValueError(f"unknown weight scheme {scheme!r}; choose one of {', '.join(SCHEMES[1:])}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.shared is not None:
            return self.shared.output(x, self.index, self.scales.dtype)
        rows = x.reshape(-1, self.in_features)  # [R, K]
        if rows.dtype != self.scales.dtype:
            rows = rows.to(self.scales.dtype)
        if self.scheme == "int8":
            out = torch._weight_int8pack_mm(rows, self.qweight, self.scales)  # [R, N]
        elif self.scheme in PRODUCTS:
            out = self.product(rows)  # [R, N]
        else:
            out = torch._weight_int4pack_mm_for_cpu(rows, self.qweight, self.group_size, self.scales)  # [R, N]
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight [N, K] (what the kernels multiply by), made anew on each access:
        for the rare reader of a head's weight (a DFlash drafter shares the target's head), never
        for a forward."""
        out = WeightOnlyLinear.forward(self, torch.eye(self.in_features, dtype=self.scales.dtype))  # [K, N]
        bias = self.bias
        if self.shared is not None and self.shared.bias is not None:
            bias = self.shared.bias[self.shared.rows(self.index)]
        return (out if bias is None else out - bias).T.contiguous()

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.scheme in ("int4", "w4a8") else ""
        shared = f", shared product {self.index + 1} of {len(self.shared.sizes)}" if self.shared is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.scheme}{group}{shared}"


def check_target_quant(scheme: str, device: str | torch.device | None = None, option: str = "--target-quant") -> str:
    """`scheme` if this machine can run it on `device`; else a ValueError that says why and what to do,
    in the words of `option` (the flag that asked for it: a drafter's is --drafter-quant)."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown target quantization {scheme!r}; choose one of {', '.join(SCHEMES)}")
    if scheme != "none" and torch.device(device or "cpu").type != "cpu":
        raise ValueError(f"{option} {scheme} runs on PyTorch's CPU kernels; drop it on {device}")
    op = {"int8": "_weight_int8pack_mm", "int4": "_weight_int4pack_mm_for_cpu"}.get(scheme)
    if op is not None and not hasattr(torch.ops.aten, op):
        raise ValueError(f"{option} {scheme} needs torch.ops.aten.{op}, missing from torch "
                         f"{torch.__version__}; upgrade PyTorch or drop {option}")
    if scheme in ("w8a8", "w4a8"):
        w8a8_kernel()  # a wrong $TAPS_W8A8_KERNEL is refused here, before any model loads
    if scheme == "w8a8" and not _int8_kernel_is_exact():
        raise ValueError(f"{option} w8a8 needs oneDNN's exact int8 products, and this CPU's int8 kernel "
                         f"saturates (no AVX-512 VNNI or AMX) or this PyTorch has none: use {option} int8")
    if scheme == "w4a8" and w4a8_kernel() is None:
        if os.environ.get(W4A8_KERNEL_VAR) == "torchao":
            raise ValueError(f"{option} w4a8 needs torchao built with its CPU kernels, which its x86 wheels leave "
                             f"out: `make install-torchao` (docs/commands.md), or unset ${W4A8_KERNEL_VAR}")
        if not torch.cpu._is_vnni_supported():
            raise ValueError(f"{option} w4a8 needs a CPU with AVX-512 VNNI (AMD Zen 4 or later, Intel Xeon 2nd "
                             f"generation or later), which this one lacks: use {option} int4 or int8")
        raise ValueError(f"{option} w4a8's AVX-512 VNNI kernel (taps.vnni) does not run here: "
                         f"{vnni.load() or 'rows differ alone and batched'}; install a C++ compiler (g++) "
                         f"and ninja, or use {option} w8a8")
    return scheme


def has_amx() -> bool:
    """Whether this CPU has AMX tiles (torch's own probe; False on a torch without it)."""
    return getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()


W4A8_KERNEL_VAR = "TAPS_W4A8_KERNEL"  # auto (default), torchao or vnni: which kernel w4a8 multiplies with


@functools.cache
def w4a8_kernel() -> str | None:
    """The kernel `W4A8Product` multiplies with here: "vnni" (taps.vnni) where the CPU has AVX-512 VNNI
    and the kernel builds, else "torchao" where the CPU has AMX and torchao's CPU kernels are installed;
    None where neither runs. $TAPS_W4A8_KERNEL=torchao or vnni asks for one (to compare them on one
    machine). Each is probed once: every row gets the same bits alone as batched (1, 4 and 33 rows:
    torchao's VNNI and AMX paths).

    Why taps' own first where the CPU has AMX too (2-core Intel Xeon with AMX, session 49,
    results/quantized-targets/xeon-amx): the w4a8 products of one forward of the 1.5B's layers cost 34.4 /
    40.8 / 65.3 ms for 1 / 8 / 16 rows on taps.vnni against torchao's 43.9 / 67.4 / 74.7, torchao's AMX
    tiles winning from 32 rows (90.8 against 111.2; forward-products.py); in the decoding loop (kernel-ab.py,
    one process, the w4a8 1.5B beside the shipped drafter, 5 HumanEval + 5 MT-Bench, T=0, 128 tokens, both
    session orders) taps:32 ran 1.03-1.08x / 1.17-1.19x torchao's tokens/s on code / chat with the same w8a8
    drafter, 1.19-1.20x / 1.32x with the drafter on taps.vnni too; its grid is the closer model as well
    (W4A8Product)."""
    wanted = os.environ.get(W4A8_KERNEL_VAR, "auto")
    if wanted not in ("auto", "torchao", "vnni"):
        raise ValueError(f"${W4A8_KERNEL_VAR}={wanted!r}: choose auto, torchao or vnni")
    if wanted != "torchao" and vnni.load() is None and _rows_independent("vnni"):
        return "vnni"
    if wanted == "torchao" or (wanted == "auto" and has_amx()):
        try:
            import torchao  # noqa: F401  (loads the kernels)

            if _rows_independent("torchao"):
                return "torchao"
        except (ImportError, AttributeError, RuntimeError):  # no torchao, or one without its CPU kernels
            pass
    return None


W8A8_KERNEL_VAR = "TAPS_W8A8_KERNEL"  # auto (default), onednn or vnni: which kernel w8a8 multiplies with


@functools.cache
def w8a8_kernel() -> str:
    """The kernel `W8A8Product` multiplies int8 weights with here: "vnni" (taps.vnni's int8 product) where
    the CPU has AVX-512 VNNI and no AMX and the kernel builds, else "onednn"; a weight that does not fit
    taps.vnni's layout (`vnni.fits8`) takes oneDNN's anyway. $TAPS_W8A8_KERNEL=onednn or vnni asks for one.

    Both sum the same int8 products exactly in int32, then multiply by the channel's scale and the row's
    in that order, so they give the same bits (tests/test_weightonly.py): the choice is speed alone.
    Measured (session 53, 2-core AMD EPYC Zen 4, avx512_vnni, no AMX; bfloat16 rows, weights out of cache,
    interleaved, median of 15; ms oneDNN -> taps.vnni):

        rows                          1            8           64          256
        151936x1536 (1.5B's head)  12.1 -> 7.8  14.1 -> 10.3  58.5 -> 40.4  279 -> 191
        17920x1536 (gate and up)    1.9 -> 1.2   2.3 -> 1.6    6.0 -> 5.2   20.6 -> 17.7
        1536x8960 (down)           0.49 -> 0.27 0.67 -> 0.32   3.6 -> 2.7   11.6 -> 9.2

    oneDNN reads the head's int8 weights at about 19 GB/s for one row where taps.vnni reads them at ~30;
    a forward of the w4a8 1.5B (its head int8) after 256 tokens took 0.87-0.89x the time at 1 row and
    0.93-0.95x at 4-8 rows (paired medians of 12, one process, two runs; results/quantized-targets/zen4/head-ab.py).
    Where the CPU has AMX, oneDNN multiplies on its tiles and stays (not measured against taps.vnni there)."""
    wanted = os.environ.get(W8A8_KERNEL_VAR, "auto")
    if wanted not in ("auto", "onednn", "vnni"):
        raise ValueError(f"${W8A8_KERNEL_VAR}={wanted!r}: choose auto, onednn or vnni")
    if wanted != "onednn" and (wanted == "vnni" or not has_amx()) and vnni.load() is None:
        return "vnni"
    return "onednn"


def _rows_independent(kernel: str) -> bool:
    """Whether W4A8Product on `kernel` gives 1, 4 and 33 rows the bits each row gets alone."""
    product = W4A8Product(torch.randn(64, 256, generator=torch.Generator().manual_seed(0)), kernel)
    rows = torch.randn(33, 256, generator=torch.Generator().manual_seed(1))
    alone = torch.cat([product(rows[i : i + 1]) for i in range(33)])  # [33, 64]
    return all(torch.equal(product(rows[:n]), alone[:n]) for n in (4, 33))


@functools.cache
def _int8_kernel_is_exact() -> bool:
    """Whether oneDNN's int8 inner product (`_qlinear`) sums int8 products exactly here, alone and
    batched: x86 kernels without VNNI multiply through 16-bit pairs that saturate at the extremes.
    Probed once with the worst case (every product 127 * +-127, signs mixed) against float64,
    exact at these sizes."""
    g = torch.Generator().manual_seed(0)
    signs = torch.randint(0, 2, (33, 256), generator=g) * 2 - 1  # [33, K]
    xq = (signs * 127 + 128).to(torch.uint8)  # codes 1 and 255: -127 and +127 after the zero point
    w = ((torch.randint(0, 2, (48, 256), generator=g) * 2 - 1) * 127).to(torch.int8)  # [N, K]
    want = (signs.double() * 127) @ w.double().T  # [33, N]
    try:
        packed = torch.ops.onednn.qlinear_prepack(w, None)
        ones, zeros = torch.ones(48), torch.zeros(48, dtype=torch.long)
        return all(torch.equal(_qlinear(xq[:rows], packed, ones, zeros).double(), want[:rows]) for rows in (1, 8, 33))
    except (RuntimeError, AttributeError):  # a build without oneDNN's int8 CPU kernel
        return False


def target_quant_of(model: nn.Module) -> str:
    """The scheme `quantize_weights` applied to `model` ("none" if it did not)."""
    return next((m.scheme for m in model.modules() if isinstance(m, WeightOnlyLinear)), "none")


def quantize_weights(model: nn.Module, scheme: str, group_size: int = GROUP_SIZE, rowwise: bool = True,
                     option: str = "--target-quant", fine_head: bool = True) -> nn.Module:
    """`model` with every `nn.Linear` (the LM head included) replaced by a `WeightOnlyLinear` in
    `scheme`, in place; "none" returns it untouched. Refused before any layer changes when a layer
    cannot be quantized (int4: input features not a multiple of `group_size`), in the words of
    `option`. `rowwise`: switch its attention to taps.rowwise, as a target needs (a drafter, which
    only proposes, need not). `fine_head`: w4a8 on taps.vnni keeps the LM head in int8, as a target
    needs (below); a drafter's head runs in int4 with the rest of it."""
    check_target_quant(scheme, next(model.parameters()).device, option)
    if scheme == "none":
        return model
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    # the int4 kernels' layouts: groups along the inputs, tiles of outputs; else the 8-bit scheme to use
    layout = {"int4": (group_size, INT4_OUTPUT_TILE, "int8"), "w4a8": (W4A8_GROUPS[-1], W4A8_OUTPUT_TILE, "w8a8")}
    if scheme in layout:
        inputs, outputs, instead = layout[scheme]
        odd = sorted({(m.in_features, m.out_features) for _, m in linears
                      if m.in_features % inputs or m.out_features % outputs})
        if odd:
            raise ValueError(f"{option} {scheme} needs layers with inputs a multiple of {inputs} and outputs a "
                             f"multiple of {outputs}; this model has (inputs, outputs) {odd}; use {option} {instead}")
    shared = _shared_inputs(model, scheme) if scheme in PRODUCTS else {}
    # w4a8 on taps.vnni keeps a target's LM head in int8 (w8a8): 4-bit files keep theirs finer (Q4_K_M: Q6_K),
    # and in 4 bits it alone took the 1.5B's next-token agreement with its float model from 0.972 to 0.961
    # (fake-quantized, results/quantized-targets/zen5); its int8 bytes cost ~2 ms a token there. A drafter's
    # head is the largest product of its draft (the 0.5B's 151,936 x 896): in int4 a draft of the 1.5B's
    # shipped drafter took 22.7 against 24.7 ms (after 256-2,200 tokens, 2-core Zen 5 EPYC, interleaved),
    # slot accuracies on the target's chat answers level (0.717 slot 1 both); in the decoding loop, with its
    # attention on the row-wise kernel too, 23.3 against 25.9 ms a round, tokens/s 1.036x [1.013-1.082]
    # (results/quantized-targets/zen5/draft-ab.py)
    int8_head = fine_head and scheme == "w4a8" and w4a8_kernel() == "vnni" and _int8_kernel_is_exact()
    head = model.get_output_embeddings() if int8_head else None
    for name, linear in linears:
        parent, _, child = name.rpartition(".")
        own = "w8a8" if linear is head else scheme
        setattr(model.get_submodule(parent), child, WeightOnlyLinear(linear, own, group_size, *shared.get(name, ())))
    # tied input embeddings keep the float weight: only the head's copy is quantized
    model.config.tie_word_embeddings = False
    if rowwise:  # every linear now computes each row alone; with attention that does too
        # (taps.rowwise), a tree's rows are plain decoding's bits, in any dtype
        from taps.rowwise import register

        model.set_attn_implementation(register())
    return model


def _shared_inputs(model: nn.Module, scheme: str) -> dict[str, tuple[SharedInput, int]]:
    """Each linear layer of `model` that shares its input with others of its module (SHARED_INPUTS,
    SharedInput.fits) -> (their shared product in `scheme`, its index there). A layer wrapped by an adapter
    that calls it on the wrapper's own input (peft's `base_layer`, a grown drafter's
    MaskRowAdapter) counts as the wrapper."""
    found = {}
    for prefix, module in model.named_modules():
        for names in SHARED_INPUTS:
            paths = [name + ".base_layer" * hasattr(getattr(module, name, None), "base_layer") for name in names]
            linears = [_find(module, path) for path in paths]
            if SharedInput.fits(linears):
                product = SharedInput(linears, scheme)
                for index, path in enumerate(paths):
                    found[f"{prefix}.{path}" if prefix else path] = (product, index)
    return found


def _find(module: nn.Module, path: str) -> object:
    """`module.get_submodule(path)`, or None where there is none."""
    try:
        return module.get_submodule(path)
    except AttributeError:
        return None
