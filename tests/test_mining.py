"""Offline (docstring -> function) SFT pairs (codechat.data.mining) and decontamination against HumanEval and MBPP
(codechat.data.decontam).

MBPP, Code Alpaca and the glaive sample come from ``shared/`` (those tests skip, saying what is missing,
when it is absent); the same decontamination rules are pinned on the project's own small files in
``tests/fixtures/cases_a/``: ``mbpp_mini.jsonl`` (MBPP-shaped, 5 test problems, one train problem a
near-copy of test problem 13), ``alpaca_mini.json`` and ``glaive_mini.json``."""
from __future__ import annotations

import ast
import json
import logging
from pathlib import Path

import pytest

from codechat.chat.conversation import Conversation, Message
from codechat.config.sft import SFTConfig
from codechat.config.stages import default_corpus_dirs
from codechat.data import decontam
from codechat.data.formats import HUMANEVAL_PROMPT, load_records
from codechat.data.decontam import BenchmarkProblem, Decontaminator, humaneval_problems, mbpp_problems, normalized_tokens
from codechat.data.mining import MiningCounts, mine_records
from codechat.data.benchmarks import mbpp_split
from codechat.data.mixture import Mixture

from conftest import FIXTURES

MINE_SRC = FIXTURES / "mine_src"
MINI_MBPP = FIXTURES / "cases_a" / "mbpp_mini.jsonl"
MINI_ALPACA = FIXTURES / "cases_a" / "alpaca_mini.json"
MINI_GLAIVE = FIXTURES / "cases_a" / "glaive_mini.json"


@pytest.fixture(scope="module")
def benchmarks(shared_dir: Path) -> list[BenchmarkProblem]:
    return humaneval_problems() + mbpp_problems(shared_dir / "data/mbpp/mbpp.jsonl")


def test_mined_pairs_are_docstring_instructions_answered_by_the_function(tmp_path):
    counts = MiningCounts()
    records = list(mine_records([MINE_SRC], counts=counts))
    by_name = {r.conversation.messages[0].content.split("`")[1]: r for r in records}
    assert sorted(by_name) == ["circle_area(radius: float)", "clamp(x, lo=0, hi=1)", "fetch_twice(get, url)"]
    user, assistant = by_name["clamp(x, lo=0, hi=1)"].conversation.messages
    assert user.content == ("Write a Python function `clamp(x, lo=0, hi=1)` that: Clamp x into the closed interval "
                            "[lo, hi].\n\nValues below lo become lo and values above hi become hi.")
    assert assistant.content == "def clamp(x, lo=0, hi=1):\n    return max(lo, min(hi, x))"  # docstring removed
    area = by_name["circle_area(radius: float)"]
    assert area.conversation.messages[1].content == ("def circle_area(radius: float) -> float:\n    # pi r squared\n"
                                                     "    return math.pi * radius ** 2")
    assert Path(area.source).name == "shapes.py" and area.line == 5 and area.format == "mined"
    assert counts.as_dict() == {"files": 3, "unparsable_files": 1, "functions": 9, "kept": 3,
                                "skipped": {"duplicate": 1, "no_docstring": 1, "docstring_length": 1,
                                            "trivial_body": 1, "decorated_or_dunder": 2}}


def test_complete_style_asks_the_way_humaneval_does_and_both_gives_each_function_twice():
    head = 'def clamp(x, lo=0, hi=1):\n    """Clamp x into the closed interval [lo, hi].\n\n    Values below lo become lo ' \
           'and values above hi become hi.\n    """\n'
    complete = [r for r in mine_records([MINE_SRC], style="complete") if "clamp" in r.conversation.messages[0].content]
    assert len(complete) == 1  # the copy in more.py is a duplicate in this style too
    user, assistant = complete[0].conversation.messages
    assert user.content == HUMANEVAL_PROMPT.format(prompt=head)  # exactly the eval's chat prompt for HumanEval
    assert assistant.content == "    return max(lo, min(hi, x))"  # the rest of the function, as indented
    counts = MiningCounts()
    both = list(mine_records([MINE_SRC], style="both", counts=counts))
    assert len(both) == counts.kept == 6 and counts.skipped["duplicate"] == 1
    assert both[0].conversation.messages[0].content.startswith("Write a Python function `")
    assert both[1].conversation.messages[0].content.startswith("Complete the following Python function:")
    assert both[0].line == both[1].line and both[0].source == both[1].source
    assert len(list(mine_records([MINE_SRC], style="both", max_examples=3))) == 3
    with pytest.raises(ValueError, match="docstring, complete, both"):
        next(mine_records([MINE_SRC], style="humaneval"))


