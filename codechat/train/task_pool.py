"""The RL task pool and its pass-rate filter: the tasks GRPO trains on are those the policy sometimes solves.

A group of rollouts whose rewards are all equal has advantages exactly 0 (:func:`codechat.train.rl.group_advantages`):
a task the policy never solves, or always solves, teaches nothing. So before step 0 the RL stage
samples ``n`` completions of every pool task with the current policy (streamed through the engine,
:func:`codechat.train.rollouts.stream_passes`), and keeps the tasks whose pass rate ``c / n`` is neither 0
nor 1 and lies in ``[min_rate, max_rate]`` (DAPO's dynamic sampling, Yu et al. 2025 §3.2, done once
up front; the seed system keeps ``[0.05, 0.95]``, and with ``n = 8`` the defaults ``[0, 1]`` keep
the same tasks: rates 1/8 .. 7/8). Fewer than ``min_tasks`` kept tasks skip RL
(:class:`TooFewTasks`, whose message gives the counts): a handful of tasks is memorised, not learned.

Under a deadline the filter samples the pool in order of :func:`solution_size`, smallest first
(``order="smallest"``, the default of ``rl.filter_order``): a weak policy solves short programs, so a
filter that cannot sample the whole pool in time keeps more tasks from the same seconds. The evidence:
the 9-minute GPU speedrun's SFT model (``benchmarks/RESULTS.md``, tenth session) solved 20 of MBPP's 500
test problems at least once in 10 samples; 9 of them are among the 50 whose reference solutions have the
fewest AST nodes (18% against 4% of all), and their median size is 24 nodes against 40.5 for the rest.
Equal sizes keep the seeded shuffle's order.

The pool (:func:`load_pool`) is one task spec or several joined by ``+`` (``mbpp:PATH+doctest``,
:func:`codechat.data.tasks.load_tasks`), each read with its RL default split (MBPP: train), and
decontaminated against HumanEval and MBPP's test split (``mbpp_file``) by the rule of
:class:`codechat.data.decontam.Decontaminator`: a task whose prompt, reference or tests overlap a
benchmark problem is left out and named in the report.
"""
from __future__ import annotations

import ast
import math
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from codechat.config.stages import ConfigError

#: Spec separator of a pool of several task specs.
POOL_SEPARATOR = "+"


class TooFewTasks(ConfigError):
    """Fewer tasks than ``min_tasks`` passed the filter: RL is skipped (the message says how many)."""


def load_pool(spec: str, *, mbpp_file: str = "", decontaminate: bool = True, **load: Any) -> tuple[list, dict]:
    """The tasks of ``spec`` (specs joined by ``+``), decontaminated: ``(tasks, report)``.

    Args:
        spec: ``SPEC[+SPEC...]`` of :func:`codechat.data.tasks.load_tasks`; each with its RL default split.
        mbpp_file: MBPP's file: its test problems join HumanEval's in the decontamination, which doctest
            mining applies too, silently (the report's ``checked`` names what was checked).
        decontaminate: False keeps every task (``codechat rl`` on a file the user already checked).
        load: passed to every :func:`~codechat.data.tasks.load_tasks` call (``check_references``,
            ``workers``, ``timeout_s``, ``max_files``, ...).

    Returns:
        The tasks, the first of each task id; the report ``{"specs": {spec: tasks read},
        "duplicates": n, "checked": {benchmark: problems} (empty without ``decontaminate``),
        "decontaminated": [{"task_id", "problem", "part", "fraction"}], "tasks": n}``.

    Raises:
        ValueError: an empty part of the spec, or what :func:`load_tasks` raises (the spec named).
    """
    from codechat.data.corpus import benchmark_decontaminator
    from codechat.data.tasks import load_tasks
    parts = spec.split(POOL_SEPARATOR)
    if any(not p for p in parts):
        raise ValueError(f"task pool {spec!r}: an empty spec between '{POOL_SEPARATOR}' signs")
    tasks, seen, report = [], set(), {"specs": {}, "duplicates": 0, "decontaminated": []}
    decon = benchmark_decontaminator(mbpp_file or None, unchecked=())
    for part in parts:
        got = load_tasks(part, mbpp_file=mbpp_file or None, decontaminator=decon, **load)
        report["specs"][part] = len(got)
        for t in got:
            if t.task_id in seen:
                report["duplicates"] += 1
                continue
            seen.add(t.task_id)
            tasks.append(t)
    report["checked"] = dict(decon.benchmarks) if decontaminate else {}
    if decontaminate:
        kept = []
        for t in tasks:
            hit = decon.overlap(t.text())
            if hit is None:
                kept.append(t)
            else:
                report["decontaminated"].append({"task_id": t.task_id, "problem": hit.problem, "part": hit.part,
                                                 "fraction": round(hit.fraction, 3)})
        tasks = kept
    if not tasks:
        raise ValueError(f"task pool {spec!r}: no task left after decontamination against HumanEval and MBPP test "
                         f"({len(report['decontaminated'])} left out); to train on them anyway, --rl.decontaminate "
                         "false")
    report["tasks"] = len(tasks)
    return tasks, report


