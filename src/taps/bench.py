"""Side-by-side benchmark: every method on the same prompts, interleaved, in one process.

Output is a records file (taps.records), one record per (dataset, prompt, method, budget,
temperature), appended and fsynced as soon as it is measured; a rerun skips finished records,
so an interrupted run resumes where it stopped. The file pins every setting that changes a
record's numbers (`file_settings`), so a rerun with another one is refused instead of taking old
records as new. Summaries are always recomputed from the raw records (taps.summary).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from importlib.metadata import version
from pathlib import Path

import torch
import transformers

from taps.assets import DTYPES, load_model
from taps.costmodel import cpu_name
from taps.cpuload import OthersCpu, is_busy
from taps.datasets import Prompt, load_prompts, spec_bench_digest
from taps.decode import default_stop_ids
from taps.drafters import drafter_kind, resolve_quant, shipped_drafter, shipped_scorer
from taps.drafters.dflash import as_transformers_assistant, read_dflash
from taps.engine import Speculator, load
from taps.linear import default_dtype, linear_in_use
from taps.methods import Method
from taps.quantize import load_dtype, quantize_linears
from taps.records import KEY_FIELDS, LLAMA_CPP_PEERS, RecordFile, Run, bench_record, portable_name, record_key
from taps.rounds import Rollout
from taps.weightonly import check_target_quant


def parse_entry(entry: str) -> tuple[str, int | None]:
    """A --methods entry: a peer name, or METHOD[:B] (taps.methods), canonically spelled."""
    name, colon, fixed = entry.partition(":")
    if name in PEERS:
        if colon:
            raise ValueError(f"{entry!r}: a budget (NAME:B) applies only to speculative methods, not to a peer")
        return name, None
    method = Method.parse(name)
    if colon and not (method.needs_draft and fixed.isdigit() and int(fixed) >= 1):
        raise ValueError(f"{entry!r}: a budget (NAME:B, B >= 1) applies only to speculative methods")
    return str(method), int(fixed) if colon else None


def _speculative(method: str) -> bool:
    return method not in PEERS and Method.parse(method).needs_draft


def _is_dflash_folder(name: str | None) -> bool:
    """Whether a drafter name is a folder of the DFlash kind: what transformers' DFlash speculation runs."""
    return name is not None and Path(name).is_dir() and getattr(drafter_kind(name), "name", None) == "dflash"


def _check_gguf(peer: str, role: str, model: str) -> None:
    """A llama.cpp peer runs packaged models' GGUF files."""
    from taps.assets import MODELS

    if model not in MODELS:
        raise ValueError(f"the {peer} peer runs a packaged model's GGUF file; the {role} {model!r} is not one "
                         f"({', '.join(MODELS)})")


def _check_llama_cpp(peer: str) -> None:
    """A llama.cpp peer needs the `llama` extra, which CI and most installs lack."""
    from importlib.util import find_spec

    if find_spec("llama_cpp") is None:
        raise ValueError(f"the {peer} peer needs llama-cpp-python: pip install 'taps-decode[llama]' "
                         "(it builds llama.cpp from source: tens of minutes on 2 cores)")


# What `probe_llama_cpp` runs in a child process: a prompt's batch, then one token, the two paths decoding takes
LLAMA_PROBE = """
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=64, n_threads=int(sys.argv[2]), verbose=False)
llm.eval(llm.tokenize(b"def add(a, b):"))
llm.eval([llm.token_eos()])
"""
# llama.cpp built for this CPU without its AMX path (docs/commands.md, "llama.cpp on a CPU with AMX")
LLAMA_NO_AMX = ("CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
                "-DGGML_BMI2=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON "
                "-DGGML_AVX512_BF16=ON' pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36")


