"""Rewards: every rung of the tiered ladder, each from a real program run in the sandbox."""
from __future__ import annotations

import pytest

from codechat.eval import rewards, sandbox

TESTS = ["assert f(1) == 1", "assert f(2) == 2", "assert f(3) == 3", "assert f(4) == 4"]

# (name, program, expected tiered reward, expected status)
LADDER = [
    ("empty", "", 0.0, "syntax"),
    ("comments-only", "# TODO\n", 0.0, "syntax"),
    ("syntax-error", "def f(x:\n    return x\n", 0.0, "syntax"),
    ("definitions-raise", "def f(x):\n    return x\nraise RuntimeError('boom')\n", 0.05, "error"),
    ("definitions-exit-0", "import sys\ndef f(x):\n    return x\nsys.exit(0)\n", 0.05, "error"),
    ("definitions-timeout", "def f(x):\n    return x\nwhile True:\n    pass\n", 0.05, "timeout"),
    ("definitions-memory", "def f(x):\n    return x\nbuf = bytearray(64 * 1024**3)\n", 0.05,
     "memory"),
    ("none-pass", "def f(x):\n    return -x\n", 0.15, "failed"),
    ("none-pass-all-raise", "def f(x):\n    raise ValueError(x)\n", 0.15, "failed"),
    ("one-of-four", "def f(x):\n    return x if x <= 1 else 0\n", 0.15 + 0.85 / 4, "failed"),
    ("two-of-four", "def f(x):\n    return x if x <= 2 else 0\n", 0.15 + 0.85 * 2 / 4, "failed"),
    ("three-of-four", "def f(x):\n    return x if x <= 3 else 0\n", 0.15 + 0.85 * 3 / 4,
     "failed"),
    # a test that times out, and the tests it leaves unreached, count as failed
    ("two-then-timeout", "def f(x):\n    while x == 3:\n        pass\n    return x\n",
     0.15 + 0.85 * 2 / 4, "timeout"),
    # a crash inside a test ends the run: that test and the rest count as failed
    ("one-then-exit", "import os\ndef f(x):\n    if x == 2:\n        os._exit(0)\n    return x\n",
     0.15 + 0.85 / 4, "failed"),
    ("all-pass", "def f(x):\n    return x\n", 1.0, "passed"),
]


@pytest.fixture(scope="module")
def results():
    with sandbox.Sandbox(2) as box:
        out = box.run_many([sandbox.Job(p, TESTS, timeout_s=1.0, memory_mb=512)
                            for _, p, _, _ in LADDER], workers=2)
    return dict(zip([name for name, *_ in LADDER], out))


@pytest.mark.parametrize("name,program,expected,status", LADDER, ids=[r[0] for r in LADDER])
def test_tiered_ladder_from_real_programs(results, name, program, expected, status):
    r = results[name]
    assert r.status == status, r
    assert rewards.tiered(r) == pytest.approx(expected, abs=1e-12)


def test_binary_and_fractional(results):
    assert rewards.binary(results["all-pass"]) == 1.0
    assert rewards.binary(results["three-of-four"]) == 0.0
    assert rewards.fractional(results["three-of-four"]) == 0.75
    assert rewards.fractional(results["two-then-timeout"]) == 0.5
    assert rewards.fractional(results["syntax-error"]) == 0.0
    assert rewards.fractional(results["all-pass"]) == 1.0


def test_rewards_without_tests():
    ok = sandbox.run("x = 1\n")
    bad = sandbox.run("x = 1 / 0\n")
    assert [rewards.binary(ok), rewards.fractional(ok), rewards.tiered(ok)] == [1.0, 1.0, 1.0]
    assert [rewards.binary(bad), rewards.fractional(bad), rewards.tiered(bad)] == [0.0, 0.0, 0.05]


def test_score_runs_the_sandbox_and_checks_the_name():
    assert rewards.score("def f(x):\n    return x\n", TESTS[:2], "binary") == 1.0
    assert rewards.score("def f(x):\n    return 1\n", TESTS[:2], "fractional") == 0.5
    with pytest.raises(ValueError, match="unknown reward"):
        rewards.score("", [], "sparse")


def test_ladder_must_not_decrease():
    with pytest.raises(ValueError):
        rewards.TieredLadder(no_tests_run=0.5, none_pass=0.15)
