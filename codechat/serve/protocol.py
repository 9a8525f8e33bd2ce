"""OpenAI's chat-completions request, read into codechat's terms, and its error object.

:func:`parse_chat_request` checks a decoded request body field by field and returns a
:class:`ChatRequest`: the conversation (:class:`codechat.chat.conversation.Conversation`, tools in the system
turn through :func:`codechat.chat.conversation.system_text`), its prompt ids, the engine
:class:`~codechat.engine.Request` and what the reply needs (stop strings, tool mode). Anything
wrong is an :class:`APIError` naming the field (``param``), never an exception that reaches the
server. Mapping of the history:

- ``messages``: read by :func:`codechat.chat.openai_messages.from_openai`, as the ``messages`` SFT format
  reads training data: ``system`` / ``developer`` (first only) -> the system turn; ``user``;
  ``assistant`` (``content``, and ``tool_calls`` or the older ``function_call``: each call its own
  assistant turn, as in training); ``tool`` / ``function`` -> a ``function_response`` turn;
  ``content`` a string, ``null`` or a list of ``{"type": "text", "text": ...}`` parts (joined).
- ``tool_choice``: ``none`` (the default without tools) declares no tools and ends the reply where
  a call would begin; ``auto`` (the default with tools) declares them and reads a call out of the
  reply (:func:`codechat.chat.calls.parse_reply_ids`); ``required`` starts the reply with the
  ``<|function_call|>`` id; ``{"type": "function", "function": {"name": N}}`` also writes the
  call's opening ``{"name": "N", "arguments":`` so that the model writes the arguments of N.
- Sampling follows OpenAI's defaults: ``temperature`` 1 (0 is greedy; at most 2), ``top_p`` 1;
  ``n`` choices share one prefill; ``seed`` fixes every choice (a random one otherwise).
- Other fields are ignored (``user``, ``metadata``, ``store``, ``parallel_tool_calls``,
  ``service_tier``, ...), as are zero penalties and ``response_format`` ``text``. Refused (400): what codechat
  cannot honour (non-zero penalties, ``logit_bias``, ``top_logprobs`` > 0, other response formats).
"""
from __future__ import annotations

import json
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from codechat.chat.calls import FUNCTION_CALL_TOKEN
from codechat.chat.conversation import Conversation, lone_surrogate, render_for_completion
from codechat.chat.openai_messages import MessageError, from_openai
from codechat.engine import Request, SamplingConfig
from codechat.tokenizer import Tokenizer

from .config import ServeConfig

MAX_TEMPERATURE = 2.0  #: OpenAI's upper bound on ``temperature``
DEFAULT_TEMPERATURE = 1.0  #: OpenAI's default ``temperature``
MAX_SEED = (1 << 63) - 1  #: ``seed`` is an int64


class APIError(Exception):
    """An error answered as OpenAI does: HTTP ``status`` and ``{"error": {"message", "type", "param", "code"}}``.

    Args:
        status: 400 (bad request), 401 (no or wrong key), 404 (unknown model or path), 413 (body
            too large), 429 (queue full; ``headers`` carries ``Retry-After``), 500 (the engine failed).
        message: what is wrong and what to change.
        type: OpenAI's error type (``invalid_request_error``, ``authentication_error``, ...).
        param: the request field at fault (``messages[2].content``), or None.
        code: a machine-readable code (``context_length_exceeded``, ``invalid_api_key``, ...).
    """

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI sends with the error."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str | None, message: str, code: str = "invalid_value") -> APIError:
    """A 400 ``invalid_request_error`` about ``param``."""
    return APIError(400, f"{param}: {message}" if param else message, param=param, code=code)


@dataclass(frozen=True)
class ChatRequest:
    """A checked chat-completions request.

    Attributes:
        conversation: the history as codechat messages, tools declared when ``tool_choice`` allows.
        engine_request: prompt ids (rendered conversation, ``<|assistant|>`` header, ``forced``),
            sampling, ``n`` samples, seed and stop ids (every control id but ``<|function_call|>``,
            which stops the reply too unless ``tools``).
        stop: stop strings: the reply ends before the first one (not included).
        tools: whether a function call is read out of the reply (``tool_choice`` not ``none``).
        forced: ids written for the model at the start of its reply (``tool_choice`` required or
            named); part of the prompt, not of the completion's tokens.
        stream: answer with server-sent events; ``include_usage``: a last chunk with ``usage``.
        logprobs: return each token's log-probability.
    """

    conversation: Conversation
    engine_request: Request
    stop: tuple[str, ...] = ()
    tools: bool = False
    forced: tuple[int, ...] = ()
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False

    @property
    def n(self) -> int:
        """Choices asked for (the engine request's samples)."""
        return len(self.engine_request.samples)

    @property
    def prompt_tokens(self) -> int:
        """Prompt ids, the forced start of the reply included (``usage.prompt_tokens``)."""
        return len(self.engine_request.prompt)


