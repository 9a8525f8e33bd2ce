"""OpenAI's Responses API (``POST /v1/responses``) on the chat-completions machinery: a request read into
codechat's terms (:func:`parse_responses_request`) and the ``response`` object and its stream's typed
events built from the reply's deltas (:class:`ResponseBuilder`).

The request (errors: :class:`~.errors.APIError`, 400 naming the field as ``param``):

- ``model``: the served model's id (404 for another), as in chat completions;
- ``input``: a string (one user message) or a non-empty list of items, read by
  :func:`codechat.chat.openai_messages.from_responses`: ``message`` items (roles ``user``, ``system`` /
  ``developer`` (first item only), ``assistant``; content a string or ``input_text`` / ``output_text``
  parts), ``function_call`` items (``name``, ``arguments`` a JSON object as text: an assistant call
  turn) and ``function_call_output`` items (``output``: a function_response turn) — the turns chat's
  assistant ``tool_calls`` and ``role: "tool"`` messages become; at most ``--max-messages`` items;
- ``instructions``: a string, the system turn put first (beside a system or developer item it is a
  400: codechat's prompt holds one system turn);
- ``tools``: function tools, flat ``{"type": "function", "name", "description"?, "parameters"?,
  "strict"?}``, and ``tool_choice`` (``auto``, ``none``, ``required``, ``{"type": "function", "name":
  N}``): what chat's ``tools`` and ``tool_choice`` mean (:mod:`.protocol`), under the same grammars
  (:mod:`.constraints`);
- ``text.format``: ``{"type": "text"}`` (the default), ``{"type": "json_object"}``, ``{"type":
  "json_schema", "name", "schema", "strict"?}``: chat's ``response_format``, the same grammars;
- ``max_output_tokens`` (chat's ``max_tokens``: the default is what the context leaves, over the
  context is a 400 ``context_length_exceeded`` naming ``input``), ``temperature``, ``top_p``, and
  codechat's ``seed`` (not OpenAI's: the ``openai`` client sends it with ``extra_body={"seed": S}``; a
  seed gives the reply chat completions gives for the same seed and messages);
- ``stream``: answer with server-sent events (below);
- ``metadata`` (an object) and ``parallel_tool_calls`` (a boolean; a reply holds one call at most
  whatever it says) are echoed back;
- refused (400, ``code="unsupported_parameter"``): what needs state kept by the server, which keeps
  none — ``previous_response_id``, ``conversation``, ``store: true``, ``background: true``, ``prompt``
  (a stored prompt), ``item_reference`` items; and what codechat cannot honour — ``top_logprobs`` > 0,
  ``include`` (no extra output is produced), ``truncation: "auto"`` (nothing is cut silently: an input
  over the context is a 400). Other fields are ignored, as chat completions ignores its unknown ones.

The answer (:class:`ResponseBuilder`): ``{"id": "resp_...", "object": "response", "created_at",
"status", "model", "output", "usage", ...}`` with the request's settings echoed (``instructions``,
``tools``, ``tool_choice``, ``text``, ``temperature``, ``top_p``, ``max_output_tokens``, ...).
``output`` holds a ``message`` item (one ``output_text`` part; present unless the reply is a call
alone) and then, when the model called a function, a ``function_call`` item (``call_id``, ``name``,
``arguments`` as JSON text). ``status`` is ``completed``, or ``incomplete`` with
``incomplete_details: {"reason": "max_output_tokens"}`` when the reply was cut by length (its last item
``incomplete``; a call cut once its name was written comes back with the partial arguments).
``usage``: ``input_tokens``, ``output_tokens`` (the closing control id included), ``total_tokens``.

A stream (``stream: true``) is ``event: TYPE`` / ``data: {...}`` pairs, each event with its ``type`` and
a ``sequence_number`` from 0: ``response.created``, ``response.in_progress``; for text
``response.output_item.added``, ``response.content_part.added``, ``response.output_text.delta`` (one per
engine step with text), then ``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done``; for a call
``response.output_item.added``, ``response.function_call_arguments.delta`` (pieces as they are
written under a grammar, else the whole arguments at once),
``response.function_call_arguments.done``, ``response.output_item.done``; last ``response.completed``
or ``response.incomplete`` holding the whole response — the same object a request without ``stream``
gets, as both are built from the same deltas. An engine failure after the events began ends the stream
with ``response.failed`` (its ``error``: ``code``, ``message``).
"""
from __future__ import annotations