def probe_llama_cpp(peer: str, gguf: Path, threads: int, command: Sequence[str] | None = None) -> None:
    """Decode a few tokens of `gguf` with llama.cpp in a child process (`command`: LLAMA_PROBE's), so
    that a build which crashes on this CPU is said, with its remedy, before any long work, instead of
    killing the benchmark with no message. Seen: llama-cpp-python 0.3.36 as pip builds it by default
    (natively: AMX_INT8 on a 2-core Intel Xeon with AMX) dies of SIGSEGV in its first decode there,
    the same release built without AMX runs (results/quantized-targets/xeon-amx/README.md)."""
    command = command or [sys.executable, "-c", LLAMA_PROBE, str(gguf), str(threads)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode == 0:
        return
    if done.returncode < 0:
        raise ValueError(f"the {peer} peer's llama.cpp crashed ({signal.Signals(-done.returncode).name}) decoding "
                         f"{gguf.name} on this CPU (a native build's AMX path does so on some Xeons); rebuild it "
                         f"without AMX: {LLAMA_NO_AMX}, or drop the llama.cpp peers")
    last = (done.stderr.strip().splitlines() or ["no message"])[-1]
    raise ValueError(f"the {peer} peer's llama.cpp cannot decode {gguf.name}: {last}; reinstall llama-cpp-python "
                     "(pip install --force-reinstall 'taps-decode[llama]') or drop the llama.cpp peers")


@dataclass(frozen=True)
class BenchConfig:
    target: str = "smollm2-135m"  # packaged name, local folder or hub id
    drafter: str | None = None  # drafter of the speculative methods (None: the one taps ships for the target)
    methods: tuple[str, ...] = ("ar", "chain", "ddtree", "taps")  # taps methods (NAME[+OPT][:B]) and/or PEERS
    datasets: tuple[str, ...] = ("humaneval",)  # names in taps.datasets.DATASETS
    limit: int = 10  # prompts per dataset (per category for spec-bench)
    temperatures: tuple[float, ...] = (0.0,)  # each prompt runs at each temperature
    budgets: tuple[int, ...] = (16,)  # tree budgets for speculative methods given without :B (ar and peers: none)
    max_new_tokens: int = 128  # per turn
    dtype: str | None = None  # None: taps.linear.default_dtype (bfloat16 where native, else float32); float32 is exact
    seed: int = 0  # the same sampling seed for every method on a given prompt
    spec_bench: str | None = None  # path of a Spec-Bench question.jsonl (None: the copy taps ships)
    categories: tuple[str, ...] = ()  # keep only these categories (empty = all)
    turns: int | None = None  # ask at most this many turns of multi-turn prompts (None = all)
    assistant: str = "qwen2.5-coder-0.5b"  # assistant model of the hf-assisted peer
    block_len: int | None = None  # positions a test drafter proposes (None: 15)
    profile: str | None = None  # latency profile JSON (default: the one `taps profile` saved for target/dtype)
    scorer: str | None = None  # trained TAPS edge scorer folder, "none" (default: the drafter's scorer/, else none)
    drafter_quant: str = "auto"  # "int8": the drafter and hf-assisted's assistant run int8 linear layers (taps.quantize);
    # "auto": int8 where that pays (taps.quantize.auto_scheme), resolved on creation like dtype
    rollout_steps: int = Rollout.steps  # methods with +rollout: most greedy drafter steps per round
    rollout_reach: float = Rollout.reach  # methods with +rollout: stop when the path's probability falls under it
    device: str | None = None  # where the models run (None: cpu)
    linear: str | None = None  # CPU linear kernel (taps.linear; None: $TAPS_LINEAR, else by dtype)
    target_quant: str = "none"  # the target's weights in int8/int4 (taps.weightonly); every method runs that model
    static_profile: bool = False  # keep the latency profile as measured (default: refitted from the rounds' times)

    @property
    def drafter_name(self) -> str | None:
        """The drafter the speculative methods use: --drafter, else the target's shipped one."""
        return self.drafter or shipped_drafter(self.target)

    @property
    def scorer_dir(self) -> str | None:
        """The scorer `taps` uses: --scorer, else the drafter folder's own (None: plain marginals)."""
        if self.scorer == "none":
            return None
        return self.scorer or shipped_scorer(self.drafter_name)

    @property
    def llama_peers(self) -> list[str]:
        """The llama.cpp peers (LLAMA_CPP_PEERS) among --methods, in their order."""
        return [name for name in (parse_entry(entry)[0] for entry in self.methods) if name in LLAMA_CPP_PEERS]

    @property
    def runs(self) -> list[tuple[str, int | None]]:
        """(method, budget) pairs in --methods order: "ddtree:32" runs at 32, a plain speculative
        name at every one of `budgets`, ar and the peers once with no budget."""
        pairs = []
        for entry in self.methods:
            name, fixed = parse_entry(entry)
            if not _speculative(name):
                pairs.append((name, None))
            else:
                pairs.extend((name, b) for b in ((fixed,) if fixed else self.budgets))
        return list(dict.fromkeys(pairs))

    def __post_init__(self):
        if self.dtype is None:  # resolved here, so records and the pinned settings name the dtype that ran
            object.__setattr__(self, "dtype", default_dtype(self.device))
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}")
        names = [parse_entry(entry)[0] for entry in self.methods]
        if "ar" not in names:
            raise ValueError("the methods must include ar: every speedup is measured against it")
        if any(_speculative(m) for m in names) and self.drafter_name is None:
            raise ValueError(f"taps ships no drafter for {self.target!r}: speculative methods need --drafter")
        if not self.budgets or min(self.budgets) < 1:
            raise ValueError("budgets must be >= 1")
        if self.limit < 1 or self.max_new_tokens < 1:
            raise ValueError("limit and max_new_tokens must be >= 1")
        if self.turns is not None and self.turns < 1:
            raise ValueError("turns must be >= 1")
        # resolved here, so records and the pinned settings name the precision that ran
        object.__setattr__(self, "drafter_quant", resolve_quant(self.drafter_quant, self.drafter_name,
                                                                self.device or "cpu"))
        check_target_quant(self.target_quant, self.device)
        if "hf-dflash" in names and not _is_dflash_folder(self.drafter_name):
            raise ValueError(f"the hf-dflash peer runs a DFlash drafter folder (config.json + model.safetensors) in "
                             f"transformers; {self.drafter_name!r} is not one: give one with --drafter")
        llama = self.llama_peers
        if llama:
            _check_gguf(llama[0], "target", self.target)
            if "llama-cpp-draft" in names:
                _check_gguf("llama-cpp-draft", "assistant", self.assistant)
            _check_llama_cpp(llama[0])
        Rollout(self.rollout_steps, self.rollout_reach)


