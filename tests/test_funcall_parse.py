"""Function-call parsing: every accepted form, every ParseError reason with its position, and every call of the
glaive sample parsed and validated against its conversation's tools.

Cases from ``shared/cases``: 19 (raw glaive quoting), 20 (arguments rendered once). Data:
``shared/data/function_calling_glaive`` (211 calls in 300 conversations). Each is also checked on the project's own
inputs in ``tests/fixtures/cases_b/`` (the shared ones skip when ``shared/`` is absent).
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codechat.chat.calls import (FUNCTION_CALL_TOKEN, PARSE_ERROR_REASONS, ParseError, format_call, normalize_call,
                            parse_assistant, parse_assistant_text, parse_call, parse_reply, parse_reply_ids)
from codechat.chat.conversation import Conversation, Message, parse_conversation, reply_message, render
from codechat.data.formats import load_records
from codechat.data.readers import read_rows
from codechat.tools import Tool, validate_arguments
from conftest import FIXTURES, shared_file

CASES_B = FIXTURES / "cases_b"
CASE19 = "cases/19-glaive-functioncall-quoting.jsonl"
CASE20 = "cases/20-tool-args-double-encoding.jsonl"
GLAIVE = "data/function_calling_glaive/glaive_toolcall_en_demo.json"
F = {"name": "f", "arguments": {"a": 1}}


# ----------------------------------------------------------------------------- accepted forms
@pytest.mark.parametrize("text,content,call,trailing", [
    pytest.param('<functioncall> {"name": "f", "arguments": {"a": 1}}', "", F, "", id="seed-marker-object"),
    pytest.param('<|function_call|>{"name": "f", "arguments": {"a": 1}}', "", F, "", id="token-spelled-as-text"),
    pytest.param('<functioncall> {"name": "f", "arguments": "{\\"a\\": 1}"}', "", F, "", id="arguments-json-string"),
    pytest.param('<functioncall> {"name": "f", "arguments": "\\"{\\\\\\"a\\\\\\": 1}\\""}', "", F, "",
                 id="arguments-double-encoded"),
    pytest.param("<functioncall> "
                 """{"name": "send", "arguments": '{"to": "Sam", "text": "I'll be late, don't wait"}'}""",
                 "", {"name": "send", "arguments": {"to": "Sam", "text": "I'll be late, don't wait"}}, "",
                 id="glaive-single-quoted-apostrophes"),
    pytest.param("""<functioncall> {"name": "f", "arguments": '{"q": "it's {x}", "n": [{"k": "}'"}]}'}""", "",
                 {"name": "f", "arguments": {"q": "it's {x}", "n": [{"k": "}'"}]}}, "",
                 id="glaive-single-quoted-braces-and-quote-in-strings"),
    pytest.param("""<functioncall> {"name": "f", "arguments": ''}""", "", {"name": "f", "arguments": {}}, "",
                 id="glaive-empty-quoted"),
    pytest.param('Let me check. <functioncall> {"name": "f", "arguments": {"a": 1}}', "Let me check.", F, "",
                 id="prose-before"),
    pytest.param('<functioncall> {"name": "f", "arguments": {"a": 1}} I will tell you when it answers.', "", F,
                 "I will tell you when it answers.", id="prose-after-is-trailing"),
    pytest.param('<functioncall> {"name": "f", "arguments": {"a": 1}}} {"name": "g"}', "", F, '} {"name": "g"}',
                 id="first-complete-object-wins"),
    pytest.param('<functioncall> {"name": "f", "arguments": {"a": 1}} <|endoftext|>', "", F, "",
                 id="end-marker-stripped"),
    pytest.param('<functioncall> {"name": "f", "arguments": {"a": 1}}<|end|>\n', "", F, "", id="end-token-text"),
    pytest.param('Calling:\n<functioncall> ```json\n{"name": "f", "arguments": {"a": 1}}\n```\nDone.', "Calling:",
                 F, "Done.", id="fence-after-marker"),
    pytest.param('Calling:\n```json\n<functioncall> {"name": "f", "arguments": {"a": 1}}\n```', "Calling:", F, "",
                 id="fence-before-marker"),
    pytest.param('<functioncall>\n{\n  "arguments": {\n    "a": 1\n  },\n  "name": "f"\n}', "", F, "",
                 id="pretty-printed-arguments-first"),
    pytest.param('<functioncall> {"id": "c1", "type": "function", "name": "f", "arguments": {"a": 1}}', "", F, "",
                 id="extra-keys-dropped"),
    pytest.param('<functioncall> {"name": "f"}', "", {"name": "f", "arguments": {}}, "", id="no-arguments"),
    pytest.param('<functioncall> {"name": "f", "arguments": null}', "", {"name": "f", "arguments": {}}, "",
                 id="null-arguments"),
    pytest.param('<functioncall> {"name": "météo", "arguments": {"city": "São Paulo"}}', "",
                 {"name": "météo", "arguments": {"city": "São Paulo"}}, "", id="unicode"),
    pytest.param('Just text, {"name": "f", "arguments": {}} is JSON, not a call.',
                 'Just text, {"name": "f", "arguments": {}} is JSON, not a call.', None, "", id="no-marker-no-call"),
])
def test_parse_reply_accepts_each_form(text, content, call, trailing):
    reply = parse_reply(text)
    assert (reply.content, reply.call, reply.error, reply.trailing) == (content, call, None, trailing)
    assert reply.text[reply.trailing_at:].rstrip() == trailing
    assert parse_assistant_text(text) == (content, call)  # the lenient tuple form drops the trailing text
    if trailing:
        with pytest.raises(ParseError) as e:
            parse_assistant_text(text, strict=True)
        assert (e.value.reason, e.value.position) == ("trailing_text", text.index(trailing))
    else:
        assert parse_assistant_text(text, strict=True) == (content, call)


def test_parse_call_forms_and_whole_text_rule():
    assert parse_call('  {"name": "f", "arguments": {"a": 1}}\n') == F
    assert parse_call("""{"name": "f", "arguments": '{"a": 1}'}""") == F
    assert parse_call('```json\n{"name": "f", "arguments": {"a": 1}}\n```') == F
    assert normalize_call('{"name": "f", "arguments": "{\\"a\\": 1}"}') == F
    assert normalize_call({"name": "f", "arguments": '{"a": 1}', "id": "x"}) == F


# ----------------------------------------------------------------------------- errors
def _at(text: str, piece: str) -> int:
    return text.index(piece)


@pytest.mark.parametrize("text,reason,position", [
    pytest.param("Sure <functioncall>", "no_json", len("Sure <functioncall>"), id="marker-at-end"),
    pytest.param("<functioncall>   call f(1)", "no_json", len("<functioncall>   "), id="prose-after-marker"),
    pytest.param("<functioncall> [1, 2]", "no_json", len("<functioncall> "), id="array-not-object"),
    pytest.param('<functioncall> {"name": "f", "arguments": {oops}}', "bad_json",
                 _at('<functioncall> {"name": "f", "arguments": {oops}}', "oops"), id="bad-nested-json"),
    pytest.param('<functioncall> {"name": "f", "arguments": {"a": 1', "bad_json",
                 len('<functioncall> {"name": "f", "arguments": {"a": 1'), id="truncated"),
    pytest.param("<functioncall> {'name': 'f'}", "bad_json", len("<functioncall> {"), id="python-quotes"),
    pytest.param("""<functioncall> {"name": "f", "arguments": '{"a": 1}}""", "bad_json",
                 len("""<functioncall> {"name": "f", "arguments": '{"a": 1}"""), id="unterminated-single-quote"),
    pytest.param('<functioncall> {"name": "f" "arguments": {}}', "bad_json", len('<functioncall> {"name": "f" '),
                 id="missing-comma"),
    pytest.param('<functioncall> {"name": "f", "arguments": "a=1"}', "bad_json",
                 len('<functioncall> {"name": "f", "arguments": '), id="arguments-string-not-json"),
    pytest.param('<functioncall> {"arguments": {"a": 1}}', "no_name", len("<functioncall> "), id="name-missing"),
    pytest.param('<functioncall> {"name": "", "arguments": {}}', "no_name", len('<functioncall> {"name": '),
                 id="name-empty"),
    pytest.param('<functioncall> {"name": 3, "arguments": {}}', "no_name", len('<functioncall> {"name": '),
                 id="name-not-string"),
    pytest.param('<functioncall> {"name": "f", "arguments": [1, 2]}', "arguments_not_object",
                 len('<functioncall> {"name": "f", "arguments": '), id="arguments-list"),
    pytest.param('<functioncall> {"name": "f", "arguments": "[1, 2]"}', "arguments_not_object",
                 len('<functioncall> {"name": "f", "arguments": '), id="arguments-string-of-list"),
    pytest.param("""<functioncall> {"name": "f", "arguments": '42'}""", "arguments_not_object",
                 len('<functioncall> {"name": "f", "arguments": '), id="arguments-glaive-number"),
])
def test_each_parse_error_reason_has_its_position(text, reason, position):
    reply = parse_reply(text)
    assert reply.call is None and reply.content == text  # nothing is lost
    e = reply.error
    assert isinstance(e, ParseError) and isinstance(e, ValueError)
    assert (e.reason, e.position, e.text) == (reason, position, text)
    assert e.reason in PARSE_ERROR_REASONS and e.message and e.message in str(e)
    assert parse_assistant_text(text) == (text, None)
    with pytest.raises(ParseError) as raised:
        parse_assistant_text(text, strict=True)
    assert (raised.value.reason, raised.value.position) == (reason, position)
    start = text.index("<functioncall>") + len("<functioncall>")
    with pytest.raises(ParseError) as raised:  # the same call without its marker, as parse_call reads it
        parse_call(text[start:])
    assert (raised.value.reason, raised.value.position) == (reason, position - start)


@pytest.mark.parametrize("text,reason,position", [
    ('{"name": "f"} and more', "trailing_text", 14), ('{"name": "f"}\n```', "trailing_text", 14),
    ('{"name": "f"}{"name": "g"}', "trailing_text", 13), ("", "no_json", 0), ("  ", "no_json", 2)])
def test_parse_call_reads_exactly_one_call(text, reason, position):
    with pytest.raises(ParseError) as e:
        parse_call(text)
    assert (e.value.reason, e.value.position) == (reason, position)


@pytest.mark.parametrize("call,reason,match", [
    ({"arguments": {}}, "no_name", "non-empty string 'name'"),
    ({"name": "f", "arguments": "[1, 2]"}, "arguments_not_object", "JSON object"),
    ({"name": "f", "arguments": 7}, "arguments_not_object", "JSON object"),
    ({"name": "f", "arguments": "{oops"}, "bad_json", "not JSON"),
    ({"name": "f", "arguments": '{"a": ' * 5000 + "1" + "}" * 5000}, "bad_json", "RecursionError"),
    ({"name": "f", "arguments": '{"a": 1' + "0" * 5000 + "}"}, "bad_json", "digits"),
    (["f", {}], "no_json", "mapping"),
])
def test_call_dicts_raise_parse_errors_too(call, reason, match):
    with pytest.raises(ParseError, match=match) as e:
        normalize_call(call)
    assert (e.value.reason, e.value.position) == (reason, 0)
    if isinstance(call, dict):
        with pytest.raises(ParseError):
            Message("assistant", "", call)


@pytest.mark.parametrize("json_text", ['{"a": ' * 5000 + "1" + "}" * 5000, '{"a": 1' + "0" * 5000 + "}"],
                         ids=["nested-5000-deep", "an-int-of-5000-digits"])
def test_json_no_parser_can_read_is_a_parse_error_not_a_crash(tok, json_text):
    """Model output (or a client's history) that Python's JSON decoder cannot take is a bad call, never a crash."""
    call = '{"name": "f", "arguments": ' + json_text + "}"
    for text in ("<functioncall> " + call, FUNCTION_CALL_TOKEN + call):
        reply = parse_reply(text)
        assert reply.call is None and reply.error.reason == "bad_json" and reply.content == text
    with pytest.raises(ParseError, match="bad_json"):
        parse_call(call)
    reply = parse_reply_ids(tok, [tok.special_id(FUNCTION_CALL_TOKEN), *tok.encode(call)])
    assert reply.call is None and reply.error.reason == "bad_json"


def test_parse_error_serialises_for_a_function_response_and_pickles():
    e = parse_reply('<functioncall> {"name": "f", "arguments": [1]}').error
    assert e.as_dict() == {"reason": "arguments_not_object", "position": 42,
                           "message": "function-call arguments must be a JSON object, got list: '[1]'"}
    json.dumps(e.as_dict())
    back = pickle.loads(pickle.dumps(e))
    assert (back.reason, back.message, back.position, back.text, str(back)) == (e.reason, e.message, e.position,
                                                                                e.text, str(e))


