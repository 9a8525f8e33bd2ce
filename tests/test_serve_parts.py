"""The serving parts that need no server: a choice built token by token (stop strings and split
characters never leak, calls by id or spelled in text), the limits' checks, the loopback warning,
and the imports: training and the engine never load fastapi, uvicorn or openai, and ``codechat
serve`` without them says how to install them."""
from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codechat.chat.calls import FUNCTION_CALL_TOKEN
from codechat.config.hosts import is_loopback, is_loopback_url
from codechat.config.stages import ConfigError
from codechat.engine import Token
from codechat.serve.choices import ChoiceStream, merge
from codechat.serve.cli import bind_warning
from codechat.serve.config import ServeConfig
from codechat.serve.constraints import Grammars
from codechat.serve.protocol import APIError, ChatRequest, parse_chat_request
from codechat.serve.worker import Job


def run(choice: ChoiceStream, ids: list[int], last: str = "stop") -> list:
    """Push ``ids`` then the closing event (``stop``: an ``<|end|>`` token; ``length``: the last id
    carries the finish) until the choice closes; the deltas."""
    out = []
    events = [Token(0, choice.index, t, 0.0, -0.5, None) for t in ids]
    if last == "stop":
        events.append(Token(0, choice.index, choice.tok.end_id, 0.0, -0.1, "stop"))
    else:
        events[-1] = Token(0, choice.index, ids[-1], 0.0, -0.5, "length")
    for ev in events:
        out.append(choice.push(ev))
        if choice.finish is not None:
            break
    return out


def ids_one_byte_each(tok, text: str) -> list[int]:
    """``text`` as one token per UTF-8 byte (the 256 byte tokens of a byte-level BPE)."""
    by_bytes = {tok.token_bytes(i): i for i in range(tok.vocab_size) if len(tok.token_bytes(i)) == 1}
    return [by_bytes[bytes([b])] for b in text.encode()]


@pytest.mark.parametrize("stop, content", [(["21 C"], "It is "), (["C in", "is 2"], "It "), (["x"], None)])
def test_a_stop_string_split_over_tokens_never_reaches_the_client(tok, stop, content):
    text = "It is 21 C in Tokyo."
    deltas = run(ChoiceStream(tok, 0, stop=stop), ids_one_byte_each(tok, text))
    assert "".join(d.content for d in deltas) == (content if content is not None else text)  # nothing more
    assert deltas[-1].finish == "stop" and all(d.finish is None for d in deltas[:-1])
    if content is not None:
        assert len(deltas) < len(text) + 1  # the choice closed at the stop string, not at the end


def test_a_character_split_over_tokens_comes_out_whole(tok):
    text = "naïve 🙂 ok"
    deltas = run(ChoiceStream(tok, 0), ids_one_byte_each(tok, text))
    assert "".join(d.content for d in deltas) == text
    assert all("\ufffd" not in d.content for d in deltas) and "🙂" in [d.content for d in deltas]


def test_a_call_by_id_becomes_tool_calls_and_one_that_does_not_parse_is_text_without_the_id(tok):
    fc = tok.special_id(FUNCTION_CALL_TOKEN)
    call = tok.encode('{"name": "weather", "arguments": {"city": "Tokyo"}}')
    c = ChoiceStream(tok, 2, tools=True)
    deltas = run(c, tok.encode("Let me look.") + [fc] + call)
    assert "".join(d.content for d in deltas) == c.content == "Let me look."
    assert c.finish == "tool_calls" and deltas[-1].finish == "tool_calls" and deltas[-1].index == 2
    assert c.tool_call["function"] == {"name": "weather", "arguments": json.dumps({"city": "Tokyo"})}
    assert c.tool_call["type"] == "function" and c.tool_call["id"].startswith("call_")
    broken = ChoiceStream(tok, 0, tools=True)
    run(broken, [fc] + call[:-3], last="stop")  # ended inside the call: free decoding can
    assert broken.tool_call is None and broken.finish == "stop" and broken.unparsed and not c.unparsed
    assert broken.content == tok.decode(call[:-3])  # no special token in content


