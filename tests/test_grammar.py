"""Constrained decoding (``codechat/engine/grammar.py``, ``codechat/chat/strict.py``) in the engine.

A random-weight ``tiny`` model at temperature 1 writes garbage; under a grammar that garbage must
still be valid: 200 of 200 samples under each of six bounded JSON schemas finish (``stop``, not
``length``) and validate with ``jsonschema``; under ``tool_choice`` ``required`` every sample is a
call to a declared tool whose arguments validate; free rows beside constrained ones draw exactly
what they draw alone; log-probs are taken after the mask; bad schemas are errors that say where.
"""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from codechat.chat.calls import parse_reply_ids
from codechat.chat.strict import call_schema, response_format_grammar, tool_grammar
from codechat.config.stages import preset
from codechat.engine import Engine, EngineConfig, Request, SamplingConfig
from codechat.engine import grammar as grammar_mod
from codechat.engine.grammar import GrammarCompiler, GrammarError, GrammarUnavailable, fill_rows, words
from codechat.model import GPT, build_model
from conftest import hide_module

pytest.importorskip("llguidance", reason="the grammar extra (llguidance) is not installed")
pytestmark = pytest.mark.timeout(120)

N_SAMPLES = 200
MAX_NEW = 192
HOT = SamplingConfig(max_new_tokens=MAX_NEW, temperature=1.0, top_p=1.0)

#: Six bounded schemas: every valid document is short, so a sample that runs to ``MAX_NEW`` is a bug.
SCHEMAS = {
    "nested objects": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                  "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                 "required": ["name", "age"], "additionalProperties": False}},
        "required": ["user"], "additionalProperties": False},
    "array min/max items": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5},
                            "minItems": 2, "maxItems": 4},
    "enums": {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]},
                                               "level": {"enum": [1, 2, 3, "high", None]}},
              "required": ["unit", "level"], "additionalProperties": False},
    "integers vs numbers": {"type": "object", "properties": {
        "count": {"type": "integer", "minimum": 0, "maximum": 999},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.125}},  # bounded digits (binary-exact)
        "required": ["count", "ratio"], "additionalProperties": False},
    "required and optional": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 50}, "note": {"type": "string", "maxLength": 6},
        "flag": {"type": "boolean"}}, "required": ["id"], "additionalProperties": False},
    "additionalProperties false, maxLength": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10}, "country": {"type": "string", "minLength": 2, "maxLength": 2}},
        "required": ["city", "country"], "additionalProperties": False},
}
TOOLS = [
    {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"], "additionalProperties": False}},
    {"name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": -99, "maximum": 99}, "b": {"type": "integer", "minimum": -99, "maximum": 99}},
        "required": ["a", "b"], "additionalProperties": False}},
]


@pytest.fixture(scope="module")
def model(tok) -> GPT:
    torch.manual_seed(0)
    return build_model(preset("tiny", vocab_size=tok.vocab_size, max_seq_len=512, init_std=0.1)).eval()


@pytest.fixture(scope="module")
def engine(model: GPT) -> Engine:
    return Engine(model, EngineConfig(slots=64))


@pytest.fixture(scope="module")
def gc(tok, model: GPT) -> GrammarCompiler:
    return GrammarCompiler(tok, model.cfg.vocab_size)


def text_of(tok, ids: list[int]) -> str:
    return tok.decode([t for t in ids if t not in tok.special_ids])


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_every_sample_under_a_bounded_schema_finishes_and_validates(name, tok, engine, gc):
    schema = SCHEMAS[name]
    req = Request(tok.encode("Answer in JSON:"), HOT, samples=N_SAMPLES, seed=7, stop_ids=[tok.end_id],
                  grammar=gc.json_schema(schema))
    out = engine.generate([req])[0]
    cut = [s for s in out if s.finish == "length"]
    assert not cut, f"{len(cut)} samples cut by max_new_tokens, e.g. {text_of(tok, cut[0].token_ids)!r}"
    assert [s.finish for s in out] == ["stop"] * N_SAMPLES
    docs = [json.loads(text_of(tok, s.token_ids)) for s in out]
    for d in docs:
        jsonschema.validate(d, schema)
    assert len({json.dumps(d) for d in docs}) >= 5  # sampled, not one document 200 times


def test_tool_choice_required_always_calls_a_declared_tool_with_valid_arguments(tok, engine, gc):
    out = engine.generate([Request(tok.encode("What now?"), HOT, samples=N_SAMPLES, seed=3, stop_ids=[tok.end_id],
                                   grammar=tool_grammar(gc, TOOLS, "required"))])[0]
    params = {t["name"]: t["parameters"] for t in TOOLS}
    names = set()
    for s in out:
        assert s.finish == "stop"
        reply = parse_reply_ids(tok, s.token_ids)
        assert reply.error is None and reply.call is not None and reply.content == ""
        jsonschema.validate(reply.call["arguments"], params[reply.call["name"]])
        names.add(reply.call["name"])
    assert names == set(params)


