"""`taps vllm-serve` (taps.vllm_serve, issue 24) without vLLM: the command line of vLLM's server
and the environment it builds for each speculation, and its refusals."""

import json

import pytest

from taps.cli import main
from taps.drafters.loading import SHIPPED
from taps.vllm_proposer import DRAFTER_ENV, PROPOSER
from taps.vllm_serve import RESERVED_ENV, VllmServe, command, engine_environment, run
from tiny import tiny_model

GROWN = str(SHIPPED / "qwen2.5-coder-1.5b")
DFLASH = str(SHIPPED / "smollm2-135m-dflash")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A local model folder: resolve() takes it as is (no packaged model is fetched)."""
    folder = tmp_path_factory.mktemp("target")
    tiny_model("qwen2").save_pretrained(folder)
    return str(folder)


def speculative(argv: list[str]) -> dict | None:
    return json.loads(argv[argv.index("--speculative-config") + 1]) if "--speculative-config" in argv else None


def test_each_speculation_becomes_its_vllm_method(model_dir):
    argv, env = command(VllmServe(model_dir, "taps", k=5, drafter=GROWN, port=8123, extra="--max-num-seqs 4"))
    assert argv[argv.index("--model") + 1] == model_dir and argv[-2:] == ["--max-num-seqs", "4"]
    assert argv[argv.index("--port") + 1] == "8123"
    assert speculative(argv) == {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 5}
    assert env[DRAFTER_ENV] == GROWN and env["VLLM_HOST_IP"] == "127.0.0.1"

    argv, env = command(VllmServe(model_dir, "ngram"))
    assert speculative(argv) == {"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_min": 3,
                                 "prompt_lookup_max": 3}
    assert DRAFTER_ENV not in env

    argv, _ = command(VllmServe(model_dir, "draft-model", draft_model=model_dir))
    assert speculative(argv) == {"method": "draft_model", "model": model_dir, "num_speculative_tokens": 7}

    argv, _ = command(VllmServe(model_dir, "none"))
    assert speculative(argv) is None


def test_drafters_that_need_hidden_states_are_refused_before_vllm_starts(model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"is a dflash drafter.*--drafter GROWN_FOLDER"):
        command(VllmServe(model_dir, "taps", drafter=DFLASH))
    with pytest.raises(ValueError, match="is no drafter folder"):
        command(VllmServe(model_dir, "taps", drafter=str(tmp_path)))
    with pytest.raises(ValueError, match="unknown speculation 'eagle'"):
        VllmServe(model_dir, "eagle")


def test_without_vllm_the_error_names_the_install_step(model_dir, monkeypatch, capsys):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ValueError, match="make install-vllm"):
        run(VllmServe(model_dir, "none"), dry_run=True)
    assert main(["vllm-serve", "--target", model_dir, "--speculation", "none", "--dry-run"]) == 2
    assert "needs the vllm extra" in capsys.readouterr().err


def test_reserved_cores_follow_the_option_then_the_user_then_the_machine(model_dir, monkeypatch):
    """vLLM keeps cores off the model: --reserved-cpus wins, then the user's own variable (left as
    it is), then none on a machine of 2 cores or fewer and vLLM's own choice above that."""
    monkeypatch.delenv(RESERVED_ENV, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert command(VllmServe(model_dir, "none"))[1][RESERVED_ENV] == "0"
    assert command(VllmServe(model_dir, "none", reserved_cpus=1))[1][RESERVED_ENV] == "1"
    with pytest.raises(ValueError, match="leaves no core of this machine's 2 for the model: use 0 to 1"):
        VllmServe(model_dir, "none", reserved_cpus=2)
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert RESERVED_ENV not in command(VllmServe(model_dir, "none"))[1]
    monkeypatch.setenv(RESERVED_ENV, "3")
    assert RESERVED_ENV not in command(VllmServe(model_dir, "none"))[1]  # the process inherits the user's 3


def test_the_intel_openmp_runtime_is_preloaded_only_where_no_other_is(monkeypatch, tmp_path):
    """vLLM asserts a single OpenMP runtime in LD_PRELOAD, and puts torch's libgomp there itself
    (in its process's environment) when it finds none: an engine made after that must not add
    Intel's."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    monkeypatch.setattr("sys.prefix", str(tmp_path))
    monkeypatch.setenv("LD_PRELOAD", "/x/libtcmalloc.so")
    assert engine_environment()["LD_PRELOAD"] == f"/x/libtcmalloc.so {tmp_path / 'lib' / 'libiomp5.so'}"
    monkeypatch.setenv("LD_PRELOAD", "/x/libtcmalloc.so:/torch/lib/libgomp-a34b3233.so.1")
    assert "LD_PRELOAD" not in engine_environment()