import copy
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from codechat.chat.conversation import Conversation, Message
from codechat.chat.openai_messages import MessageError, from_responses
from codechat.engine import Request
from codechat.tokenizer import Tokenizer

from .choices import ChoiceStream, Delta, usage
from .config import ServeConfig
from .constraints import RESPONSES, Grammars
from .errors import APIError, bad
from .protocol import check_body, read_bool, read_format, read_reply

#: Fields that need the state a server keeps between requests -> the value that asks for none.
STATEFUL = {"previous_response_id": None, "conversation": None, "store": False, "background": False, "prompt": None}


@dataclass(frozen=True)
class ResponsesRequest:
    """A checked ``POST /v1/responses`` request.

    Attributes:
        conversation: the history as codechat messages (``instructions`` first), tools declared when
            ``tool_choice`` allows.
        engine_request: the prompt ids and everything the reply is generated under (one sample).
        tools: whether a function call is read out of the reply (``tool_choice`` not ``none``).
        stream: answer with server-sent events.
        echo: the settings the response object repeats (``instructions``, ``tools``, ``tool_choice``,
            ``text``, ``temperature``, ``top_p``, ``max_output_tokens``, ``metadata``, ...).
    """

    conversation: Conversation
    engine_request: Request
    tools: bool = False
    stream: bool = False
    echo: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        """Prompt ids (``usage.input_tokens``)."""
        return len(self.engine_request.prompt)


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    for key, none in STATEFUL.items():
        if body.get(key, none) not in (none, None):
            raise bad(key, "is not supported: codechat serve keeps no state between requests (send the whole "
                           f"conversation as input{', with store false or left out' if key == 'store' else ''})",
                      "unsupported_parameter")
    if (body.get("top_logprobs") or 0) != 0:
        raise bad("top_logprobs", "is not supported by codechat serve's Responses API", "unsupported_parameter")
    if body.get("include"):
        raise bad("include", "is not supported: codechat serve produces no extra output to include",
                  "unsupported_parameter")
    if body.get("truncation") not in (None, "disabled"):
        raise bad("truncation", "only \"disabled\" is supported: an input over the context is a 400, never cut",
                  "unsupported_parameter")


def _messages(body: Mapping[str, Any], cfg: ServeConfig) -> tuple[Message, ...]:
    """``instructions`` and ``input`` as the conversation's messages (module docstring)."""
    raw = body.get("input")
    if not isinstance(raw, (str, list)) or raw == []:
        raise bad("input", "must be a string or a non-empty list of input items")
    if isinstance(raw, list) and len(raw) > cfg.max_messages:
        raise bad("input", f"{len(raw)} items; at most {cfg.max_messages}")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad("instructions", "must be a string")
    try:
        messages = from_responses(raw)
    except MessageError as e:
        raise bad(e.param, e.message) from None
    if instructions is not None:
        if messages[0].role == "system":
            raise bad("input[0].role", "a system or developer message beside instructions: codechat's prompt holds "
                                       "one system turn; put it in instructions")
        messages = (Message("system", instructions),) + messages
    if messages[-1].role == "assistant":  # a string is a user message: raw is a list
        raise bad(f"input[{len(raw) - 1}]", "the last item is the assistant's; end with a user message or a "
                                             "function_call_output to get the next assistant turn")
    return messages