def test_a_call_cut_by_max_tokens_is_a_tool_call_with_its_partial_arguments_as_openai_returns_it(tok):
    fc = tok.special_id(FUNCTION_CALL_TOKEN)
    text = '{"name": "weather", "arguments": {"city": "Tok'
    cut = ChoiceStream(tok, 0, tools=True)
    deltas = run(cut, tok.encode("Looking.") + [fc] + tok.encode(text), last="length")
    assert cut.finish == "length" and deltas[-1].finish == "length" and not cut.unparsed
    assert cut.content == "Looking." and cut.tool_call["function"] == {"name": "weather", "arguments": '{"city": "Tok'}
    early = ChoiceStream(tok, 0, tools=True)  # cut before the arguments began: no name to give, so text
    run(early, [fc] + tok.encode('{"name": "wea'), last="length")
    assert early.tool_call is None and early.finish == "length" and early.content == '{"name": "wea'


def test_a_call_spelled_in_text_is_a_call_only_when_tools_are_declared(tok):
    text = 'Sure. <functioncall> {"name": "weather", "arguments": {"city": "Oslo"}}'
    with_tools = ChoiceStream(tok, 0, tools=True)
    deltas = run(with_tools, ids_one_byte_each(tok, text))
    assert "<" not in "".join(d.content for d in deltas)  # the marker was held back, never sent in part
    assert with_tools.content == "Sure. " and with_tools.finish == "tool_calls"
    assert json.loads(with_tools.tool_call["function"]["arguments"]) == {"city": "Oslo"}
    plain = ChoiceStream(tok, 0)
    run(plain, ids_one_byte_each(tok, text))
    assert plain.content == text and plain.tool_call is None and plain.finish == "stop"


