"""Dispatching model-written function calls: hostile output becomes an error response, never a crash.

One :class:`Dispatcher` (one worker process) serves the module; the tests that kill its worker
(timeout, output flood, crash) check that the next call gets a fresh one.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import resource
import textwrap
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from codechat.tools import Tool, ToolError, load_executors
from codechat.tools.builtins import BUILTIN_NAMES, CalculatorError, builtin_tools, calculate
from codechat.tools.dispatch import CallResult, DispatchLimits, Dispatcher, dispatch
from conftest import FIXTURES, shared_params

CASE_12B = "cases/12b-calculator-tool-exprs.jsonl"  # in shared/ (skipped when absent)
#: The project's own hostile calculator expressions (names, imports, dunder walks, power and product bombs).
CALCULATOR_EXPRS = FIXTURES / "cases_b" / "calculator_exprs.jsonl"

EXECUTORS = textwrap.dedent('''
    import os
    import pathlib
    import sys
    import time


    def add(a, b):
        return a + b


    def echo(text):
        return {"text": text}


    def boom(message):
        raise ValueError(message)


    def sleepy(seconds):
        time.sleep(seconds)
        return "woke"


    def loud(n_bytes):
        sys.stdout.write("x" * n_bytes)
        return "done"


    def loud_fd(n_chunks):
        for _ in range(n_chunks):
            os.write(2, b"y" * 65536)
        return "done"


    def chatty():
        print("hello from the tool")
        print("a warning", file=sys.stderr)
        return 1


    def make_set():
        return {1, 2}


    def not_a_number():
        return float("nan")


    def big(n):
        return "x" * n


    def die(status):
        os._exit(status)


    def touch(path):  # never declared: no call may run it
        pathlib.Path(path).write_text("ran")
        return "touched"
''')

OBJ = "object"
SCHEMAS: dict[str, dict[str, Any]] = {
    "add": {"type": OBJ, "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"], "additionalProperties": False},
    "echo": {"type": OBJ, "properties": {"text": {"type": "string"}}, "required": ["text"]},
    "boom": {"type": OBJ, "properties": {"message": {"type": "string"}}, "required": ["message"]},
    "sleepy": {"type": OBJ, "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]},
    "loud": {"type": OBJ, "properties": {"n_bytes": {"type": "integer"}}, "required": ["n_bytes"]},
    "loud_fd": {"type": OBJ, "properties": {"n_chunks": {"type": "integer"}}, "required": ["n_chunks"]},
    "chatty": {"type": OBJ, "properties": {}},
    "make_set": {"type": OBJ, "properties": {}},
    "not_a_number": {"type": OBJ, "properties": {}},
    "big": {"type": OBJ, "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    "die": {"type": OBJ, "properties": {"status": {"type": "integer"}}, "required": ["status"]},
}


@pytest.fixture(scope="module")
def executors(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Tool]]:
    """An executors file in a temp dir, loaded by path, and a Tool for each declared function."""
    path = tmp_path_factory.mktemp("executors") / "executors.py"
    path.write_text(EXECUTORS)
    spec = importlib.util.spec_from_file_location("executors_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tools = {name: Tool(name, f"{name} (test)", parameters=schema, fn=getattr(module, name), source=f"{path}:{name}")
             for name, schema in SCHEMAS.items()}
    return path, tools


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file that exists only if something that must not run did."""
    return tmp_path_factory.mktemp("sentinel") / "ran.txt"


@pytest.fixture(scope="module")
def dispatcher(executors: tuple[Path, dict[str, Tool]]) -> Dispatcher:
    tools = {**executors[1], **builtin_tools(["python", "calculator"], python_timeout_s=1.0)}
    with Dispatcher(tools, timeout_s=5.0) as d:
        d.start()
        yield d