LLAMA_CONTEXT = 4096  # llama.cpp's context: the longest prompt and answers of every set fit
LLAMA_DRAFT_TOKENS = 8  # tokens llama-cpp-draft's draft model proposes per round (llama.cpp's examples use 5-16)


class GreedyDraft:
    """A llama-cpp-python draft model (its `LlamaDraftModel` protocol, which `Llama` only calls, so
    no subclass is needed and llama_cpp is not imported here: the sequence so far as a numpy array ->
    the draft token ids) that is a second llama.cpp model proposing its `k` greedy
    next tokens. `Llama.generate` keeps its KV cache for the longest common prefix with the
    sequence it is given, so a round evaluates only the tokens committed since the last one: its
    cache then holds the context and its first k - 1 drafts, and the target accepted a prefix of
    those."""

    def __init__(self, llm, k: int):
        self.llm, self.k = llm, k

    def __call__(self, input_ids, /, **kwargs):
        import numpy as np

        draft = []
        for token in self.llm.generate(input_ids.tolist(), temp=0.0, reset=True):
            draft.append(token)
            if len(draft) == self.k:
                break
        return np.array(draft, dtype=np.intc)


class Session:
    """Loaded models, shared by every method of a benchmark run."""

    def __init__(self, cfg: BenchConfig):
        self.cfg = cfg
        if cfg.llama_peers:  # a llama.cpp build that crashes here is said before the models load
            from taps.assets import gguf_file

            probe_llama_cpp(cfg.llama_peers[0], gguf_file(cfg.target), torch.get_num_threads())
        speculative = [m for m, _ in cfg.runs if _speculative(m)]
        # prefix reuse off: every call prefills its whole prompt, as the peers do
        self.spec: Speculator = load(
            cfg.target, cfg.drafter_name if speculative else None, method=speculative[0] if speculative else "ar",
            dtype=cfg.dtype, device=cfg.device, profile=cfg.profile, scorer=cfg.scorer_dir or False,
            drafter_quant=cfg.drafter_quant, target_quant=cfg.target_quant, linear=cfg.linear, block_len=cfg.block_len,
            rollout=Rollout(cfg.rollout_steps, cfg.rollout_reach), reuse_prefix=False,
            adapt_profile=not cfg.static_profile,
        )
        self.target = self.spec.target
        self._assistant = None
        self._dflash_assistant = None
        self._llamas: dict = {}  # peer name -> its llama_cpp.Llama, made on first use

    def llama(self, peer: str):
        """The llama.cpp model of a LLAMA_CPP_PEERS peer: the target's packaged GGUF file, with as
        many threads as torch uses, drafting as the name says (one model per peer: llama.cpp fixes
        its draft model, and whether it keeps every position's logits, when the model is made)."""
        if peer not in self._llamas:
            from llama_cpp import Llama

            from taps.assets import gguf_file

            self._llamas[peer] = Llama(model_path=str(gguf_file(self.cfg.target)), n_ctx=LLAMA_CONTEXT,
                                       n_threads=torch.get_num_threads(), draft_model=self._llama_draft(peer),
                                       verbose=False)
        return self._llamas[peer]

    def _llama_draft(self, peer: str):
        """What drafts for a llama.cpp peer: llama-cpp-python's own prompt lookup (10 tokens, as the
        prompt-lookup peer), the --assistant's GGUF file drafting greedily, or nothing."""
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        if peer == "llama-cpp-lookup":
            return LlamaPromptLookupDecoding(num_pred_tokens=10)
        if peer == "llama-cpp-draft":
            from llama_cpp import Llama

            from taps.assets import gguf_file

            return GreedyDraft(Llama(model_path=str(gguf_file(self.cfg.assistant)), n_ctx=LLAMA_CONTEXT,
                                     n_threads=torch.get_num_threads(), verbose=False), LLAMA_DRAFT_TOKENS)
        return None

    @property
    def dflash_assistant(self):
        """The DFlash drafter folder of the speculative methods as transformers' DFlash assistant, in
        the target's dtype (the drafter reads the target's features and feeds its LM head)."""
        if self._dflash_assistant is None:
            model, _ = read_dflash(self.cfg.drafter_name)
            self._dflash_assistant = as_transformers_assistant(model.to(DTYPES[self.cfg.dtype]))
        return self._dflash_assistant

    @property
    def assistant(self):
        if self._assistant is None:
            dtype = load_dtype(self.cfg.drafter_quant, DTYPES[self.cfg.dtype])
            assistant, tok = load_model(self.cfg.assistant, dtype=dtype, linear=self.cfg.linear, device=self.cfg.device)
            if tok.get_vocab() != self.target.tokenizer.get_vocab():
                raise ValueError(f"the assistant {self.cfg.assistant} does not share the target's tokenizer")
            # the peer drafts in the same precision as taps' drafter: a fair comparison
            self._assistant = quantize_linears(assistant, self.cfg.drafter_quant)
        return self._assistant


