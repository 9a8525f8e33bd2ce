"""OpenAI's chat-completions request, read into codechat's terms (errors: :class:`~.errors.APIError`).

What every API reads the same way — the body's model and shape (:func:`check_body`), ``tools``
(:func:`read_tools`), ``tool_choice`` (:func:`read_tool_choice`), the reply's format
(:func:`read_format`), and the prompt, sampling, length and grammar of the reply (:func:`read_reply`) —
is read here for the Responses API too (:mod:`.responses`), given its spelling
(:class:`.constraints.Shape`: flat tools, ``text.format``, ``input``).

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
- ``tools``: ``{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}``
  each, the schemas rendered into the system turn as given; ``strict`` (true / false) decides
  whether ``tool_choice`` ``auto`` is constrained (:mod:`.constraints`).
- ``tool_choice``: ``none`` (the default without tools) declares no tools and ends the reply where
  a call would begin; ``auto`` (the default with tools) declares them and reads a call out of the
  reply (:func:`codechat.chat.calls.parse_reply_ids`), generated under the tools' grammar when any
  tool is ``strict``; ``required`` and ``{"type": "function", "function": {"name": N}}`` generate the
  reply under a grammar that admits exactly one ``<|function_call|>`` and a call to a declared tool
  (to N) whose arguments are valid under its ``parameters`` (a grammar is built by :mod:`.constraints`;
  the prompt is the conversation alone, nothing is written into the reply for the model).
- ``response_format``: ``text`` (the default); ``json_object`` (the reply is a JSON object) and
  ``json_schema`` (``{"name", "schema", "strict"?}``: the reply is JSON valid under ``schema``, held
  to it whatever ``strict`` says) are grammars too; refused beside tools unless ``tool_choice`` is
  ``none``. A grammar ends the reply when it is complete (finish reason ``stop``, or ``tool_calls``).
- Sampling follows OpenAI's defaults: ``temperature`` 1 (0 is greedy; at most 2), ``top_p`` 1;
  ``n`` choices share one prefill; ``seed`` fixes every choice (a random one otherwise).
- ``presence_penalty``, ``frequency_penalty`` and ``logit_bias`` with OpenAI's semantics
  (:func:`sampling_options`; :mod:`codechat.engine.sampling`); ``logprobs`` true gives each token's
  log-probability under temperature 1 (after a grammar's mask, penalties and biases) and
  ``top_logprobs`` (0 to 20, with ``logprobs``) that many of the most likely tokens at each position.
- Other fields are ignored (``user``, ``metadata``, ``store``, ``parallel_tool_calls``,
  ``service_tier``, ...). Refused (400): what codechat cannot honour (the deprecated ``functions``,
  a response format beside tools), a schema the grammar library cannot compile (``param`` names its
  place: ``tools[0].function.parameters.properties.x``), and a grammar without the library
  installed (``code="grammar_unavailable"``).
"""
from __future__ import annotations

import json
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from codechat.chat.calls import FUNCTION_CALL_TOKEN
from codechat.chat.conversation import Conversation, Message, lone_surrogate, render_for_completion
from codechat.chat.openai_messages import MessageError, from_openai
from codechat.engine import Request, SamplingConfig
from codechat.engine.sampling import MAX_TOP_LOGPROBS
from codechat.tokenizer import Tokenizer

from .config import ServeConfig
from .constraints import CHAT, Grammars, Shape, reply_grammar
from .errors import APIError, bad

MAX_TEMPERATURE = 2.0  #: OpenAI's upper bound on ``temperature``
DEFAULT_TEMPERATURE = 1.0  #: OpenAI's default ``temperature``
MAX_SEED = (1 << 63) - 1  #: ``seed`` is an int64


