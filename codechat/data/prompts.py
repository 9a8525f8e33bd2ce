"""Prompts of SFT records and a teacher's answers joined back to them by prompt id.

``codechat distill`` (:mod:`codechat.data.teacher`) asks a teacher to answer the *prompt* of
every record: its conversation up to and including its last user turn (:func:`prompt_of`; a
prompt-only record, format ``prompt`` or ``messages`` ending at a user turn, is all prompt).
Each prompt has an id (:func:`prompt_id`): the record's ``id`` field when it has one, otherwise
``FILE:LINE`` with ``FILE`` the data file's name (``hf:ORG/NAME`` sources keep their name), so
the same file read from another directory keeps its ids.

``DIR/completions.jsonl`` holds one line per kept answer::

    {"id": PROMPT_ID, "answer": [{"role": "assistant", "content": TEXT, "function_call": CALL?}, ...],
     "finish_reason": "stop", "usage": {"prompt_tokens": N, "completion_tokens": M}, "model": NAME}

``answer`` is the answer as :meth:`Message.to_dict <codechat.chat.conversation.Message.to_dict>` turns
(an answer with several tool calls is one assistant turn per call). ``codechat sft
--teacher-completions DIR/completions.jsonl`` (``sft.teacher_completions``) reads it with
:func:`read_answers` and replaces each record's conversation by its prompt plus the answer
(:func:`join_answers`); a prompt without an answer is an error naming its id
(:func:`missing_message`, which also says which of them ``DIR/rejected.jsonl`` rejected and why).
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from codechat.chat.conversation import Conversation, Message
from codechat.data.formats import FormatError, Record, to_conversation

#: The files of a distillation directory.
COMPLETIONS, REJECTED, SUMMARY = "completions.jsonl", "rejected.jsonl", "summary.json"
#: Prompt ids named at most in one error message.
MAX_NAMED = 10


def prompt_id(rec: Record) -> str:
    """The record's ``id`` field, else ``FILE:LINE`` (the file's name and the 1-based line or row)."""
    if rec.id:
        return rec.id
    return f"{rec.source if rec.source.startswith('hf:') else Path(rec.source).name}:{rec.line}"


def prompt_of(conv: Conversation) -> Conversation | None:
    """The conversation up to and including its last user turn (tools kept); ``None`` without a user turn."""
    last = max((k for k, m in enumerate(conv.messages) if m.role == "user"), default=-1)
    return Conversation(conv.messages[:last + 1], conv.tools) if last >= 0 else None


def jsonl_rows(path: str | os.PathLike) -> Iterator[tuple[int, str, dict[str, Any] | None]]:
    """``(line number, raw line, object)`` of each non-blank line of a JSON-lines file written by distill.

    The object is ``None`` only for an unfinished last line (no newline and not JSON: a write cut
    by a crash); ``codechat distill`` removes such a line when it resumes.

    Raises:
        FormatError: a line that is not a JSON object, naming the file and line.
    """
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as e:  # not JSON, or nested past what the decoder takes
                if not line.endswith("\n"):  # only the last line can lack its newline
                    yield n, line, None
                    continue
                raise FormatError(f"{path}:{n}: not valid JSON ({type(e).__name__}: {e})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
                raise FormatError(f"{path}:{n}: expected a JSON object with a string 'id'")
            yield n, line, obj


def answer_messages(answer: Any, where: str) -> tuple[Message, ...]:
    """The turns of a stored ``answer`` list, read by the ``messages`` format (so calls are checked once).

    Raises:
        FormatError: not a list of assistant turns, naming ``where``.
    """
    if not isinstance(answer, list) or not answer:
        raise FormatError(f"{where}: 'answer' must be a non-empty list of assistant turns")
    try:
        conv, _ = to_conversation({"messages": answer}, "messages")
    except FormatError as e:
        raise FormatError(f"{where}: {e}") from None
    if any(m.role != "assistant" for m in conv.messages):
        raise FormatError(f"{where}: an answer holds only assistant turns")
    return conv.messages


def read_answers(path: str | os.PathLike) -> dict[str, tuple[Message, ...]]:
    """Prompt id -> answer turns of a ``completions.jsonl``.

    Raises:
        FormatError: the file is missing, a line is not JSON (an unfinished last line: rerun
            ``codechat distill`` on its directory to repair it), an answer is malformed, or one
            prompt id is answered twice.
    """
    p = Path(path)
    if not p.is_file():
        raise FormatError(f"--teacher-completions {p}: no such file (codechat distill writes DIR/{COMPLETIONS})")
    answers: dict[str, tuple[Message, ...]] = {}
    first: dict[str, int] = {}
    for n, _, obj in jsonl_rows(p):
        if obj is None:
            raise FormatError(f"{p}:{n}: an unfinished last line (the distill run was killed while writing it); "
                              f"rerun codechat distill with --out {p.parent} to repair it")
        if obj["id"] in answers:
            raise FormatError(f"{p}:{n}: prompt id {obj['id']!r} is answered twice (first at line {first[obj['id']]})")
        answers[obj["id"]] = answer_messages(obj.get("answer"), f"{p}:{n}")
        first[obj["id"]] = n
    return answers


def join_answers(records: Iterable[Record], answers: dict[str, tuple[Message, ...]]
                 ) -> tuple[list[Record], list[str]]:
    """``(records, missing)``: each record's conversation replaced by its prompt and its answer, and the
    ids of the records without an answer (or without a user turn, so without a prompt), in order."""
    joined, missing = [], []
    for rec in records:
        pid = prompt_id(rec)
        prompt = prompt_of(rec.conversation)
        if prompt is None or pid not in answers:
            missing.append(pid)
            continue
        conv = Conversation(prompt.messages + answers[pid], prompt.tools)
        joined.append(dataclasses.replace(rec, conversation=conv))
    return joined, missing


def missing_message(path: str | os.PathLike, missing: list[str]) -> str:
    """The error for prompts without an answer: their ids (the first :data:`MAX_NAMED`), and the
    reasons ``rejected.jsonl`` beside ``path`` gives for those it rejected."""
    p = Path(path)
    named = ", ".join(repr(m) for m in missing[:MAX_NAMED]) + (f" and {len(missing) - MAX_NAMED} more"
                                                               if len(missing) > MAX_NAMED else "")
    reasons: dict[str, str] = {}
    if (p.parent / REJECTED).is_file():
        for _, _, obj in jsonl_rows(p.parent / REJECTED):
            if obj is not None:
                reasons[obj["id"]] = str(obj.get("reason"))
    why: dict[str, int] = {}
    for m in missing:
        if m in reasons:
            why[reasons[m]] = why.get(reasons[m], 0) + 1
    said = f"; {sum(why.values())} of them rejected by the teacher ({p.parent / REJECTED}: " \
           f"{', '.join(f'{k} {v}' for k, v in sorted(why.items()))})" if why else ""
    return (f"--teacher-completions {p} has no answer for {len(missing)} prompt(s) of --data: {named}{said}; "
            "run codechat distill on the same prompts (it retries what failed), or drop those prompts from --data")


__all__ = ["COMPLETIONS", "REJECTED", "SUMMARY", "prompt_id", "prompt_of", "jsonl_rows", "answer_messages",
           "read_answers", "join_answers", "missing_message"]
