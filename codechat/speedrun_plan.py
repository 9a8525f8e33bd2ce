"""What a speedrun does on this machine: its stages, each stage's share of the budget, the preset
and corpus (:func:`plan`). :mod:`codechat.speedrun` runs the plan."""
from __future__ import annotations

import site
import sysconfig
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .config import ConfigError, pretrain_recipe

#: The stages, in order (each a key of ``metrics.json`` and of ``SpeedrunPlan.shares``).
STAGES = ("tokenizer", "data", "baseline", "pretrain", "samples", "sft", "chat", "eval", "rl")
#: Stages added by ``--funcall-data``: function-calling SFT on the file's train split (from the
#: chat SFT checkpoint), then the function-calling evaluation on its held-out split.
FUNCALL_STAGES = ("funcall", "funcall_eval")
#: Their shares of the whole budget; the other stages' shares shrink to make room.
FUNCALL_SHARES = {"funcall": 0.08, "funcall_eval": 0.04}

#: Shares of the whole budget per stage. CPU: 12 minutes with today's 9 of pretraining; the
#: stages before pretraining and the generation stages end early on a fast machine (2026-12-01,
#: 2-core VM: tokenizer 2 s, corpus 8 s, samples 8 s, HumanEval 11 s) and pass their time on to
#: the later stages (SFT got 68 s of its planned 43). GPU, from the H200 runs of ``benchmarks/RESULTS.md``
#: (2026-12-01, with the generation engine: tokenizer 10 s, corpus 20 s, baselines 16 s, samples
#: 6 s, chat 3 s, HumanEval 164 x 20 in 27 s): the generation stages end early, and only stages
#: after them get their time back, so pretraining, which comes before, gets the rest up front.
#: ``rl`` runs only when HumanEval's verdict allows GRPO (today's small models get "stall" and skip
#: it at once, so its share is small: on a GPU its time goes to the function-calling stages when
#: there are some, else the run ends early).
CPU_SHARES = {"tokenizer": 0.05, "data": 0.035, "baseline": 0.01, "pretrain": 0.77, "samples": 0.025,
              "sft": 0.06, "chat": 0.01, "eval": 0.025, "rl": 0.015}
GPU_SHARES = {"tokenizer": 0.03, "data": 0.04, "baseline": 0.03, "pretrain": 0.545, "samples": 0.025,
              "sft": 0.14, "chat": 0.01, "eval": 0.11, "rl": 0.07}


