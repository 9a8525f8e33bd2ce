"""Constrained replies through the real server (uvicorn on 127.0.0.1 in a thread of this process) and
the official ``openai`` client: strict tools under ``tool_choice`` auto, ``required`` and a named tool,
``response_format`` ``json_schema`` (and ``client.chat.completions.parse`` with a Pydantic model), each
streamed and not; schemas that do not compile and undeclared tools are 400s naming their place, and
the server answers the next request.

The model has random weights, sampled at temperature 1, so nothing but the grammar keeps its replies
in shape: every token's embedding leans on one dimension that only ``<|function_call|>`` (about 2.6%
a step) and ``<|end|>`` (about 1.2%) read, every other token is about equally likely. So a free reply
that opens a call goes on with noise (a call that does not parse: sent as text, counted in
``/health``), and a strict ``auto`` reply is text that often turns into a call. Schemas are bounded
(``maxLength``, enums, integer ranges, ``maxItems``, no extra properties) so that a constrained reply
ends well within ``max_tokens``."""
from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pytest
import torch
from conftest import http, serve_in_thread
from pydantic import BaseModel, Field

from codechat.chat.calls import FUNCTION_CALL_TOKEN
from codechat.config.stages import ModelConfig
from codechat.model import build_model
from codechat.serve import constraints
from codechat.serve.config import ServeConfig
from codechat.serve.errors import APIError
from codechat.serve.protocol import parse_chat_request

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit", "days"], "additionalProperties": False}
SEARCH = {"type": "object", "properties": {
    "query": {"type": "string", "maxLength": 16},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["query", "tags"], "additionalProperties": False}
SCHEMAS = {"weather": WEATHER, "search": SEARCH}
USER = [{"role": "user", "content": "Weather in Oslo, and find me a recipe."}]
SAMPLE = {"temperature": 1.0, "max_tokens": 200}


def tools(strict: bool | None = True) -> list[dict]:
    flag = {} if strict is None else {"strict": strict}
    return [{"type": "function", "function": {"name": name, "description": f"the {name} tool", "parameters": schema,
                                              **flag}} for name, schema in SCHEMAS.items()]


class Answer(BaseModel):
    name: str = Field(max_length=10)
    score: int = Field(ge=0, le=10)
    tags: list[Literal["x", "y"]] = Field(max_length=2)


def random_model(tok):
    """The random model of the module docstring (seed 0, 1024 positions)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=tok.vocab_size, n_layer=2, n_embd=64, n_head=4, n_kv_head=2,
                                    max_seq_len=1024))
    with torch.no_grad():  # the last hidden state is about 8 along dimension 0 (RMS-normed, 64 wide)
        model.embed_tokens.weight[:, 0] += 8.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[tok.special_id(FUNCTION_CALL_TOKEN), 0] = 0.5  # logit 4: ~2.6% a step
        model.lm_head.weight[tok.end_id, 0] = 0.4  # logit 3.2: ~1.2%
    return model.eval()


def serving(tok, api_key: str | None = None):
    """The base URL of a server over :func:`random_model` (8 slots), requiring ``api_key`` when given
    (:func:`conftest.serve_in_thread`); stopped on exit."""
    return serve_in_thread(random_model(tok), tok, slots=8, queue_size=8, config=ServeConfig(max_n=8), api_key=api_key)


@pytest.fixture(scope="module")
def server(tok):
    """The base URL of a server over the random model of the module docstring (8 slots)."""
    with serving(tok) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(api_key="none", base_url=server + "/v1", max_retries=0, timeout=60)


def complete(client: openai.OpenAI, stream: bool, **kw) -> list[tuple[str | None, list, str]]:
    """Each choice's ``(content, [(tool name, arguments JSON)], finish_reason)``, read from the whole
    answer or put together from the stream's chunks (a call's arguments joined from their pieces)."""
    if not stream:
        r = client.chat.completions.create(model="codechat", **kw)
        return [(c.message.content, [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []],
                 c.finish_reason) for c in r.choices]
    parts: dict[int, list] = {}
    for ch in client.chat.completions.create(model="codechat", stream=True, **kw):
        for c in ch.choices:
            p = parts.setdefault(c.index, ["", [], None])
            p[0] += c.delta.content or ""
            for t in c.delta.tool_calls or []:  # a call's id and name once, then pieces of its arguments
                if t.id is not None:
                    p[1].append((t.function.name, t.function.arguments or ""))
                else:
                    p[1][-1] = (p[1][-1][0], p[1][-1][1] + t.function.arguments)
            p[2] = c.finish_reason or p[2]
    return [(p[0] or None if p[1] else p[0], p[1], p[2]) for _, p in sorted(parts.items())]


def assert_valid_calls(calls: list, names=tuple(SCHEMAS)) -> None:
    for name, arguments in calls:
        assert name in names
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def assert_no_special_text(content: str | None) -> None:
    assert "<|" not in (content or "")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_choice_required_makes_every_choice_one_valid_call(client, stream):
    choices = complete(client, stream, messages=USER, tools=tools(strict=None), tool_choice="required", n=4, seed=7,
                       **SAMPLE)
    assert len(choices) == 4
    for content, calls, finish in choices:
        assert finish == "tool_calls" and len(calls) == 1 and not content
        assert_valid_calls(calls)
    assert len({args for _, [(_, args)], _ in choices}) == 4  # four samples, not one


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_named_tool_choice_calls_that_tool(client, stream):
    choices = complete(client, stream, messages=USER, tools=tools(strict=False), n=2, seed=3,
                       tool_choice={"type": "function", "function": {"name": "search"}}, **SAMPLE)
    for content, calls, finish in choices:
        assert finish == "tool_calls" and [name for name, _ in calls] == ["search"] and not content
        assert_valid_calls(calls)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_strict_tools_under_auto_answer_in_text_or_with_a_valid_call(client, stream):
    choices = complete(client, stream, messages=USER, tools=tools(strict=True), n=6, seed=11, **SAMPLE)
    made = [calls for _, calls, _ in choices if calls]
    assert made, choices  # the seed is one whose samples call
    for content, calls, finish in choices:
        assert_no_special_text(content)
        assert finish == "tool_calls" if calls else finish in ("stop", "length")
        assert_valid_calls(calls)


def test_a_free_call_that_does_not_parse_is_text_without_the_opener_and_counted(client, server):
    before = http("GET", server + "/health")[2]["unparsed_calls"]
    choices = complete(client, False, messages=USER, tools=tools(strict=False), n=6, seed=11, **SAMPLE)
    assert all(not calls for _, calls, _ in choices)  # noise after <|function_call|> is no call
    for content, _, _ in choices:
        assert_no_special_text(content)
    after = http("GET", server + "/health")[2]["unparsed_calls"]
    assert 1 <= after - before <= len(choices), (before, after)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_json_schema_response_format_gives_valid_json(client, stream):
    schema = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 20},
                                               "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                                               "genres": {"type": "array", "items": {"enum": ["drama", "comedy"]},
                                                          "maxItems": 2}},
              "required": ["title", "year", "genres"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "movie", "schema": schema, "strict": True}}
    choices = complete(client, stream, messages=USER, response_format=fmt, n=3, seed=5, **SAMPLE)
    for content, calls, finish in choices:
        assert finish == "stop" and not calls
        jsonschema.validate(json.loads(content), schema)
    # with tools only when they are not in play
    choices = complete(client, stream, messages=USER, response_format=fmt, tools=tools(), tool_choice="none", seed=6,
                       **SAMPLE)
    jsonschema.validate(json.loads(choices[0][0]), schema)


def test_a_json_object_response_format_starts_an_object(client):
    [(content, _, finish)] = complete(client, False, messages=USER, response_format={"type": "json_object"}, seed=2,
                                      **SAMPLE)
    assert content.startswith("{")
    if finish == "stop":
        assert isinstance(json.loads(content), dict)


def test_parse_with_a_pydantic_model_reads_the_reply(client):
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    r = parse(model="codechat", messages=USER, response_format=Answer, n=2, seed=9, **SAMPLE)
    for c in r.choices:
        assert c.finish_reason == "stop" and isinstance(c.message.parsed, Answer)
    stream = getattr(client.chat.completions, "stream", None) or client.beta.chat.completions.stream
    with stream(model="codechat", messages=USER, response_format=Answer, seed=9, **SAMPLE) as events:
        final = events.get_final_completion()
    assert final.choices[0].message.parsed == r.choices[0].message.parsed  # sample 0 of seed 9 either way


BAD = [  # (what, request fields, param, keyword)
    ("unknown format in a tool",
     {"tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
         "type": "object", "properties": {"when": {"type": "string", "format": "stardate"}}}}}]},
     "tools[0].function.parameters.properties.when", "format"),
    ("$ref to nowhere in a named strict tool",
     {"tools": tools() + [{"type": "function", "function": {"name": "g", "strict": True, "parameters": {
         "type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tools[2].function.parameters.properties.x.$ref", "$ref"),
    ("a strict tool requiring a property it does not declare (closed, never satisfiable)",
     {"tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
         "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]}}}],
      "tool_choice": "required"},
     "tools[0].function.parameters.required", "required"),
    ("unknown format in response_format",
     {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {
         "type": "object", "properties": {"d": {"type": "string", "format": "stardate"}}}}}},
     "response_format.json_schema.schema.properties.d", "format"),
    ("$ref to nowhere in response_format",
     {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"$ref": "#/$defs/missing"}}}},
     "response_format.json_schema.schema.$ref", "$ref"),
    ("undeclared tool named", {"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", None),
    ("response_format beside tools", {"tools": tools(), "response_format": {"type": "json_object"}}, "response_format",
     None),
    ("strict not a boolean", {"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]},
     "tools[0].function.strict", None),
]


@pytest.mark.parametrize("what, fields, param, keyword", BAD, ids=[b[0] for b in BAD])
def test_a_request_whose_grammar_cannot_be_built_is_a_400_and_the_server_goes_on(client, server, what, fields, param,
                                                                                 keyword):
    status, _, body = http("POST", server + "/v1/chat/completions", {"model": "codechat", "messages": USER, **fields})
    assert status == 400 and body["error"]["param"] == param, body
    assert body["error"]["message"].startswith(param) and (keyword is None or repr(keyword) in body["error"]["message"])
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="codechat", messages=USER, **fields)
    assert e.value.param == param
    [(content, _, finish)] = complete(client, False, messages=USER, max_tokens=5, seed=1)
    assert finish in ("stop", "length") and content is not None


def test_without_llguidance_a_grammar_is_a_400_and_a_free_request_needs_none(tok, monkeypatch):
    class Missing:
        def __init__(self, *a, **k):
            raise constraints.GrammarUnavailable()

    monkeypatch.setattr(constraints, "GrammarCompiler", Missing)
    grammars = constraints.Grammars(tok, tok.vocab_size)
    body = {"model": "codechat", "messages": USER, "tools": tools(strict=False)}
    assert parse_chat_request(body, tok, 1024, ServeConfig(), grammars).engine_request.grammar is None
    with pytest.raises(APIError) as e:
        parse_chat_request({**body, "tool_choice": "required"}, tok, 1024, ServeConfig(), grammars)
    assert (e.value.status, e.value.code, e.value.param) == (400, "grammar_unavailable", "tool_choice")
    assert "pip install 'codechat[grammar]'" in e.value.message


def test_a_forced_call_streams_its_arguments_in_pieces_that_join_to_the_whole_answers(client):
    kw = dict(model="codechat", messages=USER, tools=tools(strict=None), tool_choice="required", seed=4, **SAMPLE)
    [whole] = client.chat.completions.create(**kw).choices
    pieces, names = [], []
    for ch in client.chat.completions.create(stream=True, **kw):
        for t in ch.choices[0].delta.tool_calls or []:
            names += [t.function.name] if t.function.name else []
            pieces.append(t.function.arguments or "")
    [call] = whole.message.tool_calls
    assert names == [call.function.name] and len([p for p in pieces if p]) > 1
    assert "".join(pieces) == call.function.arguments
    assert_valid_calls([(call.function.name, call.function.arguments)])