def test_ids_with_the_call_token_report_positions_in_the_spelled_out_text(tok):
    fc = tok.special_id(FUNCTION_CALL_TOKEN)
    ids = tok.encode("Hm. ") + [fc] + tok.encode('{"name": "f", "arguments": {bad}}') + [tok.end_id]
    reply = parse_reply_ids(tok, ids)
    spelled = 'Hm. <|function_call|>{"name": "f", "arguments": {bad}}'
    assert (reply.content, reply.call, reply.text) == (spelled, None, spelled)
    assert (reply.error.reason, reply.error.position) == ("bad_json", spelled.index("bad"))
    assert parse_assistant(tok, ids) == (spelled, None)
    with pytest.raises(ParseError, match="bad_json"):
        parse_assistant(tok, ids, strict=True)
    ok = tok.encode("Hm. ") + [fc] + tok.encode('{"name": "f", "arguments": {"a": 1}} then text') + [tok.end_id]
    reply = parse_reply_ids(tok, ok)
    assert (reply.content, reply.call, reply.trailing) == ("Hm. ", F, "then text")  # content kept exactly
    assert parse_assistant(tok, ok) == ("Hm. ", F)
    with pytest.raises(ParseError, match="trailing_text"):
        parse_assistant(tok, ok, strict=True)
    assert reply_message(reply) == Message("assistant", "Hm. ", F)


# ----------------------------------------------------------------------------- rendering
def test_a_call_is_rendered_once_as_json_and_parses_back(tok):
    as_string = Message("assistant", "", {"name": "f", "arguments": '{"q": "it\'s \\"x\\""}'})
    as_object = Message("assistant", "", {"name": "f", "arguments": {"q": 'it\'s "x"'}})
    assert as_string == as_object
    text = format_call(as_string.function_call)
    assert text == '{"name": "f", "arguments": {"q": "it\'s \\"x\\""}}' and json.loads(text)["arguments"] == \
        {"q": 'it\'s "x"'}
    conv = Conversation((Message("user", "go"), as_string))
    ids, _ = render(tok, conv)
    assert FUNCTION_CALL_TOKEN + text + "<|end|>" in tok.decode(ids)
    assert parse_conversation(tok, ids) == conv


@settings(max_examples=150, deadline=None)
@given(name=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8).filter(str.strip),
       args=st.dictionaries(st.text(max_size=6), st.recursive(
           st.none() | st.booleans() | st.integers() | st.text(max_size=8),
           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=6),
           max_size=3),
       prose=st.text(st.characters(blacklist_characters="<`", blacklist_categories=("Cs",)), max_size=20),
       trailing=st.text(st.characters(blacklist_characters="<", blacklist_categories=("Cs",)), max_size=20),
       form=st.sampled_from(["object", "json-string", "glaive"]))
def test_trailing_text_never_leaks_into_the_arguments(name, args, prose, trailing, form):
    call = {"name": name, "arguments": args}
    dumped = json.dumps(args, ensure_ascii=False)
    arguments = {"object": dumped, "json-string": json.dumps(dumped), "glaive": f"'{dumped}'"}[form]
    text = f'{prose}<functioncall> {{"name": {json.dumps(name)}, "arguments": {arguments}}} {trailing}'
    reply = parse_reply(text)
    assert (reply.content, reply.call, reply.error, reply.trailing) == (prose.rstrip(), call, None, trailing.strip())
    assert parse_call(format_call(call)) == call


# ----------------------------------------------------------------------------- case 19
CASE19_EXPECTED = [
    ("apostrophes-in-args", [{"name": "send_message", "arguments": {"to": "Sam", "text": "I'll be late, don't wait"}}]),
    ("nested-and-braces-in-strings", [{"name": "place_order", "arguments": {"items": [{"name": "tea", "qty": 2}],
                                                                            "note": "it's for {room 4}"}}]),
    ("unicode-arg", [{"name": "get_weather", "arguments": {"city": "São Paulo"}}]),
    ("arguments-as-object", [{"name": "get_weather", "arguments": {"city": "Oslo"}}]),
    ("no-call", []),
]


