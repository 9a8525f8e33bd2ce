"""SFT data formats: records in files -> :class:`~codechat.chat.conversation.Conversation` with their source and line.

A record's format is detected from its fields (``--sft.format`` / ``PATH#FORMAT`` overrides it).
Detection looks at one distinctive field per format, in this order, so that a record missing a
required field is reported as such instead of silently matching another format:

========== ==================== ===================================================================
format     detected by          mapping
========== ==================== ===================================================================
messages   ``messages``         OpenAI chat, read by :func:`codechat.chat.openai_messages.from_openai` (as
                                ``codechat serve`` reads a request): roles system/developer, user,
                                assistant, tool/function (-> function_response); ``content`` str,
                                list of text parts or null; ``tool_calls`` / legacy ``function_call``
                                (arguments object or JSON string), each call its own assistant turn;
                                ``tools`` / ``functions`` schemas.
sharegpt   ``conversations``    ``{from, value}`` (or ``{role, content}``) with human/user, gpt/
                                assistant, function_call (call JSON), observation (-> function_
                                response), system; ``tools`` (JSON string or list); ``system``.
glaive     ``chat``             glaive-function-calling-v2 raw: ``system`` ("SYSTEM: ..." with the
                                function schemas, which become ``tools``) and ``chat`` split at
                                ``USER:`` / ``ASSISTANT:`` / ``FUNCTION RESPONSE:`` *at line starts*;
                                ``<|endoftext|>`` turn ends are stripped; ``<functioncall> {...}``
                                (single-quoted JSON-string arguments) becomes a function call.
mbpp       ``test_list``        ``text`` (or sanitized ``prompt``), ``code``, ``test_list``: the user
                                asks with :data:`MBPP_PROMPT`, the assistant answers with the code.
humaneval  ``canonical_solution`` ``prompt`` + ``canonical_solution``: :data:`HUMANEVAL_PROMPT`, the
                                assistant answers with the rest of the function (the solution, as
                                indented under the signature), not a copy of the prompt.
alpaca     ``instruction``      ``instruction``, optional ``input`` (appended after a blank line),
                                ``output`` or ``response`` (or ``instances[0]``, the seed tasks).
qa         ``question``         ``question`` -> user, ``answer`` -> assistant (GSM8K, kept verbatim).
completion ``completion``       ``prompt`` -> user, ``completion`` -> assistant.
prompt     ``prompt``           prompt-only: ``prompt`` -> user (optional ``system``), no answer; for
                                ``codechat distill`` and ``codechat sft --teacher-completions``.
text       ``text``             plain text, pretraining-style: ONE assistant turn holding the whole
                                text and no prompt, so every token (and the closing ``<|end|>``) is
                                trained on, as in pretraining.
========== ==================== ===================================================================

In the chat formats (messages, sharegpt, glaive), assistant text that holds a call in the seed
system's spelling ``<functioncall> {json}`` becomes a structured function call, read by
:func:`codechat.chat.calls.parse_assistant_text` with ``strict``: a marker not followed by exactly one
valid call (text after the call included) makes the record invalid, with the parser's reason and
character offset in the message (never trained on as text, never cut silently).

Files and datasets are read by :mod:`codechat.data.readers` (``.jsonl``, ``.json``, ``.parquet``, each
optionally ``.gz``; a directory of them; ``hf:`` datasets).
A record that fits no format, lacks a field or holds invalid values raises :class:`BadRecordError`
(a :class:`FormatError`) naming the file, line and field - or, with ``skip_bad``, is skipped and
counted by reason. The message names no command-line flag: only the callers that offer a way
to skip such records (the SFT mixture, :func:`codechat.data.mixture.load_source`) say so.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from codechat.chat.calls import CALL_MARKERS, parse_assistant_text, parse_call
from codechat.chat.conversation import Conversation, Message, normalize_tool
from codechat.data.readers import (BadRecordError, BadRow, FormatError, LoadCounts, checked_rows, data_files, read_rows,
                                   record_field)
from codechat.chat.openai_messages import MessageError, from_openai, message_text

#: Formats in detection order, each with the field that identifies it.
DETECT_BY: tuple[tuple[str, str], ...] = (("messages", "messages"), ("sharegpt", "conversations"), ("glaive", "chat"),
                                          ("mbpp", "test_list"), ("humaneval", "canonical_solution"),
                                          ("alpaca", "instruction"), ("qa", "question"),
                                          ("completion", "completion"), ("prompt", "prompt"), ("text", "text"))
FORMATS: tuple[str, ...] = tuple(f for f, _ in DETECT_BY)
#: The user turn of an MBPP record (as in the MBPP paper's prompt, without its few-shot part).
MBPP_PROMPT = "{text}\nYour code should pass these tests:\n\n{tests}"
#: The user turn of a HumanEval record; the answer is the rest of the function. (Answering with the
#: whole function made a d12 model re-type the signature and docstring first: 52% of its HumanEval
#: samples renamed the function or lost its ``def`` on the way, 2026-12-02, benchmarks/RESULTS.md.)
HUMANEVAL_PROMPT = "Complete the following Python function:\n\n{prompt}"
#: Prefix of the raw glaive ``system`` string.
GLAIVE_SYSTEM_PREFIX = "SYSTEM:"
_GLAIVE_ROLES = {"USER": "user", "ASSISTANT": "assistant", "FUNCTION RESPONSE": "function_response"}
_GLAIVE_SPLIT = re.compile(r"^(USER|ASSISTANT|FUNCTION RESPONSE):[ \t]?", re.MULTILINE)
_GLAIVE_END = "<|endoftext|>"


@dataclass(frozen=True)
class Record:
    """A conversation read from ``source`` (a file path or ``hf:...``) at ``line`` (1-based), in ``format``.

    ``task_id`` is the record's own ``task_id`` field as text (MBPP, HumanEval), ``""`` when it has
    none: the task identity decontamination keys on. ``id`` is its ``id`` field as text (``""``:
    none), the prompt id of :mod:`codechat.data.prompts` when present.
    """

    conversation: Conversation
    source: str
    line: int
    format: str
    task_id: str = ""
    id: str = ""


def detect_format(rec: Mapping[str, Any]) -> str | None:
    """The format whose identifying field ``rec`` has (see :data:`DETECT_BY`), or ``None``."""
    return next((fmt for fmt, key in DETECT_BY if key in rec), None)


# ----------------------------------------------------------------------------- converters
def _text(content: Any, where: str) -> str:
    """Message content as text (:func:`codechat.chat.openai_messages.message_text`)."""
    try:
        return message_text(content, where)
    except MessageError as e:
        raise BadRow("invalid", str(e)) from None


def _tools(value: Any) -> tuple[dict[str, Any], ...] | None:
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise BadRow("invalid", f"field 'tools' is not JSON ({e})") from None
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, list):
        raise BadRow("invalid", f"field 'tools' must be a list of function schemas, got {type(value).__name__}")
    return tuple(normalize_tool(t) for t in value)


def _message(role: str, content: str) -> Message:
    """A message; assistant text holding a call in the seed spelling ``<functioncall> {json}`` becomes a call.

    A marker followed by something that is not a call makes the record invalid (never trained on as text).
    """
    if role == "assistant" and any(m in content for m in CALL_MARKERS):
        try:
            text, call = parse_assistant_text(content, strict=True)
        except ValueError as e:
            raise BadRow("invalid", f"assistant text has a function-call marker but no valid call: {e}") from None
        return Message("assistant", text, call)
    return Message(role, content)


def _from_messages(rec: Mapping[str, Any]) -> Conversation:
    msgs = record_field(rec, "messages record", "messages", kind=list)
    try:
        messages = from_openai(msgs)
    except MessageError as e:
        raise BadRow(e.reason, str(e)) from None
    out = tuple(_message(m.role, m.content) if m.role == "assistant" and m.function_call is None else m
                for m in messages)
    return Conversation(out, _tools(rec.get("tools", rec.get("functions"))))


_SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "model": "assistant", "function_call": "function_call", "observation": "function_response",
                   "function": "function_response", "tool": "function_response",
                   "function_response": "function_response"}


def _from_sharegpt(rec: Mapping[str, Any]) -> Conversation:
    turns = record_field(rec, "sharegpt record", "conversations", kind=list)
    out: list[Message] = []
    system = rec.get("system")
    if isinstance(system, str) and system.strip():
        out.append(Message("system", system))
    for k, t in enumerate(turns):
        if not isinstance(t, Mapping):
            raise BadRow("invalid", f"conversations[{k}] must be an object, got {type(t).__name__}")
        who = t.get("from", t.get("role"))
        role = _SHAREGPT_ROLES.get(who)
        if role is None:
            raise BadRow("invalid", f"conversations[{k}] is from {who!r}; expected one of {', '.join(_SHAREGPT_ROLES)}")
        value = t.get("value", t.get("content"))
        if role == "function_call":
            out.append(Message("assistant", "", parse_call(value) if isinstance(value, str) else value))
        else:
            out.append(_message(role, _text(value, f"conversations[{k}]")))
    return Conversation(tuple(out), _tools(rec.get("tools")))


def _glaive_system(text: str) -> tuple[str, tuple[dict[str, Any], ...] | None]:
    """The prose and the function schemas of a raw glaive ``system`` string."""
    text = text.strip()
    if text.startswith(GLAIVE_SYSTEM_PREFIX):
        text = text[len(GLAIVE_SYSTEM_PREFIX):].strip()
    start = text.find("{")
    if start < 0:
        return text, None
    decoder, tools, pos = json.JSONDecoder(), [], start
    try:
        while pos < len(text):
            obj, pos = decoder.raw_decode(text, pos)
            tools.append(normalize_tool(obj))
            while pos < len(text) and text[pos].isspace():
                pos += 1
    except (json.JSONDecodeError, ValueError):
        return text, None  # not a list of schemas: keep the system text as written
    return text[:start].strip(), tuple(tools)


def _from_glaive(rec: Mapping[str, Any]) -> Conversation:
    chat = record_field(rec, "glaive record", "chat")
    system, tools = _glaive_system(rec.get("system") or "")
    out = [Message("system", system)] if system else []
    parts = _GLAIVE_SPLIT.split(chat)
    if parts[0].strip():
        raise BadRow("invalid", f"glaive chat text before the first USER:/ASSISTANT: marker: {parts[0][:60]!r}")
    for marker, body in zip(parts[1::2], parts[2::2]):
        body = body.strip()
        while body.endswith(_GLAIVE_END):
            body = body[:-len(_GLAIVE_END)].rstrip()
        out.append(_message(_GLAIVE_ROLES[marker], body))
    return Conversation(tuple(out), tools)


def mbpp_prompt(text: str, tests: Iterable[str]) -> str:
    """The user turn of an MBPP problem (:data:`MBPP_PROMPT`)."""
    return MBPP_PROMPT.format(text=text.strip(), tests="\n".join(t.strip() for t in tests))


def _from_mbpp(rec: Mapping[str, Any]) -> Conversation:
    text = record_field(rec, "mbpp record", "text", "prompt")
    code = record_field(rec, "mbpp record", "code")
    tests = record_field(rec, "mbpp record", "test_list", kind=list)
    return Conversation((Message("user", mbpp_prompt(text, tests)),
                         Message("assistant", code.replace("\r\n", "\n").rstrip())))


def _from_humaneval(rec: Mapping[str, Any]) -> Conversation:
    prompt = record_field(rec, "humaneval record", "prompt")
    solution = record_field(rec, "humaneval record", "canonical_solution")
    return Conversation((Message("user", HUMANEVAL_PROMPT.format(prompt=prompt)),
                         Message("assistant", solution.strip("\n").rstrip())))


def _from_alpaca(rec: Mapping[str, Any]) -> Conversation:
    instruction = record_field(rec, "alpaca record", "instruction")
    if rec.get("output") is None and rec.get("response") is None and isinstance(rec.get("instances"), list) \
            and rec["instances"] and isinstance(rec["instances"][0], Mapping):
        rec = {**rec, **rec["instances"][0]}  # the seed-task layout: instruction + instances[{input, output}]
    given = rec.get("input") or ""
    if not isinstance(given, str):
        raise BadRow("invalid", f"field 'input' of an alpaca record must be str, got {type(given).__name__}")
    output = record_field(rec, "alpaca record", "output", "response")
    user = f"{instruction}\n\n{given}" if given.strip() else instruction
    return Conversation((Message("user", user), Message("assistant", output)))


def _from_qa(rec: Mapping[str, Any]) -> Conversation:
    return Conversation((Message("user", record_field(rec, "qa record", "question")),
                         Message("assistant", record_field(rec, "qa record", "answer"))))


def _from_completion(rec: Mapping[str, Any]) -> Conversation:
    return Conversation((Message("user", record_field(rec, "completion record", "prompt")),
                         Message("assistant", record_field(rec, "completion record", "completion"))))


def _from_prompt(rec: Mapping[str, Any]) -> Conversation:
    system = rec.get("system")
    return Conversation(((Message("system", system),) if isinstance(system, str) and system.strip() else ())
                        + (Message("user", record_field(rec, "prompt record", "prompt")),))


def _from_text(rec: Mapping[str, Any]) -> Conversation:
    return Conversation((Message("assistant", record_field(rec, "text record", "text")),))


CONVERTERS: dict[str, Callable[[Mapping[str, Any]], Conversation]] = {
    "messages": _from_messages, "sharegpt": _from_sharegpt, "glaive": _from_glaive, "mbpp": _from_mbpp,
    "humaneval": _from_humaneval, "alpaca": _from_alpaca, "qa": _from_qa, "completion": _from_completion,
    "prompt": _from_prompt, "text": _from_text}


def to_conversation(rec: Mapping[str, Any], format: str = "auto") -> tuple[Conversation, str]:
    """``(conversation, format)`` of one record; ``format="auto"`` detects it.

    Raises:
        FormatError: the record fits no format, lacks a field, or holds invalid values.
    """
    try:
        return _convert(rec, format)
    except BadRow as e:
        raise FormatError(str(e)) from None


def _convert(rec: Any, format: str) -> tuple[Conversation, str]:
    if not isinstance(rec, Mapping):
        raise BadRow("invalid", f"a record must be a JSON object, got {type(rec).__name__}")
    fmt = detect_format(rec) if format == "auto" else format
    if fmt is None:
        need = "; ".join(f"{f}: {k!r}" for f, k in DETECT_BY)
        raise BadRow("no_format", f"record fits no format (fields present: {', '.join(sorted(rec)) or 'none'}); "
                                f"each format needs a field: {need}")
    if fmt not in CONVERTERS:
        raise FormatError(f"unknown format {fmt!r}; known: auto, {', '.join(FORMATS)}")
    try:
        return CONVERTERS[fmt](rec), fmt
    except BadRow:
        raise
    except (ValueError, TypeError, AttributeError) as e:
        raise BadRow("invalid", f"{fmt} record is invalid: {e}") from None


# ----------------------------------------------------------------------------- records of files
def records_from_rows(rows: Iterable[tuple[int, Any]], source: str, *, format: str = "auto", skip_bad: bool = False,
                      counts: LoadCounts | None = None) -> Iterator[Record]:
    """Convert ``(line, record)`` rows of one source to :class:`Record`; see :func:`iter_records`."""
    for line, value, (conv, fmt) in checked_rows(rows, source, lambda v: _convert(v, format), skip_bad=skip_bad,
                                                 counts=counts):
        yield Record(conv, source, line, fmt, *("" if value.get(k) is None else str(value[k]) for k in ("task_id", "id")))


def iter_records(path: str | os.PathLike, *, format: str = "auto", skip_bad: bool = False,
                 counts: LoadCounts | None = None) -> Iterator[Record]:
    """Every record of a file or directory as a :class:`Record`, in file then line order.

    Args:
        format: ``"auto"`` (detect each record) or one of :data:`FORMATS`.
        skip_bad: skip bad records, counting them in ``counts.skipped`` by reason
            (``bad_json``, ``no_format``, ``missing_field``, ``invalid``), instead of raising.

    Raises:
        FormatError: a missing path, an unreadable file, or (without ``skip_bad``) a bad record
            (:class:`BadRecordError`), named as ``FILE:LINE: what is wrong``.
    """
    if format != "auto" and format not in FORMATS:
        raise FormatError(f"unknown format {format!r}; known: auto, {', '.join(FORMATS)}")
    for f in data_files(path):
        yield from records_from_rows(read_rows(f), str(f), format=format, skip_bad=skip_bad, counts=counts)


def load_records(path: str | os.PathLike, **kwargs: Any) -> list[Record]:
    """``list(iter_records(path, **kwargs))``."""
    return list(iter_records(path, **kwargs))


__all__ = ["FORMATS", "DETECT_BY", "MBPP_PROMPT", "HUMANEVAL_PROMPT", "FormatError", "BadRecordError", "Record",
           "detect_format", "to_conversation", "mbpp_prompt", "records_from_rows", "iter_records", "load_records"]
