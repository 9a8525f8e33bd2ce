"""``codechat distill`` with the real ``codechat serve`` as its teacher (``served`` in conftest.py:
the tiny model taught one function-calling conversation), then ``codechat sft
--teacher-completions`` on what it kept.

Each prompt's outcome is checked against the engine run greedily in this process on the same
checkpoint and the same rendered prompt: a kept text answer is the engine's text, a kept call is
the call the model was taught, a rejection has the reason the engine's output earns (cut at
``max_tokens``; stopped at ``<|function_call|>`` with no tools declared). A call that does not
parse reaches distill as plain text (the server never puts ``<|function_call|>`` in ``content``),
so distill cannot tell it from an answer and keeps it. The usage stored with each answer is the rendered prompt's length and the engine's
token count, so the prompt the server rendered from distill's messages (history, calls and
tool responses included) is the one codechat renders from the record."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from codechat.chat.budget import render_with_budget
from codechat.chat.calls import FUNCTION_CALL_TOKEN, format_call, parse_reply_ids
from codechat.chat.conversation import Conversation, Message, render_for_completion
from codechat.checkpoint import load_model
from codechat.config.sft import SFTConfig
from codechat.data.formats import to_conversation
from codechat.data.prompts import read_answers
from codechat.data.teacher import DistillConfig, TeacherGenConfig, run_distill
from codechat.engine import Engine, EngineConfig, Request, SamplingConfig
from codechat.tools import load_executors

REPO = Path(__file__).resolve().parents[1]
MAX_TOKENS = 40  # the longest prompt below (208 ids) plus this fits the model's 256 positions
CALL = {"name": "weather", "arguments": {"city": "Tokyo"}}
HISTORY = [{"role": "user", "content": "Weather in Tokyo?"},
           {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type": "function", "function": {
               "name": "weather", "arguments": '{"city": "Tokyo"}'}}]},
           {"role": "tool", "tool_call_id": "call_0", "content": '{"temp_c": 21}'},
           {"role": "assistant", "content": "It is 21 C in Tokyo."},
           {"role": "user", "content": "And in Oslo?"}]
#: id -> (record fields, with the tools?, the outcome the engine's greedy answer earns)
RECORDS = {
    "hi": ({"prompt": "Say hi"}, False, "text"),
    "brief": ({"prompt": "hello", "system": "Be brief."}, False, "length"),
    "notools": ({"prompt": "Weather in Tokyo?"}, False, "empty_content"),  # it starts a call nobody declared
    "call": ({"messages": [{"role": "user", "content": "Weather in Tokyo?"}]}, True, "call"),
    "history": ({"messages": HISTORY + [{"role": "assistant", "content": "not part of the prompt"}]}, True, "text"),
    "broken": ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                             {"role": "user", "content": "Weather in Tokyo?"}]}, True, "unparsed_call"),
}


@pytest.fixture(scope="module")
def greedy(served, funcall_stage):
    """``greedy(conversation) -> (prompt ids, generated ids, finish)``: the served checkpoint's engine in
    this process, stopping where the server stops (any control id, ``<|function_call|>`` too unless tools)."""
    model, tok, _ = load_model(served.stage)
    engine = Engine(model, EngineConfig(slots=4))
    fc = tok.special_id(FUNCTION_CALL_TOKEN)

    def run(conv: Conversation):
        prompt = render_for_completion(tok, conv)
        stop = sorted(tok.special_ids - ({fc} if conv.tools else set()))
        [[s]] = engine.generate([Request(prompt, SamplingConfig(MAX_TOKENS, 0.0, 0, 1.0), seed=0, stop_ids=stop)])
        return prompt, list(s.token_ids), s.finish
    run.tok, run.max_len = tok, engine.max_len
    return run


def _lines(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def test_distill_from_codechat_serve_keeps_the_engines_greedy_answers_then_sft_trains_on_them(
        served, funcall_stage, greedy, tmp_path, monkeypatch):
    tok = greedy.tok
    [tool] = load_executors(funcall_stage[1])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": pid, **rec, **({"tools": [tool.schema()]} if tools else {})}) + "\n"
                               for pid, (rec, tools, _) in RECORDS.items()))
    out = tmp_path / "distill"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPENAI_API_KEY": served.api_key}
    p = subprocess.run([sys.executable, "-m", "codechat", "distill", "--prompts", str(prompts), "--base-url",
                        served.url + "/v1", "--model", "codechat", "--out", str(out), "--temperature", "0",
                        "--max-tokens", str(MAX_TOKENS), "--concurrency", "4"], env=env, capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert served.api_key not in p.stdout + p.stderr + "".join(f.read_text() for f in out.iterdir() if f.is_file())

    kept = {r["id"]: r for r in _lines(out / "completions.jsonl")}
    rejected = {r["id"]: r for r in _lines(out / "rejected.jsonl")}
    assert len(kept) + len(rejected) == len(_lines(out / "completions.jsonl")) + len(_lines(out / "rejected.jsonl"))
    assert sorted([*kept, *rejected]) == sorted(RECORDS)  # every prompt answered exactly once
    tokens = {"prompt": 0, "completion": 0}
    for pid, (rec, tools, outcome) in RECORDS.items():
        conv, _ = to_conversation({**rec, **({"tools": [tool.schema()]} if tools else {})})
        if pid == "history":
            conv = Conversation(conv.messages[:-1], conv.tools)  # the prompt ends at the last user turn
        prompt, ids, finish = greedy(conv)
        line = kept.get(pid) or rejected[pid]
        assert line["usage"]["prompt_tokens"] == len(prompt), pid  # the server rendered the same prompt
        assert line["usage"]["completion_tokens"] == len(ids), pid
        tokens["prompt"] += len(prompt)
        tokens["completion"] += len(ids)
        reply = parse_reply_ids(tok, ids)
        if outcome == "text":
            assert finish == "stop" and reply.call is None and reply.content.strip(), (pid, ids)
            assert line["answer"] == [{"role": "assistant", "content": reply.content.strip()}], pid
        elif outcome == "call":  # the model's own call, as it was taught
            assert ids == [tok.special_id(FUNCTION_CALL_TOKEN), *tok.encode(format_call(CALL)), tok.end_id]
            assert line["answer"] == [{"role": "assistant", "content": "", "function_call": CALL}]
            assert line["finish_reason"] == "tool_calls"
        elif outcome == "unparsed_call":  # its text without the <|function_call|> id: kept as an answer
            assert ids[0] == tok.special_id(FUNCTION_CALL_TOKEN) and reply.call is None and reply.error
            text = tok.decode([t for t in ids if t not in tok.special_ids]).strip()
            assert finish == "stop" and line["answer"] == [{"role": "assistant", "content": text}], pid
        else:
            assert line["reason"] == outcome and line["final"] is True, (pid, line)
            if outcome == "length":
                assert finish == "length" and len(ids) == MAX_TOKENS
                assert line["message"]["content"] == tok.decode(ids)
            else:  # empty_content
                assert ids == [tok.special_id(FUNCTION_CALL_TOKEN)]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kept"] == 4 and summary["rejected"] == {"length": 1, "empty_content": 1}
    assert (summary["failed"], summary["pending"], summary["prompts"]) == ({}, 0, len(RECORDS))
    assert summary["tokens"] == tokens and summary["this_run"]["requests"] == len(RECORDS)
    assert summary["this_run"]["retries"] == {} and summary["teacher"]["temperature"] == 0.0

    before = {f: (out / f).read_bytes() for f in ("completions.jsonl", "rejected.jsonl")}
    monkeypatch.setenv("OPENAI_API_KEY", served.api_key)
    teacher = TeacherGenConfig(temperature=0.0, max_tokens=MAX_TOKENS, concurrency=4)
    again = run_distill(DistillConfig(prompts=str(prompts), base_url=served.url + "/v1", model="codechat",
                                      out=str(out), teacher=teacher), show_progress=False, say=lambda *_: None)
    assert again["this_run"]["requests"] == 0 and again["this_run"]["skipped"] == len(RECORDS)  # nothing asked again
    assert {f: (out / f).read_bytes() for f in before} == before and again["tokens"] == tokens

    answered = tmp_path / "answered.jsonl"  # the kept prompts: every one of them has an answer
    answered.write_text("".join(ln + "\n" for ln in prompts.read_text().splitlines()
                                if json.loads(ln)["id"] in kept))
    p = subprocess.run([sys.executable, "-m", "codechat", "sft", "--device", "cpu", "--init", str(served.stage),
                        "--data", str(answered), "--teacher-completions", str(out / "completions.jsonl"),
                        "--out", str(tmp_path / "sft"), "--max-steps", "2", "--sft.decontaminate", "false",
                        "--train.micro_batch_size", "2"], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    cfg = SFTConfig(decontaminate=False).for_model(greedy.max_len)  # as sft resolves it
    answers = read_answers(out / "completions.jsonl")
    rendered = []
    for ln in answered.read_text().splitlines():
        conv, _ = to_conversation(json.loads(ln))
        last = max(k for k, m in enumerate(conv.messages) if m.role == "user")
        rendered.append(render_with_budget(tok, Conversation(conv.messages[:last + 1] + answers[json.loads(ln)["id"]],
                                                             conv.tools), cfg))
    report = json.loads((tmp_path / "sft" / "data_report.json").read_text())["preflight"]
    assert (report["seen"], report["kept"]) == (4, 4)
    assert report["tokens"] == sum(len(r.ids) for r in rendered)  # trained on the prompts plus the teacher's answers
    assert report["supervised_tokens"] == sum(sum(r.mask) for r in rendered)
    assert Message("assistant", "", CALL) in answers["call"]
