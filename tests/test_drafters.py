"""The drafters package: the kind registry, loading by name or folder, what ships with taps, and
the scorer folder's own marker."""

import pytest
import torch

from taps.drafters import KINDS, TEST_DRAFTERS, TargetInfo, drafter_kind, load_drafter, shipped_drafter, shipped_scorer
from taps.drafters.base import DrafterKind, register
from taps.drafters.dflash import save_dflash
from taps.drafters.dflash_model import DFlashConfig, DFlashDrafterModel
from taps.drafters.loading import SHIPPED
from taps.scorer import EdgeScorer
from taps.target import Target, TargetError
from taps.train.drafter import TrainDrafterConfig
from tiny import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def dflash_folder(model, folder, layers=(0, 2)):
    cfg = DFlashConfig.for_target(model.config, mask_token_id=95, target_layer_ids=layers, block_size=4)
    save_dflash(DFlashDrafterModel(cfg), folder, TargetInfo.of(model, "tiny"))
    return str(folder)


def test_every_kind_has_its_own_marker_and_registering_a_clash_is_refused():
    assert list(KINDS) == ["dflash", "grown"]
    assert len({kind.marker for kind in KINDS.values()}) == len(KINDS)
    with pytest.raises(ValueError, match="clashes with 'grown'"):
        register(DrafterKind("other", "x", KINDS["grown"].marker, "x", KINDS["grown"].load, KINDS["grown"].training))


def test_loading_sets_the_targets_feature_layers(model, tmp_path):
    target = Target(model)
    drafter = load_drafter(dflash_folder(model, tmp_path / "d"), target)
    assert drafter.feature_layers == target.feature_layers == (0, 2)
    load_drafter("noisy", target, block_len=3)  # a test drafter reads none
    assert target.feature_layers == ()


def test_unknown_names_and_folders_are_clear_errors(model, tmp_path):
    target = Target(model)
    with pytest.raises(ValueError, match="give a drafter folder or one of oracle, random, noisy"):
        load_drafter(str(tmp_path / "missing"), target)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"holds no drafter taps knows: a dflash drafter has config.json \+ "
                                         r"model.safetensors.*; a grown drafter has grown.json"):
        load_drafter(str(tmp_path / "empty"), target)
    with pytest.raises(ValueError, match="proposes 3 positions, not 5"):
        load_drafter(dflash_folder(model, tmp_path / "d"), target, block_len=5)
    with pytest.raises(ValueError, match="no weights to quantize"):
        load_drafter("oracle", target, quantize="int8")
    with pytest.raises(TargetError, match="feature layer 7 is outside the target's 3 layers"):
        target.read_features((0, 7))
    (tmp_path / "d" / "grown.json").write_text("{}")
    with pytest.raises(ValueError, match="marker files of several drafter kinds"):
        drafter_kind(tmp_path / "d")


def test_shipped_drafters_and_their_scorers():
    for name in ("smollm2-135m", "qwen2.5-coder-1.5b"):
        folder = shipped_drafter(name)
        assert folder == str(SHIPPED / name) and drafter_kind(folder) is not None
        scorer = shipped_scorer(folder)
        assert drafter_kind(scorer) is None  # a scorer folder is never taken for a drafter
        assert EdgeScorer.load(scorer).config.buckets == 4096
    # SmolLM2's DFlash drafter ships beside its default grown one: asked for by kind, as vLLM's dflash method asks
    assert drafter_kind(shipped_drafter("smollm2-135m")).name == "grown"
    assert shipped_drafter("smollm2-135m", "dflash") == str(SHIPPED / "smollm2-135m-dflash")
    assert shipped_drafter("smollm2-135m", "grown") == shipped_drafter("smollm2-135m")
    assert shipped_drafter("qwen2.5-coder-1.5b", "dflash") is None
    assert drafter_kind(shipped_drafter("smollm2-135m", "dflash")).name == "dflash"
    assert shipped_drafter("no-such-model") is None
    assert shipped_scorer(None) is None and all(shipped_scorer(name) is None for name in TEST_DRAFTERS)


def test_a_scorer_saved_before_the_marker_still_loads(tmp_path):
    torch.manual_seed(0)
    EdgeScorer().save(tmp_path / "scorer")
    (tmp_path / "scorer" / "scorer.json").rename(tmp_path / "scorer" / "config.json")  # the old layout
    assert shipped_scorer(str(tmp_path)) == str(tmp_path / "scorer")
    assert EdgeScorer.load(tmp_path / "scorer").config == EdgeScorer().config


def test_training_options_belong_to_their_kind():
    with pytest.raises(ValueError, match='kind "grown" needs base'):
        TrainDrafterConfig(target="t", data="d", out="o", mask_token_id=1, kind="grown")
    with pytest.raises(ValueError, match='lora_rank applies to kind "grown" only, not to kind "dflash"'):
        TrainDrafterConfig(target="t", data="d", out="o", mask_token_id=1, lora_rank=8)
    with pytest.raises(ValueError, match='num_hidden_layers applies to kind "dflash" only'):
        TrainDrafterConfig(target="t", data="d", out="o", mask_token_id=1, kind="grown", base="b", num_hidden_layers=2)
    with pytest.raises(ValueError, match="kind must be one of dflash, grown"):
        TrainDrafterConfig(target="t", data="d", out="o", mask_token_id=1, kind="lora")
    assert TrainDrafterConfig(target="t", data="d", out="o", mask_token_id=1, kind="grown", base="b", lora_rank=8).lora_rank == 8
