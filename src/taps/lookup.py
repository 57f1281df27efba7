"""N-gram lookup (prompt lookup decoding) as an extra candidate source for the TAPS pool.

Pure: the last `n` committed tokens are searched for earlier in the context; the tokens that
followed each earlier occurrence are a candidate continuation of the current text. Code and
quoted text repeat themselves, which is where these candidates pay.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

NGRAM = 3  # tokens matched: the last NGRAM committed tokens are searched for earlier in the context


def ngram_continuations(context: Sequence[int], n: int = NGRAM, max_len: int = 8, max_paths: int = 4) -> list[list[int]]:
    """Up to `max_paths` distinct continuations (each at most `max_len` tokens, most recent
    occurrence first) that followed an earlier occurrence of the last `n` tokens of `context`.
    The last token of the context is the round's root, so a continuation starts right after it."""
    if n < 1 or max_len < 1 or max_paths < 1:
        raise ValueError("n, max_len and max_paths must be >= 1")
    if len(context) <= n:
        return []
    ids = torch.as_tensor(list(context), dtype=torch.long)  # [T]
    windows = ids[:-1].unfold(0, n, 1)  # [T - n, n]: every n-gram that has a token after it
    starts = (windows == ids[-n:]).all(dim=1).nonzero().squeeze(1).flip(0)  # most recent first
    out: list[list[int]] = []
    for s in starts.tolist():
        path = ids[s + n : s + n + max_len].tolist()
        if path not in out:
            out.append(path)
            if len(out) == max_paths:
                break
    return out