def _conversation(session: Session, prompt: Prompt, answer: Callable[[list[int]], tuple[list[int], float, object]]) -> tuple[list[list[int]], list[str], list[float], list]:
    """Ask each turn after the model's own answers to the earlier ones (MT-Bench protocol)."""
    target = session.target
    messages, ids, texts, secs, extras = [], [], [], [], []
    for turn in prompt.turns[: session.cfg.turns]:
        messages.append({"role": "user", "content": turn})
        new, seconds, extra = answer(target.encode_chat(messages))
        text = target.tokenizer.decode(new, skip_special_tokens=True)
        messages.append({"role": "assistant", "content": text})
        ids.append(new)
        texts.append(text)
        secs.append(seconds)
        extras.append(extra)
    return ids, texts, secs, extras


def run_policy(session: Session, prompt: Prompt, method: str, budget: int | None, temperature: float, seed: int,
               max_new: int) -> Run:
    def answer(ids):
        res = session.spec.generate(ids, method=method, budget=budget, max_new_tokens=max_new,
                                    temperature=temperature, seed=seed)
        return res.token_ids, res.stats.seconds, res.stats

    ids, texts, secs, stats = _conversation(session, prompt, answer)
    stages: dict[str, float] = {}
    for s in stats:
        for k, v in s.stage_seconds.items():
            stages[k] = stages.get(k, 0.0) + v
        stages["prefill"] = stages.get("prefill", 0.0) + s.prefill_seconds
    return Run(ids, texts, secs, [s.rounds for s in stats], [a for s in stats for a in s.accepted_per_round],
               [t for s in stats for t in s.tree_sizes], stages, sum(s.copy_rounds for s in stats))


