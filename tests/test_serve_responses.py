"""``POST /v1/responses`` through the real server (uvicorn on 127.0.0.1 in a thread, over the random
model of ``test_serve_grammar.py``, with an API key) and the official ``openai`` client.

A reply is the chat completion of the same seed and messages (``instructions`` the system turn,
``input_text`` / ``output_text`` parts the content), whole or streamed as the typed events in their
order; function tools (flat) under ``tool_choice`` required or named give one ``function_call`` item
valid under the tool's closed schema, or, cut by ``max_output_tokens``, an ``incomplete`` response
with the partial call; ``text.format`` json_schema gives JSON valid under its schema; a tool's result
sent back as ``function_call_output`` renders as chat's ``role: tool`` message does; what needs
server state is a 400 naming the field."""
from __future__ import annotations

import itertools
import json

import jsonschema
import openai
import pydantic
import pytest
from conftest import http
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from test_serve_grammar import SCHEMAS, Answer, serving
from test_serve_parts import json_values

from codechat.chat.calls import FUNCTION_CALL_TOKEN
from codechat.chat.conversation import Conversation, Message, render_for_completion
from codechat.chat.strict import closed_schema
from codechat.engine import Token
from codechat.serve.choices import ChoiceStream
from codechat.serve.config import ServeConfig
from codechat.serve.constraints import Grammars
from codechat.serve.errors import APIError
from codechat.serve.protocol import parse_chat_request
from codechat.serve.responses import ResponseBuilder, ResponsesRequest, parse_responses_request

pytest.importorskip("llguidance", reason="the grammar extra (llguidance) is not installed")
pytestmark = pytest.mark.timeout(300)

KEY = "responses-key"
TOOLS = [{"type": "function", "name": name, "description": f"the {name} tool", "parameters": schema}
         for name, schema in SCHEMAS.items()]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS]
MOVIE = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 20},
                                          "year": {"type": "integer", "minimum": 1900, "maximum": 2100}},
         "required": ["title", "year"], "additionalProperties": False}
TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
               "response.output_text.delta", "response.output_text.done", "response.content_part.done",
               "response.output_item.done"]
CALL_EVENTS = ["response.output_item.added", "response.function_call_arguments.delta",
               "response.function_call_arguments.done", "response.output_item.done"]


@pytest.fixture(scope="module")
def server(tok):
    with serving(tok, api_key=KEY) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(api_key=KEY, base_url=server + "/v1", max_retries=0, timeout=60)


def seeded(seed: int) -> dict:
    return {"extra_body": {"seed": seed}}


def kinds(events) -> list[str]:
    """Event types, runs of one type (text deltas) written once."""
    return [k for k, _ in itertools.groupby(e.type for e in events)]


def sse(text: str) -> list[dict]:
    """The events of a raw Responses stream, each ``event:`` line checked against its data's ``type``."""
    out = []
    for block in text.strip().split("\n\n"):
        named, data = block.split("\n")
        out.append(json.loads(data.removeprefix("data: ")))
        assert named == f"event: {out[-1]['type']}"
    return out


def test_a_string_input_is_the_chat_completion_of_one_user_message(client):
    r = client.responses.create(model="codechat", input="Say hi", max_output_tokens=12, **seeded(3))
    c = client.chat.completions.create(model="codechat", messages=[{"role": "user", "content": "Say hi"}],
                                       max_tokens=12, seed=3)
    assert r.output_text == c.choices[0].message.content and r.output_text
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "codechat"
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == \
        (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens)
    [item] = r.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert [p.type for p in item.content] == ["output_text"]
    cut = c.choices[0].finish_reason == "length"
    assert r.status == ("incomplete" if cut else "completed") and item.status == r.status
    assert (r.incomplete_details.reason if cut else r.incomplete_details) == ("max_output_tokens" if cut else None)
    assert (r.max_output_tokens, r.tools, r.tool_choice, r.text.format.type) == (12, [], "none", "text")


