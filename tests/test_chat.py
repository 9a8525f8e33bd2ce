"""Chat rendering, the assistant-only loss mask, parsing replies, and prompt/completion budgets.

Cases from ``shared/cases``: 01 (truncation), 02 (oversized completions), 17 (special-token literals, chat
rows), 19 (raw glaive calls), 20 (arguments rendered once); each is also checked on the project's own inputs in
``tests/fixtures/cases_b/`` (the shared ones skip when ``shared/`` is absent).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codechat.chat.budget import BudgetCounts, render_with_budget
from codechat.chat.calls import FUNCTION_CALL_TOKEN, parse_assistant, parse_assistant_text, parse_call
from codechat.chat.conversation import (ROLE_TOKENS, TOOLS_HEADER, Conversation, Message, parse_conversation, render,
                           render_for_completion, render_turns, supervised_spans, turn_texts)
from codechat.config.sft import SFTConfig
from codechat.config.stages import ConfigError, ModelConfig
from codechat.data.formats import load_records
from codechat.model import GPT, IGNORE_INDEX
from conftest import FIXTURES, shared_file

END = "<|end|>"
CASES_B = FIXTURES / "cases_b"


def assistant_spans(conv: Conversation) -> list[str]:
    """What must be supervised: each assistant turn's content, call and closing <|end|>."""
    out = []
    for m in conv.messages:
        if m.role == "assistant":
            call = FUNCTION_CALL_TOKEN + json.dumps(m.function_call, ensure_ascii=False) if m.function_call else ""
            out.append(m.content + call + END)
    return out


def spans_text(tok, ids, mask) -> list[str]:
    return [tok.decode(ids[a:b]) for a, b in supervised_spans(mask)]


def turn_bounds(tok, ids, role: str) -> list[tuple[int, int]]:
    """(header index, end index) of every turn of ``role`` in rendered ids."""
    header = tok.special_id(ROLE_TOKENS[role])
    out = []
    for k, i in enumerate(ids):
        if i == header:
            out.append((k, ids.index(tok.end_id, k)))
    return out


# ----------------------------------------------------------------------------- rendering
def test_render_layout_and_mask_exactly_on_assistant_turns(tok):
    conv = Conversation((Message("system", "Be brief."), Message("user", "Weather in Oslo?"),
                         Message("assistant", "Checking.", {"name": "get_weather", "arguments": {"city": "Oslo"}}),
                         Message("function_response", '{"temp_c": 3}'), Message("assistant", "3°C.")),
                        tools=({"type": "function", "function": {"name": "get_weather", "parameters": {}}},))
    ids, mask = render(tok, conv)
    assert len(ids) == len(mask) and ids[0] == tok.bos_id and mask[0] == 0
    sp = tok.special_id
    headers = [i for i in ids if i in tok.special_ids and i not in (tok.end_id, sp(FUNCTION_CALL_TOKEN), tok.bos_id)]
    assert headers == [sp("<|system|>"), sp("<|user|>"), sp("<|assistant|>"), sp("<|function_response|>"),
                       sp("<|assistant|>")]
    assert all(mask[k] == 0 for k, i in enumerate(ids) if i in headers)
    assert spans_text(tok, ids, mask) == [
        'Checking.<|function_call|>{"name": "get_weather", "arguments": {"city": "Oslo"}}<|end|>', "3°C.<|end|>"]
    system = tok.decode(ids[2:ids.index(tok.end_id)])
    assert system == 'Be brief.\n\n' + TOOLS_HEADER + '\n{"name": "get_weather", "parameters": {}}'
    assert parse_conversation(tok, ids) == conv


def test_tools_without_system_message_get_their_own_system_turn(tok):
    conv = Conversation((Message("user", "hi"), Message("assistant", "hello")), tools=({"name": "f"},))
    ids, mask = render(tok, conv)
    assert ids[1] == tok.special_id("<|system|>")
    assert tok.decode(ids[2:ids.index(tok.end_id)]) == TOOLS_HEADER + '\n{"name": "f"}'
    assert parse_conversation(tok, ids) == conv


