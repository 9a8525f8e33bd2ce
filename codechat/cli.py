"""The ``codechat`` command: one subcommand per stage.

Training commands accept dotted config overrides after their own flags
(``codechat pretrain --preset tiny --optim.lr 1e-3 --train.micro_batch_size 8``).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Iterable

from codechat.config.cli_args import MODEL_HELP, add_common
from codechat.config.stages import ConfigError


def _add_pretrain(sub: argparse._SubParsersAction) -> None:
    from codechat.config.stages import PRESETS
    p = sub.add_parser("pretrain", help="pretrain a GPT on token shards (default: the Python stdlib)",
                       description="Pretrain on token shards. Without --data/--tokenizer the default tokenizer and "
                                   "corpus (this Python's standard library) are built into --out. Any setting can be "
                                   "overridden as --section.field VALUE (sections: model, data, optim, train, run).")
    p.add_argument("--preset", default="tiny", choices=list(PRESETS), help="model shape and its recipe (default tiny)")
    p.add_argument("--config", help="YAML file of settings, applied over the preset")
    p.add_argument("--data", help="token-shard directory made by `codechat data corpus`")
    p.add_argument("--tokenizer", help="tokenizer directory made by `codechat tokenizer train`")
    p.add_argument("--init", help="continue pretraining this checkpoint or stage directory, or hf:PATH (a Llama / "
                                  "Qwen3 directory or Hub repo id): its shape and tokenizer replace the preset's")
    p.add_argument("--max-steps", type=int, help="optimizer steps (train.max_steps)")
    p.add_argument("--time-budget-min", type=_minutes, help="stop after this many minutes of training (> 0)")
    _add_stage_io(p, "pretrain")
    _add_parallel(p)
    add_common(p)
    p.set_defaults(func=_cmd_pretrain, accepts_overrides=True)


def _minutes(text: str) -> float:
    """An argparse ``type`` for a time in minutes: a number > 0, else a usage error (exit 2) naming the flag."""
    try:
        minutes = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of minutes, got {text!r}") from None
    if not minutes > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 minutes, got {text} (leave the flag out for no time limit)")
    return minutes


#: The settings that a training command's flag sets under another name, its value unchanged, and that
#: flag: an error about the setting names the flag when the value came from it (:func:`_stage_config`).
#: ``--time-budget-min`` (minutes; ``train.time_budget_s`` holds seconds) is checked as it is parsed.
FLAG_OF_SETTING = {
    "train.max_steps": "--max-steps", "train.epochs": "--epochs", "train.save_every_s": "--checkpoint-every-s",
    "run.out": "--out", "run.seed": "--seed", "data.data_dir": "--data", "data.tokenizer_dir": "--tokenizer",
    "sft.data": "--data", "sft.seed": "--seed", "sft.max_examples": "--max-examples",
    "sft.teacher_completions": "--teacher-completions", "rl.tasks": "--tasks", "rl.split": "--split",
    "rl.group_size": "--group-size", "rl.prompts_per_step": "--prompts-per-step",
    "rl.max_new_tokens": "--max-new-tokens", "rl.dead_steps": "--dead-steps", "rl.filter_samples": "--filter-samples"}


def _name_flags(message: str, settings: Iterable[str]) -> str:
    """``message`` with each of ``settings`` that :data:`FLAG_OF_SETTING` lists written as its flag
    (``train.max_steps must be >= 0`` -> ``--max-steps must be >= 0``; ``--train.max_steps`` stays)."""
    for key in settings:
        if key in FLAG_OF_SETTING:
            message = re.sub(rf"(?<![\w.-]){re.escape(key)}(?![\w.])", FLAG_OF_SETTING[key], message)
    return message


def _stage_config(cls: type, path: str | None, flags: dict, overrides: dict[str, str], base=None):
    """A stage's config: defaults (or ``base``) <- YAML ``path`` <- the named flags given (not None)
    <- dotted overrides.

    Raises:
        ConfigError: a bad setting, named by the flag the user typed when a named flag gave it
            (:data:`FLAG_OF_SETTING`); ``run.resume`` (``--resume``) when ``run.out`` holds no
            checkpoint, which would silently start from step 0.
    """
    from codechat.config.stages import load
    given = {k: v for k, v in flags.items() if v is not None}
    try:
        cfg = load(cls, path, {**given, **overrides}, base=base)
    except ConfigError as e:
        e.args = (_name_flags(str(e), [k for k in given if k not in overrides]),)
        raise
    if cfg.run.resume:
        from .checkpoint import list_checkpoints
        checkpoints = Path(cfg.run.out) / "checkpoints"
        if not list_checkpoints(checkpoints):
            raise ConfigError(f"--resume: {cfg.run.out} holds no checkpoint to continue from (none in {checkpoints}); "
                              "drop --resume to start a new run there")
    return cfg


def _say(text: str) -> None:
    """Print on rank 0 only (every rank of a torchrun world runs the same command)."""
    import os
    if os.environ.get("RANK", "0") == "0":
        print(text)


def _add_parallel(p: argparse.ArgumentParser) -> None:
    from codechat.config.stages import PARALLEL_STRATEGIES
    p.add_argument("--parallel", choices=PARALLEL_STRATEGIES,
                   help="under torchrun: ddp (replicas, default), fsdp (sharded) or hsdp (sharded within a node, "
                        "replicated across nodes); one process ignores it (train.parallel)")
    p.add_argument("--ac", choices=["none", "selective", "full"],
                   help="activation checkpointing: full recomputes each block's activations in the backward pass, "
                        "trading ~1/3 more compute for activation memory; selective keeps the attention and every "
                        "other matmul output and recomputes the rest (train.ac; default none)")
    p.add_argument("--pp", type=int, help="under torchrun: pipeline stages; world size / N ranks replicate each stage "
                                          "(train.pp; schedule and micro-batches: --train.pp_schedule gpipe|1f1b, "
                                          "--train.pp_microbatches M)")


HF_INIT_HELP = "or hf:PATH (a Llama / Qwen3 directory or Hub repo id, imported into OUT/hf_init)"


def _add_stage_io(p: argparse.ArgumentParser, stage: str) -> None:
    """A training stage's --out, --checkpoint-every-s, --resume and --peft (read back by :func:`_stage_flags`)."""
    p.add_argument("--out", help=f"stage directory (default runs/default/{stage})")
    p.add_argument("--checkpoint-every-s", type=float,
                   help="also save a checkpoint after this many seconds of training, so a killed run resumes close "
                        "to where it stopped (train.save_every_s; default: every train.save_every steps only)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    from codechat.train.stop import add_stop_flag
    add_stop_flag(p)
    p.add_argument("--peft", choices=["none", "lora"],
                   help="lora: train LoRA adapters on the frozen --init (AdamW; --lora.rank R --lora.alpha A "
                        "--lora.dropout P --lora.targets q,k,v,o,gate,up,down); checkpoints hold the adapters and "
                        "name their base (default none: every weight is trained)")


def _stage_flags(args: argparse.Namespace, parallel: bool = True) -> dict:
    """The flags every training stage shares, as dotted settings: --init, :func:`_add_stage_io`'s,
    :func:`~codechat.config.cli_args.add_common`'s and (``parallel``) :func:`_add_parallel`'s."""
    flags = {"init": args.init, "run.out": args.out, "run.resume": args.resume or None, "run.seed": args.seed,
             "run.device": args.device, "train.save_every_s": args.checkpoint_every_s, "peft": args.peft}
    if parallel:
        flags.update({"train.parallel": args.parallel, "train.ac": args.ac, "train.pp": args.pp})
    return flags


def pretrain_config(args: argparse.Namespace, overrides: dict[str, str]):
    """Preset recipe <- YAML file <- named flags <- dotted overrides."""
    from codechat.config.stages import PretrainConfig, pretrain_recipe
    flags = {**_stage_flags(args), "data.data_dir": args.data, "data.tokenizer_dir": args.tokenizer,
             "train.max_steps": args.max_steps,
             "train.time_budget_s": args.time_budget_min * 60 if args.time_budget_min else None}
    if args.time_budget_min and args.max_steps is None:
        flags["train.max_steps"] = 0
    return _stage_config(PretrainConfig, args.config, flags, overrides, base=pretrain_recipe(args.preset))


def _cmd_pretrain(args: argparse.Namespace, overrides: dict[str, str]) -> int:
    from .train.pretrain import run_pretrain
    cfg = pretrain_config(args, overrides)
    result = run_pretrain(cfg)
    _say(f"done: step {result['step']}, val_bpb {result.get('val_bpb', float('nan')):.4f}, "
          f"checkpoints in {Path(cfg.run.out) / 'checkpoints'}")
    return 0


def _add_sft(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sft", help="chat SFT of a pretrained model (assistant-only loss)",
                       description="Fine-tune --init on a data mixture SOURCE[:WEIGHT],... (local .jsonl/.json/.parquet "
                                   "files or directories, hf:ORG/NAME[:CONFIG][@SPLIT]). Without --data, docstring -> "
                                   "function pairs mined from this Python's standard library. Overrides: "
                                   "--sft.*, --optim.*, --train.*, --run.*.")
    p.add_argument("--init", help=f"pretrained stage directory (its newest checkpoint), checkpoint, run directory (its "
                                  f"last code stage, printed), {HF_INIT_HELP}")
    p.add_argument("--data", help="mixture spec, e.g. mbpp.jsonl:1,code_alpaca.json:0.5 (default: mined pairs)")
    p.add_argument("--config", help="YAML file of settings")
    p.add_argument("--max-steps", type=int, help="optimizer steps (default: --epochs over the data)")
    p.add_argument("--epochs", type=float, help="passes over the data (default 1)")
    p.add_argument("--packing", action="store_true", help="best-fit pack examples into full rows")
    p.add_argument("--max-examples", type=int, help="a seeded subset of N records (smoke runs)")
    p.add_argument("--skip-bad", action="store_true", help="skip and count records that fit no format")
    p.add_argument("--teacher-completions", metavar="DIR/completions.jsonl",
                   help="answers of `codechat distill`: each --data record is its prompt (up to its last user turn) "
                        "plus the teacher's answer, joined by prompt id; a prompt without one is an error "
                        "(sft.teacher_completions)")
    _add_stage_io(p, "sft")
    _add_parallel(p)
    add_common(p)
    p.set_defaults(func=_cmd_sft, accepts_overrides=True)


def _cmd_sft(args: argparse.Namespace, overrides: dict[str, str]) -> int:
    from codechat.config.sft import SFTStageConfig
    from .train.sft import run_sft
    flags = {**_stage_flags(args), "sft.data": args.data, "train.max_steps": args.max_steps,
             "train.epochs": args.epochs, "sft.packing": args.packing or None, "sft.max_examples": args.max_examples,
             "sft.skip_bad": args.skip_bad or None, "sft.seed": args.seed,
             "sft.teacher_completions": args.teacher_completions}
    if args.max_steps is not None and args.epochs is None:
        flags["train.epochs"] = 0.0
    cfg = _stage_config(SFTStageConfig, args.config, flags, overrides)
    result = run_sft(cfg)
    _say(f"done: step {result['step']}, loss {result.get('loss', float('nan')):.4f}, "
          f"checkpoints in {Path(cfg.run.out) / 'checkpoints'}")
    return 0


def _add_rl(sub: argparse._SubParsersAction) -> None:
    from .train.rollouts import REWARD_KINDS
    p = sub.add_parser("rl", help="GRPO on tasks judged by running code or checking function calls",
                       description="Reinforcement learning (GRPO) from --init on --tasks: mbpp:PATH, tasks:PATH (from "
                                   "`codechat eval filter`), humaneval[:PATH], funcall:PATH or doctest[:DIR] (default: "
                                   "doctests mined from this Python's standard library). A pass@k check runs first and "
                                   "refuses a run that would stall (or, with --filter-samples, a pass-rate filter keeps "
                                   "the tasks the policy sometimes solves); a run that goes --dead-steps steps without signal "
                                   "stops with a checkpoint. Overrides: --rl.*, --optim.*, --train.*, --run.* "
                                   "(metrics: codechat.train.grpo).")
    p.add_argument("--init", help=f"SFT stage directory (its newest checkpoint), checkpoint, run directory (its last "
                                  f"code stage, printed), {HF_INIT_HELP}")
    p.add_argument("--tasks", help="task spec (default doctest); several joined by + make one pool, e.g. "
                                   "mbpp:mbpp.jsonl+doctest (decontaminated against HumanEval and --rl.mbpp_file)")
    p.add_argument("--split", help="task split (default: the spec's RL default, MBPP train)")
    p.add_argument("--filter-samples", type=int, metavar="N",
                   help="before step 0 sample N completions of every task and train only on those the policy "
                        "sometimes solves (replaces the pass@k check; bounds --rl.filter_min/--rl.filter_max, "
                        "at least --rl.min_tasks 32 kept or RL is skipped)")
    p.add_argument("--group-size", type=int, help="samples per task, one GRPO group (default 8)")
    p.add_argument("--prompts-per-step", type=int, help="tasks per step (default 8)")
    p.add_argument("--reward", choices=["auto", *REWARD_KINDS], help="reward (default: tiered for code tasks, funcall_tiered for function-call tasks)")
    p.add_argument("--max-new-tokens", type=int, help="tokens sampled per completion at most (default 256)")
    p.add_argument("--loss-norm", choices=["token", "sequence"], help="loss per token (DAPO, default) or per sequence")
    p.add_argument("--max-steps", type=int, help="RL steps (default 50)")
    p.add_argument("--epochs", type=float, help="passes over the tasks trained on (those the filter kept, less the "
                                                "held-out slice), in place of --max-steps")
    p.add_argument("--dead-steps", type=int, help="stop after N steps in a row without signal (default 20)")
    p.add_argument("--force", action="store_true", help="start even when the pre-RL check says the run will stall")
    _add_stage_io(p, "rl")
    add_common(p)
    p.set_defaults(func=_cmd_rl, accepts_overrides=True)


def _cmd_rl(args: argparse.Namespace, overrides: dict[str, str]) -> int:
    from .train.grpo import RLStageConfig, run_rl
    flags = {**_stage_flags(args, parallel=False), "rl.tasks": args.tasks, "rl.split": args.split,
             "rl.group_size": args.group_size, "rl.prompts_per_step": args.prompts_per_step, "rl.reward": args.reward,
             "rl.max_new_tokens": args.max_new_tokens, "rl.loss_norm": args.loss_norm,
             "train.max_steps": args.max_steps, "train.epochs": args.epochs, "rl.dead_steps": args.dead_steps,
             "rl.force": args.force or None, "rl.filter_samples": args.filter_samples}
    if args.epochs is not None and args.max_steps is None:
        flags["train.max_steps"] = 0  # the default 50 would win over --epochs
    cfg = _stage_config(RLStageConfig, None, flags, overrides)
    result = run_rl(cfg)
    if result["stopped"] == "dead":
        print(f"codechat rl: stopped: {result['message']}", file=sys.stderr)
        return 3
    print(f"done: step {result['step']}, reward_mean {result.get('reward_mean', float('nan')):.3f}, "
          f"checkpoints in {Path(cfg.run.out) / 'checkpoints'}")
    return 0


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a checkpoint as one consolidated directory (model.safetensors)",
                       description="Write --model (a stage directory means its newest checkpoint; one written by "
                                   "any number of ranks) as OUT/model.safetensors + state.json + tokenizer/, which "
                                   "sample, chat, eval and --init load like any checkpoint; or with --format hf as a "
                                   "Hugging Face Llama / Qwen3 directory (config.json, tokenizer with the chat "
                                   "template, model card) that transformers loads. One process, CPU only.")
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument("--out", required=True, help="directory to write (replaced if it is an earlier export)")
    p.add_argument("--format", default="codechat", choices=["codechat", "hf", "peft"],
                   help="codechat (default): safetensors + config + tokenizer; hf: transformers' layout; peft: a "
                        "LoRA checkpoint's adapters as adapter_config.json + adapter_model.safetensors, which "
                        "peft's PeftModel.from_pretrained loads onto the --format hf export of its base")
    p.add_argument("--dtype", choices=["bf16", "fp32"],
                   help="--format hf: dtype of the weights (default bf16); --format peft: of the adapters (default fp32)")
    p.add_argument("--merge", action="store_true",
                   help="a LoRA checkpoint's adapters merged into its base: plain weights (--format codechat or hf)")
    p.set_defaults(func=_cmd_export)


