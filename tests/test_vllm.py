"""taps' drafters inside vLLM (issue 24): greedy output through vLLM with taps' proposer, and with
a taps DFlash drafter through vLLM's own dflash method, equals vLLM's plain greedy output; the
proposer answered vLLM's real batches, empty rows included. Runs only where the vllm extra is
installed (make install-vllm), marked `vllm`:

    make test-vllm      (.venv-vllm/bin/pytest -q -m vllm tests/test_vllm.py: about 9 minutes on 2 busy cores)

taps' proposer: target Qwen2.5-Coder-0.5B in float32 (the same tokenizer as the 1.5B, whose
shipped grown drafter proposes here: output must not change whatever is proposed, and its base
is the 0.5B itself, so most drafts are accepted). Not bfloat16: there vLLM's verification of
several rows rounds otherwise than its one-row decoding, and when the shipped drafter changed
(session 40) a near-tie of the second prompt flipped within its 40 tokens; exactness is a float32
promise (docs/method.md section 10). vLLM runs in this process (engine and worker),
so the test can watch the proposer's calls; prefill is chunked (max_num_batched_tokens below the
long prompt's length) so that some rows sample nothing while others decode (ragged answers: []
beside full drafts), and one request runs to max_model_len (vLLM itself stops asking for drafts
once a batch's longest request has no room for k more tokens: GPUModelRunner._input_fits_in_drafter).

DFlash: SmolLM2-135M with its shipped DFlash drafter, exported (taps.vllm_dflash); vLLM's tau
must match taps' own chain tau on the same prompts, which a wrongly exported head would not."""

import gc

import pytest

pytest.importorskip("vllm", reason="the vllm extra is not installed (make install-vllm; docs/vllm.md)")

import taps
from taps.assets import resolve
from taps.drafters import shipped_drafter
from taps.vllm_dflash import exported_for
from taps.vllm_proposer import DRAFTER_ENV, PROPOSER, ChainProposer

pytestmark = pytest.mark.vllm

K = 7  # both shipped drafters' block: 7 drafted tokens
MAX_LEN = 192
CHUNK = 64  # tokens per engine step: the long prompt's prefill takes several steps
PROMPTS = [
    "def fibonacci(n):",
    "# Python: merge two sorted lists\n",
    "Write a function that checks whether a string is a palindrome.\n" * 8,  # > CHUNK tokens
]
CHAT = ["Write a Python function that checks whether a number is prime.",
        "Explain what a hash table is in two sentences."]


def run_vllm(model: str, prompts: list[list[int]], budgets: list[int], speculative: dict | None,
             dtype: str = "bfloat16", **engine) -> tuple[list[list[int]], dict]:
    """Greedy token ids per prompt and vLLM's spec-decode counters, from a fresh in-process engine."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=resolve(model), dtype=dtype, max_model_len=MAX_LEN, enforce_eager=True, max_num_seqs=4,
              distributed_executor_backend="uni", speculative_config=speculative, disable_log_stats=False, seed=0,
              **engine)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in budgets]
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    counters = {m.name: getattr(m, "value", getattr(m, "values", None)) for m in llm.get_metrics()
                if m.name.startswith("vllm:spec_decode")}
    del llm
    gc.collect()
    return [list(o.outputs[0].token_ids) for o in outputs], counters


@pytest.fixture(scope="module")
def engine_env():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: calls can be watched
        mp.setenv("VLLM_HOST_IP", "127.0.0.1")  # loopback only
        mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
        yield mp


@pytest.fixture(scope="module")
def runs(engine_env):
    """Plain greedy, then greedy with taps' proposer, recording what the proposer returned."""
    from transformers import AutoTokenizer

    calls: list[list[tuple[int, int, int]]] = []  # per call, per row: tokens sampled, tokens held, draft length
    original = ChainProposer.propose

    def recording(self, sampled_token_ids, num_tokens_no_spec, *args, **kwargs):
        drafts = original(self, sampled_token_ids, num_tokens_no_spec, *args, **kwargs)
        assert len(drafts) == len(sampled_token_ids)  # one draft per batch row
        calls.append([(len(s), int(n), len(d)) for s, n, d in zip(sampled_token_ids, num_tokens_no_spec, drafts)])
        return drafts

    tokenizer = AutoTokenizer.from_pretrained(resolve("qwen2.5-coder-0.5b"))
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    budgets = [40, 40, MAX_LEN - len(prompts[2])]  # the long prompt runs to max_model_len
    engine_env.setenv(DRAFTER_ENV, shipped_drafter("qwen2.5-coder-1.5b"))
    plain, _ = run_vllm("qwen2.5-coder-0.5b", prompts, budgets, None, "float32", max_num_batched_tokens=CHUNK)
    engine_env.setattr(ChainProposer, "propose", recording)
    spec, counters = run_vllm("qwen2.5-coder-0.5b", prompts, budgets,
                              {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": K},
                              "float32", max_num_batched_tokens=CHUNK)
    engine_env.setattr(ChainProposer, "propose", original)
    return plain, spec, counters, calls


def test_greedy_through_vllm_with_taps_proposer_equals_plain_greedy(runs):
    plain, spec, counters, _ = runs
    assert [len(ids) for ids in plain[:2]] == [40, 40]
    assert spec == plain
    # the drafts were used, not ignored: vLLM accepted some, first positions most
    accepted = counters["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert len(accepted) == K and counters["vllm:spec_decode_num_accepted_tokens"] > 0
    assert accepted[0] >= accepted[-1]


def test_proposer_answered_empty_and_ragged_rows(runs):
    *_, calls = runs
    assert calls, "vLLM never called taps' proposer"
    rows = [row for call in calls for row in call]
    # a row that sampled nothing (mid-prefill) gets no draft; the others K, or what fits in max_model_len
    assert all(draft == (min(K, MAX_LEN - held) if sampled else 0) for sampled, held, draft in rows)
    assert any({0, K} <= {draft for _, _, draft in call} for call in calls)  # an empty row beside a full one


def test_dflash_drafter_through_vllm_dflash_is_exact_and_accepted_as_in_taps(engine_env):
    spec = taps.load("smollm2-135m", shipped_drafter("smollm2-135m", "dflash"), method="chain", dtype="bfloat16")
    prompts = [spec.encode(p) for p in CHAT]
    rounds = tokens = 0
    for text in CHAT:
        stats = spec.generate(text, max_new_tokens=48, budget=K).stats
        rounds, tokens = rounds + stats.rounds, tokens + stats.new_tokens
    del spec
    exported = exported_for("smollm2-135m", None, "bfloat16", K)
    plain, _ = run_vllm("smollm2-135m", prompts, [48, 48], None)
    drafted, counters = run_vllm("smollm2-135m", prompts, [48, 48],
                                 {"method": "dflash", "model": str(exported), "num_speculative_tokens": K})
    assert drafted == plain
    vllm_tau = 1 + counters["vllm:spec_decode_num_accepted_tokens"] / counters["vllm:spec_decode_num_drafts"]
    assert counters["vllm:spec_decode_num_accepted_tokens"] > 0
    assert vllm_tau == pytest.approx(tokens / rounds, abs=0.1)  # taps' chain tau (1.16 here) on the same prompts