def test_a_named_tool_choice_calls_that_tool(tok, engine, gc):
    out = engine.generate([Request(tok.encode("Sum"), HOT, samples=20, seed=5, stop_ids=[tok.end_id],
                                   grammar=tool_grammar(gc, TOOLS, "add"))])[0]
    assert {parse_reply_ids(tok, s.token_ids).call["name"] for s in out} == {"add"}


def test_auto_with_strict_tools_is_text_or_a_valid_call(tok, engine, gc):
    out = engine.generate([Request(tok.encode("Hi"), SamplingConfig(max_new_tokens=48, temperature=1.0, top_p=1.0),
                                   samples=40, seed=9, stop_ids=[tok.end_id], grammar=tool_grammar(gc, TOOLS, "auto"))])[0]
    for s in out:
        reply = parse_reply_ids(tok, s.token_ids)
        if reply.call is not None:
            assert reply.error is None and s.finish == "stop"
            jsonschema.validate(reply.call["arguments"], {t["name"]: t["parameters"] for t in TOOLS}[reply.call["name"]])
    assert tool_grammar(gc, TOOLS, "auto", strict=False) is None and tool_grammar(gc, TOOLS, "none") is None


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_free_rows_beside_constrained_rows_draw_what_they_draw_alone(temperature, tok, model):
    free = [Request(tok.encode(p), SamplingConfig(max_new_tokens=24, temperature=temperature, top_p=1.0), samples=2, seed=11)
            for p in ("def f(x):", "import os\n", "class A:")]
    alone = Engine(model, EngineConfig(slots=16)).generate(free)
    eng = Engine(model, EngineConfig(slots=16))
    gc = GrammarCompiler(tok, model.cfg.vocab_size)
    constrained = Request(tok.encode("JSON:"), HOT, samples=4, seed=1, grammar=gc.json_schema(SCHEMAS["enums"]))
    ids = [eng.add(constrained), *[eng.add(r) for r in free]]
    for _ in eng.run():
        pass
    mixed = [eng.pop(i) for i in ids[1:]]
    assert [[s.token_ids for s in r] for r in mixed] == [[s.token_ids for s in r] for r in alone]
    flat = lambda rs: [lp for r in rs for s in r for lp in s.logprobs_t1]  # noqa: E731
    assert flat(mixed) == pytest.approx(flat(alone), abs=1e-5)


@pytest.mark.parametrize("wider", [0, 3], ids=["model as wide as the tokenizer", "model logits wider"])
def test_fill_rows_writes_each_matchers_mask_into_its_row(wider, tok, gc):
    """The batch of masks is each matcher's own mask in its row, rows in any order and stale words
    cleared, also into a buffer wider than the tokenizer; rows not asked for are left alone."""
    rng = torch.Generator().manual_seed(0)
    grammars = [tool_grammar(gc, TOOLS, "required")] + [gc.json_schema(s) for s in SCHEMAS.values()]
    matchers = [grammars[i % len(grammars)].matcher() for i in range(12)]
    for step, m in enumerate(matchers):  # walk each to a different place
        for _ in range(step % 5):
            buf = torch.zeros(1, words(gc.vocab_size), dtype=torch.int32)
            m.fill(buf[0])
            allowed = grammar_mod.unpack(buf, gc.vocab_size)[0].nonzero().flatten()
            if m.done or not allowed.numel():
                break
            m.consume(int(allowed[torch.randint(allowed.numel(), (1,), generator=rng)]))
    rows = [(m, 2 * i + 1) for i, m in enumerate(matchers) if not m.done][::-1]
    shape = (2 * len(matchers) + 1, words(gc.vocab_size) + wider)
    batch = torch.full(shape, -1, dtype=torch.int32)
    fill_rows(rows, batch)
    assert len(rows) >= 8
    for m, i in rows:
        own = torch.zeros(1, words(gc.vocab_size), dtype=torch.int32)
        m.fill(own[0])
        assert own.any() and torch.equal(batch[i, :words(gc.vocab_size)], own[0])
    assert (batch[[i for _, i in rows], words(gc.vocab_size):] == 0).all()
    assert (batch[0] == -1).all(), "rows not asked for are left alone"


def test_fill_rows_refuses_a_buffer_it_cannot_write_by_address(gc):
    """``fill_rows`` writes through row addresses, so a buffer of another dtype, or whose words are
    not contiguous, is an error, not a corrupted mask."""
    m = gc.json_schema(SCHEMAS[next(iter(SCHEMAS))]).matcher()
    w = words(gc.vocab_size)
    with pytest.raises(ValueError, match="int32"):
        fill_rows([(m, 0)], torch.zeros(1, w, dtype=torch.int64))
    with pytest.raises(ValueError, match="contiguous"):
        fill_rows([(m, 0)], torch.zeros(1, 2 * w, dtype=torch.int32)[:, ::2])
    fill_rows([], torch.zeros(1, 1, dtype=torch.int64))  # nothing to write: nothing checked


