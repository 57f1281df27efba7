"""Side-by-side benchmark: every method on the same prompts, interleaved, in one process.

Output is JSONL, one record per (dataset, prompt, method, budget, temperature), appended and
fsynced as soon as it is measured; a rerun skips finished records, so an interrupted run
resumes where it stopped. Summaries are always recomputed from the raw records.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import torch
import transformers

from taps.assets import DTYPES, load_model
from taps.datasets import Prompt, load_prompts
from taps.decode import DecodeConfig, check_rollout, generate
from taps.drafters import load_drafter, shipped_scorer
from taps.costmodel import LatencyProfile, cpu_name, saved_profile
from taps.linear import linear_in_use
from taps.policies import POLICIES, configure_policy
from taps.quantize import check_scheme, load_dtype, quantize_linears
from taps.scorer import EdgeScorer
from taps.target import Target
from taps.verify import SamplingConfig

KEY_FIELDS = ("dataset", "prompt_id", "method", "budget", "temperature")


def _speculative(method: str) -> bool:
    return method in POLICIES and POLICIES[method].needs_draft


@dataclass(frozen=True)
class BenchConfig:
    target: str = "smollm2-135m"  # packaged name, local folder or hub id
    drafter: str | None = None  # drafter for the speculative methods
    methods: tuple[str, ...] = ("ar", "chain", "ddtree", "taps")  # taps policies and/or peers (PEERS); "name:B" fixes B's budget
    datasets: tuple[str, ...] = ("humaneval",)  # names in taps.datasets.DATASETS
    limit: int = 10  # prompts per dataset (per category for spec-bench)
    temperatures: tuple[float, ...] = (0.0,)  # each prompt runs at each temperature
    budgets: tuple[int, ...] = (16,)  # tree budgets for speculative methods (ar and peers ignore them)
    max_new_tokens: int = 128  # per turn
    dtype: str = "bfloat16"  # bfloat16 is the speed dtype on CPU; float32 for exactness
    seed: int = 0  # the same sampling seed for every method on a given prompt
    spec_bench: str | None = None  # path of Spec-Bench's question.jsonl (for dataset spec-bench)
    categories: tuple[str, ...] = ()  # keep only these categories (empty = all)
    turns: int | None = None  # ask at most this many turns of multi-turn prompts (None = all)
    assistant: str = "qwen2.5-coder-0.5b"  # assistant model of the hf-assisted peer
    block_len: int | None = None  # positions a test drafter proposes (None: 15)
    profile: str | None = None  # latency profile JSON (default: the one `taps profile` saved for target/dtype)
    scorer: str | None = None  # trained TAPS edge scorer folder (default: the drafter's scorer/, else plain marginals)
    lookup: bool = True  # taps: n-gram lookup candidates join the pool
    drafter_quant: str = "none"  # "int8": the drafter and hf-assisted's assistant run int8 linear layers (taps.quantize)
    rollout_steps: int = DecodeConfig.rollout_steps  # rollout methods: most greedy drafter steps per round
    rollout_reach: float = DecodeConfig.rollout_reach  # rollout methods: stop when the path's probability falls under it

    @property
    def scorer_dir(self) -> str | None:
        """The scorer `taps` uses: --scorer, else the drafter folder's own (None: plain marginals)."""
        return self.scorer or shipped_scorer(self.drafter)

    @property
    def runs(self) -> list[tuple[str, int | None]]:
        """(method, budget) pairs in --methods order: "ddtree:32" runs at 32, a plain speculative
        name at every one of `budgets`, ar and the peers once with no budget."""
        pairs = []
        for entry in self.methods:
            name, _, fixed = entry.partition(":")
            if not _speculative(name):
                pairs.append((name, None))
            else:
                pairs.extend((name, b) for b in ((int(fixed),) if fixed else self.budgets))
        return list(dict.fromkeys(pairs))

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}")
        names = []
        for entry in self.methods:
            name, colon, fixed = entry.partition(":")
            if name not in POLICIES and name not in PEERS:
                raise ValueError(f"unknown method {name!r}; choose from {', '.join([*POLICIES, *PEERS])}")
            if colon and not (_speculative(name) and fixed.isdigit() and int(fixed) >= 1):
                raise ValueError(f"{entry!r}: a budget (name:B, B >= 1) applies only to speculative methods"
                                 f" ({', '.join(m for m in POLICIES if _speculative(m))})")
            names.append(name)
        if "ar" not in names:
            raise ValueError("the methods must include ar: every speedup is measured against it")
        if any(_speculative(m) for m in names) and self.drafter is None:
            raise ValueError("speculative methods need a drafter (--drafter)")
        if not self.budgets or min(self.budgets) < 1:
            raise ValueError("budgets must be >= 1")
        if self.limit < 1 or self.max_new_tokens < 1:
            raise ValueError("limit and max_new_tokens must be >= 1")
        if self.turns is not None and self.turns < 1:
            raise ValueError("turns must be >= 1")
        check_scheme(self.drafter_quant)
        check_rollout(self.rollout_steps, self.rollout_reach)


