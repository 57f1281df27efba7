"""Row-wise attention: each query row attends alone, over exactly the keys its mask allows, so a
row's result does not depend on the other rows of its forward (attn_implementation "taps_rowwise").

Why: a tree's rows must be computed as plain decoding computes them (docs/method.md section 10).
SDPA over many query rows and a masked key set sums in another order than over one query and its
own keys, which moves the last bits; a float model shrugs that off, but a w8a8 target
(taps.weightonly) rounds every activation to int8, so a last-bit difference can flip a rounding,
and then a near-tie token (SmolLM2-135M in float32: chain's answer differed from the model's own
greedy one within 48 tokens). With every linear of a quantized target computing each row alone
(tested bit for bit) and this attention, the rest of a decoder layer (norms, rotary embedding,
activations, residuals) works row by row anyway, so a verified tree's rows, its committed K/V
included, are the bits plain decoding would have made, in float32 and bfloat16 alike.

Row i computes softmax(q_i K^T * scale) V over exactly its allowed keys K, V, one call per row,
never one over several rows (a batched call's rows are not each the bits of their call alone:
SDPA's batch entries, float32, 300 keys, were 7e-8 apart), in float32 (PyTorch's CPU SDPA over
one bfloat16 query cost 379 us against 45 in float32). In plain decoding the allowed keys are all
of them: the same computation. Two batched matrix products per row (its query heads grouped by
the key/value head they read), not SDPA: 27 against 40 us a row (12 heads over 2, 260 keys, 2
threads, 2-core Intel Xeon with AMX), and a 32-node tree of a 28-layer model makes 896 calls.
A prompt's prefill goes row by row too (a causal call without a mask: row i over its prefix), so
its K/V are the same bits however the prompt is cut into forwards: taps feeds a prompt without
its last token, which the first round verifies, where transformers' `generate` feeds it whole;
one causal SDPA call over the rows made them differ, and on that Xeon SmolLM2's w8a8 greedy
answer by taps left `generate`'s at its 26th token (tests/test_weightonly.py).

The rows' key lists are made once per mask, which every layer of a forward shares. K and V go
to float32 once per call; a row whose keys are a prefix reads them in place; the other rows of a
tree all see the same context, copied once per call, and each writes only its own ancestors' keys
after it (a gather of every row's keys cost 43 of the 274 ms of such a forward). w8a8 1.5B, one
forward of 32 rows after 256 tokens, ms (median of 6, same Xeon): 304 with SDPA and gathers, 216
now; 1 row 115 -> 109, 8 rows 165 -> 132.

Where the CPU has AVX-512 or AVX2, taps' own kernel (kernels/rowwise.cpp, built at first use by
taps.kernels.build for the wider of the two) computes the rows in one call instead: the same lists of keys, each row's
reductions in the order of its list (so the invariant above holds by construction; its sums run in
another order than the loop's, so the two are different bits of the same attention, and one machine
uses one of them throughout). Why: the loop's per-row calls and conversions, not its arithmetic, were
its cost. Measured on a 2-core AMD EPYC Zen 5, the 1.5B's shape (12 query heads over 2, D 128), a
bfloat16 cache, us a row (1 row / 6 rows a call), one process:

    keys        loop          AVX2 build    AVX-512 build
    30          31.2 / 17.3   10.8 / 4.0    10.2 / 3.0
    300         54.6 / 35.5   25.7 / 16.3   18.8 / 9.5
    1000        699 / 203     54.2 / 45.3   34.1 / 27.6

(The AVX2 build ran on that AVX-512 CPU.) One process, the w4a8 1.5B with its w4a8 drafter,
taps, a HumanEval prompt, 128 tokens, median of 6 alternating runs: 3.09 -> 2.81 s an answer, the
verification 1.74 -> 1.50 s.
"""

from __future__ import annotations

import functools
import itertools

import torch

from taps import kernels

NAME = "taps_rowwise"
GROUPS = 8  # the kernel's most query heads per key/value head (kernels/rowwise.cpp)


