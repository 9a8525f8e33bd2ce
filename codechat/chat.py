"""Conversations: rendering to token ids with the assistant-only loss mask, and parsing replies.

Fitting a rendered conversation to SFT token budgets is :mod:`codechat.budget`.

Rendered layout (each ``<|...|>`` is one special id, which text can never produce; every other
piece is ordinary text encoded with :meth:`Tokenizer.encode`)::

    <|bos|>
    <|system|>SYSTEM TEXT<|end|>                      optional; first; holds the tool schemas
    <|user|>TEXT<|end|>
    <|assistant|>TEXT<|function_call|>CALL JSON<|end|>  text, a call, or both
    <|function_response|>TEXT<|end|>
    ...

- There is no separator between a role header, its content and ``<|end|>``.
- A function call is :func:`format_call`, ``json.dumps({"name": NAME, "arguments": {...}},
  ensure_ascii=False)``: the arguments are a JSON *object*, written once (never a JSON string
  inside JSON).
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

Parsing a reply (one reader for the project): :func:`parse_reply` (text) and
:func:`parse_reply_ids` (generated ids) return a :class:`Reply` ``(content, call, error,
trailing)`` and never raise; :func:`parse_assistant_text` / :func:`parse_assistant` return
``(content, call)`` and raise :class:`ParseError` with ``strict``; :func:`parse_call` reads call
JSON alone. A call opens with the ``<|function_call|>`` id, or the text ``<|function_call|>`` or
the seed's ``<functioncall>``; it is the first complete JSON object after the marker (a code
fence around it is allowed), its ``arguments`` an object, a JSON string of one, or glaive's
single-quoted ``'{...}'``. Text after the object is never part of the arguments: it is
``Reply.trailing``, dropped by the lenient tuple functions and an error (``trailing_text``) for
the strict ones. A :class:`ParseError` says why (``reason``) and where (``position``, an offset
into the parsed text), so a CLI can send it back to the model as a function response.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from codechat.tokenizer import Tokenizer

ROLES: tuple[str, ...] = ("system", "user", "assistant", "function_response")
ROLE_TOKENS: dict[str, str] = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>",
                               "function_response": "<|function_response|>"}
FUNCTION_CALL_TOKEN = "<|function_call|>"
#: The line that introduces the tool schemas in the system turn.
TOOLS_HEADER = ("You can call these functions. To call one, answer with a function call whose arguments are a "
                "JSON object matching its parameters:")
#: Text spellings of a call marker that the output parser accepts (the seed system's and ours).
CALL_MARKERS: tuple[str, ...] = (FUNCTION_CALL_TOKEN, "<functioncall>")
#: Text spellings of a turn end that the text parser strips from the end of a reply.
END_MARKERS: tuple[str, ...] = ("<|end|>", "<|endoftext|>")


# ----------------------------------------------------------------------------- messages
#: The kinds of :class:`ParseError`, in the order a call is read.
PARSE_ERROR_REASONS: tuple[str, ...] = ("no_json", "bad_json", "no_name", "arguments_not_object", "trailing_text")


class ParseError(ValueError):
    """A function call that cannot be read, with where it went wrong.

    Attributes:
        reason: the kind, one of :data:`PARSE_ERROR_REASONS`:
            ``no_json`` (no JSON object where the call should start), ``bad_json`` (the object,
            or a JSON-string ``arguments``, is not valid JSON), ``no_name`` (no non-empty string
            ``name``), ``arguments_not_object`` (``arguments`` is not an object nor a JSON string
            of one), ``trailing_text`` (text after the call where none is allowed).
        message: one line for a person (or for the model, as a function response).
        position: character offset into ``text`` where reading failed (for a call given as a
            mapping, ``text`` is its JSON and ``position`` is 0).
        text: the whole text that was parsed.
    """

    def __init__(self, reason: str, message: str, position: int, text: str) -> None:
        self.reason, self.message, self.position, self.text = reason, message, position, text
        near = text[max(0, position - 30):position + 50]
        super().__init__(f"not a function call ({reason} at character {position}: {message}): near {near!r}")

    def __reduce__(self) -> tuple[Any, ...]:  # pickles (multiprocessing) with its fields
        return type(self), (self.reason, self.message, self.position, self.text)

    def as_dict(self) -> dict[str, Any]:
        """``{"reason", "message", "position"}``: what a function response telling the model its error holds."""
        return {"reason": self.reason, "message": self.message, "position": self.position}


def _decode_arguments(args: Any, text: str, at: int) -> dict[str, Any]:
    """Arguments as a dict: an object stays, a JSON string is decoded (twice at most), ``None`` / ``""`` is ``{}``.

    ``text`` and ``at`` (where the arguments value starts in it) locate a :class:`ParseError`.
    """
    for _ in range(3):
        if args is None:
            return {}
        if isinstance(args, Mapping):
            return dict(args)
        if not isinstance(args, str):
            break
        stripped = args.strip()
        if not stripped:
            return {}
        try:
            args = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise ParseError("bad_json", f"function-call arguments {stripped[:80]!r} are a string that is not JSON "
                                         f"({e})", at, text) from None
    raise ParseError("arguments_not_object", f"function-call arguments must be a JSON object, got "
                                             f"{type(args).__name__}: {str(args)[:80]!r}", at, text)


def _check_call(value: Mapping[str, Any], text: str, start: int, where: Mapping[str, int]) -> dict[str, Any]:
    """``{"name", "arguments"}`` of a decoded call object that starts at ``start`` of ``text``.

    ``where`` maps keys to the offsets of their values (empty when unknown). Other keys are dropped.
    """
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ParseError("no_name", f"a function call needs a non-empty string 'name', got {name!r}",
                         where.get("name", start), text)
    return {"name": name, "arguments": _decode_arguments(value.get("arguments"), text, where.get("arguments", start))}


def normalize_call(call: Mapping[str, Any] | str) -> dict[str, Any]:
    """``{"name": str, "arguments": dict}`` from a call dict (arguments an object or a JSON string) or call text.

    Keys other than ``name`` and ``arguments`` (an OpenAI ``id``, say) are dropped.

    Raises:
        ParseError: (a ``ValueError``) no non-empty ``name`` (``no_name``), arguments that are not a
            JSON object (``arguments_not_object``, ``bad_json``), or text that is not a call (see
            :func:`parse_call`).
    """
    if isinstance(call, str):
        return parse_call(call)
    if not isinstance(call, Mapping):
        raise ParseError("no_json", f"a function call must be a mapping with name and arguments, got "
                                    f"{type(call).__name__}", 0, repr(call))
    return _check_call(call, json.dumps(call, ensure_ascii=False, default=repr), 0, {})


def format_call(call: Mapping[str, Any] | str) -> str:
    """The text of a call as rendered after ``<|function_call|>``: ``{"name": ..., "arguments": {...}}``.

    The arguments are written once, as a JSON object (a JSON-string ``arguments`` is decoded first).

    Raises:
        ParseError: ``call`` is not a call (see :func:`normalize_call`).
    """
    return json.dumps(normalize_call(call), ensure_ascii=False)


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
        if self.function_call is not None:
            if self.role != "assistant":
                raise ValueError(f"only an assistant message can carry a function call, not {self.role}")
            object.__setattr__(self, "function_call", normalize_call(self.function_call))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.function_call is not None:
            d["function_call"] = self.function_call
        return d


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


def render_turns(tok: Tokenizer, conv: Conversation) -> list[Turn]:
    """The turns of ``conv`` in order, the system turn (with tools) first when there is one."""
    turns: list[Turn] = []
    sys_text = system_text(conv)
    if sys_text is not None:
        turns.append(Turn("system", tok.special_id(ROLE_TOKENS["system"]), tok.encode(sys_text), False))
    for m in conv.messages:
        if m.role == "system":
            continue
        content = tok.encode(m.content) if m.content else []
        if m.function_call is not None:
            content += [tok.special_id(FUNCTION_CALL_TOKEN)] + tok.encode(format_call(m.function_call))
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
    :func:`parse_assistant`.

    Raises:
        ValueError: the conversation already ends with an assistant message.
    """
    if conv.messages[-1].role == "assistant":
        raise ValueError("the conversation already ends with an assistant message; drop it to generate a new one")
    return render(tok, conv)[0] + [tok.special_id(ROLE_TOKENS["assistant"])]


