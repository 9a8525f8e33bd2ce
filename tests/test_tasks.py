"""RL tasks (codechat.data.tasks): every loader on real files, doctest mining, and bad input.

One sandbox pool is shared by the module. MBPP and the glaive sample come from ``shared/`` (those tests
skip, naming the file, when it is absent); each behaviour they pin is pinned as well on the project's own
MBPP-shaped file and glaive-style conversations in ``tests/fixtures/cases_a/`` (``mbpp_mini.jsonl``: prompt
tasks 1-4 and 10, test tasks 11-14 and 510, validation 511 and 600, train 601-603 and 974;
``glaive_mini.json``: 12 conversations, 8 train and 4 held out).
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import logging
import re
import warnings
from pathlib import Path

import pytest

from codechat.chat.conversation import Conversation, Message
from codechat.data import doctest_tasks as D
from codechat.data import tasks as T
from codechat.data.benchmarks import HUMANEVAL_FILE, conversation_split
from codechat.eval import rewards, sandbox
from codechat.eval.cli import _cli_filter
from codechat.eval.problems import load_humaneval

from conftest import FIXTURES, shared_file

MBPP_REL = "data/mbpp/mbpp.jsonl"
GLAIVE_REL = "data/function_calling_glaive/glaive_toolcall_en_demo.json"
MINI_MBPP = FIXTURES / "cases_a" / "mbpp_mini.jsonl"
MINI_GLAIVE = FIXTURES / "cases_a" / "glaive_mini.json"
MINI_TRAIN_IDS = [601, 602, 603, 974]


@pytest.fixture(scope="module")
def box():
    with sandbox.Sandbox(2) as b:
        yield b


@contextlib.contextmanager
def captured():
    """``(records, caught)``: the warnings the block logs through the ``codechat`` loggers, and the Python
    warnings it raises."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("codechat")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield records, caught
    finally:
        logger.removeHandler(handler)


@contextlib.contextmanager
def warns(match: str):
    """Asserts that the block logs a warning matching ``match`` through a ``codechat`` logger (one line, as
    the CLI prints it) and raises no Python warning about it (printed with a source excerpt)."""
    with captured() as (records, caught):
        yield
    assert any(re.search(match, r.getMessage()) for r in records), [r.getMessage() for r in records]
    assert not [w for w in caught if re.search(match, str(w.message))]


def fenced(code: str) -> str:
    return f"Here is the function:\n\n```python\n{code}\n```\n"


# ----------------------------------------------------------------------------- MBPP / HumanEval
def check_mbpp_default_split_and_references(mbpp: Path, train_ids: list[int], box) -> None:
    tasks = T.load_tasks(f"mbpp:{mbpp}", check_references=True, box=box)
    assert [t.task_id for t in tasks] == [f"MBPP/{i}" for i in train_ids]
    t = tasks[0]
    assert t.kind == "code" and t.problem.split == "train" and t.source == str(mbpp)
    assert [m.role for m in t.prompt.messages] == ["user"]
    assert t.prompt.messages[0].content == t.problem.prompt and "Your code should pass these tests" in t.problem.prompt
    assert len(t.tests) == 3 and t.entry_point and t.reference


def test_mbpp_default_split_is_train_601_to_974_and_references_pass(box):
    check_mbpp_default_split_and_references(shared_file(MBPP_REL), list(range(601, 975)), box)


def test_mini_mbpp_default_split_is_its_train_tasks_and_references_pass(box):
    check_mbpp_default_split_and_references(MINI_MBPP, MINI_TRAIN_IDS, box)
    [first] = T.load_tasks(f"mbpp:{MINI_MBPP}", limit=1)
    assert first.entry_point == "common_prefix" and first.tests[0] == "assert common_prefix(['flower', 'flow', 'flight']) == 'fl'"
    assert "\r" not in first.reference  # the release's CRLF line ends are normalised


