"""Input/output tasks mined from pure corpus functions (``codechat/data/io_tasks.py``), with the real sandbox."""
from __future__ import annotations

import ast
import json

import pytest

from codechat.data import io_tasks as IO
from codechat.data.tasks import load_tasks
from codechat.eval import sandbox

pytestmark = pytest.mark.timeout(180)

SOURCE = '''
import math
import os


def clamp(value: int, low=0):
    """Clamp the integer value so that it is never below low, returning the result."""
    return value if value > low else low


def initials(name):
    """Return the upper-case first letter of every word in the name, joined together."""
    return "".join(w[0].upper() for w in name.split())


def hypot_floor(a: int, b: int):
    """The integer part of the hypotenuse of a right triangle with sides a and b."""
    return int(math.sqrt(a * a + b * b))


def always_seven(n):
    """Return seven, whatever the number n given to this function happens to be."""
    return 7


def shout(text):
    """Print the text in upper case and return nothing at all to the caller."""
    print(text.upper())


def unique(items):
    """The distinct items of the list, in the order a set happens to give them back."""
    return list(set(items))


def cwd_name(suffix):
    """The current working directory's name followed by the suffix string given."""
    return os.getcwd() + suffix


def halve(x: int):
    """Half of the number x as a floating point value, never rounded to an integer."""
    return x / 2


def count_up(n):
    """A list of the integers from zero up to but not including n, in increasing order."""
    out = []
    i = 0
    while i < n:
        out.append(i)
        i += 1
    return out


def bump(n):
    """Add n to the module's running total and return the new total value."""
    global TOTAL
    TOTAL += n
    return TOTAL


def documented(n):
    """Twice n, shown by its example.

    >>> documented(2)
    4
    """
    return 2 * n
'''


