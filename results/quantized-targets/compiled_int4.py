"""Experiment (issue 25): does Inductor's CPU GEMM template for int4 weights make a tree's rows cheap?

taps' int4 target multiplies through `torch._weight_int4pack_mm_for_cpu`, which pays for every row
(results/quantized-targets/README.md: 0.32 ms for one row of a 1536x8960 layer, 3.9 ms for 32).
Under `torch.compile(mode="max-autotune")` Inductor may replace that op by its own C++ template
(CppWoqInt4GemmTemplate), whose micro-kernel dequantizes a tile of weights once and reuses it for
every row. This script measures, per layer shape of Qwen2.5-1.5B and per number of rows:
bfloat16 `F.linear`, the aten int4 op, and the compiled op (rows marked dynamic, so one kernel
serves every tree size, unless Inductor specializes one row); whether each row's result is the same bits alone and batched (lossless needs it:
docs/method.md section 10); and the compile time. One JSON line per measurement.

    .venv/bin/python results/quantized-targets/compiled_int4.py --out results/quantized-targets/compiled-int4.jsonl
"""

import argparse
import json
import statistics
import time

import torch
import torch._inductor.config as inductor_config
from torch import nn
from torch._dynamo.utils import counters

from taps.costmodel import cpu_name
from taps.weightonly import WeightOnlyLinear

SHAPES = [(1536, 8960), (8960, 1536), (1536, 1536), (1536, 256)]  # (in, out) of the 1.5B's layers
ROWS = [1, 2, 4, 8, 16, 32, 64]


class Int4Matmul(nn.Module):
    """Just the int4 product of a WeightOnlyLinear, its packed weight a buffer (what the template needs)."""

    def __init__(self, layer: WeightOnlyLinear):
        super().__init__()
        self.group_size = layer.group_size
        self.register_buffer("qweight", layer.qweight)
        self.register_buffer("scales", layer.scales)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(rows, self.qweight, self.group_size, self.scales)  # [R, N]


def timed(fn, x: torch.Tensor, repeats: int) -> float:
    """Median ms of `fn(x)` after two warm-up calls (first calls allocate and, compiled, may recompile)."""
    fn(x)
    fn(x)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    torch.manual_seed(0)
    inductor_config.freezing = True  # the packed weight becomes a constant: the template requires one
    inductor_config.fx_graph_cache = False  # a cached graph skips lowering: every run times a cold compile
    cpu = cpu_name()
    with open(args.out, "w") as out, torch.no_grad():
        for k, n in SHAPES:
            linear = nn.Linear(k, n, bias=False).to(torch.bfloat16)
            layer = WeightOnlyLinear(linear, "int4")
            aten = Int4Matmul(layer).eval()
            torch._dynamo.reset()
            counters.clear()
            compiled = torch.compile(Int4Matmul(layer).eval(), mode="max-autotune")
            first = torch.randn(3, k, dtype=torch.bfloat16)
            torch._dynamo.mark_dynamic(first, 0)  # rows only: the template needs N and K fixed
            start = time.perf_counter()
            compiled(first)
            compile_s = time.perf_counter() - start
            template = counters["inductor"]["cpp_templated_kernel_counter"]
            x = torch.randn(max(ROWS), k, dtype=torch.bfloat16)  # [64, K]
            alone = torch.cat([compiled(x[i:i + 1]) for i in range(max(ROWS))])  # [64, N] row by row
            for rows in ROWS:
                batch = compiled(x[:rows])  # [rows, N]
                record = {
                    "cpu": cpu, "threads": torch.get_num_threads(), "in": k, "out": n, "rows": rows,
                    "compile_s": round(compile_s, 1), "template_kernels": template,
                    "template_kernels_now": counters["inductor"]["cpp_templated_kernel_counter"],  # recompiles add
                    "graphs_now": counters["stats"]["unique_graphs"],
                    "ms_bf16": timed(lambda t: torch.nn.functional.linear(t, linear.weight), x[:rows], args.repeats),
                    "ms_aten_int4": timed(aten, x[:rows], args.repeats),
                    "ms_compiled_int4": timed(compiled, x[:rows], args.repeats),
                    "rows_exact": bool(torch.equal(batch, alone[:rows])),
                    "max_diff_vs_aten": float((batch.float() - aten(x[:rows]).float()).abs().max()),
                }
                print(json.dumps(record), flush=True)
                out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