def test_turns_rendered_from_texts_encoded_together_are_those_encoded_one_by_one(tok):
    # the SFT loader encodes a chunk's texts in one encode_batch (it releases the GIL) and renders from them
    conv = Conversation((Message("user", "Weather in Oslo?"),
                         Message("assistant", "", {"name": "get_weather", "arguments": {"city": "Oslo"}}),
                         Message("function_response", '{"temp_c": 3}'), Message("assistant", "3°C.")),
                        tools=({"name": "get_weather", "parameters": {}},))
    texts = turn_texts(conv)
    assert texts == [TOOLS_HEADER + '\n{"name": "get_weather", "parameters": {}}', "Weather in Oslo?",
                     '{"name": "get_weather", "arguments": {"city": "Oslo"}}', '{"temp_c": 3}', "3°C."]
    assert render_turns(tok, conv, tok.encode_batch(texts)) == render_turns(tok, conv)
    with pytest.raises(ValueError, match="4 encoded texts for a conversation of 5"):
        render_turns(tok, conv, tok.encode_batch(texts[:4]))


def test_render_for_completion_ends_with_the_assistant_header(tok):
    conv = Conversation((Message("user", "hi"), Message("assistant", "hello"), Message("user", "again")))
    prompt = render_for_completion(tok, conv)
    assert prompt == render(tok, conv)[0] + [tok.special_id("<|assistant|>")]
    with pytest.raises(ValueError, match="already ends with an assistant"):
        render_for_completion(tok, Conversation(conv.messages[:2]))


@pytest.mark.parametrize("make,match", [
    (lambda: Message("bot", "x"), "unknown role"),
    (lambda: Message("user", "x", {"name": "f", "arguments": {}}), "only an assistant"),
    (lambda: Message("assistant", "", {"name": "f", "arguments": "[1, 2]"}), "JSON object"),
    (lambda: Message("assistant", "", {"arguments": {}}), "non-empty string 'name'"),
    (lambda: Conversation(()), "at least one message"),
    (lambda: Conversation((Message("user", "x"), Message("system", "y"))), "only be the first"),
])
def test_invalid_messages_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ----------------------------------------------------------------------------- case 17
def check_literal_chat_rows(tok, path: Path, n_rows: int) -> None:
    """The ``kind: chat`` rows of ``path``: special-token spellings typed in user text stay ordinary text."""
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    chat_rows = [r for r in rows if r["kind"] == "chat"]
    assert len(chat_rows) == n_rows
    for r in chat_rows:
        conv = Conversation(tuple(Message(**m) for m in r["messages"]))
        ids, mask = render(tok, conv)
        [(u_head, u_end)] = turn_bounds(tok, ids, "user")
        inside = ids[u_head + 1:u_end]
        assert not set(inside) & tok.special_ids, r["id"]  # zero special ids between the real header and end
        assert tok.decode(inside) == r["messages"][0]["content"]  # round-trips exactly
        assert all(m == 0 for m in mask[u_head:u_end + 1])  # the injected "assistant" text is never trained on
        assert ids.count(tok.special_id("<|assistant|>")) == 1  # exactly one assistant turn
        assert spans_text(tok, ids, mask) == [r["messages"][1]["content"] + END]
        back = parse_conversation(tok, ids)
        assert back == conv and [m.role for m in back.messages] == ["user", "assistant"]
        assert all(m.function_call is None for m in back.messages)  # typed "ASSISTANT: <functioncall>" is text
        a_head = ids.index(tok.special_id("<|assistant|>"))
        assert parse_assistant(tok, ids[a_head + 1:]) == (r["messages"][1]["content"], None)


def test_case17_special_token_spellings_in_user_text_are_ordinary_text(tok):
    check_literal_chat_rows(tok, shared_file("cases/17-special-token-literals.jsonl"), 3)


def test_special_token_spellings_in_user_text_are_ordinary_text_fixture(tok):
    """codechat's own spellings (<|end|><|assistant|>...), ChatML's, and a typed glaive call."""
    path = CASES_B / "special_literals.jsonl"
    assert "<|end|><|assistant|>" in path.read_text()
    check_literal_chat_rows(tok, path, 3)


