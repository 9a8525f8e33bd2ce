"""The one OpenAI <-> codechat message mapping (codechat.chat.openai_messages): a conversation survives the
round trip, tools included, and training data, a served request and a teacher's request render the
same ids for the same OpenAI messages."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codechat.chat.conversation import Conversation, Message, render, render_for_completion
from codechat.chat.openai_messages import MessageError, from_openai, openai_tools, to_openai
from codechat.data.formats import FormatError, to_conversation
from codechat.data.teacher import request_messages
from codechat.data.teacher_store import Prompt
from codechat.serve.config import ServeConfig
from codechat.serve.constraints import Grammars
from codechat.serve.protocol import APIError, parse_chat_request

WEATHER = {"name": "weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def call(city: str) -> dict:
    return {"name": "weather", "arguments": {"city": city, "unit": "°C", "days": [1, 2]}}


CONVERSATION = Conversation((
    Message("system", "Be brief."), Message("user", "Weather in Tokyo and Zürich?"),
    Message("assistant", "Let me look.", call("Tokyo")), Message("assistant", "", call("Zürich")),
    Message("function_response", '{"temp_c": 21}'), Message("function_response", '{"temp_c": 9}'),
    Message("assistant", "21 and 9."), Message("user", "東京 again?"), Message("assistant", "", call("東京")),
    Message("function_response", "{}"), Message("assistant", "")), (WEATHER,))


def test_a_conversation_survives_the_round_trip_tools_included():
    msgs = to_openai(CONVERSATION.messages)
    assert json.loads(json.dumps(msgs)) == msgs  # plain JSON, as sent on the wire
    assert msgs[2] == {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "call_2", "type": "function", "function": {
            "name": "weather", "arguments": '{"city": "Tokyo", "unit": "°C", "days": [1, 2]}'}}]}
    assert msgs[3]["content"] is None  # a call alone: content null, as OpenAI sends it
    assert [m.get("tool_call_id") for m in msgs[4:6]] == ["call_2", "call_3"]  # the oldest open call first
    assert msgs[9]["tool_call_id"] == "call_8"
    assert openai_tools(CONVERSATION) == [{"type": "function", "function": WEATHER}]
    back = Conversation(from_openai(msgs), openai_tools(CONVERSATION))
    assert back == CONVERSATION


texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
calls = st.fixed_dictionaries({"name": st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
                               "arguments": st.dictionaries(texts, st.integers() | texts | st.booleans(), max_size=3)})
turns = st.one_of(st.builds(Message, st.just("user"), texts), st.builds(Message, st.just("assistant"), texts),
                  st.builds(Message, st.just("assistant"), texts, calls),
                  st.builds(Message, st.just("function_response"), texts))


@settings(max_examples=200, deadline=None)
@given(system=st.none() | texts, rest=st.lists(turns, min_size=1, max_size=6))
def test_any_conversation_survives_the_round_trip(system, rest):
    messages = ((Message("system", system),) if system is not None else ()) + tuple(rest)
    assert from_openai(to_openai(messages)) == messages


def test_training_data_a_served_request_and_a_teachers_request_render_alike(tok):
    """The same OpenAI messages (two calls in one message, text parts) give the same ids as SFT data,
    as a request to codechat serve, and as distill sends the record to a teacher."""
    raw = [{"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
           {"role": "user", "content": "Weather in Tokyo and Zürich?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "a", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Tokyo"}'}},
               {"id": "b", "type": "function", "function": {"name": "weather", "arguments": {"city": "Zürich"}}}]},
           {"role": "tool", "tool_call_id": "a", "content": '{"temp_c": 21}'},
           {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": '{"temp_c": 9}'}]}]
    tools = [{"type": "function", "function": WEATHER}]
    data, _ = to_conversation({"messages": raw, "tools": tools})
    assert [m.role for m in data.messages] == ["system", "user", "assistant", "assistant", "function_response",
                                               "function_response"]
    assert data.messages[0].content == "Be brief." and data.messages[3].function_call["arguments"] == {
        "city": "Zürich"}
    grammars = Grammars(tok, tok.vocab_size)  # none is compiled: no request here asks for one
    served = parse_chat_request({"model": "codechat", "messages": raw, "tools": tools}, tok, 1024, ServeConfig(),
                                grammars)
    assert served.conversation == data
    assert list(served.engine_request.prompt) == render_for_completion(tok, data)
    sent = request_messages(Prompt("p", data))
    again = parse_chat_request({"model": "codechat", "messages": sent, "tools": openai_tools(data)}, tok, 1024,
                               ServeConfig(), grammars)
    assert list(again.engine_request.prompt) == list(served.engine_request.prompt)
    assert render(tok, data)[0] == list(served.engine_request.prompt[:-1])  # the prompt is the data and <|assistant|>


@pytest.mark.parametrize("messages, param, reason", [
    ("hi", "messages", "invalid"),
    ([{"content": "hi"}], "messages[0].role", "missing_field"),
    ([{"role": "wizard", "content": "hi"}], "messages[0].role", "invalid"),
    ([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}], "messages[1].role", "invalid"),
    ([{"role": "user", "content": {"text": "a"}}], "messages[0].content", "invalid"),
    ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content[0]", "invalid"),
    ([{"role": "user", "content": "a", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}],
     "messages[0]", "invalid"),
    ([{"role": "assistant", "tool_calls": {"function": {"name": "f"}}}], "messages[0].tool_calls", "invalid"),
    ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}},
                                           {"function": {"name": "g", "arguments": "[1]"}}]}],
     "messages[0].tool_calls[1].function.arguments", "invalid"),
    ([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}], "messages[0].tool_calls[0].function",
     "invalid"),
    ([{"role": "assistant", "function_call": {"name": "f", "arguments": "{bad"}}],
     "messages[0].function_call.arguments", "invalid"),
])
def test_a_message_that_does_not_map_names_its_field_for_data_and_for_serve(tok, messages, param, reason):
    with pytest.raises(MessageError) as e:
        from_openai(messages)
    assert (e.value.param, e.value.reason) == (param, reason) and str(e.value).startswith(param + ": ")
    with pytest.raises(FormatError, match=param.replace("[", r"\[").replace("]", r"\]")):
        to_conversation({"messages": messages})
    if isinstance(messages, list):
        with pytest.raises(APIError) as e:
            parse_chat_request({"model": "codechat", "messages": messages + [{"role": "user", "content": "x"}]}, tok,
                               256, ServeConfig(), Grammars(tok, tok.vocab_size))
        assert e.value.status == 400 and e.value.param == param