def call(name: Any, /, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def error_of(r: CallResult) -> str:
    """The error the model reads; checks that content and ``error`` agree."""
    assert not r.ok
    message = json.loads(r.content)["error"]
    assert r.error is not None and r.error.startswith(message)
    return message


def child_pids() -> set[int]:
    pids: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            pids |= {int(p) for p in f.read().split()}
    return pids


# ----------------------------------------------------------------------------- declared calls
def test_declared_call_returns_its_value_as_json(dispatcher: Dispatcher) -> None:
    r = dispatcher(call("add", a=2, b=40))
    assert r == CallResult("add", True, "42", None, r.wall_s)
    assert json.loads(dispatcher(call("echo", text="héllo")).content) == {"text": "héllo"}
    assert r.message().role == "function_response" and r.message().content == "42"


def test_call_text_and_json_string_arguments_are_accepted(dispatcher: Dispatcher) -> None:
    assert dispatcher('{"name": "add", "arguments": {"a": 1, "b": 2}}').content == "3"
    assert dispatcher({"name": "add", "arguments": '{"a": 1, "b": 2}'}).content == "3"


def test_executor_output_is_captured_not_returned(dispatcher: Dispatcher) -> None:
    r = dispatcher(call("chatty"))
    assert (r.ok, r.content, r.stdout, r.stderr) == (True, "1", "hello from the tool\n", "a warning\n")
    assert dispatcher(call("add", a=1, b=1)).stdout == ""  # nothing left over from the previous call


# ----------------------------------------------------------------------------- names
HOSTILE_NAMES = ["eval", "exec", "open", "__import__", "compile", "getattr", "print", "breakpoint",
                 "__builtins__", "os.system", "subprocess.run", "touch", "executors.touch",
                 "executors.py:touch", "../executors.py:touch", "/etc/passwd", "add; touch", " add", "ADD"]


def test_undeclared_names_never_run_anything(executors: tuple[Path, dict[str, Tool]], sentinel: Path) -> None:
    path, tools = executors
    d = Dispatcher(tools)
    names = HOSTILE_NAMES + [f"{path}:touch"]
    for name in names:
        for arguments in ({"path": str(sentinel)}, {"file": str(sentinel), "mode": "w"},
                          {"source": f"open({str(sentinel)!r}, 'w').write('ran')"}, {"name": "os"}):
            r = d(call(name, **arguments))
            assert error_of(r).startswith(f"there is no function named {name[:60]!r}; the functions you can "
                                          "call are: add, echo, boom"), name
    assert not sentinel.exists()
    assert d.worker_pid is None and d.starts == 0  # no process was even started
    d.close()


def test_undeclared_name_in_a_live_worker_does_not_run(dispatcher: Dispatcher, sentinel: Path) -> None:
    pid = dispatcher.worker_pid
    assert "no function named 'touch'" in error_of(dispatcher(call("touch", path=str(sentinel))))
    assert not sentinel.exists() and dispatcher.worker_pid == pid


@pytest.mark.parametrize("bad", [
    None, 5, [], ["add"], {"arguments": {}}, {"name": None}, {"name": 3}, {"name": ["add"]}, {"name": ""},
    {"name": "x" * 10_000_000}, "garbage text", '{"name": "add", "arguments": ', ValueError("bad JSON"),
], ids=lambda b: type(b).__name__ + ":" + repr(b)[:30])
def test_garbage_calls_are_error_responses(dispatcher: Dispatcher, bad: Any) -> None:
    r = dispatcher(bad)
    message = error_of(r)
    assert len(r.content) < 1000  # a 10 MB name is not echoed back
    if bad is None or isinstance(bad, (str, ValueError)):
        assert message.startswith("your function call could not be parsed")


def test_parse_failure_passed_as_error_string(dispatcher: Dispatcher) -> None:
    r = dispatcher(None, error="Expecting value: line 1 column 1 (char 0)")
    assert r.name is None
    assert error_of(r).startswith("your function call could not be parsed: Expecting value: line 1 column 1")


# ----------------------------------------------------------------------------- arguments
@pytest.mark.parametrize("arguments, expected", [
    ({"a": "1", "b": 2}, "invalid arguments for 'add': a: '1' is not of type 'integer'"),
    ({"a": 1}, "invalid arguments for 'add': arguments: 'b' is a required property"),
    ({"a": 1, "b": 2, "c": 3}, "invalid arguments for 'add': arguments: Additional properties are not allowed "
                               "('c' was unexpected)"),
    ({"a": 1.5, "b": 2}, "invalid arguments for 'add': a: 1.5 is not of type 'integer'"),
    ({"a": [1], "b": {"x": 1}}, "invalid arguments for 'add': a: [1] is not of type 'integer'"),
])
def test_arguments_that_do_not_fit_the_schema(dispatcher: Dispatcher, arguments: dict, expected: str) -> None:
    assert error_of(dispatcher({"name": "add", "arguments": arguments})) == expected


@pytest.mark.parametrize("arguments, expected", [
    ([1, 2], "the arguments of 'add' must be a JSON object, not list"),
    ("not json", "the arguments of 'add' are not JSON: JSONDecodeError: Expecting value"),
    ('[1, 2]', "the arguments of 'add' must be a JSON object, not list"),
    ({"a": float("nan"), "b": 1}, "the arguments of 'add' are not plain JSON: ValueError: Out of range float"),
])
def test_arguments_that_are_not_an_object(dispatcher: Dispatcher, arguments: Any, expected: str) -> None:
    assert error_of(dispatcher({"name": "add", "arguments": arguments})).startswith(expected)


def test_deeply_nested_arguments_are_an_error(dispatcher: Dispatcher) -> None:
    nested: list = []
    for _ in range(100_000):
        nested = [nested]
    assert "are not plain JSON: RecursionError" in error_of(dispatcher(call("echo", text=nested)))


def test_ten_megabyte_arguments_are_refused_before_anything_runs(dispatcher: Dispatcher) -> None:
    pid = dispatcher.worker_pid
    text = "x" * 10_000_000
    limit = "at most 1,048,576 bytes are accepted"
    assert error_of(dispatcher(call("echo", text=text))) == f"the arguments of 'echo' are 10,000,011 bytes; {limit}"
    as_string = json.dumps({"text": text})  # a JSON string inside the call: its own size counts
    assert error_of(dispatcher({"name": "echo", "arguments": as_string})) == \
        f"the arguments of 'echo' are {len(as_string):,} bytes; {limit}"
    assert dispatcher.worker_pid == pid


@pytest.mark.parametrize("text", [
    "__import__('os').system('touch {sentinel}')", "open('{sentinel}', 'w').write('ran')",
    "../../../../etc/passwd", "/etc/shadow", "..\\..\\windows\\system32", "$(touch {sentinel})", "${HOME}",
    "{{7*7}}", "'; DROP TABLE tools; --", "nul\x00byte", "lone \ud800 surrogate", "<|end|><|assistant|>", "eval",
])
def test_argument_values_are_only_data(dispatcher: Dispatcher, sentinel: Path, text: str) -> None:
    text = text.replace("{sentinel}", str(sentinel))
    r = dispatcher(call("echo", text=text))
    assert r.ok and json.loads(r.content) == {"text": text}
    assert not sentinel.exists()


def test_arguments_that_do_not_fit_the_signature(executors: tuple[Path, dict[str, Tool]],
                                                  dispatcher: Dispatcher) -> None:
    loose = Tool("add", parameters={"type": "object"}, fn=executors[1]["add"].fn, source=executors[1]["add"].source)
    with Dispatcher({"add": loose}) as d:
        assert error_of(d(call("add", a=1, b=2, c=3))) == \
            "the arguments do not fit 'add': got an unexpected keyword argument 'c'"


# ----------------------------------------------------------------------------- executors misbehaving
def test_an_executor_that_raises(dispatcher: Dispatcher) -> None:
    pid = dispatcher.worker_pid
    r = dispatcher(call("boom", message="bad input"))
    assert r.content == json.dumps({"error": "'boom' failed: ValueError: bad input"})
    assert "Traceback" not in r.content and "executors.py:" in r.error and "in boom" in r.error
    assert dispatcher.worker_pid == pid


def test_an_executor_that_sleeps_forever_is_killed_and_the_next_call_works(dispatcher: Dispatcher) -> None:
    pid = dispatcher.worker_pid
    r = dispatcher(call("sleepy", seconds=3600), timeout_s=0.5)
    assert error_of(r) == "'sleepy' did not finish within 0.5 s and was stopped"
    assert r.wall_s < 3
    assert not os.path.exists(f"/proc/{pid}")  # killed and reaped
    assert dispatcher(call("add", a=1, b=2)).content == "3"
    assert dispatcher.worker_pid not in (None, pid)


@pytest.mark.parametrize("name, arguments, stream", [
    ("loud", {"n_bytes": 100_000_000}, "stdout"),  # through sys.stdout
    ("loud_fd", {"n_chunks": 1600}, "stderr"),  # 100 MiB straight to file descriptor 2
])
def test_an_executor_that_prints_100_mb_is_stopped_with_memory_bounded(
        dispatcher: Dispatcher, name: str, arguments: dict, stream: str) -> None:
    before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = dispatcher(call(name, **arguments))
    assert error_of(r) == f"'{name}' printed more than 1,048,576 bytes of output (the limit) and was stopped"
    assert len(getattr(r, stream)) <= 1 << 20
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kib) / 1024
    assert grown_mib < 40, f"the dispatching process grew by {grown_mib:.0f} MiB"
    assert dispatcher(call("add", a=2, b=2)).content == "4"