def check_mbpp_task_judges_a_chat_answer(mbpp: Path, box) -> None:
    t = T.load_tasks(f"mbpp:{mbpp}", limit=1)[0]
    good, bad = box.run_many([t.job(fenced(t.reference)), t.job(fenced("def nothing():\n    return 1"))])
    assert good.passed and rewards.tiered(good) == 1.0
    assert not bad.passed and bad.tests_total == 3
    assert t.code("no code at all") == ""


def test_mbpp_task_judges_a_chat_answer_like_eval(box):
    check_mbpp_task_judges_a_chat_answer(shared_file(MBPP_REL), box)


def test_mini_mbpp_task_judges_a_chat_answer_like_eval(box):
    check_mbpp_task_judges_a_chat_answer(MINI_MBPP, box)
    # the test set-up code of a task is part of its program: task 12's asserts read SAMPLE from it
    with warns("evaluation reports on"):
        t12 = next(t for t in T.load_tasks(f"mbpp:{MINI_MBPP}", split="test") if t.task_id == "MBPP/12")
    assert t12.problem.test_setup_code == "SAMPLE = [4, 7, 1, 9, 3]"
    ok, off = box.run_many([t12.job(fenced("def even_position_sum(items):\n    return sum(items[::2])")),
                            t12.job(fenced("def even_position_sum(items):\n    return sum(items[1::2])"))])
    assert ok.passed and ok.tests_passed == 3 and not off.passed and off.tests[0].outcome == "failed"


def test_mbpp_other_splits_and_limit():
    mbpp = shared_file(MBPP_REL)
    assert [t.task_id for t in T.load_tasks(f"mbpp:{mbpp}", split="prompt")] == [f"MBPP/{i}" for i in range(1, 11)]
    with warns("evaluation reports on"):
        assert len(T.load_tasks(f"mbpp:{mbpp}", split="test", limit=5)) == 5


def test_mini_mbpp_other_splits_and_limit():
    """Splits follow the task ids at their edges: 10 | 11, 510 | 511, 600 | 601, 974."""
    ids = lambda **kw: [t.task_id for t in T.load_tasks(f"mbpp:{MINI_MBPP}", **kw)]  # noqa: E731
    assert ids(split="prompt") == ["MBPP/1", "MBPP/2", "MBPP/3", "MBPP/4", "MBPP/10"]
    with warns("evaluation reports on"):
        assert ids(split="test") == ["MBPP/11", "MBPP/12", "MBPP/13", "MBPP/14", "MBPP/510"]
    with warns("evaluation reports on"):
        assert ids(split="validation") == ["MBPP/511", "MBPP/600"]
    with warns("evaluation reports on"):
        assert len(ids(split="test", limit=3)) == 3
    with warns("evaluation reports on"):
        assert len(ids(split="all")) == 16


def test_humaneval_shipped_and_by_path_with_references(box):
    with warns("evaluation reports on"):
        tasks = T.load_tasks("humaneval", check_references=True, box=box)
    assert len(tasks) == 164 and tasks[0].task_id == "HumanEval/0" and tasks[0].tests == ("check(has_close_elements)",)
    with warns("evaluation reports on"):
        again = T.load_tasks(f"humaneval:{HUMANEVAL_FILE}", limit=3)
    assert [t.task_id for t in again] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert again[0].prompt == tasks[0].prompt


