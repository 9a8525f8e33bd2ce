"""Function-calling evaluation: splits, scoring, and the whole suite with an oracle generator.

The glaive sample comes from ``shared/`` (those tests skip, saying what is missing, when it is absent);
each of them also runs on the project's own glaive-style ``tests/fixtures/cases_a/glaive_mini.json``
(12 conversations in the same layout: 8 train, 4 held out, 11 call turns, one conversation without a call)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from codechat.chat.calls import FUNCTION_CALL_TOKEN
from codechat.chat.conversation import Message
from codechat.data.benchmarks import conversation_split as split_of
from codechat.engine import Sample
from codechat.eval.funcall import load_cases, normalize_value, run_funcall_suite, score_case

from conftest import FIXTURES, hide_module

GLAIVE_REL = "data/function_calling_glaive/glaive_toolcall_en_demo.json"
MINI_GLAIVE = FIXTURES / "cases_a" / "glaive_mini.json"
#: conversation_split of each conversation of MINI_GLAIVE, in file order (a pure function of the record)
MINI_SPLITS = ["train", "heldout", "train", "heldout", "train", "train", "train", "train", "train", "heldout",
               "heldout", "train"]
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
           "required": ["city"]}


def check_splits(glaive: Path, n_heldout: int, n_train: int, tmp_path: Path) -> list[dict]:
    records = json.loads(glaive.read_text())
    splits = [split_of(r) for r in records]
    assert splits.count("heldout") == n_heldout and splits.count("train") == n_train
    assert splits == [split_of(json.loads(json.dumps(r))) for r in records]  # a pure function of the record
    held, train = load_cases(glaive, "heldout"), load_cases(glaive, "train")
    lines = lambda cs: {c["id"].split(":")[0] for c in cs}  # noqa: E731
    assert not lines(held) & lines(train) and len(lines(held)) == n_heldout
    with pytest.raises(ValueError, match="split"):
        load_cases(glaive, "test")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(records[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):  # FormatError names file and line
        load_cases(bad, "heldout")
    from codechat.config.sft import SFTConfig
    from codechat.data.mixture import load_source
    from codechat.data.spec import parse_spec
    [spec] = parse_spec(f"{glaive}@train:2")
    assert (spec.split, spec.weight) == ("train", 2.0)
    assert len(load_source(spec, SFTConfig())) == n_train  # SFT on @train never sees a held-out conversation
    return held


def test_the_glaive_sample_splits_by_hash_into_238_train_and_62_heldout_conversations(shared_dir, tmp_path):
    held = check_splits(shared_dir / GLAIVE_REL, 62, 238, tmp_path)
    assert sum(c["expected"].function_call is not None for c in held) > 30


def test_the_mini_glaive_file_splits_by_hash_into_8_train_and_4_heldout_conversations(tmp_path):
    held = check_splits(MINI_GLAIVE, 4, 8, tmp_path)
    assert [split_of(r) for r in json.loads(MINI_GLAIVE.read_text())] == MINI_SPLITS  # the rule itself is pinned
    # held out: lines 2, 4, 10, 11; a case per assistant turn, calls and answers alike
    assert [c["id"] for c in held] == ["2:1", "2:3", "2:5", "4:1", "4:3", "10:1", "11:1", "11:3", "11:5", "11:7"]
    calls = [c["expected"].function_call for c in held if c["expected"].function_call is not None]
    assert calls == [{"name": "monthly_payment", "arguments": {"principal": 12000, "annual_rate": 6, "months": 24}},
                     {"name": "set_timer", "arguments": {"minutes": 12, "label": "pasta"}},
                     {"name": "find_books", "arguments": {"author": "Octavia Butler"}},
                     {"name": "stock_quote", "arguments": {"symbol": "BOOK"}}]
    assert [len(c["conversation"].messages) for c in held[-4:]] == [1, 3, 5, 7]
    assert [c["id"] for c in load_cases(MINI_GLAIVE, "heldout", limit=2)] == ["2:1", "2:3", "2:5", "4:1", "4:3"]
    assert len(load_cases(MINI_GLAIVE, "all")) == 26


def test_arguments_match_after_normalisation_and_not_otherwise():
    want = Message("assistant", "", {"name": "weather", "arguments": {"city": "Tokyo", "days": 2}})
    tools = {"weather": WEATHER}
    same = {"name": "weather", "arguments": {"days": 2.0, "city": " Tokyo "}}  # 2.0 is an integer in JSON Schema
    assert score_case(want, "", same, True, tools) == {"kind": "call", "parsed": True, "schema_valid": True,
                                                       "name_correct": True, "arguments_exact": True,
                                                       "invalid_reason": None}
    as_text = {"name": "weather", "arguments": {"city": "Tokyo", "days": "2"}}
    assert score_case(want, "", as_text, True, tools) == {"kind": "call", "parsed": True, "schema_valid": False,
                                                          "name_correct": True, "arguments_exact": True,
                                                          "invalid_reason": "days: '2' is not of type 'integer'"}
    assert normalize_value("2", {"type": "number"}) == normalize_value(2, {"type": "number"}) == 2.0
    assert normalize_value("2", {"type": "string"}) == "2"
    other = score_case(want, "", {"name": "weather", "arguments": {"city": "Kyoto"}}, True, tools)
    assert other["schema_valid"] and other["name_correct"] and not other["arguments_exact"]
    wrong = score_case(want, "", {"name": "forecast", "arguments": {"city": "Tokyo", "days": 2}}, True, tools)
    assert not wrong["name_correct"] and not wrong["arguments_exact"] and "undeclared" in wrong["invalid_reason"]
    assert score_case(want, "sure", None, True, tools)["parsed"] is False
    text = Message("assistant", "It is sunny.")
    assert score_case(text, "It is sunny.", None, False, tools) == {"kind": "text", "no_call": True}
    assert score_case(text, "", None, True, tools)["no_call"] is False  # a broken call is still a call


class Oracle:
    """An engine stand-in that answers every case with ``answer(expected message)`` as token ids."""

    max_len = 4096

    def __init__(self, tok, cases, answer) -> None:
        self.tok, self.replies = tok, [answer(c["expected"]) for c in cases]

    def generate(self, requests):
        assert len(requests) == len(self.replies)
        return [[Sample(token_ids=ids + [self.tok.end_id], finish="stop")] for ids in self.replies]


def check_perfect_and_mute(glaive: Path, tok, tmp_path: Path) -> tuple[dict, dict]:
    cases = load_cases(glaive, "heldout", limit=12)
    fc = tok.special_id(FUNCTION_CALL_TOKEN)

    def perfect(m):
        ids = tok.encode(m.content) if m.content else []
        return ids + ([fc] + tok.encode(json.dumps(m.function_call)) if m.function_call else [])
    res = run_funcall_suite(Oracle(tok, cases, perfect), tok, path=glaive, out_dir=tmp_path, limit=12)
    assert res["call_turns"] > 0 and res["text_turns"] > 0
    assert res["parse_rate"] == res["name_accuracy"] == res["arguments_exact_match"] == res["no_call_accuracy"] == 1.0
    assert res["schema_valid_rate"] >= 0.9
    rows = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == len(cases) and json.loads((tmp_path / "results.json").read_text())["cases"] == len(cases)
    mute = run_funcall_suite(Oracle(tok, cases, lambda m: tok.encode("I cannot help.")), tok, path=glaive,
                             out_dir=tmp_path / "mute", limit=12)
    assert mute["parse_rate"] == mute["name_accuracy"] == 0.0 and mute["no_call_accuracy"] == 1.0
    return res, mute


def test_the_suite_scores_a_perfect_model_100_and_a_model_that_never_calls_0(shared_dir, tok, tmp_path):
    check_perfect_and_mute(shared_dir / GLAIVE_REL, tok, tmp_path)


def test_the_suite_scores_a_perfect_model_100_and_a_model_that_never_calls_0_on_the_mini_file(tok, tmp_path):
    res, mute = check_perfect_and_mute(MINI_GLAIVE, tok, tmp_path)
    assert (res["call_turns"], res["text_turns"]) == (4, 6) and res["schema_valid_rate"] == 1.0
    assert (mute["call_turns"], mute["arguments_exact_match"]) == (4, 0.0)


class NoGeneration:
    """An engine stand-in that must not be asked to generate."""

    max_len = 4096

    def generate(self, requests):
        raise AssertionError("generated into an OUT holding results made with other settings")


def check_rerun_refused(glaive: Path, tok, tmp_path: Path) -> None:
    cases = load_cases(glaive, "heldout", limit=2)
    mute = Oracle(tok, cases, lambda m: tok.encode("I cannot help."))
    kw = dict(path=glaive, out_dir=tmp_path, limit=2, max_new_tokens=32, model_id="a@1")
    first = run_funcall_suite(mute, tok, **kw)
    assert json.loads((tmp_path / "run.json").read_text())["limit"] == 2
    results = (tmp_path / "results.json").read_text()
    for change, shown in [({"limit": 3}, "limit 2 -> 3"), ({"split": "train"}, "split 'heldout' -> 'train'"),
                          ({"max_new_tokens": 64}, "max_new_tokens 32 -> 64"), ({"model_id": "b@2"}, "'a@1' -> 'b@2'")]:
        with pytest.raises(ValueError, match=f"{tmp_path} holds samples made with other settings .*{shown}"):
            run_funcall_suite(NoGeneration(), tok, **{**kw, **change})
    assert (tmp_path / "results.json").read_text() == results  # nothing was overwritten
    again = run_funcall_suite(mute, tok, **kw)  # the same settings: generated again and rewritten
    assert {k: v for k, v in again.items() if k != "timing"} == {k: v for k, v in first.items() if k != "timing"}
    other = tmp_path / "he"  # a HumanEval OUT is not reused for function calling either
    other.mkdir()
    (other / "run.json").write_text(json.dumps({"suite": "humaneval"}))
    (other / "samples.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="other settings .*suite 'humaneval' -> 'funcall:"):
        run_funcall_suite(NoGeneration(), tok, **{**kw, "out_dir": other})


def test_a_rerun_into_an_out_with_other_settings_is_refused_before_generating(shared_dir, tok, tmp_path):
    check_rerun_refused(shared_dir / GLAIVE_REL, tok, tmp_path)


def test_a_rerun_into_an_out_with_other_settings_is_refused_before_generating_on_the_mini_file(tok, tmp_path):
    check_rerun_refused(MINI_GLAIVE, tok, tmp_path)


def test_a_bad_record_error_of_eval_suggests_no_flag_eval_lacks(tmp_path, capsys):
    from codechat.cli import main
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
                   + "\n" + json.dumps({"foo": 1}) + "\n")
    code = main(["eval", "run", "--model", str(tmp_path / "nowhere"), "--suite", f"funcall:{bad}", "--split", "all",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and f"{bad}:2: record fits no format" in err, err
    assert "skip" not in err  # `codechat eval` has no --skip-bad


# ----------------------------------------------------------------------------- strict decoding (--strict)
def taught_conversation(path: Path, executors: Path) -> Path:
    """``path``: funcall_stage's one conversation (call weather(Tokyo), read 21, say so) in OpenAI's layout."""
    from codechat.tools import load_executors
    [tool] = load_executors(executors)
    path.write_text(json.dumps({"tools": [{"type": "function", "function": tool.schema()}], "messages": [
        {"role": "user", "content": "Weather in Tokyo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Tokyo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp_c": 21}'},
        {"role": "assistant", "content": "It is 21 C in Tokyo."}]}) + "\n")
    return path


def eval_run(model, data: Path, out: Path, *args: str) -> int:
    from codechat.cli import main
    return main(["eval", "run", "--model", str(model), "--suite", f"funcall:{data}", "--split", "all", "--out", str(out),
                 "--device", "cpu", "--max-new-tokens", "40", *args])


def test_strict_both_writes_the_free_and_the_strict_figures_and_every_strict_call_validates(funcall_stage, tmp_path,
                                                                                            capsys):
    pytest.importorskip("llguidance", reason="the grammar extra (llguidance) is not installed")
    import jsonschema
    stage, executors = funcall_stage
    data = taught_conversation(tmp_path / "taught.jsonl", executors)
    assert eval_run(stage, data, tmp_path / "both", "--strict", "both") == 0
    printed = capsys.readouterr().out
    assert "  free:   parse 100.0%" in printed and "  strict: parse 100.0%" in printed, printed
    res = json.loads((tmp_path / "both" / "results.json").read_text())
    assert (res["call_turns"], res["text_turns"], res["settings"]["strict"]) == (1, 1, "both")
    s = res["strict"]
    assert (s["call_turns"], s["parse_rate"], s["schema_valid_rate"], s["grammar_errors"]) == (1, 1.0, 1.0, 0)
    assert res["parse_rate"] == 1.0 and s["no_call_accuracy"] == 1.0  # the text turn stays text under auto
    rows = [json.loads(x) for x in (tmp_path / "both" / "samples.jsonl").read_text().splitlines()]
    assert [r["strict"] for r in rows] == [False, False, True, True]
    [call] = [r["call"] for r in rows if r["strict"] and r["kind"] == "call"]
    jsonschema.validate(call["arguments"], json.loads(data.read_text())["tools"][0]["function"]["parameters"])
    # on: the strict pass only; its rates under "strict", the counts at the top
    assert eval_run(stage, data, tmp_path / "on", "--strict", "on") == 0
    on = json.loads((tmp_path / "on" / "results.json").read_text())
    assert "parse_rate" not in on and on["call_turns"] == 1 and on["strict"]["parse_rate"] == 1.0
    assert "  free:" not in capsys.readouterr().out


def test_asked_about_other_tools_the_taught_model_writes_broken_calls_free_and_valid_ones_strict(funcall_stage, tmp_path):
    """funcall_stage's model on the mini glaive file (tools it never saw): free, its calls do not parse;
    under the grammar every call it starts names a declared tool and validates."""
    pytest.importorskip("llguidance", reason="the grammar extra (llguidance) is not installed")
    from codechat.checkpoint import load_model
    from codechat.engine import Engine
    stage, _ = funcall_stage
    model, tok, _ = load_model(stage, "cpu")
    res = run_funcall_suite(Engine(model), tok, path=MINI_GLAIVE, out_dir=tmp_path, max_new_tokens=32, strict="both")
    strict = res["strict"]
    assert strict["grammar_errors"] == 0 and strict["parse_rate"] > res["parse_rate"]
    assert strict["schema_valid_rate"] == strict["parse_rate"]
    rows = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert any("<|function_call|>" in r["content"] for r in rows if not r["strict"])  # free: broken calls
    assert not any("<|function_call|>" in r["content"] for r in rows if r["strict"])  # strict: none


def test_strict_errors_are_one_line(funcall_stage, tmp_path, capsys, monkeypatch):
    from codechat.cli import main
    stage, executors = funcall_stage
    code = main(["eval", "run", "--model", str(tmp_path / "nowhere"), "--suite", "humaneval", "--strict", "on",
                 "--out", str(tmp_path / "he")])
    err = capsys.readouterr().err
    assert code == 2 and "--strict on applies to --suite funcall:PATH only, not humaneval" in err, err
    with pytest.raises(SystemExit):
        main(["eval", "run", "--model", "m", "--suite", "humaneval", "--strict", "maybe", "--out", str(tmp_path)])
    assert "invalid choice: 'maybe'" in capsys.readouterr().err
    hide_module(monkeypatch, "llguidance")
    data = taught_conversation(tmp_path / "taught.jsonl", executors)
    assert eval_run(stage, data, tmp_path / "out", "--strict", "both") == 2
    err = capsys.readouterr().err
    assert "pip install 'codechat[grammar]'" in err and len(err.strip().splitlines()) == 1, err
