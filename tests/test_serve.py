"""``codechat serve`` as a client sees it: the real server (a subprocess on 127.0.0.1, ``served`` in
conftest.py) with the tiny model taught one function-calling conversation, driven by the official
``openai`` client and by plain HTTP. Answers are checked against the engine run in this process on
the same checkpoint: a completion, streaming, ``n`` seeded choices, stop strings, log-probs, the
tools round trip (the call is the model's own), the key, a 400 for each kind of malformed request,
and 64 concurrent streams equal to the same requests made one at a time, unstreamed, while ``/health``
answers."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import openai
import pytest
from conftest import http

from codechat.chat.calls import FUNCTION_CALL_TOKEN, format_call
from codechat.chat.conversation import Conversation, Message, render_for_completion
from codechat.checkpoint import load_model
from codechat.engine import Engine, EngineConfig, Request, SamplingConfig
from codechat.tools import load_executors

USER = {"role": "user", "content": "Weather in Tokyo?"}
GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(api_key=served.api_key, base_url=served.url + "/v1", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def weather(funcall_stage):
    """The taught tool as a client declares it."""
    [tool] = load_executors(funcall_stage[1])
    return {"type": "function", "function": tool.schema()}


@pytest.fixture(scope="module")
def local(served):
    """The served checkpoint's engine and tokenizer, in this process: what the answers must be."""
    model, tok, _ = load_model(served.stage)
    return Engine(model, EngineConfig(slots=4)), tok


