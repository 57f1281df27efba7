"""The `taps` command. The CLI parses and prints; the library computes and returns."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from taps.cli_options import MAX_BUDGET, SEED, bounded, csv_of, temperature


def _models(args) -> int:
    from taps import assets

    if args.action == "list":
        for name, spec in assets.MODELS.items():
            state = assets.cache_state(name)
            print(f"{name:22s} {state:12s} {spec.description}")
            if state == "damaged":
                print(f"{'':22s} a weights file is damaged: `taps models fetch {name}` converts it again")
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


def _add_drafter_quant(p, text: str) -> None:
    from taps.quantize import SCHEMES

    p.add_argument("--drafter-quant", choices=list(SCHEMES), default="auto", help=text)


def _method(text: str) -> str:
    """--method's type: NAME[+OPTION...] checked at parse time, before any model loads."""
    from taps.methods import Method

    try:
        return str(Method.parse(text))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _load(args, method: str):
    """The parts the options name, assembled by the composition root (taps.engine.load)."""
    import taps
    from taps.rounds import Rollout

    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="taps: %(message)s")

    return taps.load(
        args.target, args.drafter, method=method, budget=getattr(args, "budget", None), dtype=args.dtype,
        device=args.device, profile=args.profile, scorer=False if args.scorer == "none" else args.scorer,
        drafter_quant=args.drafter_quant, target_quant=args.target_quant, linear=args.linear,
        block_len=args.block_len, rollout=Rollout(args.rollout_steps, args.rollout_reach),
        adapt_profile=not args.static_profile, verbose=args.verbose,
    )


def _generate(args) -> int:
    spec = _load(args, args.method)
    options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed, stop=args.stop or None, chat=not args.no_chat_template)
    if args.stream and not args.json:
        for piece in spec.stream(args.prompt, **options):
            print(piece, end="", flush=True)
        print()
        result = spec.last_result
    else:
        result = spec.generate(args.prompt, **options)
    s = result.stats
    drafter = spec.drafter_name if spec.drafter is not None else None
    if args.json:
        record = result.to_dict()
        record.update(target=args.target, drafter=drafter, dtype=spec.target.dtype_name)
        print(json.dumps(record))
        return 0
    if not args.stream:
        print(result.text)
    print(
        f"\n[{result.method}{'' if drafter is None else ' / ' + drafter}] {s.new_tokens} tokens in "
        f"{s.seconds:.2f} s = {s.tokens_per_second:.1f} tokens/s, {s.rounds} rounds, tau {s.tau:.2f}, "
        f"mean tree {s.mean_tree_size:.1f} nodes, finished by {result.finish_reason}; stages (s): "
        + ", ".join(f"{k} {v:.2f}" for k, v in s.stage_seconds.items())
        + f", prefill {s.prefill_seconds:.2f}",
        file=sys.stderr,
    )
    return 0


def _methods(args) -> int:
    from taps.methods import method_help

    print(method_help())
    return 0


def _bench(args) -> int:
    from pathlib import Path

    from taps.bench import BenchConfig, run_bench
    from taps.records import read_records
    from taps.summary import format_table, summarize, write_spec_bench_answers

    cfg = BenchConfig(
        target=args.target, drafter=args.drafter, methods=args.methods, datasets=args.datasets, limit=args.limit,
        temperatures=args.temperatures, budgets=args.budgets, max_new_tokens=args.max_new_tokens, dtype=args.dtype,
        seed=args.seed, spec_bench=args.spec_bench, categories=args.categories, block_len=args.block_len,
        profile=args.profile, scorer=args.scorer, turns=args.turns, drafter_quant=args.drafter_quant,
        rollout_steps=args.rollout_steps, rollout_reach=args.rollout_reach, device=args.device, linear=args.linear,
        assistant=args.assistant, target_quant=args.target_quant, static_profile=args.static_profile,
    )
    out = Path(args.out)
    records = run_bench(cfg, out, progress=True, redo_busy=args.redo_busy)
    rows = summarize(records)
    print(format_table(rows))
    # the answer files cover every record in the file, not only this invocation's
    answers = write_spec_bench_answers(read_records(out), out.with_suffix(".answers"))
    print(f"records: {out} ({len(records)}); Spec-Bench answer files: {answers[0].parent.parent if answers else '-'}")
    print(json.dumps({"target": cfg.target, "results": rows}))
    return 0


