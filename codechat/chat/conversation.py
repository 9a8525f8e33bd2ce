"""Conversations: messages, rendering to token ids with the assistant-only loss mask, and reading them back.

Fitting a rendered conversation to SFT token budgets is :mod:`codechat.chat.budget`; function calls and
assistant replies as text (writing and parsing them) are :mod:`codechat.chat.calls`.

Rendered layout (each ``<|...|>`` is one special id, which text can never produce; every other
piece is ordinary text encoded with :meth:`Tokenizer.encode`)::

    <|bos|>
    <|system|>SYSTEM TEXT<|end|>                      optional; first; holds the tool schemas
    <|user|>TEXT<|end|>
    <|assistant|>TEXT<|function_call|>CALL JSON<|end|>  text, a call, or both
    <|function_response|>TEXT<|end|>
    ...

- There is no separator between a role header, its content and ``<|end|>``.
- A function call is :func:`~codechat.chat.calls.format_call`, ``json.dumps({"name": NAME,
  "arguments": {...}}, ensure_ascii=False)``: the arguments are a JSON *object*, written once
  (never a JSON string inside JSON).
- Tools (JSON schemas ``{"name", "description", "parameters"}``; OpenAI's
  ``{"type": "function", "function": {...}}`` wrapper is removed) are written into the system
  turn: the system text, a blank line when that text is not empty, :data:`TOOLS_HEADER`, then one
  ``json.dumps(schema, ensure_ascii=False)`` per line. Without a system message a system turn
  holding only the tools is created.
- The loss mask is 1 exactly on assistant content, on ``<|function_call|>`` and the call JSON,
  and on the ``<|end|>`` closing an assistant turn; 0 on ``<|bos|>``, every role header, and
  system, user and function-response turns. ``mask[i] == 1`` means "``ids[i]`` is a training
  target": the collator predicts ``ids[i]`` from ``ids[:i]``.

Role boundaries come only from special ids: :func:`parse_conversation` never looks for
``"ASSISTANT:"`` or ``"<functioncall>"`` inside a turn's text, so a user cannot open a turn or a
call by typing one.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from codechat.chat.calls import FUNCTION_CALL_TOKEN, Reply, format_call, normalize_call, parse_assistant
from codechat.tokenizer import Tokenizer

ROLES: tuple[str, ...] = ("system", "user", "assistant", "function_response")
ROLE_TOKENS: dict[str, str] = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>",
                               "function_response": "<|function_response|>"}
#: The line that introduces the tool schemas in the system turn.
TOOLS_HEADER = ("You can call these functions. To call one, answer with a function call whose arguments are a "
                "JSON object matching its parameters:")


# ----------------------------------------------------------------------------- messages
def normalize_tool(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A function schema ``{"name", ...}``; OpenAI's ``{"type": "function", "function": {...}}`` is unwrapped.

    Raises:
        ValueError: not a mapping, or no string ``name``.
    """
    if isinstance(schema, Mapping) and schema.get("type") == "function" and isinstance(schema.get("function"), Mapping):
        schema = schema["function"]
    if not isinstance(schema, Mapping) or not isinstance(schema.get("name"), str):
        raise ValueError(f"a tool schema must be a JSON object with a string 'name', got {str(schema)[:120]!r}")
    return dict(schema)


