"""Which w4a8 kernel on a CPU with AMX: torchao's `da8w4_linear_cpu` (AMX tiles from 5 rows on, groups
of 128 with int8 zero points) against taps' own AVX-512 VNNI kernel (taps.vnni: groups of 32, a float
minimum each), in the decoding loop, one process (taps.bench.run_side_by_side: per prompt and method
each config's run in turn). Configs, each a w4a8 1.5B target beside the shipped drafter:

    vnni-w8a8     target on taps.vnni, drafter w8a8 (oneDNN's int8 x int8)
    torchao-w8a8  target on torchao, drafter w8a8 (session 44's pairing)
    vnni-w4a8     target and drafter on taps.vnni (the drafter's head in int4 too)

The kernel is chosen per session through $TAPS_W4A8_KERNEL (taps.weightonly.w4a8_kernel, read
while the session's weights are packed). Each config has its own latency profile
(profile-w4a8-<config>.json, `taps profile` under the same variable, made here when missing).
The two kernels are two models (their grids differ), so outputs are compared with each config's
own plain decoding (`=ar`), not across configs. 5 HumanEval + 5 MT-Bench turn 1 (LIMIT=), T=0,
128 new tokens, bfloat16 activations, methods ar, ddtree:8, taps:32. Resumable.

    .venv/bin/python results/quantized-targets/xeon-amx/kernel-ab.py    # -> kernel-ab/<config>.jsonl

REVERSE=1 makes the sessions in the other order (into kernel-ab-reversed/): in one process the session
made later ran the same computation slower (ar of one target 0.94-0.97x, drafter-quant/), so the
configs' order is part of what a single run compares. METHODS=a,b,... replaces the methods.
"""

import os
import subprocess
from pathlib import Path

import taps.bench as bench
from taps import weightonly
from taps.bench import BenchConfig, run_side_by_side

HERE = Path(__file__).parent
REVERSE = bool(os.environ.get("REVERSE"))
OUT = HERE / ("kernel-ab-reversed" if REVERSE else "kernel-ab")
CONFIGS = {"vnni-w8a8": ("vnni", "w8a8"), "torchao-w8a8": ("torchao", "w8a8"), "vnni-w4a8": ("vnni", "w4a8")}
if REVERSE:
    CONFIGS = dict(reversed(CONFIGS.items()))
LIMIT = int(os.environ.get("LIMIT", "5"))
METHODS = tuple(os.environ.get("METHODS", "ar,ddtree:8,taps:32").split(","))


def use_kernel(kernel: str) -> None:
    os.environ[weightonly.W4A8_KERNEL_VAR] = kernel
    weightonly.w4a8_kernel.cache_clear()


def config_kernel(cfg: BenchConfig) -> str:
    return CONFIGS[Path(cfg.profile).stem.removeprefix("profile-w4a8-")][0]


class KernelSession(bench.Session):
    """A session whose w4a8 products run on the kernel its config's profile is named for."""

    def __init__(self, cfg: BenchConfig):
        use_kernel(config_kernel(cfg))
        super().__init__(cfg)


def environment(cfg: BenchConfig, _environment=bench.environment) -> dict:
    """The records' environment, naming the config's kernel (bench reads it after every session is made)."""
    use_kernel(config_kernel(cfg))
    return _environment(cfg)


OUT.mkdir(exist_ok=True)
for name, (kernel, drafter) in CONFIGS.items():
    profile = HERE / f"profile-w4a8-{name}.json"
    if not profile.exists():
        subprocess.run([".venv/bin/taps", "profile", "--target", "qwen2.5-coder-1.5b", "--dtype", "bfloat16",
                        "--target-quant", "w4a8", "--drafter-quant", drafter, "--sizes", "0,1,3,7,15,31,63",
                        "--contexts", "256", "--repeats", "3", "--out", str(profile)],
                       check=True, env={**os.environ, weightonly.W4A8_KERNEL_VAR: kernel})
bench.Session, bench.environment = KernelSession, environment  # run_side_by_side looks both up by name
benches = [(BenchConfig(target="qwen2.5-coder-1.5b", methods=METHODS,
                        datasets=("humaneval", "mt-bench"), turns=1, limit=LIMIT, max_new_tokens=128,
                        dtype="bfloat16", temperatures=(0.0,), drafter_quant=drafter, target_quant="w4a8",
                        profile=str(HERE / f"profile-w4a8-{name}.json")), OUT / f"{name}.jsonl")
           for name, (_, drafter) in CONFIGS.items()]
run_side_by_side(benches)
for _, path in benches:
    subprocess.run([".venv/bin/taps", "report", str(path), "--out", str(OUT / f"report-{path.stem}"), "--complete-only"],
                   check=True)
