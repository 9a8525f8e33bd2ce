"""SFT data formats: records in files -> :class:`~codechat.chat.Conversation` with their source and line.

A record's format is detected from its fields (``--sft.format`` / ``PATH#FORMAT`` overrides it).
Detection looks at one distinctive field per format, in this order, so that a record missing a
required field is reported as such instead of silently matching another format:

========== ==================== ===================================================================
format     detected by          mapping
========== ==================== ===================================================================
messages   ``messages``         OpenAI chat: roles system/developer, user, assistant, tool/function
                                (-> function_response); ``content`` str, list of text parts or null;
                                ``tool_calls`` / legacy ``function_call`` (arguments object or JSON
                                string); ``tools`` / ``functions`` schemas. Each extra tool call of
                                one message becomes its own assistant turn.
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
                                assistant answers with the whole function.
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
:func:`codechat.calls.parse_assistant_text` with ``strict``: a marker not followed by exactly one
valid call (text after the call included) makes the record invalid, with the parser's reason and
character offset in the message (never trained on as text, never cut silently).

Files: ``.jsonl`` (``line`` is the 1-based line number), ``.json`` (an array, or an object with a
``data`` array; ``line`` is the 1-based record index), ``.parquet`` (needs ``pyarrow``; ``line``
is the 1-based row), each optionally ``.gz``; a directory means every such file under it, sorted.
A record that fits no format, lacks a field or holds invalid values raises :class:`BadRecordError`
(a :class:`FormatError`) naming the file, line and field - or, with ``skip_bad``, is skipped and
counted by reason. The message names no command-line flag: only the callers that offer a way
to skip such records (the SFT mixture, :func:`codechat.data.mixture.load_source`) say so.
"""
from __future__ import annotations

import gzip
import io
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codechat.calls import CALL_MARKERS, parse_assistant_text, parse_call
from codechat.chat import Conversation, Message, normalize_tool

#: Formats in detection order, each with the field that identifies it.
DETECT_BY: tuple[tuple[str, str], ...] = (("messages", "messages"), ("sharegpt", "conversations"), ("glaive", "chat"),
                                          ("mbpp", "test_list"), ("humaneval", "canonical_solution"),
                                          ("alpaca", "instruction"), ("qa", "question"),
                                          ("completion", "completion"), ("prompt", "prompt"), ("text", "text"))
FORMATS: tuple[str, ...] = tuple(f for f, _ in DETECT_BY)
#: File name endings read (each also with ``.gz``).
EXTENSIONS: tuple[str, ...] = (".jsonl", ".json", ".parquet")
#: The user turn of an MBPP record (as in the MBPP paper's prompt, without its few-shot part).
MBPP_PROMPT = "{text}\nYour code should pass these tests:\n\n{tests}"
#: The user turn of a HumanEval record.
HUMANEVAL_PROMPT = "Complete the following Python function:\n\n{prompt}"
#: Prefix of the raw glaive ``system`` string.
GLAIVE_SYSTEM_PREFIX = "SYSTEM:"
_GLAIVE_ROLES = {"USER": "user", "ASSISTANT": "assistant", "FUNCTION RESPONSE": "function_response"}
_GLAIVE_SPLIT = re.compile(r"^(USER|ASSISTANT|FUNCTION RESPONSE):[ \t]?", re.MULTILINE)
_GLAIVE_END = "<|endoftext|>"


class FormatError(ValueError):
    """A data file or record cannot be read; the message names the file, the line and the field."""


class BadRecordError(FormatError):
    """One record fits no format, lacks a field or holds invalid values: what ``skip_bad`` skips."""


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


@dataclass
class LoadCounts:
    """Records read and records skipped (by reason) with ``skip_bad``; ``examples`` holds the first few errors."""

    records: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    def skip(self, reason: str, message: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if len(self.examples) < 3:
            self.examples.append(message)

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())

    def as_dict(self) -> dict[str, Any]:
        return {"records": self.records, "skipped": dict(self.skipped), "examples": list(self.examples)}


