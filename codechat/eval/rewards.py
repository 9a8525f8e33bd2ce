"""Rewards for RL on code, each a pure function of a sandbox :class:`~codechat.eval.sandbox.ExecResult`.

- :func:`binary`: 1.0 when every test passes, else 0.0.
- :func:`fractional`: the fraction of tests passed, k/n.
- :func:`tiered`: the seed's ladder, which gives partial credit for getting further, so a weak
  policy (pass@1 of 1-5 %) still sees reward variance inside a GRPO group:

  ====================================================================  ================
  what happened                                                         reward
  ====================================================================  ================
  empty program or syntax error                                         0.00
  the definitions raise, time out or run out of memory before any test  0.05
  tests run but none passes                                             0.15
  k of n tests pass, 0 < k < n                                          0.15 + 0.85 k/n
  all tests pass                                                        1.00
  ====================================================================  ================

  A test that raises, fails or runs out of time counts as failed, and so does a test never
  reached (the run stopped earlier).

:func:`score` runs a program in the sandbox and returns one of these rewards.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from codechat.eval.sandbox import ExecResult, run


def binary(result: ExecResult) -> float:
    """1.0 if the program passed every test (status ``passed``), else 0.0."""
    return 1.0 if result.passed else 0.0


def fractional(result: ExecResult) -> float:
    """``tests_passed / tests_total``; with no tests, 1.0 if the program ran to completion."""
    if result.tests_total == 0:
        return binary(result)
    return result.tests_passed / result.tests_total


@dataclass(frozen=True)
class TieredLadder:
    """The rungs of :func:`tiered` (defaults: the seed's values)."""

    syntax: float = 0.0  # empty program or syntax error
    no_tests_run: float = 0.05  # definitions raised / timed out / ran out of memory
    none_pass: float = 0.15  # tests ran, none passed
    partial_floor: float = 0.15  # k of n pass: partial_floor + partial_span * k / n
    partial_span: float = 0.85
    all_pass: float = 1.0

    def __post_init__(self) -> None:
        rungs = (self.syntax, self.no_tests_run, self.none_pass, self.all_pass)
        if list(rungs) != sorted(rungs):
            raise ValueError(f"tiered rewards must not decrease up the ladder, got {rungs}")
        if self.partial_floor + self.partial_span > self.all_pass:
            raise ValueError("partial_floor + partial_span must not exceed all_pass")


TIERED = TieredLadder()


def tiered(result: ExecResult, ladder: TieredLadder = TIERED) -> float:
    """The seed's tiered reward (see the module docstring for the ladder)."""
    if result.passed:
        return ladder.all_pass
    if result.status == "syntax":
        return ladder.syntax
    if not result.definitions_ok:  # error / timeout / memory before any test ran
        return ladder.no_tests_run
    k, n = result.tests_passed, result.tests_total
    if k == 0 or n == 0:
        return ladder.none_pass
    return ladder.partial_floor + ladder.partial_span * k / n


REWARDS: dict[str, Callable[[ExecResult], float]] = {
    "binary": binary,
    "fractional": fractional,
    "tiered": tiered,
}


def score(program: str, tests: Sequence[str], reward: str = "tiered", *,
          timeout_s: float = 10.0, memory_mb: int = 1024) -> float:
    """Run ``program`` against ``tests`` in the sandbox and return the named reward.

    Raises:
        ValueError: an unknown reward name.
    """
    if reward not in REWARDS:
        raise ValueError(f"unknown reward {reward!r}; use one of {sorted(REWARDS)}")
    return REWARDS[reward](run(program, tests, timeout_s=timeout_s, memory_mb=memory_mb))