def check_raw_glaive_row(tok, path: Path, case_id: str, expected: list[dict]) -> None:
    """Row ``case_id`` of a raw glaive file: the loader and the reply parser both give ``expected``."""
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    k = [r["id"] for r in rows].index(case_id)
    row, rec = rows[k], load_records(path)[k]
    assert row["_expected_calls"] == expected
    assert [m.function_call for m in rec.conversation.messages if m.function_call] == expected  # the loader
    ids, _ = render(tok, rec.conversation)
    assert parse_conversation(tok, ids) == rec.conversation
    # the raw assistant text as a model would emit it: the turn alone, then with all the chat after it
    marker = "ASSISTANT: <functioncall>"
    if not expected:
        assert marker not in row["chat"]
        reply = parse_reply(row["chat"].split("ASSISTANT: ")[1])
        assert reply.call is None and reply.error is None
        return
    rest = row["chat"][row["chat"].index(marker) + len("ASSISTANT: "):]
    turn = rest.split("\n")[0]
    assert turn.endswith("<|endoftext|>")
    assert parse_reply(turn).call == expected[0] and parse_reply(turn).trailing == ""
    assert parse_assistant_text(turn, strict=True) == ("", expected[0])
    reply = parse_reply(rest)  # trailing: <|endoftext|>, the function response, the next turn
    assert reply.call == expected[0] and reply.trailing.startswith("<|endoftext|>\n\n\nFUNCTION RESPONSE: ")


@pytest.mark.parametrize("case_id,expected", CASE19_EXPECTED, ids=[c for c, _ in CASE19_EXPECTED])
def test_case19_raw_glaive_call_parses_to_the_expected_dict(tok, case_id, expected):
    check_raw_glaive_row(tok, shared_file(CASE19), case_id, expected)


#: the fixture's rows and what they must give (written here, not read from the file, so a wrong file fails)
GLAIVE_QUOTING_EXPECTED = [
    ("apostrophes", [{"name": "create_note", "arguments": {"title": "Ann's party",
                                                           "body": "It isn't on Friday, don't forget"}}]),
    ("nested-braces", [{"name": "book_table", "arguments": {
        "guests": [{"name": "Bo", "age": 30}, {"name": "Cy", "tags": ["vip"]}], "remark": "it's {window} }{"}}]),
    ("unicode-two-tools", [{"name": "translate", "arguments": {"text": "Grüße aus Kraków", "to": "en"}}]),
    ("arguments-object", [{"name": "translate", "arguments": {"text": "hi", "to": "fr"}}]),
    ("no-call", []),
]


@pytest.mark.parametrize("case_id,expected", GLAIVE_QUOTING_EXPECTED, ids=[c for c, _ in GLAIVE_QUOTING_EXPECTED])
def test_raw_glaive_call_parses_to_the_expected_dict_fixture(tok, case_id, expected):
    check_raw_glaive_row(tok, CASES_B / "glaive_quoting.jsonl", case_id, expected)


# ----------------------------------------------------------------------------- case 20
CASE20_EXPECTED = [("args-as-json-string", {"city": "Paris"}), ("args-as-object", {"city": "Paris"}),
                   ("args-string-with-quotes", {"city": 'Paris "rive gauche"'})]


def check_arguments_parse_once(tok, path: Path, case_id: str, name: str, arguments: dict) -> None:
    """Row ``case_id`` of an OpenAI-messages file: its call's arguments (a JSON string or an object) parse to
    ``arguments`` and render once, as an object."""
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    k = [r["id"] for r in rows].index(case_id)
    fn = rows[k]["messages"][1]["tool_calls"][0]["function"]
    expected = {"name": name, "arguments": arguments}
    assert parse_call(json.dumps(fn)) == expected  # a JSON string inside JSON is decoded once
    conv = load_records(path)[k].conversation
    assert conv.messages[1] == Message("assistant", "", expected)  # content null -> ""
    assert format_call(expected) == json.dumps(expected, ensure_ascii=False)
    ids, _ = render(tok, conv)
    text = tok.decode(ids)
    assert '"arguments": {' in text and '"arguments": "' not in text and "None" not in text
    head = ids.index(tok.special_id("<|assistant|>"))
    assert parse_assistant(tok, ids[head + 1:]) == ("", expected)  # stops at <|end|>
    reply = parse_reply(tok.decode(ids[head + 1:]))  # as text: the later turns follow the call
    assert reply.call == expected and reply.trailing.startswith("<|end|><|function_response|>")


@pytest.mark.parametrize("case_id,arguments", CASE20_EXPECTED, ids=[c for c, _ in CASE20_EXPECTED])
def test_case20_arguments_parse_to_a_dict_and_render_once(tok, case_id, arguments):
    check_arguments_parse_once(tok, shared_file(CASE20), case_id, "get_weather", arguments)