# ----------------------------------------------------------------------------- tasks.jsonl
def check_tasks_jsonl_round_trip(mbpp: Path, tmp_path: Path, box) -> None:
    """Sample rows as ``codechat eval run`` writes them -> ``codechat eval filter`` -> load_tasks."""
    problems = [T.load_tasks(f"mbpp:{mbpp}", limit=2)[i].problem for i in range(2)]
    with warns("evaluation reports on"):
        problems += [t.problem for t in T.load_tasks("humaneval", limit=2)]
    samples = tmp_path / "samples.jsonl"
    with open(samples, "w") as f:
        for p in problems:
            for i, passed in enumerate((True, False)):  # pass rate 0.5: kept
                f.write(json.dumps({**p.row(), "sample": i, "status": "passed" if passed else "failed",
                                    "passed": passed}) + "\n")
    out = tmp_path / "tasks.jsonl"
    assert _cli_filter(argparse.Namespace(samples=samples, min_rate=0.05, max_rate=0.95, out=out)) == 0
    tasks = T.load_tasks(f"tasks:{out}", check_references=True, box=box)
    assert [t.task_id for t in tasks] == ["MBPP/601", "MBPP/602", "HumanEval/0", "HumanEval/1"]
    assert [t.source for t in tasks] == [f"{out}:{i}" for i in range(1, 5)]
    mbpp, he = tasks[0], tasks[2]
    assert mbpp.reference is None and mbpp.tests == problems[0].tests  # rows carry no MBPP reference
    shipped = load_humaneval()[0]
    assert (he.problem.header, he.problem.base_prompt, he.reference) == \
           (shipped.header, shipped.base_prompt, shipped.reference)  # recovered from the shipped copy
    # a HumanEval answer that is only the body is put under the signature, as in eval
    body = shipped.reference[len(shipped.base_prompt):]
    assert box.run_many([he.job(fenced(body))])[0].passed
    assert [t.task_id for t in T.load_tasks(f"tasks:{out}", split="test")] == ["HumanEval/0", "HumanEval/1"]


def test_tasks_jsonl_written_by_eval_filter_round_trips(tmp_path, box):
    check_tasks_jsonl_round_trip(shared_file(MBPP_REL), tmp_path, box)


def test_mini_tasks_jsonl_written_by_eval_filter_round_trips(tmp_path, box):
    check_tasks_jsonl_round_trip(MINI_MBPP, tmp_path, box)


# ----------------------------------------------------------------------------- funcall
def check_funcall_tasks(glaive: Path, n_train_calls: int) -> list[T.Task]:
    raw = json.loads(glaive.read_text())
    tasks = T.load_tasks(f"funcall:{glaive}")
    assert len(tasks) == n_train_calls
    for t in tasks:
        _, line, turn = t.task_id.rsplit(":", 2)
        record = raw[int(line) - 1]
        assert conversation_split(record) == "train"
        assert t.kind == "funcall" and t.expected_call["name"] and isinstance(t.expected_call["arguments"], dict)
        assert t.tools and t.tools == t.prompt.tools
        assert t.prompt.messages[-1].role in ("user", "function_response")
        assert len(t.prompt.messages) == int(turn) and t.tests == () and t.reference is None
    with pytest.raises(ValueError, match="funcall task"):
        tasks[0].job("{}")
    with warns("evaluation reports on"):
        held = T.load_tasks(f"funcall:{glaive}", split="heldout")
    assert held and all(conversation_split(raw[int(t.task_id.rsplit(":", 2)[1]) - 1]) == "heldout" for t in held)
    assert len(T.load_tasks(f"funcall:{glaive}", limit=7)) == 7
    return tasks


def test_funcall_tasks_are_train_call_turns_with_tools():
    check_funcall_tasks(shared_file(GLAIVE_REL), 171)  # the call turns of the 238 train conversations of 300


def test_mini_funcall_tasks_are_train_call_turns_with_tools():
    # the 8 train conversations hold 7 call turns (one of them has no call)
    tasks = check_funcall_tasks(MINI_GLAIVE, 7)
    assert [t.task_id for t in tasks] == [f"glaive_mini.json:{line}:{turn}" for line, turn in
                                          [(1, 1), (3, 1), (5, 1), (6, 3), (8, 1), (9, 1), (12, 1)]]
    first = tasks[0]
    assert first.expected_call == {"name": "convert_temperature", "arguments": {"value": 30, "to_unit": "F"}}
    assert [m.content for m in first.prompt.messages] == ["What is 30 degrees Celsius in Fahrenheit?"]
    assert [tool["name"] for tool in first.tools] == ["convert_temperature"]
    with warns("evaluation reports on"):
        held = T.load_tasks(f"funcall:{MINI_GLAIVE}", split="heldout")
    assert [t.task_id.split(":", 1)[1] for t in held] == ["2:1", "4:1", "11:1", "11:5"]
    # the second call of a conversation sees the first call, its result and the answer before it
    assert [m.role for m in held[-1].prompt.messages] == ["user", "assistant", "function_response", "assistant", "user"]
    assert held[-1].expected_call == {"name": "stock_quote", "arguments": {"symbol": "BOOK"}}