# ----------------------------------------------------------------------------- case 19 / 20
def check_raw_glaive_records(tok, path: Path) -> None:
    """Raw glaive records (``system`` + ``chat``) load, render and parse back to their ``_expected_calls``."""
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    records = load_records(path)
    assert [r.format for r in records] == ["glaive"] * len(rows)
    for row, rec in zip(rows, records):
        conv = rec.conversation
        assert [m.function_call for m in conv.messages if m.function_call] == row["_expected_calls"], row["id"]
        for name in row.get("_expected_functions_in_system", []):
            assert name in [t["name"] for t in conv.tools]
        ids, mask = render(tok, conv)
        text = tok.decode(ids)
        assert "<|endoftext|>" not in text  # turn ends are stripped, never trained on as text
        assert all("<|endoftext|>" not in m.content for m in conv.messages)
        assert [m.role for m in conv.messages][:2] == ["system", "user"]
        for name in row.get("_expected_functions_in_system", []):
            assert f'"name": "{name}"' in tok.decode(ids[:ids.index(tok.end_id)])
        assert spans_text(tok, ids, mask) == assistant_spans(conv)
        assert parse_conversation(tok, ids) == conv
        # the generated call parses back from ids to the expected dict
        for (head, end), call in zip(turn_bounds(tok, ids, "assistant"), row["_expected_calls"]):
            assert parse_assistant(tok, ids[head + 1:end + 1])[1] == call


def test_case19_raw_glaive_calls_parse_to_the_expected_dicts(tok):
    check_raw_glaive_records(tok, shared_file("cases/19-glaive-functioncall-quoting.jsonl"))


def test_raw_glaive_calls_parse_to_the_expected_dicts_fixture(tok):
    """Apostrophes and braces inside single-quoted JSON-string arguments, nested lists of objects, unicode, two
    schemas in one system text, arguments already an object, and a record without a call."""
    path = CASES_B / "glaive_quoting.jsonl"
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    assert [len(r["_expected_calls"]) for r in rows] == [1, 1, 1, 1, 0]
    assert rows[0]["_expected_calls"][0]["arguments"]["body"] == "It isn't on Friday, don't forget"
    check_raw_glaive_records(tok, path)


def check_arguments_rendered_once(tok, path: Path, name: str, key: str, plain: str, quoted: str) -> None:
    """Rows 1 (content null, arguments a JSON string) and 2 (content "", arguments an object) render to the same
    ids, with the arguments one JSON object; row 3's string with quotes parses back to ``{key: quoted}``."""
    records = load_records(path)
    rendered = [render(tok, r.conversation) for r in records]
    assert rendered[0] == rendered[1]  # content null + JSON-string args == content "" + object args
    for (ids, _), rec in zip(rendered, records):
        text = tok.decode(ids)
        call_json = json.loads(text.split("<|function_call|>")[1].split(END)[0])
        assert isinstance(call_json["arguments"], dict) and '"arguments": "' not in text  # one JSON level only
        assert "None" not in text
        head, end = turn_bounds(tok, ids, "assistant")[0]
        content, call = parse_assistant(tok, ids[head + 1:end + 1])
        assert content == ""
        rec_call = rec.conversation.messages[1].function_call
        assert call == rec_call and isinstance(call["arguments"], dict)
    call_text = f'<|function_call|>{{"name": "{name}", "arguments": {{"{key}": "{plain}"}}}}<|end|>'
    assert call_text in tok.decode(rendered[0][0])
    assert parse_assistant(tok, _assistant_ids(tok, rendered[0][0]))[1]["arguments"] == {key: plain}
    assert parse_assistant(tok, _assistant_ids(tok, rendered[2][0]))[1]["arguments"] == {key: quoted}


def test_case20_tool_arguments_are_rendered_once_as_an_object(tok):
    expected = json.loads(shared_file("cases/20-tool-args-double-encoding.expected.json").read_text())
    assert "parse_back" in expected
    check_arguments_rendered_once(tok, shared_file("cases/20-tool-args-double-encoding.jsonl"), "get_weather", "city",
                                  "Paris", 'Paris "rive gauche"')


def test_tool_arguments_are_rendered_once_as_an_object_fixture(tok):
    check_arguments_rendered_once(tok, CASES_B / "args_encoding.jsonl", "lookup_word", "word", "serendipity",
                                  'the "so-called" serendipity')


def _assistant_ids(tok, ids):
    head, end = turn_bounds(tok, ids, "assistant")[0]
    return ids[head + 1:end + 1]


