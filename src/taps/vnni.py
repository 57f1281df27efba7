"""taps' own int4 x int8 product for CPUs with AVX-512 VNNI: the kernel of `--target-quant w4a8`
wherever it runs, AMX CPUs included (taps.weightonly.W4A8Product and w4a8_kernel, which says why; the
C++ is kernels/w4a8_vnni.cpp); and an int8 x int8 one, w8a8's off AMX (w8a8_kernel).

Why a kernel of our own: on a CPU without AMX nothing maintained multiplies int4 weights by a tree's
rows cheaply. PyTorch's `_weight_int4pack_mm_for_cpu` (`int4`) pays per row (a 31-node tree of the
1.5B cost 11x a token on a Zen 5 EPYC, results/quantized-targets/zen5), oneDNN's int8 product
(`w8a8`) reads twice int4's bytes, and torchao's `da8w4_linear_cpu` runs its VNNI micro-kernel only
where the CPU has AMX (a scalar loop elsewhere: da8w4_linear.cpp, torchao v0.18.0). Measured on a
2-core AMD EPYC Zen 5 (avx512_vnni, no AMX), 2 threads, session 46: the products of one forward of
Qwen2.5-Coder-1.5B (28 x (q/k/v as one, o, gate/up as one, down) + the head; random weights, 0.8 GB,
out of cache), bfloat16 rows, ms by rows:

    rows                                   1     4     8    16    32
    4 rows a pass, 4 sums a row         20.8  25.7  36.0  51.4  80.9
    8 rows a pass, 2 sums a row         21.2  26.1  30.8  49.3  81.6
    the same, another run               15.4  24.4  32.0  52.3  82.9
    + weights prefetched 8 KB ahead     16.3  20.3  20.0  34.7  65.6   (kept; 2 KB: 14.6 17.5 21.9 38.7 69.1)

(Rows of one line are one process, interleaved; one row moves between 15 and 21 ms from process to
process.) One row reads the weights at 38-53 GB/s (memory-bound); 8 rows now cost little more, and
from 16 rows on a row costs ~1.5 ms. Those rows had groups of 128 inputs with integer zero points
(torchao's grid). The grid kept is int4's: groups of 32 with a float minimum each, the sub-blocks of a
Q4_K file, so a packaged model's weights land on their own grid again. Next-token agreement of the
1.5B with its float32 model (results/quantized-targets/zen5, quality.py) went from 0.932 to 0.97,
near w8a8's 0.979 (llama.cpp on the file itself: 0.991), at a price per group (same process, ms):

    rows                                   1     8    32
    groups of 32                        25.3  32.7  85.3
    groups of 64                        20.8  25.6  68.7
    groups of 128                       19.2  21.7  62.1
    groups of 32, scales in float16     20.5  24.4  72.3   (kept; another process)

Scales and minimums in float32 were 2 bits a weight more to read; in float16 (SCALES) 1, and the
codes are rounded against the float16 values.

How: each row is rounded to int8 in the kernel exactly as taps.weightonly._round_rows rounds (its
float32 scale, a true division, half to even: tested), one call a product. Each block of 32 output
channels keeps two codes a byte, laid out so that one 64-byte load gives, after a mask and a shift,
the codes of 16 channels x 4 inputs twice; `vpdpbusd` multiplies them (unsigned) by 4 of a row's int8
codes broadcast (signed) and sums in int32, for 8 rows a pass over the block. Per group of inputs
the row's float32 total takes the group's minimum times the row's sum of codes, then the codes'
int32 sum times the group's scale (two fused multiply-adds), groups in input order; the total is
multiplied by the row's scale last. Rows stay independent, bit for bit: every row runs those same
operations whatever the number of rows or which rows share a tile (tests/test_weightonly.py checks 1
to 64 rows); the int32 sums are exact (|sum| <= 32 x 127 x 15 per group).

int8 weights (`pack8`, `linear8`: taps.weightonly.W8A8Product off AMX, the w4a8 target's head among
them) run the same way, 4 inputs of 32 channels a 128-byte pair of loads, the weight stored plus 128 so
that `vpdpbusd` reads it unsigned, and 128 times the row's sum of codes taken off the int32 sum after;
then the channel's scale and the row's, as oneDNN's product does, so both give the same bits
(taps.weightonly.w8a8_kernel has the timings).

Built at first use (taps.kernels.build; ~5 s on 2 cores). The source
keeps two GCC 12 workarounds that the measurements above needed: vpdpbusd in place through inline
assembly, and accumulators as named variables (arrays of them were copied or kept on the stack).
"""