@pytest.fixture(scope="module")
def after_call(client, weather):
    """The history after the model's call and the function's response (the call is the model's)."""
    r = client.chat.completions.create(model="codechat", messages=[USER], tools=[weather], **GREEDY)
    call = r.choices[0].message.tool_calls[0]
    return [USER, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'}]


def test_the_model_calls_the_tool_then_answers_from_its_response(client, weather, after_call, local):
    r = client.chat.completions.create(model="codechat", messages=[USER], tools=[weather], **GREEDY)
    [choice] = r.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "weather"
    assert json.loads(call.function.arguments) == {"city": "Tokyo"}  # a JSON string, as OpenAI sends it
    r = client.chat.completions.create(model="codechat", messages=after_call, tools=[weather], **GREEDY)
    assert r.choices[0].message.content == "It is 21 C in Tokyo." and r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.tool_calls is None
    engine, tok = local
    conv = Conversation((Message("user", USER["content"]),
                         Message("assistant", "", {"name": "weather", "arguments": {"city": "Tokyo"}}),
                         Message("function_response", '{"temp_c": 21}')), (weather["function"],))
    assert r.usage.prompt_tokens == len(render_for_completion(tok, conv))  # the same prompt as in training
    assert r.usage.completion_tokens == len(tok.encode("It is 21 C in Tokyo.")) + 1  # and <|end|>
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_tool_choice_named_or_required_constrains_the_call_and_none_declares_nothing(client, weather, local):
    _, tok = local
    call_ids = tok.encode(format_call({"name": "weather", "arguments": {"city": "Tokyo"}}))
    auto = client.chat.completions.create(model="codechat", messages=[USER], tools=[weather], **GREEDY).usage
    assert auto.completion_tokens == 1 + len(call_ids) + 1  # <|function_call|>, the call, <|end|>
    for choice in ({"type": "function", "function": {"name": "weather"}}, "required"):
        r = client.chat.completions.create(model="codechat", messages=[USER], tools=[weather], tool_choice=choice,
                                           **GREEDY)
        [call] = r.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("weather", {"city": "Tokyo"})
        assert r.choices[0].finish_reason == "tool_calls"
        # the same prompt; the grammar ends the reply at the call's last token, without <|end|>
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (auto.prompt_tokens, auto.completion_tokens - 1)
    r = client.chat.completions.create(model="codechat", messages=[USER], tools=[weather], tool_choice="none",
                                       max_tokens=30, **GREEDY)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")


def _alone(engine: Engine, tok, conv: Conversation, sampling: SamplingConfig, n: int = 1, seed: int = 0):
    """The engine's samples of ``conv`` (stopping at any control id, as the server does without
    tools): ``(texts, samples, prompt)``."""
    prompt = render_for_completion(tok, conv)
    [samples] = engine.generate([Request(prompt, sampling, samples=n, seed=seed, stop_ids=sorted(tok.special_ids))])
    return [tok.decode([t for t in s.token_ids if t not in tok.special_ids]) for s in samples], samples, prompt


def test_a_completion_is_what_the_engine_answers_alone(client, local):
    engine, tok = local
    messages = [{"role": "system", "content": "Answer in one line."}, {"role": "user", "content": "Say hi"}]
    r = client.chat.completions.create(model="codechat", messages=messages, max_tokens=20, **GREEDY)
    conv = Conversation(tuple(Message(**m) for m in messages))
    [text], [sample], prompt = _alone(engine, tok, conv, SamplingConfig(20, 0.0, 0, 1.0))
    assert r.choices[0].message.content == text and r.choices[0].finish_reason == sample.finish
    assert r.object == "chat.completion" and r.model == "codechat" and r.id.startswith("chatcmpl-")
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == len(sample.token_ids)


def test_a_stream_is_the_same_answer_in_pieces_ending_with_done(client, served, after_call, weather):
    whole = client.chat.completions.create(model="codechat", messages=after_call, tools=[weather], **GREEDY)
    chunks = list(client.chat.completions.create(model="codechat", messages=after_call, tools=[weather],
                                                 stream=True, stream_options={"include_usage": True}, **GREEDY))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    # the pieces' count depends on how fast this reader keeps up (the tokens it has not taken come together: one
    # piece under load, test_serve_parts.test_a_lagging_reader_takes_every_waiting_step_at_once_...)
    assert len(pieces) >= 1 and "".join(pieces) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[0].object == "chat.completion.chunk"
    body = {"model": "codechat", "messages": [USER], "tools": [weather], "stream": True, **GREEDY}
    status, headers, text = http("POST", served.url + "/v1/chat/completions", body, key=served.api_key)
    events = text.split("\n\n")
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert events[-2:] == ["data: [DONE]", ""] and all(e.startswith("data: {") for e in events[:-2])
    calls = [d for e in events[:-2] for d in json.loads(e[6:])["choices"][0]["delta"].get("tool_calls", [])]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [("weather", {"city": "Tokyo"})]


def test_n_seeded_choices_are_the_engines_seeded_samples(client, local):
    engine, tok = local
    messages = [{"role": "user", "content": "Write a story"}]
    r = client.chat.completions.create(model="codechat", messages=messages, n=3, seed=1234, temperature=1.0,
                                       max_tokens=12)
    assert [c.index for c in r.choices] == [0, 1, 2]
    want, samples, prompt = _alone(engine, tok, Conversation((Message("user", "Write a story"),)),
                                   SamplingConfig(12, 1.0, 0, 1.0), n=3, seed=1234)
    assert [c.message.content for c in r.choices] == want
    assert len(set(want)) > 1  # three different samples, one prefill
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == sum(len(s.token_ids) for s in samples)
    again = client.chat.completions.create(model="codechat", messages=messages, n=1, seed=1234, temperature=1.0,
                                           max_tokens=12)
    assert again.choices[0].message.content == want[0]  # sample 0 of a seed, whatever runs beside it


@pytest.mark.parametrize("stop, content", [(" C in", "It is 21"), (["21", "is"], "It "), ("Tokyo.", "It is 21 C in ")])
def test_stop_strings_end_the_reply_before_them_streamed_or_not(client, after_call, weather, stop, content):
    kw = dict(model="codechat", messages=after_call, tools=[weather], stop=stop, **GREEDY)
    r = client.chat.completions.create(**kw)
    assert r.choices[0].message.content == content and r.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == content


def test_logprobs_are_the_models_own_at_temperature_one(client, after_call, weather, local):
    engine, tok = local
    r = client.chat.completions.create(model="codechat", messages=after_call, tools=[weather], logprobs=True,
                                       **GREEDY)
    entries = r.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == "It is 21 C in Tokyo."
    assert b"".join(bytes(e.bytes) for e in entries).decode() == "It is 21 C in Tokyo."
    conv = Conversation((Message("user", USER["content"]),
                         Message("assistant", "", {"name": "weather", "arguments": {"city": "Tokyo"}}),
                         Message("function_response", '{"temp_c": 21}')), (weather["function"],))
    scored = engine.score(render_for_completion(tok, conv), tok.encode("It is 21 C in Tokyo."))
    assert [e.logprob for e in entries] == pytest.approx(scored, abs=1e-4)


def test_penalties_logit_bias_and_top_logprobs_reach_the_engine(client, after_call, weather, local):
    """The options as the engine applies them (checked against the model's own logits in
    tests/test_sampling_options.py): the server's reply equals the engine's, option by option."""
    engine, tok = local
    conv = Conversation((Message("user", USER["content"]),
                         Message("assistant", "", {"name": "weather", "arguments": {"city": "Tokyo"}}),
                         Message("function_response", '{"temp_c": 21}')), (weather["function"],))
    banned = tok.encode("It")[0]
    fc = tok.special_id(FUNCTION_CALL_TOKEN)
    cfg = SamplingConfig(16, temperature=0.0, presence_penalty=0.5, frequency_penalty=1.5, logit_bias={banned: -100},
                         top_logprobs=3)
    [[ref]] = engine.generate([Request(render_for_completion(tok, conv), cfg, stop_ids=sorted(tok.special_ids - {fc}))])
    r = client.chat.completions.create(model="codechat", messages=after_call, tools=[weather], logprobs=True,
                                       top_logprobs=3, max_tokens=16, presence_penalty=0.5, frequency_penalty=1.5,
                                       logit_bias={str(banned): -100}, **GREEDY)
    entries = r.choices[0].logprobs.content
    body = [t for t in ref.token_ids if t not in tok.special_ids]
    assert r.choices[0].message.content == tok.decode(body) != "It is 21 C in Tokyo."  # the options changed it
    assert [e.logprob for e in entries] == pytest.approx(ref.logprobs_t1[:len(entries)], abs=1e-4)
    for e, top in zip(entries, ref.top_logprobs):
        assert [(x.token, x.logprob) for x in e.top_logprobs] == [(tok.decode([t]), pytest.approx(v, abs=1e-4))
                                                                    for t, v in top]


def test_the_api_key_is_required_except_for_health(served, client):
    status, _, body = http("GET", served.url + "/v1/models")
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert body["error"]["type"] == "authentication_error"
    wrong = openai.OpenAI(api_key="not-the-key", base_url=served.url + "/v1", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model="codechat", messages=[USER])
    assert http("GET", served.url + "/health")[0] == 200
    status, headers, _ = http("HEAD", served.url + "/")  # the chat page needs no key either
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert [m.id for m in client.models.list()] == ["codechat"]
    assert client.models.retrieve("codechat").max_model_len == 256


def _ok() -> dict:
    return {"model": "codechat", "messages": [USER]}


MALFORMED = [  # (what, body, status, param, code)
    ("bad JSON", b'{"model": "codechat", "messages": [', 400, None, "invalid_json"),
    ("not UTF-8", b'\xff\xfe{}', 400, None, "invalid_json"),
    ("not an object", [1, 2], 400, None, "invalid_json"),
    ("no model", {"messages": [USER]}, 400, "model", "invalid_value"),
    ("unknown model", {**_ok(), "model": "gpt-9"}, 404, "model", "model_not_found"),
    ("no messages", {"model": "codechat"}, 400, "messages", "invalid_value"),
    ("empty messages", {**_ok(), "messages": []}, 400, "messages", "invalid_value"),
    ("too many messages", {**_ok(), "messages": [USER] * 65}, 400, "messages", "invalid_value"),
    ("message not an object", {**_ok(), "messages": ["hi"]}, 400, "messages[0]", "invalid_value"),
    ("unknown role", {**_ok(), "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role",
     "invalid_value"),
    ("system not first", {**_ok(), "messages": [USER, {"role": "system", "content": "x"}, USER]}, 400,
     "messages[1].role", "invalid_value"),
    ("content a number", {**_ok(), "messages": [{"role": "user", "content": 3}]}, 400, "messages[0].content",
     "invalid_value"),
    ("image part", {**_ok(), "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     400, "messages[0].content[0]", "invalid_value"),
    ("ends with the assistant", {**_ok(), "messages": [USER, {"role": "assistant", "content": "x"}]}, 400,
     "messages[1].role", "invalid_value"),
    ("bad call arguments", {**_ok(), "messages": [USER, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}, USER]}, 400,
     "messages[1].tool_calls[0].function.arguments", "invalid_value"),
    ("calls in a user message", {**_ok(), "messages": [{**USER, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, 400, "messages[0]",
     "invalid_value"),
    ("temperature too high", {**_ok(), "temperature": 2.5}, 400, "temperature", "invalid_value"),
    ("temperature a string", {**_ok(), "temperature": "hot"}, 400, "temperature", "invalid_value"),
    ("top_p zero", {**_ok(), "top_p": 0}, 400, "top_p", "invalid_value"),
    ("n zero", {**_ok(), "n": 0}, 400, "n", "invalid_value"),
    ("n over the limit", {**_ok(), "n": 9}, 400, "n", "invalid_value"),
    ("max_tokens zero", {**_ok(), "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    ("max_tokens over the context", {**_ok(), "max_tokens": 250}, 400, "messages", "context_length_exceeded"),
    ("two max_tokens", {**_ok(), "max_tokens": 5, "max_completion_tokens": 6}, 400, "max_completion_tokens",
     "invalid_value"),
    ("seed a float", {**_ok(), "seed": 1.5}, 400, "seed", "invalid_value"),
    ("stream not a bool", {**_ok(), "stream": "yes"}, 400, "stream", "invalid_value"),
    ("stream_options without stream", {**_ok(), "stream_options": {"include_usage": True}}, 400, "stream_options",
     "invalid_value"),
    ("five stop strings", {**_ok(), "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "invalid_value"),
    ("empty stop string", {**_ok(), "stop": [""]}, 400, "stop", "invalid_value"),
    ("tools not a list", {**_ok(), "tools": {"name": "f"}}, 400, "tools", "invalid_value"),
    ("tool without wrapper", {**_ok(), "tools": [{"name": "f"}]}, 400, "tools[0]", "invalid_value"),
    ("tool with a bad name", {**_ok(), "tools": [{"type": "function", "function": {"name": "a b"}}]}, 400,
     "tools[0]", "invalid_value"),
    ("tool with bad parameters", {**_ok(), "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": 3}}}]}, 400, "tools[0]", "invalid_value"),
    ("tool_choice without tools", {**_ok(), "tool_choice": "required"}, 400, "tool_choice", "invalid_value"),
    ("tool_choice naming no tool", {**_ok(), "tools": [{"type": "function", "function": {"name": "f"}}],
                                    "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400,
     "tool_choice", "invalid_value"),
    ("presence penalty out of range", {**_ok(), "presence_penalty": 2.5}, 400, "presence_penalty", "invalid_value"),
    ("logit bias on no token", {**_ok(), "logit_bias": {"999999": 10}}, 400, "logit_bias.999999", "invalid_value"),
    ("logit bias over 100", {**_ok(), "logit_bias": {"5": 101}}, 400, "logit_bias.5", "invalid_value"),
    ("unknown response format", {**_ok(), "response_format": {"type": "xml"}}, 400, "response_format",
     "invalid_value"),
    ("json_schema without a schema", {**_ok(), "response_format": {"type": "json_schema",
                                                                    "json_schema": {"name": "r"}}},
     400, "response_format.json_schema", "invalid_value"),
    ("top logprobs without logprobs", {**_ok(), "top_logprobs": 5}, 400, "top_logprobs", "invalid_value"),
    ("top logprobs over 20", {**_ok(), "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs", "invalid_value"),
    ("nested too deep for a parser", b'{"model": "codechat", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400,
     None, "invalid_json"),
    ("a number too long for a parser", b'{"model": "codechat", "messages": [], "n": 1' + b"0" * 5000 + b"}", 400,
     None, "invalid_json"),
    ("nested over the limit", {**_ok(), "metadata": json.loads("[" * 65 + "]" * 65)}, 400, "metadata",
     "invalid_value"),
    ("a schema nested deep", {**_ok(), "tools": [{"type": "function", "function": {
        "name": "f", "parameters": json.loads('{"type": "object", "properties": {"a": ' * 30 + "{}" + "}}" * 30)}}]},
     400, "tools", "invalid_value"),
    ("a lone surrogate", b'{"model": "codechat", "messages": [{"role": "user", "content": "hi \\ud800"}]}', 400,
     "messages[0].content", "invalid_value"),
    ("call arguments nested deep", {**_ok(), "messages": [USER, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": ' * 2000 + "1" + "}" * 2000}}]},
        USER]}, 400, "messages[1].tool_calls[0].function.arguments", "invalid_value"),
    ("body over the limit", {**_ok(), "messages": [{"role": "user", "content": "x" * 70_000}]}, 413, None,
     "request_too_large"),
]


@pytest.mark.parametrize("what, body, status, param, code", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_each_malformed_request_gets_an_openai_error_naming_its_field(served, what, body, status, param, code):
    got, _, answer = http("POST", served.url + "/v1/chat/completions", body, key=served.api_key)
    assert got == status, answer
    err = answer["error"]
    assert (err["param"], err["code"]) == (param, code) and err["message"], err
    assert set(err) == {"message", "type", "param", "code"}


def test_errors_reach_the_openai_client_and_the_server_lives_on(client, served):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="codechat", messages=[USER], max_tokens=1000)
    assert e.value.code == "context_length_exceeded" and "maximum context length is 256" in e.value.message
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=[USER])
    status, _, body = http("GET", served.url + "/v2/nothing", key=served.api_key)
    assert status == 404 and body["error"]["type"] == "not_found_error"
    status, _, health = http("GET", served.url + "/health")
    assert status == 200 and health["status"] == "ok" and health["in_flight"] == 0


def test_64_concurrent_streams_equal_the_same_requests_unstreamed_one_at_a_time_while_health_answers(served, weather):
    """Each stream's chunks (several tokens of a choice coalesced into one) join to the answer the same
    request gets alone and unstreamed: text, calls and finish reason."""
    cities = ["Tokyo", "Paris", "Lima", "Oslo", "Cairo", "Quito", "Rome", "Delhi"]
    requests = [dict(messages=[{"role": "user", "content": f"Weather in {cities[i % 8]}{'?' * (1 + i // 8)}"}],
                     tools=[weather] if i % 2 else None, max_tokens=28 + i % 16) for i in range(64)]
    key, base = served.api_key, served.url + "/v1"

    def answer(chunks) -> tuple:
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        calls = [(t.function.name, t.function.arguments) for c in chunks if c.choices
                 for t in c.choices[0].delta.tool_calls or []]
        return text, calls, [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]

    def kwargs(r: dict) -> dict:
        return {k: v for k, v in r.items() if v is not None}

    def unstreamed(r: dict) -> tuple:
        [c] = sync.chat.completions.create(model="codechat", **GREEDY, **kwargs(r)).choices
        return (c.message.content or "", [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []],
                [c.finish_reason])

    sync = openai.OpenAI(api_key=key, base_url=base, max_retries=0, timeout=120)
    alone = [unstreamed(r) for r in requests]
    health: list[tuple[float, int, object]] = []  # (seconds, status, body) of each /health during the load
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            t0 = time.monotonic()
            status, _, body = http("GET", served.url + "/health", timeout=10)
            health.append((time.monotonic() - t0, status, body))

    async def together() -> list:
        aclient = openai.AsyncOpenAI(api_key=key, base_url=base, max_retries=0, timeout=120)

        async def one(r: dict) -> tuple:
            stream = await aclient.chat.completions.create(model="codechat", stream=True, **GREEDY, **kwargs(r))
            return answer([c async for c in stream])
        try:
            return await asyncio.gather(*(one(r) for r in requests))
        finally:
            await aclient.close()

    before = http("GET", served.url + "/health")[2]["engine"]
    poller = threading.Thread(target=poll)
    poller.start()
    try:
        concurrent = asyncio.run(together())
    finally:
        done.set()
        poller.join()
    after = http("GET", served.url + "/health")[2]["engine"]
    assert concurrent == alone
    # the step timeline counted exactly these 64 rows' prefills, and their time
    assert after["prefill_rows"] - before["prefill_rows"] == 64
    assert after["tokens"] - before["tokens"] >= 64 and after["steps"] > before["steps"]
    assert 0 < after["admit_s"] - before["admit_s"] < after["step_s"] - before["step_s"]
    assert after["deliver_s"] > before["deliver_s"] and after["idle_s"] >= before["idle_s"]
    n_calls, n_texts = sum(bool(calls) for _, calls, _ in alone), len({text for text, _, _ in alone})
    assert n_calls >= 2 and n_texts >= 8, (n_calls, n_texts)  # calls, texts, calls that do not parse
    assert len(health) >= 3 and all(status == 200 and body["status"] == "ok" for _, status, body in health)
    assert max(t for t, _, _ in health) < 5.0, health
    assert max(body["running"] for _, _, body in health) > 1  # the streams shared the running batch


def test_prompt_logprobs_cross_from_the_engine_process_as_the_engines_own_score(served, local):
    """``echo`` with ``logprobs`` runs a teacher-forced pass on the engine's loop (a call: its function
    and its answer cross the engine process's pipe)."""
    engine, tok = local
    text = "Weather in Tokyo? It is 21 C."
    c = openai.OpenAI(api_key=served.api_key, base_url=served.url + "/v1", max_retries=0, timeout=60)
    r = c.completions.create(model="codechat", prompt=text, echo=True, logprobs=1, max_tokens=0)
    ids = [tok.end_id] + tok.encode(text)  # a text prompt follows <|end|>, as documents did in pretraining
    want = engine.score(ids[:1], ids[1:])
    got = r.choices[0].logprobs.token_logprobs
    assert got[0] is None and len(got) == len(ids)
    assert got[1:] == pytest.approx(want, abs=1e-4)


def test_a_dead_engine_process_answers_503_and_health_says_so(funcall_stage, tmp_path):
    """Every request in flight and every new one gets a 503 (never a hang) once the engine process is gone."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from conftest import free_port, wait_healthy
    port, log = free_port(), tmp_path / "server.log"
    proc = subprocess.Popen([sys.executable, "-m", "codechat", "serve", "--model", str(funcall_stage[0]), "--port",
                             str(port), "--device", "cpu", "--slots", "2", "--log-level", "warning",
                             "--http", "h11", "--loop", "asyncio"],  # uvicorn's pure-Python pair, named
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        assert http("GET", url + "/health")[2]["engine"]["steps"] == 0
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        [child] = [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
        os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (status := http("GET", url + "/health")[0]) == 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert status == 503
        status, _, body = http("POST", url + "/v1/chat/completions", {"model": "codechat", "messages": [USER]})
        assert status == 503 and "engine is not running" in body["error"]["message"]
        assert proc.poll() is None  # the front end lives on and says why
    finally:
        proc.terminate()
        proc.wait(10)