@dataclass(frozen=True)
class ChatRequest:
    """A checked chat-completions request.

    Attributes:
        conversation: the history as codechat messages, tools declared when ``tool_choice`` allows.
        engine_request: prompt ids (rendered conversation and ``<|assistant|>`` header), sampling,
            ``n`` samples, seed, stop ids (every control id but ``<|function_call|>``, which stops
            the reply too unless ``tools``) and the reply's grammar (None: free; :mod:`.constraints`).
        stop: stop strings: the reply ends before the first one (not included).
        tools: whether a function call is read out of the reply (``tool_choice`` not ``none``).
        stream: answer with server-sent events; ``include_usage``: a last chunk with ``usage``.
        logprobs: return each token's log-probability.
    """

    conversation: Conversation
    engine_request: Request
    stop: tuple[str, ...] = ()
    tools: bool = False
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False

    @property
    def n(self) -> int:
        """Choices asked for (the engine request's samples)."""
        return len(self.engine_request.samples)

    @property
    def prompt_tokens(self) -> int:
        """Prompt ids (``usage.prompt_tokens``)."""
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


def read_bool(body: Mapping[str, Any], key: str, param: str | None = None) -> bool:
    """``body[key]``: true, false, or absent / null (false).

    Raises:
        APIError: 400 naming ``param`` (default ``key``) for another value.
    """
    v = body.get(key)
    if v is not None and not isinstance(v, bool):
        raise bad(param or key, f"must be true or false, got {json.dumps(v)[:40]}")
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


def read_tools(body: Mapping[str, Any], cfg: ServeConfig, shape: Shape = CHAT
               ) -> tuple[tuple[dict[str, Any], ...], frozenset[str]]:
    """The ``tools``, checked (:func:`codechat.tools.tool_from_schema`), as ``{"name", "description",
    "parameters"}`` in the client's spelling (the schemas are rendered as given, as in SFT data), and
    the names of those that say ``"strict": true``. ``shape`` says where a tool's function schema is
    (chat's ``tools[k].function``, the Responses API's ``tools[k]``).

    Raises:
        APIError: 400 naming the field: not a list, over ``cfg.max_tools``, a tool that is not a
            function tool or whose schema is not one, two tools of one name, ``strict`` not a boolean.
    """
    from codechat.tools import ToolError, tool_from_schema
    raw = body.get("tools")
    if raw is None:
        return (), frozenset()
    if not isinstance(raw, list):
        raise bad("tools", f"must be a list of {shape.tool_spelling}")
    if len(raw) > cfg.max_tools:
        raise bad("tools", f"{len(raw)} tools; at most {cfg.max_tools}")
    out, names, strict = [], set(), set()
    for k, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, Mapping) and not shape.flat else t
        if not (isinstance(t, Mapping) and t.get("type") == "function" and isinstance(fn, Mapping)):
            raise bad(f"tools[{k}]", f"must be {shape.tool_spelling} (function tools only)")
        schema = {key: fn[key] for key in ("name", "description", "parameters") if key in fn}
        try:
            tool = tool_from_schema(schema, f"tools[{k}]")
        except ToolError as e:
            raise bad(f"tools[{k}]", str(e).removeprefix(f"tools[{k}]").lstrip(": ")) from None
        if tool.name in names:
            raise bad(f"tools[{k}]", f"a second tool named {tool.name!r}")
        names.add(tool.name)
        out.append(schema)
        if read_bool(fn, "strict", f"{shape.tool(k)}.strict"):
            strict.add(tool.name)
    return tuple(out), frozenset(strict)


def read_tool_choice(body: Mapping[str, Any], tools: tuple[dict[str, Any], ...], shape: Shape = CHAT
                     ) -> str | dict[str, Any]:
    """``"none"``, ``"auto"``, ``"required"`` or the named tool's schema (a name is chat's
    ``{"type": "function", "function": {"name": N}}``, the Responses API's ``{"type": "function",
    "name": N}``).

    Raises:
        APIError: 400 (``param="tool_choice"``): another value, ``auto`` or ``required`` without tools,
            a name not among the tools.
    """
    v = body.get("tool_choice")
    if v is None:
        return "auto" if tools else "none"
    if v in ("none", "auto", "required"):
        if v != "none" and not tools:
            raise bad("tool_choice", f"{v!r} needs tools")
        return v
    named = (v if shape.flat else v.get("function")) if isinstance(v, Mapping) else None
    name = named.get("name") if isinstance(named, Mapping) and v.get("type", "function") == "function" else None
    if not isinstance(name, str):
        raise bad("tool_choice", f"must be none, auto, required or {shape.choice_spelling}")
    match = [t for t in tools if t["name"] == name]
    if not match:
        raise bad("tool_choice", f"names {name!r}, which is not among the tools")
    return match[0]