def _hf_generate(session: Session, ids: list[int], temperature: float, seed: int, max_new: int, **kwargs):
    model = session.target.model
    torch.manual_seed(seed)
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(do_sample=False)
    t0 = time.perf_counter()
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=max_new, **sampling, **kwargs)  # fmt: skip
    seconds = time.perf_counter() - t0
    return out[0, len(ids):].tolist(), seconds, None


def _hf_peer(options: Callable[[Session], dict]) -> Callable[..., Run]:
    """A peer that is transformers' own `model.generate`, called with `options(session)` besides
    the shared sampling settings of `_hf_generate` (an assistant, prompt lookup, or none)."""

    def run(session, prompt, method, budget, temperature, seed, max_new) -> Run:
        ids, texts, secs, _ = _conversation(session, prompt, lambda x: _hf_generate(
            session, x, temperature, seed, max_new, **options(session)))
        return Run(ids, texts, secs)

    return run


def _llama_peer(peer: str) -> Callable[..., Run]:
    """A peer that is llama.cpp (llama-cpp-python) decoding the packaged GGUF file itself, its
    4-bit weights as they ship, with the speculation the `peer` name asks for (`Session.llama`):
    another model than taps' dequantized one, so its output is not taps' (reported
    for speed, not exactness). It is fed the same prompt token ids and stops on the same tokens."""

    def run(session, prompt, method, budget, temperature, seed, max_new) -> Run:
        llm = session.llama(peer)
        stop = set(default_stop_ids(session.target))

        def answer(ids):
            out = []
            t0 = time.perf_counter()
            llm.set_seed(seed)
            for token in llm.generate(ids, temp=temperature, top_k=0, top_p=1.0, min_p=0.0, reset=True):
                if token in stop:
                    break
                out.append(token)
                if len(out) == max_new:
                    break
            return out, time.perf_counter() - t0, None

        ids, texts, secs, _ = _conversation(session, prompt, answer)
        return Run(ids, texts, secs)

    return run


# Peers: what users would pick instead, run through their own libraries, not re-implemented.
PEERS: dict[str, Callable[..., Run]] = {
    "hf-generate": _hf_peer(lambda s: {}),  # transformers' plain generate: the baseline users know
    "hf-assisted": _hf_peer(lambda s: {"assistant_model": s.assistant}),  # a small sibling as assistant
    "prompt-lookup": _hf_peer(lambda s: {"prompt_lookup_num_tokens": 10}),  # n-gram copy from the context
    # transformers' own DFlash speculation with the drafter of the speculative methods
    "hf-dflash": _hf_peer(lambda s: {"assistant_model": s.dflash_assistant, "speculation_type": "dflash"}),
    # llama.cpp on the packaged GGUF (4-bit weights; the `llama` extra): plain, with its prompt
    # lookup draft, and with the --assistant's GGUF drafting greedily (Session.llama)
    **{name: _llama_peer(name) for name in LLAMA_CPP_PEERS},
}


