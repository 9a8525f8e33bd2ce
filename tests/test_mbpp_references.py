"""All 974 MBPP reference solutions pass their asserts in the sandbox, and every one of them,
mutated to return a wrong value, fails.

MBPP's published references were checked by its authors, and in this copy none has a bad
test: KNOWN_BAD is empty. One reference is slow rather than bad: task 123
(``amicable_numbers_sum(9999)`` by trial division) needs ~10 s on a 2-core VM, more than the
default 10 s deadline, so this file judges with ``TIMEOUT_S``.

MBPP comes from ``shared/`` (those tests skip, naming the file, when it is absent). The same checks run
on the project's own MBPP-shaped file, ``tests/fixtures/cases_a/mbpp_mini.jsonl`` (16 small problems with
task ids at the edges of every split, whose references return a bool, an int, a float, a str, a list, a
tuple, a set or a dict, so that every branch of the mutation is exercised).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from codechat.data import benchmarks
from codechat.eval import problems
from codechat.eval import sandbox as sb
from codechat.eval.extract import called_names, parse_quietly

from conftest import FIXTURES, shared_file

MBPP_REL = "data/mbpp/mbpp.jsonl"
MINI_MBPP = FIXTURES / "cases_a" / "mbpp_mini.jsonl"
MINI_IDS = [1, 2, 3, 4, 10, 11, 12, 13, 14, 510, 511, 600, 601, 602, 603, 974]
KNOWN_BAD: dict[int, str] = {}  # task_id -> why its reference fails its own tests
SLOW = {123: "amicable numbers below 10^4 by trial division: ~10 s"}
TIMEOUT_S = 60.0

# Appended to a reference: every function the asserts call returns a wrong value of the same
# kind (int + 1, not bool, str + "?", a longer container, ...) or an object equal to nothing.
MUTATION = '''

class _Wrong:
    def __eq__(self, other):
        return False
    def __ne__(self, other):
        return True
    __hash__ = object.__hash__
    def __bool__(self):
        raise TypeError("wrong value")

def _wrong(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float, complex)):
        return value + 1
    if isinstance(value, (str, bytes)):
        return value + value[:0].__class__("?" if isinstance(value, str) else b"?")
    if isinstance(value, (list, tuple)):
        return value + type(value)([_Wrong()])
    if isinstance(value, (set, frozenset)):
        return value | {_Wrong()}
    if isinstance(value, dict):
        return {**value, _Wrong(): None}
    if value is None:
        return 0
    return _Wrong()

def _mutate(fn):
    def wrapper(*args, **kwargs):
        return _wrong(fn(*args, **kwargs))
    return wrapper
'''


def _mutated(task: problems.MBPPTask) -> str | None:
    """The reference with every tested function wrapped to return a wrong value."""
    tree = parse_quietly(task.code)
    funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    called = [n for n in called_names(task.test_list) if n in funcs]
    if not called:
        return None
    return task.program() + MUTATION + "".join(f"{n} = _mutate({n})\n" for n in called)


def _judge(tasks: list[problems.MBPPTask]) -> tuple[list[sb.ExecResult], list[sb.ExecResult]]:
    """References and mutants judged in one pool run, interleaved so that the slow task's
    two runs overlap on the two workers. Returns (reference results, mutant results)."""
    jobs = []
    for t in tasks:
        mutant = _mutated(t)
        assert mutant is not None, f"task {t.task_id}: no tested function to mutate"
        jobs += [t.job(timeout_s=TIMEOUT_S), sb.Job(mutant, t.test_list, TIMEOUT_S)]
    with sb.Sandbox(2) as box:
        results = box.run_many(jobs, workers=2)
    return results[0::2], results[1::2]


def _check_splits(path: Path, ids: list[int], sizes: dict[str, int]) -> None:
    assert [t.task_id for t in problems.load_mbpp(path, "all")] == ids
    assert {s: len(problems.load_mbpp(path, s)) for s in benchmarks.MBPP_SPLITS} == sizes
    assert benchmarks.mbpp_split(11) == "test" and benchmarks.mbpp_split(510) == "test"
    assert benchmarks.mbpp_split(511) == "validation" and benchmarks.mbpp_split(601) == "train"
    with pytest.raises(ValueError):
        benchmarks.mbpp_split(975)
    with pytest.raises(ValueError):
        problems.load_mbpp(path, "dev")


def _check_references(tasks: list[problems.MBPPTask], refs: list[sb.ExecResult], known_bad: dict[int, str]) -> None:
    failing = {t.task_id: f"{r.status}: {r.error}" for t, r in zip(tasks, refs) if not r.passed}
    print(f"MBPP references passing: {sum(r.passed for r in refs)}/{len(refs)}; "
          f"failing: {failing}")
    assert set(failing) == set(known_bad), failing
    assert sum(r.passed for r in refs) == len(tasks) - len(known_bad)


def _check_mutants(tasks: list[problems.MBPPTask], mutated: list[sb.ExecResult]) -> None:
    still_passing = [t.task_id for t, r in zip(tasks, mutated) if r.passed]
    assert still_passing == [], still_passing
    # they fail on a test, not by breaking the program
    assert all(r.definitions_ok and r.status == "failed" for r in mutated)


# ----------------------------------------------------------------------------- MBPP (shared/)
@pytest.fixture(scope="module")
def tasks() -> list[problems.MBPPTask]:
    return problems.load_mbpp(shared_file(MBPP_REL), "all")


@pytest.fixture(scope="module")
def judged(tasks):
    return _judge(tasks)


def test_splits_follow_the_task_ids(tasks):
    assert len(tasks) == 974
    _check_splits(shared_file(MBPP_REL), list(range(1, 975)),
                  {"prompt": 10, "test": 500, "validation": 90, "train": 374})


def test_entry_points_are_found(tasks):
    assert all(t.entry_point for t in tasks)
    assert tasks[0].entry_point == "min_cost"


def test_all_references_pass_except_known_bad(tasks, judged):
    refs, _ = judged
    _check_references(tasks, refs, KNOWN_BAD)


def test_every_mutated_reference_fails(tasks, judged):
    _, mutated = judged
    _check_mutants(tasks, mutated)


# ----------------------------------------------------------------------------- the project's own MBPP-shaped file
@pytest.fixture(scope="module")
def mini_tasks() -> list[problems.MBPPTask]:
    return problems.load_mbpp(MINI_MBPP, "all")


@pytest.fixture(scope="module")
def mini_judged(mini_tasks):
    return _judge(mini_tasks)


def test_mini_splits_follow_the_task_ids():
    _check_splits(MINI_MBPP, MINI_IDS, {"prompt": 5, "test": 5, "validation": 2, "train": 4})


def test_mini_entry_points_are_found(mini_tasks):
    assert [t.entry_point for t in mini_tasks][:5] == ["reverse_words", "count_vowels", "is_perfect_square",
                                                       "second_largest", "factorial"]
    assert all(t.entry_point for t in mini_tasks)
    t12 = next(t for t in mini_tasks if t.task_id == 12)  # its set-up code comes after the reference
    assert t12.program().endswith("\n\nSAMPLE = [4, 7, 1, 9, 3]\n") and "\r" not in t12.program()


def test_mini_all_references_pass(mini_tasks, mini_judged):
    refs, _ = mini_judged
    _check_references(mini_tasks, refs, {})
    assert all(r.tests_passed == r.tests_total == 3 for r in refs)


def test_mini_a_bad_reference_is_reported_as_failing(mini_tasks):
    """The reference check is not vacuous: a wrong reference is listed with its task id."""
    from dataclasses import replace
    bad = [replace(t, code=t.code.replace("return sum(items[0::2])", "return sum(items[1::2])"))
           if t.task_id == 12 else t for t in mini_tasks[5:9]]
    refs, _ = _judge(bad)
    with pytest.raises(AssertionError, match="12"):
        _check_references(bad, refs, {})
    _check_references(bad, refs, {12: "sums the odd positions"})


def test_mini_every_mutated_reference_fails(mini_tasks, mini_judged):
    _, mutated = mini_judged
    _check_mutants(mini_tasks, mutated)
    returned = {type(eval(t.test_list[0].split("==", 1)[1])).__name__ for t in mini_tasks}  # what the asserts expect
    assert returned == {"bool", "int", "float", "str", "list", "tuple", "set", "dict"}