# ----------------------------------------------------------------------------- parsing output
def test_parse_assistant_accepts_the_call_id_and_the_seed_text_spelling(tok):
    call = {"name": "send", "arguments": {"to": "Sam", "text": "I'll be late"}}
    ids = tok.encode("On it.") + [tok.special_id(FUNCTION_CALL_TOKEN)] + tok.encode(json.dumps(call)) + [tok.end_id]
    assert parse_assistant(tok, ids + tok.encode("ignored after end")) == ("On it.", call)
    seed = ('On it. <functioncall> {"name": "send", "arguments": \'{"to": "Sam", "text": "I\'ll be late"}\'} '
            '<|endoftext|>')
    assert parse_assistant_text(seed) == ("On it.", call)
    assert parse_assistant(tok, tok.encode(seed)) == ("On it.", call)  # typed by the model as plain tokens
    assert parse_assistant_text("Just text.<|end|>") == ("Just text.", None)


def test_a_malformed_call_is_kept_as_text_or_raises_when_strict(tok):
    text = 'Sure <functioncall> {"name": "f", "arguments": {oops}}'
    assert parse_assistant_text(text) == (text, None)
    with pytest.raises(ValueError, match="not a function call"):
        parse_assistant_text(text, strict=True)
    ids = [tok.special_id(FUNCTION_CALL_TOKEN)] + tok.encode("{not json")
    assert parse_assistant(tok, ids) == ("<|function_call|>{not json", None)


@pytest.mark.parametrize("text,args", [
    ('{"name": "f", "arguments": {"a": 1}}', {"a": 1}),
    ('{"name": "f", "arguments": "{\\"a\\": 1}"}', {"a": 1}),  # JSON string inside JSON: decoded once
    ("""{"name": "f", "arguments": '{"q": "it's {x}", "n": [{"k": "}"}]}'}""", {"q": "it's {x}", "n": [{"k": "}"}]}),
    ('{"name": "f"}', {}),
])
def test_parse_call_forms(text, args):
    assert parse_call(text) == {"name": "f", "arguments": args}


specials = st.sampled_from(["<|end|>", "<|user|>", "<|assistant|>", "<|function_call|>", "USER: ", "ASSISTANT: ",
                            "<functioncall> {\"name\": \"x\"}", "<|endoftext|>", "\n", " "])
texts = st.lists(st.one_of(st.text(max_size=12), specials), max_size=5).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(contents=st.lists(texts, min_size=1, max_size=5), system=st.one_of(st.none(), texts),
       call=st.one_of(st.none(), st.dictionaries(st.text(max_size=5), st.text(max_size=8), max_size=2)))
def test_render_then_parse_round_trips_and_masks_only_assistant_text(tok, contents, system, call):
    roles = ["user", "assistant"] * 3
    msgs = ([Message("system", system)] if system is not None else [])
    msgs += [Message(roles[k], c) for k, c in enumerate(contents)]
    if call is not None:
        msgs.append(Message("assistant", "", {"name": "tool", "arguments": call}))
    conv = Conversation(tuple(msgs))
    ids, mask = render(tok, conv)
    assert parse_conversation(tok, ids) == conv
    assert render_turns(tok, conv, tok.encode_batch(turn_texts(conv))) == render_turns(tok, conv)
    assert spans_text(tok, ids, mask) == assistant_spans(conv)


# ----------------------------------------------------------------------------- budgets
def test_sft_config_rejects_a_prompt_budget_that_leaves_no_completion():
    with pytest.raises(ConfigError, match="max_prompt_length=64 >= sft.max_length=64"):
        SFTConfig(max_length=64, max_prompt_length=64)
    with pytest.raises(ConfigError, match="max_prompt_length"):
        SFTConfig(max_length=64, max_prompt_length=100)


