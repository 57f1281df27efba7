"""The training commands of `taps`: gen-data, train-drafter, train-scorer (parsers and runners).

The CLI parses and prints; taps.train computes and returns. `add_commands` adds them to the
`taps` parser (taps.cli).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from taps.cli_options import SEED, bounded, csv_of


def _warn_emulated_bfloat16(*dtypes: str) -> None:
    """Say before the long work starts that bfloat16 runs emulated on this CPU (taps.linear.default_dtype):
    many rows at once (training, batched answers, traces) cost several times float32's there. Measured on
    a 2-core AMD EPYC with AVX2 only: a training step of the 1.5B's grown drafter (block 8, 24 anchors)
    477 s in bfloat16, 14 s in float32."""
    from taps.linear import bf16_native

    if "bfloat16" in dtypes and not bf16_native():
        print("taps: warning: this CPU has no native bfloat16 kernels, so bfloat16 runs emulated, several times "
              "slower than float32 (a training step: 30x); float32 is the faster choice here", file=sys.stderr)


def _gen_data(args) -> int:
    from taps.train.data import append_text_sequences, generate_data

    if args.engine == "transformers":  # vLLM runs kernels of its own
        _warn_emulated_bfloat16(args.dtype)
    result = generate_data(args.target, args.out, args.prompts, max_new_tokens=args.max_new_tokens,
                           batch_size=args.batch_size, dtype=args.dtype, seed=args.seed, progress=True,
                           temperature=args.temperature, engine=args.engine, mix=args.mix, follow_up=args.follow_up)
    print(f"{result.path}: {result.n_prompts} prompts answered ({result.generated} generated now), "
          f"{result.tokens} tokens")
    if args.text_tokens:
        from transformers import AutoTokenizer

        from taps.assets import resolve

        added = append_text_sequences(args.out, AutoTokenizer.from_pretrained(resolve(args.target)),
                                      args.text_tokens, args.text_seq_len, args.seed)
        print(f"{result.path}: {added} stdlib text sequences added")
    return 0


def prompt_mix(text: str) -> dict[str, float]:
    """`--mix chat=1,math=0.5`: source weights of the training prompts (taps.train.prompts.parse_mix)."""
    from taps.train.prompts import parse_mix

    try:
        return parse_mix(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def mask_token_candidates(tokenizer, limit: int = 8) -> list[tuple[int, str]]:
    """Special or added tokens that a chat never uses (not bos/eos/pad/unk, not in a rendered
    conversation): candidates for a drafter's mask token."""
    ids = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    reserved = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    used: set[int] = set()
    if tokenizer.chat_template is not None:
        conversation = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                        {"role": "assistant", "content": "a"}, {"role": "user", "content": "v"}]
        try:
            used = set(tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True,
                                                     return_dict=False))
        except Exception:  # a template that refuses a system turn, say: fall back to one user turn
            used = set(tokenizer.apply_chat_template(conversation[1:2], add_generation_prompt=True, tokenize=True,
                                                     return_dict=False))
    return [(i, tokenizer.convert_ids_to_tokens(i)) for i in sorted(ids - reserved - used)][:limit]