def rowwise_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function interface: query [B, H, Q, D], key/value [B, Hkv, K, D],
    attention_mask [B, 1, Q, K] (bool: True = attend; or additive, 0 = attend) or None; returns
    ([B, Q, H, D], None)."""
    batch, heads, rows, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads  # GQA: head h reads kv head h // group
    scale = dim**-0.5 if scaling is None else scaling
    if (op := kernel_for(query.device, key.dtype, group)) is not None:
        out = [op(
            query[b], scale, key[b].contiguous(), value[b].contiguous(),
            *(causal(key.shape[2], rows) if attention_mask is None else index(attention_mask, b)))
            for b in range(batch)]  # [Q, H, D] each
        return out[0][None] if batch == 1 else torch.stack(out), None
    # row i's heads as [Hkv, group, D] blocks, scaled once for all rows
    q = (query.float() * scale).transpose(1, 2).reshape(batch, rows, kv_heads, group, dim)  # [B, Q, Hkv, g, D]
    out = query.new_empty(batch, rows, kv_heads, group, dim, dtype=torch.float32)  # [B, Q, Hkv, g, D]
    for b in range(batch):
        if attention_mask is None:  # causal: the rows are the cache's last `rows` positions, each over its prefix
            keys = range(key.shape[2] - rows + 1, key.shape[2] + 1)
        else:
            keys = _allowed(attention_mask, b)  # per row: see _allowed
        key_b, value_b = key[b].float(), value[b].float()  # [Hkv, K, D], converted once for all rows
        scratch = None  # [Hkv, K, D] x 2: a shared prefix copied once, each row's other keys written after it
        for i, allowed in enumerate(keys):
            if isinstance(allowed, int):  # the first `allowed` keys: a view, no copy
                k, v = key_b[:, :allowed], value_b[:, :allowed]  # [Hkv, L, D]
            else:
                start, extra = allowed
                if scratch is None:  # every such row of the mask shares its `start`
                    scratch = key_b.clone(), value_b.clone()
                k, v = scratch
                end = start + len(extra)
                torch.index_select(key_b, 1, extra, out=k[:, start:end])
                torch.index_select(value_b, 1, extra, out=v[:, start:end])
                k, v = k[:, :end], v[:, :end]  # [Hkv, L, D]: the row's keys in order, as _allowed gives them
            weights = torch.bmm(q[b, i], k.transpose(1, 2)).softmax(-1)  # [Hkv, g, L]
            torch.bmm(weights, v, out=out[b, i])  # [Hkv, g, D]
    return out.view(batch, rows, heads, dim).to(query.dtype), None


_last: tuple[torch.Tensor, int, list] | None = None  # (mask, batch row, its rows' keys): every layer gets one mask


def _allowed(mask: torch.Tensor, b: int) -> list[int | tuple[int, torch.Tensor]]:
    """Per query row of batch row b, the keys it attends to: m when it allows exactly the first m
    keys (plain decoding's row; a row whose ancestors are all the tree's nodes before it: a chain's
    rows, a tree's first ones), read in place; else (p, extra): the first p keys, p the same for
    every row of the mask (the context all of them see), and the indices of its others (its
    ancestors and itself), written after one shared copy of the first p. Made once per mask,
    which every layer of a forward shares."""
    global _last
    cached = _last  # read once: another thread's forward may replace it meanwhile
    if cached is None or cached[0] is not mask or cached[1] != b:
        allowed = mask[b if mask.shape[0] > 1 else 0, 0]  # [Q, K]
        if allowed.dtype != torch.bool:
            allowed = allowed == 0  # an additive mask: 0 where attended
        counts = allowed.sum(1).tolist()  # [Q]
        leads = allowed.int().cumprod(1).sum(1)  # [Q]: each row's run of allowed keys from the first
        shared = int(leads.min())
        keys = [m if m == lead else (shared, row[shared:].nonzero()[:, 0] + shared)
                for row, m, lead in zip(allowed, counts, leads.tolist())]
        cached = _last = (mask, b, keys)
    return cached[2]


_last_index: tuple[list, tuple[torch.Tensor, ...]] | None = None  # (_allowed's list, its _index)


def index(mask: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_allowed(mask, b)` as the kernel's lists: prefix [Q] (row i reads keys 0 .. prefix[i] - 1, then)
    extra[offsets[i] : offsets[i + 1]] (offsets [Q + 1]); made once per mask, as `_allowed`'s list."""
    global _last_index
    keys = _allowed(mask, b)
    cached = _last_index  # read once, as _last
    if cached is None or cached[0] is not keys:
        extras = [(0, torch.empty(0, dtype=torch.long)) if isinstance(k, int) else k for k in keys]
        prefix = torch.tensor([k if isinstance(k, int) else k[0] for k in keys])  # [Q]
        offsets = torch.tensor([0, *itertools.accumulate(len(extra) for _, extra in extras)])  # [Q + 1]
        cached = _last_index = (keys, (prefix, offsets, torch.cat([extra for _, extra in extras])))
    return cached[1]


@functools.lru_cache(maxsize=16)
def causal(n_keys: int, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's lists for a causal call (no mask): row i reads the first n_keys - rows + 1 + i keys."""
    prefix = torch.arange(n_keys - rows + 1, n_keys + 1)  # [Q]
    return prefix, torch.zeros(rows + 1, dtype=torch.long), torch.empty(0, dtype=torch.long)


BUILDS = {"avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl"], "avx2": ["-mavx2", "-mfma"]}  # kernels/rowwise.cpp's
RUNS = {"AVX512": ("avx512", "avx2"), "AVX2": ("avx2",)}  # torch's CPU capability -> the builds it runs, best first


@functools.cache
def kernel(isa: str | None = None):
    """The op of taps' row-wise kernel (kernels/rowwise.cpp) built for `isa` (a key of BUILDS; None: the
    best this CPU runs), or None where it cannot run here (no such instructions, no compiler):
    `rowwise_attention` then loops over rows itself."""
    runs = RUNS.get(torch.backends.cpu.get_cpu_capability(), ())
    name = runs[0] if isa is None and runs else isa
    if name not in runs:
        return None
    library = f"taps_rowwise_{name}"
    if kernels.build(library, "rowwise.cpp", [*BUILDS[name], f"-DTAPS_LIBRARY={library}"]) is not None:
        return None
    return getattr(torch.ops, library).attention


def kernel_for(device: torch.device, dtype: torch.dtype, group: int):
    """`kernel()` where it can attend tensors on `device` in `dtype` with `group` query heads a key/value
    head (the CPU, float32 or bfloat16, at most GROUPS), else None."""
    if device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and group <= GROUPS:
        return kernel()
    return None


def register() -> str:
    """Make NAME an attention implementation transformers models can switch to (idempotent); its
    masks are prepared as SDPA's are (4D masks, such as a tree's, pass through untouched)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, rowwise_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME
