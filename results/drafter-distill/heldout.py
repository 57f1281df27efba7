"""The held-out estimate of grown drafter folders on train-grown-mixed.sh's held-out answers.

The same 16 answers of both self-distilled files, the same anchors and the same measures
(taps.train.drafter.evaluate: loss, accuracy per slot, estimated chain tau) that the run logs
every 50 steps, for any grown drafter folder: the shipped one, trained elsewhere, reads on the
run's own scale, and a run's saved drafter/ reproduces its last logged evaluation (a check of
this script). float32, so it runs on any CPU. DATA=FILE[,FILE] and HELD_OUT=N hold out N answers
(by the same seeded split) of other files instead: answers no drafter compared has trained on, when
a run's own split may hold answers an --init-from drafter trained on.
    [DATA=F,F HELD_OUT=16] .venv/bin/python results/drafter-distill/heldout.py FOLDER [FOLDER ...]
(one JSON line each)
"""

import functools
import json
import os
import sys
from pathlib import Path

import torch

from taps.assets import load_model
from taps.drafters.grown import GROWN, GrownTrainee, read_grown
from taps.train.drafter import TrainDrafterConfig, evaluate, load_sequences, split_sequences

D = "data/drafters/qwen2.5-coder-1.5b"
DATA = tuple(os.environ.get("DATA", f"{D}/distill-vllm-bf16.jsonl,{D}/distill-vllm-chat-bf16.jsonl").split(","))
# train-grown-mixed.sh's --max-seq-len and --eval-sequences
MAX_SEQ_LEN, HELD_OUT = 512, int(os.environ.get("HELD_OUT", 16))


@functools.cache
def held_out(vocab_size: int, anchor_region: str, seed: int) -> list:
    """The run's held-out sequences (read once for all folders of one base)."""
    sequences = [s for path in DATA for s in load_sequences(path, vocab_size, MAX_SEQ_LEN, anchor_region)]
    return split_sequences(sequences, HELD_OUT, seed)[1]


for folder in sys.argv[1:]:
    spec, _ = read_grown(folder)
    cfg = TrainDrafterConfig(target="qwen2.5-coder-1.5b", data=DATA, out=folder, mask_token_id=spec.mask_token_id,
                             kind="grown", base=spec.base, block_size=spec.block_size, lora_rank=spec.lora_rank,
                             adapt=spec.adapt, anchors_per_sequence=24, max_seq_len=MAX_SEQ_LEN,
                             eval_sequences=HELD_OUT)
    model, _ = load_model(spec.base, dtype=torch.float32)
    model = model.eval().requires_grad_(False)
    sequences = held_out(model.get_output_embeddings().weight.shape[0], cfg.anchor_region, cfg.seed)
    trainee = GrownTrainee(cfg, model, [])
    GROWN.training.warm_start(trainee, Path(folder))
    print(json.dumps({"drafter": folder, **evaluate(trainee, sequences, cfg, torch.autocast("cpu", enabled=False))}),
          flush=True)
