"""The peers `taps bench` runs beside taps (taps.bench.PEERS), each exercised on SmolLM2; one whose
library is not installed is skipped with the reason, and asking for it is a clear error."""

import importlib.util
import sys

import pytest

from taps import bench
from taps.drafters import shipped_drafter


def run(tmp_path, *methods, **kw):
    cfg = bench.BenchConfig(target="smollm2-135m", methods=("ar", *methods), datasets=("humaneval",), limit=1,
                            max_new_tokens=16, dtype="float32", **kw)
    records = bench.run_bench(cfg, tmp_path / "r.jsonl", progress=False)
    return {r["method"]: r for r in records}


@pytest.mark.parametrize("peer", [pytest.param("hf-generate", marks=pytest.mark.slow), "hf-assisted", "prompt-lookup",
                                  pytest.param("hf-dflash", marks=pytest.mark.slow)])
def test_transformers_peers_equal_plain_greedy_in_float32(tmp_path, peer):
    # hf-dflash: transformers' DFlash speculation with the DFlash drafter taps ships for SmolLM2
    kw = {"hf-assisted": {"assistant": "smollm2-135m"},
          "hf-dflash": {"drafter": shipped_drafter("smollm2-135m", "dflash")}}.get(peer, {})
    records = run(tmp_path, peer, **kw)
    assert records[peer]["token_ids"] == records["ar"]["token_ids"]  # transformers' own lossless methods
    assert records[peer]["rounds"] is None  # a peer exposes no rounds


def test_llama_cpp_decodes_the_packaged_gguf(tmp_path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'taps-decode[llama]')")
    records = run(tmp_path, "llama-cpp")
    answer = records["llama-cpp"]["token_ids"][0]
    assert 0 < len(answer) <= 16 and records["llama-cpp"]["total_seconds"] > 0
    # its own 4-bit model, not taps' dequantized float32 one: close, not necessarily equal
    assert answer[0] == records["ar"]["token_ids"][0][0]
    # the record names the llama.cpp build: its version and the CPU features it was compiled with
    import llama_cpp

    build = records["llama-cpp"]["env"]["llama_cpp"]
    assert build.startswith(f"{llama_cpp.__version__} (") and build.endswith(")") and len(build.split()) > 1, build


@pytest.mark.slow
@pytest.mark.parametrize("peer", ["llama-cpp-lookup", "llama-cpp-draft"])
def test_llama_cpp_speculation_equals_its_plain_greedy_decoding(tmp_path, peer):
    """At T=0 llama.cpp's speculation keeps its own greedy tokens. SmolLM2 has no smaller sibling
    GGUF, so the draft peer drafts with the target's own file: every draft is accepted."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'taps-decode[llama]')")
    records = run(tmp_path, "llama-cpp", peer, assistant="smollm2-135m")
    assert records[peer]["token_ids"] == records["llama-cpp"]["token_ids"]
    assert len(records[peer]["token_ids"][0]) == 16


def test_a_missing_peer_library_is_a_clear_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    with pytest.raises(ValueError, match=r"llama-cpp peer needs llama-cpp-python: pip install 'taps-decode\[llama\]'"):
        bench.BenchConfig(target="smollm2-135m", methods=("ar", "llama-cpp"))
    with pytest.raises(ValueError, match="runs a packaged model's GGUF file; the target '/some/folder'"):
        bench.BenchConfig(target="/some/folder", methods=("ar", "llama-cpp"))
    with pytest.raises(ValueError, match="hf-dflash peer runs a DFlash drafter folder"):
        bench.BenchConfig(target="qwen2.5-coder-1.5b", methods=("ar", "hf-dflash"))  # its drafter is a grown one
    with pytest.raises(ValueError, match="llama-cpp-draft peer runs a packaged model's GGUF file; the assistant"):
        bench.BenchConfig(target="smollm2-135m", methods=("ar", "llama-cpp-draft"), assistant="/some/folder")


def test_a_llama_cpp_build_that_crashes_or_fails_is_a_clear_error(tmp_path):
    """`probe_llama_cpp` runs llama.cpp in a child process before a benchmark's long work: a child
    that dies of a signal (as a native AMX build does on some Xeons) or exits with an error is said
    with its remedy; one that decodes passes. Real child processes, without llama.cpp itself."""
    gguf = tmp_path / "model.gguf"
    crash = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
    with pytest.raises(ValueError, match=r"llama-cpp peer's llama.cpp crashed \(SIGSEGV\) decoding model.gguf.*"
                                         r"-DGGML_NATIVE=OFF.*or drop the llama.cpp peers"):
        bench.probe_llama_cpp("llama-cpp", gguf, 2, command=crash)
    fail = [sys.executable, "-c", "import sys; sys.exit('failed to load model')"]
    with pytest.raises(ValueError, match=r"cannot decode model\.gguf: failed to load model; reinstall"):
        bench.probe_llama_cpp("llama-cpp", gguf, 2, command=fail)
    bench.probe_llama_cpp("llama-cpp", gguf, 2, command=[sys.executable, "-c", "pass"])