def _report(args) -> int:
    from pathlib import Path

    from taps.records import KEY_FIELDS, read_records
    from taps.report import complete_only, write_report

    if not Path(args.results).is_file():
        raise ValueError(f"no results file {args.results}: give the JSONL that taps bench wrote (its --out)")
    records = read_records(args.results, required=KEY_FIELDS)
    if not records:
        raise ValueError(f"no benchmark records in {args.results}")
    if args.complete_only:
        records = complete_only(records)
    print(write_report(records, Path(args.out)))
    return 0


def _add_load_options(p, drafter_help: str) -> None:
    """What `taps.load` takes: the target, its drafter, dtype, device, kernels, profile and scorer."""
    from taps.assets import DTYPES
    from taps.linear import BACKENDS
    from taps.weightonly import SCHEMES as TARGET_QUANT

    p.add_argument("--target", default="smollm2-135m", help="packaged model name, local HF folder or hub id")
    p.add_argument("--drafter", default=None, help=drafter_help)
    p.add_argument("--verbose", action="store_true", help="log what loading decides (profile, kernels) and show "
                                                         "transformers' progress bars")
    p.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="bfloat16 (fast where the CPU has native bfloat16 kernels) or float32 (exact); default: "
                        "bfloat16 on such CPUs (avx512_bf16, AMX) and GPUs, else float32")
    p.add_argument("--device", default=None, help="cpu (default), cuda, mps, ...: where the models run")
    p.add_argument("--linear", choices=list(BACKENDS), default=None,
                   help="CPU linear kernel (default: $TAPS_LINEAR, else onednn-packed for bfloat16 and onednn for "
                        "float32 where this PyTorch has oneDNN)")
    p.add_argument("--block-len", type=bounded(int, 1, 256), default=None,
                   help="positions a test drafter proposes per round (15)")
    p.add_argument("--profile", default=None,
                   help="latency profile JSON for cost-aware/taps/copy rounds (default: the one `taps profile` saved "
                        "for this target, dtype and kernel; without one they warn and use a stated default)")
    p.add_argument("--static-profile", action="store_true",
                   help="keep the latency profile as measured; by default its levels are refitted from the times "
                        "the rounds themselves take (taps.costmodel.OnlineProfile)")
    p.add_argument("--scorer", default=None,
                   help="trained TAPS edge scorer folder, or none for plain marginals (default: the drafter's scorer/)")
    _add_drafter_quant(p, "the drafter's linear layers in int8 (a grown drafter and hf-assisted's assistant: beside "
                          "any target dtype; CPU only), int4, w8a8 or w4a8 (--target-quant's kernels): faster "
                          "drafts, the same output; auto: int8 for grown and sibling drafters on the CPU (w4a8 where "
                          "taps' w4a8 kernel runs, else w8a8 where it has AMX), none otherwise (auto)")
    p.add_argument("--target-quant", choices=list(TARGET_QUANT), default="none",
                   help="the target's weights in int8 or int4, or w8a8 (int8 weights and per-row int8 activations: "
                        "cheap tree rows) on PyTorch's CPU kernels, or w4a8 (int4 weights, per-row int8 activations; "
                        "AVX-512 VNNI, or AMX with make install-torchao); CPU only: faster rounds; the output is that "
                        "quantized model's own (none)")
    p.add_argument("--rollout-steps", type=bounded(int, 0, MAX_BUDGET), default=64,
                   help="methods with +rollout: most greedy drafter steps after the block pass, at most budget - 1 (64)")
    p.add_argument("--rollout-reach", type=bounded(float, 0.0, 1.0), default=0.2,
                   help="methods with +rollout: stop when the path's drafter probability falls under this (0.2)")


def _profile(args) -> int:
    from pathlib import Path

    from taps.costmodel import measure_profile, profile_path
    from taps.cpuload import is_busy

    spec = _load(args, "chain")  # loads the target and its drafter; the profile times both
    profile = measure_profile(spec.target, spec.drafter, sizes=args.sizes, context_lengths=args.contexts, repeats=args.repeats)
    # the dtype taps.load chose (--dtype, else taps.linear.default_dtype), as the profile measured it
    out = Path(args.out) if args.out else profile_path(args.target, profile.info.dtype, args.linear,
                                                       profile.info.drafter_quant, args.target_quant)
    out.parent.mkdir(parents=True, exist_ok=True)
    profile.save(out)
    info = profile.info
    several = len(info.context_lengths) > 1  # then also each context's own medians (what `at_context` reads)
    contexts = [f"{'ctx ' + str(c):>10s}" for c in info.context_lengths] if several else []
    print(f"{'nodes':>6s} {'t_verify ms':>12s}", *contexts)
    for i, (n, t) in enumerate(zip(profile.sizes, profile.fitted_seconds)):
        print(f"{n:6d} {1000 * t:12.1f}", *[f"{1000 * row[i]:10.1f}" for row in info.verify_by_context] if several else [])
    per_context = ", ".join(f"{1000 * d:.1f} at {c}" for c, d in zip(info.context_lengths, info.draft_by_context))
    print(f"t_draft {1000 * profile.draft_seconds:.1f} ms" + (f" ({per_context})" if several and per_context else "")
          + f"; saved {out}")
    if is_busy(info.others_cpu):
        print(f"taps profile: other processes used {info.others_cpu:.0%} of the CPU while it measured, so these are "
              "a busy machine's costs: run it again when the machine is quiet", file=sys.stderr)
    return 0


def _add_report(sub) -> None:
    r = sub.add_parser("report", help="markdown table and plots from a bench results JSONL")
    r.add_argument("results", help="the JSONL written by taps bench")
    r.add_argument("--out", required=True, help="folder for report.md and the PNG plots")
    r.add_argument("--complete-only", action="store_true",
                   help="keep only prompts that every method of their set has finished (a run still in progress)")
    r.set_defaults(func=_report)


def _report_parser() -> argparse.ArgumentParser:
    """`taps report` alone: the full parser imports torch for its help texts, and a report is
    made from JSONL where no model runs (taps.report needs no torch)."""
    p = argparse.ArgumentParser(prog="taps", description=__doc__)
    _add_report(p.add_subparsers(dest="command", required=True))
    return p


def _serve(args) -> int:
    import os

    try:
        from taps.serve import ServeConfig, serve
    except ImportError as error:
        raise SystemExit(f"taps serve needs the `serve` extra ({error.name} is missing): pip install -e '.[serve]'")
    cfg = ServeConfig(host=args.host, port=args.port, max_queue=args.max_queue, model_name=args.model_name,
                      api_key=args.api_key or os.environ.get("TAPS_API_KEY"))  # the variable keeps it out of `ps`
    return serve(_load(args, args.method), cfg)


def _vllm_serve(args) -> int:
    from taps.vllm_serve import VllmServe, run

    return run(VllmServe(args.target, args.speculation, args.k, args.drafter, args.draft_model, args.dtype, args.host,
                         args.port, args.max_model_len, args.reserved_cpus, args.vllm_args), dry_run=args.dry_run)


