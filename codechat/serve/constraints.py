"""The grammar a chat-completions reply is generated under: OpenAI's ``tool_choice``, strict tools and
``response_format``, mapped to :mod:`codechat.chat.strict` and compiled once per server.

- ``tool_choice`` ``required`` or a tool's name: the reply is one ``<|function_call|>`` and a call to
  one of the (that) tool(s), its ``arguments`` valid under the tool's closed ``parameters``
  (:func:`codechat.chat.strict.tool_grammar`; the closing rules are there), whether or not the
  tools say ``strict`` (a tool without it is never refused for its schema);
- ``auto``: constrained (text, then optionally such a call) when any declared tool has
  ``"strict": true`` — every tool's arguments are then held to its schema —, free otherwise;
- ``none``: free (the tools are not declared to the model);
- ``response_format`` ``json_object`` / ``json_schema``: the reply is a JSON object / JSON valid under
  ``json_schema.schema`` (:func:`codechat.chat.strict.response_format_grammar`), ``json_schema.strict``
  true or not. With tools it is refused unless ``tool_choice`` is ``none``: a reply is held to one
  grammar, and "a call, or JSON in the format" is not one codechat builds.

The :class:`~codechat.engine.grammar.GrammarCompiler` is built at the first request that needs a
grammar (:class:`Grammars`), so a server whose clients never ask for one never loads llguidance.
The Responses API asks the same with other spellings (:data:`RESPONSES`: flat ``tools[k]``, the format
in ``text.format`` with its ``schema`` beside its ``type``); its requests are read into chat's terms and
errors name their places in its own body (:class:`Shape`).

Errors are :class:`~.protocol.APIError` 400s: a schema that does not compile names its place in the
request body as ``param`` (``tools[0].function.parameters.properties.when``,
``response_format.json_schema.schema.$defs``; for the Responses API ``tools[0].parameters...``,
``text.format.schema...``) and the keyword at fault in the message; without llguidance,
``code="grammar_unavailable"``.
"""
from __future__ import annotations

import re
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from codechat.chat.strict import response_format_grammar, tool_grammar
from codechat.engine.grammar import Grammar, GrammarCompiler, GrammarError, GrammarUnavailable
from codechat.tokenizer import Tokenizer

from .errors import APIError, bad


class Grammars:
    """The server's one :class:`~codechat.engine.grammar.GrammarCompiler` (with its cache of compiled
    grammars), built lazily and thread-safely.

    Args:
        tok: the model's tokenizer.
        vocab_size: the model's logits width (``model.cfg.vocab_size``; the engine refuses a grammar
            compiled for more ids).
    """

    def __init__(self, tok: Tokenizer, vocab_size: int) -> None:
        self.tok, self.vocab_size = tok, vocab_size
        self._gc: GrammarCompiler | None = None
        self._lock = threading.Lock()

    def compiler(self, param: str) -> GrammarCompiler:
        """The compiler, built on the first call (seconds at most: every token's bytes go to llguidance).

        Args:
            param: the request field that needs a grammar (named by the error).

        Raises:
            APIError: 400 ``grammar_unavailable`` when llguidance is not installed.
        """
        with self._lock:
            if self._gc is None:
                try:
                    self._gc = GrammarCompiler(self.tok, self.vocab_size)
                except GrammarUnavailable as e:
                    raise APIError(400, str(e), param=param, code="grammar_unavailable") from None
            return self._gc