@dataclass
class Run:
    """What one method produced for one prompt (all turns)."""

    token_ids: list[list[int]]  # generated ids per turn
    texts: list[str]  # decoded answer per turn
    seconds: list[float]  # wall time per turn
    rounds: list[int] | None = None  # target forwards per turn (None for peers that do not expose them)
    accepted_per_round: list[int] = field(default_factory=list)
    tree_sizes: list[int] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    copy_rounds: int = 0  # rounds that verified an n-gram continuation without calling the drafter (taps.copying)


class Session:
    """Loaded models, shared by every method of a benchmark run."""

    def __init__(self, cfg: BenchConfig):
        self.cfg = cfg
        model, tokenizer = load_model(cfg.target, dtype=DTYPES[cfg.dtype])
        self.target = Target(model, tokenizer)
        self.drafter = (load_drafter(cfg.drafter, self.target, block_len=cfg.block_len, quantize=cfg.drafter_quant)
                        if cfg.drafter else None)  # fmt: skip
        self.profile = LatencyProfile.load(cfg.profile) if cfg.profile else saved_profile(cfg.target, cfg.dtype,
                                                                                          drafter_quant=cfg.drafter_quant)
        scorer_dir = cfg.scorer_dir
        scorer = EdgeScorer.load(scorer_dir) if scorer_dir else None
        self.selectors = {m: configure_policy(m, profile=self.profile, scorer=scorer) for m, _ in cfg.runs if m in POLICIES}
        self._assistant = None

    @property
    def assistant(self):
        if self._assistant is None:
            dtype = load_dtype(self.cfg.drafter_quant, DTYPES[self.cfg.dtype])
            assistant, tok = load_model(self.cfg.assistant, dtype=dtype)
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


def run_policy(session: Session, prompt: Prompt, method: str, budget: int | None, temperature: float, seed: int, max_new: int) -> Run:
    cfg = DecodeConfig(method=method, budget=budget or 1, max_new_tokens=max_new,
                       sampling=SamplingConfig(temperature), seed=seed, lookup=session.cfg.lookup,
                       rollout_steps=session.cfg.rollout_steps, rollout_reach=session.cfg.rollout_reach)  # fmt: skip

    def answer(ids):
        res = generate(session.target, ids, cfg, session.drafter, session.selectors[method], session.profile)
        return res.token_ids, res.stats.seconds, res.stats

    ids, texts, secs, stats = _conversation(session, prompt, answer)
    stages: dict[str, float] = {}
    for s in stats:
        for k, v in s.stage_seconds.items():
            stages[k] = stages.get(k, 0.0) + v
        stages["prefill"] = stages.get("prefill", 0.0) + s.prefill_seconds
    return Run(ids, texts, secs, [s.rounds for s in stats],
               [a for s in stats for a in s.accepted_per_round], [t for s in stats for t in s.tree_sizes], stages,
               sum(s.copy_rounds for s in stats))  # fmt: skip


def _hf_generate(session: Session, ids: list[int], temperature: float, seed: int, max_new: int, **kwargs):
    model = session.target.model
    torch.manual_seed(seed)
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(do_sample=False)
    t0 = time.perf_counter()
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=max_new, **sampling, **kwargs)  # fmt: skip
    seconds = time.perf_counter() - t0
    return out[0, len(ids):].tolist(), seconds, None


def run_hf_assisted(session, prompt, method, budget, temperature, seed, max_new) -> Run:
    ids, texts, secs, _ = _conversation(session, prompt, lambda x: _hf_generate(
        session, x, temperature, seed, max_new, assistant_model=session.assistant))
    return Run(ids, texts, secs)


def run_prompt_lookup(session, prompt, method, budget, temperature, seed, max_new) -> Run:
    ids, texts, secs, _ = _conversation(session, prompt, lambda x: _hf_generate(
        session, x, temperature, seed, max_new, prompt_lookup_num_tokens=10))
    return Run(ids, texts, secs)


