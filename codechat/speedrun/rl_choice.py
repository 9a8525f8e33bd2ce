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
RL_AUTO_MIN_BUDGET_MIN = 16.0


def with_rl(p: SpeedrunPlan, choice: str, device: torch.device) -> SpeedrunPlan:
    """``p`` with or without the RL stage: ``--rl on``, ``off``, or ``auto``. Without it, RL's share
    goes to pretraining (mid-training's part of it included) and ``rl_reason`` says why.

    ``auto`` runs RL on a GPU with a budget of at least :data:`RL_AUTO_MIN_BUDGET_MIN` minutes when the
    pool holds more than the corpus's doctests (``--mbpp``'s train split or ``--tasks``), else not.
    Evidence (``benchmarks/RESULTS.md``, one GPU, ``d12``):

    - 9 minutes: the pass-rate filter kept 11 (H200, ed0ed6f), 18 (H100, 0151c41) and 7 (H100, 8a79860;
      a pool of 1,223 with 896 corpus tasks, pool pass@1 0.52%) tasks, fewer than ``rl_min_tasks`` (32):
      RL's 71 s came out of pretraining and went unused. The one 9-minute run that kept more (192 of 358,
      1952296) had a pool of MBPP train tasks whose answers chat SFT had shown it (pool pass@1 35.5%),
      and GRPO then changed no score beyond its interval. With the streaming filter (H100, a06a26b) it kept
      172 of 726 in 21 s, but GRPO got 19 steps of the stage's 88 s, and neither the mean reward nor the
      held-out slice moved beyond its noise, while pretraining lost 50 s (val 0.622 against 0.601). At
      2a91d01 (H100, two runs) GRPO made 150 and 30 steps; at 150 the reward on its training tasks rose
      0.60 -> 0.80 and HumanEval / MBPP pass@1 0.88 -> 1.40% / 0.92 -> 1.24% (within their intervals),
      but the held-out slice stayed flat (57.8 -> 56.6% on 32 tasks; 27.7 -> 27.7% on 96 in the other).
      At 6d775cc (H100; 96 held out, the filter stopping at 200 kept): 34 steps, reward 0.39 -> 0.53,
      held-out 35.8 -> 35.9%; a third of GRPO's time waited on the judge's 3 s timeouts. At d39a339 (H100,
      the judge at 1 s): 53 steps, reward 0.41 -> 0.58, held-out 34.8 -> 31.5% (paired over its tasks: -3.3
      points [-6.4, -0.3], a fall beyond the noise).
    - 16 minutes (H100, 1952296): the filter kept 86 of 358 tasks and GRPO made 36 steps.
    - The tasks mined from a GPU run's corpus alone (``--plan.rl_pool_mbpp false``, no ``--tasks``) were 897 at
      a06a26b (H100, 9 minutes: 345 doctest and 551 input/output tasks); at f18248e the filter kept ~7% of
      those it sampled (27 of ~360): about 60 of the whole, not yet measured as ``auto``'s pool.
    - On a CPU the tiny model's filter kept fewer than 32 tasks in every run (``tests/test_speedrun.py``),
      and the stage took 72 s of a busy 2-core machine's 12-minute budget doing so (issue 44).

    Raises:
        ConfigError: a ``choice`` not in :data:`RL_CHOICES`.
    """
    if choice not in RL_CHOICES:
        raise ConfigError(f"--rl must be one of {', '.join(RL_CHOICES)}, got {choice!r}")
    if choice == "auto":
        pool = any(s != "doctest" for s in p.rl_pool)
        long = p.time_budget_min >= RL_AUTO_MIN_BUDGET_MIN
        on = device.type == "cuda" and pool and long
        why = ("--rl auto: on a GPU with a pool beyond the corpus's doctests (--mbpp or --tasks)" if on else
               "--rl auto: off on a CPU (the tiny model's pass-rate filter keeps too few tasks)"
               if device.type != "cuda" else
               "--rl auto: off, the pool would be the tasks mined from the corpus alone (~7% of them kept by the "
               "pass-rate filter on a GPU, not yet measured as auto's pool); add --mbpp FILE or --tasks SPEC, or "
               "--rl on" if not pool else
               f"--rl auto: off below a {RL_AUTO_MIN_BUDGET_MIN:g}-minute GPU budget (in 9 minutes GRPO learned "
               "the tasks it trained on but moved no held-out task beyond its noise, and its time came out of "
               "pretraining); --rl on to run it anyway")
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
