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
