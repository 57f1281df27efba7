"""Second turns for the drafter's training data: a conversation's first turn (a training prompt and
the target's own answer to it, from a file `taps gen-data` made) continued with a follow-up
request, which the target then answers (`taps gen-data --follow-up FILE`).

Why: at inference a chat's later turns draft after a whole conversation, the target's earlier
answers included (MT-Bench's second turns: "now rewrite it as ...", "add tests", "make it
shorter"), while single-turn data only ever shows the drafter a user turn before the answer.
The first answer goes back as text through the chat template, as a client sends a conversation
(its ids may differ from the ids the target generated: that is what a second turn sees too).

Follow-up i continues the first file's record of prompt index i (so a file of N first turns gives
up to N follow-ups, and more first turns later give more follow-ups: prefix-stable in i); its
request is drawn by Random(f"{seed}:follow-up:{i}"), from CODE_REQUESTS when the first answer holds
a fenced code block (with probability CODE_SHARE), else from GENERAL_REQUESTS. The requests are
this module's own wording, generic enough for any first turn; none is an evaluation prompt
(taps.train.overlap checks every user turn).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from taps.train.prompts import TrainingPrompt

SOURCE = "follow-up"
CODE_SHARE = 0.7  # a first answer with code: share of code requests among its follow-ups
GENERAL_REQUESTS = (
    "Can you make that shorter? Keep only what matters most.",
    "Please rewrite your answer as a bulleted list.",
    "Explain the most important point of your answer in more detail.",
    "Give a concrete example that illustrates your answer.",
    "What are the limitations of what you said, or the cases where it does not hold?",
    "Now explain the same thing to a ten-year-old.",
    "Summarize your previous answer in one sentence.",
    "Rewrite your answer in a more formal tone, as for a report.",
    "Rewrite your answer in a friendly, casual tone.",
    "Turn your answer into a numbered step-by-step guide.",
    "What would someone who disagrees with you say, and how would you answer them?",
    "Which part of your answer are you least sure about, and why?",
    "Translate your previous answer into German.",
    "Add a short conclusion with the key takeaway.",
    "Thanks. Can you give me three follow-up questions I should think about?",
)
CODE_REQUESTS = (
    "Add type hints and a docstring to the code.",
    "Write pytest unit tests for this code.",
    "Can you make the code faster? Explain what you changed.",
    "Add error handling for invalid input.",
    "Explain the code line by line.",
    "What is the time and space complexity of this code?",
    "Refactor the code to make it easier to read.",
    "Rewrite the code without using any imports.",
    "Show how to call this code with an example and its output.",
)


def follow_up_prompts(first_turns: Sequence[dict], n: int, seed: int,
                      decode: Callable[[list[int]], str]) -> list[TrainingPrompt]:
    """Follow-up prompts 0..n-1: prompt i continues the record of `first_turns` (a gen-data file's
    records) whose prompt_index is i, its answer given back as `decode(answer ids)`.

    Raises ValueError when a first turn is missing (the first file answers fewer prompts)."""
    if n < 0 or seed < 0:
        raise ValueError(f"n and seed must be >= 0, got n={n}, seed={seed}")
    by_index = {r["prompt_index"]: r for r in first_turns if "prompt_index" in r and "n_prompt" in r}
    missing = [i for i in range(n) if i not in by_index]
    if missing:
        raise ValueError(f"the first-turn file answers no prompt {missing[0]} ({n - len(missing)} of the first {n} are "
                         "there): give fewer --prompts, or answer more first turns with gen-data on that file")
    out = []
    for i in range(n):
        first = by_index[i]
        answer = decode(first["ids"][first["n_prompt"] :])
        rng = random.Random(f"{seed}:follow-up:{i}")
        code = "```" in answer and rng.random() < CODE_SHARE
        request = rng.choice(CODE_REQUESTS if code else GENERAL_REQUESTS)
        history = ({"role": "user", "content": first["prompt"]}, {"role": "assistant", "content": answer})
        out.append(TrainingPrompt(SOURCE, request, history))
    return out
