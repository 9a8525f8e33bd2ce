"""Strict output closes its objects (``codechat/chat/strict.py``, "Closed objects") and ends honestly.

Tools derived from plain Python functions (required, optional with a default, a ``Literal`` enum,
``list[int]``) leave ``additionalProperties`` unset, as pydantic's and glaive's schemas do; a
random-weight ``tiny`` model at temperature 1 under ``tool_choice`` ``required`` and named, strict
and not, then writes 200 of 200 calls with no undeclared and no repeated key (cut ones read as far
as they go), every one that ends ``stop`` validates against the closed schema, and the ones cut by
``max_new_tokens`` end ``length`` and are counted. A token the grammar rejects ends its row
``rejected`` with a reason, never ``stop``.
"""
from __future__ import annotations

import json
from typing import Literal

import jsonschema
import pytest
import torch

from codechat.chat.calls import FUNCTION_CALL_TOKEN
from codechat.chat.strict import arguments_schema, closed_schema, response_format_grammar, tool_grammar
from codechat.config.stages import preset
from codechat.engine import Engine, EngineConfig, Request, SamplingConfig
from codechat.engine.grammar import Grammar, GrammarCompiler, GrammarError
from codechat.model import build_model
from codechat.tools import tool_from_function

pytest.importorskip("llguidance", reason="the grammar extra (llguidance) is not installed")
pytestmark = pytest.mark.timeout(300)

N_SAMPLES = 200
MAX_NEW = 96
HOT = SamplingConfig(max_new_tokens=MAX_NEW, temperature=1.0, top_p=1.0)


def book_room(city: str, nights: int, room: Literal["single", "double"] = "single",
              guests: list[int] | None = None) -> str:
    """Book a hotel room.

    Args:
        city: where.
        nights: how many nights.
        room: the kind of room.
        guests: the guests' ages.
    """
    return f"{room} in {city} for {nights}"


def get_weather(city: str, unit: Literal["c", "f"] = "c") -> dict:
    """The weather in a city."""
    return {"city": city, "unit": unit}


TOOLS = [tool_from_function(book_room).schema(), tool_from_function(get_weather).schema()]


@pytest.fixture(scope="module")
def engine(tok) -> Engine:
    torch.manual_seed(0)
    model = build_model(preset("tiny", vocab_size=tok.vocab_size, max_seq_len=512, init_std=0.1)).eval()
    return Engine(model, EngineConfig(slots=64))


@pytest.fixture(scope="module")
def gc(tok, engine: Engine) -> GrammarCompiler:
    return GrammarCompiler(tok, engine.vocab_size)


PARTIAL = "\x00"


def object_keys(text: str) -> list[list[str]]:
    """The keys of every JSON object in ``text`` in the order they open, read as far as the text goes
    (a document cut short included; a key cut short ends with ``PARTIAL``); repeats kept."""
    stack: list[list] = []  # ["obj", keys, expecting a key] or ["arr"]
    found: list[list[str]] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == '"':
            j = i + 1
            while j < len(text) and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if stack and stack[-1][0] == "obj" and stack[-1][2]:
                stack[-1][1].append(json.loads(text[i:j + 1]) if j < len(text) else text[i + 1:] + PARTIAL)
                stack[-1][2] = False
            i = j + 1
            continue
        if c == "{":
            stack.append(["obj", [], True])
            found.append(stack[-1][1])
        elif c == "[":
            stack.append(["arr"])
        elif c in "}]":
            stack.pop()
        elif c == "," and stack and stack[-1][0] == "obj":
            stack[-1][2] = True
        i += 1
    return found


def test_object_keys_reads_a_cut_document():
    assert object_keys('{"name": "f", "arguments": {"a": [1, {"x": 2}], "a": 3, "b') == [
        ["name", "arguments"], ["a", "a", "b" + PARTIAL], ["x"]]


def no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"repeated key in {keys}"
    return dict(pairs)


@pytest.mark.parametrize("choice", ["required", "book_room"])
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "not-strict"])
def test_derived_tools_give_calls_with_only_declared_keys_each_once(choice, strict, tok, engine, gc):
    fc = tok.special_id(FUNCTION_CALL_TOKEN)
    req = Request(tok.encode("Book me a room."), HOT, samples=N_SAMPLES, seed=3, stop_ids=[tok.end_id],
                  grammar=tool_grammar(gc, TOOLS, choice, strict))
    out = engine.generate([req])[0]
    closed = {t["name"]: closed_schema(t["parameters"]) for t in TOOLS}
    finishes = [s.finish for s in out]
    assert set(finishes) <= {"stop", "length"}, finishes
    for s in out:
        assert s.token_ids[0] == fc
        text = tok.decode([t for t in s.token_ids[1:] if t != tok.end_id])
        call_keys, *rest = object_keys(text)
        assert call_keys in (["name", "arguments"], ["name"], []), text  # cut before the arguments, at worst
        if rest:
            name = json.loads(text[text.index(":") + 1:text.index(",")])
            assert choice == "required" or name == choice
            args_keys = [k for k in rest[0] if not k.endswith(PARTIAL)]
            assert len(args_keys) == len(set(args_keys)), f"repeated key: {text!r}"
            declared = closed[name]["properties"]
            assert set(args_keys) <= set(declared), f"undeclared key: {text!r}"
            cut = [k[:-1] for k in rest[0] if k.endswith(PARTIAL)]
            assert all(any(d.startswith(k) for d in declared if d not in args_keys) for k in cut), text
        if s.finish == "stop":
            call = json.loads(text, object_pairs_hook=no_duplicates)
            jsonschema.validate(call["arguments"], closed[call["name"]])
    stopped = finishes.count("stop")
    print(f"{choice}, strict={strict}: {stopped} of {N_SAMPLES} calls finished, "
          f"{finishes.count('length')} cut by length at {MAX_NEW} tokens")
    assert stopped >= N_SAMPLES // 4  # the test checks finished calls, not only cut ones


