"""``codechat data inspect``: the supervised spans it shows are exactly the assistant turns, for every format."""
from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import pytest

from codechat.chat.calls import FUNCTION_CALL_TOKEN
from codechat.config.stages import ConfigError
from codechat.data import corpus
from codechat.data import inspect as data_inspect
from codechat.data.formats import load_records
from codechat.data.decontam import humaneval_file
from conftest import shared_file

FIXTURES = Path(__file__).parent / "fixtures" / "sft"
CASES_B = Path(__file__).parent / "fixtures" / "cases_b"
#: Budgets large enough that no example here is truncated.
NO_TRUNCATION = ["--max-length", "16384", "--max-prompt-length", "16000"]


def run(argv: list[str]) -> int:
    """``codechat data ...`` through the same parser wiring as ``codechat.cli``."""
    parser = argparse.ArgumentParser(prog="codechat")
    data_inspect.add_cli(corpus.add_cli(parser.add_subparsers(dest="command", required=True)))
    args = parser.parse_args(["data", *argv])
    return args.func(args)


def expected_spans(conv) -> list[str]:
    return [m.content + (FUNCTION_CALL_TOKEN + json.dumps(m.function_call, ensure_ascii=False)
                         if m.function_call else "") + "<|end|>" for m in conv.messages if m.role == "assistant"]


def sources(shared: Path) -> list[tuple[str, Path]]:
    return [("mbpp", shared / "data/mbpp/mbpp.jsonl"), ("sharegpt", shared / "data/function_calling_glaive"),
            ("alpaca", shared / "data/code_alpaca/code_alpaca_2k.json"),
            ("alpaca", shared / "data/code_alpaca/new_codealpaca.json.gz"),
            ("qa", shared / "data/gsm8k/train.jsonl.gz"),
            ("glaive", shared / "cases/19-glaive-functioncall-quoting.jsonl"),
            ("messages", shared / "cases/20-tool-args-double-encoding.jsonl"),
            ("messages", FIXTURES / "messages.jsonl"), ("glaive", FIXTURES / "glaive_raw.jsonl"),
            ("completion", FIXTURES / "completion.jsonl"), ("text", FIXTURES / "text.jsonl"),
            ("humaneval", humaneval_file())]


def fixture_sources(tmp: Path) -> list[tuple[str, Path]]:
    """The project's own file of every format :func:`sources` reads from shared/ (gzip made here)."""
    gz = tmp / "qa.jsonl.gz"
    gz.write_bytes(gzip.compress((CASES_B / "gsm8k/qa.jsonl").read_bytes()))
    return [("mbpp", CASES_B / "mbpp/mbpp.jsonl"), ("mbpp", CASES_B / "mbpp/sanitized-mbpp.json"),
            ("sharegpt", CASES_B / "glaive_sharegpt"), ("alpaca", CASES_B / "alpaca/instructions.json"),
            ("alpaca", CASES_B / "alpaca/instructions_response.json"), ("qa", gz),
            ("glaive", CASES_B / "glaive_quoting.jsonl"), ("messages", CASES_B / "args_encoding.jsonl"),
            ("messages", FIXTURES / "messages.jsonl"), ("glaive", FIXTURES / "glaive_raw.jsonl"),
            ("completion", FIXTURES / "completion.jsonl"), ("text", FIXTURES / "text.jsonl"),
            ("humaneval", humaneval_file())]


def check_inspect_json(tok_dir: Path, capsys, srcs: list[tuple[str, Path]]) -> None:
    """``inspect --json`` of each source: its format, and supervised text exactly the assistant turns."""
    for fmt, path in srcs:
        records = {(r.source, r.line): r for r in load_records(path)}
        assert run(["inspect", "--data", str(path), "--json", "--n", "12", "--tokenizer", str(tok_dir),
                    *NO_TRUNCATION]) == 0
        out = capsys.readouterr()
        rows = [json.loads(line) for line in out.out.splitlines()]
        assert len(rows) == min(12, len(records)), path
        assert "kept" in out.err and "supervised share" in out.err
        for row in rows:
            assert set(row) >= {"source", "line", "ids", "mask", "supervised_text"}
            assert row["format"] == fmt and row["dropped"] is None and len(row["ids"]) == len(row["mask"])
            rec = records[(row["source"], row["line"])]
            assert row["supervised_text"] == expected_spans(rec.conversation), (path, row["line"])


def test_inspect_json_supervised_spans_are_exactly_the_assistant_turns(tok_dir, shared_dir, capsys):
    check_inspect_json(tok_dir, capsys, sources(shared_dir))


def test_inspect_json_supervised_spans_are_exactly_the_assistant_turns_fixture(tok_dir, tmp_path, capsys):
    check_inspect_json(tok_dir, capsys, fixture_sources(tmp_path))


def check_inspect_truncation(tok_dir: Path, capsys, path: Path, first_turns: str, last_turn: str) -> None:
    """Plain ``inspect`` of a three-row file whose rows 1 and 3 overflow a 48-token prompt budget."""
    assert run(["inspect", "--data", str(path), "--tokenizer", str(tok_dir), "--n", "5", "--max-length", "64",
                "--max-prompt-length", "48"]) == 0
    out = capsys.readouterr().out  # not a terminal: [[...]] markers, no colour codes
    assert first_turns in out
    assert last_turn in out and "\x1b[" not in out
    assert out.count("[prompt_truncated]") == 2 and "=== example 3/3" in out
    assert "3 examples: 3 kept (2 prompt-truncated, 0 completion-truncated), 0 dropped" in out
    assert run(["inspect", "--data", str(path), "--tokenizer", str(tok_dir), "--n", "1", "--color", "always"]) == 0
    out = capsys.readouterr().out
    assert data_inspect.COLOR_ON in out and data_inspect.COLOR_OFF in out and "[[" not in out


def test_inspect_marks_supervised_text_and_shows_truncation(tok_dir, capsys):
    check_inspect_truncation(tok_dir, capsys, shared_file("cases/01-prompt-exceeds-max-len.jsonl"),
                             "<|user|>Say OK.<|end|><|assistant|>[[OK.<|end|>]]<|user|>",
                             "<|assistant|>[[Done.<|end|>]]")


def test_inspect_marks_supervised_text_and_shows_truncation_fixture(tok_dir, capsys):
    check_inspect_truncation(tok_dir, capsys, CASES_B / "budget_prompts.jsonl",
                             "<|user|>Reply yes.<|end|><|assistant|>[[yes.<|end|>]]<|user|>",
                             "<|assistant|>[[Finished.<|end|>]]")


def test_inspect_lists_dropped_examples(tok_dir, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "no answer"}]}) + "\n")
    assert run(["inspect", "--data", str(data), "--tokenizer", str(tok_dir), "--json"]) == 0
    [row] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["dropped"] == "no_assistant_turn" and row["ids"] == [] and row["supervised_text"] == []


def test_inspect_requires_a_tokenizer(tmp_path):
    data = str(CASES_B / "args_encoding.jsonl")  # any readable data: the missing tokenizer is the error
    with pytest.raises(ConfigError, match="--tokenizer DIR is required"):
        run(["inspect", "--data", data])
    with pytest.raises(ConfigError, match="holds no tokenizer"):
        run(["inspect", "--data", data, "--tokenizer", str(tmp_path)])
