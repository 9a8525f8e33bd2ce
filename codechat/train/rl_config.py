"""The settings of the RL stage, ``codechat rl`` (:mod:`codechat.train.grpo`): what it samples, how it
is judged and how the policy is updated (:class:`RLConfig`), and the stage around them
(:class:`RLStageConfig`). Built and validated before step 0: a setting that would make the run learn
nothing is an error that names the fix.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from codechat.config.lora import LoraConfig, check_peft
from codechat.config.stages import OptimConfig, RunConfig, TrainConfig, _check, check_init
from .rl import ADVANTAGE_SCALES, LOSS_NORMS
from .rollouts import REWARD_KINDS
from .task_pool import FILTER_ORDERS


@dataclass(frozen=True)
class RLConfig:
    """What ``codechat rl`` samples, how it is judged and how the policy is updated (module docstring)."""

    tasks: str = "doctest"  # task spec (codechat.data.tasks.load_tasks): mbpp:PATH, tasks:PATH, funcall:PATH, ...;
    # several joined by + make one pool (mbpp:PATH+doctest; codechat.train.task_pool)
    decontaminate: bool = True  # leave out tasks overlapping HumanEval and MBPP test (mbpp_file), named in pool.json
    split: str = ""  # "" -> the spec's RL default (MBPP: train)
    limit: int = 0  # first N tasks (0: all)
    mbpp_file: str = ""  # doctest tasks: also exclude overlaps with this MBPP file's test problems
    group_size: int = 8  # samples per task (one GRPO group)
    prompts_per_step: int = 8  # tasks per step
    reward: str = "auto"  # binary | fractional | tiered (code) | funcall_tiered (calls) | auto: tiered or funcall_tiered
    max_new_tokens: int = 256
    temperature: float = 1.0  # sampling temperature (> 0: greedy groups have no variance)
    top_p: float = 1.0
    top_k: int = 0
    advantage_scale: str = "std"  # std (GRPO) | none (Dr. GRPO)
    clip_eps: float = 0.2  # lower clip of the importance ratio
    clip_eps_high: float = 0.28  # upper clip (DAPO clip-higher; = clip_eps for symmetric PPO)
    num_iterations: int = 1  # optimizer updates per batch of rollouts
    beta: float = 0.0  # KL weight to the frozen initial policy (0: no reference model is held)
    loss_norm: str = "token"  # token (DAPO) | sequence (GRPO)
    mask_truncated: bool = True  # no loss on completions cut at max_new_tokens (DAPO overlong filtering)
    shuffle_rewards: bool = False  # a control: permute rewards across the batch (the run must not learn)
    dead_steps: int = 20  # stop after this many dead steps in a row
    force: bool = False  # start even when the pre-RL pass@k verdict says the run will stall
    preflight_tasks: int = 16  # tasks of the pass@k check before step 0 (without the filter)
    # The pass-rate filter (codechat.train.task_pool), in place of the pass@k check: before step 0 sample
    # filter_samples completions of every pool task and train on those whose pass rate is neither 0 nor 1
    # and in [filter_min, filter_max] (the seed system's: [0.05, 0.95]); fewer than min_tasks: RL is skipped
    filter_samples: int = 0  # 0: no filter
    filter_min: float = 0.0
    filter_max: float = 1.0
    min_tasks: int = 32
    filter_deadline_s: float = 0.0  # > 0: sample no more pool tasks after this many seconds (the rest are left out)
    filter_enough: int = 0  # > 0: sample no more pool tasks once this many are kept (the rest are left out)
    # The order the filter samples the pool in: smallest reference solution first (a weak policy's solvable
    # tasks come first when the deadline cuts the pool short: codechat.train.task_pool), or random.
    filter_order: str = "smallest"
    # Kept tasks set aside, never trained on, scored before step 0 and after the last (codechat.train.rl_heldout;
    # heldout.json): at most this many, leaving min_tasks to train on (0: none). Needs the filter.
    heldout_tasks: int = 0
    # Samples a held-out task is scored with, before and after (0: filter_samples). More samples narrow the
    # paired change's interval at little cost: the slice is a few dozen tasks, the filter samples hundreds.
    heldout_samples: int = 0
    # Run every pool task's reference solution against its tests before step 0 (a failing one is an error
    # naming the task). With the filter a task whose tests fail its reference is never solved, so never kept:
    # the speedrun, whose mined tasks were run when mined, skips the check.
    check_references: bool = True
    judge_workers: int = 2  # sandbox programs at once
    # Wall-clock seconds a program may run. A step waits for its slowest verdict, so each rollout that
    # loops until the limit stalls the whole step: at 10 s, 44 steps on one H100 waited 82 s on the judge
    # against 60 s generating and training; at the speedrun's 3 s, 15 of 43 s (RESULTS, sixteenth
    # session); at 1 s, 4.6 of 45 s, and the speedrun's GRPO took 53 steps instead of 34 (seventeenth).
    # The tasks' own solutions run in milliseconds; raise it for tasks that compute more.
    judge_timeout_s: float = 1.0
    judge_memory_mb: int = 1024
    engine_slots: int = 0  # rows decoded at once (0: prompts_per_step x group_size)
    log_rollouts_every: int = 10  # print / keep the best and a typical rollout every N steps (0: never)

    @property
    def slice_samples(self) -> int:
        """Samples each held-out task is scored with: :attr:`heldout_samples`, else :attr:`filter_samples`."""
        return self.heldout_samples or self.filter_samples

    def __post_init__(self) -> None:
        _check(self.group_size >= 2, f"rl.group_size={self.group_size}: a group of one has no variance, so every "
                                     "advantage is 0 and nothing is learned; use --group-size 8")
        _check(self.reward in ("auto", *REWARD_KINDS),
               f"rl.reward must be auto or one of {', '.join(REWARD_KINDS)}, got {self.reward!r}")
        _check(self.temperature > 0, f"rl.temperature={self.temperature}: greedy samples of one prompt are all "
                                     "equal (zero variance); use a temperature > 0, e.g. 1.0")
        _check(0 < self.top_p <= 1 and self.top_k >= 0, "rl.top_p must be in (0, 1] and rl.top_k >= 0")
        _check(self.prompts_per_step >= 1 and self.max_new_tokens >= 1 and self.preflight_tasks >= 1,
               "rl.prompts_per_step, rl.max_new_tokens and rl.preflight_tasks must be >= 1")
        _check(self.limit >= 0 and self.engine_slots >= 0 and self.log_rollouts_every >= 0,
               "rl.limit, rl.engine_slots and rl.log_rollouts_every must be >= 0")
        _check(self.advantage_scale in ADVANTAGE_SCALES, f"rl.advantage_scale must be one of {ADVANTAGE_SCALES}")
        _check(self.loss_norm in LOSS_NORMS, f"rl.loss_norm must be one of {LOSS_NORMS}, got {self.loss_norm!r}")
        _check(self.clip_eps > 0 and self.clip_eps_high >= 0, "rl.clip_eps must be > 0 and rl.clip_eps_high >= 0")
        _check(self.num_iterations >= 1, f"rl.num_iterations must be >= 1, got {self.num_iterations}")
        _check(self.beta >= 0, f"rl.beta must be >= 0, got {self.beta}")
        _check(self.dead_steps >= 1, f"rl.dead_steps must be >= 1, got {self.dead_steps}")
        _check(self.filter_samples == 0 or self.filter_samples >= 2,
               f"rl.filter_samples={self.filter_samples}: a pass rate needs at least 2 samples (0: no filter)")
        _check(0.0 <= self.filter_min <= self.filter_max <= 1.0 and self.min_tasks >= 1 and self.filter_deadline_s >= 0,
               "rl.filter_min and rl.filter_max must satisfy 0 <= min <= max <= 1, rl.min_tasks >= 1 and "
               "rl.filter_deadline_s >= 0")
        _check(self.filter_enough == 0 or self.filter_enough >= self.min_tasks + self.heldout_tasks,
               f"rl.filter_enough={self.filter_enough} would stop the filter before it kept rl.min_tasks "
               f"({self.min_tasks}) plus rl.heldout_tasks ({self.heldout_tasks}); raise it, or 0 for no such stop")
        _check(self.filter_order in FILTER_ORDERS,
               f"rl.filter_order must be one of {', '.join(FILTER_ORDERS)}, got {self.filter_order!r}")
        _check(self.heldout_samples == 0 or self.heldout_samples >= 2,
               f"rl.heldout_samples={self.heldout_samples}: a pass rate needs at least 2 samples (0: filter_samples)")
        _check(self.heldout_tasks >= 0 and (self.heldout_tasks == 0 or self.filter_samples),
               f"rl.heldout_tasks={self.heldout_tasks}: a held-out slice (>= 0) is taken from the pass-rate filter's "
               "kept tasks; set rl.filter_samples too")
        _check(self.judge_workers >= 1 and self.judge_timeout_s > 0 and self.judge_memory_mb > 0,
               "rl.judge_workers, rl.judge_timeout_s and rl.judge_memory_mb must be positive")


@dataclass(frozen=True)
class RLStageConfig:
    """Everything ``codechat rl`` needs: the policy to start from, the RL settings, optimizer, loop and run.

    ``train.max_steps`` counts RL steps (batches of rollouts); ``train.micro_batch_size`` counts
    rollouts per forward pass. ``peft`` ``lora`` trains LoRA adapters on the frozen ``init``
    (:mod:`codechat.config.lora`): rollouts sample from the merged current adapters after every update,
    and the KL reference (``rl.beta`` > 0) is the base with the adapters off.
    """

    init: str = ""  # stage directory or checkpoint to start from (required)
    rl: RLConfig = field(default_factory=RLConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5, warmup_steps=0, schedule="constant",
                                                                   min_lr_ratio=1.0, weight_decay=0.0))
    train: TrainConfig = field(default_factory=lambda: TrainConfig(max_steps=50, micro_batch_size=8, log_every=1,
                                                                   eval_every=10**9, save_every=10))
    run: RunConfig = field(default_factory=lambda: RunConfig(out="runs/default/rl"))
    peft: str = "none"  # PEFT_METHODS: none (every weight trained) | lora (adapters on the frozen --init)
    lora: LoraConfig = field(default_factory=LoraConfig)

    def __post_init__(self) -> None:
        check_peft(self.peft, self.optim, self.train)

    def check_init(self) -> None:
        """Raises ConfigError unless ``init`` names an existing run directory or checkpoint."""
        check_init(self.init, "the SFT stage")