TRAIN_HELP = {  # one line per TrainDrafterConfig field (tests check that every field has an option)
    "kind": "the drafter kind to train",
    "base": "with --kind grown: the pretrained model grown into a drafter (e.g. qwen2.5-coder-0.5b)",
    "lora_rank": "with --kind grown: rank of the LoRA adapters (alpha = 2 * rank)",
    "base_layers": "with --kind grown: keep N of the base's decoder layers, spread evenly from first to last, and "
                   "train the adapters over them (cheaper drafts; default: all)",
    "adapt": "with --kind grown: the tokens the adapters act on: all (merged on load: one plain forward) or masks "
             "(peft's activated LoRA from the first mask on: the root's row and the context stay the base's)",
    "init_layers": "with --kind dflash: random (published), or start the drafter layers from the target's own last "
                   "or first layers",
    "num_hidden_layers": "drafter transformer layers (published: 5; 1-3 fit a CPU)",
    "block_size": "root + drafted slots per block (published: 16)",
    "target_layer_ids": "comma-separated target layers read (default: one per drafter layer, spread from 1 to L-3)",
    "draft_vocab_size": "score only the N most frequent tokens of the training data (default: all)",
    "anchors_per_sequence": "blocks per sequence per step (published: up to 512)",
    "anchor_region": "answer: blocks start only in a record's answer (after its n_prompt tokens), as at inference; all: anywhere",
    "max_seq_len": "longer sequences are cut to their first N tokens",
    "sequences_per_step": "sequences whose gradients add up before one optimizer step",
    "epochs": "passes over the training sequences (published: 6)",
    "lr": "peak AdamW learning rate (published: 6e-4)",
    "warmup_fraction": "share of all steps spent warming the learning rate up (published: 0.04)",
    "weight_decay": "AdamW weight decay",
    "grad_clip": "gradient-norm clip (published: 1.0)",
    "gamma": "slot-weight decay exp(-(k-1)/gamma) (default: 7, 5, 4 for blocks of 16, 10, 8)",
    "soft_label_weight": "share of the loss given to KL(target top-k || drafter); 0: hard labels only",
    "soft_label_top_k": "tokens of the target's distribution kept for soft labels",
    "eval_sequences": "sequences held out to measure loss and per-slot accuracy",
    "eval_every": "optimizer steps between evaluations (each appends a line to log.jsonl)",
    "save_every": "optimizer steps between resumable checkpoints",
    "stop_after_steps": "end this run at this step (the schedule still spans all epochs); rerun to resume",
    "dtype": "the target's weights and the drafter's compute: float32 or bfloat16",
    "seed": "drafter init, held-out split, data order and anchors",
    "max_steps": "cut the whole schedule (warm-up, decay) to N optimizer steps, for a time budget on much data; "
                 "another N on a resumed run extends it: the data order and optimizer go on, the learning rate warms "
                 "up and decays again over the steps left (default: all epochs)",
    "init_from": "start from the weights of another run folder, a drafter folder of the same kind, or 'shipped' (the "
                 "drafter taps ships for --target), of the same drafter options: e.g. to go on with more --data, "
                 "which a resumed run refuses, or on a machine without the run that trained it; its schedule starts "
                 "anew (default: none)",
}
TRAIN_REQUIRED = ("target", "data", "out", "mask_token_id", "progress")  # options of their own


DEFAULT_PROMPTS = 1000  # prompts answered when no --data is given: ~150K answer tokens, hours of a CPU


def default_run(target: str) -> Path:
    """Where `taps train-drafter --target X` trains when no --out is given: under the taps home."""
    from taps.assets import taps_home

    return taps_home() / "drafters" / target.strip("/").replace("/", "--")


def _mask_token(target: str, given: int | None) -> int:
    """--mask-token-id, else the first unused special token of the target's tokenizer (said)."""
    if given is not None:
        return given
    from transformers import AutoTokenizer

    from taps.assets import resolve

    candidates = mask_token_candidates(AutoTokenizer.from_pretrained(resolve(target)))
    if not candidates:
        raise ValueError(f"{target}'s tokenizer has no unused special token to fill drafter blocks with: pass "
                         "--mask-token-id (a token the target never needs, never pad or eos)")
    token, text = candidates[0]
    others = ", ".join(f"{i} {t!r}" for i, t in candidates[1:])
    print(f"block filler (mask token): {token} {text!r}, the first unused special token; others: {others or 'none'}; "
          "choose with --mask-token-id")
    return token