def test_instructions_and_a_message_list_are_the_chat_completions_messages(client):
    history = [{"role": "user", "content": [{"type": "input_text", "text": "Hello"},
                                            {"type": "input_text", "text": "!"}]},
               {"role": "assistant", "content": [{"type": "output_text", "text": "Hi, what now?"}]},
               {"type": "message", "role": "user", "content": "Count to three"}]
    r = client.responses.create(model="codechat", instructions="Answer in one line.", input=history,
                                max_output_tokens=16, temperature=0.7, top_p=0.9, **seeded(5))
    messages = [{"role": "system", "content": "Answer in one line."}, {"role": "user", "content": "Hello!"},
                {"role": "assistant", "content": "Hi, what now?"}, {"role": "user", "content": "Count to three"}]
    c = client.chat.completions.create(model="codechat", messages=messages, max_tokens=16, temperature=0.7, top_p=0.9,
                                       seed=5)
    assert r.output_text == c.choices[0].message.content and r.output_text
    assert r.usage.input_tokens == c.usage.prompt_tokens and r.usage.output_tokens == c.usage.completion_tokens
    assert (r.instructions, r.temperature, r.top_p) == ("Answer in one line.", 0.7, 0.9)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_json_schema_format_gives_valid_json_and_the_stream_joins_to_it(client, stream):
    fmt = {"format": {"type": "json_schema", "name": "movie", "schema": MOVIE, "strict": True}}
    kw = dict(model="codechat", input="A movie, as JSON", text=fmt, max_output_tokens=200, **seeded(7))
    whole = client.responses.create(**kw)
    assert whole.status == "completed" and whole.text.format.type == "json_schema"
    jsonschema.validate(json.loads(whole.output_text), MOVIE)
    if not stream:
        return
    with client.responses.stream(**kw) as s:
        events = list(s)
        final = s.get_final_response()
    assert kinds(events) == TEXT_EVENTS + ["response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 3 and "".join(deltas) == final.output_text == whole.output_text  # the seed's sample
    assert events[-4].text == final.output_text and final.usage == whole.usage
    assert events[0].response.status == "in_progress" and events[0].response.output == []


def test_responses_parse_reads_a_pydantic_text_format(client):
    r = client.responses.parse(model="codechat", input="Rate it", text_format=Answer, max_output_tokens=200,
                               **seeded(9))
    assert r.status == "completed" and isinstance(r.output_parsed, Answer)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "search"}], ids=["required", "named"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_forced_call_is_one_function_call_item_valid_under_the_closed_schema(client, choice, stream):
    names = ["search"] if isinstance(choice, dict) else list(SCHEMAS)
    for seed in range(3):
        kw = dict(model="codechat", input="Weather in Oslo?", tools=TOOLS, tool_choice=choice, max_output_tokens=200,
                  **seeded(seed))
        if stream:
            with client.responses.stream(**kw) as s:
                events = list(s)
                r = s.get_final_response()
            deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
            calls = [k for k in kinds(events) if k != "response.function_call_arguments.delta"]
            assert calls == ["response.created", "response.in_progress"] + [
                k for k in CALL_EVENTS if k != "response.function_call_arguments.delta"] + ["response.completed"]
            assert len(deltas) > 1  # streamed as written, in pieces
            assert "".join(deltas) == r.output[0].arguments == events[-3].arguments
        else:
            r = client.responses.create(**kw)
        assert r.status == "completed" and r.incomplete_details is None and r.output_text == ""
        [call] = r.output
        assert call.type == "function_call" and call.status == "completed" and call.name in names
        assert call.call_id.startswith("call_") and call.id.startswith("fc_")
        jsonschema.validate(json.loads(call.arguments), closed_schema(SCHEMAS[call.name]))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_call_cut_by_max_output_tokens_is_incomplete_with_its_partial_arguments(client, server, stream):
    partial = 0
    for budget in (18, 22, 26, 30):
        body = {"model": "codechat", "input": "Weather in Oslo?", "tools": TOOLS, "tool_choice": "required",
                "max_output_tokens": budget, "seed": 3, "stream": stream}
        if stream:
            events = list(client.responses.create(**{k: v for k, v in body.items() if k != "seed"}, **seeded(3)))
            r = events[-1].response
            if r.status == "incomplete":
                assert events[-1].type == "response.incomplete"
                calls = [e for e in events if e.type == "response.function_call_arguments.delta"]
                assert "".join(e.delta for e in calls) == "".join(o.arguments for o in r.output if o.type == "function_call")
        else:
            r = openai.types.responses.Response.model_validate(http("POST", server + "/v1/responses", body, key=KEY)[2])
        if r.status == "completed":  # finished within the budget: valid
            jsonschema.validate(json.loads(r.output[0].arguments), closed_schema(SCHEMAS[r.output[0].name]))
            continue
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
        assert r.usage.output_tokens == budget and r.output[-1].status == "incomplete"
        if r.output[-1].type == "function_call":  # cut once its arguments began
            partial += 1
            with pytest.raises(ValueError):
                json.loads(r.output[-1].arguments)
    assert partial >= 1


@pytest.mark.parametrize("fields", [{}, {"max_output_tokens": 5}, {"tools": TOOLS, "tool_choice": "required"},
                                    {"tools": TOOLS, "tool_choice": "required", "max_output_tokens": 22}],
                         ids=["text", "cut text", "call", "cut call"])
def test_every_event_and_response_is_valid_under_the_clients_types_and_a_stream_ends_as_the_whole(server, fields):
    body = {"model": "codechat", "input": "Weather in Oslo?", "max_output_tokens": 200, "seed": 3, **fields}
    status, _, whole = http("POST", server + "/v1/responses", body, key=KEY)
    assert status == 200
    Response.model_validate(whole)  # strict: every field the client's type requires is there
    status, headers, text = http("POST", server + "/v1/responses", {**body, "stream": True}, key=KEY)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = sse(text)
    for ev in events:
        pydantic.TypeAdapter(ResponseStreamEvent).validate_python(ev)
    final = events[-1]["response"]
    assert events[-1]["type"] == f"response.{final['status']}" and final["status"] == whole["status"]

    def same(r):  # ids are each response's own
        return [{k: v for k, v in o.items() if k not in ("id", "call_id")} for o in r["output"]], r["usage"]
    assert same(final) == same(whole)


def test_text_then_a_call_is_a_message_item_and_a_function_call_item_in_order(tok):
    """The model's reply of text and a call (rare from the random model: built here from tokens)."""
    req = parse_responses_request({"model": "codechat", "input": "Weather?", "tools": TOOLS}, tok, 1024, ServeConfig(),
                                  Grammars(tok, tok.vocab_size))
    choice, out = ChoiceStream(tok, 0, tools=req.tools), ResponseBuilder(req, "codechat")
    ids = tok.encode("Let me look. ") + [tok.special_id(FUNCTION_CALL_TOKEN)] + tok.encode(
        '{"name": "weather", "arguments": {"city": "Lima"}}') + [tok.end_id]
    events = out.opened()
    for k, t in enumerate(ids):
        events += out.push(choice.push(Token(0, 0, t, 0.0, 0.0, "stop" if k == len(ids) - 1 else None)))
    events += out.closed(choice)
    assert kinds(openai_events(events)) == TEXT_EVENTS + CALL_EVENTS + ["response.completed"]
    message, call = out.final["output"]
    assert message["content"][0]["text"] == "Let me look. " and message["status"] == "completed"
    assert (call["name"], json.loads(call["arguments"]), call["status"]) == ("weather", {"city": "Lima"}, "completed")
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [0, 1]
    assert out.final["usage"]["output_tokens"] == len(ids)
    failed = ResponseBuilder(req, "codechat")
    [_, _, last] = failed.opened() + failed.failed(APIError(500, "the engine failed", type="server_error"))
    assert last["type"] == "response.failed" and last["response"]["status"] == "failed"
    assert last["response"]["error"] == {"code": "server_error", "message": "the engine failed"}


def openai_events(events: list[dict]) -> list:
    return [pydantic.TypeAdapter(ResponseStreamEvent).validate_python(e) for e in events]


def test_a_function_call_output_renders_as_chats_tool_message(tok, client):
    """The client sends the model's call items back with the tool's result: the prompt is chat's for the
    assistant's ``tool_calls`` and the ``role: tool`` message, one turn of text and call."""
    call = {"name": "weather", "arguments": '{"city": "Oslo", "unit": "c", "days": 1}'}
    chat = [{"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": call}]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 3}'}]
    items = [{"role": "user", "content": "Weather in Oslo?"},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
             {"type": "function_call", "call_id": "call_1", **call},
             {"type": "function_call_output", "call_id": "call_1", "output": '{"temp_c": 3}'}]
    grammars, cfg = Grammars(tok, tok.vocab_size), ServeConfig()
    ours = parse_responses_request({"model": "codechat", "input": items, "tools": TOOLS}, tok, 1024, cfg, grammars)
    theirs = parse_chat_request({"model": "codechat", "messages": chat, "tools": CHAT_TOOLS}, tok, 1024, cfg, grammars)
    want = Conversation((Message("user", "Weather in Oslo?"), Message("assistant", "Let me look.", call),
                         Message("function_response", '{"temp_c": 3}')), tuple(t["function"] for t in CHAT_TOOLS))
    assert ours.conversation == theirs.conversation == want
    assert ours.engine_request.prompt == theirs.engine_request.prompt == tuple(render_for_completion(tok, want))
    # and through the server, the model's own output items sent back as the openai docs do
    first = client.responses.create(model="codechat", input=items[:1], tools=TOOLS, tool_choice="required",
                                    max_output_tokens=200, **seeded(1))
    [fc] = first.output
    history = items[:1] + [o.model_dump() for o in first.output] + [
        {"type": "function_call_output", "call_id": fc.call_id, "output": '{"temp_c": 3}'}]
    r = client.responses.create(model="codechat", input=history, tools=TOOLS, max_output_tokens=8, **seeded(2))
    conv = Conversation((Message("user", "Weather in Oslo?"), Message("assistant", "", {
        "name": fc.name, "arguments": fc.arguments}), Message("function_response", '{"temp_c": 3}')),
        tuple(t["function"] for t in CHAT_TOOLS))
    assert r.usage.input_tokens == len(render_for_completion(tok, conv))


