"""``codechat funcall`` end to end on CPU: a tiny model taught one tool conversation
(``funcall_stage``, tests/conftest.py) calls the test's own executor, whose response reaches the
final answer; the trace shows every turn. Also the argument errors found before the model loads
(of ``chat`` and ``sample`` too)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from codechat.chat.funcall import load_tools
from codechat.cli import main
from codechat.tools import ToolError
from conftest import hide_module


def funcall(*args):
    return subprocess.run([sys.executable, "-m", "codechat", "funcall", "--device", "cpu", *map(str, args)],
                          capture_output=True, text=True, timeout=180)


def test_the_call_runs_and_its_response_reaches_the_final_answer(funcall_stage):
    stage, executors = funcall_stage
    p = funcall("--model", stage, "--executors", executors, "--user", "Weather in Tokyo?", "--show-trace")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ['', '[call] weather(city="Tokyo")', '[response] {"temp_c": 21}',
                                     '[assistant] It is 21 C in Tokyo.'], p.stdout
    assert executors.with_name("ran.txt").read_text() == "Tokyo"  # the executor really ran
    p = funcall("--model", stage, "--executors", executors, "--user", "Weather in Tokyo?")
    assert p.returncode == 0 and p.stdout.rstrip().endswith("It is 21 C in Tokyo."), p.stdout


def test_a_call_limit_of_zero_runs_nothing_and_says_so(funcall_stage):
    stage, executors = funcall_stage
    executors.with_name("ran.txt").unlink(missing_ok=True)
    p = funcall("--model", stage, "--executors", executors, "--user", "Weather in Tokyo?", "--max-tool-calls", 0,
                "--show-trace")
    assert p.returncode == 0 and "[stopped: the model asked for a call after 0 tool calls]" in p.stdout
    assert not executors.with_name("ran.txt").exists()


def test_tools_that_fill_the_context_are_refused_before_the_first_turn(funcall_stage, tmp_path):
    stage, _ = funcall_stage
    many = tmp_path / "many.py"
    many.write_text("".join(f'def tool_{i}(text: str) -> str:\n    """{"Does a long thing. " * 10}"""\n    return text\n\n\n'
                            for i in range(20)))
    p = funcall("--model", stage, "--executors", many, "--user", "hi")
    assert p.returncode == 2 and "20 tool schema(s) takes" in p.stderr and "declare fewer tools" in p.stderr


def test_bad_executors_files_are_one_line_errors_before_the_model_loads(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import no_such_module_here\n")
    p = funcall("--model", tmp_path / "nowhere", "--executors", bad, "--user", "hi")
    assert p.returncode == 2 and "bad.py" in p.stderr and "no_such_module_here" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    with pytest.raises(ToolError, match="no tools"):
        load_tools(None, None)
    with pytest.raises(ToolError, match="calculator"):
        load_tools(None, "shell")


def test_two_tools_of_one_name_are_an_error_naming_both_sources_before_the_model_loads(tmp_path, capsys):
    mine = tmp_path / "mine.py"
    mine.write_text("def calculator(expression: str) -> str:\n    \"\"\"My own calculator.\"\"\"\n"
                    "    return expression\n")
    nowhere = str(tmp_path / "nowhere")  # a model that would fail to load: the tools are checked first
    assert main(["funcall", "--model", nowhere, "--executors", str(mine), "--tools", "calculator", "--user", "hi"]) == 2
    assert f"two tools named 'calculator' ({mine}:calculator and builtin)" in capsys.readouterr().err
    assert main(["funcall", "--model", nowhere, "--tools", "calculator,python,calculator", "--user", "hi"]) == 2
    assert "built-in tool 'calculator' is named twice" in capsys.readouterr().err


@pytest.mark.parametrize("argv, without", [
    (["funcall", "--tools", "calculator", "--user", ""], "for an interactive session"),
    (["funcall", "--tools", "calculator", "--user", " \n\t"], "for an interactive session"),
    (["chat", "--prompt", ""], "for an interactive chat"),
    (["chat", "--prompt", "   "], "for an interactive chat"),
    (["sample", "--prompt", ""], "to sample from the start of a document"),
    (["sample", "--prompt", "\n"], "to sample from the start of a document"),
])
def test_an_empty_message_is_a_usage_error_before_the_model_loads(argv, without, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main([*argv, "--model", str(tmp_path / "nowhere")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"codechat {argv[0]}: error: argument {argv[-2]}: empty text" in err, err
    assert f"leave the flag out {without}" in err


# ----------------------------------------------------------------------------- strict calls (--strict, --tool-choice)
#: Bounded schemas: every valid call is short, so one cut off by the token limit is a bug.
BOUNDED = {
    "get_weather": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                     "unit": {"enum": ["c", "f"]}},
                    "required": ["city"], "additionalProperties": False},
    "add": {"type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                             "b": {"type": "integer", "minimum": -99, "maximum": 99}},
            "required": ["a", "b"], "additionalProperties": False},
}
BOUNDED_EXECUTORS = f'''
import json
from pathlib import Path

from codechat.tools import tool


@tool(parameters={BOUNDED["add"]!r})
def add(a, b):
    """Adds."""
    Path(__file__).with_name("add.json").write_text(json.dumps({{"a": a, "b": b}}))
    return a + b
'''  # one short tool: funcall_stage's context is 256 tokens


class Echo:
    """A dispatcher stand-in: every call succeeds, answering ``"ok"``."""

    ok = True

    def __call__(self, call, error=None):
        return self

    def message(self):
        from codechat.chat.conversation import Message
        return Message("function_response", '"ok"')


@pytest.fixture(scope="module")
def random_engine(tok):
    import torch

    from codechat.config.stages import preset
    from codechat.engine import Engine, EngineConfig
    from codechat.model import build_model
    torch.manual_seed(0)
    return Engine(build_model(preset("tiny", vocab_size=tok.vocab_size, max_seq_len=512, init_std=0.1)).eval(),
                  EngineConfig(slots=1))


@pytest.mark.parametrize("choice", ["required", "add", "auto"])
def test_under_strict_every_call_of_a_random_model_parses_and_validates(choice, tok, random_engine):
    pytest.importorskip("llguidance", reason="the grammar extra (llguidance) is not installed")
    import jsonschema

    from codechat.chat.conversation import Message
    from codechat.chat.funcall import Constraints, answer, tool_constraints
    from codechat.engine import SamplingConfig
    from codechat.tools import Tool
    tools = [Tool(name, f"tool {name}", params) for name, params in BOUNDED.items()]
    constraints = tool_constraints(random_engine, tok, tools, choice, strict=True)
    assert constraints.first is not None and constraints.after_call is not None
    assert tool_constraints(random_engine, tok, tools, "none", strict=True) == Constraints()  # free, nothing compiled
    assert tool_constraints(random_engine, tok, tools, "auto") == Constraints()
    calls = []
    for seed in range(4):  # temperature 1: a random model writes anything the grammar allows
        msgs = answer(random_engine, tok, [Message("user", "Weather in Tokyo, and 2 + 3?")], tools, Echo(),
                      SamplingConfig(48, temperature=1.0), max_tool_calls=1, seed=seed, constraints=constraints)
        if choice != "auto":  # the first reply is a call, to that tool when one is named
            assert msgs[1].function_call is not None and msgs[1].content == ""
            assert choice == "required" or msgs[1].function_call["name"] == choice
        calls += [m.function_call for m in msgs if m.role == "assistant" and m.function_call is not None]
        # without a call, a reply is text: a <|function_call|> the grammar let through always parsed
        assert all(m.function_call is not None or "<|function_call|>" not in m.content for m in msgs)
    assert calls or choice == "auto"
    for c in calls:
        jsonschema.validate(c["arguments"], BOUNDED[c["name"]])


def test_tool_choice_names_a_tool_and_the_executor_gets_valid_arguments(funcall_stage, tmp_path):
    pytest.importorskip("llguidance", reason="the grammar extra (llguidance) is not installed")
    import json

    import jsonschema
    stage, _ = funcall_stage
    (tmp_path / "bounded.py").write_text(BOUNDED_EXECUTORS)
    # the model was taught to call weather(Tokyo); forced to call add, it still writes valid arguments
    p = funcall("--model", stage, "--executors", tmp_path / "bounded.py", "--user", "Weather in Tokyo?",
                "--tool-choice", "add", "--strict", "--max-tool-calls", 1, "--max-new-tokens", 64, "--show-trace")
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    assert out[1].startswith("[call] add(a=") and out[2].startswith("[response] "), p.stdout
    jsonschema.validate(json.loads((tmp_path / "add.json").read_text()), BOUNDED["add"])


def test_strict_errors_are_one_line(funcall_stage, tmp_path, capsys, monkeypatch):
    pytest.importorskip("llguidance", reason="the grammar extra (llguidance) is not installed")
    stage, _ = funcall_stage
    (tmp_path / "bounded.py").write_text(BOUNDED_EXECUTORS)
    base = ["funcall", "--device", "cpu", "--executors", str(tmp_path / "bounded.py"), "--user", "hi"]

    def error(*args: str) -> str:
        assert main([*base, *args]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        return err
    # an undeclared tool: before the model loads (there is none at `nowhere`)
    err = error("--model", str(tmp_path / "nowhere"), "--tool-choice", "delete_all")
    assert "--tool-choice 'delete_all' is neither auto, required, none nor a declared tool (add)" in err
    # a parameters schema the grammar library cannot compile: where, and the keyword
    (tmp_path / "odd.py").write_text("from codechat.tools import tool\n\n\n@tool(parameters={'type': 'object', "
                                     "'properties': {'d': {'type': 'string', 'format': 'nope'}}})\n"
                                     "def odd(d=''):\n    \"\"\"Odd.\"\"\"\n    return d\n")
    assert main([*base, "--model", str(stage), "--executors", str(tmp_path / "odd.py"), "--strict"]) == 2
    err = capsys.readouterr().err
    assert "$.tools[0].parameters.properties.d (keyword 'format')" in err and len(err.strip().splitlines()) == 1, err
    # the grammar library missing
    hide_module(monkeypatch, "llguidance")
    assert "pip install 'codechat[grammar]'" in error("--model", str(stage), "--tool-choice", "required")
    assert main([*base, "--model", str(stage), "--max-new-tokens", "8"]) == 0  # free calls need no grammar