# ----------------------------------------------------------------------------- field readers
def _number(body: Mapping[str, Any], key: str, default: float, lo: float, hi: float, *, lo_open: bool = False
            ) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad(key, f"must be a number, got {json.dumps(v)[:40]}")
    if v < lo or (lo_open and v == lo) or v > hi:
        raise bad(key, f"must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v}")
    return float(v)


def _int(body: Mapping[str, Any], key: str, lo: int, hi: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(key, f"must be an integer, got {json.dumps(v)[:40]}")
    if not lo <= v <= hi:
        raise bad(key, f"must be in [{lo}, {hi}], got {v}")
    return v


def _bool(body: Mapping[str, Any], key: str) -> bool:
    v = body.get(key)
    if v is not None and not isinstance(v, bool):
        raise bad(key, f"must be true or false, got {json.dumps(v)[:40]}")
    return bool(v)


def _stop(body: Mapping[str, Any], cfg: ServeConfig) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad("stop", "must be a non-empty string or a list of non-empty strings")
    if len(stops) > cfg.max_stop:
        raise bad("stop", f"{len(stops)} stop strings; at most {cfg.max_stop}")
    return tuple(stops)


def _tools(body: Mapping[str, Any], cfg: ServeConfig) -> tuple[dict[str, Any], ...]:
    """The ``tools``, checked (:func:`codechat.tools.tool_from_schema`), as ``{"name", "description",
    "parameters"}`` in the client's spelling: the schemas are rendered as given, as in SFT data."""
    from codechat.tools import ToolError, tool_from_schema
    raw = body.get("tools")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise bad("tools", "must be a list of {\"type\": \"function\", \"function\": {...}}")
    if len(raw) > cfg.max_tools:
        raise bad("tools", f"{len(raw)} tools; at most {cfg.max_tools}")
    out, names = [], set()
    for k, t in enumerate(raw):
        if not (isinstance(t, Mapping) and t.get("type") == "function" and isinstance(t.get("function"), Mapping)):
            raise bad(f"tools[{k}]", "must be {\"type\": \"function\", \"function\": {\"name\", \"parameters\"}}")
        try:
            tool = tool_from_schema(t, f"tools[{k}]")
        except ToolError as e:
            raise bad(f"tools[{k}]", str(e).removeprefix(f"tools[{k}]").lstrip(": ")) from None
        if tool.name in names:
            raise bad(f"tools[{k}]", f"a second tool named {tool.name!r}")
        names.add(tool.name)
        fn = t["function"]
        out.append({key: fn[key] for key in ("name", "description", "parameters") if key in fn})
    return tuple(out)


def _tool_choice(body: Mapping[str, Any], tools: tuple[dict[str, Any], ...]) -> str | dict[str, Any]:
    """``"none"``, ``"auto"``, ``"required"`` or the named tool's schema."""
    v = body.get("tool_choice")
    if v is None:
        return "auto" if tools else "none"
    if v in ("none", "auto", "required"):
        if v != "none" and not tools:
            raise bad("tool_choice", f"{v!r} needs tools")
        return v
    name = v.get("function", {}).get("name") if isinstance(v, Mapping) and isinstance(v.get("function"), Mapping) \
        else None
    if not isinstance(name, str):
        raise bad("tool_choice", "must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}")
    match = [t for t in tools if t["name"] == name]
    if not match:
        raise bad("tool_choice", f"names {name!r}, which is not among the tools")
    return match[0]


def _check_tree(body: Mapping[str, Any], max_depth: int) -> None:
    """Every value of the body: nested at most ``max_depth`` deep, strings that are Unicode text.

    Raises:
        APIError: 400 naming the top-level field nested too deep, or the string (or key) holding a
            lone surrogate (``"\\ud800"`` decodes to one; the tokenizer cannot encode it).
    """
    stack: list[tuple[Any, str, int]] = [(body, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            if lone_surrogate(value) is not None:
                raise bad(path or None, "holds a lone surrogate (an unpaired \\ud800-\\udfff escape), which is "
                                        "not Unicode text")
            continue
        if not isinstance(value, (Mapping, list)):
            continue
        if depth > max_depth:
            top = path.split(".")[0].split("[")[0]
            raise bad(top or None, f"nested deeper than {max_depth} levels, this server's limit")
        if isinstance(value, list):
            stack += [(item, f"{path}[{k}]", depth + 1) for k, item in enumerate(value)]
        else:
            stack += [(key, path, depth) for key in value]  # a key is a string too
            stack += [(item, f"{path}.{key}" if path else key, depth + 1) for key, item in value.items()]


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    for key in ("frequency_penalty", "presence_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise bad(key, "is not supported by codechat serve (give 0 or leave it out)", "unsupported_parameter")
    if body.get("logit_bias"):
        raise bad("logit_bias", "is not supported by codechat serve", "unsupported_parameter")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        raise bad("response_format", "only {\"type\": \"text\"} is supported by codechat serve",
                  "unsupported_parameter")
    if (body.get("top_logprobs") or 0) != 0:
        raise bad("top_logprobs", "is not supported: codechat returns the chosen token's log-probability only "
                                  "(logprobs: true)", "unsupported_parameter")
    if body.get("functions") is not None:
        raise bad("functions", "the deprecated functions field is not supported; send tools", "unsupported_parameter")


# ----------------------------------------------------------------------------- the request
def parse_chat_request(body: Any, tok: Tokenizer, max_len: int, cfg: ServeConfig) -> ChatRequest:
    """Check a decoded ``POST /v1/chat/completions`` body and render its prompt.

    Args:
        body: the decoded JSON body.
        tok: the model's tokenizer.
        max_len: the engine's context (prompt plus completion positions).
        cfg: the server's limits.

    Raises:
        APIError: 400 for a malformed or over-limit field (nesting and lone surrogates included:
            :func:`_check_tree`; ``param`` names it; the prompt plus
            ``max_tokens`` over the context is ``code="context_length_exceeded"``), 404 for a
            model other than ``cfg.model_name``.
    """
    if not isinstance(body, Mapping):
        raise bad(None, f"the request body must be a JSON object, got {type(body).__name__}", "invalid_json")
    model = body.get("model")
    if not isinstance(model, str):
        raise bad("model", f"must be a string: the model id {cfg.model_name!r}")
    if model != cfg.model_name:
        raise APIError(404, f"The model {model!r} does not exist; this server serves {cfg.model_name!r}",
                       param="model", code="model_not_found")
    _check_tree(body, cfg.max_depth)
    _refuse_unsupported(body)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad("messages", "must be a non-empty list of messages")
    if len(raw) > cfg.max_messages:
        raise bad("messages", f"{len(raw)} messages; at most {cfg.max_messages}")
    try:
        messages = from_openai(raw)
    except MessageError as e:
        raise bad(e.param, e.message) from None
    if messages[-1].role == "assistant":
        raise bad(f"messages[{len(raw) - 1}].role", "the last message is the assistant's; end with a user or tool "
                                                    "message to get the next assistant turn")
    tools = _tools(body, cfg)
    choice = _tool_choice(body, tools)
    conv = Conversation(messages, tools if choice != "none" else None)
    prompt = render_for_completion(tok, conv)
    forced: list[int] = []
    if choice == "required" or isinstance(choice, dict):
        forced = [tok.special_id(FUNCTION_CALL_TOKEN)]
        if isinstance(choice, dict):  # the opening of format_call's JSON, up to the arguments' value
            forced += tok.encode('{"name": ' + json.dumps(choice["name"], ensure_ascii=False) + ', "arguments":')
    prompt += forced

    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    if opts is not None and (not stream or not isinstance(opts, Mapping)):
        raise bad("stream_options", "is an object, allowed only with stream: true")
    include_usage = _bool(opts, "include_usage") if opts else False
    n = _int(body, "n", 1, cfg.max_n) or 1
    asked = [(k, v) for k in ("max_tokens", "max_completion_tokens") if (v := _int(body, k, 1, MAX_SEED)) is not None]
    if len({v for _, v in asked}) > 1:
        raise bad("max_completion_tokens", "differs from max_tokens; give one of them")
    cap = cfg.max_tokens or max_len
    if asked and asked[0][1] > cfg.max_tokens > 0:
        raise bad(asked[0][0], f"{asked[0][1]} is over this server's limit of {cfg.max_tokens} (--max-tokens)")
    room = max_len - len(prompt)
    if asked:
        key, new = asked[0]
        if new > room:
            raise APIError(400, f"This model's maximum context length is {max_len} tokens. However, you requested "
                                f"{len(prompt) + new} tokens ({len(prompt)} in the messages, {new} in the completion). "
                                f"Please reduce the length of the messages or {key}.",
                           param="messages", code="context_length_exceeded")
    else:
        if room < 1:
            raise APIError(400, f"This model's maximum context length is {max_len} tokens, and the messages take "
                                f"{len(prompt)}: shorten them", param="messages", code="context_length_exceeded")
        new = min(room, cap)
    temperature = _number(body, "temperature", DEFAULT_TEMPERATURE, 0.0, MAX_TEMPERATURE)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    seed = _int(body, "seed", -MAX_SEED - 1, MAX_SEED)
    stop_ids = tok.special_ids - ({tok.special_id(FUNCTION_CALL_TOKEN)} if choice != "none" else set())
    request = Request(prompt, SamplingConfig(new, temperature, 0, top_p), samples=n,
                      seed=secrets.randbits(31) if seed is None else seed, stop_ids=sorted(stop_ids))
    return ChatRequest(conv, request, _stop(body, cfg), choice != "none", tuple(forced), stream, include_usage,
                       _bool(body, "logprobs"))


__all__ = ["APIError", "ChatRequest", "bad", "parse_chat_request"]