def parse_responses_request(body: Any, tok: Tokenizer, max_len: int, cfg: ServeConfig, grammars: Grammars
                            ) -> ResponsesRequest:
    """Check a decoded ``POST /v1/responses`` body, render its prompt and compile its grammar.

    Args:
        body: the decoded JSON body.
        tok: the model's tokenizer.
        max_len: the engine's context (prompt plus reply positions).
        cfg: the server's limits.
        grammars: the server's grammar compiler.

    Raises:
        APIError: 400 for a malformed, over-limit or unsupported field (module docstring; ``param``
            names it), the input plus ``max_output_tokens`` over the context
            (``code="context_length_exceeded"``, ``param="input"``), a schema that does not compile
            (``param`` its place: ``tools[0].parameters.properties.x``, ``text.format.schema...``) or a
            grammar without llguidance; 404 for a model other than ``cfg.model_name``.
    """
    body = check_body(body, cfg)
    _refuse_unsupported(body)
    messages = _messages(body, cfg)
    text = body.get("text")
    if text is not None and not isinstance(text, Mapping):
        raise bad("text", "must be an object: {\"format\": {\"type\": ...}}")
    fmt = read_format((text or {}).get("format"), RESPONSES)
    stream = read_bool(body, "stream")
    parallel = read_bool(body, "parallel_tool_calls") if body.get("parallel_tool_calls") is not None else True
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise bad("metadata", "must be an object of strings")
    reply = read_reply(body, messages, tok, max_len, cfg, grammars, fmt=fmt, limit_keys=("max_output_tokens",),
                       shape=RESPONSES)
    sampling = reply.engine_request.sampling
    echo = {"instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "metadata": dict(metadata or {}), "parallel_tool_calls": parallel,
            "temperature": sampling.temperature, "top_p": sampling.top_p,
            "tool_choice": body.get("tool_choice") or ("auto" if reply.tools else "none"),
            "tools": list(body.get("tools") or []),
            "text": {"format": dict((text or {}).get("format") or {"type": "text"})},
            "previous_response_id": None, "store": False, "background": False, "truncation": "disabled",
            "reasoning": None, "user": body.get("user"), "service_tier": "default", "top_logprobs": 0}
    return ResponsesRequest(reply.conversation, reply.engine_request, reply.tools, stream, echo)


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class ResponseBuilder:
    """One response built from its choice's deltas: the stream's events and the final object.

    Call :meth:`opened` first, :meth:`push` with each delta, then :meth:`closed` (or :meth:`failed`);
    each returns the events to send (a request without ``stream`` drops them and answers
    :attr:`final`). Events are dicts with ``type`` and ``sequence_number``.

    Args:
        req: the request.
        model: the served model's id.

    Attributes:
        id: ``resp_...``; ``created_at``: Unix seconds; ``output``: the items so far;
        ``final``: the whole response once closed (None before).
    """

    def __init__(self, req: ResponsesRequest, model: str) -> None:
        self.req, self.model = req, model
        self.id, self.created_at = _id("resp"), int(time.time())
        self.output: list[dict[str, Any]] = []
        self.final: dict[str, Any] | None = None
        self._seq = 0
        self._message: dict[str, Any] | None = None  # the message item
        self._call: dict[str, Any] | None = None  # the function call item

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return ev

    def response(self, status: str, **fields: Any) -> dict[str, Any]:
        """The response object with ``status`` and the items so far (copied: later deltas do not change it)."""
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "error": None, "incomplete_details": None, "model": self.model, "output": copy.deepcopy(self.output),
                "usage": None, **copy.deepcopy(self.req.echo), **fields}

    def opened(self) -> list[dict[str, Any]]:
        """``response.created`` and ``response.in_progress``."""
        return [self._event("response.created", response=self.response("in_progress")),
                self._event("response.in_progress", response=self.response("in_progress"))]

    def _open_message(self) -> list[dict[str, Any]]:
        item = {"id": _id("msg"), "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        self.output.append(item)
        self._message = item
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        added = self._event("response.output_item.added", output_index=len(self.output) - 1, item=copy.deepcopy(item))
        item["content"].append(part)
        return [added, self._event("response.content_part.added", item_id=item["id"],
                                   output_index=len(self.output) - 1, content_index=0, part=dict(part))]

    def push(self, delta: Delta) -> list[dict[str, Any]]:
        """The events of ``delta``: its text, and a call streamed as it is written (its item opened at
        the call's header, then its arguments pieces); the end is read by :meth:`closed`."""
        events = []
        if delta.content:
            events += self._open_message() if self._message is None else []
            self._message["content"][0]["text"] += delta.content
            events.append(self._event("response.output_text.delta", item_id=self._message["id"],
                                      output_index=len(self.output) - 1, content_index=0, delta=delta.content,
                                      logprobs=[]))
        if delta.tool_call is not None and delta.finish is None:  # a streamed call begins
            events += self._close_message(cut=False) + self._open_call(delta.tool_call)
        if delta.arguments and self._call is not None:
            self._call["arguments"] += delta.arguments
            events.append(self._event("response.function_call_arguments.delta", item_id=self._call["id"],
                                      output_index=self.output.index(self._call), delta=delta.arguments))
        return events

    def _close_message(self, cut: bool) -> list[dict[str, Any]]:
        """The events that close the open message item (none when there is none)."""
        if self._message is None or self._message["status"] != "in_progress":
            return []
        item, at = self._message, self.output.index(self._message)
        item["status"] = "incomplete" if cut else "completed"
        part = item["content"][0]
        return [self._event("response.output_text.done", item_id=item["id"], output_index=at,
                            content_index=0, text=part["text"], logprobs=[]),
                self._event("response.content_part.done", item_id=item["id"], output_index=at,
                            content_index=0, part=dict(part)),
                self._event("response.output_item.done", output_index=at, item=copy.deepcopy(item))]

    def _open_call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        self._call = {"id": _id("fc"), "type": "function_call", "status": "in_progress", "call_id": call["id"],
                      "name": call["function"]["name"], "arguments": ""}
        self.output.append(self._call)
        return [self._event("response.output_item.added", output_index=len(self.output) - 1, item=dict(self._call))]

    def closed(self, choice: ChoiceStream) -> list[dict[str, Any]]:
        """The events that close the response once ``choice`` closed: the message item's, the call's,
        and ``response.completed`` or ``response.incomplete``; sets :attr:`final`."""
        cut = choice.finish == "length"
        events = self._open_message() if self._message is None and choice.tool_call is None else []
        events += self._close_message(cut and choice.tool_call is None)
        if choice.tool_call is not None:
            fn = choice.tool_call["function"]
            if self._call is None:  # a call that came whole: its arguments in one delta
                events += self._open_call(choice.tool_call)
                self._call["arguments"] = fn["arguments"]
                events.append(self._event("response.function_call_arguments.delta", item_id=self._call["id"],
                                          output_index=len(self.output) - 1, delta=fn["arguments"]))
            item, at = self._call, self.output.index(self._call)
            item.update(arguments=fn["arguments"], status="incomplete" if cut else "completed")
            events += [self._event("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                                   name=fn["name"], arguments=fn["arguments"]),
                       self._event("response.output_item.done", output_index=at, item=dict(item))]
        u = usage(self.req.prompt_tokens, [choice])
        done = {"usage": {"input_tokens": u["prompt_tokens"],
                          "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                          "output_tokens": u["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                          "total_tokens": u["total_tokens"]}}
        if cut:
            self.final = self.response("incomplete", incomplete_details={"reason": "max_output_tokens"}, **done)
            return events + [self._event("response.incomplete", response=self.final)]
        self.final = self.response("completed", completed_at=int(time.time()), **done)
        return events + [self._event("response.completed", response=self.final)]

    def failed(self, error: APIError) -> list[dict[str, Any]]:
        """``response.failed``: the engine failed after the stream began (its ``error``: ``code``, ``message``)."""
        return [self._event("response.failed", response=self.response(
            "failed", error={"code": error.code or "server_error", "message": error.message}))]


__all__ = ["ResponseBuilder", "ResponsesRequest", "parse_responses_request"]
