"""Offline replay of temperature-0 decoding against the target's recorded greedy outputs.

At temperature 0 a round accepts the longest tree path that follows the target's greedy text, so
with the greedy answers of a benchmark's `ar` records the drafter and a policy can be replayed
without running the target: tau and tree sizes come out exactly as `taps bench` measures them
(the numerics of tree verification match plain decoding, tested). Time per round is modelled
from a latency profile (t_verify(n) at the round's context) plus the drafter's block pass and its
rollout steps, timed here.

    python replay.py RECORDS.jsonl --profile P.json --methods taps,taps-rollout [--limit 5] [--drafter-quant int8]
"""

import argparse
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoTokenizer

from taps.assets import model_dir
from taps.records import read_records
from taps.costmodel import LatencyProfile
from taps.datasets import load_prompts
from taps.drafters import load_drafter, shipped_drafter, shipped_scorer
from taps.lookup import ngram_continuations
from taps.policies import CandidatePath, configure_policy, get_policy
from taps.scorer import EdgeScorer


def accepted_length(tree, greedy: list[int]) -> int:
    children = tree.children()
    tokens = tree.tokens.tolist()
    node, n = 0, 0
    while n < len(greedy):
        nxt = [c for c in children[node] if tokens[c] == greedy[n]]
        if not nxt:
            break
        node, n = nxt[0], n + 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("records")
    ap.add_argument("--profile", required=True)
    ap.add_argument("--methods", default="taps,taps-rollout")
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--tag", default="")
    ap.add_argument("--dataset", default="humaneval")
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--drafter-quant", default="int8")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--reach", type=float, default=0.25)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-scorer", action="store_true", help="taps methods score edges by the plain rows")
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    target_name = "qwen2.5-coder-1.5b"
    tok = AutoTokenizer.from_pretrained(model_dir(target_name))
    # the drafter reads these two only, and tells the target to read no features
    target = SimpleNamespace(vocab_size=151936, dtype=torch.float32, read_features=lambda layers: None)
    drafter = load_drafter(shipped_drafter(target_name), target, quantize=args.drafter_quant)
    profile = LatencyProfile.load(args.profile)
    scorer_dir = shipped_scorer(shipped_drafter(target_name))
    scorer = EdgeScorer.load(scorer_dir) if scorer_dir and not args.no_scorer else None
    greedy = {r["prompt_id"]: r["token_ids"][0] for r in read_records(Path(args.records))
              if r["method"] == "ar" and r["temperature"] == 0 and r["dataset"] == args.dataset}
    prompts = [p for p in load_prompts(args.dataset, None) if p.id in greedy][: args.limit]
    rows = []
    for prompt in prompts:
        ids0 = list(tok.apply_chat_template([{"role": "user", "content": prompt.turns[0]}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False))
        for method in args.methods.split(","):
            policy = get_policy(method)
            select = configure_policy(method, profile=profile, scorer=scorer)
            out = greedy[prompt.id]
            ids, pos = list(ids0), 0
            drafter.start(ids)
            acc, sizes, steps, t_block, t_roll, t_model = [], [], [], 0.0, 0.0, 0.0
            while pos < len(out):
                remaining = args.max_new - pos
                t0 = time.perf_counter()
                m = drafter.draft(ids, None)
                t1 = time.perf_counter()
                if policy.rollout:
                    m = drafter.rollout(m, min(args.steps, remaining - 2), args.reach)
                t2 = time.perf_counter()
                n_rows = m.shape[0]
                m = m[: remaining - 1]
                extra = {"extra_paths": [CandidatePath(p) for p in ngram_continuations(ids)]} if policy.accepts_paths else {}
                if policy.reads_context:
                    extra["context"] = len(ids) - 1
                    if policy.rollout:
                        extra["draft_seconds"] = t2 - t0
                tree = select(m, ids[-1], args.budget, **extra)
                a = accepted_length(tree, out[pos:])
                a = min(a, len(out) - pos - 1)
                commit = out[pos: pos + a + 1]
                ids += commit
                pos += len(commit)
                acc.append(a)
                sizes.append(tree.n_draft)
                steps.append(max(0, n_rows - drafter.block_len) if policy.rollout else 0)
                t_block += t1 - t0
                t_roll += t2 - t1
                t_model += profile.at_context(len(ids) - 1).t_verify(tree.n_draft)
            row = dict(prompt=prompt.id, method=method, rounds=len(acc), tau=pos / len(acc),
                       tree=statistics.mean(sizes), rollout_steps=sum(steps), t_block=t_block, t_rollout=t_roll,
                       t_verify_model=t_model, tokens=pos)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
