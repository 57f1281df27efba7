"""A taps DFlash drafter folder rewritten for vLLM's own `dflash` method (issue 24, docs/vllm.md).

vLLM 0.32 runs z-lab's DFlash layout (`DFlashQwen3ForCausalLM`), which taps' DFlash drafters
follow: the same parameter names, `fc` then `hidden_norm` over the target layers'
`dflash_config.target_layer_ids` (vLLM reads the input of layer i + 1, taps hidden_states[i + 1]:
the same tensor), a non-causal block [root, mask, ...]. One thing differs: a taps drafter with a
reduced draft vocabulary scores it through the target's own LM head (the rows `draft_vocab_ids`),
where vLLM wants the drafter's own `lm_head` of `draft_vocab_size` rows and a `d2t` table (draft
id i is target id i + d2t[i]). The export writes those two and drops the `draft_vocab_ids`
buffer; the embeddings stay the target's, which vLLM shares when the drafter ships none.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from taps.drafters.dflash import CONFIG_FILE, WEIGHTS_FILE, DFlashDrafter
from taps.drafters.dflash_model import DRAFT_VOCAB_KEY
from taps.files import read_json
from taps.target import Target


def exported_for(target: str, drafter: str | None, dtype: str, k: int) -> Path:
    """vLLM's copy of the DFlash `drafter` folder (default: the one taps ships for `target`), checked
    against the target loaded in `dtype` and written under $TAPS_HOME/vllm-dflash/ (again on every
    call: seconds), for `k` drafted tokens."""
    from taps.assets import DTYPES, load_model, writable_home
    from taps.drafters import load_drafter, shipped_drafter

    folder = drafter or shipped_drafter(target, "dflash")
    if folder is None:
        raise ValueError(f"taps ships no DFlash drafter for {target}: pass --drafter DFLASH_FOLDER")
    model, _ = load_model(target, dtype=DTYPES[dtype])
    loaded = load_drafter(folder, Target(model))
    if not isinstance(loaded, DFlashDrafter):
        raise ValueError(f"{folder} is no DFlash drafter: vLLM's dflash method runs DFlash-layout drafters "
                         "(--speculation taps runs a grown one)")
    if k > loaded.block_len:
        raise ValueError(f"--k {k}, but the drafter in {folder} proposes {loaded.block_len} tokens: "
                         f"pass --k <= {loaded.block_len}")
    where = str(Path(folder).resolve())
    out = writable_home() / "vllm-dflash" / f"{Path(where).name}-{hashlib.sha1(where.encode()).hexdigest()[:8]}"
    return export_dflash(loaded, folder, out)


def export_dflash(drafter: DFlashDrafter, folder: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write `drafter` (loaded from `folder` against its target) to `out` in vLLM's layout."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    raw = read_json(Path(folder) / CONFIG_FILE, "fix it or copy the drafter again")
    state = {name: t.contiguous() for name, t in drafter.model.state_dict().items() if name != DRAFT_VOCAB_KEY}
    if drafter.vocab is not None:
        n = drafter.vocab.numel()
        state["lm_head.weight"] = drafter.head_weight.detach().to(drafter.dtype).contiguous()
        state["d2t"] = drafter.vocab - torch.arange(n)
        raw["draft_vocab_size"] = n  # vLLM reads it at the top level
    save_file(state, out / WEIGHTS_FILE)
    (out / CONFIG_FILE).write_text(json.dumps(raw, indent=2) + "\n")
    return out