@dataclass(frozen=True)
class SpeedrunPlan:
    """What a speedrun does on this machine (every number a field, chosen by :func:`plan`)."""

    preset: str
    time_budget_min: float  # the whole run's wall clock (setup excluded)
    sources: tuple[str, ...]
    shares: dict[str, float]  # fraction of the budget per stage (STAGES), summing to 1
    max_files: int = 0
    compile: bool = False  # the preset's recipe; a stage still runs eager under compile_max_share
    # Seconds torch.compile adds to a stage's first step (H200, d12: 37 s; CPU tiny: 46 s); the SFT
    # stage uses the figure measured in pretraining instead when there is one.
    compile_estimate_s: float = 40.0
    # A stage compiles only if the compile is at most this share of its training time: eager d12
    # pretraining ran at 0.52x compiled speed on an H200 (273k vs 524k tokens/s), so compiling
    # pays back when it costs under ~45% of the stage's training time.
    compile_max_share: float = 0.45
    min_train_s: float = 5.0  # a training stage's time budget never goes below this
    # Shares of a training stage's grant spent in its steps; the rest goes to loading, mining and
    # evaluations (2026-12-01: pretraining 27 s of 593 on the 2-core CPU, 14 s of 130 on an H200;
    # SFT 18 s of 76 and 9 s of 38).
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
    eval_temperature: float = 0.8
    # A conversations file with tools (glaive, ShareGPT, OpenAI messages): adds FUNCALL_STAGES,
    # training on FILE@train and evaluating FILE@heldout (codechat.data.benchmarks.conversation_split).
    funcall_data: str = ""
    # The RL stage (GRPO from the SFT model, when HumanEval's verdict is not "stall"): tasks mined
    # from doctests in the corpus (codechat.data.tasks), the tiered reward, groups of 8.
    rl_tasks: str = "doctest"
    rl_group_size: int = 8
    rl_prompts_per_step: int = 8
    rl_tokens: int = 256  # max new tokens per rollout
    funcall_tokens: int = 64  # max new tokens per evaluated assistant turn
    funcall_eval_limit: int = 10  # held-out conversations evaluated (0: all)

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages this plan runs, in order."""
        return STAGES + (FUNCALL_STAGES if self.funcall_data else ())

    def __post_init__(self) -> None:
        if set(self.shares) != set(self.stages) or abs(sum(self.shares.values()) - 1) > 1e-6 or \
                min(self.shares.values()) <= 0:
            raise ConfigError(f"speedrun shares must give every stage of {self.stages} a positive share summing "
                              f"to 1, got {self.shares}")
        if self.time_budget_min <= 0:
            raise ConfigError(f"--time-budget-min must be > 0, got {self.time_budget_min}")
        if self.checkpoint_every_s <= 0:
            raise ConfigError(f"--checkpoint-every-s must be > 0, got {self.checkpoint_every_s}")

    def planned_s(self) -> dict[str, float]:
        """Seconds per stage as planned up front."""
        return {s: self.shares[s] * self.time_budget_min * 60 for s in self.stages}


#: Presets a GPU speedrun picks by whole-run budget: (minutes at most, preset).
GPU_PRESET_BY_BUDGET = ((60.0, "d12"), (300.0, "d20"), (float("inf"), "1b"))
CPU_TIME_BUDGET_MIN = 12.0
GPU_TIME_BUDGET_MIN = 30.0
#: Where the speedrun's data comes from, for the report.
LICENSES = {"pretraining corpus": "this Python's standard library (PSF License)"
                                  " [+ installed site-packages on GPU: each package's own licence]",
            "SFT data": "docstring -> function pairs mined from the same standard library (PSF License)",
            "HumanEval (evaluation only)": "OpenAI's HumanEval, MIT License, shipped in codechat/data/shipped"}


def with_funcall(shares: dict[str, float]) -> dict[str, float]:
    """``shares`` of :data:`STAGES` shrunk to make room for :data:`FUNCALL_SHARES`."""
    scale = 1.0 - sum(FUNCALL_SHARES.values())
    return {**{k: v * scale for k, v in shares.items()}, **FUNCALL_SHARES}


def plan(device: torch.device, preset: str | None, time_budget_min: float | None, max_files: int = 0,
         funcall_data: str = "") -> SpeedrunPlan:
    """Preset, budget, shares and corpus for ``device`` (explicit arguments win).

    Raises:
        ConfigError: ``funcall_data`` is given and is not a file.
    """
    if funcall_data:
        if not Path(funcall_data).is_file():
            raise ConfigError(f"--funcall-data {funcall_data}: no such file")
        base = plan(device, preset, time_budget_min, max_files)
        return replace(base, funcall_data=str(funcall_data), shares=with_funcall(base.shares))
    stdlib = sysconfig.get_paths()["stdlib"]
    if device.type == "cuda":
        budget = time_budget_min or GPU_TIME_BUDGET_MIN
        chosen = preset or next(p for limit, p in GPU_PRESET_BY_BUDGET if budget <= limit)
        packages = tuple(d for d in site.getsitepackages() if Path(d).is_dir())
        return SpeedrunPlan(chosen, budget, (stdlib, *packages), dict(GPU_SHARES), max_files,
                            compile=pretrain_recipe(chosen).train.compile, sft_max_length=1024,
                            sft_max_prompt_length=512, sft_micro_batch_size=8, eval_limit=0, eval_n=20,
                            eval_tokens=512, funcall_tokens=256, funcall_eval_limit=0)
    chosen = preset or "tiny"
    return SpeedrunPlan(chosen, time_budget_min or CPU_TIME_BUDGET_MIN, (stdlib,), dict(CPU_SHARES), max_files,
                        compile=pretrain_recipe(chosen).train.compile, compile_estimate_s=46.0)
