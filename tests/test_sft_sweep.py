"""benchmarks/sft_sweep.py chooses on MBPP's validation split: its eval commands name the split, its rows say
which split they scored, and a cached row scored on the other split is refused rather than reused."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from conftest import benchmark_module


@pytest.fixture()
def sweep():
    with benchmark_module("sft_sweep") as module:
        yield module


def _args(split: str) -> argparse.Namespace:
    return argparse.Namespace(budget_s=1.0, mbpp="mbpp.jsonl", mbpp_split=split, n=10, temperature=0.8,
                              max_new_tokens=16, limit=0, loss_only=False)


def _fake_codechat(calls: list[list[str]]):
    """Stands in for ``run_codechat``: records the arguments and writes what each command would."""
    def run(args: list[str], log: Path) -> None:
        calls.append(args)
        out = Path(args[args.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        if args[0] == "sft":
            (out / "metrics.jsonl").write_text(json.dumps({"step": 7, "eval_loss": 0.5}) + "\n")
        else:
            first = 511 if "mbpp" in args[args.index("--suite") + 1] else 0
            per_task = {str(first): {"c": 1}, str(first + 1): {"c": 0}}
            (out / "results.json").write_text(json.dumps({"pass@1": 0.05, "pass@k": {"pass@10": 0.5},
                                                          "problems": 2, "per_task": per_task}))
    return run


def test_mbpp_is_scored_on_validation_and_the_row_says_so(sweep, tmp_path, monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(sweep, "run_codechat", _fake_codechat(calls))
    row = sweep._variant(tmp_path, "w1", [], _args("validation"))
    evals = {c[c.index("--suite") + 1].split(":")[0]: c[c.index("--split") + 1] for c in calls if c[0] == "eval"}
    assert evals == {"humaneval": "test", "mbpp": "validation"}
    assert row["mbpp"]["split"] == "validation" and row["mbpp"]["solved"] == ["511"]
    assert row["humaneval"]["split"] == "test" and row["steps"] == 7
    assert json.loads((tmp_path / "sweep" / "w1" / "row.json").read_text()) == row


def test_a_cached_row_is_reused_on_its_split_and_refused_on_the_other(sweep, tmp_path, monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(sweep, "run_codechat", _fake_codechat(calls))
    sweep._variant(tmp_path, "w1", [], _args("test"))
    n = len(calls)
    assert sweep._variant(tmp_path, "w1", [], _args("test"))["mbpp"]["split"] == "test"
    assert len(calls) == n  # reused, nothing run again
    with pytest.raises(SystemExit, match="scored MBPP test, not validation: give the variant another name"):
        sweep._variant(tmp_path, "w1", [], _args("validation"))
    assert len(calls) == n
