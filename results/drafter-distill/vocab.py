"""Issue 22: a copy of a trained grown drafter whose head scores only the N most frequent token ids
of the self-distilled training files (taps.drafters.grown.set_draft_vocabulary; docs/method.md 2.3):
a cheaper draft with no retraining.

    .venv/bin/python results/drafter-distill/vocab.py DRAFTER_DIR OUT_DIR N
"""

import json
import shutil
import sys
from pathlib import Path

from taps.drafters.grown import read_grown, set_draft_vocabulary
from taps.drafters.objective import draft_vocabulary

DATA = Path(__file__).resolve().parents[2] / "data/drafters/qwen2.5-coder-1.5b"
FILES = ("distill-vllm-bf16.jsonl", "distill-vllm-chat-bf16.jsonl")


def main(drafter: str, out: str, size: int) -> None:
    sequences = [json.loads(line)["ids"] for name in FILES for line in open(DATA / name) if '"ids"' in line]
    shutil.copytree(drafter, out)
    _, info = read_grown(out)
    set_draft_vocabulary(out, draft_vocabulary(sequences, size, info["vocab_size"]))
    print(f"{out}: the {size} most frequent ids of {len(sequences)} training sequences")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