def _cmd_export(args: argparse.Namespace) -> int:
    from .checkpoint import export, load, load_merged
    if args.format == "peft":
        if args.merge:
            raise ConfigError("--merge writes plain weights; --format peft writes the adapters unmerged: choose one")
        from .hf.peft import export_peft
        print(f"exported {args.model} -> {export_peft(load(args.model), args.out, args.dtype or 'fp32')} (PEFT LoRA)")
        return 0
    if args.format == "codechat":
        if args.dtype:
            raise ConfigError("--dtype applies to --format hf and peft only (the codechat format keeps the trained "
                              "dtype)")
        print(f"exported {args.model} -> {export(args.model, args.out, merge=args.merge)}")
        return 0
    from .hf import ExportConfig, export_hf
    config = ExportConfig(dtype=args.dtype or "bf16")
    c = load_merged(args.model) if args.merge else load(args.model)
    print(f"exported {args.model} -> {export_hf(c, args.out, config)} (Hugging Face, {config.dtype})")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse's parser, except that a missing subcommand (``codechat``, ``codechat eval``) prints the
    whole help, the list of commands, before the error (stderr, exit 2). Subparsers inherit the class."""

    def error(self, message: str) -> None:  # type: ignore[override]
        missing = message.startswith("the following arguments are required:")
        if missing and any(isinstance(a, argparse._SubParsersAction) and a.required
                           and (a.metavar or a.dest) in message for a in self._actions):
            self.print_help(sys.stderr)
            self.exit(2, f"\n{self.prog}: error: {message}\n")
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    from .chat import cli as chat_cli
    from .data import corpus
    from .data import inspect as data_inspect
    from .data import teacher, tokenizer_cli
    from .eval import cli as eval_cli
    from .serve import cli as serve_cli
    from .speedrun import cli as speedrun_cli
    from .train import plan_cli
    parser = _Parser(prog="codechat", description="Train your own code-chat model end to end.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    speedrun_cli.add_cli(sub)
    tokenizer_cli.add_cli(sub)
    data_inspect.add_cli(corpus.add_cli(sub))
    _add_pretrain(sub)
    _add_sft(sub)
    _add_rl(sub)
    _add_export(sub)
    plan_cli.add_cli(sub)
    chat_cli.add_cli(sub)
    serve_cli.add_cli(sub)
    eval_cli.add_cli(sub)
    teacher.add_cli(sub)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """The errors printed as one line (exit 2). ``CheckpointError`` and ``GrammarUnavailable`` (the grammar
    extra missing) only once their modules are imported (a command that raised one imported it): importing
    them loads torch, ~200 MB and a second, for commands that never touch a checkpoint (``tokenizer``,
    ``data``) and their worker processes."""
    checkpoint = sys.modules.get(f"{__package__}.checkpoint")
    grammar = sys.modules.get(f"{__package__}.engine.grammar")
    return ((ConfigError, FileNotFoundError, ValueError) + ((checkpoint.CheckpointError,) if checkpoint else ())
            + ((grammar.GrammarUnavailable,) if grammar else ()))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``codechat`` console script; returns the exit code."""
    from codechat.config.log import setup_cli_logging
    from codechat.config.stages import parse_overrides
    from codechat.config.threads import calm_threads_when_busy
    setup_cli_logging()  # the codechat loggers' messages: one line each on stderr
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command line as given (speedrun --record)
    from codechat.train.stop import EXIT_STOPPED, RunStopped, resume_command, stop_watch
    accepts = getattr(args, "accepts_overrides", False)
    if rest and not accepts:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        call = (lambda: args.func(args, parse_overrides(rest))) if accepts else (lambda: args.func(args))
        if not hasattr(args, "stop_after_min"):  # SIGTERM keeps its default for the other commands (serve)
            return call()
        calm_threads_when_busy()  # training commands, before PyTorch loads (codechat.config.threads)
        # a long job's log file (`> run.log`) follows it line by line, as a terminal does: block-buffered, a
        # stage's lines could sit unwritten for minutes, and a stopped run's log ends short of where it was
        if not sys.stdout.isatty() and hasattr(sys.stdout, "reconfigure"):
            sys.stdout.reconfigure(line_buffering=True)
        with stop_watch(args.stop_after_min).install():  # they stop cleanly (codechat.train.stop)
            return call()
    except RunStopped as e:
        print(f"codechat {args.command}: {e}; continue with: {resume_command(args.argv)}", file=sys.stderr)
        return EXIT_STOPPED
    except _user_errors() as e:  # ToolError, HFImportError: ValueErrors
        print(f"codechat {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