# ----------------------------------------------------------------------------- doctests
GOOD = '''import re
from typing import List
import json


def words(text: str) -> List[str]:
    """Split text into lower-case words.

    >>> words("Hello, World!")
    ['hello', 'world']
    >>> words("")
    []
    """
    return [w.lower() for w in re.findall(r"[A-Za-z]+", text)]


def safe_div(a, b):
    """Divide a by b, as floats.

    >>> safe_div(6, 3)
    2.0
    >>> safe_div(1, 0)
    Traceback (most recent call last):
      ...
    ZeroDivisionError: division by zero
    >>> print(safe_div(1, 4))
    0.25
    >>> x = safe_div(9, 3)
    >>> x
    3.0
    """
    return a / b
'''
BAD = '''def add(a, b):
    """Add two numbers (its doctest is wrong).

    >>> add(2, 2)
    5
    """
    return a + b


def undocumented(a):
    return a
'''


def test_doctest_examples_become_asserts():
    doc = ('>>> f(1)\n3\n>>> f(2)  # doctest: +NORMALIZE_WHITESPACE\n'
           'Point(x=1,   y=2)\n>>> y = 4\n>>> f(y)\n>>> g(3)\n9\n>>> f(0)  # doctest: +SKIP\n1\n'
           '>>> f(-1)\nTraceback (most recent call last):\nValueError: negative\n')
    assert D.doctest_tests(doc, "f") == (
        "assert (f(1)) == (3)",
        "import contextlib as _contextlib, io as _io\n"
        "with _contextlib.redirect_stdout(_io.StringIO()) as _out:\n"
        "    _v = (f(2)  # doctest: +NORMALIZE_WHITESPACE\n    )\n    if _v is not None:\n        print(repr(_v))\n"
        "assert ' '.join(_out.getvalue().split()) == 'Point(x=1, y=2)', ' '.join(_out.getvalue().split())",
        "y = 4\nassert (f(y)) is None",
        # g(3) does not mention f: it runs as set-up of the next test
        "assert (g(3)) == (9)\ntry:\n    f(-1)\nexcept BaseException as _e:\n"
        "    assert type(_e).__name__ == 'ValueError', repr(_e)\n"
        "else:\n    raise AssertionError('no ValueError raised')",
    )


def check_doctest_mining(mbpp: Path, tmp_path: Path, box) -> None:
    he = json.loads(gzip.open(HUMANEVAL_FILE, "rt").readline())  # HumanEval/0 has doctests in its prompt
    (tmp_path / "good.py").write_text(GOOD)
    (tmp_path / "bad.py").write_text(BAD)
    (tmp_path / "leak.py").write_text(he["prompt"] + he["canonical_solution"])
    (tmp_path / "broken.py").write_text("def f(:\n    '''>>> f()'''\n")
    counts = D.DoctestCounts()
    tasks = D.mine_doctest_tasks([tmp_path], mbpp_file=mbpp, box=box, counts=counts)
    assert [t.task_id for t in tasks] == ["doctest/good.py::words", "doctest/good.py::safe_div"]
    assert counts.as_dict() == {"files": 4, "files_with_doctests": 3, "unparsable_files": 1, "functions": 4,
                                "candidates": 3, "kept": 2, "skipped": {"contaminated": 1},
                                "reference_failures": {"failed": 1}}
    words, div = tasks
    assert words.prompt.messages[0].content.startswith(
        "Write a Python function `words(text: str)` that: Split text into lower-case words.")  # as SFT's mined pairs
    assert ">>> words(\"\")" in words.prompt.messages[0].content  # the examples stay in the prompt
    assert words.problem.header == "import re\nfrom typing import List\n\n\n"  # not json: unused
    assert words.tests == ("assert (words(\"Hello, World!\")) == (['hello', 'world'])", "assert (words(\"\")) == ([])")
    assert len(div.tests) == 4 and div.source == f"{tmp_path / 'good.py'}:17"
    # the answer needs no imports of its own: the header comes first; a wrong answer fails
    answer = fenced('def words(text: str) -> List[str]:\n    return re.findall("[a-z]+", text.lower())')
    wrong = fenced("def words(text):\n    return text.split()")
    ok, ko, empty = box.run_many([words.job(answer), words.job(wrong), words.job("I cannot do that.")])
    assert ok.passed and not ko.passed and empty.status == "syntax"


