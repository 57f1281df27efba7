"""A small, bounded load test of a running `taps serve` on this machine.

For each concurrency level it sends a fixed number of short streamed chat requests (T=0) from
that many client threads, then stops; it measures requests per minute, time to first token
(TTFT), inter-token latency (ITL: the gap between consecutive streamed pieces, as vLLM's
benchmark defines it) and time per output token (TPOT: a request's decode time over its
tokens), p50 and p95, and reads the server's own tau and decode speed for exactly those
requests from the increase of its /metrics counters: taps serve's, or vLLM's speculative
decoding counters (tau and the acceptance rate per draft position) when a vLLM server answers
(`taps vllm-serve`, results/vllm-cpu/bench.sh). One JSONL record per level, with the CPU named.
Loopback only: it refuses any other host.

    taps serve --target smollm2-135m --method taps &        # then, once it answers /health:
    python scripts/load_test.py --out runs/load.jsonl       # concurrency 1, 4, 16
    # stop it, start `taps serve ... --method ar`, run again: the records say which method ran
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

import httpx
import numpy as np

from taps.costmodel import cpu_name

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
PROMPTS = [  # short chat prompts with answers of a few sentences or a few lines of code
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash table is in two sentences.",
    "Give three tips for writing clear emails.",
    "Write a Python function that reverses the words of a sentence.",
    "What causes the seasons on Earth? Answer briefly.",
    "Write a SQL query that counts the orders of each customer.",
    "Summarise the plot of Romeo and Juliet in three sentences.",
    "Write a Python function that merges two sorted lists.",
]


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def one_request(client: httpx.Client, url: str, body: dict) -> dict:
    """One streamed chat request: its timings and token count, or its error."""
    start = time.perf_counter()
    arrivals, tokens = [], 0
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            return {"error": response.status_code}
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: "):])
            if "error" in chunk:
                return {"error": chunk["error"].get("code") or "stream error"}
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                arrivals.append(time.perf_counter())
    if not arrivals:
        return {"error": "no content"}
    return {"ttft": arrivals[0] - start, "gaps": list(np.diff(arrivals)), "tokens": tokens,
            "tpot": (arrivals[-1] - arrivals[0]) / (tokens - 1) if tokens > 1 else None}


def metrics(client: httpx.Client, url: str) -> dict[str, float]:
    text = client.get(f"{url}/metrics").text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def vllm_speculation(delta: dict[str, float]) -> dict:
    """tau (tokens per verification: 1 + accepted / drafts) and the acceptance rate at each draft
    position (accepted there / drafts) from the increase of vLLM's spec_decode counters; {} when
    the server is no speculating vLLM."""
    def total(name: str) -> float:
        return sum(v for k, v in delta.items() if k.split("{")[0] == name)

    drafts = total("vllm:spec_decode_num_drafts_total")
    if not drafts:
        return {}
    per_pos: dict[int, float] = {}
    for key, value in delta.items():
        if key.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total{"):
            position = int(key.partition('position="')[2].partition('"')[0])
            per_pos[position] = per_pos.get(position, 0.0) + value
    return {"vllm_tau": 1 + total("vllm:spec_decode_num_accepted_tokens_total") / drafts,
            "vllm_acceptance_per_position": [per_pos[i] / drafts for i in sorted(per_pos)]}


def load_questions(datasets: str, limit: int) -> list[str]:
    """The first user turn of the first `limit` prompts of each taps dataset named (comma-separated)."""
    from taps.datasets import load_prompts

    return [prompt.turns[0] for name in datasets.split(",") if name for prompt in load_prompts(name, limit)]


def run_level(url: str, headers: dict, concurrency: int, requests: int, max_tokens: int, timeout: float,
              questions: list[str]) -> dict:
    """`requests` requests from `concurrency` threads; the server's counters read before and after."""
    prompts = itertools.cycle(questions)
    bodies = [{"model": None, "messages": [{"role": "user", "content": next(prompts)}], "max_tokens": max_tokens,
               "temperature": 0, "stream": True, "stream_options": {"include_usage": True}} for _ in range(requests)]
    results: list[dict] = []
    lock = threading.Lock()
    with httpx.Client(headers=headers, timeout=timeout) as client:
        model = client.get(f"{url}/v1/models").json()["data"][0]["id"]
        for body in bodies:
            body["model"] = model
        before = metrics(client, url)

        def worker() -> None:
            with httpx.Client(headers=headers, timeout=timeout) as own:
                while True:
                    with lock:
                        if not bodies:
                            return
                        body = bodies.pop()
                    try:
                        outcome = one_request(own, url, body)
                    except httpx.HTTPError as error:
                        outcome = {"error": type(error).__name__}
                    with lock:
                        results.append(outcome)

        start = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        after = metrics(client, url)
    ok = [r for r in results if "error" not in r]
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    rounds = delta.get("taps_decode_rounds_total", 0.0)
    speeds = delta.get("taps_request_tokens_per_second_count", 0.0)
    gaps = [g for r in ok for g in r["gaps"]]
    tpots = [r["tpot"] for r in ok if r["tpot"] is not None]
    info = next((k for k in after if k.startswith("taps_server_info{")), "")
    return {
        "model": model, "method": info.partition('method="')[2].partition('"')[0] or None,
        "concurrency": concurrency, "requests": requests, "max_tokens": max_tokens, "ok": len(ok),
        "errors": sorted(str(r["error"]) for r in results if "error" in r), "wall_s": wall,
        "requests_per_min": 60 * len(ok) / wall, "tokens_per_s": sum(r["tokens"] for r in ok) / wall,
        "ttft_p50_s": percentile([r["ttft"] for r in ok], 50), "ttft_p95_s": percentile([r["ttft"] for r in ok], 95),
        "itl_p50_s": percentile(gaps, 50), "itl_p95_s": percentile(gaps, 95),
        "tpot_p50_s": percentile(tpots, 50), "tpot_p95_s": percentile(tpots, 95),
        "server_tau": delta["taps_decode_committed_tokens_total"] / rounds if rounds else None,
        "server_tokens_per_s": delta["taps_request_tokens_per_second_sum"] / speeds if speeds else None,
        **vllm_speculation(delta),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server, on this machine (default :8000)")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts (1,4,16)")
    p.add_argument("--requests", type=int, default=16, help="requests per concurrency level (16)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per answer (64)")
    p.add_argument("--datasets", default="", help="ask these taps datasets' first turns (e.g. humaneval,mt-bench) "
                                                  "instead of the built-in short chat prompts")
    p.add_argument("--limit", type=int, default=10, help="prompts per dataset with --datasets (10)")
    p.add_argument("--timeout", type=float, default=900, help="seconds one request may take (900)")
    p.add_argument("--api-key", default=os.environ.get("TAPS_API_KEY"), help="the server's key ($TAPS_API_KEY)")
    p.add_argument("--note", default="", help="free text stored in every record (e.g. the dtype)")
    p.add_argument("--out", required=True, help="JSONL file the records are appended to")
    args = p.parse_args(argv)
    url = args.url.rstrip("/")
    if urlparse(url).hostname not in LOOPBACK:
        raise SystemExit(f"load_test.py drives servers on this machine only; {url} is not a loopback address")
    levels = [int(c) for c in args.concurrency.split(",") if c]
    if args.requests < 1 or not levels or min(levels) < 1:
        raise SystemExit("need --requests >= 1 and concurrency levels >= 1")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    questions = load_questions(args.datasets, args.limit) if args.datasets else PROMPTS
    # warm-up, not recorded: the first call pays one-off costs
    run_level(url, headers, 1, 1, 8, args.timeout, questions)
    for level in levels:
        record = run_level(url, headers, level, args.requests, args.max_tokens, args.timeout, questions)
        record.update(cpu=cpu_name(), cores=os.cpu_count(), url=url, note=args.note,
                      time=datetime.now(UTC).isoformat(timespec="seconds"))
        with out.open("a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"c={level:2d} {record['ok']}/{record['requests']} ok, {record['requests_per_min']:.1f} req/min, "
              f"TTFT p50 {record['ttft_p50_s'] or 0:.2f} s p95 {record['ttft_p95_s'] or 0:.2f} s, "
              f"ITL p50 {record['itl_p50_s'] or 0:.3f} s p95 {record['itl_p95_s'] or 0:.3f} s, "
              f"server tau {record['server_tau'] or record.get('vllm_tau') or 0:.2f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