def test_mining_in_worker_processes_gives_the_same_records_in_the_same_order():
    one, two = MiningCounts(), MiningCounts()
    a = list(mine_records(default_corpus_dirs(), max_files=80, style="both", counts=one))
    b = list(mine_records(default_corpus_dirs(), max_files=80, style="both", counts=two, workers=2))
    assert len(a) > 40 and [(r.source, r.line, r.conversation) for r in a] == \
        [(r.source, r.line, r.conversation) for r in b]
    assert one.as_dict() == two.as_dict()
    assert len(list(mine_records(default_corpus_dirs(), max_files=80, max_examples=7, workers=2))) == 7
    with pytest.raises(ValueError, match="workers must be >= 0"):
        next(mine_records(default_corpus_dirs(), workers=-1))


def test_mining_the_standard_library_gives_valid_functions():
    records = list(mine_records(default_corpus_dirs(), max_files=60, max_examples=40))
    assert len(records) == 40
    for r in records:
        user, assistant = r.conversation.messages
        assert user.content.startswith("Write a Python function `")
        tree = ast.parse(assistant.content)
        [fn] = tree.body
        assert isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(fn) is None
        assert fn.body


def test_mine_is_a_mixture_source(tok):
    m = Mixture.from_spec(f"mine:{MINE_SRC}:1", SFTConfig(seed=0))
    assert m.epoch_size == 3 and {r.format for r in m.iter_epoch()} == {"mined"}
    cfg = SFTConfig(mine_src=(str(MINE_SRC),), decontaminate=False)
    assert Mixture.from_config(cfg).epoch_size == 3  # no --data: mined pairs


def test_humaneval_and_mbpp_test_problems_are_all_excluded(benchmarks, shared_dir):
    dec = Decontaminator(benchmarks)
    assert dec.benchmarks == {"HumanEval": 164, "MBPP": 500}
    humaneval = load_records(decontam.humaneval_file())
    assert sum(not dec.keep(r) for r in humaneval) == 164
    records = load_records(shared_dir / "data/mbpp/mbpp.jsonl")
    excluded = {r.line for r in records if not dec.keep(r)}
    assert {r.line for r in records if mbpp_split(r.line) == "test"} <= excluded  # line == task_id in mbpp.jsonl
    train = [r for r in records if mbpp_split(r.line) == "train"]
    flagged = [r.line for r in train if r.line in excluded]
    assert len(flagged) < 0.15 * len(train)  # only MBPP's own near-duplicates of test problems
    assert dec.report()["by_benchmark"]["HumanEval"] == 164 and dec.report()["checked"] == 164 + 974
    assert dec.report()["examples"][0]["problem"] == "HumanEval/0"


def test_ordinary_sft_data_is_kept(benchmarks, shared_dir):
    dec = Decontaminator(benchmarks)
    mined = list(mine_records(default_corpus_dirs(), max_files=60))
    assert all(dec.keep(r) for r in mined)
    alpaca = load_records(shared_dir / "data/code_alpaca/code_alpaca_2k.json")
    excluded = [r for r in alpaca if not dec.keep(r)]
    assert 0 < len(excluded) < 20  # a handful of genuine copies (e.g. the same gcd as HumanEval/13)
    assert all(dec.keep(r) for r in load_records(shared_dir / "data/function_calling_glaive"))


@pytest.fixture(scope="module")
def mini_benchmarks() -> list[BenchmarkProblem]:
    return humaneval_problems() + mbpp_problems(MINI_MBPP)


def test_mini_humaneval_and_mbpp_test_problems_are_all_excluded(mini_benchmarks):
    dec = Decontaminator(mini_benchmarks)
    assert dec.benchmarks == {"HumanEval": 164, "MBPP": 5}  # MBPP: the test split (11-510) only
    humaneval = load_records(decontam.humaneval_file())
    assert sum(not dec.keep(r) for r in humaneval) == 164
    records = load_records(MINI_MBPP)
    excluded = {int(r.task_id) for r in records if not dec.keep(r)}
    # every test and validation task (by task id), and the train task that copies test problem 13's text
    assert excluded == {11, 12, 13, 14, 510, 511, 600, 603}
    assert {int(r.task_id) for r in records if mbpp_split(int(r.task_id)) == "train"} - excluded == {601, 602, 974}
    report = dec.report()
    assert report["by_benchmark"] == {"HumanEval": 164, "MBPP": 8} and report["checked"] == 164 + 16
    assert report["by_rule"] == {"ngram": 165, "task_id": 7}
    assert report["examples"][0]["problem"] == "HumanEval/0"