def lone_surrogate(text: str) -> int | None:
    """Where ``text`` holds a lone surrogate (a JSON ``"\\ud800"``-style escape with no pair decodes
    to one; no UTF-8 spells it, so the tokenizer could not encode it), or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def check_text(text: str, what: str) -> None:
    """Raise ValueError if ``text`` holds a lone surrogate (:func:`lone_surrogate`), naming ``what``."""
    at = lone_surrogate(text)
    if at is not None:
        raise ValueError(f"{what} holds a lone surrogate {text[at]!r} at character {at} (an unpaired "
                         "\\ud800-\\udfff escape), which no UTF-8 text can hold: fix or remove it")


@dataclass(frozen=True)
class Message:
    """One turn. ``content`` ``None`` becomes ``""``; only an assistant message may carry ``function_call``.

    ``function_call`` is normalised to ``{"name": str, "arguments": dict}`` (a JSON-string
    ``arguments`` is decoded once, so both spellings render identically).

    Raises:
        ValueError: unknown role, non-string content, or an invalid / misplaced function call.
    """

    role: str
    content: str = ""
    function_call: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}; roles are {', '.join(ROLES)}")
        if self.content is None:
            object.__setattr__(self, "content", "")
        if not isinstance(self.content, str):
            raise ValueError(f"{self.role} content must be a string or None, got {type(self.content).__name__}")
        check_text(self.content, f"{self.role} content")
        if self.function_call is not None:
            if self.role != "assistant":
                raise ValueError(f"only an assistant message can carry a function call, not {self.role}")
            object.__setattr__(self, "function_call", normalize_call(self.function_call))
            check_text(json.dumps(self.function_call, ensure_ascii=False), "the function call")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.function_call is not None:
            d["function_call"] = self.function_call
        return d


def reply_message(reply: Reply) -> Message:
    """A :class:`~codechat.chat.calls.Reply` as the assistant :class:`Message` for the history (``trailing``
    is dropped)."""
    return Message("assistant", reply.content, reply.call)


@dataclass(frozen=True)
class Conversation:
    """Messages (a system message only first) and optional tool schemas (rendered into the system turn).

    Raises:
        ValueError: no messages, a system message that is not first, or an invalid tool schema.
    """

    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] | None = None

    def __post_init__(self) -> None:
        msgs = tuple(m if isinstance(m, Message) else Message(**m) for m in self.messages)
        if not msgs:
            raise ValueError("a conversation needs at least one message")
        for i, m in enumerate(msgs):
            if m.role == "system" and i:
                raise ValueError(f"a system message can only be the first message, found one at position {i}")
        object.__setattr__(self, "messages", msgs)
        if self.tools is not None:
            tools = tuple(normalize_tool(t) for t in self.tools)
            for t in tools:
                check_text(json.dumps(t, ensure_ascii=False), f"tool {t.get('name')!r}")
            object.__setattr__(self, "tools", tools or None)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"messages": [m.to_dict() for m in self.messages]}
        if self.tools:
            d["tools"] = list(self.tools)
        return d


def system_text(conv: Conversation) -> str | None:
    """The text of the system turn: the system message, then the tools block; ``None`` if neither."""
    base = conv.messages[0].content if conv.messages[0].role == "system" else None
    if not conv.tools:
        return base
    block = TOOLS_HEADER + "\n" + "\n".join(json.dumps(t, ensure_ascii=False) for t in conv.tools)
    return f"{base}\n\n{block}" if base else block


def split_tools(text: str) -> tuple[str, tuple[dict[str, Any], ...] | None]:
    """Inverse of the tools block of :func:`system_text`: ``(system message text, tools or None)``."""
    if text.startswith(TOOLS_HEADER + "\n"):
        base, block = "", text[len(TOOLS_HEADER) + 1:]
    else:
        base, sep, block = text.rpartition("\n\n" + TOOLS_HEADER + "\n")
        if not sep:
            return text, None
    try:
        tools = tuple(normalize_tool(json.loads(line)) for line in block.split("\n"))
    except (ValueError, json.JSONDecodeError):
        return text, None
    return base, tools


# ----------------------------------------------------------------------------- rendering
@dataclass
class Turn:
    """A rendered turn: ``[header] + content + [end]``; ``supervised`` for assistant turns.

    ``content`` holds the text ids and, for an assistant call, ``<|function_call|>`` and the call ids.
    """

    role: str
    header: int
    content: list[int]
    supervised: bool

    def __len__(self) -> int:
        return len(self.content) + 2


def turn_texts(conv: Conversation) -> list[str]:
    """The texts :func:`render_turns` encodes, in its order: the system text (when there is one), then each
    other message's content (when not empty) and call (when it has one)."""
    texts = []
    sys_text = system_text(conv)
    if sys_text is not None:
        texts.append(sys_text)
    for m in conv.messages:
        if m.role == "system":
            continue
        if m.content:
            texts.append(m.content)
        if m.function_call is not None:
            texts.append(format_call(m.function_call))
    return texts


def render_turns(tok: Tokenizer, conv: Conversation, encoded: Sequence[list[int]] | None = None) -> list[Turn]:
    """The turns of ``conv`` in order, the system turn (with tools) first when there is one.

    Args:
        encoded: the ids of :func:`turn_texts`, in its order, when the caller encoded them already (e.g. many
            conversations' texts in one :meth:`~codechat.tokenizer.Tokenizer.encode_batch`, which releases the
            GIL); by default each text is encoded here.

    Raises:
        ValueError: ``encoded`` does not hold one entry per text of :func:`turn_texts`.
    """
    texts = turn_texts(conv)
    if encoded is None:
        encoded = [tok.encode(t) for t in texts]
    elif len(encoded) != len(texts):
        raise ValueError(f"{len(encoded)} encoded texts for a conversation of {len(texts)}")
    pieces = iter(encoded)
    turns: list[Turn] = []
    if conv.messages[0].role == "system" or conv.tools:  # system_text(conv) is not None
        turns.append(Turn("system", tok.special_id(ROLE_TOKENS["system"]), list(next(pieces)), False))
    for m in conv.messages:
        if m.role == "system":
            continue
        content = list(next(pieces)) if m.content else []
        if m.function_call is not None:
            content += [tok.special_id(FUNCTION_CALL_TOKEN), *next(pieces)]
        turns.append(Turn(m.role, tok.special_id(ROLE_TOKENS[m.role]), content, m.role == "assistant"))
    return turns


