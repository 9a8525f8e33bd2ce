"""OpenAI chat messages <-> codechat :class:`~codechat.chat.conversation.Message` s: the one mapping, both ways.

Read by the ``messages`` SFT format (:mod:`codechat.data.formats`), by ``codechat serve`` for
each request (:mod:`codechat.serve.protocol`, :mod:`codechat.serve.responses`), and written by
``codechat distill`` for each prompt (:mod:`codechat.data.teacher`), so a conversation is rendered
the same in training, in serving and when a teacher is asked; the exported Hugging Face chat
template (:mod:`codechat.hf.template`) follows the same rules in Jinja.

From OpenAI (:func:`from_openai`):

- roles: ``system`` / ``developer`` -> system (first message only), ``user``, ``assistant``,
  ``tool`` / ``function`` / ``ipython`` / ``function_response`` -> function_response;
- ``content``: a string, ``null`` (-> ``""``) or a list of text parts ``{"type": "text", "text":
  ...}`` (``type`` may be left out), joined with nothing between them;
- an assistant's ``tool_calls`` ``[{"type": "function", "function": {"name", "arguments"}}]``
  (or the older ``function_call`` ``{"name", "arguments"}``): each call is its own assistant
  turn (codechat's format holds one call a turn), the content in the first; ``arguments`` is a
  JSON object or a JSON string of one (decoded once, :func:`codechat.chat.calls.normalize_call`).
  Other fields (``tool_call_id``, ``name``, ``refusal``, ...) are ignored.

From the Responses API's ``input`` (:func:`from_responses`), the same turns:

- a string: one user message;
- a ``message`` item (``type`` may be left out) ``{"role", "content"}``: ``system`` / ``developer``
  (first item only) -> system, ``user``, ``assistant``; ``content`` a string or a list of
  ``input_text`` / ``output_text`` parts (:data:`RESPONSES_TEXT`), joined;
- a ``function_call`` item ``{"name", "arguments", "call_id"}``: an assistant call turn. It joins
  the assistant message item right before it when that one holds no call yet, so the model's own
  reply of text and a call, which the Responses API returns as a message item and a call item,
  renders as the one turn it was (chat's assistant message with ``content`` and ``tool_calls``);
  each further call is its own turn;
- a ``function_call_output`` item ``{"call_id", "output"}`` (a string or text parts): a
  function_response turn. ``call_id`` s are not read: codechat's format answers calls in order,
  as chat's ``tool_call_id`` is not read either.

To OpenAI (:func:`to_openai`): each turn one message; a function-call turn is an assistant
message with one ``tool_calls`` entry (:func:`tool_call`: ``arguments`` a JSON string, id
``call_K`` with ``K`` the turn's position) and ``content`` ``null`` when it has no text; a
function response is a ``tool`` message answering the oldest call not yet answered.
``from_openai(to_openai(conv))`` gives back ``conv.messages``, and :func:`openai_tools` the tools
that :class:`~codechat.chat.conversation.Conversation` unwraps back to ``conv.tools``.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from codechat.chat.calls import ParseError
from codechat.chat.conversation import Conversation, Message

#: OpenAI roles (and the older spellings data sets use) -> codechat roles.
ROLES: dict[str, str] = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
                         "tool": "function_response", "function": "function_response",
                         "ipython": "function_response", "function_response": "function_response"}
#: The Responses API's message roles -> codechat roles (a function's output is an item of its own).
RESPONSES_ROLES: dict[str, str] = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
#: The Responses API's text parts: ``input_text`` (what a client writes), ``output_text`` (a reply sent back).
RESPONSES_TEXT: tuple[str, ...] = ("input_text", "output_text")


class MessageError(ValueError):
    """A message that does not map to codechat's.

    Attributes:
        param: the field at fault, e.g. ``messages[2].tool_calls[0].function.arguments``.
        reason: ``missing_field`` (a message without a ``role``) or ``invalid``.
    """

    def __init__(self, param: str, message: str, reason: str = "invalid") -> None:
        super().__init__(f"{param}: {message}")
        self.param, self.message, self.reason = param, message, reason


def message_text(content: Any, param: str, kinds: Sequence[str] = ("text",)) -> str:
    """A message's ``content`` as text: a string, ``None`` (-> ``""``) or text parts joined.

    Args:
        content: the field's value.
        param: its place, for errors.
        kinds: the ``type`` s of a text part (chat's ``text``, which may be left out; the Responses
            API's ``input_text`` and ``output_text``, :data:`RESPONSES_TEXT`).

    Raises:
        MessageError: another type, or a part that is not text (``param[K]``).
    """
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            if not (isinstance(part, Mapping) and part.get("type", "text") in kinds
                    and isinstance(part.get("text"), str)):
                got = f"a part of type {part.get('type')!r}" if isinstance(part, Mapping) else type(part).__name__
                spelled = " or ".join(f'{{"type": "{t}", "text": ...}}' for t in kinds)
                raise MessageError(f"{param}[{k}]", f"only text parts {spelled} are supported, got {got}")
            parts.append(part["text"])
        return "".join(parts)
    raise MessageError(param, f"must be a string, null or a list of text parts, got {type(content).__name__}")


def _calls(raw: Mapping[str, Any], param: str) -> list[tuple[str, Any]]:
    """``(param, call)`` of each call of a message: its ``tool_calls`` entries' ``function`` s, or its
    ``function_call`` (an empty or ``null`` field is no call)."""
    calls = raw.get("tool_calls")
    if not calls:
        return [(f"{param}.function_call", raw["function_call"])] if raw.get("function_call") else []
    if not isinstance(calls, list):
        raise MessageError(f"{param}.tool_calls", f"must be a list, got {type(calls).__name__}")
    return [(f"{param}.tool_calls[{j}].function", call.get("function") if isinstance(call, Mapping)
             and "function" in call else call) for j, call in enumerate(calls)]


def call_message(content: str, call: Any, param: str) -> Message:
    """An assistant turn holding ``call``, which :func:`codechat.chat.calls.normalize_call` checks."""
    try:
        return Message("assistant", content, call)
    except ParseError as e:
        where = param if e.reason in ("no_json", "no_name") else f"{param}.arguments"
        raise MessageError(where, f"not a call codechat can render: {e}") from None


def from_openai(messages: Any, param: str = "messages") -> tuple[Message, ...]:
    """OpenAI chat ``messages`` as codechat messages (module docstring).

    Raises:
        MessageError: not a list, a message that is not an object, an unknown or missing role, a
            system message after the first, bad content, or a call that is not a name and a JSON
            object of arguments; ``param`` names the field (``messages[K].role``, ...).
    """
    if not isinstance(messages, list):
        raise MessageError(param, f"must be a list of messages, got {type(messages).__name__}")
    out: list[Message] = []
    for k, raw in enumerate(messages):
        where = f"{param}[{k}]"
        if not isinstance(raw, Mapping):
            raise MessageError(where, f"must be an object with a role, got {type(raw).__name__}")
        role = ROLES.get(raw["role"]) if isinstance(raw.get("role"), str) else None
        if role is None:
            raise MessageError(f"{where}.role", f"unknown role {raw.get('role')!r}; use one of {', '.join(ROLES)}",
                               "invalid" if "role" in raw else "missing_field")
        if role == "system" and k:
            raise MessageError(f"{where}.role", "a system message can only be the first message")
        content = message_text(raw.get("content"), f"{where}.content")
        calls = _calls(raw, where)
        if calls and role != "assistant":
            raise MessageError(where, f"a {raw['role']} message cannot carry tool calls; only an assistant's can")
        if not calls:
            out.append(Message(role, content))
        for j, (at, call) in enumerate(calls):
            out.append(call_message(content if j == 0 else "", call, at))
    return tuple(out)


def from_responses(items: Any, param: str = "input") -> tuple[Message, ...]:
    """The Responses API's ``input`` as codechat messages (module docstring).

    Raises:
        MessageError: not a string or a list, an item that is not an object or of a type other than
            ``message``, ``function_call`` and ``function_call_output``, an unknown or missing role, a
            system message after the first item, content that is not text, or a call that is not a name
            and a JSON object of arguments; ``param`` names the field (``input[K].role``,
            ``input[K].arguments``, ...).
    """
    if isinstance(items, str):
        return (Message("user", items),)
    if not isinstance(items, list):
        raise MessageError(param, f"must be a string or a list of input items, got {type(items).__name__}")
    out: list[Message] = []
    joins = False  # the last turn is an assistant message item without a call: a call item joins it
    for k, item in enumerate(items):
        where = f"{param}[{k}]"
        if not isinstance(item, Mapping):
            raise MessageError(where, f"must be an input item (an object), got {type(item).__name__}")
        kind = item.get("type", "message")
        if kind == "message":
            role = RESPONSES_ROLES.get(item["role"]) if isinstance(item.get("role"), str) else None
            if role is None:
                raise MessageError(f"{where}.role", f"unknown role {item.get('role')!r}; use one of "
                                                   f"{', '.join(RESPONSES_ROLES)}",
                                   "invalid" if "role" in item else "missing_field")
            if role == "system" and k:
                raise MessageError(f"{where}.role", "a system or developer message can only be the first item")
            out.append(Message(role, message_text(item.get("content"), f"{where}.content", RESPONSES_TEXT)))
            joins = role == "assistant"
        elif kind == "function_call":
            call = {"name": item.get("name"), "arguments": item.get("arguments")}
            if joins:
                out[-1] = call_message(out[-1].content, call, where)
            else:
                out.append(call_message("", call, where))
            joins = False
        elif kind == "function_call_output":
            out.append(Message("function_response", message_text(item.get("output"), f"{where}.output",
                                                                 RESPONSES_TEXT)))
            joins = False
        else:
            raise MessageError(f"{where}.type", f"input items of type {kind!r} are not supported (codechat reads "
                                                "message, function_call and function_call_output items, and "
                                                "stores nothing an item_reference could name)")
    return tuple(out)


def tool_call(call: Mapping[str, Any], call_id: str) -> dict[str, Any]:
    """OpenAI's ``tool_calls`` entry of a codechat call ``{"name", "arguments": {...}}`` (arguments as JSON text)."""
    return {"id": call_id, "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)}}


def to_openai(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Codechat messages as OpenAI chat messages (module docstring); :func:`from_openai` reads them back."""
    out: list[dict[str, Any]] = []
    open_calls: list[str] = []
    for k, m in enumerate(messages):
        if m.role == "function_response":
            out.append({"role": "tool", "tool_call_id": open_calls.pop(0) if open_calls else f"call_{k}",
                        "content": m.content})
        elif m.function_call is not None:
            open_calls.append(f"call_{k}")
            out.append({"role": "assistant", "content": m.content or None,
                        "tool_calls": [tool_call(m.function_call, open_calls[-1])]})
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def openai_tools(conv: Conversation) -> list[dict[str, Any]]:
    """The conversation's tool schemas in OpenAI's ``{"type": "function", "function": SCHEMA}`` wrapper."""
    return [{"type": "function", "function": dict(t)} for t in conv.tools or ()]


__all__ = ["ROLES", "RESPONSES_ROLES", "RESPONSES_TEXT", "MessageError", "message_text", "call_message", "from_openai",
           "from_responses", "tool_call", "to_openai", "openai_tools"]
