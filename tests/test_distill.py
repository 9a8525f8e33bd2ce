"""codechat distill against a fault-injecting OpenAI-compatible server of the test's own, and
codechat sft --teacher-completions on what it wrote.

The server (stdlib ``http.server`` on 127.0.0.1, in a thread) reads what to do from each
prompt: ``PID|ACTION,ACTION,...``, one action per attempt at that prompt (the last one
repeats): ``ok``, ``429`` (``Retry-After: 1``), ``429ms`` (``retry-after-ms: 300``), ``500``,
``drop`` (the connection closed without an answer), ``slow`` (an answer after the client's
timeout), ``garbage`` (a 200 that is not JSON), ``length``, ``filter``, ``nochoices``,
``empty``, ``think``, ``toolnull`` (tool calls with ``content: null``), ``badargs`` (a call
whose arguments are cut), ``echo400`` (a 400 whose message repeats the Authorization header).
An ``ok`` answer to a prompt in ``FaultServer.hold`` waits until the test sets ``release``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from codechat import checkpoint as ckpt
from codechat.cli import main
from codechat.config.sft import SFTConfig
from codechat.config.stages import ConfigError, ModelConfig, to_dict
from codechat.data.formats import FormatError
from codechat.data.mixture import Mixture
from codechat.data.prompts import jsonl_rows, read_answers
from codechat.data.teacher import DistillConfig, TeacherGenConfig, judge, retry_after, run_distill
from codechat.data.teacher_store import AnswerStore, repair_tail
from codechat.model import build_model

KEY = "sk-test-5ecret-Q7xZ"
REPO = Path(__file__).resolve().parents[1]
WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


class FaultServer:
    """An OpenAI-compatible ``POST /v1/chat/completions`` whose answer to each attempt is named in the prompt."""

    def __init__(self, slow_s: float = 1.5) -> None:
        self.attempts: Counter = Counter()
        self.log: list[tuple[str, str, float]] = []  # (prompt id, action, time)
        self.auth: set[str] = set()
        self.bodies: dict[str, dict] = {}
        self.lock = threading.Lock()
        self.slow_s = slow_s
        self.hold: frozenset[str] = frozenset()  # prompt ids whose ok answers wait for release (the test sets both)
        self.release = threading.Event()
        self.held = 0  # requests that have waited for release so far
        self.held_changed = threading.Condition()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def send(self, status, obj, headers=()):
                body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in headers:
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                auth = self.headers.get("Authorization", "")
                if auth != f"Bearer {KEY}":
                    return self.send(401, {"error": {"message": "bad key", "type": "invalid_request_error"}})
                text = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
                pid, _, plan = text.partition("|")
                with server.lock:
                    n = server.attempts[pid]
                    server.attempts[pid] += 1
                    actions = plan.split(",")
                    action = actions[min(n, len(actions) - 1)]
                    server.log.append((pid, action, time.monotonic()))
                    server.auth.add(auth)
                    server.bodies[pid] = body
                server.act(self, pid, action, auth)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @staticmethod
    def completion(message, finish="stop", usage=(10, 5)):
        return {"id": "cmpl-1", "object": "chat.completion", "created": 0, "model": "fault-teacher",
                "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
                "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}}

    def act(self, h, pid, action, auth):
        call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        if action == "ok":
            if pid in self.hold and not self.release.is_set():
                with self.held_changed:
                    self.held += 1
                    self.held_changed.notify_all()
                self.release.wait()
            return h.send(200, self.completion({"content": f"answer to {pid}"}))
        if action in ("429", "429ms"):
            wait = ("Retry-After", "1") if action == "429" else ("retry-after-ms", "300")
            return h.send(429, {"error": {"message": "slow down", "type": "rate_limit"}}, [wait])
        if action == "500":
            return h.send(500, {"error": {"message": "boom", "type": "server_error"}})
        if action == "drop":
            h.close_connection = True
            return h.connection.close()
        if action == "slow":
            time.sleep(self.slow_s)
            return h.send(200, self.completion({"content": f"late answer to {pid}"}))
        if action == "garbage":
            return h.send(200, b"<html>not json</html>")
        if action == "echo400":
            return h.send(400, {"error": {"message": f"context too long; you sent {auth}", "type": "invalid"}})
        if action == "nochoices":
            return h.send(200, {**self.completion({"content": "x"}), "choices": []})
        message, finish = {
            "length": ({"content": "a cut answ"}, "length"),
            "filter": ({"content": ""}, "content_filter"),
            "empty": ({"content": "   "}, "stop"),
            "think": ({"content": "<think>secret plan</think>\n\nThe answer."}, "stop"),
            "toolnull": ({"content": None, "tool_calls": [call, {**call, "id": "call_2", "function": {
                "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}, "tool_calls"),
            "badargs": ({"content": None, "tool_calls": [{**call, "function": {"name": "get_weather",
                                                                               "arguments": '{"city": "Par'}}]},
                        "tool_calls"),
        }[action]
        h.send(200, self.completion(message, finish))

    def wait_held(self, n: int, timeout: float = 120) -> None:
        """Return once ``n`` requests in all have waited for ``release``; fails after ``timeout`` seconds."""
        with self.held_changed:
            assert self.held_changed.wait_for(lambda: self.held >= n, timeout), f"{self.held} of {n} requests held"

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = FaultServer()
    yield s
    s.close()


def write_prompts(path: Path, plans: dict[str, str], tools_for: tuple[str, ...] = ()) -> Path:
    """One record per prompt id: ``prompt`` records, or ``messages`` with tools for ``tools_for``."""
    with open(path, "w") as f:
        for pid, plan in plans.items():
            if pid in tools_for:
                rec = {"id": pid, "messages": [{"role": "user", "content": f"{pid}|{plan}"}], "tools": [WEATHER]}
            else:
                rec = {"id": pid, "prompt": f"{pid}|{plan}"}
            f.write(json.dumps(rec) + "\n")
    return path


def lines(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def assert_no_key(*texts_or_dirs) -> None:
    for t in texts_or_dirs:
        if isinstance(t, Path):
            for f in t.rglob("*"):
                if f.is_file():
                    assert KEY not in f.read_text(errors="replace"), f
        else:
            assert KEY not in t


PLANS = {"ok": "ok", "r429": "429,ok", "r429ms": "429ms,429ms,ok", "r500": "500,500,ok", "drop": "drop,ok",
         "slow": "slow,ok", "garbage": "garbage,ok", "length": "length", "filter": "filter", "nochoices": "nochoices",
         "empty": "empty", "think": "think", "tools": "toolnull", "badargs": "badargs", "echo": "echo400",
         "down": "500,500,500,500,ok"}


def fault_config(server, prompts, out, **teacher):
    gen = dict(concurrency=4, retries=3, backoff_base_s=0.01, request_timeout_s=0.6, connect_timeout_s=2.0)
    return DistillConfig(prompts=str(prompts), base_url=server.url, model="fault-teacher", out=str(out),
                         teacher=TeacherGenConfig(**{**gen, **teacher}))


def test_faults_end_complete_once_each_with_rejections_counted_by_reason(server, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    prompts = write_prompts(tmp_path / "prompts.jsonl", PLANS, tools_for=("tools", "badargs"))
    out = tmp_path / "out"
    s = run_distill(fault_config(server, prompts, out), show_progress=False)
    kept = {r["id"]: r for r in lines(out / "completions.jsonl")}
    assert len(kept) == len(lines(out / "completions.jsonl"))  # no prompt answered twice
    assert set(kept) == {"ok", "r429", "r429ms", "r500", "drop", "slow", "garbage", "think", "tools"}
    assert kept["r500"]["answer"] == [{"role": "assistant", "content": "answer to r500"}]
    assert kept["slow"]["answer"][0]["content"] == "answer to slow"  # the late answer was given up on
    assert kept["think"]["answer"] == [{"role": "assistant", "content": "The answer."}]
    assert kept["tools"]["answer"] == [  # content null: one function-call turn per call
        {"role": "assistant", "content": "", "function_call": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"role": "assistant", "content": "", "function_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]
    assert server.bodies["tools"]["tools"] == [{"type": "function", "function": WEATHER}]
    assert (server.bodies["ok"]["temperature"], server.bodies["ok"]["top_p"]) == (1.0, 0.95)
    rejected = {r["id"]: r for r in lines(out / "rejected.jsonl")}
    assert {k: (r["reason"], r["final"]) for k, r in rejected.items()} == {
        "length": ("length", True), "filter": ("content_filter", True), "nochoices": ("empty_choices", True),
        "empty": ("empty_content", True), "badargs": ("bad_tool_arguments", True), "echo": ("bad_request", True),
        "down": ("server_error", False)}
    assert rejected["length"]["message"]["content"] == "a cut answ"  # the rejected answer itself is kept
    assert s["rejected"] == {"length": 1, "content_filter": 1, "empty_choices": 1, "empty_content": 1,
                             "bad_tool_arguments": 1, "bad_request": 1}
    assert (s["kept"], s["failed"], s["pending"], s["prompts"]) == (9, {"server_error": 1}, 1, 16)
    assert s["this_run"]["retries"] == {"rate_limited": 3, "server_error": 5, "connection_error": 1, "timeout": 1,
                                        "bad_response": 1}
    answered = 9 + 5  # every 200 with usage: the kept ones and the rejected answers (nochoices included)
    assert s["tokens"] == {"prompt": 10 * answered, "completion": 5 * answered}
    assert json.loads((out / "summary.json").read_text())["kept"] == 9
    times = defaultdict(list)
    for pid, _, t in server.log:
        times[pid].append(t)
    assert times["r429"][1] - times["r429"][0] >= 0.95  # Retry-After: 1, though the back-off base is 0.01 s
    assert all(b - a >= 0.28 for a, b in zip(times["r429ms"], times["r429ms"][1:]))  # retry-after-ms: 300
    assert server.auth == {f"Bearer {KEY}"}  # the key was sent ...
    assert "[api key]" in rejected["echo"]["detail"]
    assert_no_key(out, capsys.readouterr().out)  # ... and never written, even when the server echoes it

    asked = Counter(server.attempts)
    s = run_distill(fault_config(server, prompts, out), show_progress=False)  # a rerun asks only what failed
    assert server.attempts - asked == Counter({"down": 1})
    assert (s["kept"], s["failed"], s["pending"]) == (10, {}, 0)
    assert s["this_run"]["skipped"] == 15 and [r["id"] for r in lines(out / "completions.jsonl")].count("down") == 1
    with pytest.raises(ConfigError, match="another teacher setting"):
        run_distill(fault_config(server, prompts, out, temperature=0.5), show_progress=False)


def distill_cli(server, prompts, out, cwd):
    """``codechat distill`` in a child process, 3 requests at a time, with SIGINT at its default as in a
    terminal. This suite run as a script's background job (``bash scripts/test.sh &``) has SIGINT ignored, and
    a child inherits an ignored signal (exec resets only handled ones), so SIGINT is handled while it starts."""
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env["PYTHONPATH"] = str(REPO)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen([sys.executable, "-m", "codechat", "distill", "--prompts", str(prompts), "--base-url",
                                 server.url, "--model", "fault-teacher", "--out", str(out), "--concurrency", "3",
                                 "--teacher.backoff_base_s", "0.01"], cwd=cwd, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    finally:
        signal.signal(signal.SIGINT, before)


def stop(proc, sig: int, within_s: float = 10) -> tuple[str, str]:
    """Send ``sig`` to ``proc``; its stdout and stderr once it exited, failing if that took over ``within_s``."""
    proc.send_signal(sig)
    try:
        return proc.communicate(timeout=within_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"codechat distill still ran {within_s} s after signal {sig}: {proc.communicate()[1][-3000:]}")


def test_ctrl_c_and_kill_9_with_requests_in_flight_then_rerun_lose_nothing_and_duplicate_nothing(tmp_path):
    # Each stop comes once the 3 workers all wait on answers the teacher holds, so what is written by then is
    # known exactly however slowly this test is scheduled: every prompt before the held ones, nothing after.
    server = FaultServer()
    ids = [f"p{i:02d}" for i in range(40)]
    try:
        (tmp_path / ".env").write_text(f"OPENAI_API_KEY={KEY}\n")  # the key from ./.env, not the environment
        plans = {pid: "500,ok" if i % 7 == 0 else "ok" for i, pid in enumerate(ids)}
        prompts = write_prompts(tmp_path / "prompts.jsonl", plans)
        out = tmp_path / "out"

        def written() -> list[str]:
            return sorted(r["id"] for name in ("completions.jsonl", "rejected.jsonl") for r in lines(out / name))

        server.hold = frozenset(ids[10:])
        proc = distill_cli(server, prompts, out, tmp_path)
        server.wait_held(3)  # p00-p09 answered, p10-p12 in flight
        stdout, stderr = stop(proc, signal.SIGINT)  # Ctrl-C: cancels them, writes the summary, says how to go on
        assert proc.returncode == 130 and written() == ids[:10], stderr  # the answers kept, no held prompt
        assert "run the same command again to continue" in stdout and "Ctrl-C is ignored" not in stdout
        assert json.loads((out / "summary.json").read_text())["this_run"]["interrupted"] is True
        logs = stdout + stderr

        server.hold = frozenset(ids[20:])
        proc = distill_cli(server, prompts, out, tmp_path)
        server.wait_held(6)  # p10-p19 answered, p20-p22 in flight
        logs += "".join(stop(proc, signal.SIGKILL))  # kill -9 in the middle
        assert written() == ids[:20]
        with open(out / "completions.jsonl", "a") as f:
            f.write('{"id": "p39", "answer": [{"role": "assis')  # a line a crash cut short

        server.release.set()
        proc = distill_cli(server, prompts, out, tmp_path)
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        logs += stdout + stderr
        assert written() == ids  # nothing lost, nothing twice
        assert all(r["answer"] == [{"role": "assistant", "content": f"answer to {r['id']}"}]
                   for r in lines(out / "completions.jsonl"))
        assert sum(server.attempts.values()) == 40 + 6 + 3 + 3  # + the retries, + the 3 in flight at each stop
        s = json.loads((out / "summary.json").read_text())
        assert (s["kept"], s["pending"], s["this_run"]["kept"], s["this_run"]["skipped"]) == (40, 0, 20, 20)
        assert_no_key(out, logs)
    finally:
        server.close()


def test_a_run_that_ctrl_c_cannot_stop_says_so_and_how_to_stop_it(server, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    prompts = write_prompts(tmp_path / "prompts.jsonl", {"a": "ok"})
    said: list[list[str]] = [[], []]
    before = signal.getsignal(signal.SIGINT)
    try:  # SIGINT as a script's background job starts with it, then as a terminal's job does
        for i, handler in enumerate((signal.SIG_IGN, signal.default_int_handler)):
            signal.signal(signal.SIGINT, handler)
            run_distill(fault_config(server, prompts, tmp_path / f"out{i}"), show_progress=False, say=said[i].append)
    finally:
        signal.signal(signal.SIGINT, before)
    assert "Ctrl-C is ignored here" in said[0][-1] and f"stop it with kill -TERM {os.getpid()}" in said[0][-1]
    assert not any("Ctrl-C" in line for line in said[1]), said


def test_refused_key_stops_the_run_and_a_remote_teacher_needs_a_key(server, tmp_path, monkeypatch, capsys):
    prompts = write_prompts(tmp_path / "prompts.jsonl", {"a": "ok", "b": "ok"})
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
    assert main(["distill", "--prompts", str(prompts), "--base-url", server.url, "--model", "m",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "HTTP 401 (the API key was refused); check --base-url, --model and $OPENAI_API_KEY" in err
    assert "sk-wrong" not in err and not lines(tmp_path / "out" / "completions.jsonl")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    config = tmp_path / "distill.yaml"  # settings from YAML, then flags, then dotted overrides
    config.write_text(f"prompts: {prompts}\nbase_url: {server.url}\nmodel: m\nlimit: 5\n"
                      "teacher: {temperature: 0.2, top_p: 0.5}\n")
    assert main(["distill", "--config", str(config), "--out", str(tmp_path / "o1"), "--limit", "1",
                 "--teacher.top_p", "0.7"]) == 0
    assert "done: 1 kept, 0 rejected, 0 failed of 1 prompts;" in capsys.readouterr().out and server.attempts == Counter({"a": 1})
    assert (server.bodies["a"]["temperature"], server.bodies["a"]["top_p"]) == (0.2, 0.7)
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.chdir(tmp_path)  # no ./.env here either
    with pytest.raises(ConfigError, match=r"no API key: set \$TEACHER_KEY in the environment or in ./.env"):
        run_distill(DistillConfig(prompts=str(prompts), base_url="https://teacher.example/v1", model="m",
                                  out=str(tmp_path / "o2"), api_key_env="TEACHER_KEY"), show_progress=False)
    with pytest.raises(ConfigError, match="teacher.top_p must be in"):
        TeacherGenConfig(top_p=0)


def test_judge_and_retry_after_edge_cases():
    from types import SimpleNamespace as NS
    msg = NS(model_dump=lambda exclude_none: {"role": "assistant", "content": "<think>unfinished"})
    assert judge(NS(choices=[NS(finish_reason="stop", message=msg)]), True).reason == "unclosed_think"
    assert judge(NS(choices=[NS(finish_reason="stop", message=msg)]), False).answer[0]["content"] == "<think>unfinished"
    text_call = NS(model_dump=lambda exclude_none: {"role": "assistant", "content": "<functioncall> {broken"})
    assert judge(NS(choices=[NS(finish_reason="stop", message=text_call)]), True).reason == "bad_tool_arguments"
    assert retry_after({"retry-after": "2.5"}) == 2.5 and retry_after({"retry-after-ms": "20"}) == 0.02
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 < retry_after({"retry-after": date}) <= 30 and retry_after({}) is None


def test_an_unfinished_last_line_is_completed_or_removed_and_one_run_holds_a_directory(tmp_path):
    with AnswerStore(tmp_path, ["a"], {"model": "m"}, {}):
        with pytest.raises(ConfigError, match="is being written by another codechat distill"):
            AnswerStore(tmp_path, ["a"], {"model": "m"}, {}).__enter__()
    with AnswerStore(tmp_path, ["a"], {"model": "m"}, {}):  # free again once the first one closed
        pass
    f = tmp_path / "c.jsonl"
    f.write_text('{"id": "a"}\n{"id": "b"}')
    repair_tail(f)
    assert f.read_text() == '{"id": "a"}\n{"id": "b"}\n'
    f.write_text('{"id": "a"}\n{"id": "b", "ans')
    repair_tail(f)
    assert f.read_text() == '{"id": "a"}\n'
    # a line nested past the JSON decoder's depth is a bad line named by file and line, not a RecursionError
    f.write_text('{"id": "a"}\n' + "[" * 200_000 + "\n")
    with pytest.raises(FormatError, match=r"c.jsonl:2: not valid JSON \(RecursionError"):
        list(jsonl_rows(f))


# ----------------------------------------------------------------------------- sft --teacher-completions
@pytest.fixture
def tiny_ckpt(tok, tok_dir, tmp_path):
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=tok.vocab_size, n_layer=2, n_embd=64, n_head=2, n_kv_head=1,
                                    max_seq_len=256))
    return ckpt.save(tmp_path / "pretrain" / "checkpoints", 0, model=model.state_dict(),
                     state={"step": 0, "meta": {"stage": "pretrain", "model": to_dict(model.cfg)}},
                     tokenizer_dir=tok_dir).parent.parent


def test_sft_trains_on_teacher_answers_joined_by_prompt_id(server, tiny_ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    plans = {"a": "ok", "b": "think", "c": "toolnull", "d": "length"}
    prompts = tmp_path / "prompts.jsonl"
    with open(prompts, "w") as f:  # prompt-only records, one without an id (its id is FILE:LINE)
        for pid, plan in plans.items():
            rec = {"prompt": f"{pid}|{plan}"} if pid == "a" else {"id": pid, "prompt": f"{pid}|{plan}"}
            f.write(json.dumps(rec) + "\n")
    out = tmp_path / "distill"
    s = run_distill(fault_config(server, prompts, out), show_progress=False)
    assert set(read_answers(out / "completions.jsonl")) == {"prompts.jsonl:1", "b", "c"}
    assert s["rejected"] == {"length": 1}

    cfg = SFTConfig(decontaminate=False, teacher_completions=str(out / "completions.jsonl"))
    with pytest.raises(ConfigError, match=r"has no answer for 1 prompt\(s\) of --data: 'd'; 1 of them rejected by "
                                          r"the teacher \(.*rejected.jsonl: length 1\)"):
        Mixture.from_spec(str(prompts), cfg)
    kept = tmp_path / "answered" / "prompts.jsonl"  # the answered prompts, the same file name elsewhere
    kept.parent.mkdir()
    kept.write_text("".join(ln + "\n" for ln in prompts.read_text().splitlines()[:3]))
    [src] = Mixture.from_spec(str(kept), cfg).sources
    convs = {r.line: r.conversation.to_dict()["messages"] for r in src.records}
    assert convs[1] == [{"role": "user", "content": "a|ok"}, {"role": "assistant", "content": "answer to a"}]
    assert convs[2] == [{"role": "user", "content": "b|think"}, {"role": "assistant", "content": "The answer."}]
    assert [m["function_call"]["arguments"] for m in convs[3][1:]] == [{"city": "Paris"}, {"city": "Oslo"}]

    def sft(*args):
        return subprocess.run([sys.executable, "-m", "codechat", "sft", "--device", "cpu", "--init", str(tiny_ckpt),
                               "--out", str(tmp_path / "sft"), "--max-steps", "2", "--sft.decontaminate", "false",
                               "--train.micro_batch_size", "2", *args], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    p = sft("--data", str(kept), "--teacher-completions", str(out / "completions.jsonl"))
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads((tmp_path / "sft" / "data_report.json").read_text())
    assert report["preflight"]["seen"] == 3 and report["preflight"]["kept"] == 3 and report["supervised_share"] > 0
    p = sft("--data", str(prompts), "--teacher-completions", str(out / "completions.jsonl"))
    assert p.returncode == 2 and "has no answer for 1 prompt(s) of --data: 'd'" in p.stderr, p.stderr
    p = sft("--data", str(kept))
    assert p.returncode == 2 and "prompt-only records need a teacher's answers" in p.stderr, p.stderr


def test_training_and_the_cli_never_import_the_client():
    code = ("import sys; import codechat.cli, codechat.train.sft, codechat.data.mixture, codechat.data.teacher; "
            "codechat.cli.build_parser(); print(sorted(m for m in ('openai', 'dotenv', 'httpx') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stderr