def check_prompt_budget(tok, path: Path, first_turns: tuple[str, str]) -> None:
    """A file of three rows (a prompt far over its budget, a short row, and a short exchange followed by the same
    long prompt) under ``max_length=64``, ``max_prompt_length=48``: prompts are left-truncated and counted,
    completions stay whole, the earlier assistant turn stays supervised, the loss is finite and positive."""
    cfg = SFTConfig(max_length=64, max_prompt_length=48)
    records = load_records(path)
    assert len(records) == 3
    counts = BudgetCounts()
    out = {}
    for rec in records:
        ex = render_with_budget(tok, rec.conversation, cfg, counts, source=rec.source, line=rec.line)
        assert ex is not None
        assert len(ex.ids) <= 64 and ex.prompt_length <= 48 and ex.n_supervised >= 1
        assert ex.ids[ex.prompt_length - 1] == tok.special_id("<|assistant|>")
        assert all(m == 0 for m in ex.mask[:ex.prompt_length]) or ex.line == 3  # only row 3 has an earlier answer
        out[ex.line] = ex
    summary = counts.as_dict()
    assert {k: summary[k] for k in ("seen", "kept", "prompt_truncated", "completion_truncated", "dropped",
                                    "turns_dropped", "completion_tokens_cut")} == \
        {"seen": 3, "kept": 3, "prompt_truncated": 2, "completion_truncated": 0, "dropped": {}, "turns_dropped": 0,
         "completion_tokens_cut": 0}
    (long, long_rec), (short, short_rec), (multi, multi_rec) = ((out[r.line], r) for r in records)
    # long-prompt: the user turn keeps its right end, the completion is whole
    assert long.prompt_length == 48 and long.prompt_truncated and not long.completion_truncated
    answer = long_rec.conversation.messages[-1].content
    assert spans_text(tok, long.ids, long.mask) == [answer + END]
    user = long_rec.conversation.messages[0].content
    kept_user = tok.decode(long.ids[2:long.ids.index(tok.end_id)])
    assert user.endswith(kept_user) and len(kept_user) < len(user)
    assert kept_user.endswith(user[-30:])
    # short: untouched, identical to the plain rendering
    assert (short.ids, short.mask) == render(tok, short_rec.conversation) and not short.prompt_truncated
    # multi-turn-partial: the first assistant turn stays supervised; the long user turn is cut from the left
    first_user, first_answer = first_turns
    assert [m.content for m in multi_rec.conversation.messages[:2]] == [first_user, first_answer]
    assert multi.prompt_length == 48
    assert spans_text(tok, multi.ids, multi.mask) == [first_answer + END,
                                                      multi_rec.conversation.messages[-1].content + END]
    assert tok.decode(multi.ids).startswith(f"<|bos|><|user|>{first_user}<|end|><|assistant|>{first_answer}<|end|>"
                                            "<|user|>")
    assert counts.prompt_tokens_cut == sum(len(render(tok, r.conversation)[0]) for r in records) \
        - sum(len(e.ids) for e in out.values())
    # the loss through the real model is finite and positive on every row (never a silent 0 or NaN)
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=tok.vocab_size, n_layer=1, n_embd=32, n_head=2, n_kv_head=2, max_seq_len=64))
    model.init_weights()
    for ex in out.values():
        ids = torch.tensor([ex.ids[:-1]])
        labels = torch.tensor([[t if m else IGNORE_INDEX for t, m in zip(ex.ids[1:], ex.mask[1:])]])
        loss = model(ids, labels) / ex.n_supervised
        assert math.isfinite(loss.item()) and loss.item() > 0


def test_case01_prompt_over_budget_is_left_truncated_and_counted(tok):
    path = shared_file("cases/01-prompt-exceeds-max-len.jsonl")
    records = load_records(path)
    assert [r.conversation.messages[-1].content for r in records] == ["It adds i to the previous value.",
                                                                      "It returns 3.", "Done."]
    assert records[0].conversation.messages[0].content.endswith("line119 = compute(line118) + 119")
    check_prompt_budget(tok, path, ("Say OK.", "OK."))


def test_prompt_over_budget_is_left_truncated_and_counted_fixture(tok):
    path = CASES_B / "budget_prompts.jsonl"
    records = load_records(path)
    assert records[0].conversation.messages[0].content.endswith("opt40 = settings.get('opt40', 120)")
    assert len(render(tok, records[0].conversation)[0]) > 10 * 48  # far over the prompt budget
    check_prompt_budget(tok, path, ("Reply yes.", "yes."))


