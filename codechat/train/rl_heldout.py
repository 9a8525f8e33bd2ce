"""A held-out slice of the filtered RL pool: tasks GRPO never trains on, scored before and after it.

The pass-rate filter keeps the tasks the SFT policy sometimes solves. A slice of them
(``rl.heldout_tasks``, a seeded draw, taken only where at least ``rl.min_tasks`` remain to train on) is
set aside; it is scored with the policy before the first step and again after the last, each task
with ``rl.filter_samples`` fresh samples (the same seeds both times, not the filter's: the filter chose
these tasks for their rates, so its own samples would flatter the "before"). The figure is pass@1 over
the slice with its 95% bootstrap interval over tasks (:func:`codechat.eval.passk.bootstrap_interval`):
whether GRPO learned something that carries to unseen tasks of the pool's kind, beside HumanEval and MBPP.
The same per part of the pool (:func:`.task_pool.pool_part`: MBPP's train split, which chat SFT may also
train on, against the mined ``io`` and ``doctest`` tasks), as the kept tasks are mostly MBPP's on a GPU
(``benchmarks/RESULTS.md``, fifteenth session).
"""
from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from .rollouts import Judge, collect
from .task_pool import pool_part


def split_heldout(tasks: Sequence, n: int, min_train: int, seed: int) -> tuple[list, list]:
    """``(train, heldout)``: ``min(n, len(tasks) - min_train)`` of ``tasks`` (none when that is < 1) drawn
    with ``seed`` for the held-out slice, the rest, in their order, to train on."""
    k = max(0, min(n, len(tasks) - min_train))
    held = set(random.Random(f"{seed}:heldout").sample(range(len(tasks)), k))
    return [t for i, t in enumerate(tasks) if i not in held], [t for i, t in enumerate(tasks) if i in held]


def score_slice(engine: Any, tok: Any, tasks: Sequence, judge: Judge, samples: int, sampling: Any,
                seed: int) -> dict[str, Any]:
    """pass@1 of ``tasks`` (``samples`` each, seeds derived from ``seed`` and the task id) with its 95%
    bootstrap interval over tasks; ``solved`` counts per task id, and the seconds taken."""
    from codechat.eval.passk import bootstrap_interval
    from codechat.eval.suites import derive_seed
    batch = collect(engine, tok, list(tasks), [derive_seed(seed, f"heldout:{t.task_id}") for t in tasks], judge,
                    group_size=samples, sampling=sampling)
    solved = batch.passes_per_task(samples)
    rates = [c / samples for c in solved]
    ci = bootstrap_interval(rates)
    counts = {t.task_id: c for t, c in zip(tasks, solved)}
    return {"tasks": len(tasks), "samples": samples, "pass@1": sum(rates) / len(rates) if rates else None,
            "pass@1_ci95": list(ci) if ci else None, "solved": counts, "by_part": by_part(counts, samples),
            "seconds": batch.generate_s + batch.judge_s}


def by_part(solved: dict[str, int], samples: int,
            part: Callable[[str], str] = pool_part) -> dict[str, dict[str, float]]:
    """``part -> {"tasks": k, "pass@1": p}`` of ``solved`` (task id -> samples passing, of ``samples``),
    per ``part(task_id)`` (default: the part of the pool, :func:`.task_pool.pool_part`), in first-seen order."""
    parts: dict[str, list[int]] = {}
    for task_id, c in solved.items():
        parts.setdefault(part(task_id), []).append(c)
    return {part: {"tasks": len(cs), "pass@1": sum(cs) / (len(cs) * samples)} for part, cs in parts.items()}