def test_an_executor_whose_process_dies(dispatcher: Dispatcher) -> None:
    assert error_of(dispatcher(call("die", status=3))) == \
        "'die' crashed: its process exited with status 3 before returning"
    assert dispatcher(call("add", a=2, b=3)).content == "5"


def test_a_result_larger_than_the_limit(dispatcher: Dispatcher) -> None:
    pid = dispatcher.worker_pid
    assert error_of(dispatcher(call("big", n=100_000))) == \
        "the result of 'big' is 100,002 bytes of JSON; at most 65,536 bytes can be returned"
    assert dispatcher(call("big", n=10)).content == '"xxxxxxxxxx"'
    assert dispatcher.worker_pid == pid


def test_a_result_that_is_not_json(dispatcher: Dispatcher) -> None:
    assert error_of(dispatcher(call("make_set"))) == "'make_set' returned a set, which is not JSON (a bug in the tool)"
    assert error_of(dispatcher(call("not_a_number"))).startswith(
        "'not_a_number' returned a float (ValueError: Out of range float values are not JSON compliant)")


def test_a_declared_tool_without_executor() -> None:
    with Dispatcher({"lookup": Tool("lookup", source="tools.json")}) as d:
        assert error_of(d(call("lookup"))) == "'lookup' is declared but cannot be run here (it has no executor)"
        assert d.worker_pid is None