# ----------------------------------------------------------------------------- parsing
# One reader for every call the project parses: model output (parse_reply / parse_reply_ids, and the
# tuple-returning parse_assistant_text / parse_assistant built on them), call text in data files
# (parse_call) and call dicts (normalize_call).
_DECODER = json.JSONDecoder()
_WS = re.compile(r"\s*")
#: A code-fence opener (```, ```json, ```JSON ...) right before the call object.
_FENCE_OPEN = re.compile(r"```[A-Za-z0-9_+.-]*[ \t]*")
#: The same at the end of the content before a text marker: ```json\n<functioncall> {...}\n```.
_FENCE_BEFORE = re.compile(r"```[A-Za-z0-9_+.-]*\s*$")
_FENCE_CLOSE = "```"


def _skip_ws(text: str, pos: int) -> int:
    return _WS.match(text, pos).end()


def _decode_value(text: str, pos: int) -> tuple[Any, int]:
    """One JSON value starting exactly at ``pos``: ``(value, end)``; raises ``bad_json`` at the decoder's position."""
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError as e:
        raise ParseError("bad_json", e.msg, e.pos, text) from None


def _scan_object(text: str, start: int) -> tuple[dict[str, Any], int, dict[str, int]]:
    """The JSON object opening at ``text[start] == "{"``: ``(object, end, offset of each key's value)``.

    Strict JSON, plus glaive's one liberty: a top-level value may be a JSON value inside single
    quotes (``"arguments": '{"q": "it's"}'``), read with a JSON decoder, so apostrophes, braces and
    nested values inside its strings are kept. Nested values are plain JSON.
    """
    obj: dict[str, Any] = {}
    where: dict[str, int] = {}
    pos = _skip_ws(text, start + 1)
    if text.startswith("}", pos):
        return obj, pos + 1, where
    while True:
        if not text.startswith('"', pos):
            raise ParseError("bad_json", "expected a double-quoted key", pos, text)
        key, pos = _decode_value(text, pos)
        pos = _skip_ws(text, pos)
        if not text.startswith(":", pos):
            raise ParseError("bad_json", f"expected ':' after the key {key!r}", pos, text)
        pos = _skip_ws(text, pos + 1)
        where[key] = pos
        if text.startswith("'", pos):  # glaive: the arguments JSON string written inside single quotes
            inner = _skip_ws(text, pos + 1)
            if text.startswith("'", inner):
                value, pos = "", inner
            else:
                value, pos = _decode_value(text, inner)
                pos = _skip_ws(text, pos)
            if not text.startswith("'", pos):
                raise ParseError("bad_json", f"expected the closing ' of the single-quoted value of {key!r}", pos, text)
            pos += 1
        else:
            value, pos = _decode_value(text, pos)
        obj[key] = value
        pos = _skip_ws(text, pos)
        if text.startswith(",", pos):
            pos = _skip_ws(text, pos + 1)
        elif text.startswith("}", pos):
            return obj, pos + 1, where
        else:
            raise ParseError("bad_json", "expected ',' or '}' after a value", pos, text)


