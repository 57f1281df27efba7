"""A taps DFlash drafter exported for vLLM's dflash method (taps.vllm_dflash, issue 24): vLLM's
lm_head and d2t score exactly the draft vocabulary the drafter scores through the target's head;
every other weight is unchanged. tests/test_vllm.py runs an export inside vLLM."""

import json

import pytest
import torch
from safetensors.torch import load_file

from taps.drafters import TargetInfo, load_drafter
from taps.drafters.dflash import save_dflash
from taps.drafters.dflash_model import DRAFT_VOCAB_KEY, DFlashConfig, DFlashDrafterModel
from taps.target import Target
from taps.vllm_dflash import export_dflash
from tiny import tiny_model

VOCAB = [3, 7, 11, 50, 60, 61, 95]


@pytest.fixture(scope="module")
def drafter_folder(tmp_path_factory):
    model = tiny_model("llama")
    torch.manual_seed(1)
    drafter = DFlashDrafterModel(DFlashConfig.for_target(model.config, mask_token_id=90, target_layer_ids=(0, 2),
                                                         block_size=8, draft_vocab_ids=VOCAB))
    folder = tmp_path_factory.mktemp("dflash") / "d"
    save_dflash(drafter, folder, TargetInfo.of(model, "tiny"))
    return model, folder


def test_export_gives_vllm_the_draft_head_and_offsets(drafter_folder, tmp_path):
    model, folder = drafter_folder
    loaded = load_drafter(str(folder), Target(model))
    export_dflash(loaded, folder, tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    # vLLM maps draft id i to target id i + d2t[i] and scores it with lm_head row i
    assert (torch.arange(len(VOCAB)) + state.pop("d2t")).tolist() == VOCAB
    assert torch.equal(state.pop("lm_head.weight"), model.lm_head.weight[VOCAB])
    assert state.keys() == {k for k in load_file(folder / "model.safetensors") if k != DRAFT_VOCAB_KEY}
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["draft_vocab_size"] == len(VOCAB) and config["dflash_config"]["target_layer_ids"] == [0, 2]