def test_the_worker_memory_limit(executors: tuple[Path, dict[str, Tool]]) -> None:
    with Dispatcher({"big": executors[1]["big"]}, memory_mb=1024) as d:
        assert error_of(d(call("big", n=2_000_000_000))) == "'big' failed: MemoryError"
        assert d(call("big", n=3)).content == '"xxx"'


def test_a_worker_that_cannot_start_is_an_error_response_and_a_warning(
        executors: tuple[Path, dict[str, Tool]], monkeypatch: pytest.MonkeyPatch) -> None:
    import codechat.tools.worker as worker_module  # the worker's launch lives with the worker

    monkeypatch.setattr(worker_module, "_BOOT", "import sys; print('broken install', file=sys.stderr); sys.exit(7)")
    with Dispatcher(executors[1]) as d, pytest.warns(RuntimeWarning, match="the tool worker did not start"):
        r = d(call("add", a=1, b=2))
    assert error_of(r) == "'add' could not be run: the tool worker did not start"
    assert "broken install" in r.error


def test_an_omitted_optional_parameter_without_default_is_passed_none(tmp_path: Path) -> None:
    path = tmp_path / "optional.py"
    path.write_text(textwrap.dedent('''
        from typing import Any, Optional


        def greet(name: str, title: str | None, suffix: Optional[int], extra: Any,
                  punct: str | None = "!", times: int | None = 3):
            return [name, title, suffix, extra, punct, times]
    '''))
    (greet,) = load_executors(path)
    assert greet.parameters["required"] == ["name"]  # title, suffix, extra: nullable, so not required
    with Dispatcher([greet]) as d:
        # left out, no default: None; left out with a default: the function's default, never None
        assert json.loads(d(call("greet", name="Ada")).content) == ["Ada", None, None, None, "!", 3]
        given = d(call("greet", name="Ada", title="Dr", suffix=2, extra=[1], punct=None, times=None))
        assert json.loads(given.content) == ["Ada", "Dr", 2, [1], None, None]
        assert error_of(d(call("greet", title="Dr"))).endswith("arguments: 'name' is a required property")