from __future__ import annotations

import functools

import torch

from taps import kernels

SOURCE = "w4a8_vnni.cpp"  # in taps/kernels
BLOCK = 32  # output channels per packed block (the kernel's two zmm of int32 lanes)
SCALES = torch.float16  # the dtype of the groups' scales and minimums (see the table above)


@functools.cache
def load() -> str | None:
    """Build (once per machine) and load the kernel: None when it runs here, else why not."""
    if not torch.cpu._is_vnni_supported():
        return "this CPU has no AVX-512 VNNI"
    return kernels.build("taps_w4a8_vnni", SOURCE, ["-mavx512f", "-mavx512bw", "-mavx512vnni"])


def pack(codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor, group: int) -> tuple[torch.Tensor, ...]:
    """int4 codes [N, K] (uint8, 0..15) of w = low + code * scale, scales and minimums [N, K / group] ->
    the kernel's layouts (kernels/w4a8_vnni.cpp): weight [N/32, K/8, 128] uint8, scales and minimums
    [N/32, K/group, 32] in SCALES."""
    n, k = codes.shape
    # [block, half, lane, octet, nibble, i] -> [block, octet, half, lane, i, nibble]: input 8o+i in the low
    # nibble of byte 4 * lane + i, input 8o+4+i in its high nibble
    c = codes.reshape(n // BLOCK, 2, 16, k // 8, 2, 4).permute(0, 3, 1, 2, 5, 4)
    weight = (c[..., 0] | (c[..., 1] << 4)).reshape(n // BLOCK, k // 8, 128).contiguous()

    def by_block(per_group: torch.Tensor) -> torch.Tensor:  # [N, K/g] -> [N/32, K/g, 32]
        return per_group.to(SCALES).reshape(n // BLOCK, BLOCK, k // group).transpose(1, 2).contiguous()

    return weight, by_block(scale), by_block(low)


def fits8(n: int, k: int) -> bool:
    """Whether an int8 weight [n, k] fits the int8 kernel: blocks of 32 outputs, inputs a multiple of 16 (its
    rounding's vectors), and few enough that every int32 sum stays exact (k * 255 * 127 < 2^31)."""
    return n % BLOCK == 0 and k % 16 == 0 and k < 66_000


def pack8(weight: torch.Tensor) -> torch.Tensor:
    """int8 weights [N, K] -> the int8 kernel's layout [N/32, K/4, 128] uint8 (kernels/w4a8_vnni.cpp, w8a8_linear):
    per block of 32 output channels and 4 inputs, channel j's 4 weights plus 128 at bytes 4j..4j+3 of its half."""
    n, k = weight.shape
    u = (weight.to(torch.int16) + 128).to(torch.uint8)  # [N, K], 1..255
    # [block, half, lane, quad, i] -> [block, quad, half, lane, i]
    return u.reshape(n // BLOCK, 2, 16, k // 4, 4).permute(0, 3, 1, 2, 4).reshape(n // BLOCK, k // 4, 128).contiguous()


def linear8(rows: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """rows [R, K] (float32 or bfloat16), each rounded to int8 by its own scale as taps.weightonly._round_rows
    rounds, times a `pack8`ed int8 weight with float32 `scales` [N] -> [R, N] in the rows' dtype."""
    return torch.ops.taps.w8a8_linear(rows.contiguous(), packed, scales)


def linear(rows: torch.Tensor, packed: tuple[torch.Tensor, ...], group: int) -> torch.Tensor:
    """rows [R, K] (float32 or bfloat16), each rounded to int8 by its own scale as
    taps.weightonly._round_rows rounds, times a `pack`ed weight -> [R, N] in the rows' dtype."""
    return torch.ops.taps.w4a8_linear(rows.contiguous(), *packed, group)
