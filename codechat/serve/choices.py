"""One choice of a chat completion, built token by token, and the OpenAI objects that carry it.

:class:`ChoiceStream` turns the engine's :class:`~codechat.engine.Token` events of one sample into
:class:`Delta` s: text that is safe to send now, then a last delta with the rest, the function call
and the finish reason. The streamed and the whole answer are the same deltas, so a streamed reply
always equals the non-streamed one.

- Text comes from the tokenizer's streaming decoder (a character split across tokens comes out
  whole) without control tokens.
- ``stop`` strings: the reply ends before the first one; text that could be the start of one is
  held back until it is not (so a stop string never reaches the client, even in part).
- With tools, a call begins at the ``<|function_call|>`` id, or at a call marker spelled in text
  (:data:`codechat.chat.calls.CALL_MARKERS`, held back like stop strings); nothing after it is sent as
  content. At the end the reply is read by :func:`codechat.chat.calls.parse_reply_ids`, the one parser:
  a call becomes ``tool_calls`` (arguments as a JSON string, an id per call) with finish reason
  ``tool_calls``; a call that does not parse (free decoding only: under a grammar every call
  parses) is sent as text — a spelled marker included, the ``<|function_call|>`` id not: no special
  token ever reaches ``content`` — with the finish reason the engine gave, and counted
  (:attr:`ChoiceStream.unparsed`).
- Under a grammar (``stream_calls``) a call streams as OpenAI streams one: its ``id`` and ``name``
  once its arguments begin, then pieces of ``arguments`` as they are written (closing braces held
  back until the call ends), which join to the final ``arguments``: the text as written.
- A call cut by ``max_tokens`` once its name is written comes back as OpenAI returns one: a
  ``tool_calls`` entry whose ``arguments`` are the JSON text so far, finish ``length``
  (:func:`codechat.chat.calls.partial_call`), never as call text in ``content``.
- Under a grammar (:mod:`.constraints`) the engine ends a row at the token that completes it, with
  finish ``stop``: that token is the reply's last (a control id, not in the reply, is what ends a
  free one). A row whose grammar rejected its token (engine finish ``rejected``) never reaches a
  choice: the server answers with an error (:mod:`.app`).
- Finish reasons: ``stop`` (a control id such as ``<|end|>``, a stop string, or the grammar
  complete), ``length`` (``max_tokens``), ``tool_calls``.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from codechat.chat.calls import CALL_MARKERS, FUNCTION_CALL_TOKEN, parse_reply_ids, partial_call
from codechat.chat.openai_messages import tool_call
from codechat.engine import Token
from codechat.tokenizer import Tokenizer


@dataclass
class Delta:
    """What one choice adds: ``content`` text, a ``tool_call`` (OpenAI's ``tool_calls`` entry: the
    whole call, or, for a call streamed as it is written, its ``id``, ``type`` and ``name`` with
    ``arguments`` empty), ``arguments`` (a streamed call's next piece of arguments text), the
    ``finish`` reason on its last delta, and ``logprobs`` entries of the tokens it consumed
    (OpenAI's ``{"token", "logprob", "bytes", "top_logprobs"}``) when they were asked for."""

    index: int
    content: str = ""
    tool_call: dict[str, Any] | None = None
    finish: str | None = None
    logprobs: list[dict[str, Any]] | None = None
    arguments: str = ""


def merge(deltas: Sequence[Delta]) -> list[Delta]:
    """One delta per choice of consecutive ``deltas`` (choices in the order they first appear):
    texts and log-prob entries joined in order, the call and finish reason of the last delta that
    has them. A stream sends one chunk per merged delta, not one per token."""
    out: dict[int, Delta] = {}
    for d in deltas:
        m = out.get(d.index)
        if m is None:
            out[d.index] = Delta(d.index, d.content, d.tool_call, d.finish, list(d.logprobs) if d.logprobs else None,
                                 d.arguments)
            continue
        m.content += d.content
        m.arguments += d.arguments
        if d.logprobs:
            m.logprobs = (m.logprobs or []) + d.logprobs
        m.tool_call, m.finish = d.tool_call or m.tool_call, d.finish or m.finish
    return list(out.values())


def _held(text: str, markers: Sequence[str]) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of one of ``markers``."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


class ChoiceStream:
    """Choice ``index`` of a completion as its tokens arrive (module docstring).

    Args:
        tok: the model's tokenizer.
        index: the choice's index (the engine's sample index).
        stop: stop strings.
        tools: read a function call out of the reply (``<|function_call|>`` is then not a control id).
        logprobs: keep each token's log-probability (at temperature 1, after a grammar's mask).
        stream_calls: send a call's arguments as they are written (a reply under a grammar, whose
            call always parses): the call's ``id`` and ``name`` once its arguments begin, then
            ``arguments`` pieces that join to its final ``arguments`` (the text as written), as
            OpenAI streams calls. Otherwise a call comes whole in the last delta.

    Attributes:
        content: every content text sent so far; ``logprobs``: every token's entry so far (None
        when not asked for); ``tool_call`` once the reply closed with a call; ``finish``: the
        finish reason once closed (None before); ``tokens``: generated tokens consumed (the closing
        control id included); ``unparsed``: the reply began a call that did not parse (sent as text).
    """

    def __init__(self, tok: Tokenizer, index: int, *, stop: Sequence[str] = (), tools: bool = False,
                 logprobs: bool = False, stream_calls: bool = False) -> None:
        self.tok, self.index, self.stop, self.tools, self.stream_calls = tok, index, tuple(stop), tools, stream_calls
        self._args_sent: int | None = None  # chars of a streamed call's arguments sent (None: header not sent)
        self._fc = tok.special_id(FUNCTION_CALL_TOKEN)
        self._control = tok.special_ids - ({self._fc} if tools else set())  # ids that end the reply
        self._decoder = tok.stream(skip_special=True)
        self._markers = self.stop + (CALL_MARKERS if tools else ())
        self._text = ""  # the decoded reply, a call's text included
        self._sent = 0  # chars of _text sent as content
        self._call_at: int | None = None  # where the call begins in _text
        self._ids: list[int] = []  # the reply's ids for the parser, closing id excluded
        self.content = ""
        self.logprobs: list[dict[str, Any]] | None = [] if logprobs else None
        self.tool_call: dict[str, Any] | None = None
        self.finish: str | None = None
        self.tokens = 0
        self.unparsed = False

    def _entry(self, t: int, logprob: float) -> dict[str, Any]:
        """OpenAI's ``{"token", "logprob", "bytes"}`` of token ``t`` (a special token's bytes empty)."""
        return {"token": self.tok.decode([t]), "logprob": logprob,
                "bytes": list(self.tok.token_bytes(t)) if t not in self.tok.special_ids else []}

    def _feed(self, t: int) -> None:
        self._ids.append(t)
        if t == self._fc:
            if self._call_at is None:
                self._call_at = len(self._text)
        else:
            self._text += self._decoder.push(t)

    def _find(self, needles: Sequence[str]) -> tuple[int, str] | None:
        start = max(0, self._sent - max((len(s) for s in needles), default=0))
        hits = [(i, s) for s in needles if (i := self._text.find(s, start)) >= 0]
        return min(hits) if hits else None

    def push(self, ev: Token) -> Delta:
        """Take the next token of this choice; returns what to send now (maybe nothing). After a
        stop string the choice is closed (``finish`` is set): the caller cancels its engine row."""
        assert self.finish is None, "push after the choice closed"
        self.tokens += 1
        lp = None
        control = ev.finish == "stop" and ev.token in self._control  # else a grammar's last token, or none
        if self.logprobs is not None and not control:
            lp = [{**self._entry(ev.token, ev.logprob_t1),
                   "top_logprobs": [self._entry(t, x) for t, x in ev.top or ()]}]
        if control:  # it ends the reply and is not part of it
            return self._close("stop", lp)
        self._feed(ev.token)
        if self._call_at is None:
            stop = self._find(self.stop)
            call = self._find(CALL_MARKERS) if self.tools else None
            if stop and not (call and call[0] < stop[0]):
                self._text = self._text[:stop[0]]
                return self._close("stop", lp)
            if call:
                self._call_at = call[0]
        if ev.finish is not None:
            return self._close(ev.finish, lp)
        safe = self._call_at if self._call_at is not None else len(self._text) - _held(self._text, self._markers)
        if self._call_at is not None and self.stream_calls:
            cut = partial_call(self._call_text())
            if cut is not None:  # held back: closing braces and space, which may be the call's own
                return self._call_piece(cut, len(cut[1].rstrip(" \t\n}")), self._text[self._sent:safe], lp)
        return self._send(self._text[self._sent:safe], lp)

    def _call_text(self) -> str:
        """The text of the call so far (after ``<|function_call|>`` or a call marker spelled in text)."""
        tail = self._text[self._call_at:]
        return next((tail[len(m):] for m in CALL_MARKERS if tail.startswith(m)), tail)

    def _call_piece(self, call: tuple[str, str], upto: int, text: str, lp: list | None) -> Delta:
        """A streamed call's next delta: its header the first time, then its arguments to ``upto``."""
        header = None
        if self._args_sent is None:
            header = {"id": f"call_{secrets.token_hex(12)}", "type": "function",
                      "function": {"name": call[0], "arguments": ""}}
            self.tool_call, self._args_sent = header, 0
        piece = call[1][self._args_sent:upto]
        self._args_sent += len(piece)
        return self._send(text, lp, tool_call=header, arguments=piece)

    def _send(self, text: str, lp: list | None, **kw: Any) -> Delta:
        self._sent += len(text)
        self.content += text
        if lp:
            self.logprobs += lp
        return Delta(self.index, text, logprobs=lp, **kw)

    def _close(self, finish: str, lp: list | None) -> Delta:
        self._text += self._decoder.flush()
        if self._call_at is None:
            return self._send(self._text[self._sent:], lp, finish=self._finished(finish))
        reply = parse_reply_ids(self.tok, self._ids)
        before = self._text[:self._call_at]
        written = partial_call(self._call_text())
        if self._args_sent is not None and written is not None and (reply.call is not None or finish == "length"):
            final = written[1]  # the arguments as written, which the streamed pieces join to
            if reply.call is not None:
                final = final.rstrip()[:-1].rstrip()  # less the call's own closing brace
            piece, self._args_sent = final[self._args_sent:], len(final)
            self.tool_call = {**self.tool_call, "function": {"name": written[0], "arguments": final}}
            return self._send(before[self._sent:], lp, arguments=piece,
                              finish=self._finished("tool_calls" if reply.call is not None else "length"))
        if reply.call is not None:
            self.tool_call = tool_call(reply.call, f"call_{secrets.token_hex(12)}")
            return self._send(before[self._sent:], lp, tool_call=self.tool_call, finish=self._finished("tool_calls"))
        cut = written if finish == "length" else None
        if cut is not None:
            self.tool_call = {"id": f"call_{secrets.token_hex(12)}", "type": "function",
                              "function": {"name": cut[0], "arguments": cut[1]}}
            return self._send(before[self._sent:], lp, tool_call=self.tool_call, finish=self._finished("length"))
        self.unparsed = True  # the text without the <|function_call|> id (never decoded into _text)
        return self._send(self._text[self._sent:], lp, finish=self._finished(finish))

    def _finished(self, finish: str) -> str:
        self.finish = finish
        return finish


# ----------------------------------------------------------------------------- OpenAI objects
@dataclass
class CompletionIds:
    """What every object of one completion repeats: ``id`` (``chatcmpl-...``), ``created`` (Unix
    seconds) and the served ``model``."""

    model: str
    id: str = field(default_factory=lambda: f"chatcmpl-{secrets.token_hex(12)}")
    created: int = field(default_factory=lambda: int(time.time()))


def usage(prompt_tokens: int, choices: Sequence[ChoiceStream]) -> dict[str, int]:
    """OpenAI's ``usage``: ``prompt_tokens`` (counted once for all ``n`` choices: one prefill),
    ``completion_tokens`` (every choice's generated tokens, closing ids included) and their sum."""
    done = sum(c.tokens for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": done, "total_tokens": prompt_tokens + done}


def completion(ids: CompletionIds, choices: Sequence[ChoiceStream], prompt_tokens: int) -> dict[str, Any]:
    """A ``chat.completion`` object of closed choices (``content`` is null when a call came alone)."""
    out = []
    for c in choices:
        message: dict[str, Any] = {"role": "assistant", "content": c.content or (None if c.tool_call else ""),
                                   "refusal": None}
        if c.tool_call is not None:
            message["tool_calls"] = [c.tool_call]
        out.append({"index": c.index, "message": message, "finish_reason": c.finish,
                    "logprobs": {"content": c.logprobs, "refusal": None} if c.logprobs is not None else None})
    return {"id": ids.id, "object": "chat.completion", "created": ids.created, "model": ids.model,
            "system_fingerprint": None, "choices": out, "usage": usage(prompt_tokens, choices)}


def chunk(ids: CompletionIds, delta: Delta | None = None, *, role: int | None = None,
          usage_of: dict[str, int] | None = None) -> dict[str, Any]:
    """A ``chat.completion.chunk``: one choice's ``delta``, the opening ``{"role": "assistant"}``
    of choice ``role``, or (``usage_of``) the last chunk, with no choices and the ``usage``."""
    base = {"id": ids.id, "object": "chat.completion.chunk", "created": ids.created, "model": ids.model,
            "system_fingerprint": None}
    if usage_of is not None:
        return {**base, "choices": [], "usage": usage_of}
    if role is not None:
        return {**base, "choices": [{"index": role, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                     "finish_reason": None}]}
    d: dict[str, Any] = {}
    if delta.content:
        d["content"] = delta.content
    if delta.tool_call is not None or delta.arguments:
        call: dict[str, Any] = {"index": 0, **(delta.tool_call or {})}
        fn = call.get("function", {})
        call["function"] = {**fn, "arguments": fn.get("arguments", "") + delta.arguments}
        d["tool_calls"] = [call]
    lp = {"content": delta.logprobs, "refusal": None} if delta.logprobs else None
    return {**base, "choices": [{"index": delta.index, "delta": d, "logprobs": lp, "finish_reason": delta.finish}]}


__all__ = ["ChoiceStream", "CompletionIds", "Delta", "chunk", "completion", "merge", "usage"]
