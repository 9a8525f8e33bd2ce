"""``codechat eval``: ``run`` samples and judges a suite (:func:`codechat.eval.suites.run_suite`),
``filter`` keeps the problems whose pass rate is in a range (:func:`codechat.eval.passk.filter_by_pass_rate`).

:func:`add_cli` registers both subcommands; the model, torch and the suite runner are imported
only when ``run`` runs.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from codechat.eval.passk import filter_by_pass_rate
from codechat.eval.problems import load_problems

def _ks(text: str) -> list[int]:
    try:
        return [int(k) for k in text.split(",") if k.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k takes comma-separated integers such as 1,10, got {text!r}") from None


def add_cli(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``eval`` with its ``run`` and ``filter`` subcommands; each sets ``func(args) -> int``."""
    p = subparsers.add_parser("eval", help="evaluate generated code")
    sub = p.add_subparsers(dest="eval_command", required=True)
    r = sub.add_parser("run", help="sample HumanEval / MBPP solutions, judge them in the sandbox, report pass@k "
                                   "and the pre-RL verdict",
                       description="Samples --n completions per problem, judges each in the sandbox as it comes, "
                                   "appends it to OUT/samples.jsonl (a rerun resumes) and writes OUT/results.json: "
                                   "pass@k, counts per result kind, timing and the verdict.")
    r.add_argument("--model", required=True, help="checkpoint, stage directory (its newest checkpoint) or run "
                                                  "directory (its rl/, sft/ or pretrain/ stage, first found; "
                                                  "funcall/ first for --suite funcall:PATH)")
    r.add_argument("--suite", required=True, help="humaneval (the copy shipped with codechat), humaneval:PATH, "
                                                  "mbpp:PATH (MBPP's published mbpp.jsonl), or funcall:PATH "
                                                  "(conversations with tools: every assistant turn is scored for "
                                                  "the right call or for no call; --split heldout|train|all, "
                                                  "'test' meaning heldout)")
    r.add_argument("--split", default="test", help="MBPP split: test (11-510, default), validation (511-600), "
                                                   "train (601-974), prompt (1-10) or all; HumanEval: test; "
                                                   "funcall: heldout (test), train or all")
    r.add_argument("--strict", default="off", choices=["off", "on", "both"],
                   help="funcall only: on generates every reply under the strict tool grammar (tool_choice auto: "
                        "the model still chooses text or a call, a call always parses and fits its schema); both "
                        "runs the free and the strict pass and reports each; off (default) the free pass. on/both "
                        "need the grammar extra (pip install 'codechat[grammar]')")
    r.add_argument("--n", type=int, default=20, help="samples per problem (default 20)")
    r.add_argument("--k", type=_ks, default=[1, 10], help="the k of each pass@k, comma-separated; each <= --n "
                                                          "(default 1,10)")
    r.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default 0.8; 0: greedy)")
    r.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default 0.95; 1: off)")
    r.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest tokens (default 0: off)")
    r.add_argument("--max-new-tokens", type=int, default=512, help="tokens generated per sample at most "
                                                                   "(default 512; the model's context caps it)")
    r.add_argument("--limit", type=int, help="only the first N problems (by task id)")
    r.add_argument("--seed", type=int, default=0, help="sampling seed (default 0); each problem's samples "
                                                       "get random streams derived from it and the task id")
    r.add_argument("--shots", type=int, default=3, help="MBPP base mode: solved examples from tasks 2-4 before "
                                                        "the task (default 3, the MBPP paper's protocol)")
    r.add_argument("--mode", default="auto", choices=["auto", "chat", "base"],
                   help="chat: the problem as a user turn; base: completion mode; auto (default): base for a "
                        "pretrain checkpoint, chat for any later stage")
    r.add_argument("--batch-size", type=int, default=0, help="samples decoded at once, across problems (the "
                                                             "engine's KV-cache slots; default 0: 256 on CUDA, 16 "
                                                             "elsewhere); samples do not depend on it")
    r.add_argument("--workers", type=int, default=0, help="programs judged in parallel (default 0: one per CPU core)")
    r.add_argument("--timeout", type=float, default=10.0, help="seconds per program (default 10)")
    r.add_argument("--memory-mb", type=int, default=1024, help="address-space limit per program (default 1024)")
    r.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"], help="default auto")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument("--out", required=True, type=Path, help="directory for samples.jsonl, results.json, run.json")
    r.set_defaults(func=_cli_run)
    f = sub.add_parser("filter", help="keep problems whose sampled pass rate is in [min, max] "
                                      "so every RL group has reward variance")
    f.add_argument("--samples", required=True, type=Path,
                   help="samples.jsonl written by `codechat eval run`")
    f.add_argument("--min", dest="min_rate", type=float, default=0.05,
                   help="lowest pass rate kept (default 0.05)")
    f.add_argument("--max", dest="max_rate", type=float, default=0.95,
                   help="highest pass rate kept (default 0.95)")
    f.add_argument("--out", required=True, type=Path, help="tasks.jsonl to write")
    f.set_defaults(func=_cli_filter)
    return p