class _Bad(Exception):
    """A record problem: ``reason`` is the counter name, ``message`` the explanation."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _field(rec: Mapping[str, Any], fmt: str, *names: str, kind: type | tuple[type, ...] = str) -> Any:
    """The first of ``names`` present (not None) in ``rec``; raises :class:`_Bad` naming the field otherwise."""
    for name in names:
        value = rec.get(name)
        if value is not None:
            if not isinstance(value, kind):
                want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
                raise _Bad("invalid", f"field {name!r} of a {fmt} record must be {want}, got {type(value).__name__}")
            return value
    raise _Bad("missing_field", f"{fmt} record has no field {' or '.join(repr(n) for n in names)} "
                                f"(fields present: {', '.join(sorted(rec)) or 'none'})")


def detect_format(rec: Mapping[str, Any]) -> str | None:
    """The format whose identifying field ``rec`` has (see :data:`DETECT_BY`), or ``None``."""
    return next((fmt for fmt, key in DETECT_BY if key in rec), None)


# ----------------------------------------------------------------------------- converters
def _text(content: Any, where: str) -> str:
    """Message content as text: a string, ``None`` (-> ``""``), or a list of ``{"type": "text", "text"}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, Mapping) and p.get("type", "text") == "text" and isinstance(p.get("text"), str):
                parts.append(p["text"])
            else:
                raise _Bad("invalid", f"{where}: only text content parts are supported, got {str(p)[:80]!r}")
        return "".join(parts)
    raise _Bad("invalid", f"{where}: content must be a string, a list of text parts or null, "
                          f"got {type(content).__name__}")


def _tools(value: Any) -> tuple[dict[str, Any], ...] | None:
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise _Bad("invalid", f"field 'tools' is not JSON ({e})") from None
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, list):
        raise _Bad("invalid", f"field 'tools' must be a list of function schemas, got {type(value).__name__}")
    return tuple(normalize_tool(t) for t in value)


def _message(role: str, content: str) -> Message:
    """A message; assistant text holding a call in the seed spelling ``<functioncall> {json}`` becomes a call.

    A marker followed by something that is not a call makes the record invalid (never trained on as text).
    """
    if role == "assistant" and any(m in content for m in CALL_MARKERS):
        try:
            text, call = parse_assistant_text(content, strict=True)
        except ValueError as e:
            raise _Bad("invalid", f"assistant text has a function-call marker but no valid call: {e}") from None
        return Message("assistant", text, call)
    return Message(role, content)


_OPENAI_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
                 "tool": "function_response", "function": "function_response", "ipython": "function_response",
                 "function_response": "function_response"}


def _from_messages(rec: Mapping[str, Any]) -> Conversation:
    msgs = _field(rec, "messages", "messages", kind=list)
    out: list[Message] = []
    for k, m in enumerate(msgs):
        if not isinstance(m, Mapping):
            raise _Bad("invalid", f"messages[{k}] must be an object, got {type(m).__name__}")
        role = _OPENAI_ROLES.get(m.get("role"))
        if role is None:
            raise _Bad("invalid" if "role" in m else "missing_field",
                       f"messages[{k}] has role {m.get('role')!r}; expected one of {', '.join(_OPENAI_ROLES)}")
        content = _text(m.get("content"), f"messages[{k}]")
        calls = m.get("tool_calls") or ([m["function_call"]] if m.get("function_call") else [])
        if calls and role != "assistant":
            raise _Bad("invalid", f"messages[{k}] is a {role} message with tool calls")
        if not calls:
            out.append(_message(role, content))
            continue
        for j, call in enumerate(calls):
            fn = call.get("function", call) if isinstance(call, Mapping) else call
            out.append(Message("assistant", content if j == 0 else "", fn))
    return Conversation(tuple(out), _tools(rec.get("tools", rec.get("functions"))))


_SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "model": "assistant", "function_call": "function_call", "observation": "function_response",
                   "function": "function_response", "tool": "function_response",
                   "function_response": "function_response"}