# ----------------------------------------------------------------------------- declaring tools
def test_executors_a_worker_cannot_import_are_refused_up_front() -> None:
    with pytest.raises(ToolError, match="must be a module-level function"):
        Dispatcher({"f": Tool("f", fn=lambda: 1)})
    with pytest.raises(ToolError, match="must be JSON values"):
        Dispatcher({"f": Tool("f", fn=functools.partial(calculate, expression=object()))})
    with pytest.raises(ToolError, match="the key must be its name"):
        Dispatcher({"g": Tool("f", fn=calculate)})


def test_a_list_with_two_tools_of_one_name_is_refused_naming_both_sources() -> None:
    with pytest.raises(ToolError, match=r"two tools named 'f' \(a.py:f and tools.json\)"):
        Dispatcher([Tool("f", source="a.py:f"), Tool("f", source="tools.json")])  # not the last one, silently


def test_one_shot_dispatch_leaves_no_process(executors: tuple[Path, dict[str, Tool]],
                                             dispatcher: Dispatcher) -> None:
    before = child_pids()
    r = dispatch(call("add", a=20, b=22), executors[1], timeout_s=2.0)
    assert (r.ok, r.content) == (True, "42")
    assert child_pids() <= before


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        DispatchLimits(timeout_s=0)
    with pytest.raises(ValueError, match="max_output_bytes must be > 0"):
        Dispatcher({}, max_output_bytes=-1)


# ----------------------------------------------------------------------------- built-ins
def test_builtin_tools_by_name_with_valid_schemas() -> None:
    tools = builtin_tools("python,calculator")
    assert sorted(tools) == sorted(BUILTIN_NAMES)
    for tool in tools.values():
        jsonschema.Draft202012Validator.check_schema(tool.parameters)
        assert tool.description and tool.schema()["name"] == tool.name
    with pytest.raises(ToolError, match="unknown built-in tool 'shell'; the built-ins are: calculator, python"):
        builtin_tools(["calculator", "shell"])


def test_python_tool_runs_code_in_the_sandbox(dispatcher: Dispatcher) -> None:
    r = dispatcher(call("python", code="print(1+1)"))
    assert r.ok and json.loads(r.content) == {"status": "ok", "stdout": "2\n", "stderr": "", "error": None}


def test_python_tool_reports_the_exception(dispatcher: Dispatcher) -> None:
    r = dispatcher(call("python", code="print('before')\nraise ValueError('no good')"))
    assert r.ok and json.loads(r.content) == {"status": "error", "stdout": "before\n", "stderr": "",
                                              "error": "ValueError: no good"}
    assert json.loads(dispatcher(call("python", code="def f(:")).content)["status"] == "syntax"


def test_python_tool_timeout_is_the_sandbox_s(dispatcher: Dispatcher) -> None:
    pid = dispatcher.worker_pid
    r = dispatcher(call("python", code="while True:\n    pass"))
    assert r.ok and json.loads(r.content)["status"] == "timeout"
    assert dispatcher.worker_pid == pid  # the sandbox stopped the program, not the dispatcher the worker
    assert error_of(dispatcher(call("python"))) == "invalid arguments for 'python': arguments: 'code' is a " \
                                                   "required property"