# Peers: what users would pick instead, run through transformers itself, not re-implemented.
PEERS: dict[str, Callable[..., Run]] = {
    "hf-assisted": run_hf_assisted,  # assisted generation with a small sibling as assistant
    "prompt-lookup": run_prompt_lookup,  # prompt lookup decoding (n-gram copy from the context)
}


def environment(cfg: BenchConfig) -> dict:
    return {
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": cfg.dtype,
        "linear": linear_in_use(cfg.dtype),
        "drafter_quant": cfg.drafter_quant,
        "scorer": cfg.scorer_dir,
        "seed": cfg.seed,
        "rollout": {"steps": cfg.rollout_steps, "reach": cfg.rollout_reach},
    }


def read_records(path: Path) -> list[dict]:
    """Every complete record of a results file; a torn last line (interrupted write) is dropped."""
    if not path.exists():
        return []
    records = []
    for line in path.read_bytes().splitlines():  # bytes: a line that is not UTF-8 fails alone, in json.loads
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and all(k in rec for k in KEY_FIELDS):
            records.append(rec)
    return records


# env fields one results file must not mix (record keys do not hold them), with the value of records
# written before the field existed (None: not compared). The machine is one of them: sessions do not
# always get the same CPU, and a file's speedups compare runs of one machine only.
SETUP_FIELDS = {"dtype": None, "drafter_quant": "none", "cpu": None, "linear": None}


def check_same_setup(records: list[dict], env: dict, out: Path) -> None:
    """Refuse to add runs of another dtype, drafter precision, CPU or linear kernel to a file: a
    rerun would take its records as done, and the summaries would mix two setups."""
    for name, default in SETUP_FIELDS.items():
        seen = {r.get("env", {}).get(name, default) for r in records} - {None}
        if seen - {env[name]}:
            raise ValueError(f"{out} holds runs with {name} {', '.join(sorted(map(str, seen)))}, this run has "
                             f"{env[name]}: write to another --out")


def record_key(rec: dict) -> tuple:
    return tuple(rec[k] for k in KEY_FIELDS)


def append_record(path: Path, rec: dict) -> None:
    """Append one record durably. A torn tail from an earlier crash is ended with a newline first
    (read_records skips it), so the new record always starts on its own line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
        f.write((json.dumps(rec) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())


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


def run_bench(cfg: BenchConfig, out: Path, progress: bool = True) -> list[dict]:
    """Run what is missing from `out`, append it, and return all records of this config's plan."""
    from tqdm import tqdm

    jobs = plan(cfg)
    existing = read_records(out)
    check_same_setup(existing, environment(cfg), out)
    done = {record_key(r) for r in existing}
    todo = [j for j in jobs if (j[0].dataset, j[0].id, j[2], j[3], j[1]) not in done]
    if todo:
        session = Session(cfg)
        env = environment(cfg)
        # warm-up: one short unrecorded run of every method (first calls pay for lazy init)
        for method, budget, temperature in dict.fromkeys((j[2], j[3], j[1]) for j in todo):
            run_job(session, todo[0][0], temperature, method, budget, max_new=8)
        for prompt, temperature, method, budget in tqdm(todo, desc="bench", unit="run", disable=not progress):
            run = run_job(session, prompt, temperature, method, budget, cfg.max_new_tokens)
            rec = {
                "dataset": prompt.dataset, "prompt_id": prompt.id, "category": prompt.category,
                "method": method, "budget": budget, "temperature": temperature,
                "target": cfg.target, "drafter": cfg.drafter if method in POLICIES and POLICIES[method].needs_draft else None,
                **asdict(run),
                "new_tokens": sum(len(t) for t in run.token_ids), "total_seconds": sum(run.seconds),
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "env": env,
            }  # fmt: skip
            append_record(out, rec)
    wanted = {(j[0].dataset, j[0].id, j[2], j[3], j[1]) for j in jobs}
    return [r for r in read_records(out) if record_key(r) in wanted]


def group_label(rec: dict) -> str:
    # Spec-Bench reports per category
    return f"spec-bench/{rec['category']}" if rec["dataset"] == "spec-bench" else rec["dataset"]


def tokens_per_second(rec: dict) -> float | None:
    """A record's new tokens over its wall seconds (all turns); None for a run that took no time."""
    return rec["new_tokens"] / rec["total_seconds"] if rec["total_seconds"] > 0 else None


