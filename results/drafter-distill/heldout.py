"""The held-out estimate of grown drafter folders on train-grown-mixed.sh's held-out answers.

The same 16 answers of both self-distilled files, the same anchors and the same measures
(taps.train.drafter.evaluate: loss, accuracy per slot, estimated chain tau) that the run logs
every 50 steps, for any grown drafter folder: the shipped one, trained elsewhere, reads on the
run's own scale, and a run's saved drafter/ reproduces its last logged evaluation (a check of
this script). float32, so it runs on any CPU.
    .venv/bin/python results/drafter-distill/heldout.py FOLDER [FOLDER ...]   (one JSON line each)
"""

import functools
import json
import sys

import torch
from peft import set_peft_model_state_dict
from safetensors.torch import load_file

from taps.assets import load_model
from taps.drafters.grown import GrownTrainee, read_grown
from taps.train.drafter import TrainDrafterConfig, evaluate, load_sequences, split_sequences

D = "data/drafters/qwen2.5-coder-1.5b"
DATA = (f"{D}/distill-vllm-bf16.jsonl", f"{D}/distill-vllm-chat-bf16.jsonl")
MAX_SEQ_LEN, HELD_OUT = 512, 16  # train-grown-mixed.sh's --max-seq-len and --eval-sequences


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
    loaded = set_peft_model_state_dict(trainee.module, load_file(f"{folder}/adapter_model.safetensors"))
    if loaded.unexpected_keys:
        sys.exit(f"heldout.py: {folder}'s adapters do not fit the drafter: {loaded.unexpected_keys[:3]}")
    print(json.dumps({"drafter": folder, **evaluate(trainee, sequences, cfg, torch.autocast("cpu", enabled=False))}),
          flush=True)