def _read_cases(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_calculator_case(dispatcher: Dispatcher, case: dict[str, str]) -> None:
    """One expression through the dispatcher's worker and in this process: an integer ``expected`` is the value;
    anything else must be rejected quickly (with the error ``message`` when the case gives one), the worker alive."""
    pid = dispatcher.worker_pid
    r = dispatcher(call("calculator", expression=case["expr"]))
    assert r.wall_s < 1.0
    if case["expected"].lstrip("-").isdigit():
        assert (r.ok, r.content) == (True, case["expected"])
        assert calculate(case["expr"]) == int(case["expected"])
    else:
        message = error_of(r)
        assert message.startswith("'calculator' failed: CalculatorError: ")
        if "message" in case:
            assert message.startswith("'calculator' failed: CalculatorError: " + case["message"])
        else:
            assert "is not allowed" in message or "the limit is" in message
        with pytest.raises(CalculatorError) as e:
            calculate(case["expr"])
        assert str(e.value).startswith(case.get("message", ""))
    assert dispatcher.worker_pid == pid  # the process lives


@pytest.mark.parametrize("case", shared_params(CASE_12B, _read_cases, lambda c: c["id"]))
def test_calculator_case_12b(dispatcher: Dispatcher, case: dict[str, str]) -> None:
    """Every line of the 12b case file, through the dispatcher's worker and in this process."""
    check_calculator_case(dispatcher, case)


@pytest.mark.parametrize("case", _read_cases(CALCULATOR_EXPRS), ids=lambda c: c["id"])
def test_calculator_hostile_expressions_fixture(dispatcher: Dispatcher, case: dict[str, str]) -> None:
    """The project's own expressions: two values, then attribute and name access, an import, a dunder walk,
    indexing into globals, and power and product bombs, each with its exact error."""
    check_calculator_case(dispatcher, case)


@pytest.mark.parametrize("expr, expected", [
    ("2**10 - 24", 1000), ("7 // 2 + 7 % 3", 4), ("-(3 - 5) ** 2", -4), ("2 ** -2", 0.25),
    ("sqrt(16) + abs(-2)", 6.0), ("round(2.567, 2)", 2.57), ("max(1, 9, 3)", 9), ("2**4095", 2 ** 4095),
])
def test_calculator_values(expr: str, expected: float) -> None:
    assert calculate(expr) == expected


@pytest.mark.parametrize("expr, message", [
    ("x + 1", "the name 'x' is not allowed"),
    ("open('/etc/passwd')", "calling 'open' is not allowed"),
    ("__import__('os').system('true')", "attribute access (.system) is not allowed"),
    ("(1).__class__", "attribute access (.__class__) is not allowed"),
    ("[c for c in ().__class__.__mro__]", "a comprehension is not allowed"),
    ("'a' * 10", "the literal 'a' is not allowed"),
    ("lambda: 1", "lambda is not allowed"),
    ("1 < 2", "a comparison is not allowed"),
    ("True + 1", "the literal True is not allowed"),
    ("10**10**10", "the power would have about 3.32e+10 bits; the limit is 4096"),
    ("(2**4000) * (2**4000)", "the product would exceed 4096 bits"),
    ("2**2**2**2**2", "the power would have about 6.55e+04 bits; the limit is 4096"),
    ("round(5, -10**8)", "round()'s second argument must be within +-100"),
    ("1e308 * 10", "the result is not finite"),
    ("1.0001 ** 10**9", "the result is too large (overflow)"),
    ("(-8) ** (1/3)", "the result is not a real number (complex)"),
    ("1 / 0", "division by zero"),
    ("sqrt(-1)", "math domain error"),
    ("-" * 200 + "1", "the expression is nested more than 100 levels deep"),
    ("1" * 1001, "the expression is 1001 characters; at most 1000"),
    ("1 +", "not an arithmetic expression"),
])
def test_calculator_rejects(expr: str, message: str) -> None:
    with pytest.raises(CalculatorError) as e:
        calculate(expr)
    assert str(e.value).startswith(message)