def _from_sharegpt(rec: Mapping[str, Any]) -> Conversation:
    turns = _field(rec, "sharegpt", "conversations", kind=list)
    out: list[Message] = []
    system = rec.get("system")
    if isinstance(system, str) and system.strip():
        out.append(Message("system", system))
    for k, t in enumerate(turns):
        if not isinstance(t, Mapping):
            raise _Bad("invalid", f"conversations[{k}] must be an object, got {type(t).__name__}")
        who = t.get("from", t.get("role"))
        role = _SHAREGPT_ROLES.get(who)
        if role is None:
            raise _Bad("invalid", f"conversations[{k}] is from {who!r}; expected one of {', '.join(_SHAREGPT_ROLES)}")
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
    chat = _field(rec, "glaive", "chat")
    system, tools = _glaive_system(rec.get("system") or "")
    out = [Message("system", system)] if system else []
    parts = _GLAIVE_SPLIT.split(chat)
    if parts[0].strip():
        raise _Bad("invalid", f"glaive chat text before the first USER:/ASSISTANT: marker: {parts[0][:60]!r}")
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
    text = _field(rec, "mbpp", "text", "prompt")
    code = _field(rec, "mbpp", "code")
    tests = _field(rec, "mbpp", "test_list", kind=list)
    return Conversation((Message("user", mbpp_prompt(text, tests)),
                         Message("assistant", code.replace("\r\n", "\n").rstrip())))


def _from_humaneval(rec: Mapping[str, Any]) -> Conversation:
    prompt = _field(rec, "humaneval", "prompt")
    solution = _field(rec, "humaneval", "canonical_solution")
    return Conversation((Message("user", HUMANEVAL_PROMPT.format(prompt=prompt)),
                         Message("assistant", (prompt + solution).rstrip())))


def _from_alpaca(rec: Mapping[str, Any]) -> Conversation:
    instruction = _field(rec, "alpaca", "instruction")
    if rec.get("output") is None and rec.get("response") is None and isinstance(rec.get("instances"), list) \
            and rec["instances"] and isinstance(rec["instances"][0], Mapping):
        rec = {**rec, **rec["instances"][0]}  # the seed-task layout: instruction + instances[{input, output}]
    given = rec.get("input") or ""
    if not isinstance(given, str):
        raise _Bad("invalid", f"field 'input' of an alpaca record must be str, got {type(given).__name__}")
    output = _field(rec, "alpaca", "output", "response")
    user = f"{instruction}\n\n{given}" if given.strip() else instruction
    return Conversation((Message("user", user), Message("assistant", output)))


def _from_qa(rec: Mapping[str, Any]) -> Conversation:
    return Conversation((Message("user", _field(rec, "qa", "question")),
                         Message("assistant", _field(rec, "qa", "answer"))))


def _from_completion(rec: Mapping[str, Any]) -> Conversation:
    return Conversation((Message("user", _field(rec, "completion", "prompt")),
                         Message("assistant", _field(rec, "completion", "completion"))))


def _from_prompt(rec: Mapping[str, Any]) -> Conversation:
    system = rec.get("system")
    return Conversation(((Message("system", system),) if isinstance(system, str) and system.strip() else ())
                        + (Message("user", _field(rec, "prompt", "prompt")),))


def _from_text(rec: Mapping[str, Any]) -> Conversation:
    return Conversation((Message("assistant", _field(rec, "text", "text")),))


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
    except _Bad as e:
        raise FormatError(str(e)) from None


def _convert(rec: Any, format: str) -> tuple[Conversation, str]:
    if not isinstance(rec, Mapping):
        raise _Bad("invalid", f"a record must be a JSON object, got {type(rec).__name__}")
    fmt = detect_format(rec) if format == "auto" else format
    if fmt is None:
        need = "; ".join(f"{f}: {k!r}" for f, k in DETECT_BY)
        raise _Bad("no_format", f"record fits no format (fields present: {', '.join(sorted(rec)) or 'none'}); "
                                f"each format needs a field: {need}")
    if fmt not in CONVERTERS:
        raise FormatError(f"unknown format {fmt!r}; known: auto, {', '.join(FORMATS)}")
    try:
        return CONVERTERS[fmt](rec), fmt
    except _Bad:
        raise
    except (ValueError, TypeError, AttributeError) as e:
        raise _Bad("invalid", f"{fmt} record is invalid: {e}") from None