def _read_call(text: str, pos: int, *, fenced: bool = False) -> tuple[dict[str, Any], int]:
    """The call whose object starts at ``pos`` (after whitespace and an optional code-fence opener).

    Returns ``(call, end)``; ``end`` is past the object, and past a closing fence (three backticks)
    when the object was fenced (``fenced`` says a fence was opened before ``pos``).

    Raises:
        ParseError: ``no_json``, ``bad_json``, ``no_name`` or ``arguments_not_object``.
    """
    pos = _skip_ws(text, pos)
    fence = _FENCE_OPEN.match(text, pos)
    if fence:
        fenced, pos = True, _skip_ws(text, fence.end())
    if not text.startswith("{", pos):
        got = repr(text[pos:pos + 20]) if pos < len(text) else "the end of the text"
        raise ParseError("no_json", f"expected a JSON object {{\"name\": ..., \"arguments\": {{...}}}}, got {got}",
                         pos, text)
    value, end, where = _scan_object(text, pos)
    call = _check_call(value, text, pos, where)
    if fenced:
        after = _skip_ws(text, end)
        if text.startswith(_FENCE_CLOSE, after):
            end = after + len(_FENCE_CLOSE)
    return call, end


def parse_call(text: str) -> dict[str, Any]:
    """A function call from its JSON text (the whole text), normalised to ``{"name": str, "arguments": dict}``.

    Accepts ``arguments`` as an object, as a JSON string of one (decoded, twice at most), as
    glaive's single-quoted form ``{"name": "f", "arguments": '{"a": "it's"}'}`` (not JSON; see
    :func:`_scan_object`), or missing / ``null`` / ``""`` (``{}``); surrounding whitespace and a
    code fence around the object are allowed. Keys other than ``name`` and ``arguments`` are dropped.

    Raises:
        ParseError: (a ``ValueError``) ``no_json`` (the text does not start with an object),
            ``bad_json``, ``no_name``, ``arguments_not_object``, or ``trailing_text`` (anything but
            whitespace after the object); ``position`` is the offset into ``text``.
    """
    call, end = _read_call(text, 0)
    rest = _skip_ws(text, end)
    if rest < len(text):
        raise ParseError("trailing_text", f"unexpected text after the call: {text[rest:rest + 40]!r}", rest, text)
    return call