def check_completion_cut(tok, path: Path) -> int:
    """Completions over ``max_length=32`` (prompt budget 16) are cut on the right and counted; returns how many."""
    cfg = SFTConfig(max_length=32, max_prompt_length=16)
    counts = BudgetCounts()
    records = load_records(path)
    for rec in records:
        ex = render_with_budget(tok, rec.conversation, cfg, counts)
        full_ids, _ = render(tok, rec.conversation)
        if len(full_ids) <= 32:
            assert ex.ids == full_ids
            continue
        assert len(ex.ids) == 32 and ex.completion_truncated
        assert ex.n_supervised == 32 - ex.prompt_length >= 16
        assert ex.ids[-1] != tok.end_id  # the cut completion has lost its <|end|>
    assert counts.seen == counts.kept and counts.completion_truncated >= 1
    assert counts.completion_truncated == sum(len(render(tok, r.conversation)[0]) > 32 for r in records)
    return counts.completion_truncated


def test_completion_is_cut_on_the_right_and_counted(tok):
    check_completion_cut(tok, shared_file("cases/02-sft-packing-oversized.jsonl"))


def test_completion_is_cut_on_the_right_and_counted_fixture(tok):
    assert check_completion_cut(tok, CASES_B / "packing_oversized.jsonl") == 4  # the four long rows, not the 3 short


def test_examples_without_assistant_turn_are_dropped_and_counted(tok):
    counts = BudgetCounts()
    cfg = SFTConfig(max_length=64, max_prompt_length=32)
    assert render_with_budget(tok, Conversation((Message("user", "hello"),)), cfg, counts) is None
    assert counts.dropped == {"no_assistant_turn": 1} and counts.kept == 0 and counts.seen == 1


def test_whole_turns_go_oldest_first_and_the_system_turn_stays_when_it_fits(tok):
    msgs = (Message("system", "Be kind."),) + tuple(
        Message(r, f"{r} message number {k} " * 3) for k in range(4) for r in ("user", "assistant"))[:-1]
    conv = Conversation(msgs + (Message("assistant", "final answer"),))
    turns = render_turns(tok, conv)
    sys_len, last_user = len(turns[0]), len(turns[-2])
    budget = 2 + sys_len + last_user + len(turns[-3]) + 1  # system + last assistant-in-prompt/user pair, minus slack
    counts = BudgetCounts()
    ex = render_with_budget(tok, conv, SFTConfig(max_length=budget + 40, max_prompt_length=budget), counts)
    text = tok.decode(ex.ids)
    assert text.startswith("<|bos|><|system|>Be kind.<|end|>")  # the system turn is kept
    assert "user message number 3" in text and "user message number 0" not in text
    assert ex.prompt_length <= budget and counts.turns_dropped >= 4
    # a system turn that cannot fit beside the newest turn is dropped whole
    big = Conversation((Message("system", "rule " * 200), Message("user", "q?"), Message("assistant", "a.")))
    ex = render_with_budget(tok, big, SFTConfig(max_length=40, max_prompt_length=20))
    assert tok.decode(ex.ids) == "<|bos|><|user|>q?<|end|><|assistant|>a.<|end|>"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=7), system=st.booleans(),
       max_prompt=st.integers(2, 60), extra=st.integers(1, 40))
def test_any_budget_keeps_rows_within_limits_with_supervised_tokens(tok, lengths, system, max_prompt, extra):
    msgs = [Message("system", "sys " * 10)] if system else []
    msgs += [Message(("user", "assistant")[k % 2], "w " * n) for k, n in enumerate(lengths)]
    conv = Conversation(tuple(msgs))
    cfg = SFTConfig(max_length=max_prompt + extra, max_prompt_length=max_prompt)
    counts = BudgetCounts()
    ex = render_with_budget(tok, conv, cfg, counts)
    if ex is None:
        assert counts.dropped == {"no_assistant_turn": 1} and len(lengths) == 1
        return
    assert len(ex.ids) <= cfg.max_length and ex.prompt_length <= cfg.max_prompt_length and ex.n_supervised >= 1
    assert ex.ids[0] == tok.bos_id and ex.ids[ex.prompt_length - 1] == tok.special_id("<|assistant|>")
    headers = {tok.special_id(t) for t in ROLE_TOKENS.values()} | {tok.bos_id}
    assert all(m == 0 for i, m in zip(ex.ids, ex.mask) if i in headers)
    assert counts.kept == 1 and counts.tokens == len(ex.ids)
