"""``codechat speedrun``: its flags and the call of :func:`codechat.speedrun.run.run_speedrun`."""
from __future__ import annotations

import argparse
import shlex
import sys

from codechat.config.stages import PRESETS, ConfigError
from codechat.train.stop import add_stop_flag


def add_cli(sub: argparse._SubParsersAction) -> None:
    """Add ``codechat speedrun`` to the subcommands ``sub``."""
    p = sub.add_parser("speedrun", help="tokenizer -> corpus -> pretraining -> SFT -> HumanEval -> RL (on the tasks the "
                                                 "SFT model sometimes solves) -> report",
                       description="The whole pipeline on the default corpus (this Python's standard library), "
                                   "written to --out with report.md and metrics.json after every stage. A stage "
                                   "that fails leaves the finished ones in the report and exits non-zero; "
                                   "--resume continues from the first unfinished stage.")
    p.add_argument("--preset", choices=list(PRESETS), help="model preset (default: tiny on CPU, sized to the "
                                                          "time budget on a GPU)")
    p.add_argument("--out", help="run directory (default runs/speedrun-<preset>)")
    p.add_argument("--time-budget-min", type=float,
                   help="the whole run's wall-clock minutes, setup excluded, shared out among the stages up front "
                        "(default 12 on CPU, 30 on GPU)")
    p.add_argument("--checkpoint-every-s", type=float,
                   help="training stages also save a checkpoint after this many seconds of training (default 60), "
                        "so a killed run resumes close to where it stopped")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its first unfinished stage (its plan and budget are kept)")
    add_stop_flag(p)
    p.add_argument("--max-files", type=int, default=0, help="read only the first N source files (a smoke run)")
    p.add_argument("--eval-limit", type=int, help="HumanEval (and MBPP) problems to evaluate (default 40 on CPU, all on GPU)")
    p.add_argument("--funcall-data", help="conversations with tools (glaive, ShareGPT or OpenAI messages): adds "
                                          "function-calling SFT on FILE@train and its evaluation on FILE@heldout")
    p.add_argument("--mbpp", metavar="PATH", help="MBPP's mbpp.jsonl: its train split (tasks 601-974) joins chat SFT "
                                                  "(and RL's pool with --plan.rl_pool_mbpp true), its test split (11-510) is evaluated (pass@1, "
                                                  "pass@10), and its test problems are kept out of every training set")
    p.add_argument("--tasks", metavar="SPEC", help="more RL tasks for the pool (codechat rl's task spec, several "
                                                   "joined by +), beside the doctest and input/output tasks mined "
                                                   "from the corpus; the pool is decontaminated and filtered by the "
                                                   "SFT model's pass rate before GRPO")
    p.add_argument("--rl", choices=["auto", "on", "off"], default="auto",
                   help="the RL stage (GRPO on the pool's tasks that the SFT model sometimes solves): auto (default) "
                        "runs it on a GPU with a budget of 9 minutes or more, never on a CPU; a stage that does not "
                        "run takes no time from pretraining")
    p.add_argument("--data", metavar="SPEC", help="more chat-SFT sources, a mixture spec SOURCE[#FORMAT][:WEIGHT],... "
                                                  "(weight: copies per epoch), e.g. code_alpaca_2k.json:1")
    p.add_argument("--mid-share", type=float, default=0.0, metavar="F",
                   help="mid-training: move this share of pretraining's time (0 <= F < 1; default 0, none) to a stage "
                        "between pretraining and chat SFT that trains on SFT's mixture, the --funcall-data "
                        "conversations and --mid-data, packed, with the pretraining optimizer and LR decaying to 0")
    p.add_argument("--mid-data", metavar="SPEC", help="more mid-training sources (a mixture spec, like --data); "
                                                      "needs --mid-share")
    p.add_argument("--record", metavar="FILE", help="append one JSON line for the finished run to FILE (date, commit, "
                                                    "command, total_wall_s, val_bpb, humaneval and mbpp pass@1/10, "
                                                    "function-calling rates, rl_ran, rl_steps; keys in "
                                                    "codechat.speedrun.record), e.g. "
                                                    "benchmarks/results/gpu_speedrun.jsonl")
    p.add_argument("--seed", type=int, help="random seed (run.seed)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], help="device (run.device, default auto)")
    p.epilog = ("Pretraining settings of the preset's recipe: --pretrain.SECTION.FIELD VALUE (sections model, "
                "data, optim, train), e.g. --pretrain.optim.name muon --pretrain.optim.lr 2e-3; the data section "
                "reaches the tokenizer and corpus too. On a GPU, d12 pretrains with the settings of "
                "codechat.speedrun.plan.GPU_RECIPE_OVERRIDES (Muon at lr 2e-3, ReLU² MLP, logits soft-capped at 15, "
                "embedding LR x5, linear decay to 0) unless told otherwise. SFT keeps half the preset's own learning rate. "
                "The plan's own settings (codechat.speedrun.plan.SpeedrunPlan's numbers, flags and texts): "
                "--plan.FIELD VALUE, e.g. --plan.rl_prompts_per_step 4 --plan.rl_evals_share 0.5; recorded in "
                "metrics.json and the report, and kept by --resume.")
    p.set_defaults(func=_run, accepts_overrides=True)


def _run(args: argparse.Namespace, overrides: dict[str, str]) -> int:
    from .run import SpeedrunFailed, run_speedrun
    other = [k for k in overrides if not k.startswith(("pretrain.", "plan."))]
    if other:
        raise ConfigError(f"unrecognised argument --{other[0]}: the speedrun takes settings of its pretraining "
                          "stage, as --pretrain.SECTION.FIELD VALUE (e.g. --pretrain.optim.lr 2e-3), and of its "
                          "plan, as --plan.FIELD VALUE (e.g. --plan.rl_prompts_per_step 4)")
    try:
        run_speedrun(preset=args.preset, out=args.out, time_budget_min=args.time_budget_min, seed=args.seed,
                     device=args.device or "auto", max_files=args.max_files, eval_limit=args.eval_limit,
                     checkpoint_every_s=args.checkpoint_every_s, resume=args.resume,
                     funcall_data=args.funcall_data or "", mbpp=args.mbpp or "", sft_data=args.data or "",
                     mid_share=args.mid_share, mid_data=args.mid_data or "", tasks=args.tasks or "", rl=args.rl,
                     pretrain_overrides={k[len("pretrain."):]: v for k, v in overrides.items()
                                         if k.startswith("pretrain.")},
                     plan_overrides={k[len("plan."):]: v for k, v in overrides.items() if k.startswith("plan.")},
                     record=args.record or "", command=shlex.join(["codechat", *args.argv]))
    except SpeedrunFailed as e:
        print(f"codechat speedrun: error: {e}", file=sys.stderr)
        return 1
    return 0


__all__ = ["add_cli"]