def environment(cfg: BenchConfig) -> dict:
    return {
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": cfg.dtype,
        "linear": linear_in_use(cfg.dtype, cfg.linear),
        "drafter_quant": cfg.drafter_quant,
        "target_quant": cfg.target_quant,
        "scorer": portable_name(cfg.scorer_dir),
        "seed": cfg.seed,
        "rollout": {"steps": cfg.rollout_steps, "reach": cfg.rollout_reach},
        **({"llama_cpp": llama_cpp_build()} if cfg.llama_peers else {}),
        # w4a8's kernel: torchao's (built from source) or taps' own (taps.weightonly.w4a8_kernel)
        **({"w4a8_kernel": w4a8_build()} if "w4a8" in (cfg.target_quant, cfg.drafter_quant) else {}),
    }


def w4a8_build() -> str:
    """Which kernel multiplies w4a8 here: "torchao VERSION" or "taps.vnni"."""
    from taps.weightonly import w4a8_kernel

    return f"torchao {version('torchao')}" if w4a8_kernel() == "torchao" else "taps.vnni"


def llama_cpp_build() -> str:
    """llama-cpp-python's version and the CPU features its llama.cpp was compiled with (a native
    build and a portable one differ by tens of percent on one CPU, so a record names its build)."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()  # "CPU : SSE3 = 1 | AVX2 = 1 | ... |"
    features = [part.split("=")[0].strip() for part in info.replace("CPU :", "").split("|") if part.strip().endswith("= 1")]
    return f"{llama_cpp.__version__} ({' '.join(features)})"


# BenchConfig fields that only choose which records to run: free to change between runs of a
# file. Every other field shapes a record's numbers and is pinned by `file_settings`.
SELECTION_FIELDS = ("methods", "datasets", "limit", "temperatures", "budgets", "categories")


def file_settings(cfg: BenchConfig) -> dict:
    """What a results file pins: every BenchConfig field but SELECTION_FIELDS, with the drafter and scorer
    as resolved and Spec-Bench's questions by content (not path), and the machine (CPU, linear
    kernel): sessions do not always get the same CPU, and a file's speedups compare runs of one
    machine only."""
    pinned = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in SELECTION_FIELDS}
    pinned.update(scorer=cfg.scorer_dir, spec_bench=spec_bench_digest(cfg.spec_bench), drafter=cfg.drafter_name)
    # models by portable name: a file made from one checkout resumes from another
    pinned.update({k: portable_name(pinned[k]) for k in ("target", "drafter", "scorer", "assistant", "profile")})
    if cfg.target_quant == "none":  # files written before quantized targets existed stay resumable
        del pinned["target_quant"]
    if cfg.static_profile:  # files written before the online refit ran static profiles: resumable with it
        del pinned["static_profile"]
    return {**pinned, "cpu": cpu_name(), "linear": linear_in_use(cfg.dtype, cfg.linear)}


def _in_categories(prompts: list[Prompt], categories: tuple[str, ...]) -> list[Prompt]:
    """A set's prompts in `categories`; a set with none of them (humaneval beside spec-bench's
    translation) is kept whole: categories choose within the sets that have them."""
    kept = [p for p in prompts if p.category in categories]
    return kept or prompts


def plan(cfg: BenchConfig) -> list[tuple[Prompt, float, str, int | None]]:
    """Every (prompt, temperature, method, budget) in run order: methods interleaved per prompt."""
    sets = [load_prompts(d, cfg.limit, cfg.spec_bench if d == "spec-bench" else None) for d in cfg.datasets]
    prompts = [p for ps in sets for p in _in_categories(ps, cfg.categories)]
    missing = set(cfg.categories) - {p.category for ps in sets for p in ps}
    if missing:
        raise ValueError(f"no prompts of {', '.join(cfg.datasets)} in categories {sorted(missing)}")
    runs = cfg.runs
    return [(prompt, temperature, method, budget) for prompt in prompts for temperature in cfg.temperatures
            for method, budget in runs]  # fmt: skip


def run_job(session: Session, prompt: Prompt, temperature: float, method: str, budget: int | None, max_new: int) -> Run:
    runner = PEERS.get(method, run_policy)
    return runner(session, prompt, method, budget, temperature, session.cfg.seed, max_new)


def run_bench(cfg: BenchConfig, out: Path, progress: bool = True, redo_busy: bool = False) -> list[dict]:
    """Run what is missing from `out`, append it, and return all records of this config's plan."""
    return run_side_by_side([(cfg, out)], progress, redo_busy)[0]