# ----------------------------------------------------------------------------- files
def _stem(path: Path) -> str:
    name = path.name.lower()
    return name[:-3] if name.endswith(".gz") else name


def is_data_file(path: Path) -> bool:
    """A file this module reads (by its name)."""
    return _stem(path).endswith(EXTENSIONS)


def data_files(path: str | os.PathLike) -> list[Path]:
    """``[path]`` for a file, or every data file under a directory (sorted, hidden entries skipped).

    Raises:
        FormatError: the path does not exist, or a directory holds no data file.
    """
    p = Path(path).expanduser()
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise FormatError(f"data source {str(path)!r} does not exist")
    files = sorted(f for f in p.rglob("*") if f.is_file() and is_data_file(f)
                   and not any(part.startswith(".") for part in f.relative_to(p).parts))
    if not files:
        raise FormatError(f"data directory {str(path)!r} holds no {'/'.join(EXTENSIONS)} file (optionally .gz)")
    return files


def _open_binary(path: Path) -> io.BufferedIOBase:
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def read_rows(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """``(line, value)`` of every record of one file; a ``.jsonl`` line that is not JSON gives a :class:`_Bad`.

    Raises:
        FormatError: unsupported extension, a ``.json`` file that is not JSON, or ``pyarrow`` missing.
    """
    p = Path(path)
    stem = _stem(p)
    if stem.endswith(".jsonl"):
        with _open_binary(p) as raw, io.TextIOWrapper(raw, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield n, json.loads(line)
                    except json.JSONDecodeError as e:
                        yield n, _Bad("bad_json", f"not valid JSON ({e})")
    elif stem.endswith(".json"):
        with _open_binary(p) as raw:
            try:
                data = json.loads(raw.read().decode("utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise FormatError(f"{p}: not a valid JSON file ({e})") from None
        if isinstance(data, Mapping):
            data = data["data"] if isinstance(data.get("data"), list) else [data]
        if not isinstance(data, list):
            raise FormatError(f"{p}: expected a JSON array of records, got {type(data).__name__}")
        yield from enumerate(data, 1)
    elif stem.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise FormatError(f"{p}: reading .parquet files needs pyarrow (pip install pyarrow), which is not "
                              "installed; or convert the file to .jsonl") from None
        with _open_binary(p) as raw:
            table = pq.read_table(io.BytesIO(raw.read()))
        yield from enumerate(table.to_pylist(), 1)
    else:
        raise FormatError(f"{p}: unsupported file type; use {', '.join(EXTENSIONS)} (optionally .gz)")


def records_from_rows(rows: Iterable[tuple[int, Any]], source: str, *, format: str = "auto", skip_bad: bool = False,
                      counts: LoadCounts | None = None) -> Iterator[Record]:
    """Convert ``(line, record)`` rows of one source to :class:`Record`; see :func:`iter_records`."""
    counts = counts if counts is not None else LoadCounts()
    for line, value in rows:
        try:
            if isinstance(value, _Bad):
                raise value
            conv, fmt = _convert(value, format)
        except _Bad as e:
            message = f"{source}:{line}: {e}"
            if not skip_bad:
                raise BadRecordError(message) from None
            counts.skip(e.reason, message)
            continue
        counts.records += 1
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


__all__ = ["FORMATS", "DETECT_BY", "EXTENSIONS", "MBPP_PROMPT", "HUMANEVAL_PROMPT", "FormatError", "BadRecordError",
           "Record", "LoadCounts", "detect_format", "to_conversation", "mbpp_prompt", "is_data_file", "data_files",
           "read_rows", "records_from_rows", "iter_records", "load_records"]
