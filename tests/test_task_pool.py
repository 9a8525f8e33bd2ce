"""The RL task pool and its pass-rate filter (codechat.train.task_pool): the filter keeps exactly the
tasks in its bounds (a stub policy with known pass rates; the real tiny policy through ``codechat rl
--filter-samples`` is in test_rl_stage), too few kept tasks give the counts in the message, and the
pool is decontaminated against HumanEval."""
from __future__ import annotations

import gzip
import itertools
import json
from dataclasses import dataclass

import pytest

from codechat.config.stages import ConfigError
from codechat.train import task_pool
from codechat.train.grpo import RLConfig
from codechat.train.task_pool import filter_pool, in_bounds, load_pool, solution_size, too_few_message


@dataclass(frozen=True)
class Stub:
    task_id: str


class Clock:
    """``time`` for :mod:`codechat.train.task_pool` whose ``perf_counter`` moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def stub_policy(passing: dict[str, int], calls: list, chunk: int = 64, clock: Clock | None = None):
    """A policy whose samples of task ``t`` pass ``passing[t]`` times out of n, whatever the seed: it takes
    ``chunk`` tasks from the feed (fewer when the feed stops), recorded in ``calls``, spends one second of
    ``clock`` on them, then yields their verdicts in reverse (a sampler may finish tasks in any order)."""
    def sample(feed):
        seeds: set[int] = set()
        while part := list(itertools.islice(feed, chunk)):
            calls.append([t.task_id for t, _ in part])
            seeds.update(s for _, s in part)
            if clock is not None:
                clock.now += 1.0
            yield from ((t, passing[t.task_id]) for t, _ in reversed(part))
        assert len(seeds) == sum(map(len, calls))
    return sample


def test_the_filter_keeps_exactly_the_tasks_in_its_bounds(monkeypatch):
    passing = {f"t{c}_{i}": c for c in range(9) for i in range(3)}  # 0..8 of 8 samples pass, three tasks each
    tasks = [Stub(t) for t in passing]
    for lo, hi, rates in ((0.0, 1.0, range(1, 8)), (0.05, 0.95, range(1, 8)), (0.25, 0.75, range(2, 7)),
                          (0.5, 0.5, [4]), (0.0, 0.0, [])):
        calls: list = []
        res = filter_pool(tasks, stub_policy(passing, calls, chunk=5), n=8, min_rate=lo, max_rate=hi, seed=3)
        assert res.kept == [t for t in passing if passing[t] in rates], (lo, hi)  # pool order
        assert res.counts == {t: (8, c) for t, c in passing.items()} and (res.pool, res.sampled) == (27, 27)
        assert [len(c) for c in calls] == [5] * 5 + [2] and sorted(sum(calls, [])) == sorted(passing)
        assert res.pass_at_1() == pytest.approx(0.5)
    d = res.as_dict(0.0, 0.0)
    assert (d["never_solved"], d["always_solved"], d["kept"]) == (3, 3, 0)
    assert d["histogram"] == {"all": [3] * 9, "other": [3] * 9}  # three tasks at each of 0..8 passes
    parts = {"io/a": 0, "io/b": 3, "doctest/c": 3, "MBPP/7": 8}
    h = filter_pool([Stub(t) for t in parts], stub_policy(parts, []), n=8, min_rate=0, max_rate=1, seed=0).histogram()
    assert h == {"all": [1, 0, 0, 2, 0, 0, 0, 0, 1], "io": [1, 0, 0, 1, 0, 0, 0, 0, 0],
                 "doctest": [0, 0, 0, 1, 0, 0, 0, 0, 0], "MBPP": [0, 0, 0, 0, 0, 0, 0, 0, 1]}
    assert in_bounds(8, 1, 0.0, 1.0) and not in_bounds(8, 0, 0.0, 1.0) and not in_bounds(8, 8, 0.0, 1.0)
    # the order tasks are sampled in is a function of the seed; a deadline leaves the rest out
    first: list = []
    filter_pool(tasks, stub_policy(passing, first, chunk=5), n=8, min_rate=0, max_rate=1, seed=4)
    assert first != calls
    late: list = []
    monkeypatch.setattr(task_pool, "time", clock := Clock())
    res = filter_pool(tasks, stub_policy(passing, late, chunk=5, clock=clock), n=8, min_rate=0, max_rate=1, seed=3,
                      deadline_s=0.5)  # passed after the first five tasks
    assert len(late) == 1 and res.sampled == 5 and res.pool == 27 and set(res.kept) <= set(late[0])
    # the first verdict's time (an engine's warm-up lands there) apart from the whole: 1 s a batch of 5 here
    whole = filter_pool(tasks, stub_policy(passing, [], chunk=5, clock=clock), n=8, min_rate=0, max_rate=1, seed=3)
    assert (whole.first_s, whole.seconds) == (1.0, 6.0) and whole.as_dict(0, 1)["first_s"] == 1.0
    # a sampler that asks for one task at a time: the deadline passes while it samples the first
    assert filter_pool(tasks, stub_policy(passing, [], chunk=1, clock=clock), n=8, min_rate=0, max_rate=1, seed=3,
                       deadline_s=0.5).sampled == 1
    # stops once the tasks kept and those left cannot reach `need` (22 tasks are left after the first 5)
    early: list = []
    res_need = filter_pool(tasks, stub_policy(passing, early, chunk=5), n=8, min_rate=0, max_rate=1, seed=3, need=26)
    kept_first = sum(0 < passing[t] < 8 for t in early[0])
    assert len(early) == (1 if kept_first + 22 < 26 else 2) and res_need.sampled == 5 * len(early)
    assert len(filter_pool(tasks, stub_policy(passing, [], chunk=5), n=8, min_rate=0, max_rate=1, seed=3,
                           need=21).counts) == 27  # 21 of 27 are in the bounds: never out of reach
    # `enough`: no task is fed once that many are kept; those fed are all judged
    one: list = []
    res_enough = filter_pool(tasks, stub_policy(passing, one, chunk=1), n=8, min_rate=0, max_rate=1, seed=3, enough=4)
    fed = [t for (t,) in one]
    assert len(res_enough.kept) == 4 and 0 < passing[fed[-1]] < 8 and res_enough.sampled == len(fed) < 27
    assert sum(0 < passing[t] < 8 for t in fed[:-1]) == 3  # the last task fed made the fourth
    # a judge five tasks behind: the tasks in flight count at the rate kept so far (3 of the first 5 -> 0.6),
    # so the second round stops after 2 fed (3 + 2 x 0.6 >= 4), not after 5 (which once kept 246 of 200 asked)
    five: list = []
    res5 = filter_pool(tasks, stub_policy(passing, five, chunk=5), n=8, min_rate=0, max_rate=1, seed=3, enough=4)
    assert sum(0 < passing[t] < 8 for t in five[0]) == 3 and [len(c) for c in five] == [5, 2]
    assert res5.sampled == 7 and len(res5.kept) == 3 + sum(0 < passing[t] < 8 for t in five[1])
    msg = too_few_message(res, 32, 0.0, 1.0)
    assert msg.startswith(f"{len(res.kept)} of 5 sampled pool tasks (27 in the pool)") and "at least 32" in msg
    with pytest.raises(ValueError, match="n >= 2"):
        filter_pool(tasks, stub_policy(passing, []), n=1, min_rate=0, max_rate=1, seed=0)
    with pytest.raises(ValueError, match="min <= max"):
        filter_pool(tasks, stub_policy(passing, []), n=8, min_rate=0.6, max_rate=0.4, seed=0)


@dataclass(frozen=True)
class Sized:
    task_id: str
    reference: str | None


def test_solution_size_counts_the_reference_program_and_leaves_docstrings_out():
    bare = "def f(x):\n    return x + 1\n"
    documented = 'def f(x):\n    """Add one to x, a number, and give it back."""\n    return x + 1\n'
    assert solution_size(Sized("a", bare)) == solution_size(Sized("b", documented)) == 10
    longer = "def f(xs):\n    out = []\n    for x in xs:\n        out.append(x * 2)\n    return out\n"
    assert solution_size(Sized("c", longer)) > solution_size(Sized("a", bare))
    assert solution_size(Sized("d", None)) == solution_size(Sized("e", "def (:")) > 10**9  # sampled last


def test_the_filter_samples_the_smallest_solutions_first_under_a_deadline(monkeypatch):
    """The shortest references go first (equal sizes in the seeded shuffle's order), so a deadline after
    the first chunk samples them; ``random`` keeps the shuffle alone."""
    sizes = {f"t{i}": i for i in range(12)}
    tasks = [Sized(t, "def f():\n" + "    x = 1\n" * (k + 1) + "    return x\n") for t, k in sorted(sizes.items())][::-1]
    calls: list = []
    filter_pool(tasks, stub_policy({t: 1 for t in sizes}, calls, chunk=4), n=8, min_rate=0, max_rate=1, seed=5)
    assert calls == [["t0", "t1", "t2", "t3"], ["t4", "t5", "t6", "t7"], ["t8", "t9", "t10", "t11"]]
    late: list = []
    monkeypatch.setattr(task_pool, "time", clock := Clock())
    res = filter_pool(tasks, stub_policy({t: 1 for t in sizes}, late, chunk=4, clock=clock), n=8, min_rate=0,
                      max_rate=1, seed=5, deadline_s=0.5)
    assert late == [["t0", "t1", "t2", "t3"]] and res.kept == ["t3", "t2", "t1", "t0"]  # kept: pool order
    shuffled: list = []
    filter_pool(tasks, stub_policy({t: 1 for t in sizes}, shuffled, chunk=4), n=8, min_rate=0, max_rate=1, seed=5,
                order="random")
    assert sorted(sum(shuffled, [])) == sorted(sizes) and shuffled != calls
    with pytest.raises(ValueError, match="smallest, random"):
        filter_pool(tasks, stub_policy({}, []), n=8, min_rate=0, max_rate=1, seed=0, order="easiest")


@pytest.mark.parametrize("setting, fragment", [
    ({"filter_samples": 1}, "a pass rate needs at least 2 samples"),
    ({"filter_samples": 8, "heldout_samples": 1}, "rl.heldout_samples=1: a pass rate needs at least 2"),
    ({"filter_min": 0.7, "filter_max": 0.3}, "0 <= min <= max <= 1"),
    ({"min_tasks": 0}, "rl.min_tasks >= 1"),
    ({"filter_order": "easiest"}, "rl.filter_order must be one of smallest, random"),
    ({"filter_samples": 8, "heldout_tasks": 8, "filter_enough": 39}, "before it kept rl.min_tasks")])
def test_filter_settings_that_cannot_work_are_refused_when_built(setting, fragment):
    with pytest.raises(ConfigError, match=fragment):
        RLConfig(**setting)


def _row(task_id: str, prompt: str, test: str = "assert f() == 1") -> str:
    return json.dumps({"task_id": task_id, "prompt": prompt, "tests": [test],
                       "reference": "def f():\n    return 1\n"}) + "\n"


def test_the_pool_joins_specs_and_leaves_out_what_overlaps_humaneval(tmp_path):
    from codechat.data.tasks import HUMANEVAL_FILE
    with gzip.open(HUMANEVAL_FILE, "rt") as f:
        he = json.loads(f.readline())  # HumanEval/0
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(_row("one", "Write a function `f()` that returns 1.") + _row("copied", he["prompt"]))
    b.write_text(_row("one", "the same id again: the first one is kept") + _row("two", "Write `f()`, returning 1."))
    tasks, report = load_pool(f"tasks:{a}+tasks:{b}", check_references=True, workers=1)
    assert [t.task_id for t in tasks] == ["one", "two"]
    assert report["specs"] == {f"tasks:{a}": 2, f"tasks:{b}": 2} and report["duplicates"] == 1
    assert [(d["task_id"], d["problem"]) for d in report["decontaminated"]] == [("copied", "HumanEval/0")]
    kept, _ = load_pool(f"tasks:{a}", decontaminate=False, workers=1)
    assert [t.task_id for t in kept] == ["one", "copied"]
    with pytest.raises(ValueError, match="an empty spec"):
        load_pool(f"tasks:{a}++doctest")