def test_doctest_mining_keeps_passing_drops_failing_and_contaminated(tmp_path, box):
    check_doctest_mining(shared_file(MBPP_REL), tmp_path, box)


# A vendored copy of the mini MBPP's test problem 13 (its text as the docstring, its asserts as doctests).
MBPP_LEAK = '''def merge_sorted(a, b):
    """Write a function to merge two already sorted lists into a single sorted list.

    >>> merge_sorted([1, 4, 9], [2, 3, 10])
    [1, 2, 3, 4, 9, 10]
    >>> merge_sorted([], [5, 6])
    [5, 6]
    """
    return sorted(a + b)
'''


def test_mini_doctest_mining_keeps_passing_drops_failing_and_contaminated(tmp_path, box):
    (tmp_path / "a").mkdir()
    check_doctest_mining(MINI_MBPP, tmp_path / "a", box)
    # an MBPP test problem is contaminated only when the MBPP file is given
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "leak.py").write_text(MBPP_LEAK)
    counts = D.DoctestCounts()
    assert D.mine_doctest_tasks([tmp_path / "b"], mbpp_file=MINI_MBPP, box=box, counts=counts) == []
    assert counts.as_dict() == {"files": 1, "files_with_doctests": 1, "unparsable_files": 0, "functions": 1,
                                "candidates": 0, "kept": 0, "skipped": {"contaminated": 1}, "reference_failures": {}}
    with warns("HumanEval only"):
        kept = D.mine_doctest_tasks([tmp_path / "b"], box=box)
    assert [t.task_id for t in kept] == ["doctest/leak.py::merge_sorted"]


def check_doctest_spec_on_the_standard_library(mbpp: Path, box, limit: int = 4, max_files: int = 0) -> None:
    tasks = T.load_tasks("doctest", limit=limit, max_files=max_files, mbpp_file=mbpp, box=box)
    assert len(tasks) == limit and len({t.task_id for t in tasks}) == limit
    assert all(t.kind == "code" and t.task_id.startswith("doctest/") and t.tests and t.reference for t in tasks)
    assert T.failing_references(tasks, box=box) == []


def test_doctest_spec_on_the_standard_library(box):
    check_doctest_spec_on_the_standard_library(shared_file(MBPP_REL), box)


def test_mini_doctest_spec_on_the_standard_library(box):
    check_doctest_spec_on_the_standard_library(MINI_MBPP, box, limit=2, max_files=100)  # the first files: fast


def test_doctest_mining_warns_without_mbpp(tmp_path, box):
    (tmp_path / "good.py").write_text(GOOD)
    with warns("HumanEval only"):
        assert len(T.load_tasks(f"doctest:{tmp_path}", box=box)) == 2