@pytest.fixture(scope="module")
def mined(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    (src / "funcs.py").write_text(SOURCE)
    counts = IO.IOCounts()
    with sandbox.Sandbox(workers=2) as box:
        tasks = IO.mine_io_tasks([src], box=box, counts=counts, mbpp_file=None)
        yield src, {t.entry_point: t for t in tasks}, counts, box


def test_only_pure_functions_whose_results_differ_become_tasks_and_each_rejection_is_counted(mined):
    _, tasks, counts, _ = mined
    assert sorted(tasks) == ["clamp", "count_up", "hypot_floor", "initials"]
    skipped = counts.skipped
    assert skipped["impure_name"] == 2  # shout prints; unique's set orders its items by the hash seed
    assert skipped["impure_construct"] == 1  # bump changes a global
    assert skipped["free_name"] == 1  # cwd_name reads os, not a pure module
    assert skipped["behaviour_not_pinned"] == 2  # always_seven (one result), halve (floats)
    assert skipped["docstring"] == 1  # documented: its doctest is doctest_tasks' own
    assert counts.functions == 11 and counts.candidates == 6 and counts.kept == 4


def test_a_task_asks_for_the_function_by_signature_and_docstring_and_tests_what_it_returned(mined):
    _, tasks, _, box = mined
    t = tasks["clamp"]
    assert t.task_id.startswith("io/") and t.task_id.endswith("funcs.py::clamp")
    assert t.prompt.messages[0].content.startswith("Write a Python function `clamp(value: int, low=0)` that: Clamp")
    assert 2 <= len(t.tests) <= IO.TESTS and all(x.startswith("assert clamp(") for x in t.tests)
    results = [ast.literal_eval(x.split(" == ", 1)[1]) for x in t.tests]
    assert len(set(results)) >= 2
    for x in t.tests:  # each expected value is what the function gives
        call, want = x[len("assert "):].split(" == ", 1)
        args = ast.literal_eval("(" + call[len("clamp("):-1] + ",)")
        assert max(args[0], args[1] if len(args) > 1 else 0) == ast.literal_eval(want) or args[0] <= (
            args[1] if len(args) > 1 else 0)
    assert "import math" in tasks["hypot_floor"].reference and "import os" not in tasks["hypot_floor"].reference
    jobs = [task.reference_job(timeout_s=5) for task in tasks.values()]
    assert all(r.passed for r in box.run_many(jobs, workers=2))
    wrong = tasks["initials"].problem.program("def initials(name):\n    return name\n")
    assert not box.run_many([sandbox.Job(wrong, tasks["initials"].tests, timeout_s=5)], workers=1)[0].passed


def test_the_corpus_task_file_holds_doctests_then_io_tasks_and_reads_back_as_the_same_tasks(mined, tmp_path):
    src, tasks, _, box = mined
    out = tmp_path / "rl_tasks.jsonl"
    counts = IO.write_corpus_tasks([src], out, box=box, io_max_tasks=2)
    assert counts["doctest"]["kept"] == 1 and counts["io"]["kept"] == 2 and counts["kept"] == 3
    back = load_tasks(f"tasks:{out}")
    assert [t.task_id.split("::")[-1] for t in back] == ["documented", "clamp", "initials"]
    assert back[1].tests == tasks["clamp"].tests and back[1].reference == tasks["clamp"].reference
    assert json.loads(out.read_text().splitlines()[1])["suite"] == "io"


def test_a_base_model_continues_a_mined_task_after_its_docstring_and_is_judged_on_prompt_plus_body(mined, tok, tmp_path):
    """The speedrun's probe of ``pretrain/`` on the RL pool (base mode): the task's imports, signature and
    docstring are the prompt, HumanEval's stops end the body, and prompt + body is judged."""
    from codechat.eval import suites as es
    src, _, _, box = mined
    out = tmp_path / "rl_tasks.jsonl"
    IO.write_corpus_tasks([src], out, box=box)
    problems = [t.problem for t in load_tasks(f"tasks:{out}")]
    assert {p.suite for p in problems} == {"doctest", "io"} <= set(es.FUNCTION_PROMPT_SUITES)
    hyp = next(p for p in problems if p.entry_point == "hypot_floor")
    assert hyp.base_prompt.startswith("import math") and hyp.base_prompt.rstrip().endswith('"""')

    class Scripted:  # answers each problem with its reference's body (or a wrong one), as a base model would
        def __init__(self, right: bool) -> None:
            self.right = right

        def __call__(self, jobs):
            for job in jobs:
                body = job.problem.reference[len(job.problem.base_prompt):] if self.right else "    return None\n"
                for i in job.samples:
                    yield job, i, es.Generation(body, 1, "stop_token")
    for right in (True, False):
        res = es.run_suite(None, tok, out_dir=tmp_path / str(right), suite=problems, mode="base", n=1, ks=(1,),
                           sampler=Scripted(right), progress=False, box=box)
        assert res["pass@1"] == (1.0 if right else 0.0)
    assert es.solution_code(hyp, "base", "    return 1\n") == hyp.base_prompt + "    return 1\n"


@pytest.mark.parametrize("param, default, expect", [
    ("n", None, int), ("text", None, str), ("items", None, list), ("flag", None, bool),
    ("whatever: list[str]", None, list), ("value: int", None, int), ("x", "'a'", str)])
def test_parameters_get_values_by_annotation_default_or_name(param, default, expect):
    fn = ast.parse(f"def f({param}{'=' + default if default else ''}): pass").body[0]
    pool = IO.value_pool(fn.args.args[0], fn.args.defaults[0] if fn.args.defaults else None)
    assert pool and all(isinstance(v, expect) for v in pool)
    if param.endswith("list[str]"):
        assert all(isinstance(e, str) for v in pool for e in v)


#: A page break (form feed) and line separators inside strings: line breaks to ``str.splitlines``, not to Python.
ODD_BREAKS = ('SEP = "a\u2028b\x85c"\n\x0c\n# the second page\nGS = "x\x1dy"\n\n\n'
              'def clamp(value: int, low=0):\n'
              '    """Clamp the integer value so that it is never below low, returning the result."""\n'
              '    return value if value > low else low\n\n\n'
              'def triple(n):\n    """Three times n, shown by its example.\n\n    >>> triple(2)\n    6\n    """\n'
              '    return 3 * n\n')


def test_functions_after_page_breaks_and_line_separators_are_mined_whole(mined, tmp_path):
    """Sources holding characters that ``str.splitlines`` breaks at and Python does not (the GPU
    speedrun's corpus miner died of one with ``SyntaxError``) give the same tasks, and SFT pairs, as
    without them: each function's source sliced by its own line numbers."""
    box = mined[3]
    src = tmp_path / "src"
    src.mkdir()
    (src / "odd.py").write_text(ODD_BREAKS, encoding="utf-8")
    out = tmp_path / "tasks.jsonl"
    counts = IO.write_corpus_tasks([src], out, box=box)
    assert counts["doctest"]["kept"] == 1 and counts["io"]["kept"] == 1, counts
    doctest_task, io_task = load_tasks(f"tasks:{out}")
    assert doctest_task.reference.startswith("def triple(n):") and doctest_task.reference.rstrip().endswith("return 3 * n")
    assert io_task.reference == ('def clamp(value: int, low=0):\n    """Clamp the integer value so that it is never '
                                 'below low, returning the result."""\n    return value if value > low else low\n')
    from codechat.data.mining import mine_records
    answers = [r.conversation.messages[1].content for r in mine_records([src])]
    assert "def clamp(value: int, low=0):\n    return value if value > low else low" in answers