def test_mini_a_near_copy_of_a_test_problem_is_excluded_by_the_overlap_rule(mini_benchmarks):
    dec = Decontaminator(mini_benchmarks)
    by_id = {int(r.task_id): r for r in load_records(MINI_MBPP)}
    hit = dec.overlap(by_id[603].conversation)  # its text is test problem 13's, plus "of numbers"
    assert (hit.problem, hit.part) == ("MBPP/13", "prompt") and hit.fraction == pytest.approx(5 / 6)
    assert dec.overlap(by_id[601].conversation) is None and dec.overlap(by_id[602].conversation) is None


def test_mini_ordinary_sft_data_is_kept(mini_benchmarks, tmp_path):
    dec = Decontaminator(mini_benchmarks)
    assert all(dec.keep(r) for r in mine_records([MINE_SRC]))
    # a genuine copy of HumanEval/13 among ordinary Code Alpaca-style rows (one of them a different gcd)
    he13 = next(p for p in mini_benchmarks if p.id == "HumanEval/13")
    rows = json.loads(MINI_ALPACA.read_text())
    rows.insert(3, {"instruction": "Return the greatest common divisor of two integers a and b.", "input": "",
                    "output": he13.prompt.strip() + "\n" + he13.solution})
    (tmp_path / "alpaca.json").write_text(json.dumps(rows))
    alpaca = load_records(tmp_path / "alpaca.json")
    assert [r.line for r in alpaca if not dec.keep(r)] == [4]
    assert dec.examples[-1]["problem"] == "HumanEval/13"
    glaive = load_records(MINI_GLAIVE)
    assert len(glaive) == 12 and all(dec.keep(r) for r in glaive)


def test_overlap_rule_normalises_case_and_whitespace_and_uses_the_threshold():
    problem = BenchmarkProblem("X/1", "Return the sum of the squares of the odd numbers in the list xs, ignoring "
                                      "negative values and zero.", "def f(xs):\n    return sum(x * x for x in xs if "
                                                                   "x > 0 and x % 2)")
    dec = Decontaminator([problem], ngram=5, threshold=0.5)
    reformatted = "please:  RETURN the SUM of the squares\nof the odd numbers in the list xs, ignoring negative"
    hit = dec.overlap(Conversation((Message("user", reformatted), Message("assistant", "ok"))))
    assert hit is not None and hit.problem == "X/1" and hit.part == "prompt" and hit.fraction >= 0.5
    assert dec.overlap("the sum of the squares of the odd numbers") is None  # under half of the n-grams
    assert dec.overlap("def g(ys):\n    return sum(x*x for x in xs if x>0 and x%2)").part == "solution"
    assert normalized_tokens("A_b(1,  2)") == ["a_b", "(", "1", ",", "2", ")"]


def check_from_config_warns(monkeypatch, caplog, mbpp: Path, n_test: int) -> None:
    monkeypatch.setattr(decontam, "humaneval_file", lambda: None)
    caplog.set_level(logging.WARNING, logger="codechat")  # log records (one line each), not Python warnings
    dec = Decontaminator.from_config(SFTConfig(decontam_mbpp=str(mbpp)))
    assert [r.message for r in caplog.records if "shipped with codechat is missing" in r.message]
    assert dec.benchmarks == {"MBPP": n_test}
    caplog.clear()
    Decontaminator.from_config(SFTConfig())
    assert any("does not check MBPP" in r.message for r in caplog.records)


def test_decontaminator_from_config_warns_when_a_benchmark_is_missing(monkeypatch, shared_dir, caplog):
    check_from_config_warns(monkeypatch, caplog, shared_dir / "data/mbpp/mbpp.jsonl", 500)


def test_mini_decontaminator_from_config_warns_when_a_benchmark_is_missing(monkeypatch, caplog):
    check_from_config_warns(monkeypatch, caplog, MINI_MBPP, 5)