#: How :func:`filter_pool` orders the pool: smallest reference solution first, or the seeded shuffle alone.
FILTER_ORDERS = ("smallest", "random")


def solution_size(task: Any) -> int:
    """AST nodes of ``task.reference`` (its reference solution, with the header it runs under),
    docstrings left out: a proxy of how hard the task is (module docstring). A task without a reference
    that parses counts as larger than any that has one (:data:`sys.maxsize`), so it is sampled last."""
    try:
        tree = ast.parse(getattr(task, "reference", None) or "")
    except (SyntaxError, ValueError):
        return sys.maxsize
    if not tree.body:
        return sys.maxsize
    docs = [n.body[0] for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)
            and isinstance(n.body[0].value.value, str)]
    return sum(1 for _ in ast.walk(tree)) - 2 * len(docs)  # a docstring is an Expr and its Constant


def pool_part(task_id: str) -> str:
    """The part of the pool a task comes from: its id's prefix before ``/`` (``io``, ``doctest``, ``MBPP``,
    ...), ``other`` without one."""
    return task_id.split("/", 1)[0] if "/" in task_id else "other"


def in_bounds(n: int, c: int, min_rate: float, max_rate: float) -> bool:
    """Whether a task with ``c`` of ``n`` samples passing is kept: ``0 < c < n`` (its group has a
    signal) and ``min_rate <= c / n <= max_rate``."""
    return 0 < c < n and min_rate <= c / n <= max_rate


@dataclass(frozen=True)
class FilterResult:
    """What :func:`filter_pool` measured.

    Attributes:
        counts: ``task_id -> (n, c)`` for every task sampled (n samples, c passing every test).
        kept: the ids kept (:func:`in_bounds`), in pool order.
        pool: tasks in the pool; ``sampled`` of them were sampled before ``deadline_s`` ran out.
        seconds: wall time of the sampling and judging.
        first_s: seconds to the first task's verdict (NaN with none): on a GPU the engine's compilation and
            CUDA-graph capture land there, so a slow start shows apart from the sampling.
    """

    counts: dict[str, tuple[int, int]]
    kept: list[str]
    pool: int
    sampled: int
    seconds: float
    first_s: float = math.nan

    def pass_at_1(self) -> float:
        """Mean pass rate of the sampled tasks (the policy's pass@1 on the pool; NaN with none)."""
        rates = [c / n for n, c in self.counts.values()]
        return math.fsum(rates) / len(rates) if rates else math.nan

    def as_dict(self, min_rate: float, max_rate: float) -> dict[str, Any]:
        rates = [c / n for n, c in self.counts.values()]
        return {"pool": self.pool, "sampled": self.sampled, "kept": len(self.kept), "min_rate": min_rate,
                "max_rate": max_rate, "never_solved": sum(r == 0 for r in rates),
                "always_solved": sum(r == 1 for r in rates), "pass@1": self.pass_at_1(), "seconds": self.seconds,
                "first_s": self.first_s,
                "kept_ids": self.kept, "histogram": self.histogram(),
                "counts": {k: list(v) for k, v in self.counts.items()}}

    def histogram(self) -> dict[str, list[int]]:
        """Per part of the pool (:func:`pool_part`) and ``all``: how many sampled tasks passed 0, 1, ..., n
        of their n samples."""
        n = max((m for m, _ in self.counts.values()), default=0)
        out: dict[str, list[int]] = {"all": [0] * (n + 1)}
        for task_id, (_, c) in self.counts.items():
            out.setdefault(pool_part(task_id), [0] * (n + 1))[c] += 1
            out["all"][c] += 1
        return out


