"""Whether a speedrun runs its RL stage (``--rl on|off|auto``): :func:`with_rl` and the evidence for
``auto``'s rule."""
from __future__ import annotations

from dataclasses import replace

import torch

from codechat.config.stages import ConfigError
from codechat.speedrun.plan import SpeedrunPlan

#: ``--rl`` choices: ``on``, ``off``, or ``auto`` (:func:`with_rl`'s rule).
RL_CHOICES = ("auto", "on", "off")
#: The shortest GPU budget (minutes) for which ``--rl auto`` plans GRPO (:func:`with_rl` gives the evidence).
RL_AUTO_MIN_BUDGET_MIN = 9.0


def with_rl(p: SpeedrunPlan, choice: str, device: torch.device) -> SpeedrunPlan:
    """``p`` with or without the RL stage: ``--rl on``, ``off``, or ``auto``. Without it, RL's share
    goes to pretraining (mid-training's part of it included) and ``rl_reason`` says why.

    ``auto`` runs RL on a GPU with a budget of at least :data:`RL_AUTO_MIN_BUDGET_MIN` minutes, where the
    pass-rate filter is measured to keep the ``rl_min_tasks`` (32) GRPO needs, else not.
    Evidence (``benchmarks/RESULTS.md``, one GPU, ``d12``):

    - 9 minutes, the pool mined from the corpus alone (doctest and input/output tasks; MBPP's train split left
      out, ``rl_pool_mbpp`` false, the default since a897d34): the filter sampled all 897 tasks in 27 s and
      kept 48; GRPO made 53 steps, its reward rose 0.22 -> 0.54, and the held-out slice (16 tasks) rose
      8.2% -> 30.5%, paired +22.3 points [+10.2, +36.3] (H200, a897d34). At f18248e the same pool's tasks
      were kept at ~7% of those sampled.
    - 9 minutes, before the streaming filter: it kept 11 (H200, ed0ed6f; MBPP train and ~31 doctests), 18
      (H100, 0151c41) and 7 (H100, 8a79860; 896 corpus tasks, of which it sampled a few hundred) tasks, fewer
      than 32: RL's 71 s came out of pretraining and went unused. With MBPP's train split in the pool
      (answers chat SFT had shown it, pool pass@1 35-50%) the streaming filter kept 172-213 tasks and GRPO
      made 19-150 steps in six runs, but the held-out slice never rose beyond its interval (+1.9, -1.2, 0.0,
      +0.1, -3.3, +0.4 points).
    - 16 minutes (H100, 1952296): the filter kept 86 of 358 tasks and GRPO made 36 steps.
    - Below 9 minutes: not measured, so not planned (the model the filter samples is weaker still).
    - On a CPU the tiny model's filter kept fewer than 32 tasks in every run (``tests/test_speedrun.py``),
      and the stage took 72 s of a busy 2-core machine's 12-minute budget doing so (issue 44).

    Raises:
        ConfigError: a ``choice`` not in :data:`RL_CHOICES`.
    """
    if choice not in RL_CHOICES:
        raise ConfigError(f"--rl must be one of {', '.join(RL_CHOICES)}, got {choice!r}")
    if choice == "auto":
        on = device.type == "cuda" and p.time_budget_min >= RL_AUTO_MIN_BUDGET_MIN
        why = (f"--rl auto: on a GPU with a budget of {RL_AUTO_MIN_BUDGET_MIN:g} minutes or more" if on else
               "--rl auto: off on a CPU (the tiny model's pass-rate filter keeps too few tasks)"
               if device.type != "cuda" else
               f"--rl auto: off below a {RL_AUTO_MIN_BUDGET_MIN:g}-minute GPU budget (the pass-rate filter's "
               "yield is measured from 9 minutes up); --rl on to run it anyway")
    else:
        on, why = choice == "on", f"--rl {choice}"
    if on:
        return replace(p, rl=True, rl_reason=why)
    shares = {k: v for k, v in p.shares.items() if k != "rl"}
    gain = p.shares.get("rl", 0.0)
    if p.mid_share:  # mid-training keeps its part of pretraining's time
        shares["mid"] += gain * p.mid_share
        gain *= 1 - p.mid_share
    shares["pretrain"] += gain
    return replace(p, rl=False, rl_reason=why, shares=shares)