def test_the_token_that_completes_a_grammar_is_the_replys_last_not_a_control_id(tok):
    """Under a grammar the engine ends a row at the call's closing brace with finish ``stop``: that
    token is part of the call (and has its log-prob entry), unlike a closing ``<|end|>``."""
    fc = tok.special_id(FUNCTION_CALL_TOKEN)
    ids = [fc] + tok.encode('{"name": "weather", "arguments": {"city": "Lima"}}')
    c = ChoiceStream(tok, 0, tools=True, logprobs=True)
    deltas = [c.push(Token(0, 0, t, 0.0, -0.5, None if k < len(ids) - 1 else "stop")) for k, t in enumerate(ids)]
    assert c.tool_call["function"] == {"name": "weather", "arguments": json.dumps({"city": "Lima"})}
    assert c.content == "" and c.finish == deltas[-1].finish == "tool_calls"
    assert c.tokens == len(ids) and [e["logprob"] for e in c.logprobs] == [-0.5] * len(ids)
    text = ChoiceStream(tok, 0)  # a response_format reply: its last token is content
    for k, t in enumerate(ids[1:]):
        text.push(Token(0, 0, t, 0.0, -0.5, None if k < len(ids) - 2 else "stop"))
    assert text.content == tok.decode(ids[1:]) and text.finish == "stop"


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                        max_size=3), max_leaves=8)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "nobody"])
messages = st.lists(st.fixed_dictionaries({"role": roles}, optional={
    "content": json_values | st.text(max_size=20), "tool_calls": json_values | st.just([{
        "id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]),
    "function_call": json_values}), max_size=4)
FIELDS = ["temperature", "top_p", "n", "max_tokens", "max_completion_tokens", "stop", "seed", "stream",
          "stream_options", "logprobs", "top_logprobs", "tools", "tool_choice", "presence_penalty", "logit_bias",
          "response_format"]
objects = st.fixed_dictionaries({"model": st.sampled_from(["codechat"] * 4 + ["gpt-4", None]),
                                "messages": st.one_of(messages, messages, messages, json_values)},
                               optional={k: json_values for k in FIELDS})
bodies = st.one_of(objects, objects, objects, json_values)


def test_merged_deltas_are_each_choices_pieces_joined_with_its_finish(tok):
    """A stream sends one chunk per choice per batch of tokens: the merge of a batch's deltas keeps
    each choice's text, log-prob entries and finish reason, whatever the interleaving."""
    a, b = (ChoiceStream(tok, i, logprobs=True) for i in (0, 1))
    da, db = run(a, tok.encode("def f(x):\n    return x")), run(b, tok.encode("print('hi')"), last="length")
    assert len(da) > 3 and len(db) > 3
    batch = [d for pair in zip(da, db) for d in pair] + da[len(db):] + db[len(da):]
    merged = merge(batch)
    assert [m.index for m in merged] == [0, 1]
    for m, c in zip(merged, (a, b)):
        assert (m.content, m.logprobs, m.finish) == (c.content, c.logprobs, c.finish)
    assert [m.finish for m in merged] == ["stop", "length"]
    assert merge(da[:2]) + merge(da[2:]) == [merge(da[:2])[0], merge(da[2:])[0]]  # two batches, two chunks
    assert merge(da[:2])[0].content + merge(da[2:])[0].content == a.content


def test_a_mixed_batchs_coalesced_chunks_are_each_choices_unchunked_text(tok):
    """Engine steps of random sizes over a batch of choices that interleave — multi-byte characters
    split over byte tokens, a stop string split over tokens, a call, a reply cut by length — sent as
    one merged chunk per choice per step: each choice's chunks join to exactly the text it gives
    token by token, and no chunk holds part of a character."""
    texts = ["naïve 🙂 ok, 東京 — done", "It is 21 C in Tokyo.", "print('héllo')\n" * 3, "Ω≈ç√∫ " * 4]
    ids = [ids_one_byte_each(tok, t) for t in texts]
    fc = tok.special_id(FUNCTION_CALL_TOKEN)
    ids.append(tok.encode("Let me look. ") + [fc] + tok.encode('{"name": "weather", "arguments": {"city": "Lima"}}'))

    def choices():
        return [ChoiceStream(tok, 0), ChoiceStream(tok, 1, stop=["C in"]), ChoiceStream(tok, 2),
                ChoiceStream(tok, 3), ChoiceStream(tok, 4, tools=True)]

    def events(i):
        evs = [Token(0, i, t, 0.0, 0.0, None) for t in ids[i]]
        if i == 3:  # cut by max_tokens
            evs[-1] = Token(0, i, ids[i][-1], 0.0, 0.0, "length")
        else:
            evs.append(Token(0, i, tok.end_id, 0.0, 0.0, "stop"))
        return evs

    alone = []
    for c in choices():
        for ev in events(c.index):
            c.push(ev)
            if c.finish is not None:
                break
        alone.append((c.content, c.tool_call and c.tool_call["function"], c.finish))
    assert alone[1] == ("It is 21 ", None, "stop") and alone[3][2] == "length"
    assert alone[4] == ("Let me look. ", {"name": "weather", "arguments": json.dumps({"city": "Lima"})}, "tool_calls")
    rng = random.Random(0)
    for _ in range(20):
        cs, queues = choices(), [events(i) for i in range(5)]
        sent: dict[int, list[str]] = {i: [] for i in range(5)}
        while any(queues):
            batch = []
            for i, q in enumerate(queues):  # an engine step: 1 to 6 tokens of every unfinished choice
                for _ in range(min(len(q), rng.randint(1, 6))):
                    if cs[i].finish is None:
                        batch.append(cs[i].push(q.pop(0)))
                    else:
                        q.clear()
            for d in merge(batch):
                assert "\ufffd" not in d.content
                sent[d.index].append(d.content)
        assert [("".join(sent[i]), c.tool_call and c.tool_call["function"], c.finish)
                for i, c in enumerate(cs)] == alone
        assert cs[0].content == texts[0]


def test_a_lagging_reader_takes_every_waiting_step_at_once_and_the_error_after_them():
    async def read(items):
        job = Job(None, 0, None, asyncio.get_running_loop())
        for item in items:
            job._queue.put_nowait(item)
        got = []
        try:
            async for tokens in job.events():
                got.append([t.token for t in tokens])
        except APIError as e:
            got.append(e.status)
        return got

    steps = [[Token(0, 0, t, 0.0, 0.0, None)] for t in (5, 6, 7)]
    assert asyncio.run(read(steps + [None])) == [[5, 6, 7]]
    assert asyncio.run(read(steps[:2] + [APIError(500, "engine failed"), None])) == [[5, 6], 500]


@pytest.fixture(scope="module")
def grammars(tok):
    return Grammars(tok, tok.vocab_size)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_any_request_body_is_a_checked_request_or_an_openai_error(tok, grammars, body):
    try:
        req = parse_chat_request(body, tok, 256, ServeConfig(max_n=4), grammars)
    except APIError as e:
        assert e.status in (400, 404) and e.message and set(e.body()["error"]) == {"message", "type", "param", "code"}
        return
    assert isinstance(req, ChatRequest) and 1 <= req.n <= 4
    assert req.prompt_tokens + req.engine_request.sampling.max_new_tokens <= 256


@pytest.mark.parametrize("field, value, flag", [("max_n", 0, "--max-n"), ("queue_size", -1, "--queue-size"),
                                                ("max_tokens", -5, "--max-tokens"), ("model_name", " ",
                                                                                     "--served-model-name"),
                                                ("max_body_bytes", 0, "--max-body-bytes")])
def test_serve_config_names_the_flag_to_change(field, value, flag):
    with pytest.raises(ConfigError, match=flag):
        ServeConfig(**{field: value})


def test_only_loopback_binds_go_without_a_warning():
    assert all(is_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "[::1]", "127.9.0.1"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.5", "example.org"))
    assert all(is_loopback_url(u) for u in ("http://127.0.0.2:8000/v1", "http://[::1]:8000/v1",
                                            "http://user:pw@localhost/v1"))  # distill asks these without a key
    assert not any(is_loopback_url(u) for u in ("https://teacher.example/v1", "http://10.0.0.1/v1", "nothing"))
    assert bind_warning("127.0.0.1", None) is None
    warning = bind_warning("0.0.0.0", None)
    assert warning.startswith("WARNING") and "0.0.0.0" in warning and "no API key" in warning
    assert "no API key" not in bind_warning("0.0.0.0", "k")


SERVING = ("fastapi", "uvicorn", "openai", "starlette")


def test_training_and_the_engine_never_import_the_serving_packages():
    code = ("import sys, codechat.train.pretrain, codechat.train.sft, codechat.engine, codechat.cli\n"
            "codechat.cli.build_parser()\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {SERVING!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_serve_without_its_extra_says_how_to_install_it():
    code = ("import sys; sys.modules['fastapi'] = None\n"  # None in sys.modules: the import fails
            "from codechat.cli import main; sys.exit(main(['serve', '--model', 'nowhere']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "codechat serve: error: fastapi is not installed: pip install 'codechat[serve]'"], out.stderr


def test_an_api_key_no_client_can_send_is_refused_at_start(capsys):
    """HTTP headers are Latin-1 on the wire (and the openai client sends ASCII only): a key outside
    printable ASCII could never match, so serve refuses it before loading anything."""
    from codechat.cli import main
    assert main(["serve", "--model", "nowhere", "--api-key", "s\u00ebcret"]) == 2
    assert "--api-key (or $CODECHAT_API_KEY) must be printable ASCII" in capsys.readouterr().err


@pytest.mark.parametrize("flag,package", [("--http", "httptools"), ("--loop", "uvloop")])
def test_a_c_parser_or_loop_that_is_not_installed_is_refused_at_start(flag, package, monkeypatch, capsys):
    """``--http httptools`` / ``--loop uvloop`` without the package: one line before the model loads
    (uvicorn itself would fail only once the model had loaded)."""
    import importlib.util

    from codechat.cli import main
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else find_spec(name, *a))
    assert main(["serve", "--model", "nowhere", flag, package]) == 2
    err = capsys.readouterr().err
    assert f"{flag} {package}: {package} is not installed (pip install {package}), or use {flag} auto" in err
