"""Function calls and replies as text: the one parser.

A function call is :func:`format_call`, ``json.dumps({"name": NAME, "arguments": {...}},
ensure_ascii=False)``: the arguments are a JSON *object*, written once (never a JSON string inside
JSON). :func:`normalize_call` gives that ``{"name": str, "arguments": dict}`` form of a call dict or
call text; :mod:`codechat.chat.conversation` renders it after the :data:`FUNCTION_CALL_TOKEN` id.

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

Turning a :class:`Reply` into a history message (:func:`codechat.chat.conversation.reply_message`) and reading
rendered conversation ids back (:func:`codechat.chat.conversation.parse_conversation`) are
:mod:`codechat.chat.conversation`'s:
this module imports nothing from it.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from codechat.tokenizer import Tokenizer

#: The special token that opens a function call inside an assistant turn.
FUNCTION_CALL_TOKEN = "<|function_call|>"
#: Text spellings of a call marker that the output parser accepts (the seed system's and ours).
CALL_MARKERS: tuple[str, ...] = (FUNCTION_CALL_TOKEN, "<functioncall>")
#: OpenAI's ``tool_choice`` values besides a tool's name (:func:`codechat.chat.strict.tool_grammar`).
TOOL_CHOICES: tuple[str, ...] = ("auto", "required", "none")
#: Text spellings of a turn end that the text parser strips from the end of a reply.
END_MARKERS: tuple[str, ...] = ("<|end|>", "<|endoftext|>")


# ----------------------------------------------------------------------------- calls
#: The kinds of :class:`ParseError`, in the order a call is read.
PARSE_ERROR_REASONS: tuple[str, ...] = ("no_json", "bad_json", "no_name", "arguments_not_object", "trailing_text",
                                        "length")


class ParseError(ValueError):
    """A function call that cannot be read, with where it went wrong.

    Attributes:
        reason: the kind, one of :data:`PARSE_ERROR_REASONS`:
            ``no_json`` (no JSON object where the call should start), ``bad_json`` (the object,
            or a JSON-string ``arguments``, is not valid JSON), ``no_name`` (no non-empty string
            ``name``), ``arguments_not_object`` (``arguments`` is not an object nor a JSON string
            of one), ``trailing_text`` (text after the call where none is allowed), ``length``
            (the reply reached its token limit inside the call: cut, not malformed;
            :func:`codechat.chat.repl.generate_reply` says so).
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
        except (ValueError, RecursionError) as e:  # also JSON past what the decoder takes (depth, digits)
            raise ParseError("bad_json", f"function-call arguments {stripped[:80]!r} are a string that is not JSON "
                                         f"({type(e).__name__}: {e})", at, text) from None
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
    except (ValueError, RecursionError) as e:  # valid JSON past what the decoder takes: nesting, digits
        raise ParseError("bad_json", f"{type(e).__name__}: {e}", pos, text) from None


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
            call, so a :class:`~codechat.chat.conversation.Message` has no place for it:
            :func:`codechat.chat.conversation.reply_message` drops it.
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


__all__ = ["FUNCTION_CALL_TOKEN", "CALL_MARKERS", "TOOL_CHOICES", "END_MARKERS", "PARSE_ERROR_REASONS", "ParseError", "normalize_call",
           "format_call", "parse_call", "Reply", "parse_reply", "parse_reply_ids", "parse_assistant_text",
           "parse_assistant", "partial_call"]


_PARTIAL = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(.*)', re.DOTALL)


def partial_call(text: str) -> tuple[str, str] | None:
    """``(name, arguments text so far)`` of a call cut short (by ``max_tokens``) once its name is
    written: ``{"name": "add", "arguments": {"a": 1, "b`` -> ``("add", '{"a": 1, "b')``, as OpenAI
    returns a cut call (``finish_reason`` ``length``, the partial ``arguments``); None when ``text``
    (what follows the call marker) has not reached the arguments."""
    m = _PARTIAL.match(text)
    if m is None:
        return None
    try:
        name = json.loads(m.group(1))
    except ValueError:
        return None
    return name, m.group(2)
