"""How far each quantized target is from the model it was made from (issue 25): the 1.5B as
packaged (Q4_K_M GGUF weights dequantized, here in float32) is the reference. Every variant reads
the bfloat16 target's own greedy answers to the bench's 10 HumanEval + 10 MT-Bench turn-1 prompts
(128 tokens, `none.jsonl`'s ar records), teacher-forced, one forward per prompt; we count how often
its next-token argmax agrees with the reference's and its mean negative log-likelihood of the
answers' tokens. llama.cpp reads them too, on the GGUF file itself (its own kernels: Q4_K and Q6_K
weights, 8-bit activations).

    .venv/bin/python results/quantized-targets/xeon-amx/quality.py     # -> quality.jsonl, prints a table
    OUT=results/quantized-targets/zen5 VARIANTS=bfloat16,w8a8,w4a8-g128 .venv/bin/python ...quality.py
        # another CPU's folder (its none.jsonl, its quality.jsonl), some of the variants
Variants: float32 (the reference itself), bfloat16, w8a8, int4 (weight-only, groups of 32), w4a8
as this machine runs it, and on torchao (AMX) with groups of 128 (its default), 64 and 32. One JSON line per (variant, prompt); rerun to redo."""

import copy
import json
import os
from pathlib import Path

import torch

import taps.weightonly as weightonly
from taps.assets import gguf_file, load_model
from taps.datasets import load_prompts
from taps.target import Target

OUT = Path(os.environ.get("OUT", Path(__file__).parent)) / "quality.jsonl"
TARGET, N_NEW = "qwen2.5-coder-1.5b", 128
VARIANTS = [("bfloat16", "none", None), ("w8a8", "w8a8", None), ("int4", "int4", None),
            ("w4a8", "w4a8", None),  # on taps.vnni: groups of 32, the head in int8 (taps.weightonly)
            ("w4a8-g128", "w4a8", (128, 64, 32)), ("w4a8-g64", "w4a8", (64, 32)), ("w4a8-g32", "w4a8", (32,))]
VARIANTS = [v for v in VARIANTS if v[0] in os.environ.get("VARIANTS", v[0]).split(",")]

def prompts(target: Target) -> list[tuple[str, list[int]]]:
    return [(p.id, target.encode_chat([{"role": "user", "content": p.turns[0]}]))
            for name in ("humaneval", "mt-bench") for p in load_prompts(name, 10)]


def main() -> None:
    reference, tokenizer = load_model(TARGET, torch.float32)
    asked = prompts(Target(reference, tokenizer))
    answers = {r["prompt_id"]: r["token_ids"][0] for r in map(json.loads, OUT.with_name("none.jsonl").open())
               if r.get("method") == "ar"}
    assert all(0 < len(answers[pid]) <= N_NEW for pid, _ in asked), "none.jsonl holds the reference text"
    want = {}  # prompt -> the reference's argmax before each answer token
    records = []

    def score(variant: str, logprobs_of) -> None:
        for pid, ids in asked:
            ans = answers[pid]
            logp = logprobs_of(ids, ans)  # [len(ans), vocab] float32: the distribution before each answer token
            want.setdefault(pid, logp.argmax(-1))  # the first variant scored is the reference
            agree = (logp.argmax(-1) == want[pid]).float().mean().item()
            nll = -logp.gather(1, torch.tensor(ans)[:, None]).mean().item()
            records.append({"variant": variant, "prompt": pid, "agree": agree, "nll": nll, "tokens": len(ans)})
        sub = [r for r in records if r["variant"] == variant]
        agree, nll = (sum(r[key] for r in sub) / len(sub) for key in ("agree", "nll"))
        print(f"{variant:10s} agree {agree:.4f}  nll {nll:.4f}")

    def torch_logprobs(model):
        def run(ids, ans):
            with torch.inference_mode():
                logits = model(torch.tensor([ids + ans])).logits[0, len(ids) - 1 : -1]  # [len(ans), vocab]
            return logits.float().log_softmax(-1)
        return run

    score("float32", torch_logprobs(reference))
    for variant, scheme, groups in VARIANTS:
        model = copy.deepcopy(reference).to(torch.bfloat16)
        if groups is not None:
            weightonly.W4A8_GROUPS = groups
        score(variant, torch_logprobs(weightonly.quantize_weights(model, scheme)))
        del model

    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf_file(TARGET)), n_ctx=1024, n_threads=torch.get_num_threads(), logits_all=True,
                verbose=False)

    def llama_logprobs(ids, ans):
        llm.reset()
        llm.eval(ids + ans)
        scores = torch.tensor(llm.scores[len(ids) - 1 : len(ids) + len(ans) - 1])  # [len(ans), vocab]
        return scores.log_softmax(-1)

    score("llama.cpp", llama_logprobs)
    OUT.write_text("".join(json.dumps(r) + "\n" for r in records))


if __name__ == "__main__":
    main()