def summarize(records: Iterable[dict]) -> list[dict]:
    """Per (method, dataset, budget, temperature): tau, median tokens/s, median paired speedup
    over ar on the same prompts, mean verified tree size, and the share of outputs equal to ar's."""
    records = list(records)
    ar = {(r["dataset"], r["prompt_id"], r["temperature"]): r for r in records if r["method"] == "ar"}
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["method"], group_label(r), r["budget"], r["temperature"]), []).append(r)
    rows = []
    for (method, dataset, budget, temperature), recs in groups.items():
        tps = [v for v in map(tokens_per_second, recs) if v is not None]
        pairs = [(r, ar.get((r["dataset"], r["prompt_id"], r["temperature"]))) for r in recs]
        pairs = [(r, a) for r, a in pairs if a is not None and tokens_per_second(a) and tokens_per_second(r) is not None]
        speedups = [tokens_per_second(r) / tokens_per_second(a) for r, a in pairs]
        rounds = [sum(r["rounds"]) for r in recs if r["rounds"] is not None]
        tau = sum(r["new_tokens"] for r in recs) / sum(rounds) if rounds and len(rounds) == len(recs) else None
        sizes = [s for r in recs for s in r["tree_sizes"]]
        rows.append({
            "method": method, "dataset": dataset, "budget": budget, "temperature": temperature,
            "prompts": len(recs),
            "tau": tau,
            "tokens_per_second": statistics.median(tps) if tps else None,
            "speedup_vs_ar": statistics.median(speedups) if speedups else None,
            "mean_tree_size": sum(sizes) / len(sizes) if sizes else None,
            "match_rate_vs_ar": sum(r["token_ids"] == a["token_ids"] for r, a in pairs) / len(pairs) if pairs else None,
        })  # fmt: skip
    order = {m: i for i, m in enumerate(dict.fromkeys(r["method"] for r in records))}
    rows.sort(key=lambda x: (x["dataset"], x["temperature"], order[x["method"]], x["budget"] or 0))
    return rows


def format_table(rows: list[dict]) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    head = f"{'dataset':26s} {'T':>4s} {'method':14s} {'budget':>6s} {'n':>3s} {'tau':>6s} {'tok/s':>7s} {'speedup':>8s} {'tree':>6s} {'=ar':>5s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['dataset']:26s} {r['temperature']:4.1f} {r['method']:14s} {f(r['budget'], 'd'):>6s} {r['prompts']:3d} "
            f"{f(r['tau'], '.2f'):>6s} {f(r['tokens_per_second'], '.2f'):>7s} {f(r['speedup_vs_ar'], '.2f'):>8s} "
            f"{f(r['mean_tree_size'], '.1f'):>6s} {f(r['match_rate_vs_ar'], '.2f'):>5s}"
        )
    return "\n".join(lines)


def _question_order(rec: dict) -> tuple:
    # Spec-Bench's ids are integers; every other set's are strings ("HumanEval/3")
    pid = str(rec["prompt_id"])
    return (0, int(pid), "") if pid.isdigit() else (1, 0, pid)


def write_spec_bench_answers(records: Iterable[dict], folder: Path) -> list[Path]:
    """Answer files in Spec-Bench's format, `folder/<dataset>/<method>[-b<budget>]-t<T>.jsonl`, so
    its evaluation/speed.py and equal.py run on our output. One folder per dataset because speed.py
    selects rows by category (HumanEval's "coding" would count as MT-Bench's), and rows sorted by
    question because equal.py compares two files line by line."""
    files: dict[tuple[str, str], list[dict]] = {}
    for r in sorted(records, key=_question_order):
        model_id = f"{r['method']}" + (f"-b{r['budget']}" if r["budget"] else "") + f"-t{r['temperature']}"
        files.setdefault((r["dataset"], model_id), []).append({
            "question_id": int(r["prompt_id"]) if str(r["prompt_id"]).isdigit() else r["prompt_id"],
            "category": r["category"],
            "answer_id": f"{model_id}-{r['prompt_id']}",
            "model_id": model_id,
            "choices": [{
                "index": 0,
                "turns": r["texts"],
                "new_tokens": [len(t) for t in r["token_ids"]],
                "wall_time": r["seconds"],
                "decoding_steps": [len(t) for t in r["token_ids"]] if r["rounds"] is None else r["rounds"],
                "accept_lengths": [a + 1 for a in r["accepted_per_round"]],
            }],
        })  # fmt: skip
    paths = []
    for (dataset, model_id), rows in files.items():
        path = folder / dataset / f"{model_id}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        paths.append(path)
    return paths
