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


# ----------------------------------------------------------------------------- function calls
FC = "<|function_call|>"
WEATHER = {"name": "weather", "description": "Forecast for a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                          "required": ["city"]}}
CONVERT = {"name": "convert_currency", "parameters": {"type": "object", "properties": {
    "amount": {"type": "number"}, "to": {"type": "string"}}, "required": ["amount", "to"]}}


@pytest.fixture(scope="module")
def fc_tools():
    from codechat.tools import tool_from_schema
    return {s["name"]: tool_from_schema(s, "test") for s in (WEATHER, CONVERT)}


EXPECTED_CALL = {"name": "weather", "arguments": {"city": "Tokyo", "days": 2}}
EXACT_REPLY = f'{FC}{{"name": "weather", "arguments": {{"city": "Tokyo", "days": 2}}}}<|end|>'

# (name, reply text, expected funcall_tiered reward): one or more per rung of the ladder
FUNCALL_LADDER = [
    ("text-only", "It is sunny in Tokyo.", 0.0),
    ("bare-json-is-not-a-call", '{"name": "weather", "arguments": {"city": "Tokyo", "days": 2}}', 0.0),
    ("marker-then-prose", f"{FC} let me look that up", 0.1),  # no_json
    ("cut-at-max-new-tokens", f'{FC}{{"name": "weather", "arguments": {{"city": "Tok', 0.1),  # bad_json
    ("no-name", f'{FC}{{"arguments": {{"city": "Tokyo"}}}}', 0.1),
    ("arguments-a-list", f'{FC}{{"name": "weather", "arguments": ["Tokyo"]}}', 0.1),
    ("undeclared-function", f'{FC}{{"name": "forecast", "arguments": {{"city": "Tokyo", "days": 2}}}}', 0.25),
    ("declared-wrong-function", f'{FC}{{"name": "convert_currency", "arguments": {{"amount": 2, "to": "JPY"}}}}',
     0.4),
    ("wrong-function-invalid-arguments", f'{FC}{{"name": "convert_currency", "arguments": {{"city": "Tokyo"}}}}',
     0.4),
    ("right-function-wrong-type", f'{FC}{{"name": "weather", "arguments": {{"city": "Tokyo", "days": "two"}}}}',
     0.6),
    ("right-function-missing-required", f'{FC}{{"name": "weather", "arguments": {{"days": 2}}}}', 0.6),
    # equal only after normalize_value's string -> number: schema-invalid, so not 1.0
    ("number-as-string", f'{FC}{{"name": "weather", "arguments": {{"city": "Tokyo", "days": "2"}}}}', 0.6),
    ("valid-but-different", f'{FC}{{"name": "weather", "arguments": {{"city": "Kyoto", "days": 2}}}}', 0.75),
    ("valid-missing-optional", f'{FC}{{"name": "weather", "arguments": {{"city": "Tokyo"}}}}', 0.75),
    ("exact", EXACT_REPLY, 1.0),
    ("exact-after-normalisation", f'Checking. {FC} {{"name": "weather", "arguments": {{"days": 2.0, '
                                  f'"city": " Tokyo "}}}}', 1.0),
    ("exact-glaive-spelling", "<functioncall> {\"name\": \"weather\", \"arguments\": "
                              "'{\"city\": \"Tokyo\", \"days\": 2}'} <|endoftext|>", 1.0),
    ("exact-then-text", f'{FC}{{"name": "weather", "arguments": {{"city": "Tokyo", "days": 2}}}} Anything else?',
     0.95),
    ("undeclared-then-text", f'{FC}{{"name": "forecast", "arguments": {{}}}} and more', 0.2),
]


@pytest.mark.parametrize("name,reply,expected", FUNCALL_LADDER, ids=[r[0] for r in FUNCALL_LADDER])
def test_funcall_tiered_ladder(fc_tools, name, reply, expected):
    assert rewards.funcall_tiered(reply, EXPECTED_CALL, fc_tools) == pytest.approx(expected, abs=1e-12)


def test_funcall_tiered_reads_the_expected_call_like_data_and_agrees_with_the_suite(fc_tools):
    from codechat.chat.calls import parse_assistant_text
    from codechat.chat.conversation import Message
    from codechat.eval.funcall import score_case
    as_string = {"name": "weather", "arguments": '{"city": "Tokyo", "days": 2}', "id": "call_1"}
    assert rewards.funcall_tiered(EXACT_REPLY, as_string, fc_tools) == 1.0
    params = {n: t.parameters for n, t in fc_tools.items()}
    want = Message("assistant", "", EXPECTED_CALL)
    for name, reply, expected in FUNCALL_LADDER:
        content, call = parse_assistant_text(reply)
        row = score_case(want, content, call, FC in reply or "<functioncall>" in reply, params)
        if expected >= 0.95:  # the top rung is exactly the suite's schema-valid exact match
            assert row["schema_valid"] and row["arguments_exact"], name
        else:
            assert not (row["schema_valid"] and row["arguments_exact"]), name


def test_funcall_tiered_text_turn_and_data_errors(fc_tools):
    assert rewards.funcall_tiered("It is sunny.", None, fc_tools) == 1.0
    assert rewards.funcall_tiered(EXACT_REPLY, None, fc_tools) == 0.0
    assert rewards.funcall_tiered(f"{FC} oops", None, fc_tools) == 0.0
    with pytest.raises(ValueError, match="not among the declared tools"):
        rewards.funcall_tiered("hi", {"name": "forecast", "arguments": {}}, fc_tools)
    with pytest.raises(ValueError):
        rewards.funcall_tiered("hi", {"arguments": {}}, fc_tools)


def test_funcall_ladder_must_increase_and_penalty_must_not_reorder():
    with pytest.raises(ValueError, match="increase"):
        rewards.FuncallLadder(wrong_function=0.7)
    with pytest.raises(ValueError, match="trailing_penalty"):
        rewards.FuncallLadder(trailing_penalty=0.15)
    assert rewards.FuncallLadder(trailing_penalty=0.0).trailing_penalty == 0.0
