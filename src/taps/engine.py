"""The composition root and the public API: names or loaded models -> a ready `Speculator`.

    import taps
    spec = taps.load("qwen2.5-coder-1.5b")              # its shipped drafter, method taps
    print(spec.generate("Write a quicksort in Python.").text)
    for piece in spec.stream([{"role": "user", "content": "Hi!"}]):
        print(piece, end="")

`load` is the one place that turns what a user names (a packaged model, a folder, a hub id, or
objects already loaded) into a target, a drafter, a latency profile, a scorer and a method
(docs/layout.md). The CLI, the benchmark, `taps profile`, `taps train-scorer` and the server
all build their parts here. Nothing process-wide changes on import; on load only what the
arguments say (`flush_denormal`, `keep_freed_memory`).

A `Speculator` decodes one request at a time (it owns the target's KV cache). A call whose
prompt starts with everything the previous call left in the cache (its prompt and answer,
e.g. the next turn of a chat) reuses that cache instead of prefilling it again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel

from taps.costmodel import LatencyProfile, OnlineProfile, default_profile, saved_profile
from taps.decode import DecodeConfig, GenerationResult, Round, Stats, check_drafter, generate, rounds
from taps.drafters import TEST_DRAFTERS, Drafter, load_drafter, shipped_drafter, shipped_scorer
from taps.drafters.sibling import load_sibling
from taps.methods import Method
from taps.rounds import Rollout
from taps.scorer import EdgeScorer, Scorer
from taps.target import Target
from taps.text import TextStream
from taps.verify import SamplingConfig

log = logging.getLogger("taps")
Prompt = str | Sequence[dict] | Sequence[int]  # text (chat template applied), chat messages, or token ids


def load(
    target,
    drafter=None,
    *,
    method: str = "taps",
    budget: int | None = None,
    dtype: str | None = None,
    device: str | None = None,
    tokenizer=None,
    profile: LatencyProfile | str | None = None,
    scorer: Scorer | str | bool | None = None,
    drafter_quant: str = "auto",
    target_quant: str = "none",
    linear: str | None = None,
    block_len: int | None = None,
    rollout: Rollout = Rollout(),
    flush_denormal: bool = True,
    keep_freed_memory: bool = True,
    reuse_prefix: bool = True,
    adapt_profile: bool = True,
    verbose: bool = False,
) -> Speculator:
    """A ready speculative decoder.

    target: a packaged model name (`taps models list`), a local Hugging Face folder, a hub id,
        or a loaded `transformers` causal LM (then pass its `tokenizer`).
    drafter: a drafter folder (DFlash or grown layout) or a DFlash hub id, a test drafter name
        (oracle, noisy, random), a sibling model sharing the target's tokenizer (a packaged name,
        a model folder or hub id, or a loaded `transformers` model: its own greedy path drafts,
        no training), a loaded `Drafter`, or None: the drafter taps ships for a packaged target.
    method: `NAME[+OPTION...]` (taps.methods); budget: most drafted nodes per round (None: the
        method's default). dtype: "float32" (exact) or "bfloat16" (for names, default:
        `taps.linear.default_dtype`, bfloat16 where the CPU has native kernels or on a GPU, else
        float32; a loaded model keeps its own). device: "cpu", "cuda", "mps" (default: the model's, else cpu).
    profile: a LatencyProfile or its JSON path (None: the one `taps profile` saved for this target,
        dtype and kernel, else the stated default, said at log level INFO). scorer: an edge scorer, its folder, False for
        plain marginals, None for the drafter's own (taps only).
    drafter_quant: "int8" runs a trained drafter's linear layers in int8 (CPU only); "auto" does where
        that pays (taps.quantize.auto_scheme: grown and sibling drafters on the CPU), "none" never.
    target_quant: "int8" or "int4" keeps the target's weights in that precision, "w8a8" / "w4a8" also
        rounds each activation row to int8 (taps.weightonly, CPU only; a model passed in is quantized
        in place); lossless then means equal to that quantized model's own output.
    linear: the CPU linear kernel (taps.linear: onednn-packed, onednn, torch; None: $TAPS_LINEAR,
        else onednn-packed for bfloat16 and onednn for float32 where available). flush_denormal:
        flush denormal floats to zero, process-wide (8x faster float32 decoding on x86 here; pass
        False to leave torch's setting alone). keep_freed_memory: once the models are loaded on the CPU,
        keep the memory a round frees for the next one instead of handing it back to the system
        (taps.heap: glibc's malloc thresholds, process-wide; pass False to leave them alone).
    reuse_prefix: a call whose prompt starts with what the cache holds keeps that part (a chat's
        next turn), and so does a drafter with a cache of its own (grown drafters); False: every call
        prefills its whole prompt, the drafter's pass over it included (benchmarks).
    adapt_profile: refit the profile's levels from the times the rounds themselves measure
        (taps.costmodel.OnlineProfile: medians per tree size, first rounds of a size dropped);
        False keeps the profile as measured.
    verbose: show transformers' progress bars while loading (quiet by default).
    """
    from taps.assets import DTYPES, MODELS, load_model, packaged_name
    from taps.files import check_weights
    from taps.hub import hub_snapshot, is_hub_id
    from taps.linear import default_dtype
    from taps.quantize import check_scheme, scheme_of
    from taps.weightonly import check_target_quant, quantize_weights

    parsed = Method.parse(method)
    check_scheme(drafter_quant)
    check_target_quant(target_quant, device)
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not parsed.needs_draft and drafter is not None:
        raise ValueError(f"method {parsed} uses no drafter; drop the drafter or pick a speculative method")
    # what names a file is checked before any model loads
    if isinstance(profile, (str, Path)) and not Path(profile).is_file():
        raise ValueError(f"no latency profile {profile}: give the JSON `taps profile` saved, or leave it out")
    if isinstance(scorer, (str, Path)) and not Path(scorer).is_dir():
        raise ValueError(f"no scorer folder {scorer}: give the folder `taps train-scorer` saved, or leave it out")
    known = (*TEST_DRAFTERS, *MODELS)
    if isinstance(drafter, str) and drafter not in known and not Path(drafter).expanduser().exists():
        if not is_hub_id(drafter):
            raise ValueError(f"unknown drafter {drafter!r}: not a folder, not a hub id (owner/name), not a packaged "
                             f"model or test drafter ({', '.join(known)})")
        drafter = hub_snapshot(drafter)  # a DFlash checkpoint on the hub loads unchanged
    for folder, what in ((drafter, "drafter"), (scorer, "scorer")):  # damaged weights are said before loading
        if isinstance(folder, (str, Path)) and Path(folder).expanduser().is_dir():
            check_weights(Path(folder).expanduser(), f"copy, download or train the {what} again")
    if isinstance(profile, (str, Path)):  # read now: a bad file is said before any model loads
        profile = LatencyProfile.load(profile)
    if flush_denormal:
        torch.set_flush_denormal(True)
    if isinstance(target, str):
        name = target
        dtype = dtype or default_dtype(device)
        model, tok = load_model(target, dtype=DTYPES[dtype], linear=linear, device=device, verbose=verbose)
    else:  # a loaded model: named by its packaged name when it came from taps' cache (its shipped drafter follows)
        path = getattr(target, "name_or_path", "")
        name, model, tok = (path and packaged_name(path)) or path or type(target).__name__, target, tokenizer
        if dtype is not None:
            model = model.to(DTYPES[dtype])
        if device is not None:
            model = model.to(device)
        dtype = str(model.dtype).removeprefix("torch.")
    if drafter_quant not in ("none", "auto") and model.device.type != "cpu":
        raise ValueError(f"--drafter-quant {drafter_quant} runs on the CPU only; the target is on {model.device}")
    model = quantize_weights(model, target_quant)
    tgt = Target(model, tok)
    if not parsed.needs_draft:
        drafter = None
    elif drafter is None:
        drafter = shipped_drafter(name)
        if drafter is None:
            raise ValueError(f"taps ships no drafter for {name!r}: pass a drafter (a trained drafter folder, a "
                             "hub id in DFlash layout, or a test drafter) or use method='ar'")
    folder = drafter if isinstance(drafter, str) else None
    if folder is not None:
        drafter = load_drafter(folder, tgt, block_len=block_len, quantize=drafter_quant)
    elif isinstance(drafter, PreTrainedModel):  # a sibling model, used as it is
        drafter = load_sibling(drafter, tgt, block_len=block_len)
    elif drafter is not None:
        tgt.read_features(drafter.feature_layers)
        check_drafter(tgt, drafter)
    if profile is None and isinstance(target, str):
        profile = saved_profile(name, dtype, linear, drafter_quant=scheme_of(getattr(drafter, "model", None)),
                                target_quant=target_quant)
    if profile is None:
        profile = default_profile()
        log.info("no latency profile measured for %s in %s on this machine: tree sizes use the stated default "
                 "(%s); run `taps profile --target %s --dtype %s` once for sizes fitted to it",
                 name, dtype, profile.info.note, name, dtype)
    if adapt_profile:
        profile = OnlineProfile(profile)
    if scorer is None or scorer is True:
        scorer = shipped_scorer(folder)
    if isinstance(scorer, (str, Path)):
        scorer = EdgeScorer.load(scorer)
    if keep_freed_memory and tgt.device.type == "cpu":
        from taps.heap import keep_freed_memory as keep

        keep()
    return Speculator(tgt, drafter, str(parsed), budget, profile, scorer or None, name, rollout,
                      drafter_name=folder, reuse_prefix=reuse_prefix)


class Speculator:
    """A target and its drafter, ready to decode; see `load`."""

    def __init__(self, target: Target, drafter: Drafter | None, method: str = "taps", budget: int | None = None,
                 profile: LatencyProfile | OnlineProfile | None = None, scorer: Scorer | None = None, name: str = "",
                 rollout: Rollout = Rollout(), drafter_name: str | None = None, reuse_prefix: bool = True):
        self.target, self.drafter, self.profile, self.scorer = target, drafter, profile, scorer
        self.method, self.budget, self.name, self.rollout = method, budget, name, rollout
        self.drafter_name = drafter_name  # the drafter's folder or test name as given, for records
        self.reuse_prefix = reuse_prefix
        self.last_result: GenerationResult | None = None  # of the last generate or exhausted stream

    @property
    def tokenizer(self):
        return self.target.tokenizer

    @property
    def max_positions(self) -> int:
        return self.target.max_positions

    def encode(self, prompt: Prompt, chat: bool = True) -> list[int]:
        """Text through the chat template (as it is with chat=False), messages through the chat
        template, token ids as they are."""
        if isinstance(prompt, str):
            return self.target.encode(prompt, chat=chat)
        prompt = list(prompt)
        if prompt and all(isinstance(m, dict) for m in prompt):
            return self.target.encode_chat(prompt)
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return prompt
        raise ValueError("a prompt is a string, a list of {'role', 'content'} messages, or a list of token ids")

    def config(self, *, method: str | None = None, budget: int | None = None, max_new_tokens: int = 128,
               temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
               stop_ids: Sequence[int] | None = None) -> DecodeConfig:
        """The DecodeConfig of one call: this speculator's method and budget unless given."""
        spec = Method.parse(method or self.method)
        budget = budget or self.budget
        if budget is None:  # a chain is as long as the drafter's block; trees take the method's default
            chained = spec.name == "chain" and self.drafter is not None
            budget = self.drafter.block_len if chained else spec.default_budget or 1
        return DecodeConfig(method=str(spec), budget=budget, max_new_tokens=max_new_tokens,
                            sampling=SamplingConfig(temperature, top_k, top_p), seed=seed,
                            stop_ids=None if stop_ids is None else tuple(stop_ids), rollout=self.rollout)

    def stream(self, prompt: Prompt, *, max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, seed: int = 0, stop: Sequence[str] | None = None, method: str | None = None,
               budget: int | None = None, chat: bool = True,
               on_round: Callable[[Round], None] | None = None) -> Iterator[str]:
        """Text pieces as rounds commit tokens; they concatenate to the `.text` of `generate` with the
        same arguments. Closing the iterator ends decoding at the next round; once it is exhausted,
        `last_result` holds the GenerationResult."""
        cfg = self.config(method=method, budget=budget, max_new_tokens=max_new_tokens, temperature=temperature,
                          top_p=top_p, top_k=top_k, seed=seed)
        return self._run(self.encode(prompt, chat), cfg, tuple(stop or ()), self._observed(on_round))

    def generate(self, prompt: Prompt, *, max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int = 0, stop: Sequence[str] | None = None, method: str | None = None,
                 budget: int | None = None, chat: bool = True, streamer=None,
                 on_round: Callable[[Round], None] | None = None) -> GenerationResult:
        """Decode one prompt. `stop`: strings that end the answer (cut before them, finish_reason
        "stop"); `streamer`: a transformers-style streamer (`put(token_ids)`, `end()`) fed each
        round's committed tokens; `on_round` sees every round (taps.decode.Round)."""
        cfg = self.config(method=method, budget=budget, max_new_tokens=max_new_tokens, temperature=temperature,
                          top_p=top_p, top_k=top_k, seed=seed)
        ids = self.encode(prompt, chat)
        on_round = self._observed(on_round)
        if streamer is not None:
            streamer.put(torch.tensor(ids))  # transformers' streamers skip the prompt they are given first

            def feed(r: Round, inner=on_round) -> None:
                streamer.put(torch.tensor(r.committed))
                if inner is not None:
                    inner(r)

            on_round = feed
        if stop:  # stop strings are found in the text, which only the streaming path decodes per round
            for _ in self._run(ids, cfg, tuple(stop), on_round):
                pass
        else:
            self.last_result = generate(self.target, ids, cfg, self.drafter, profile=self.profile, scorer=self.scorer,
                                        on_round=on_round, reuse_prefix=self.reuse_prefix)
        if streamer is not None:
            streamer.end()
        return self.last_result

    def _observed(self, on_round: Callable[[Round], None] | None) -> Callable[[Round], None] | None:
        """`on_round`, preceded by the profile's own observation when it learns from rounds."""
        if not isinstance(self.profile, OnlineProfile):
            return on_round
        learn = self.profile.observe
        if on_round is None:
            return learn

        def both(r: Round) -> None:
            learn(r)
            on_round(r)

        return both

    def _run(self, ids: list[int], cfg: DecodeConfig, stop: tuple[str, ...],
             on_round: Callable[[Round], None] | None) -> Iterator[str]:
        """The loop (taps.decode.rounds) with text decoded as rounds commit: pieces to yield and stop
        strings to find. Plain generation (taps.decode.generate) pays no detokenization per round."""
        proposer, select = Method.parse(cfg.method).build(self.drafter, self.profile, self.scorer, cfg.rollout)
        stats, new = Stats(), []
        detok = TextStream(self.tokenizer, stop)
        t_start = time.perf_counter()
        try:
            for r in rounds(self.target, ids, cfg, proposer, select, stats, self.reuse_prefix):
                new += r.committed
                if on_round is not None:
                    on_round(r)
                piece = detok.push(r.committed)
                if piece:
                    yield piece
                if detok.stopped:
                    stats.finish_reason = "stop"
                    break
            if rest := detok.flush():
                yield rest
        finally:
            stats.seconds = time.perf_counter() - t_start
            if detok.stopped:
                new = new[: detok.stop_tokens]
            stats.new_tokens = len(new)
            self.last_result = GenerationResult(new, detok.text, cfg.method, stats, stats.finish_reason, len(ids))