def join_turns(tok: Tokenizer, turns: Iterable[Turn]) -> tuple[list[int], list[int]]:
    """``(ids, mask)`` of ``<|bos|>`` followed by ``turns``, each closed by ``<|end|>`` (see the layout above)."""
    ids, mask = [tok.bos_id], [0]
    for t in turns:
        s = int(t.supervised)
        ids += [t.header, *t.content, tok.end_id]
        mask += [0] + [s] * len(t.content) + [s]
    return ids, mask


def render(tok: Tokenizer, conv: Conversation) -> tuple[list[int], list[int]]:
    """``(ids, mask)`` of the whole conversation, same length; see the module docstring for the layout."""
    return join_turns(tok, render_turns(tok, conv))


def render_for_completion(tok: Tokenizer, conv: Conversation) -> list[int]:
    """Prompt ids for generation: the rendered conversation, then the ``<|assistant|>`` header.

    Generation continues from here and should stop at ``<|end|>``; give the sampled ids to
    :func:`codechat.chat.calls.parse_reply_ids` (or :func:`~codechat.chat.calls.parse_assistant`).

    Raises:
        ValueError: the conversation already ends with an assistant message.
    """
    if conv.messages[-1].role == "assistant":
        raise ValueError("the conversation already ends with an assistant message; drop it to generate a new one")
    return render(tok, conv)[0] + [tok.special_id(ROLE_TOKENS["assistant"])]


# ----------------------------------------------------------------------------- reading rendered ids back
def parse_conversation(tok: Tokenizer, ids: Sequence[int]) -> Conversation:
    """Invert :func:`render`: split ``ids`` into turns at role-header ids only.

    Text inside a turn is never searched for role names or call markers, so typed
    ``"ASSISTANT: <functioncall> ..."`` stays user text. A final turn without ``<|end|>``
    (a truncated row) is accepted.

    Raises:
        ValueError: ids outside a turn; :class:`~codechat.chat.calls.ParseError` (a ``ValueError``) for
            an assistant call that does not parse.
    """
    roles = {tok.special_id(t): r for r, t in ROLE_TOKENS.items()}
    fc, end = tok.special_id(FUNCTION_CALL_TOKEN), tok.end_id
    ids = [int(i) for i in ids]
    k = 1 if ids[:1] == [tok.bos_id] else 0
    messages: list[Message] = []
    tools = None
    while k < len(ids):
        role = roles.get(ids[k])
        if role is None:
            raise ValueError(f"token {k} (id {ids[k]}) is outside any turn; expected a role header")
        stop = next((j for j in range(k + 1, len(ids)) if ids[j] in tok.special_ids and ids[j] != fc), len(ids))
        body = ids[k + 1:stop]
        if role == "assistant":
            content, call = parse_assistant(tok, body, strict=True) if fc in body else (tok.decode(body), None)
            messages.append(Message("assistant", content, call))
        elif role == "system" and not messages:
            text, tools = split_tools(tok.decode(body))
            messages.append(Message("system", text))
        else:
            if fc in body:
                raise ValueError(f"a {role} turn holds a <|function_call|> id")
            messages.append(Message(role, tok.decode(body)))
        k = stop + 1 if stop < len(ids) and ids[stop] == end else stop
    if messages and messages[0].role == "system" and not messages[0].content and tools:
        messages = messages[1:]  # the system turn held only the tools
    return Conversation(tuple(messages), tools)


def supervised_spans(mask: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, stop)`` index ranges of the runs of 1 in ``mask``."""
    spans, start = [], None
    for k, m in enumerate(mask):
        if m and start is None:
            start = k
        elif not m and start is not None:
            spans.append((start, k))
            start = None
    if start is not None:
        spans.append((start, len(mask)))
    return spans


__all__ = ["ROLES", "ROLE_TOKENS", "TOOLS_HEADER", "Message", "Conversation", "Turn", "normalize_tool", "reply_message",
           "system_text", "split_tools", "turn_texts", "render_turns", "join_turns", "render", "render_for_completion",
           "parse_conversation", "supervised_spans"]
