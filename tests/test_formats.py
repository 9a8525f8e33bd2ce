"""SFT record formats read from the real files in shared/data (skipped when it is absent) and from the project's
own fixtures (tests/fixtures/sft, tests/fixtures/cases_b), which pin every format the shared files do."""
from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import pytest

from codechat.chat.calls import FUNCTION_CALL_TOKEN
from codechat.chat.conversation import Conversation, Message, render, supervised_spans
from codechat.data.formats import (HUMANEVAL_PROMPT, FormatError, detect_format, load_records, mbpp_prompt,
                                   to_conversation)
from codechat.data.decontam import humaneval_file
from codechat.data.readers import LoadCounts, read_rows
from conftest import shared_file

FIXTURES = Path(__file__).parent / "fixtures" / "sft"
CASES_B = Path(__file__).parent / "fixtures" / "cases_b"


def assistant_spans(conv: Conversation) -> list[str]:
    return [m.content + (FUNCTION_CALL_TOKEN + json.dumps(m.function_call, ensure_ascii=False)
                         if m.function_call else "") + "<|end|>" for m in conv.messages if m.role == "assistant"]


def check_spans(tok, records) -> None:
    """Rendered supervised spans are exactly the assistant turns of every record."""
    for r in records:
        ids, mask = render(tok, r.conversation)
        assert [tok.decode(ids[a:b]) for a, b in supervised_spans(mask)] == assistant_spans(r.conversation), \
            (r.source, r.line)


def check_mbpp_jsonl(tok, path: Path, n: int) -> None:
    """MBPP JSON lines: the user asks with the problem and its tests, the assistant answers with the code (CRLF->LF)."""
    records = load_records(path)
    assert len(records) == n and {r.format for r in records} == {"mbpp"}
    first = json.loads(path.read_text().splitlines()[0])
    user, assistant = records[0].conversation.messages
    assert (records[0].source, records[0].line) == (str(path), 1)
    assert user.content == mbpp_prompt(first["text"], first["test_list"])
    assert user.content.startswith(first["text"]) and all(t in user.content for t in first["test_list"])
    assert "\r\n" in first["code"]
    assert assistant.content == first["code"].replace("\r\n", "\n").rstrip() and "\r" not in assistant.content
    assert records[0].task_id == str(first["task_id"])
    check_spans(tok, records[:50])


def test_mbpp_jsonl_user_asks_with_the_tests_and_assistant_answers_with_code(tok):
    check_mbpp_jsonl(tok, shared_file("data/mbpp/mbpp.jsonl"), 974)


def test_mbpp_jsonl_fixture(tok):
    path = CASES_B / "mbpp/mbpp.jsonl"
    check_mbpp_jsonl(tok, path, 11)
    user, assistant = load_records(path)[0].conversation.messages
    assert user.content == ("Write a function to count the vowels in a string.\nYour code should pass these tests:\n\n"
                            "assert count_vowels('hello') == 2\nassert count_vowels('xyz') == 0\n"
                            "assert count_vowels('AEIOU') == 5")
    assert assistant.content == "def count_vowels(s):\n    return sum(1 for ch in s.lower() if ch in 'aeiou')"


def test_sanitized_mbpp_json_array():
    records = load_records(shared_file("data/mbpp/sanitized-mbpp.json"))
    assert len(records) == 427 and {r.format for r in records} == {"mbpp"}
    assert [r.line for r in records[:3]] == [1, 2, 3]  # record index in the array
    assert [r.task_id for r in records[:3]] == ["2", "3", "4"]  # the task identity decontamination keys on


def test_sanitized_mbpp_json_array_fixture(tok):
    path = CASES_B / "mbpp/sanitized-mbpp.json"
    assert path.read_text().startswith("[\n")  # a pretty-printed array, not JSON lines
    records = load_records(path)
    assert len(records) == 7 and {r.format for r in records} == {"mbpp"}
    assert [r.line for r in records[:3]] == [1, 2, 3]  # record index in the array
    assert [r.task_id for r in records] == ["2", "3", "11", "12", "511", "601", "602"]
    raw = json.loads(path.read_text())[2]
    assert records[2].conversation.messages[0].content == mbpp_prompt(raw["prompt"], raw["test_list"])  # "prompt"
    check_spans(tok, records)


def check_sharegpt_calls(tok, directory: Path, n: int, users: int, calls: int, with_tools: int) -> list:
    """A directory of ShareGPT function-calling records: calls, responses and tools kept, arguments as objects."""
    records = load_records(directory)  # a directory source
    assert len(records) == n and {r.format for r in records} == {"sharegpt"}
    msgs = [m for r in records for m in r.conversation.messages]
    assert sum(m.role == "user" for m in msgs) == users
    assert sum(m.function_call is not None for m in msgs) == calls
    assert sum(m.role == "function_response" for m in msgs) == calls
    assert sum(m.role == "assistant" and m.function_call is None for m in msgs) == users
    assert sum(bool(r.conversation.tools) for r in records) == with_tools  # the others list no tools ("[]")
    assert all(r.conversation.tools for r in records if any(m.function_call for m in r.conversation.messages))
    assert all(isinstance(m.function_call["arguments"], dict) for m in msgs if m.function_call)
    check_spans(tok, records)
    return records


