"""Offline replay of temperature-0 decoding against the target's recorded greedy outputs.

At temperature 0 a round accepts the longest tree path that follows the target's greedy text, so
with the greedy answers of a benchmark's `ar` records the drafter and a policy can be replayed
without running the target: tau and tree sizes come out exactly as `taps bench` measures them
(the numerics of tree verification match plain decoding, tested). The replay is the round loop
itself (taps.decode.generate) over a `RecordedTarget` whose logits at every tree node point to
the recorded next token; time per round is modelled from a latency profile (t_verify(n) at the
round's context) plus the drafter's own time, which the loop measures.

    python replay.py RECORDS.jsonl --profile P.json --methods taps,taps+rollout [--limit 5] [--drafter-quant int8]
"""

import argparse
import json
import statistics
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoTokenizer

from taps.assets import model_dir
from taps.costmodel import LatencyProfile
from taps.datasets import load_prompts
from taps.decode import DecodeConfig, generate
from taps.drafters import load_drafter, shipped_drafter, shipped_scorer
from taps.records import read_records
from taps.rounds import Rollout
from taps.scorer import EdgeScorer
from taps.target import TreeOutput

VOCAB = 151936  # Qwen2.5's output rows


class RecordedTarget:
    """The Target interface over a recorded greedy answer: the target's token at a node of depth d
    is the answer's token d places after the root. Nodes off the recorded path are never walked
    past (their parent's token differs), so their rows do not matter."""

    vocab_size, feature_layers, tokenizer, device = VOCAB, (), None, torch.device("cpu")
    dtype = torch.float32

    def __init__(self, prompt: list[int], answer: list[int]):
        self.text, self.max_positions = prompt + answer, len(prompt) + len(answer)
        self.n_cached = 0

    def read_features(self, layers) -> None:
        pass

    def prefill(self, ids, reuse: bool = False):
        self.n_cached = len(ids)

    def forward_tree(self, tree) -> TreeOutput:
        at = self.n_cached + 1 + tree.depths  # [n_nodes] position of the token after each node
        logits = torch.zeros(tree.n_nodes, VOCAB)
        logits[torch.arange(tree.n_nodes), torch.tensor(self.text + [0])[at.clamp(max=len(self.text))]] = 1.0
        return TreeOutput(logits, None)

    def commit(self, keep, n_nodes: int) -> None:
        self.n_cached += len(keep)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("records")
    ap.add_argument("--profile", required=True)
    ap.add_argument("--methods", default="taps,taps+rollout")
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--dataset", default="humaneval")
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--drafter-quant", default="int8")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--reach", type=float, default=0.25)
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-scorer", action="store_true", help="taps methods score edges by the plain rows")
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    target_name = "qwen2.5-coder-1.5b"
    tok = AutoTokenizer.from_pretrained(model_dir(target_name))
    # the drafter reads these two only, and tells the target to read no features
    stand_in = SimpleNamespace(vocab_size=VOCAB, dtype=torch.float32, read_features=lambda layers: None)
    drafter = load_drafter(shipped_drafter(target_name), stand_in, quantize=args.drafter_quant)
    profile = LatencyProfile.load(args.profile)
    scorer_dir = shipped_scorer(shipped_drafter(target_name))
    scorer = EdgeScorer.load(scorer_dir) if scorer_dir and not args.no_scorer else None
    greedy = {r["prompt_id"]: r["token_ids"][0] for r in read_records(Path(args.records))
              if r["method"] == "ar" and r["temperature"] == 0 and r["dataset"] == args.dataset}
    prompts = [p for p in load_prompts(args.dataset, None) if p.id in greedy][: args.limit]
    rows = []
    for prompt in prompts:
        ids = list(tok.apply_chat_template([{"role": "user", "content": prompt.turns[0]}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False))
        answer = greedy[prompt.id]
        for method in args.methods.split(","):
            modelled = []  # t_verify of each round's tree at its context, from the profile
            cfg = DecodeConfig(method, budget=args.budget, max_new_tokens=len(answer), stop_ids=(),
                               rollout=Rollout(args.steps, args.reach))
            res = generate(RecordedTarget(ids, answer), ids, cfg, drafter, profile=profile, scorer=scorer,
                           on_round=lambda r: modelled.append(profile.at_context(r.proposal.context if r.proposal
                                                              else None).t_verify(r.tree.n_draft)))
            assert res.token_ids == answer, "the replay must reproduce the recorded answer"
            s = res.stats
            rows.append(dict(prompt=prompt.id, method=method, rounds=s.rounds, tau=s.tau,
                             tree=statistics.mean(s.tree_sizes), t_draft=s.stage_seconds["draft"],
                             t_verify_model=sum(modelled), tokens=s.new_tokens))
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