def build_parser() -> argparse.ArgumentParser:
    from taps.drafters import TEST_DRAFTERS

    p = argparse.ArgumentParser(prog="taps", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    m = sub.add_parser("models", help="list, fetch or locate the packaged models")
    m.add_argument("action", choices=["list", "fetch", "path"])
    m.add_argument("name", nargs="?", help="a packaged model name (see `taps models list`)")
    m.set_defaults(func=_models)

    g = sub.add_parser("generate", help="generate text for one prompt and print speculation stats")
    _add_load_options(g, "a trained drafter folder, or a test drafter (" + ", ".join(TEST_DRAFTERS)
                      + ") (default: the drafter taps ships for --target)")
    g.add_argument("--method", type=_method, default="taps",
                   help="NAME[+OPTION...] (default taps; list them with `taps methods`)")
    g.add_argument("--budget", type=bounded(int, 1, MAX_BUDGET), default=None,
                   help="most drafted nodes per verification (default: the method's; a chain: the drafter's block)")
    g.add_argument("--temperature", type=temperature, default=0.0, help="0 = greedy (default); > 0 samples")
    g.add_argument("--top-k", type=bounded(int, 0), default=0, help="sample from the k most likely tokens; 0 = off")
    g.add_argument("--top-p", type=bounded(float, 1e-6, 1.0), default=1.0, help="nucleus sampling threshold; 1 = off")
    g.add_argument("--max-new-tokens", type=bounded(int, 1), default=128, help="most tokens to generate (default 128)")
    g.add_argument("--stop", action="append", default=[], help="a string that ends the answer (repeatable)")
    g.add_argument("--no-chat-template", action="store_true", help="tokenize the prompt as is")
    g.add_argument("--seed", type=SEED, default=0, help="seeds sampling and the test drafters (default 0)")
    g.add_argument("--stream", action="store_true", help="print the answer as it is generated")
    g.add_argument("--json", action="store_true", help="print one JSON object with text, token_ids and stats")
    g.add_argument("--prompt", required=True, help="the user message (or raw text with --no-chat-template)")
    g.set_defaults(func=_generate)

    me = sub.add_parser("methods", help="list the methods and their options")
    me.set_defaults(func=_methods)

    pr = sub.add_parser("profile", help="measure verification latency t(n) and drafting cost on this machine")
    _add_load_options(pr, "time this drafter's draft call (folder or test name; default: the target's shipped drafter)")
    pr.add_argument("--sizes", type=csv_of(bounded(int, 0, MAX_BUDGET)), default=(0, 1, 3, 7, 11, 15, 23, 31, 47, 63),
                    help="tree sizes (drafted nodes) to time")
    pr.add_argument("--contexts", type=csv_of(bounded(int, 1)), default=(128, 512, 2048),
                    help="context lengths to time them at; rounds read the curve at their own context (128,512,2048)")
    pr.add_argument("--repeats", type=bounded(int, 1, 1000), default=5, help="timed runs per point; the median is kept (5)")
    pr.add_argument("--out", default=None, help="where to save (default: the path generate and bench look in)")
    pr.set_defaults(func=_profile)

    from taps.bench import PEERS
    from taps.datasets import DATASETS

    b = sub.add_parser("bench", help="run methods side by side on prompt sets; JSONL records, table, JSON summary")
    _add_load_options(b, "drafter of the speculative methods: a folder or a test drafter name (default: the one "
                         "taps ships for --target)")
    b.add_argument("--methods", type=csv_of(str), default=("ar", "chain", "ddtree", "taps"),
                   help=f"comma-separated methods (`taps methods`) and peers ({', '.join(PEERS)}); a speculative "
                   "one as NAME:B runs at budget B only, e.g. ddtree:8,ddtree:64,taps+copy:32 (default ar,chain,ddtree,taps)")
    b.add_argument("--datasets", type=csv_of(str), default=("humaneval",), help=f"comma-separated, from: {', '.join(DATASETS)}")
    b.add_argument("--spec-bench", default=None,
                   help="path of a Spec-Bench question.jsonl for dataset spec-bench (default: the copy taps ships)")
    b.add_argument("--categories", type=csv_of(str), default=(), help="keep only these categories in the sets that have them (spec-bench's translation, mt-bench's writing); other sets run whole")
    b.add_argument("--turns", type=bounded(int, 1), default=None, help="ask at most this many turns of multi-turn prompts (all)")
    b.add_argument("--limit", type=bounded(int, 1), default=10, help="prompts per dataset, per category for spec-bench (10)")
    b.add_argument("--temperatures", type=csv_of(temperature), default=(0.0,), help="comma-separated (0)")
    b.add_argument("--budgets", type=csv_of(bounded(int, 1, MAX_BUDGET)), default=(16,), help="tree budgets of the speculative methods given without :B (16)")
    b.add_argument("--max-new-tokens", type=bounded(int, 1), default=128, help="per turn (128)")
    b.add_argument("--seed", type=SEED, default=0, help="sampling seed, the same for every method on a prompt")
    b.add_argument("--assistant", default="qwen2.5-coder-0.5b",
                   help="the hf-assisted peer's assistant model (packaged name, folder or hub id; qwen2.5-coder-0.5b)")
    b.add_argument("--out", required=True, help="results JSONL; a rerun skips the records already there")
    b.add_argument("--redo-busy", action="store_true",
                   help="first remove the records of runs during which other processes used more than 10%% of the "
                   "CPU (their others_cpu), so that they run again")
    b.set_defaults(func=_bench)

    _add_report(sub)
    from taps.train.cli import add_commands

    add_commands(sub)

    sv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (chat/completions, streaming, /metrics)")
    _add_load_options(sv, "a trained drafter folder or a test drafter (default: the one taps ships for --target)")
    sv.add_argument("--method", type=_method, default="taps", help="NAME[+OPTION...] (default taps; ar: no speculation)")
    sv.add_argument("--budget", type=bounded(int, 1, MAX_BUDGET), default=None, help="most drafted nodes per verification (the method's default)")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    sv.add_argument("--port", type=bounded(int, 1, 65535), default=8000, help="port to listen on (default 8000)")
    sv.add_argument("--max-queue", type=bounded(int, 0), default=64, help="requests that may wait; one more gets 429 (default 64)")
    sv.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (default: $TAPS_API_KEY, else none)")
    sv.add_argument("--model-name", default=None, help="the model id clients send and /v1/models lists (default: --target)")
    sv.set_defaults(func=_serve)

    from taps.vllm_serve import SPECULATIONS

    vs = sub.add_parser("vllm-serve", help="vLLM's OpenAI-compatible server with taps' drafter or a vLLM speculation "
                                            "(needs the vllm extra; docs/vllm.md)")
    vs.add_argument("--target", default="qwen2.5-coder-1.5b", help="packaged model name, local HF folder or hub id")
    vs.add_argument("--speculation", choices=SPECULATIONS, default="taps",
                    help="taps: taps' grown drafter (custom_class); ngram; draft-model; dflash: a DFlash "
                         "drafter through vLLM's dflash; none: plain (default taps)")
    vs.add_argument("--k", type=bounded(int, 1, 64), default=7, help="drafted tokens per step, one chain (7)")
    vs.add_argument("--drafter", default=None,
                    help="drafter folder for taps (grown) or dflash (default: the one taps ships for --target)")
    vs.add_argument("--draft-model", default="qwen2.5-coder-0.5b",
                    help="the draft-model speculation's model (qwen2.5-coder-0.5b)")
    vs.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="vLLM's model dtype (bfloat16)")
    vs.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    vs.add_argument("--port", type=bounded(int, 1, 65535), default=8000, help="port to listen on (default 8000)")
    vs.add_argument("--max-model-len", type=bounded(int, 16), default=4096, help="context limit per request (4096)")
    vs.add_argument("--reserved-cpus", type=bounded(int, 0), default=None,
                    help="cores vLLM keeps for its front end instead of the model (default: none on a machine of "
                         "2 cores or fewer, else vLLM's own choice; $VLLM_CPU_NUM_OF_RESERVED_CPU if set)")
    vs.add_argument("--vllm-args", default="", help="more `vllm serve` options, one quoted string")
    vs.add_argument("--dry-run", action="store_true", help="print the vllm command and exit")
    vs.set_defaults(func=_vllm_serve)
    return p