@dataclass(frozen=True)
class Reply:
    """An assistant reply read by :func:`parse_reply`: text, and a function call or why there is none.

    Attributes:
        content: the text before the call marker (whitespace before a text marker stripped), or the
            whole reply when there is no marker or the call does not parse (nothing is lost).
        call: ``{"name": str, "arguments": dict}``, or ``None``.
        error: why the text after the marker is not a call, or ``None``; set only with ``call`` ``None``.
        trailing: text after the call (whitespace-stripped; ``""`` when none). One turn holds one
            call, so :class:`Message` has no place for it: :meth:`message` drops it.
        trailing_at: offset of ``trailing`` in :attr:`text` (its length when there is none).
        text: the text that was parsed (the reply with trailing end markers stripped); offsets
            (:attr:`trailing_at`, ``error.position``) index it.
    """

    content: str
    call: dict[str, Any] | None = None
    error: ParseError | None = None
    trailing: str = ""
    trailing_at: int = 0
    text: str = ""

    def message(self) -> Message:
        """The reply as the assistant :class:`Message` to append to the history (``trailing`` is dropped)."""
        return Message("assistant", self.content, self.call)

    def strict(self) -> tuple[str, dict[str, Any] | None]:
        """``(content, call)``, raising when the reply is not exactly text followed by one call.

        Raises:
            ParseError: :attr:`error`, or ``trailing_text`` when text follows the call.
        """
        if self.error is not None:
            raise self.error
        if self.trailing:
            raise ParseError("trailing_text", f"unexpected text after the call: {self.trailing[:40]!r}",
                             self.trailing_at, self.text)
        return self.content, self.call


def _strip_end_markers(text: str) -> str:
    body = text.rstrip()
    stripped = True
    while stripped:
        stripped = False
        for marker in END_MARKERS:
            if body.endswith(marker):
                body, stripped = body[:-len(marker)].rstrip(), True
    return body


def _reply_after(text: str, content: str, call_start: int, *, fenced: bool, on_error: str) -> Reply:
    try:
        call, end = _read_call(text, call_start, fenced=fenced)
    except ParseError as e:
        return Reply(on_error, error=e, trailing_at=len(text), text=text)
    at = _skip_ws(text, end)
    return Reply(content, call, trailing=text[at:].rstrip(), trailing_at=at, text=text)


def parse_reply(text: str) -> Reply:
    """Read an assistant reply given as text; never raises (a bad call is :attr:`Reply.error`).

    Trailing :data:`END_MARKERS` are stripped. The first of :data:`CALL_MARKERS`
    (``<|function_call|>`` spelled as text, or the seed's ``<functioncall>``) splits the content
    from the call; the call is the first complete JSON object after it (whitespace and a Markdown
    code-fence opener, three backticks and an optional language, may come between; a fence opened
    just before the marker is also accepted and kept out of the content). Text after that object
    is :attr:`Reply.trailing`, never part of the arguments. Without a marker the whole text is
    content: a bare JSON object is not a call. ``ParseError.position`` and ``Reply.trailing_at``
    are offsets into ``text`` (``Reply.text`` and ``ParseError.text`` are ``text`` without its
    trailing end markers, a prefix of it).
    """
    body = _strip_end_markers(text)
    hits = [(body.find(m), m) for m in CALL_MARKERS if m in body]
    if not hits:
        return Reply(body, trailing_at=len(body), text=body)
    at, marker = min(hits)
    content = body[:at]
    fence = _FENCE_BEFORE.search(content)
    if fence:
        content = content[:fence.start()]
    return _reply_after(body, content.rstrip(), at + len(marker), fenced=bool(fence), on_error=body)