def test_glaive_sharegpt_sample_keeps_calls_responses_and_tools(tok):
    check_sharegpt_calls(tok, shared_file("data/function_calling_glaive"), 300, 746, 211, 191)


def test_sharegpt_function_calling_fixture_keeps_calls_responses_and_tools(tok):
    records = check_sharegpt_calls(tok, CASES_B / "glaive_sharegpt", 12, 14, 10, 10)
    assert [m.role for m in records[1].conversation.messages] == ["user", "assistant", "function_response",
                                                                  "assistant"] * 2
    assert records[1].conversation.messages[5].function_call == {"name": "find_recipes", "arguments": {
        "ingredients": ["tofu"], "diet": "vegan"}}
    assert records[1].conversation.messages[2].content == '{"recipes": ["rice and beans", "burrito bowl"]}'
    assert [t["name"] for t in records[3].conversation.tools] == ["split_bill", "convert_units"]
    assert records[2].conversation.tools is None


def check_alpaca(tok, path: Path, count: int) -> list:
    """Alpaca records (``output`` or ``response``), from ``.json`` or ``.json.gz``: the input after a blank line."""
    records = load_records(path)
    assert len(records) == count and {r.format for r in records} == {"alpaca"}
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        raw = json.load(f)
    for r in records[:200]:
        row = raw[r.line - 1]
        user, assistant = r.conversation.messages
        given = row["input"]
        assert user.content == (f"{row['instruction']}\n\n{given}" if given.strip() else row["instruction"])
        assert assistant.content == row.get("output", row.get("response"))
    check_spans(tok, records[:100])
    return records


@pytest.mark.parametrize("name,count", [("code_alpaca_2k.json", 2017), ("new_codealpaca.json.gz", 4535)])
def test_code_alpaca_json_and_gzip(tok, name, count):
    check_alpaca(tok, shared_file(f"data/code_alpaca/{name}"), count)


@pytest.mark.parametrize("name,count,gz", [("instructions.json", 7, False), ("instructions_response.json", 4, True)])
def test_alpaca_json_and_gzip_fixture(tok, tmp_path, name, count, gz):
    path = CASES_B / "alpaca" / name
    if gz:  # the gzip of a .json array is read transparently
        path = tmp_path / (name + ".gz")
        with gzip.open(path, "wb") as f:
            f.write((CASES_B / "alpaca" / name).read_bytes())
    records = check_alpaca(tok, path, count)
    assert records[1].conversation.messages[0].content == \
        "Fix the bug in this function.\n\ndef inc(x):\n    return x - 1"
    assert records[2].conversation.messages[0].content == "Name the data structure used for FIFO queues in Python."
    assert records[3].conversation.messages[1].content == "set(nums)"


def test_gsm8k_question_answer_gzip(tok):
    records = load_records(shared_file("data/gsm8k/test.jsonl.gz"))
    assert len(records) == 1319 and {r.format for r in records} == {"qa"}
    user, assistant = records[0].conversation.messages
    assert user.content.startswith("Janet") and assistant.content.endswith("#### 18")
    check_spans(tok, records[:50])


def test_question_answer_jsonl_gzip_fixture(tok, tmp_path):
    path = tmp_path / "qa.jsonl.gz"
    with gzip.open(path, "wb") as f:
        f.write((CASES_B / "gsm8k/qa.jsonl").read_bytes())
    records = load_records(path)
    assert len(records) == 3 and {r.format for r in records} == {"qa"} and records[2].line == 3
    user, assistant = records[0].conversation.messages
    assert user.content == "Mira bakes 3 trays of 8 rolls and gives away 5 rolls. How many rolls are left?"
    assert assistant.content == "She bakes 3*8=<<3*8=24>>24 rolls.\nShe has 24-5=<<24-5=19>>19 left.\n#### 19"
    check_spans(tok, records)


def test_humaneval_shipped_with_codechat(tok):
    path = humaneval_file()
    assert path is not None, "codechat/data/shipped/HumanEval.jsonl.gz ships with codechat"
    records = load_records(path)
    assert len(records) == 164 and {r.format for r in records} == {"humaneval"}
    first = next(read_rows(path))[1]
    user, assistant = records[0].conversation.messages
    assert user.content == HUMANEVAL_PROMPT.format(prompt=first["prompt"])
    assert assistant.content == first["canonical_solution"].strip("\n").rstrip()  # the rest of the function
    assert assistant.content.startswith("    ") and "def has_close_elements" not in assistant.content
    check_spans(tok, records[:20])