def _asset_errors() -> tuple[type[Exception], ...]:
    # AssetError, if taps.assets is loaded: a command that never loaded it (report) cannot raise it
    assets = sys.modules.get("taps.assets")
    return (assets.AssetError,) if assets else ()


def _check_text(args) -> None:
    """Text options must be valid Unicode: a shell may pass bytes that are not UTF-8 (Python keeps
    them as lone surrogates), which the tokenizer would fail on after the model has loaded."""
    for name in ("prompt", "stop"):
        for value in (lambda v: v if isinstance(v, list) else [v])(getattr(args, name, None)):
            if isinstance(value, str):
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError(f"--{name} is not valid UTF-8 text; pass it in UTF-8 (e.g. from a UTF-8 "
                                     "file with \"$(cat file)\")") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # torchao's import (transformers' loader makes it wherever torchao is installed: make
    # install-torchao) logs torch.compile deprecation notices a user cannot act on
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    try:  # the parser too: building it imports torch, seconds in which Ctrl-C is likely
        args = (_report_parser() if argv[:1] == ["report"] else build_parser()).parse_args(argv)
        _check_text(args)
        return args.func(args)
    except (ValueError, OSError, *_asset_errors()) as err:  # our own clear errors: print them, not a traceback
        message = "; ".join(line for line in str(err).splitlines() if line.strip()) or type(err).__name__
        print(f"taps: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line and the conventional status; files stay as written
        print("taps: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
