"""OpenAI's chat-completions request, read into codechat's terms (errors: :class:`~.errors.APIError`).

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
from codechat.chat.conversation import Conversation, lone_surrogate, render_for_completion
from codechat.chat.openai_messages import MessageError, from_openai
from codechat.engine import Request, SamplingConfig
from codechat.tokenizer import Tokenizer

from .config import ServeConfig
from .constraints import Grammars, reply_grammar
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


def _bool(body: Mapping[str, Any], key: str, param: str | None = None) -> bool:
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


def _tools(body: Mapping[str, Any], cfg: ServeConfig) -> tuple[tuple[dict[str, Any], ...], frozenset[str]]:
    """The ``tools``, checked (:func:`codechat.tools.tool_from_schema`), as ``{"name", "description",
    "parameters"}`` in the client's spelling (the schemas are rendered as given, as in SFT data), and
    the names of those that say ``"strict": true``."""
    from codechat.tools import ToolError, tool_from_schema
    raw = body.get("tools")
    if raw is None:
        return (), frozenset()
    if not isinstance(raw, list):
        raise bad("tools", "must be a list of {\"type\": \"function\", \"function\": {...}}")
    if len(raw) > cfg.max_tools:
        raise bad("tools", f"{len(raw)} tools; at most {cfg.max_tools}")
    out, names, strict = [], set(), set()
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
        if _bool(fn, "strict", f"tools[{k}].function.strict"):
            strict.add(tool.name)
    return tuple(out), frozenset(strict)


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


def _response_format(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``response_format`` when it asks for JSON (``json_object`` or ``json_schema``); None for ``text``
    or none given. The schema itself is checked when it is compiled (:mod:`.constraints`)."""
    v = body.get("response_format")
    if v is None:
        return None
    kinds = ("text", "json_object", "json_schema")
    if not isinstance(v, Mapping) or v.get("type") not in kinds:
        raise bad("response_format", f"must be {{\"type\": T}} with T one of {', '.join(kinds)}, got "
                                     f"{json.dumps(v)[:60]}")
    if v["type"] == "json_schema":
        spec = v.get("json_schema")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("schema"), Mapping):
            raise bad("response_format.json_schema", "must be {\"name\": ..., \"schema\": {...}, \"strict\": "
                                                     "true} with a schema object")
        _bool(spec, "strict", "response_format.json_schema.strict")
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
    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    if opts is not None and (not stream or not isinstance(opts, Mapping)):
        raise bad("stream_options", "is an object, allowed only with stream: true")
    return stream, _bool(opts, "include_usage", "stream_options.include_usage") if opts else False


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
    tools, strict = _tools(body, cfg)
    choice = _tool_choice(body, tools)
    fmt = _response_format(body)
    conv = Conversation(messages, tools if choice != "none" else None)
    prompt = render_for_completion(tok, conv)

    stream, include_usage = read_stream(body)
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
    temperature, top_p, seed = read_sampling(body)
    stop_ids = tok.special_ids - ({tok.special_id(FUNCTION_CALL_TOKEN)} if choice != "none" else set())
    stop, logprobs = _stop(body, cfg), _bool(body, "logprobs")
    top = _int(body, "top_logprobs", 0, 20) or 0
    if top and not logprobs:
        raise bad("top_logprobs", "needs logprobs: true")
    options = sampling_options(body, grammars.vocab_size)
    grammar = reply_grammar(grammars, tools, choice, strict, fmt)  # last: compiling is the costly check
    request = Request(prompt, SamplingConfig(new, temperature, 0, top_p, top_logprobs=top, **options), samples=n,
                      seed=seed, stop_ids=sorted(stop_ids), grammar=grammar)
    return ChatRequest(conv, request, stop, choice != "none", stream, include_usage, logprobs)


__all__ = ["APIError", "ChatRequest", "bad", "check_body", "parse_chat_request", "read_sampling", "read_stream",
           "sampling_options"]