def test_openai_messages_with_tool_calls_null_content_and_text_parts(tok):
    records = load_records(FIXTURES / "messages.jsonl")
    assert [r.format for r in records] == ["messages"] * 3
    tools_conv, text_call, plain = (r.conversation for r in records)
    assert [m.role for m in tools_conv.messages] == ["system", "user", "assistant", "assistant", "function_response",
                                                     "function_response", "assistant"]
    assert [m.function_call for m in tools_conv.messages[2:4]] == [
        {"name": "get_time", "arguments": {"city": "Lima"}}, {"name": "get_time", "arguments": {"city": "Quito"}}]
    assert tools_conv.messages[2].content == "" and tools_conv.tools[0]["name"] == "get_time"
    assert text_call.messages[0] == Message("system", "Use tools when needed.")  # developer -> system
    assert text_call.messages[1].content == "Add 2 and 3."  # text parts joined
    assert text_call.messages[2] == Message("assistant", "Let me compute that.", {"name": "add",
                                                                                 "arguments": {"a": 2, "b": 3}})
    assert text_call.tools == ({"name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "number"}, "b": {"type": "number"}}}},)
    assert [m.role for m in plain.messages] == ["user", "assistant"] * 2
    check_spans(tok, records)


def test_raw_glaive_fixture_splits_at_line_start_markers_only(tok):
    records = load_records(FIXTURES / "glaive_raw.jsonl")
    plain, call = (r.conversation for r in records)
    assert plain.tools is None
    assert plain.messages[0] == Message("system", "You are a helpful assistant, with no access to external functions.")
    assert plain.messages[-1].content == "def outer(x):\n    def inner():\n        return x\n    return inner"
    assert call.messages[1].content == "Convert 100 USD to EUR. Note: my text says ASSISTANT: hi mid-line."
    assert call.messages[2] == Message("assistant", "Sure.", {"name": "convert_currency",
                                                              "arguments": {"amount": 100, "from": "USD", "to": "EUR"}})
    assert [m.role for m in call.messages] == ["system", "user", "assistant", "function_response", "assistant"]
    assert call.tools[0]["name"] == "convert_currency"
    check_spans(tok, records)


def test_seed_spelling_of_calls_in_assistant_text_becomes_a_call():
    call = {"name": "f", "arguments": {"q": "it's"}}
    seed = """<functioncall> {"name": "f", "arguments": '{"q": "it's"}'}"""
    sharegpt = {"conversations": [{"from": "human", "value": "go"}, {"from": "gpt", "value": seed}]}
    assert to_conversation(sharegpt)[0].messages[1] == Message("assistant", "", call)
    messages = {"messages": [{"role": "user", "content": seed}, {"role": "assistant", "content": "Ok. " + seed}]}
    user, assistant = to_conversation(messages)[0].messages
    assert user == Message("user", seed) and assistant == Message("assistant", "Ok.", call)  # only assistant text
    with pytest.raises(FormatError, match="function-call marker but no valid call"):
        to_conversation({"messages": [{"role": "assistant", "content": "<functioncall> {broken"}]})


def test_prompt_completion_and_plain_text(tok):
    comp = load_records(FIXTURES / "completion.jsonl")
    assert comp[0].conversation.messages == (Message("user", "Reverse the string s in Python."),
                                             Message("assistant", "s[::-1]"))
    text = load_records(FIXTURES / "text.jsonl")
    # plain text: one assistant turn with no prompt, trained on entirely, like pretraining
    assert [r.format for r in text] == ["text", "text"]
    assert text[1].conversation.messages == (Message("assistant", "The separator is written <|endoftext|> and chat "
                                                                  "turns use <|user|>."),)
    ids, mask = render(tok, text[1].conversation)
    assert mask == [0, 0] + [1] * (len(ids) - 2)
    assert not set(ids[2:-1]) & tok.special_ids  # spelled specials stay text
    check_spans(tok, comp + text)


def test_a_record_that_fits_no_format_names_file_line_and_field():
    path = FIXTURES / "bad.jsonl"
    with pytest.raises(FormatError, match=r"bad.jsonl:2: alpaca record has no field 'output' or 'response'"):
        load_records(path)
    with pytest.raises(FormatError, match=r"record fits no format \(fields present: bar, foo\); each format needs"):
        to_conversation({"foo": 1, "bar": 2})
    counts = LoadCounts()
    records = load_records(path, skip_bad=True, counts=counts)
    assert [r.line for r in records] == [1, 5]
    assert counts.records == 2 and counts.skipped == {"missing_field": 1, "no_format": 1, "bad_json": 1}
    assert counts.examples[0].startswith(f"{path}:2:")


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.json"])
def test_json_past_what_the_decoder_takes_is_a_bad_line_not_a_crash(tmp_path, name):
    """A line nested 5000 deep or holding a 5000-digit integer is valid JSON that Python's decoder refuses:
    it is a bad_json record (skipped with skip_bad), in a file of JSON lines and as a whole .json file."""
    path = tmp_path / name
    path.write_text('{"prompt": "fine"}\n{"messages": ' + "[" * 5000 + "]" * 5000 + '}\n{"prompt": "x", "n": 1'
                    + "0" * 5000 + "}\n{\"prompt\": \"fine too\"}\n")
    counts = LoadCounts()
    records = load_records(path, skip_bad=True, counts=counts)
    assert [r.line for r in records] == [1, 4] and counts.skipped == {"bad_json": 2}
    with pytest.raises(FormatError, match=f"{name}:2: not valid JSON"):
        load_records(path)
    whole = tmp_path / "whole.json"
    whole.write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(FormatError, match="whole.json: not a valid JSON file"):
        load_records(whole)


def test_a_lone_surrogate_is_a_bad_record_naming_line_and_field(tmp_path, tok):
    """JSON's ``"\\ud800"`` decodes to a lone surrogate, which no UTF-8 text holds: the record (in
    content, in a call's arguments or in a tool schema) is invalid, not a crash in the tokenizer later."""
    path = tmp_path / "sft.jsonl"
    rows = ['{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok \\udc80"}]}',
            '{"messages": [{"role": "user", "content": "caf\\u00e9 \\ud83d\\ude00"}, {"role": "assistant", "content": "ok"}]}',
            '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "function_call": '
            '{"name": "f", "arguments": {"x": "\\ud800"}}}]}',
            '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}], '
            '"tools": [{"type": "function", "function": {"name": "t", "description": "\\udfff", "parameters": {}}}]}']
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(FormatError, match=r"sft.jsonl:1: .*assistant content holds a lone surrogate '\\udc80' at "
                                          r"character 3"):
        load_records(path)
    counts = LoadCounts()
    records = load_records(path, skip_bad=True, counts=counts)
    assert [r.line for r in records] == [2] and counts.skipped == {"invalid": 3}  # a paired emoji is fine
    assert "the function call holds" in counts.examples[1] and "tool 't' holds" in counts.examples[2]
    render(tok, records[0].conversation)  # what was kept encodes


def test_format_override_and_detection():
    assert detect_format({"messages": []}) == "messages"
    assert detect_format({"text": "x", "code": "y", "test_list": []}) == "mbpp"
    assert detect_format({"nothing": 1}) is None
    assert detect_format({"prompt": "x"}) == "prompt" and detect_format({"prompt": "x", "completion": "y"}) == "completion"
    records = load_records(FIXTURES / "completion.jsonl", format="completion")
    assert len(records) == 2
    with pytest.raises(FormatError, match="completion.jsonl:1: text record has no field 'text'"):
        load_records(FIXTURES / "completion.jsonl", format="text")
    with pytest.raises(FormatError, match="unknown format"):
        load_records(FIXTURES / "completion.jsonl", format="yaml")
    conv, fmt = to_conversation({"question": "1+1?", "answer": "2"})
    assert fmt == "qa" and conv.messages[1].content == "2"


def test_gzip_is_read_transparently_and_paths_are_checked(tmp_path):
    src = FIXTURES / "messages.jsonl"
    gz = tmp_path / "messages.jsonl.gz"
    with gzip.open(gz, "wb") as f:
        f.write(src.read_bytes())
    assert [r.conversation for r in load_records(gz)] == [r.conversation for r in load_records(src)]
    with pytest.raises(FormatError, match="does not exist"):
        load_records(tmp_path / "missing.jsonl")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(FormatError, match="unsupported file type"):
        load_records(tmp_path / "notes.txt")
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(FormatError, match="holds no"):
        load_records(empty_dir)


def test_parquet_reads_the_rows_and_needs_pyarrow(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "q", "answer": "a"}]), path)
    assert load_records(path)[0].conversation.messages[1].content == "a"
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # not installed
    with pytest.raises(FormatError, match=r"data.parquet: reading a .parquet file .* needs the `pyarrow` package, "
                                          r"which is not installed: pip install 'codechat\[data\]'"):
        load_records(path)


def test_a_directory_source_reads_every_data_file_sorted(tmp_path):
    shutil.copy(FIXTURES / "completion.jsonl", tmp_path / "b.jsonl")
    (tmp_path / "a.json").write_text(json.dumps([{"question": "q", "answer": "a"}]))
    (tmp_path / "README.md").write_text("ignored")
    records = load_records(tmp_path)
    assert [(Path(r.source).name, r.line) for r in records] == [("a.json", 1), ("b.jsonl", 1), ("b.jsonl", 2)]
