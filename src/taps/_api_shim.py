"""TEMPORARY stand-in for the public API of issue 19 (`taps.load`), so that taps.serve can be
built and tested before that API lands. The lead replaces this module at merge; nothing but
`taps.load` (in taps/__init__.py) may import it.

It implements exactly the agreed contract on the existing pieces (taps.decode.generate,
taps.assets.load_model, taps.target.Target, taps.drafters).
"""

from __future__ import annotations

import math
import queue
import threading
from dataclasses import dataclass
from typing import Iterator

from taps.assets import DTYPES, load_model
from taps.decode import DecodeConfig, GenerationResult as _Decoded, Stats, default_stop_ids, generate as _generate
from taps.drafters import default_drafter, default_scorer, drafter_feature_layers, make_drafter
from taps.policies import configure_policy, get_policy
from taps.target import Target
from taps.verify import SamplingConfig


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop", "length" or "context"
    prompt_tokens: int
    stats: Stats


class Speculator:
    def __init__(self, name: str, drafter: str | None, method: str, budget: int | None, dtype: str | None):
        from taps.costmodel import saved_profile
        from taps.scorer import EdgeScorer

        dtype = dtype or "bfloat16"
        policy = get_policy(method)
        self.name, self.method, self.budget = name, method, budget or 16
        drafter = (drafter or default_drafter(name)) if policy.needs_draft else None
        if policy.needs_draft and drafter is None:
            raise ValueError(f"taps ships no drafter for {name!r}: pass drafter=")
        model, self.tokenizer = load_model(name, DTYPES[dtype])
        self.target = Target(model, self.tokenizer, drafter_feature_layers(drafter) if drafter else ())
        self.drafter = make_drafter(drafter, self.target) if drafter else None
        self.profile = saved_profile(name, dtype)
        scorer_dir = default_scorer(drafter)
        self.select = configure_policy(method, profile=self.profile,
                                       scorer=EdgeScorer.load(scorer_dir) if scorer_dir else None)
        self.max_positions = self.target.max_positions
        self.last_result: GenerationResult | None = None

    def encode(self, prompt_or_messages) -> list[int]:
        if isinstance(prompt_or_messages, str):
            return self.target.encode(prompt_or_messages, chat=False)
        return self.target.encode_chat(list(prompt_or_messages))

    def generate(self, prompt_or_messages, *, max_new_tokens: int = 128, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int = 0, stop=None) -> GenerationResult:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
        ids = self.encode(prompt_or_messages)
        cfg = DecodeConfig(method=self.method, budget=self.budget, max_new_tokens=max_new_tokens,
                           sampling=SamplingConfig(temperature, top_k, top_p), seed=seed)
        out: _Decoded = _generate(self.target, ids, cfg, self.drafter, self.select, self.profile)
        tokens, text = out.token_ids, out.text
        if tokens and tokens[-1] in default_stop_ids(self.target):
            reason = "stop"
        elif len(tokens) >= max_new_tokens:
            reason = "length"
        else:
            reason = "context"
        cuts = [text.find(s) for s in (stop or []) if s and s in text]
        if cuts:
            text, reason = text[: min(cuts)], "stop"
            while tokens and len(self.tokenizer.decode(tokens[:-1], skip_special_tokens=True)) >= len(text):
                tokens = tokens[:-1]
        return GenerationResult(text, tokens, reason, len(ids), out.stats)

    def stream(self, prompt_or_messages, **kwargs) -> Iterator[str]:
        """Pieces as rounds commit tokens: `generate` runs in a thread whose target reports each
        round's tokens; closing this generator stops that thread at its next round."""
        events: queue.Queue = queue.Queue()
        cancel = threading.Event()
        tokens: list[int] = []
        rounds = {"n": 0, "tree": None}
        target, stops = self.target, [s for s in (kwargs.get("stop") or []) if s]
        ends = set(default_stop_ids(target))

        def forward_tree(tree):
            if cancel.is_set():
                raise _Cancelled
            if rounds["n"]:  # the root is the previous round's bonus token
                tokens.append(int(tree.tokens[0]))
            rounds["n"] += 1
            rounds["tree"] = tree
            return Target.forward_tree(target, tree)

        def commit(keep, n_nodes):
            Target.commit(target, keep, n_nodes)
            for tok in rounds["tree"].tokens[list(keep)[1:]].tolist():
                if tokens and tokens[-1] in ends:  # the cache may keep accepted tokens past a stop token
                    break
                tokens.append(tok)
            events.put(("tokens", list(tokens)))

        def run():
            try:
                events.put(("done", self.generate(prompt_or_messages, **kwargs)))
            except _Cancelled:
                events.put(("cancelled", None))
            except BaseException as error:  # re-raised in the caller's thread
                events.put(("error", error))

        target.forward_tree, target.commit = forward_tree, commit
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        sent = 0
        try:
            while True:
                kind, value = events.get()
                if kind == "tokens":
                    text = self.tokenizer.decode(value, skip_special_tokens=True).rstrip("\ufffd")
                    cuts = [text.find(s) for s in stops if s in text]
                    safe = min(cuts + [len(text) - max((len(s) - 1 for s in stops), default=0)])
                    if safe > sent:
                        yield text[sent:safe]
                        sent = safe
                elif kind == "done":
                    if sent < len(value.text):
                        yield value.text[sent:]
                    self.last_result = value
                    return
                elif kind == "error":
                    raise value
                else:
                    return
        finally:
            cancel.set()
            worker.join()
            del target.forward_tree, target.commit


class _Cancelled(Exception):
    pass


def load(target, drafter=None, *, method="taps", budget=None, dtype=None, device=None) -> Speculator:
    if device not in (None, "cpu"):
        raise ValueError(f"the temporary API shim runs on the CPU only, got device={device!r}")
    return Speculator(target, drafter, method, budget, dtype)