def test_a_pool_mines_doctests_with_its_own_check_silently_and_its_report_names_the_benchmarks(tmp_path, box):
    """``codechat rl`` and the speedrun's RL stage read doctest tasks through a pool: the miner uses the
    pool's check, so nothing is printed, and the pool's report (and the speedrun's report row) says what
    was checked: HumanEval's problems, and MBPP's test problems only with its file."""
    from codechat.speedrun.report import _rl_section
    from codechat.train.task_pool import load_pool
    (tmp_path / "good.py").write_text(GOOD)
    (tmp_path / "leak.py").write_text(MBPP_LEAK)
    with captured() as (records, caught):
        tasks, report = load_pool(f"doctest:{tmp_path}", box=box)
    assert records == [] and not [w for w in caught if re.search("HumanEval|MBPP", str(w.message))]
    assert report["checked"] == {"HumanEval": 164} and report["tasks"] == len(tasks) == 3  # the leak kept
    section = "\n".join(_rl_section({"rl": {"pool": report, "skipped": True, "reason": "-"},
                                     "stages": {"rl": {"status": "skipped"}}}))
    row = next(line for line in section.splitlines() if line.startswith("| task pool |"))
    assert "; checked against HumanEval (164 problems): 0 left out as overlapping" in row
    with captured() as (records, caught):
        tasks, report = load_pool(f"doctest:{tmp_path}", mbpp_file=str(MINI_MBPP), box=box)
    assert records == [] and not [w for w in caught if re.search("HumanEval|MBPP", str(w.message))]
    assert report["checked"] == {"HumanEval": 164, "MBPP": 5}  # the mini file's test problems: 11-14, 510
    assert sorted(t.task_id for t in tasks) == ["doctest/good.py::safe_div", "doctest/good.py::words"]