def filter_pool(tasks: Sequence, sample: Callable[[Iterator[tuple[Any, int]]], Iterator[tuple[Any, int]]], *,
                n: int, min_rate: float, max_rate: float, seed: int, deadline_s: float = 0.0, need: int = 0,
                enough: int = 0, order: str = "smallest") -> FilterResult:
    """Sample ``n`` completions of every task of ``tasks`` and keep those in the bounds (module docstring).

    The tasks are fed to ``sample`` one at a time, as it asks for them, so an engine stays full: it
    takes new tasks while earlier ones still decode (:func:`codechat.train.rollouts.stream_passes`),
    and no batch waits for its longest row before the next starts.

    Args:
        tasks: the pool (objects with ``task_id``).
        sample: ``sample(feed)``: takes ``(task, seed)`` pairs from the iterator ``feed`` as it has room
            and yields ``(task, passed)`` as each task's ``n`` samples are judged (``passed``: how many
            passed every test), in any order; the RL stage's is the engine and the sandbox
            (:func:`codechat.train.rollouts.stream_passes`), tests pass a stub policy.
        n: samples per task (>= 2).
        min_rate, max_rate: the kept rates, ``0 <= min_rate <= max_rate <= 1``.
        seed: the order the tasks are sampled in (a seeded shuffle, then ``order``) and each task's
            sampling seed.
        deadline_s: > 0: feed no task after the first once this many seconds have passed; the tasks not
            fed are left out (those fed are judged).
        need: > 0: feed no more once the tasks kept so far and those not yet judged together fall short
            of it (the stage would skip RL whatever the rest gave).
        enough: > 0: feed no more once this many tasks are kept or expected to be: those kept so far plus
            those fed and not yet judged at the rate kept so far (those already fed are still judged, so a
            few more or fewer may be kept): the time left goes to training instead of to tasks it has no
            steps for. Counting the tasks in flight keeps a slow judge from overshooting: with verdicts
            10 s late, 246 were kept against 200 asked (``benchmarks/RESULTS.md``, sixteenth session).
        order: ``smallest`` (tasks by :func:`solution_size`, ascending) or ``random`` (:data:`FILTER_ORDERS`).

    Raises:
        ValueError: ``n < 2``, bad bounds or an unknown ``order``.
    """
    from codechat.eval.suites import derive_seed
    if n < 2 or not 0.0 <= min_rate <= max_rate <= 1.0:
        raise ValueError(f"the pass-rate filter needs n >= 2 and 0 <= min <= max <= 1, got n={n}, min={min_rate}, "
                         f"max={max_rate}")
    if order not in FILTER_ORDERS:
        raise ValueError(f"the pass-rate filter's order must be one of {', '.join(FILTER_ORDERS)}, got {order!r}")
    queue = random.Random(f"{seed}:filter").sample(range(len(tasks)), len(tasks))
    if order == "smallest":
        size = [solution_size(t) for t in tasks]
        queue.sort(key=size.__getitem__)  # stable: equal sizes keep the shuffle's order
    counts: dict[str, tuple[int, int]] = {}
    kept_so_far = 0
    t0 = time.perf_counter()

    def feed() -> Iterator[tuple[Any, int]]:
        for k, i in enumerate(queue):
            if k and deadline_s and time.perf_counter() - t0 > deadline_s:  # the first task always runs
                return
            if k and kept_so_far + len(queue) - len(counts) < need:  # not yet judged: fed or not
                return
            in_flight = k - len(counts)
            if enough and kept_so_far + (in_flight * kept_so_far / len(counts) if counts else 0) >= enough:
                return
            yield tasks[i], derive_seed(seed, f"filter:{tasks[i].task_id}")

    first_s = math.nan
    for task, c in sample(feed()):
        if not counts:
            first_s = time.perf_counter() - t0
        counts[task.task_id] = (n, int(c))
        kept_so_far += in_bounds(n, int(c), min_rate, max_rate)
    kept = [t.task_id for t in tasks if t.task_id in counts and in_bounds(*counts[t.task_id], min_rate, max_rate)]
    return FilterResult(counts, kept, len(tasks), len(counts), time.perf_counter() - t0, first_s)


def too_few_message(result: FilterResult, min_tasks: int, min_rate: float, max_rate: float) -> str:
    """The reason RL is skipped when fewer than ``min_tasks`` tasks were kept."""
    d = result.as_dict(min_rate, max_rate)
    return (f"{d['kept']} of {d['sampled']} sampled pool tasks ({d['pool']} in the pool) have a pass rate in "
            f"[{min_rate:g}, {max_rate:g}] and neither 0 nor 1 ({d['never_solved']} never solved, "
            f"{d['always_solved']} always solved; pool pass@1 {d['pass@1']:.2%}); GRPO needs at least {min_tasks} "
            "(rl.min_tasks), so RL is skipped: more SFT, a larger pool, or wider bounds")