@dataclass(frozen=True)
class Shape:
    """How one of OpenAI's APIs spells, in its request body, what a reply is built from; errors name
    these places.

    Attributes:
        prompt: the field holding the history (``messages``; the Responses API's ``input``).
        format: the reply format's field (``response_format``; ``text.format``).
        flat: a tool is ``tools[k]`` itself and the format holds its ``schema`` beside its ``type``
            (the Responses API); else a tool is ``tools[k].function`` and the schema is under
            ``json_schema`` (chat completions).
    """

    prompt: str
    format: str
    flat: bool

    def tool(self, k: int) -> str:
        """The place of tool ``k``'s function schema (``name``, ``parameters``, ``strict``)."""
        return f"tools[{k}]" if self.flat else f"tools[{k}].function"

    @property
    def schema(self) -> str:
        """The place of the format's JSON schema."""
        return f"{self.format}.schema" if self.flat else f"{self.format}.json_schema.schema"

    @property
    def tool_spelling(self) -> str:
        """A function tool as this API spells it (for messages)."""
        return ('{"type": "function", "name": ..., "parameters": {...}}' if self.flat
                else '{"type": "function", "function": {"name": ..., "parameters": {...}}}')

    @property
    def choice_spelling(self) -> str:
        """A ``tool_choice`` naming a tool as this API spells it (for messages)."""
        return '{"type": "function", "name": ...}' if self.flat else '{"type": "function", "function": {"name": ...}}'


CHAT = Shape("messages", "response_format", flat=False)  #: ``POST /v1/chat/completions``
RESPONSES = Shape("input", "text.format", flat=True)  #: ``POST /v1/responses``


def body_path(path: str, shape: Shape = CHAT) -> str:
    """A :class:`~codechat.engine.grammar.GrammarError` path (``$.tools[2].parameters.properties.x``,
    ``$.response_format.json_schema.schema.x``: chat's spelling) as the place in the request body
    (``tools[2].function.parameters.properties.x``; ``tools[2].parameters.properties.x`` in
    :data:`RESPONSES`)."""
    path = path.removeprefix("$").lstrip(".")
    path = re.sub(r"^tools\[(\d+)\]\.parameters", lambda m: f"{shape.tool(int(m[1]))}.parameters", path)
    return re.sub(r"^response_format\.json_schema\.schema", shape.schema, path)


def reply_grammar(grammars: Grammars, tools: Sequence[Mapping[str, Any]], choice: str | Mapping[str, Any],
                  strict: Collection[str], response_format: Mapping[str, Any] | None, shape: Shape = CHAT
                  ) -> Grammar | None:
    """The grammar of the reply (module docstring), or None when it is free.

    Args:
        grammars: the server's compiler.
        tools: the declared tools, ``{"name", "description"?, "parameters"?}`` each.
        choice: ``none``, ``auto``, ``required`` or the named tool's entry of ``tools``.
        strict: the names of the tools with ``"strict": true`` (any constrains ``auto``; their schemas
            must be honoured, :func:`codechat.chat.strict.arguments_schema`).
        response_format: the checked ``response_format`` of type ``json_object`` or ``json_schema``
            (chat's spelling, whatever the API); None for text.
        shape: the API whose body errors name places in.

    Raises:
        APIError: 400 for a response format beside tools (``param`` the format's field), a schema that
            does not compile (``param`` its place in the body), or no llguidance.
    """
    fmt = response_format
    if fmt is not None and choice != "none":
        name = choice["name"] if isinstance(choice, Mapping) else choice
        raise bad(shape.format, f"{fmt['type']!r} with tools (tool_choice {name!r}) is not supported: a reply "
                                "follows either the tools' grammar or the response format; send tool_choice "
                                "\"none\" to answer in the format", "unsupported_parameter")
    try:
        if fmt is not None:
            return response_format_grammar(grammars.compiler(shape.format), fmt)
        if isinstance(choice, Mapping):  # the one tool alone ("required" of it: its name may be "auto")
            k = next(i for i, t in enumerate(tools) if t["name"] == choice["name"])
            try:
                return tool_grammar(grammars.compiler("tool_choice"), [choice], "required", strict)
            except GrammarError as e:
                raise GrammarError(e.message, e.path.replace("$.tools[0]", f"$.tools[{k}]", 1), e.keyword) from None
        if choice == "required" or (choice == "auto" and strict):
            return tool_grammar(grammars.compiler("tool_choice" if choice == "required" else "tools"), tools,
                                choice, strict)
    except GrammarError as e:
        kw = f" (keyword {e.keyword!r})" if e.keyword else ""
        raise bad(body_path(e.path, shape), f"cannot be honoured as a constraint{kw}: {e.message}") from None
    return None


__all__ = ["CHAT", "RESPONSES", "Grammars", "Shape", "body_path", "reply_grammar"]