def parse_reply_ids(tok: Tokenizer, ids: Sequence[int]) -> Reply:
    """Read generated assistant ids (what follows the ``<|assistant|>`` header); never raises.

    The reply ends at the first ``<|end|>`` or any other control id except ``<|function_call|>``.
    With a ``<|function_call|>`` id, the content is the text before it (kept exactly) and the call
    is read from the text after it as in :func:`parse_reply`; ``ParseError.position`` is then an
    offset into ``content + "<|function_call|>" + call text``, which is also the content of a
    reply whose call does not parse. Without that id the decoded text goes through
    :func:`parse_reply`, which accepts the text spellings ``<functioncall> {json}``.
    """
    fc = tok.special_id(FUNCTION_CALL_TOKEN)
    stop = tok.special_ids - {fc}
    ids = [int(i) for i in ids]
    end = next((k for k, i in enumerate(ids) if i in stop), len(ids))
    ids = ids[:end]
    if fc not in ids:
        return parse_reply(tok.decode(ids))
    at = ids.index(fc)
    content = tok.decode(ids[:at])
    text = content + FUNCTION_CALL_TOKEN + tok.decode(ids[at + 1:])
    return _reply_after(text, content, len(content) + len(FUNCTION_CALL_TOKEN), fenced=False, on_error=text)


def parse_assistant_text(text: str, *, strict: bool = False) -> tuple[str, dict[str, Any] | None]:
    """``(content, function_call)`` of an assistant reply given as text (see :func:`parse_reply`).

    Without ``strict`` a call that does not parse leaves the whole text as content and the call
    ``None``, and text after a call is dropped. With ``strict`` (training data) both raise.

    Raises:
        ParseError: ``strict`` and the text after the marker is not exactly one call
            (any reason of :data:`PARSE_ERROR_REASONS`, ``trailing_text`` included).
    """
    reply = parse_reply(text)
    return reply.strict() if strict else (reply.content, reply.call)


def parse_assistant(tok: Tokenizer, ids: Sequence[int], *, strict: bool = False) -> tuple[str, dict[str, Any] | None]:
    """``(content, function_call)`` of generated assistant ids (see :func:`parse_reply_ids`).

    Without ``strict`` a malformed call is kept as text (``content + "<|function_call|>" + call
    text``) and text after a call is dropped; use :func:`parse_reply_ids` to get the error or the
    trailing text.

    Raises:
        ParseError: ``strict`` and the call does not parse or is followed by text.
    """
    reply = parse_reply_ids(tok, ids)
    return reply.strict() if strict else (reply.content, reply.call)


def parse_conversation(tok: Tokenizer, ids: Sequence[int]) -> Conversation:
    """Invert :func:`render`: split ``ids`` into turns at role-header ids only.

    Text inside a turn is never searched for role names or call markers, so typed
    ``"ASSISTANT: <functioncall> ..."`` stays user text. A final turn without ``<|end|>``
    (a truncated row) is accepted.

    Raises:
        ValueError: ids outside a turn; :class:`ParseError` (a ``ValueError``) for an assistant
            call that does not parse.
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


__all__ = ["ROLES", "ROLE_TOKENS", "FUNCTION_CALL_TOKEN", "TOOLS_HEADER", "CALL_MARKERS", "Message", "Conversation",
           "Turn", "normalize_call", "normalize_tool", "system_text", "split_tools", "render_turns", "join_turns",
           "render", "render_for_completion", "PARSE_ERROR_REASONS", "ParseError", "Reply", "format_call",
           "parse_call", "parse_reply", "parse_reply_ids", "parse_assistant_text", "parse_assistant",
           "parse_conversation", "supervised_spans"]