BAD = [  # (what, request fields, param, code)
    ("previous_response_id", {"previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter"),
    ("store true", {"store": True}, "store", "unsupported_parameter"),
    ("a conversation", {"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
    ("background", {"background": True}, "background", "unsupported_parameter"),
    ("include", {"include": ["message.output_text.logprobs"]}, "include", "unsupported_parameter"),
    ("truncation auto", {"truncation": "auto"}, "truncation", "unsupported_parameter"),
    ("no input", {"input": None}, "input", "invalid_value"),
    ("empty input", {"input": []}, "input", "invalid_value"),
    ("an item reference", {"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "invalid_value"),
    ("an image part", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0]", "invalid_value"),
    ("a tool role", {"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "invalid_value"),
    ("instructions beside a system item", {"instructions": "a", "input": [{"role": "developer", "content": "b"},
                                                                           {"role": "user", "content": "c"}]},
     "input[0].role", "invalid_value"),
    ("bad call arguments", {"input": [{"role": "user", "content": "x"}, {
        "type": "function_call", "call_id": "c", "name": "f", "arguments": "{not json"}]}, "input[1].arguments",
     "invalid_value"),
    ("ends with a call", {"input": [{"role": "user", "content": "x"}, {
        "type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]}, "input[1]", "invalid_value"),
    ("a chat-style tool", {"tools": CHAT_TOOLS}, "tools[0]", "invalid_value"),
    ("a built-in tool", {"tools": [{"type": "web_search"}]}, "tools[0]", "invalid_value"),
    ("strict not a boolean", {"tools": [{**TOOLS[0], "strict": "yes"}]}, "tools[0].strict", "invalid_value"),
    ("a chat-style tool_choice", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "search"}}},
     "tool_choice", "invalid_value"),
    ("tool_choice naming no tool", {"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}},
     "tool_choice", "invalid_value"),
    ("a schema that does not compile", {"tools": [{"type": "function", "name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"when": {"type": "string", "format": "stardate"}}}}]},
     "tools[0].parameters.properties.when", "invalid_value"),
    ("a format schema that does not compile", {"text": {"format": {"type": "json_schema", "name": "r", "schema": {
        "type": "object", "properties": {"d": {"type": "string", "format": "stardate"}}}}}},
     "text.format.schema.properties.d", "invalid_value"),
    ("json_schema without a schema", {"text": {"format": {"type": "json_schema", "name": "r"}}}, "text.format",
     "invalid_value"),
    ("a format beside tools", {"tools": TOOLS, "text": {"format": {"type": "json_object"}}}, "text.format",
     "unsupported_parameter"),
    ("max_output_tokens zero", {"max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
    ("over the context", {"max_output_tokens": 5000}, "input", "context_length_exceeded"),
    ("temperature too high", {"temperature": 3}, "temperature", "invalid_value"),
]


@pytest.mark.parametrize("what, fields, param, code", BAD, ids=[b[0] for b in BAD])
def test_a_request_codechat_cannot_honour_is_a_400_naming_the_field(client, server, what, fields, param, code):
    body = {"model": "codechat", "input": "hi", **fields}
    status, _, answer = http("POST", server + "/v1/responses", body, key=KEY)
    assert status == 400 and (answer["error"]["param"], answer["error"]["code"]) == (param, code), answer
    assert answer["error"]["message"].startswith(param) or code == "context_length_exceeded"


def test_the_client_sees_stateful_fields_refused_and_the_key_is_required(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="codechat", input="hi", previous_response_id="resp_123")
    assert e.value.param == "previous_response_id" and "keeps no state" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="codechat", input="hi", store=True)
    assert e.value.param == "store"
    assert client.responses.create(model="codechat", input="hi", store=False, max_output_tokens=2).status
    status, _, answer = http("POST", server + "/v1/responses", {"model": "codechat", "input": "hi"})
    assert status == 401 and answer["error"]["code"] == "invalid_api_key"
    status, _, answer = http("POST", server + "/v1/responses", {"model": "gpt-5", "input": "hi"}, key=KEY)
    assert status == 404 and answer["error"]["param"] == "model"


items = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "developer", "assistant", "tool"])}, optional={
        "type": st.just("message"), "content": json_values | st.text(max_size=8) | st.lists(st.fixed_dictionaries({
            "type": st.sampled_from(["input_text", "output_text", "text", "input_image"]), "text": json_values}),
            max_size=2)}),
    st.fixed_dictionaries({"type": st.just("function_call")}, optional={
        "name": st.sampled_from(["weather", "a b", ""]) | json_values, "call_id": json_values,
        "arguments": st.sampled_from(['{"city": "Oslo"}', "{bad", "[]"]) | json_values}),
    st.fixed_dictionaries({"type": st.sampled_from(["function_call_output", "item_reference", "reasoning"])},
                          optional={"output": json_values | st.text(max_size=8), "call_id": json_values}),
    json_values)


def often(valid: st.SearchStrategy) -> st.SearchStrategy:
    """``valid`` values most of the time (a body of many fields is then sometimes valid), any JSON value else."""
    return st.one_of(*[valid] * 7, json_values)


FIELDS = {"instructions": often(st.text(max_size=8)), "tools": often(st.just(TOOLS)),
          "tool_choice": often(st.sampled_from(["auto", "none", "required", {"type": "function", "name": "search"}])),
          "text": often(st.just({"format": {"type": "json_object"}})), "max_output_tokens": often(st.integers(1, 300)),
          "temperature": often(st.floats(0, 2)), "top_p": often(st.floats(0.01, 1)), "seed": often(st.integers()),
          "stream": often(st.booleans()), "store": often(st.just(False)), "background": often(st.just(False)),
          "previous_response_id": often(st.none()), "conversation": often(st.none()), "include": often(st.just([])),
          "truncation": often(st.just("disabled")), "metadata": often(st.just({"k": "v"})),
          "parallel_tool_calls": often(st.booleans()), "top_logprobs": often(st.just(0))}
objects = st.fixed_dictionaries({"model": st.sampled_from(["codechat"] * 8 + ["gpt-5", None]),
                                 "input": st.lists(items, max_size=4) | st.text(max_size=8) | json_values},
                                optional=FIELDS)
bodies = st.one_of(objects, objects, objects, json_values)


@pytest.fixture(scope="module")
def grammars(tok):
    return Grammars(tok, tok.vocab_size)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_any_responses_body_is_a_checked_request_or_an_openai_error(tok, grammars, body):
    try:
        req = parse_responses_request(body, tok, 256, ServeConfig(), grammars)
    except APIError as e:
        assert e.status in (400, 404) and e.message and set(e.body()["error"]) == {"message", "type", "param", "code"}
        return
    assert isinstance(req, ResponsesRequest) and len(req.engine_request.samples) == 1
    assert req.prompt_tokens + req.engine_request.sampling.max_new_tokens <= 256