# ----------------------------------------------------------------------------- bad input
def write_rows(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


ROW = {"task_id": 7, "suite": "task", "split": "train", "prompt": "Write f.", "tests": ["assert f() == 1"],
       "test_setup_code": "", "entry_point": "f"}


@pytest.mark.parametrize("spec,match", [
    ("gsm8k:x.jsonl", "unknown task spec"),
    ("mbpp", "needs a file"),
    ("tasks:/nonexistent/tasks.jsonl", "does not exist"),
])
def test_bad_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        T.load_tasks(spec)


def check_bad_split_and_limit(mbpp: Path, glaive: Path) -> None:
    with pytest.raises(ValueError, match="unknown MBPP split 'dev'"):
        T.load_tasks(f"mbpp:{mbpp}", split="dev")
    with pytest.raises(ValueError, match="only a test split"):
        T.load_tasks("humaneval", split="train")
    with pytest.raises(ValueError, match="funcall split|split must be one of"):
        T.load_tasks(f"funcall:{glaive}", split="test")
    with pytest.raises(ValueError, match="no splits"):
        T.load_tasks("doctest", split="train")
    with pytest.raises(ValueError, match="limit must be >= 1"):
        T.load_tasks(f"mbpp:{mbpp}", limit=0)


def test_bad_split_and_limit():
    check_bad_split_and_limit(shared_file(MBPP_REL), shared_file(GLAIVE_REL))


def test_mini_bad_split_and_limit():
    check_bad_split_and_limit(MINI_MBPP, MINI_GLAIVE)


def test_task_rows_without_tests_or_bad_json_name_file_and_line(tmp_path):
    path = write_rows(tmp_path / "t.jsonl", [ROW, {**ROW, "task_id": 8, "tests": []}])
    with pytest.raises(ValueError, match=rf"{path}:2: task 8 has no tests"):
        T.load_tasks(f"tasks:{path}")
    path = write_rows(tmp_path / "t.jsonl", [ROW, "", "{not json"])
    with pytest.raises(ValueError, match=rf"{path}:3: not JSON"):
        T.load_tasks(f"tasks:{path}")
    path = write_rows(tmp_path / "t.jsonl", [ROW, ROW])
    with pytest.raises(ValueError, match=rf"{path}:2: task '7' already read at line 1"):
        T.load_tasks(f"tasks:{path}")
    path = write_rows(tmp_path / "t.jsonl", [{k: v for k, v in ROW.items() if k != "prompt"}])
    with pytest.raises(ValueError, match=rf"{path}:1: task 7 has no prompt"):
        T.load_tasks(f"tasks:{path}")


def check_failing_references(mbpp_file: Path, tmp_path: Path, box) -> None:
    good = {**ROW, "reference": "def f():\n    return 1"}
    bad = {**ROW, "task_id": 9, "reference": "def f():\n    return 2"}
    path = write_rows(tmp_path / "t.jsonl", [good, bad])
    assert len(T.load_tasks(f"tasks:{path}")) == 2  # not checked unless asked
    with pytest.raises(ValueError, match=r"references of 1 tasks fail .*9 \(.*t.jsonl:2\): failed"):
        T.load_tasks(f"tasks:{path}", check_references=True, box=box)
    rows = [json.loads(line) for line in mbpp_file.read_text().splitlines() if line.strip()]
    broken = next(r for r in rows if r["task_id"] == 601)
    broken["code"] = "def max_chain_length(arr, n):\n    return -1\n"  # not even the function the tests call
    mbpp = write_rows(tmp_path / "mbpp.jsonl", [broken] + [r for r in rows if r["task_id"] in (602, 603)])
    with pytest.raises(ValueError, match=r"references of 1 tasks fail .*MBPP/601"):
        T.load_tasks(f"mbpp:{mbpp}", check_references=True, box=box)
    nothing = write_rows(tmp_path / "n.jsonl", [ROW])
    with warns("nothing was checked"):
        T.load_tasks(f"tasks:{nothing}", check_references=True, box=box)


def test_failing_references_raise_naming_the_task_ids(tmp_path, box):
    check_failing_references(shared_file(MBPP_REL), tmp_path, box)


def test_mini_failing_references_raise_naming_the_task_ids(tmp_path, box):
    check_failing_references(MINI_MBPP, tmp_path, box)
    # a reference that defines the right function but returns a wrong value is caught too
    rows = [json.loads(line) for line in MINI_MBPP.read_text().splitlines()]
    wrong = {**next(r for r in rows if r["task_id"] == 602), "code": "def rotate_right(items, k):\n    return items\n"}
    mbpp = write_rows(tmp_path / "wrong.jsonl", [r for r in rows if r["task_id"] == 601] + [wrong])
    with pytest.raises(ValueError, match=r"references of 1 tasks fail .*MBPP/602 \(.*wrong.jsonl\): failed"):
        T.load_tasks(f"mbpp:{mbpp}", check_references=True, box=box)


def check_empty_results_are_errors(mbpp: Path, tmp_path: Path, box) -> None:
    path = write_rows(tmp_path / "t.jsonl", [ROW])
    with pytest.raises(ValueError, match=r"split 'test'\): no task"):
        T.load_tasks(f"tasks:{path}", split="test")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "bad.py").write_text(BAD)
    with pytest.raises(ValueError, match=r"no doctest task survived: .*\"reference_failures\": \{\"failed\": 1\}"):
        T.load_tasks(f"doctest:{tmp_path / 'src'}", mbpp_file=mbpp, box=box)
    empty = tmp_path / "empty.json"
    chat = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]
    empty.write_text(json.dumps([{"conversations": chat, "tools": "[]"}] * 3))
    with pytest.raises(ValueError, match="no task"):
        T.load_tasks(f"funcall:{empty}", split="all")


@pytest.mark.filterwarnings("ignore:RL on funcall")
def test_empty_results_are_errors(tmp_path, box):
    check_empty_results_are_errors(shared_file(MBPP_REL), tmp_path, box)


@pytest.mark.filterwarnings("ignore:RL on funcall")
def test_mini_empty_results_are_errors(tmp_path, box):
    check_empty_results_are_errors(MINI_MBPP, tmp_path, box)


@pytest.mark.filterwarnings("ignore:RL on funcall")
def test_call_without_tools_and_bad_records_name_file_and_line(tmp_path):
    call = {"messages": [{"role": "user", "content": "weather?"},
                         {"role": "assistant", "content": None,
                          "tool_calls": [{"function": {"name": "weather", "arguments": "{}"}}]}]}
    path = tmp_path / "calls.jsonl"
    write_rows(path, [call])
    with pytest.raises(ValueError, match=rf"{path}:1: turn 1 calls 'weather' but the conversation declares no tools"):
        T.load_tasks(f"funcall:{path}", split="all")
    write_rows(path, ["{oops"])
    with pytest.raises(ValueError, match=rf"{path}:1"):
        T.load_tasks(f"funcall:{path}", split="all")