def _train_drafter(args) -> int:
    from taps.train.drafter import LOG_FILE, TrainDrafterConfig, train_drafter

    out = Path(args.out) if args.out else default_run(args.target)
    files = [Path(d) for d in args.data] if args.data else [out / "data.jsonl"]
    prompts = DEFAULT_PROMPTS if args.prompts is None and args.data is None else args.prompts
    if prompts is not None and len(files) > 1:
        raise ValueError("--prompts generates into one --data file: give one, or drop --prompts")
    missing = [str(f) for f in files if not f.is_file()]
    if prompts is None and missing:
        raise ValueError(f"no data file {', '.join(missing)}; make it with `taps gen-data` or pass --prompts N")
    data = files[0]  # where --prompts generates
    fields = {name: getattr(args, name) for name in TRAIN_HELP}
    # the options are checked before the tokenizer loads; then the mask token, said when chosen
    cfg = TrainDrafterConfig(target=args.target, data=files, out=str(out),
                             mask_token_id=args.mask_token_id or 0, progress=not args.no_progress, **fields)
    cfg = dataclasses.replace(cfg, mask_token_id=_mask_token(args.target, args.mask_token_id))
    _warn_emulated_bfloat16(cfg.dtype, *([args.gen_dtype] if prompts is not None else []))
    print(f"run folder: {out}; data: {', '.join(map(str, files))}" + (f" ({prompts} prompts)" if prompts is not None else ""))
    if prompts is not None:
        from taps.train.data import generate_data

        # resumable and a no-op once complete: the data are generated once and reused after
        data.parent.mkdir(parents=True, exist_ok=True)
        result = generate_data(args.target, data, prompts, max_new_tokens=args.gen_max_new_tokens,
                               batch_size=args.gen_batch_size, dtype=args.gen_dtype, seed=args.gen_seed,
                               progress=not args.no_progress)
        if result.generated:
            print(f"{result.path}: {result.n_prompts} prompts answered ({result.generated} now), {result.tokens} tokens")
    result = train_drafter(cfg)
    print(f"drafter saved in {result.drafter_dir} (step {result.step} of {result.total_steps})")
    log = out / LOG_FILE
    lines = [line for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
    evals = [line for line in lines if "eval_loss" in json.loads(line)]
    print(f"last evaluation: {evals[-1] if evals else (lines[-1] if lines else '-')}")
    if result.step < result.total_steps:
        print("stopped early: rerun the same command to resume")
    elif args.scorer_prompts:
        _train_drafters_scorer(args, result.drafter_dir, out)
    print(f"use it: taps generate --target {args.target} --drafter {result.drafter_dir} --prompt ...")
    return 0


def _train_drafters_scorer(args, drafter_dir: Path, out: Path) -> None:
    """The edge scorer for a finished drafter, kept in its folder when it passes the guard
    (taps.train.scorer.check_guard); otherwise the drafter ships without one and taps scores by
    its plain marginals."""
    import shutil

    from taps.drafters.loading import SCORER_DIR
    from taps.train.scorer import ScorerGuardError, TrainScorerConfig, train_scorer

    if (drafter_dir / SCORER_DIR).is_dir():
        return  # trained by an earlier run of this command
    n = args.scorer_prompts
    cfg = TrainScorerConfig(target=args.target, drafter=str(drafter_dir), out=str(out / "scorer-run"), prompts=n,
                            eval_prompts=n // 8 or min(1, n - 1),  # the guard's held-out prompts
                            prompt_seed=args.gen_seed + 1, dtype=args.dtype, progress=not args.no_progress)
    try:
        result = train_scorer(cfg)
    except ScorerGuardError as err:
        print(f"edge scorer not kept: {err}")
        return
    shutil.copytree(result.scorer_dir, drafter_dir / SCORER_DIR)
    print(f"edge scorer saved in {drafter_dir / SCORER_DIR} (passed the held-out guard; log: {result.log_path})")


def _add_gen_data(sub) -> None:
    from taps.assets import DTYPES
    from taps.train.data import BATCH_SIZES, ENGINES

    d = sub.add_parser("gen-data", help="self-distillation data: the target's greedy or sampled answers to training prompts")
    d.add_argument("--target", required=True, help="packaged model name, local HF folder or hub id")
    d.add_argument("--out", required=True, help="JSONL file of {prompt_index, prompt, ids, n_prompt}; a rerun resumes")
    d.add_argument("--prompts", type=bounded(int, 0), required=True, help="training prompts to answer (a larger N later adds more; 0 with --text-tokens: text only)")
    d.add_argument("--max-new-tokens", type=bounded(int, 1), default=256, help="longest answer (256)")
    d.add_argument("--batch-size", type=bounded(int, 1, 4096), default=None,
                   help=f"prompts per call: per left-padded generate call ({BATCH_SIZES['transformers']}), or per "
                        f"call of vLLM's engine, which batches them itself ({BATCH_SIZES['vllm']}); the file grows "
                        "by one call's answers")
    d.add_argument("--dtype", choices=list(DTYPES), default="float32",
                   help="float32 (default) or bfloat16 (faster where the CPU has native bfloat16 kernels)")
    d.add_argument("--seed", type=SEED, default=0, help="which training prompts, in which order, and the draws (0)")
    d.add_argument("--temperature", type=bounded(float, 0.0, 100.0), default=0.0,
                   help="0: greedy answers (default); > 0: answers sampled at this temperature, so the drafter "
                        "also learns the law sampled decoding verifies against (use another --out than greedy's)")
    d.add_argument("--engine", choices=list(ENGINES), default="transformers",
                   help="what generates: transformers (default) or vllm (the vllm extra: make install-vllm, then "
                        ".venv-vllm/bin/taps gen-data; several times faster on a CPU; pinned in the file)")
    d.add_argument("--mix", type=prompt_mix, default=None,
                   help="which training prompts: SOURCE=WEIGHT,... over code-write, code-explain, math, reasoning, "
                        "general, chat (default: all but chat, taps.train.prompts.DEFAULT_MIX; pinned in the file)")
    d.add_argument("--follow-up", default=None, metavar="FILE",
                   help="second turns instead: prompt i continues FILE's prompt i and the target's answer to it with "
                        "a follow-up request (FILE: a gen-data file of this target; taps.train.followup; pinned)")
    d.add_argument("--text-tokens", type=bounded(int, 0), default=0, help="also add N tokens of raw stdlib source (0)")
    d.add_argument("--text-seq-len", type=bounded(int, 2), default=512, help="tokens per stdlib text sequence (512)")
    d.set_defaults(func=_gen_data)


def _add_train_drafter(sub) -> None:
    from taps.assets import DTYPES
    from taps.train.drafter import ADAPT, ANCHOR_REGIONS, INIT_LAYERS, KINDS, TrainDrafterConfig

    t = sub.add_parser("train-drafter", help="train (or resume) a block drafter for a target: its own answers as "
                                             "data, the drafter, its edge scorer; rerun to resume")
    t.add_argument("--target", required=True, help="the frozen target: packaged model name, folder or hub id")
    t.add_argument("--out", default=None, help="run folder: data.jsonl, state.pt (resume), drafter/, log.jsonl "
                                                "(default: $TAPS_HOME/drafters/TARGET)")
    t.add_argument("--data", nargs="+", default=None, help='JSONL files of {"ids": [...]} records, from `taps gen-data` '
                                                f"(default: OUT/data.jsonl, made with --prompts {DEFAULT_PROMPTS})")
    t.add_argument("--mask-token-id", type=bounded(int, 0), default=None,
                   help="block filler token id: an unused special token (default: the tokenizer's first one, said)")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")
    t.add_argument("--prompts", type=bounded(int, 0), default=None,
                   help="first run `gen-data` for N prompts into --data (resumed, then reused; "
                        f"default {DEFAULT_PROMPTS} when --data is not given)")
    t.add_argument("--scorer-prompts", type=bounded(int, 0), default=64,
                   help="once the drafter is trained, record this many prompts and train its edge scorer, kept "
                        "in drafter/scorer if it beats the plain marginals on held-out prompts (0: none; 64)")
    t.add_argument("--gen-max-new-tokens", type=bounded(int, 1), default=256, help="with --prompts: longest answer (256)")
    t.add_argument("--gen-batch-size", type=bounded(int, 1, 4096), default=8, help="with --prompts: prompts per generate call (8)")
    t.add_argument("--gen-dtype", choices=list(DTYPES), default="float32", help="with --prompts: float32 or bfloat16")
    t.add_argument("--gen-seed", type=SEED, default=0, help="with --prompts: which training prompts (0)")
    optional_int = lambda text: None if text.lower() == "none" else int(text)  # noqa: E731
    optional_float = lambda text: None if text.lower() == "none" else float(text)  # noqa: E731
    for f in dataclasses.fields(TrainDrafterConfig):
        if f.name in TRAIN_REQUIRED:
            continue
        kind = {"int": int, "float": float, "str": str, "int | None": optional_int, "float | None": optional_float,
                "tuple[int, ...] | None": csv_of(int), "str | None": str}[str(f.type)]
        extra = {"dtype": {"choices": list(DTYPES)}, "kind": {"choices": list(KINDS)},
                 "anchor_region": {"choices": list(ANCHOR_REGIONS)},
                 "init_layers": {"choices": list(INIT_LAYERS)}, "adapt": {"choices": list(ADAPT)}}.get(f.name, {})
        text = TRAIN_HELP[f.name] if "default" in TRAIN_HELP[f.name] else f"{TRAIN_HELP[f.name]}; default {f.default}"
        if f.name == "kind":  # each registered kind says what it is
            text += "; " + "; ".join(f"{kind.name}: {kind.doc}" for kind in KINDS.values())
        t.add_argument("--" + f.name.replace("_", "-"), type=kind, default=f.default, help=text, **extra)
    t.set_defaults(func=_train_drafter)


def _train_scorer(args) -> int:
    from taps.train.scorer import HELP, TrainScorerConfig, train_scorer

    fields = {name: getattr(args, name) for name in HELP}
    for f in dataclasses.fields(TrainScorerConfig):
        if str(f.type) == "bool":  # the options are --no-... flags
            fields[f.name] = not fields[f.name]
    cfg = TrainScorerConfig(target=args.target, drafter=args.drafter, out=args.out, **fields)
    _warn_emulated_bfloat16(cfg.dtype)
    result = train_scorer(cfg)
    print(f"scorer saved in {result.scorer_dir} ({result.train_pools} training pools, {result.eval_pools} held out); "
          f"use it with --method taps --scorer {result.scorer_dir}")
    print(f"last log line ({result.log_path}): {json.dumps(result.last)}")
    return 0


def _add_train_scorer(sub) -> None:
    from taps.assets import DTYPES
    from taps.train.scorer import HELP, TrainScorerConfig

    t = sub.add_parser("train-scorer", help="record verification traces of a target and drafter, train the TAPS "
                                            "edge scorer on them (docs/method.md 3.4e)")
    t.add_argument("--target", required=True, help="packaged model name, local HF folder or hub id")
    t.add_argument("--drafter", required=True, help="a trained drafter folder or a test drafter name")
    t.add_argument("--out", required=True, help="run folder: traces/ (recorded once, then reused), scorer/, log.jsonl")
    optional_int = lambda text: None if text.lower() == "none" else int(text)  # noqa: E731
    for f in dataclasses.fields(TrainScorerConfig):
        if f.name not in HELP:
            continue
        flag = "--" + f.name.replace("_", "-")
        if str(f.type) == "bool":  # the defaults are on: the flag turns them off
            t.add_argument("--no-" + flag[2:], dest=f.name, action="store_true", help=HELP[f.name])
            continue
        kind = {"int": int, "float": float, "str": str, "int | None": optional_int}[str(f.type)]
        extra = {"choices": list(DTYPES)} if f.name == "dtype" else {}
        text = HELP[f.name] if "default" in HELP[f.name] else f"{HELP[f.name]} ({f.default})"
        t.add_argument(flag, type=kind, default=f.default, help=text, **extra)
    t.set_defaults(func=_train_scorer)


def add_commands(sub) -> None:
    _add_gen_data(sub)
    _add_train_drafter(sub)
    _add_train_scorer(sub)