def test_logprobs_are_taken_after_the_mask(tok, engine, gc):
    """Under ``required`` the reply's first token (the call opener) and the ``{`` after it are the
    only tokens allowed: probability 1 after the mask, under both returned log-probs."""
    s = engine.generate([Request(tok.encode("x"), HOT, samples=1, seed=2, grammar=tool_grammar(gc, TOOLS, "required"))])[0][0]
    assert s.logprobs[:2] == pytest.approx([0.0, 0.0], abs=1e-5)
    assert s.logprobs_t1[:2] == pytest.approx([0.0, 0.0], abs=1e-5)
    assert all(lp <= 1e-6 for lp in s.logprobs_t1)


def test_a_grammar_that_cannot_finish_in_max_tokens_ends_with_length(tok, engine, gc):
    s = engine.generate([Request(tok.encode("x"), SamplingConfig(max_new_tokens=10, temperature=1.0), samples=1, seed=4,
                                 grammar=gc.regex("a{300}"))])[0][0]
    assert s.finish == "length" and len(s.token_ids) == 10
    assert set(tok.decode(s.token_ids)) == {"a"}


@pytest.mark.parametrize("schema, path, keyword", [
    ({"type": "object", "properties": {"b": {"type": "string", "format": "weird"}}}, "$.properties.b", "format"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/nowhere"}}}, "$.properties.a.$ref", "$ref"),
    ({"type": "object", "properties": {"a": {"type": "strin"}}}, "$.properties.a", "type"),
    ({"type": "object", "properties": {"x": {"type": "string", "pattern": "(("}}}, "$.properties.x", None),
])
def test_a_schema_the_library_cannot_compile_is_an_error_that_says_where(schema, path, keyword, gc):
    with pytest.raises(GrammarError) as e:
        gc.json_schema(schema)
    assert (e.value.path, e.value.keyword) == (path, keyword)
    assert path in str(e.value)


def test_cycles_deep_nesting_and_huge_enums_end_in_an_error_or_a_grammar_never_a_hang(tok, engine, gc):
    with pytest.raises(GrammarError, match="admits no output"):
        gc.json_schema({"$ref": "#"})
    deep: dict = {"type": "object"}
    for _ in range(300):
        deep = {"type": "object", "properties": {"a": deep}, "required": ["a"]}
    with pytest.raises(GrammarError, match="recursion limit"):
        gc.json_schema(deep)
    big = {"type": "object", "properties": {"v": {"enum": [f"v{i}" for i in range(10_000)]}},
           "required": ["v"], "additionalProperties": False}
    out = engine.generate([Request(tok.encode("x"), HOT, samples=8, seed=1, grammar=gc.json_schema(big))])[0]
    for s in out:
        jsonschema.validate(json.loads(text_of(tok, s.token_ids)), big)


def test_tool_and_response_format_errors_name_their_request_field(gc):
    with pytest.raises(GrammarError) as e:
        tool_grammar(gc, TOOLS, "delete_everything")
    assert e.value.path == "$.tool_choice"
    bad = [*TOOLS, {"name": "odd", "parameters": {"type": "object", "properties": {"d": {"format": "nope", "type": "string"}}}}]
    with pytest.raises(GrammarError) as e:
        tool_grammar(gc, bad, "required")
    assert (e.value.path, e.value.keyword) == ("$.tools[2].parameters.properties.d", "format")
    with pytest.raises(GrammarError) as e:
        response_format_grammar(gc, {"type": "json_schema", "json_schema": {"name": "x"}})
    assert e.value.path == "$.response_format.json_schema.schema"
    assert response_format_grammar(gc, {"type": "text"}) is None


def test_compiled_grammars_are_cached(gc):
    a = gc.json_schema(SCHEMAS["enums"])
    assert gc.json_schema(json.loads(json.dumps(SCHEMAS["enums"]))) is a
    assert call_schema(TOOLS)["anyOf"][1]["properties"]["name"] == {"const": "add"}


def test_a_grammar_of_another_tokenizer_is_refused(tok):
    small = build_model(preset("tiny", vocab_size=tok.vocab_size // 2, max_seq_len=64)).eval()
    with pytest.raises(ValueError, match="not the model's"):
        GrammarCompiler(tok, small.cfg.vocab_size)
    with pytest.raises(ValueError, match="model's own tokenizer"):
        Engine(small, EngineConfig(slots=2)).add(Request([1], grammar=GrammarCompiler(tok).json_schema({"type": "object"})))


def test_without_the_grammar_library_a_constraint_is_a_clear_error(tok, monkeypatch):
    hide_module(monkeypatch, "llguidance")
    with pytest.raises(GrammarUnavailable, match=r"codechat\[grammar\]"):
        GrammarCompiler(tok)
