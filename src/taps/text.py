"""Incremental detokenization with stop strings, for streaming (taps.engine).

Every round commits a few tokens; `TextStream.push` returns the new text they add. Two things
are held back until later tokens settle them: an incomplete character (byte-level tokenizers
split multi-byte characters over tokens; the decoder shows U+FFFD until the rest arrives) and a
tail of the text that may be the start of a stop string. Invariant: the pieces returned so far
are a prefix of the final text, so their concatenation is exactly `text` when the stream ends
(after `flush`, or after a stop string, which is cut off with everything after it).
"""

from __future__ import annotations

from collections.abc import Sequence


class TextStream:
    def __init__(self, tokenizer, stop: Sequence[str] = ()):
        if tokenizer is None:
            raise ValueError("text streaming needs the target's tokenizer")
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.text = ""  # what has been returned so far
        self.stopped = False  # a stop string was found; nothing more is returned
        self.stop_tokens: int | None = None  # the fewest tokens whose text contains the stop string

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _emit(self, upto: str) -> str:
        piece = upto[len(self.text):] if upto.startswith(self.text) else ""
        self.text += piece
        return piece

    def push(self, tokens: Sequence[int]) -> str:
        """The text these tokens add that is settled now (possibly "")."""
        if self.stopped:
            return ""
        before = len(self.ids)
        self.ids += list(tokens)
        full = self._decode(self.ids)
        hits = [i for i in (full.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            self.stop_tokens = next(k for k in range(before + 1, len(self.ids) + 1)
                                    if any(s in self._decode(self.ids[:k]) for s in self.stop))
            return self._emit(full[: min(hits)])
        settled = full.rstrip("\ufffd")
        hold = max((n for s in self.stop for n in range(1, len(s)) if settled.endswith(s[:n])), default=0)
        return self._emit(settled[: len(settled) - hold])

    def flush(self) -> str:
        """At the end of decoding: whatever was held back."""
        return "" if self.stopped else self._emit(self._decode(self.ids))