def read_format(v: Any, shape: Shape = CHAT) -> Mapping[str, Any] | None:
    """The reply's format (``v``: chat's ``response_format``, the Responses API's ``text.format``) when it
    asks for JSON, in chat's spelling (``{"type": "json_object"}`` or ``{"type": "json_schema",
    "json_schema": {"name", "schema", "strict"?}}``: what :func:`.constraints.reply_grammar` takes); None
    for ``text`` or none given. The schema itself is checked when it is compiled (:mod:`.constraints`).

    Raises:
        APIError: 400 naming the field: another type, a ``json_schema`` without a schema object,
            ``strict`` not a boolean.
    """
    if v is None:
        return None
    kinds = ("text", "json_object", "json_schema")
    if not isinstance(v, Mapping) or v.get("type") not in kinds:
        raise bad(shape.format, f"must be {{\"type\": T}} with T one of {', '.join(kinds)}, got "
                                f"{json.dumps(v)[:60]}")
    if v["type"] == "json_schema":
        spec = v if shape.flat else v.get("json_schema")
        where = shape.format if shape.flat else f"{shape.format}.json_schema"
        if not isinstance(spec, Mapping) or not isinstance(spec.get("schema"), Mapping):
            raise bad(where, "must be {\"name\": ..., \"schema\": {...}, \"strict\": true} with a schema object")
        read_bool(spec, "strict", f"{where}.strict")
        if shape.flat:
            return {"type": "json_schema", "json_schema": {k: spec[k] for k in ("name", "description", "schema",
                                                                               "strict") if k in spec}}
    return None if v["type"] == "text" else v


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
    if body.get("functions") is not None:
        raise bad("functions", "the deprecated functions field is not supported; send tools", "unsupported_parameter")


