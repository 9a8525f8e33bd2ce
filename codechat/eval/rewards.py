"""Rewards for RL: code, from a sandbox :class:`~codechat.eval.sandbox.ExecResult`; function calls, from the reply text.

Code (each a pure function of an ``ExecResult``):

- :func:`binary`: 1.0 when every test passes, else 0.0.
- :func:`fractional`: the fraction of tests passed, k/n.
- :func:`tiered`: the seed's ladder, which gives partial credit for getting further, so a weak
  policy (pass@1 of 1-5 %) still sees reward variance inside a GRPO group:

  ====================================================================  ================
  what happened                                                         reward
  ====================================================================  ================
  empty program or syntax error                                         0.00
  the definitions raise, time out or run out of memory before any test  0.05
  tests run but none passes                                             0.15
  k of n tests pass, 0 < k < n                                          0.15 + 0.85 k/n
  all tests pass                                                        1.00
  ====================================================================  ================

  A test that raises, fails or runs out of time counts as failed, and so does a test never
  reached (the run stopped earlier).

:func:`score` runs a program in the sandbox and returns one of these rewards.

Function calls: :func:`funcall_tiered` scores a reply to a turn that should call
``expected_call``, reading it with the project's one parser (:func:`codechat.chat.calls.parse_reply`)
and checking it as the funcall suite does (:func:`codechat.eval.funcall.score_case`): schema
validity by :func:`codechat.tools.validate_arguments`, equality by
:func:`codechat.eval.funcall.normalize_value`. Each rung is one more thing right, in the order a
call is judged (:class:`FuncallLadder` holds the values):

  ==================================================================================  ======
  the reply                                                                           reward
  ==================================================================================  ======
  answers in text: no call marker (``<|function_call|>``, ``<functioncall>``)         0.00
  a marker, but what follows is not a call (any :class:`~codechat.chat.calls.ParseError`)  0.10
  a call of a function that is not declared (a hallucinated tool)                     0.25
  a call of a declared function, but not the expected one                             0.40
  the expected function, arguments invalid against its schema                         0.60
  the expected function, schema-valid arguments that differ from the reference        0.75
  the expected function, schema-valid, arguments equal after normalisation            1.00
  ==================================================================================  ======

  and text after the call (``Reply.trailing``: the turn should end at the call) costs 0.05, less
  than any gap between rungs, so it never reorders them (an exact call with text after it gets
  0.95; a parse failure has no "after" and stays 0.10).

Why this order: choosing the function is the decision that matters most, so a call of the right
function with broken arguments (0.60) outranks a well-formed call of the wrong one (0.40; the
validity of arguments for a function not due is not rewarded, as teaching nothing useful); a
declared wrong function outranks an invented one. 1.0 needs schema-valid arguments: a value equal
only after :func:`~codechat.eval.funcall.normalize_value`'s string-to-number conversion (``"2"``
where the schema says integer) is invalid, the dispatcher would reject it, and it gets 0.60 (the
funcall suite counts it under ``arguments_exact`` but not ``schema_valid``). Parse failures are
one rung whatever their :data:`~codechat.chat.calls.PARSE_ERROR_REASONS` (``no_json``, ``bad_json``
as from a call cut at ``max_new_tokens``, ``no_name``, ``arguments_not_object``): finer credit
for kinds of malformed JSON would reward junk. With ``expected_call=None`` (a turn that should
answer in text, as the suite's ``no_call``): 1.0 without a marker, 0.0 with one (parsed or not).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping, Sequence

from codechat.chat.calls import normalize_call, parse_reply
from codechat.eval.funcall import normalize_value
from codechat.eval.sandbox import ExecResult, run
from codechat.tools.schema import Tool, validate_arguments


def binary(result: ExecResult) -> float:
    """1.0 if the program passed every test (status ``passed``), else 0.0."""
    return 1.0 if result.passed else 0.0


def fractional(result: ExecResult) -> float:
    """``tests_passed / tests_total``; with no tests, 1.0 if the program ran to completion."""
    if result.tests_total == 0:
        return binary(result)
    return result.tests_passed / result.tests_total


@dataclass(frozen=True)
class TieredLadder:
    """The rungs of :func:`tiered` (defaults: the seed's values)."""

    syntax: float = 0.0  # empty program or syntax error
    no_tests_run: float = 0.05  # definitions raised / timed out / ran out of memory
    none_pass: float = 0.15  # tests ran, none passed
    partial_floor: float = 0.15  # k of n pass: partial_floor + partial_span * k / n
    partial_span: float = 0.85
    all_pass: float = 1.0

    def __post_init__(self) -> None:
        rungs = (self.syntax, self.no_tests_run, self.none_pass, self.all_pass)
        if list(rungs) != sorted(rungs):
            raise ValueError(f"tiered rewards must not decrease up the ladder, got {rungs}")
        if self.partial_floor + self.partial_span > self.all_pass:
            raise ValueError("partial_floor + partial_span must not exceed all_pass")


TIERED = TieredLadder()


def tiered(result: ExecResult, ladder: TieredLadder = TIERED) -> float:
    """The seed's tiered reward (see the module docstring for the ladder)."""
    if result.passed:
        return ladder.all_pass
    if result.status == "syntax":
        return ladder.syntax
    if not result.definitions_ok:  # error / timeout / memory before any test ran
        return ladder.no_tests_run
    k, n = result.tests_passed, result.tests_total
    if k == 0 or n == 0:
        return ladder.none_pass
    return ladder.partial_floor + ladder.partial_span * k / n


REWARDS: dict[str, Callable[[ExecResult], float]] = {
    "binary": binary,
    "fractional": fractional,
    "tiered": tiered,
}


def score(program: str, tests: Sequence[str], reward: str = "tiered", *,
          timeout_s: float = 10.0, memory_mb: int = 1024) -> float:
    """Run ``program`` against ``tests`` in the sandbox and return the named reward.

    Raises:
        ValueError: an unknown reward name.
    """
    if reward not in REWARDS:
        raise ValueError(f"unknown reward {reward!r}; use one of {sorted(REWARDS)}")
    return REWARDS[reward](run(program, tests, timeout_s=timeout_s, memory_mb=memory_mb))


# ----------------------------------------------------------------------------- function calls
@dataclass(frozen=True)
class FuncallLadder:
    """The rungs of :func:`funcall_tiered` (module docstring); they must increase strictly up the
    ladder, and ``trailing_penalty`` must be smaller than every gap from ``undeclared`` up."""

    no_call: float = 0.0  # answered in text where a call was due
    unparseable: float = 0.1  # a call marker, then no readable call
    undeclared: float = 0.25  # a call of a function not among the tools
    wrong_function: float = 0.4  # a declared function, not the expected one
    invalid_arguments: float = 0.6  # the expected function, arguments invalid against its schema
    different_arguments: float = 0.75  # the expected function, valid arguments unlike the reference
    exact: float = 1.0  # the expected function, valid arguments equal to the reference
    trailing_penalty: float = 0.05  # subtracted when text follows a parsed call

    def __post_init__(self) -> None:
        names = [f.name for f in fields(self) if f.name != "trailing_penalty"]
        rungs = [getattr(self, n) for n in names]
        if any(b <= a for a, b in zip(rungs, rungs[1:])):
            raise ValueError(f"funcall rewards must increase strictly up the ladder "
                             f"({', '.join(names)}), got {rungs}")
        gap = min(b - a for a, b in zip(rungs[1:], rungs[2:]))  # gaps from `unparseable` up
        if not 0.0 <= self.trailing_penalty < gap:
            raise ValueError(f"trailing_penalty must be in [0, {gap}) (the smallest gap above "
                             f"'unparseable') so that it never reorders rungs, got {self.trailing_penalty}")


FUNCALL = FuncallLadder()


def funcall_tiered(reply_text: str, expected_call: Mapping[str, Any] | None, tools: Mapping[str, Tool],
                   ladder: FuncallLadder = FUNCALL) -> float:
    """The tiered reward of an assistant reply to a turn that should call ``expected_call`` (module docstring).

    Args:
        reply_text: the generated reply as text (``<|function_call|>`` spelled out, as
            ``tok.decode`` writes it; trailing ``<|end|>`` is stripped by the parser).
        expected_call: the reference ``{"name", "arguments"}`` (arguments an object or a JSON
            string of one: :func:`codechat.chat.calls.normalize_call`), or ``None`` for a turn that
            should answer in text.
        tools: the declared tools by the name the model calls them: :class:`~codechat.tools.Tool`
            as :func:`codechat.tools.tool_from_schema` builds them (parameters normalised and
            checked at load; an invalid schema here raises ``jsonschema.SchemaError``).
        ladder: the rung values.

    Raises:
        ValueError: ``expected_call`` is not a call (a :class:`~codechat.chat.calls.ParseError`) or names a
            function that is not among ``tools`` (a data error: no reply could earn 1.0).
    """
    reply = parse_reply(reply_text)
    if expected_call is None:
        return ladder.exact if reply.call is None and reply.error is None else ladder.no_call
    want = normalize_call(expected_call)
    if want["name"] not in tools:
        raise ValueError(f"the expected call names {want['name']!r}, which is not among the declared tools "
                         f"{sorted(tools)}: no reply could earn the top reward")
    if reply.call is None:
        return ladder.unparseable if reply.error is not None else ladder.no_call
    call = reply.call
    tool = tools.get(call["name"])
    if tool is None:
        reward = ladder.undeclared
    elif call["name"] != want["name"]:
        reward = ladder.wrong_function
    elif validate_arguments(tool, call["arguments"]) is not None:
        reward = ladder.invalid_arguments
    elif normalize_value(call["arguments"], tool.parameters) == normalize_value(want["arguments"], tool.parameters):
        reward = ladder.exact
    else:
        reward = ladder.different_arguments
    return reward - ladder.trailing_penalty if reply.trailing else reward
