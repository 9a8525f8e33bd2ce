"""A held-out slice of the filtered RL pool: tasks GRPO never trains on, scored before and after it.

The pass-rate filter keeps the tasks the SFT policy sometimes solves. A slice of them
(``rl.heldout_tasks``, a seeded draw, taken only where at least ``rl.min_tasks`` remain to train on;
tasks that share a function name stay on one side, :func:`copy_group`) is set aside; it is scored with the
policy before the first step and again after the last, each task with ``rl.heldout_samples`` fresh samples
(0: ``rl.filter_samples``; the same seeds both times, not the filter's: the filter chose these tasks for
their rates, so its own samples would flatter the "before"). The figure is pass@1 over the slice with its
95% bootstrap interval over tasks (:func:`codechat.eval.passk.bootstrap_interval`): whether GRPO learned
something that carries to unseen tasks of the pool's kind, beside HumanEval and MBPP. The same per part of
the pool (:func:`.task_pool.pool_part`: MBPP's train split, which chat SFT may also train on, against the
mined ``io`` and ``doctest`` tasks), as the kept tasks were mostly MBPP's on a GPU while that split was in
the speedrun's pool (``benchmarks/RESULTS.md``, fifteenth session).
"""
from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from .rollouts import Judge, collect
from .task_pool import pool_part


def copy_group(task_id: str) -> str:
    """The group a task is held out or trained on with: a mined task's function name (the part of its id after
    ``::``, so ``io/pkg/a.py::f`` and ``io/vendored/pkg/a.py::f`` are one group), else the whole id. Vendored
    and copied functions are common in a corpus of installed packages: at a897d34 the slice held
    ``decimal_encoder`` of ``fastapi`` and ``pydantic.v1`` while GRPO trained on ``pydantic.deprecated``'s, and
    ``assoc`` of ``torch.fx``'s copy of ``toolz`` while it trained on ``toolz``'s (``benchmarks/RESULTS.md``,
    twenty-second session)."""
    return task_id.rsplit("::", 1)[-1] if "::" in task_id else task_id


def split_heldout(tasks: Sequence, n: int, min_train: int, seed: int,
                  group: Callable[[Any], str] = lambda t: copy_group(t.task_id)) -> tuple[list, list]:
    """``(train, heldout)``: a seeded draw of whole groups of ``tasks`` (``group(task)``, default
    :func:`copy_group` of its ``task_id``) for the held-out slice, at most ``min(n, len(tasks) - min_train)``
    tasks (none when that is < 1; a group that would pass it is skipped for smaller ones), so no task has a
    namesake on the other side; the rest, in their order, to train on."""
    k = max(0, min(n, len(tasks) - min_train))
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        groups.setdefault(group(t), []).append(i)
    order = list(groups.values())
    random.Random(f"{seed}:heldout").shuffle(order)
    held: set[int] = set()
    for members in order:
        if len(held) + len(members) <= k:
            held.update(members)
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