def test_closing_goes_through_defs_items_and_branches_and_keeps_what_is_open():
    schema = {"$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}}},
              "type": "object", "properties": {
                  "p": {"$ref": "#/$defs/P"},
                  "items": {"type": "array", "items": {"properties": {"y": {"type": "string"}}}},
                  "either": {"anyOf": [{"type": "object", "properties": {"a": {}}}, {"type": "null"}]},
                  "open": {"type": "object", "additionalProperties": True},
                  "map": {"type": "object", "additionalProperties": {"type": "object", "properties": {"z": {}}}},
                  "mixed": {"allOf": [{"type": "object", "properties": {"m": {}}}]}}}
    c = closed_schema(schema)
    assert c["additionalProperties"] is False and c["$defs"]["P"]["additionalProperties"] is False
    props = c["properties"]
    assert props["items"]["items"]["additionalProperties"] is False
    assert props["either"]["anyOf"][0]["additionalProperties"] is False and props["either"]["anyOf"][1] == {"type": "null"}
    assert props["open"] == {"type": "object", "additionalProperties": True}
    assert props["map"]["additionalProperties"]["additionalProperties"] is False  # open to keys, each value closed
    assert props["mixed"] == schema["properties"]["mixed"]  # allOf: as written
    assert "additionalProperties" not in schema  # a new schema: the caller's is unchanged
    assert closed_schema(True) is True and closed_schema({"type": "string"}) == {"type": "string"}
    with pytest.raises(GrammarError, match="required 'b' is not among") as e:
        closed_schema({"type": "object", "properties": {"q": {"type": "object", "properties": {"a": {}},
                                                              "required": ["a", "b"]}}})
    assert e.value.path == "$.properties.q.required" and e.value.keyword == "required"


def test_a_strict_tool_that_cannot_be_honoured_is_refused_and_one_without_strict_falls_back(gc):
    bad = {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}},
                                       "required": ["a", "b"]}}
    with pytest.raises(GrammarError) as e:
        tool_grammar(gc, [bad], "required", strict=True)
    assert e.value.path == "$.tools[0].parameters.required"
    assert arguments_schema(gc, bad, strict=False) == bad["parameters"]  # as written: open, b allowed
    assert isinstance(tool_grammar(gc, [bad], "required", strict=False), Grammar)
    unknown = {"name": "g", "parameters": {"type": "object", "properties": {"d": {"type": "string",
                                                                                 "format": "stardate"}}}}
    assert arguments_schema(gc, unknown, strict=False) == {"type": "object"}  # any object, never refused
    assert arguments_schema(gc, {"name": "h"}, strict=True) == {"type": "object", "properties": {},
                                                                 "additionalProperties": False}


def test_json_object_stays_open_and_json_schema_is_closed(tok, engine, gc):
    open_ = response_format_grammar(gc, {"type": "json_object"})
    schema = {"type": "object", "properties": {"k": {"enum": [1, 2]}}, "required": ["k"]}
    closed = response_format_grammar(gc, {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}})
    out = engine.generate([Request(tok.encode("JSON:"), HOT, samples=40, seed=1, stop_ids=[tok.end_id],
                                   grammar=closed)])[0]
    assert all(s.finish == "stop" for s in out)
    assert {tok.decode([t for t in s.token_ids if t not in tok.special_ids]) for s in out} <= {'{"k": 1}', '{"k": 2}'}
    free_keys = engine.generate([Request(tok.encode("JSON:"), HOT, samples=40, seed=1, stop_ids=[tok.end_id],
                                         grammar=open_)])[0]
    assert any(object_keys(tok.decode(s.token_ids[:-1]))[0] for s in free_keys)  # open: keys of its own


def test_a_token_the_grammar_rejects_ends_the_row_rejected_with_a_reason_never_stop(tok, engine, gc, monkeypatch):
    grammar = tool_grammar(gc, TOOLS, "get_weather")
    real = Grammar.matcher

    def refusing(self):
        m = real(self)
        consume, seen = m.consume, []

        def third_refused(t: int) -> bool:
            seen.append(t)
            return consume(t) if len(seen) < 3 else False
        m.consume = third_refused
        return m
    monkeypatch.setattr(Grammar, "matcher", refusing)
    [s] = engine.generate([Request(tok.encode("x"), HOT, samples=1, seed=0, stop_ids=[tok.end_id],
                                   grammar=grammar)])[0]
    assert s.finish == "rejected" and len(s.token_ids) == 3
    assert "the grammar rejected token" in s.error and "after 2 tokens" in s.error
