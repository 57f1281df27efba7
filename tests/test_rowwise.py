"""Row-wise attention (taps.rowwise): a row's output is the same bits whatever other rows share
its call, and it is attention (close to SDPA with the same mask); every way of computing it: taps'
kernel built for AVX-512 and for AVX2 (those this CPU runs) and the loop over rows."""

import pytest
import torch
import torch.nn.functional as F

import taps.rowwise
from taps.rowwise import _allowed, rowwise_attention


def build(isa):
    """The kernel's op built for `isa`, or a skip where this CPU cannot run it."""
    op = taps.rowwise.kernel(isa)
    if op is None:
        pytest.skip(f"taps' row-wise attention kernel for {isa} needs a CPU with it and a C++ compiler")
    return op


@pytest.fixture(params=[*taps.rowwise.BUILDS, "loop"])
def path(request, monkeypatch):
    """Each test runs on each build of the kernel and on the loop over rows."""
    op = None if request.param == "loop" else build(request.param)
    monkeypatch.setattr(taps.rowwise, "kernel", lambda: op)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads, dim", [(4, 16), (6, 20), (18, 8)])  # 20: a partial 16-lane chunk; 9 heads a kv head
def test_a_row_is_the_same_bits_alone_as_among_a_trees_rows(path, dtype, heads, dim):
    torch.manual_seed(0)
    cached, rows, kv_heads = 37, 9, 2
    q = torch.randn(1, heads, rows, dim, dtype=dtype)
    k = torch.randn(1, kv_heads, cached + rows, dim, dtype=dtype)
    v = torch.randn(1, kv_heads, cached + rows, dim, dtype=dtype)
    tree = torch.tensor([-1, 0, 0, 1, 1, 2, 3, 5, 7])  # parents
    mask = torch.zeros(rows, cached + rows, dtype=torch.bool)
    mask[:, :cached] = True
    for i in range(rows):
        j = i
        while j >= 0:  # self and ancestors
            mask[i, cached + j] = True
            j = int(tree[j])
    # rows 0 and 1 attend to a prefix of the keys (read in place); the others share one copy of the
    # context and write their own ancestors after it
    keys = _allowed(mask[None, None], 0)
    assert [isinstance(k, int) for k in keys] == [i in (0, 1) for i in range(rows)]
    assert {k[0] for k in keys[2:]} == {cached + 1}  # one shared start: the context and the root
    assert _allowed(torch.ones(1, 1, 1, 5, dtype=torch.bool), 0) == [5]  # plain decoding's row: every key
    out, _ = rowwise_attention(None, q, k, v, mask[None, None])  # [1, rows, heads, dim]
    for i in range(rows):  # the row alone, over its allowed keys only: plain decoding's call
        keys = mask[i].nonzero()[:, 0]
        alone, _ = rowwise_attention(None, q[:, :, i : i + 1], k[:, :, keys], v[:, :, keys], None)
        assert torch.equal(out[:, i : i + 1], alone), i
    sdpa = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask[None, None], enable_gqa=True)
    torch.testing.assert_close(out.float(), sdpa.transpose(1, 2), rtol=0.02, atol=0.02)
    additive = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
    assert torch.equal(rowwise_attention(None, q, k, v, additive[None, None])[0], out)  # eager's mask form


def test_a_prefill_is_causal_and_the_same_bits_however_the_prompt_is_cut(path):
    """A causal call without a mask (a prompt's prefill, after `cached` earlier keys): row i attends
    to its prefix, each row the bits of that row decoded alone, so feeding a prompt whole (as
    transformers' generate does) or in pieces (as taps does) fills the cache alike."""
    torch.manual_seed(1)
    cached, rows = 3, 6
    q = torch.randn(1, 4, rows, 8)
    k, v = (torch.randn(1, 2, cached + rows, 8) for _ in range(2))
    out, _ = rowwise_attention(None, q, k, v, None)  # [1, rows, heads, dim]
    for i in range(rows):
        end = cached + i + 1
        alone, _ = rowwise_attention(None, q[:, :, i : i + 1], k[:, :, :end], v[:, :, :end], None)
        assert torch.equal(out[:, i : i + 1], alone), i
    first, _ = rowwise_attention(None, q[:, :, :2], k[:, :, : cached + 2], v[:, :, : cached + 2], None)
    assert torch.equal(out[:, :2], first)  # the prompt's first two rows fed alone
    mask = torch.ones(rows, cached + rows, dtype=torch.bool).tril(cached)  # the same, as a mask
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, sdpa)


@pytest.mark.parametrize("isa", list(taps.rowwise.BUILDS))
def test_the_kernel_computes_what_the_loop_does(isa, monkeypatch):
    """Each build agrees with the loop to float32 rounding (not bit for bit: their sums run in other
    orders), on a tree's mask and a long causal call (several vectors of keys and a partial one)."""
    op = build(isa)
    monkeypatch.setattr(taps.rowwise, "kernel", lambda: op)
    torch.manual_seed(2)
    q = torch.randn(1, 12, 5, 64)
    k, v = (torch.randn(1, 2, 301, 64) for _ in range(2))
    mask = torch.ones(5, 301, dtype=torch.bool).tril(296)
    mask[3, 297:299] = False  # a row skipping two keys: a tree's sibling branches
    for m in (mask[None, None], None):
        fast, _ = rowwise_attention(None, q, k, v, m)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(taps.rowwise, "kernel", lambda: None)
            slow, _ = rowwise_attention(None, q, k, v, m)
        torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("isa", list(taps.rowwise.BUILDS))
def test_the_kernel_reads_a_caches_slice_in_place(isa):
    """Heads that lie apart (a slice of a preallocated cache [kv_heads, capacity, D], as a grown drafter's
    taps.decoder.KVCache) give the bits of their contiguous copy; a head's rows must be contiguous."""
    op = build(isa)
    torch.manual_seed(3)
    q = torch.randn(6, 4, 32, dtype=torch.bfloat16)  # [H, Q, D]
    keys, values = (torch.randn(2, 50, 32, dtype=torch.bfloat16)[:, :37] for _ in range(2))  # [Hkv, 37, D]
    lists = taps.rowwise.causal(37, 4)
    assert torch.equal(op(q, 0.25, keys, values, *lists), op(q, 0.25, keys.contiguous(), values.contiguous(), *lists))
    with pytest.raises(RuntimeError, match="each head's"):
        op(q, 0.25, keys.transpose(1, 2).contiguous().transpose(1, 2), values, *lists)