def test_task_validation(box):
    prompt = Conversation((Message("user", "Write f."),))
    with pytest.raises(ValueError, match="needs tests"):
        T.Task("x", "code", prompt)
    with pytest.raises(ValueError, match="kind must be"):
        T.Task("x", "math", prompt, tests=("assert 1",))
    with pytest.raises(ValueError, match="ends with an assistant turn"):
        T.Task("x", "code", Conversation((Message("user", "q"), Message("assistant", "a"))), tests=("assert 1",))
    with pytest.raises(ValueError, match="needs the tools"):
        T.Task("x", "funcall", prompt, expected_call={"name": "f", "arguments": {}})
    t = T.Task("x", "code", prompt, tests=["assert f() == 1"], entry_point="f", reference="def f():\n    return 1")
    assert t.tests == ("assert f() == 1",) and t.problem.suite == "task"
    assert t.program(t.code(fenced("def f():\n    return 1"))) == "def f():\n    return 1\n"
    assert T.failing_references([t], box=box) == []


def test_written_doctest_tasks_read_back_as_the_same_tasks_and_the_speedrun_pools_them(tmp_path, box):
    """write_doctest_tasks (the speedrun's background job) -> ``tasks:FILE``: the same ids, prompts, tests,
    header and reference; the speedrun's RL pool takes the file in place of ``doctest`` when it holds tasks."""
    from concurrent.futures import Future
    from dataclasses import replace

    import torch

    from codechat.speedrun.plan import plan, with_plan_overrides
    from codechat.speedrun.run import Speedrun
    src = tmp_path / "src"
    src.mkdir()
    (src / "leak.py").write_text(MBPP_LEAK)
    (src / "words.py").write_text('import re\nfrom typing import List\n\n\ndef words(text: str) -> List[str]:\n'
                                  '    """The lower-case words of text.\n\n    >>> words("Hi, you")\n'
                                  '    [\'hi\', \'you\']\n    """\n    return re.findall("[a-z]+", text.lower())\n')
    out = tmp_path / "run" / "rl_doctests.jsonl"
    counts = D.write_doctest_tasks([src], out, mbpp_file=MINI_MBPP, box=box)
    assert (counts["kept"], counts["skipped"]) == (1, {"contaminated": 1})
    mined = D.mine_doctest_tasks([src], mbpp_file=MINI_MBPP, box=box)
    back = T.load_tasks(f"tasks:{out}", check_references=True, box=box)
    assert [(t.task_id, t.prompt, t.tests, t.reference, t.problem.header) for t in back] == \
        [(t.task_id, t.prompt, t.tests, t.reference, t.problem.header) for t in mined]
    assert back[0].task_id == "doctest/words.py::words" and "from typing import List" in back[0].problem.header
    p = replace(plan(torch.device("cpu"), "tiny", 2.0), rl_tasks="mbpp:m.jsonl+doctest")
    s = Speedrun(p, tmp_path / "run", torch.device("cpu"), "cpu", 0, resume=False)
    job = Future()
    job.set_result({"doctest": counts, "io": {"kept": 0, "candidates": 0, "functions": 2}, "kept": counts["kept"]})
    s._doctests = job
    assert s._rl_pool_spec() == f"mbpp:m.jsonl+tasks:{out}" and s._doctests is None
    out.write_text("")  # the background job found nothing: the stage mines the standard library itself
    assert s._rl_pool_spec() == "mbpp:m.jsonl+doctest"
    s.p = with_plan_overrides(plan(torch.device("cpu"), "tiny", 2.0, mbpp=str(MINI_MBPP)), {"rl_pool_mbpp": "false"})
    assert s.p.rl_tasks == f"mbpp:{MINI_MBPP}+doctest" and s._rl_pool_spec() == "doctest"  # the mined tasks alone