def _cli_run(args: argparse.Namespace) -> int:
    """``codechat eval run``: validate everything cheap first, then load the model and run."""
    # torch, the model and the suite runner load only for this subcommand
    if args.suite.startswith("funcall:"):
        return _cli_run_funcall(args)
    if args.strict != "off":
        raise ValueError(f"--strict {args.strict} applies to --suite funcall:PATH only, not {args.suite}")
    from codechat.eval.suites import check_ks, format_summary, resolve_mode, run_suite
    check_ks(args.k, args.n)
    problems = load_problems(args.suite, args.split, limit=args.limit, shots=args.shots)
    from codechat.checkpoint import load_model, resolve
    from codechat.config.device import resolve_device
    ckpt = resolve(args.model)
    model, tok, state = load_model(ckpt, resolve_device(args.device))
    stage = state.get("meta", {}).get("stage", "pretrain")
    mode = resolve_mode(args.mode, stage)
    print(f"model {ckpt} (stage {stage}, step {state.get('step')}): {args.suite} in {mode} mode, "
          f"{len(problems)} problems x {args.n} samples -> {args.out}")
    results = run_suite(model, tok, out_dir=args.out, suite=args.suite, split=args.split, stage=stage, mode=mode,
                        n=args.n, ks=args.k, limit=args.limit, temperature=args.temperature, top_p=args.top_p,
                        top_k=args.top_k, max_new_tokens=args.max_new_tokens, seed=args.seed, shots=args.shots,
                        batch_size=args.batch_size, workers=args.workers, timeout_s=args.timeout,
                        memory_mb=args.memory_mb, model_id=f"{ckpt.resolve()}@{state.get('step')}",
                        progress=not args.quiet)
    print(format_summary(results))
    print(f"wrote {Path(args.out) / 'results.json'} and {Path(args.out) / 'samples.jsonl'}")
    return 0


def _cli_run_funcall(args: argparse.Namespace) -> int:
    """``codechat eval run --suite funcall:PATH``: every assistant turn of the split, scored."""
    from codechat.checkpoint import FUNCALL_STAGES, load_model, resolve
    from codechat.config.device import resolve_device
    from codechat.engine import Engine, EngineConfig
    from codechat.eval.funcall import format_summary, load_cases, run_funcall_suite
    path = args.suite.split(":", 1)[1]
    if not path:
        raise ValueError("--suite funcall:PATH needs the path of a conversations file after 'funcall:'")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    split = "heldout" if args.split == "test" else args.split
    load_cases(path, split, args.limit)  # bad input is reported before the model loads
    ckpt = resolve(args.model, FUNCALL_STAGES)
    model, tok, state = load_model(ckpt, resolve_device(args.device))
    engine = Engine(model, EngineConfig(slots=args.batch_size))
    print(f"model {ckpt} (stage {state.get('meta', {}).get('stage')}, step {state.get('step')}): "
          f"function calling on {path} ({split}, strict {args.strict}) -> {args.out}")
    results = run_funcall_suite(engine, tok, path=path, out_dir=args.out, split=split,
                                max_new_tokens=args.max_new_tokens, limit=args.limit,
                                model_id=f"{ckpt.resolve()}@{state.get('step')}", strict=args.strict)
    print(format_summary(results))
    print(f"wrote {Path(args.out) / 'results.json'} and {Path(args.out) / 'samples.jsonl'}")
    return 0


def _cli_filter(args: argparse.Namespace) -> int:
    try:
        kept = filter_by_pass_rate(args.samples, args.min_rate, args.max_rate)
    except (ValueError, OSError) as e:  # EmptyFilterError included
        print(f"error: {e}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for row in kept:
            f.write(json.dumps(row) + "\n")
    print(f"kept {len(kept)} problems with pass rate in [{args.min_rate}, {args.max_rate}] "
          f"-> {args.out}")
    return 0