def run_side_by_side(benches: Sequence[tuple[BenchConfig, Path]], progress: bool = True,
                     redo_busy: bool = False) -> list[list[dict]]:
    """Several configs over the same plan (prompts, temperatures, methods), each with its own
    session and records file, interleaved job by job: e.g. two drafters of one target, whose runs
    then pair prompt by prompt under the same machine load. Per config as `run_bench`: what is
    missing from its file is run and appended; returns each config's records of its plan.
    `redo_busy`: first remove the records of runs that shared the CPU (taps.cpuload), so that
    they run again."""
    from tqdm import tqdm

    plans = [plan(cfg) for cfg, _ in benches]
    job_keys = [[(p.dataset, p.id, m, b, t) for p, t, m, b in jobs] for jobs in plans]
    if any(keys != job_keys[0] for keys in job_keys):
        raise ValueError("configs run side by side need the same prompts, temperatures, methods and budgets")
    stores = [RecordFile.open(out, file_settings(cfg), required=KEY_FIELDS) for cfg, out in benches]
    if redo_busy:
        for store in stores:
            dropped = store.drop(lambda r: is_busy(r.get("others_cpu")))
            if dropped:
                print(f"bench: {dropped} records of {store.path} ran beside other processes; running them again",
                      file=sys.stderr)
    done = [{record_key(r) for r in store.records} for store in stores]
    todo = [(i, j) for j, key in enumerate(job_keys[0]) for i in range(len(benches)) if key not in done[i]]
    if todo:
        sessions = {i: Session(benches[i][0]) for i in dict.fromkeys(i for i, _ in todo)}
        envs = {i: environment(benches[i][0]) for i in sessions}
        # warm-up: one short unrecorded run of every method (first calls pay for lazy init)
        for i, session in sessions.items():
            mine = [plans[i][j] for k, j in todo if k == i]
            for method, budget, temperature in dict.fromkeys((m, b, t) for _, t, m, b in mine):
                run_job(session, mine[0][0], temperature, method, budget, max_new=8)
        for i, j in tqdm(todo, desc="bench", unit="run", disable=not progress):
            cfg, (prompt, temperature, method, budget) = benches[i][0], plans[i][j]
            with OthersCpu() as load:
                run = run_job(sessions[i], prompt, temperature, method, budget, cfg.max_new_tokens)
            if is_busy(load.share):
                tqdm.write(f"bench: other processes used {load.share:.0%} of the CPU while {prompt.dataset}/"
                           f"{prompt.id} {method} ran, so its time is not this method's: stop them, then rerun with "
                           "--redo-busy (taps report counts such runs)", file=sys.stderr)
            stores[i].append(bench_record(
                dataset=prompt.dataset, prompt_id=prompt.id, category=prompt.category, method=method, budget=budget,
                temperature=temperature, target=cfg.target, drafter=cfg.drafter_name if _speculative(method) else None,
                run=run, peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                others_cpu=load.share, env=envs[i]))
    wanted = set(job_keys[0])
    return [[r for r in store.records if record_key(r) in wanted] for store in stores]