ARGS_ENCODING_EXPECTED = [("args-json-string-content-null", {"word": "serendipity"}),
                          ("args-object-content-empty", {"word": "serendipity"}),
                          ("args-string-with-quotes", {"word": 'the "so-called" serendipity'})]


@pytest.mark.parametrize("case_id,arguments", ARGS_ENCODING_EXPECTED, ids=[c for c, _ in ARGS_ENCODING_EXPECTED])
def test_arguments_parse_to_a_dict_and_render_once_fixture(tok, case_id, arguments):
    check_arguments_parse_once(tok, CASES_B / "args_encoding.jsonl", case_id, "lookup_word", arguments)


# ----------------------------------------------------------------------------- the glaive sample
def _glaive_calls(path: Path) -> list[tuple[int, dict, dict]]:
    """(record line, call, {tool name: schema}) of every call in a ShareGPT function-calling file, read by the
    project's loader."""
    out = []
    for rec in load_records(path):
        tools = {t["name"]: t for t in rec.conversation.tools or ()}
        out += [(rec.line, m.function_call, tools) for m in rec.conversation.messages if m.function_call]
    return out


def check_calls_parse_in_every_spelling(path: Path, n_calls: int) -> list[dict]:
    """Every call of ``path`` parses from the file's own text and from the raw glaive, JSON-string and codechat
    spellings to the loader's dict; returns the calls."""
    calls = _glaive_calls(path)
    assert len(calls) == n_calls
    raw = [(line, t["value"]) for line, row in read_rows(path) for t in row["conversations"]
           if t["from"] == "function_call"]
    assert [line for line, _ in raw] == [line for line, _, _ in calls]
    for (line, value), (_, call, _) in zip(raw, calls):
        assert parse_call(value) == call, line  # the file's own text
        assert isinstance(call["arguments"], dict)
        args = json.dumps(call["arguments"], ensure_ascii=False)
        name = json.dumps(call["name"])
        for spelling in (f'<functioncall> {{"name": {name}, "arguments": \'{args}\'}} <|endoftext|>',  # raw glaive
                         f'<functioncall> {{"name": {name}, "arguments": {json.dumps(args)}}}',  # JSON string
                         f"Sure.\n{FUNCTION_CALL_TOKEN}{format_call(call)}<|end|>"):  # ours, as text
            reply = parse_reply(spelling)
            assert (reply.call, reply.error, reply.trailing) == (call, None, ""), (line, spelling)
    return [call for _, call, _ in calls]


def validation_errors(path: Path) -> tuple[int, list[tuple[str, str]]]:
    """(calls, [(tool name, error)]) of the calls of ``path`` validated against their own conversation's tools."""
    calls = _glaive_calls(path)
    errors = []
    for line, call, tools in calls:
        schema = tools[call["name"]]  # every call names a tool of its own conversation
        params = schema["parameters"]
        jsonschema.Draft202012Validator.check_schema(params)  # used as written: no normalisation needed
        tool = Tool(schema["name"], schema.get("description", ""), params, source=f"{path}:{line}")
        error = validate_arguments(tool, call["arguments"])
        if error is not None:
            errors.append((call["name"], error))
    return len(calls), errors


def test_glaive_sample_all_211_calls_parse_in_every_spelling():
    check_calls_parse_in_every_spelling(shared_file(GLAIVE), 211)


def test_sharegpt_fixture_calls_parse_in_every_spelling():
    calls = check_calls_parse_in_every_spelling(CASES_B / "glaive_sharegpt/sample.json", 10)
    assert {"name": "set_reminder", "arguments": {"text": "Call Zoë's \"new\" office",
                                                  "when": {"day": "Monday", "hour": 9}}} in calls
    assert {"name": "get_stock_price", "arguments": {"symbol": "{BRK.B}"}} in calls


def test_glaive_sample_calls_validate_against_their_tools_except_track_calories():
    n, errors = validation_errors(shared_file(GLAIVE))
    assert n - len(errors) == 210
    assert errors == [("track_calories", "calories_per_item: [150, 350, 800] is not of type 'number'")]


def test_sharegpt_fixture_calls_validate_against_their_tools_except_one():
    n, errors = validation_errors(CASES_B / "glaive_sharegpt/sample.json")
    assert n - len(errors) == 9
    assert errors == [("split_bill", "total: [12.5, 7] is not of type 'number'")]