# ----------------------------------------------------------------------------- shared by the APIs
def check_body(body: Any, cfg: ServeConfig) -> Mapping[str, Any]:
    """``body`` as a request: a JSON object naming the served model, nested at most ``cfg.max_depth``
    deep, its strings Unicode text (:func:`_check_tree`).

    Raises:
        APIError: 400 (``invalid_json`` for a body that is not an object; ``param`` names the field),
            404 for a model other than ``cfg.model_name``.
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
    return body


def read_stream(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """``(stream, include_usage)``: ``stream`` and its ``stream_options.include_usage``.

    Raises:
        APIError: 400 for a value that is not a boolean, or ``stream_options`` without ``stream: true``.
    """
    stream = read_bool(body, "stream")
    opts = body.get("stream_options")
    if opts is not None and (not stream or not isinstance(opts, Mapping)):
        raise bad("stream_options", "is an object, allowed only with stream: true")
    return stream, read_bool(opts, "include_usage", "stream_options.include_usage") if opts else False


def read_sampling(body: Mapping[str, Any]) -> tuple[float, float, int]:
    """``(temperature, top_p, seed)``: OpenAI's defaults 1 and 1, and a random seed when none is given.

    Raises:
        APIError: 400 for a value out of OpenAI's range (``temperature`` in [0, 2], ``top_p`` in
            (0, 1], ``seed`` an int64).
    """
    temperature = _number(body, "temperature", DEFAULT_TEMPERATURE, 0.0, MAX_TEMPERATURE)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    seed = _int(body, "seed", -MAX_SEED - 1, MAX_SEED)
    return temperature, top_p, secrets.randbits(31) if seed is None else seed


def sampling_options(body: Mapping[str, Any], vocab_size: int) -> dict[str, Any]:
    """OpenAI's ``presence_penalty`` and ``frequency_penalty`` (numbers in [-2, 2], default 0) and
    ``logit_bias`` (an object mapping token ids, as strings, to biases in [-100, 100]; at most
    :data:`~codechat.engine.sampling.MAX_LOGIT_BIAS` entries) as :class:`~codechat.engine.SamplingConfig`
    keyword arguments.

    Raises:
        APIError: 400 naming the field: a value out of range, or a token id that is not an integer
            below the model's ``vocab_size``.
    """
    from codechat.engine.sampling import MAX_LOGIT_BIAS
    out: dict[str, Any] = {k: _number(body, k, 0.0, -2.0, 2.0) for k in ("presence_penalty", "frequency_penalty")}
    raw = body.get("logit_bias")
    if raw is None:
        return out
    if not isinstance(raw, Mapping):
        raise bad("logit_bias", "must be an object mapping token ids to biases in [-100, 100]")
    if len(raw) > MAX_LOGIT_BIAS:
        raise bad("logit_bias", f"has {len(raw)} entries; at most {MAX_LOGIT_BIAS}")
    bias = []
    for key in raw:
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and int(key) < vocab_size):  # "²".isdigit()
            raise bad(f"logit_bias.{key}", f"is not a token id of this model (an integer in [0, {vocab_size}))")
        v = raw[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise bad(f"logit_bias.{key}", f"must be a number in [-100, 100], got {json.dumps(v)[:40]}")
        bias.append((int(key), float(v)))
    return {**out, "logit_bias": tuple(bias)}


def _budget(body: Mapping[str, Any], keys: tuple[str, ...], prompt: int, max_len: int, cfg: ServeConfig,
            shape: Shape) -> int:
    """New tokens of the reply: the one asked for under ``keys`` (the same value when several are
    given), else what the context leaves after the ``prompt`` ids, capped by ``cfg.max_tokens``.

    Raises:
        APIError: 400 naming the key: not an integer >= 1, two different values, over
            ``cfg.max_tokens``; ``context_length_exceeded`` (``param`` the history's field) when the
            prompt and the reply do not fit ``max_len``.
    """
    asked = [(k, v) for k in keys if (v := _int(body, k, 1, MAX_SEED)) is not None]
    if len({v for _, v in asked}) > 1:
        raise bad(keys[-1], f"differs from {keys[0]}; give one of them")
    if asked and asked[0][1] > cfg.max_tokens > 0:
        raise bad(asked[0][0], f"{asked[0][1]} is over this server's limit of {cfg.max_tokens} (--max-tokens)")
    room, where = max_len - prompt, shape.prompt
    if asked:
        key, new = asked[0]
        if new > room:
            raise APIError(400, f"This model's maximum context length is {max_len} tokens. However, you requested "
                                f"{prompt + new} tokens ({prompt} in the {where}, {new} in the completion). "
                                f"Please reduce the length of the {where} or {key}.",
                           param=where, code="context_length_exceeded")
        return new
    if room < 1:
        raise APIError(400, f"This model's maximum context length is {max_len} tokens, and the {where} take "
                            f"{prompt}: shorten them", param=where, code="context_length_exceeded")
    return min(room, cfg.max_tokens or max_len)


@dataclass(frozen=True)
class Reply:
    """What a request asks of its reply, read the same way whatever the API (:func:`read_reply`).

    Attributes:
        conversation: the history, tools declared when ``tool_choice`` allows.
        engine_request: the prompt ids and everything the engine generates the reply under.
        tools: whether a function call is read out of the reply (``tool_choice`` not ``none``).
    """

    conversation: Conversation
    engine_request: Request
    tools: bool


def read_reply(body: Mapping[str, Any], messages: tuple[Message, ...], tok: Tokenizer, max_len: int, cfg: ServeConfig,
               grammars: Grammars, *, fmt: Mapping[str, Any] | None, limit_keys: tuple[str, ...],
               shape: Shape = CHAT, n: int = 1, top_logprobs: int = 0) -> Reply:
    """The prompt and the engine request of ``messages`` under ``body``'s ``tools``, ``tool_choice``,
    ``temperature``, ``top_p``, ``seed``, penalties, ``logit_bias`` (:func:`sampling_options`) and
    reply length (module docstring).

    Args:
        body: the checked body (:func:`check_body`).
        messages: the history, not ending with the assistant's turn.
        tok, max_len, cfg, grammars: as :func:`parse_chat_request`'s.
        fmt: the reply's format (:func:`read_format`).
        limit_keys: the fields that may give the reply's length (chat's ``max_tokens`` and
            ``max_completion_tokens``; the Responses API's ``max_output_tokens``).
        shape: the API's spelling of tools and the format (errors name its places).
        n: samples.
        top_logprobs: the most likely tokens returned at each position (0: none).

    Raises:
        APIError: 400 for a malformed field (:func:`read_tools`, :func:`read_tool_choice`,
            :func:`_budget`, the sampling fields), a reply that does not fit the context, or a grammar
            that cannot be built (:func:`.constraints.reply_grammar`).
    """
    tools, strict = read_tools(body, cfg, shape)
    choice = read_tool_choice(body, tools, shape)
    conv = Conversation(messages, tools if choice != "none" else None)
    prompt = render_for_completion(tok, conv)
    new = _budget(body, limit_keys, len(prompt), max_len, cfg, shape)
    temperature, top_p, seed = read_sampling(body)
    options = sampling_options(body, grammars.vocab_size)
    stop_ids = tok.special_ids - ({tok.special_id(FUNCTION_CALL_TOKEN)} if choice != "none" else set())
    grammar = reply_grammar(grammars, tools, choice, strict, fmt, shape)  # last: compiling is the costly check
    request = Request(prompt, SamplingConfig(new, temperature, 0, top_p, top_logprobs=top_logprobs, **options),
                      samples=n, seed=seed, stop_ids=sorted(stop_ids), grammar=grammar)
    return Reply(conv, request, choice != "none")


# ----------------------------------------------------------------------------- the request
def parse_chat_request(body: Any, tok: Tokenizer, max_len: int, cfg: ServeConfig, grammars: Grammars
                       ) -> ChatRequest:
    """Check a decoded ``POST /v1/chat/completions`` body, render its prompt and compile its grammar.

    Args:
        body: the decoded JSON body.
        tok: the model's tokenizer.
        max_len: the engine's context (prompt plus completion positions).
        cfg: the server's limits.
        grammars: the server's grammar compiler (built here at the first request that needs it).

    Raises:
        APIError: 400 for a malformed or over-limit field (nesting and lone surrogates included:
            :func:`_check_tree`; ``param`` names it; the prompt plus
            ``max_tokens`` over the context is ``code="context_length_exceeded"``), for a schema
            that does not compile or a grammar without llguidance (:func:`.constraints.reply_grammar`),
            404 for a model other than ``cfg.model_name``.
    """
    body = check_body(body, cfg)
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
    fmt = read_format(body.get("response_format"))
    stream, include_usage = read_stream(body)
    n = _int(body, "n", 1, cfg.max_n) or 1
    stop, logprobs = _stop(body, cfg), read_bool(body, "logprobs")
    top = _int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    if top and not logprobs:
        raise bad("top_logprobs", "needs logprobs: true")
    reply = read_reply(body, messages, tok, max_len, cfg, grammars, fmt=fmt,
                       limit_keys=("max_tokens", "max_completion_tokens"), n=n, top_logprobs=top)
    return ChatRequest(reply.conversation, reply.engine_request, stop, reply.tools, stream, include_usage, logprobs)


__all__ = ["APIError", "ChatRequest", "Reply", "bad", "check_body", "parse_chat_request", "read_bool", "read_format",
           "read_reply", "read_sampling", "read_stream", "read_tool_choice", "read_tools", "sampling_options"]
