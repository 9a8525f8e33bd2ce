"""Strict function calling in codechat's reply layout: the grammars behind ``tool_choice`` and strict tools.

An assistant reply is ``TEXT <|function_call|> CALL`` or ``TEXT`` alone, then ``<|end|>``
(:mod:`codechat.chat.conversation`); ``CALL`` is ``{"name": NAME, "arguments": {...}}`` in
``json.dumps``' layout (:func:`codechat.chat.calls.format_call`). :func:`tool_grammar` builds the
constraint for OpenAI's choices:

- ``required``: the reply is one call (no text) to one of the tools, its ``arguments`` valid under
  that tool's ``parameters`` schema;
- a tool's name: the same, to that tool only;
- ``auto``: text, then optionally such a call — constrained only with strict tools (OpenAI's
  ``strict: true``); otherwise the reply is free (None) and a call is read out of it as written;
- ``none``: no call and no constraint (None); the caller leaves the tools undeclared.

Under a constraint a call always parses and validates: the engine masks every token the grammar
forbids (:mod:`codechat.engine.grammar`).
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from codechat.chat.calls import FUNCTION_CALL_TOKEN, TOOL_CHOICES
from codechat.engine.grammar import Grammar, GrammarCompiler, GrammarError, json_rule


def call_schema(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The JSON schema of a call to one of ``tools`` (each ``{"name", "parameters"?}``; a tool
    without ``parameters`` takes any object): ``{"name": const, "arguments": parameters}``, one
    ``anyOf`` branch per tool, keys in that order."""
    return {"anyOf": [{"type": "object", "properties": {"name": {"const": t["name"]},
                                                        "arguments": dict(t.get("parameters") or {"type": "object"})},
                       "required": ["name", "arguments"], "additionalProperties": False} for t in tools]}


def tool_grammar(gc: GrammarCompiler, tools: Sequence[Mapping[str, Any]], choice: str = "required",
                 strict: bool = True) -> Grammar | None:
    """The constraint of a reply under ``tool_choice`` ``choice`` (module docstring); None when the reply is free.

    Args:
        gc: the compiler of the model's tokenizer.
        tools: the declared tools, ``{"name", "description"?, "parameters"?}`` each.
        choice: ``auto``, ``required``, ``none`` or a tool's name.
        strict: whether ``auto`` constrains calls (``required`` and a named tool always do).

    Raises:
        GrammarError: ``choice`` names no declared tool, no tools are declared for ``required`` / a
            name, or a tool's ``parameters`` cannot be compiled (``path`` starts at
            ``$.tools[i].parameters``).
    """
    if choice == "none" or (choice == "auto" and not strict) or (choice == "auto" and not tools):
        return None
    names = [t["name"] for t in tools]
    if choice not in TOOL_CHOICES:
        if choice not in names:
            raise GrammarError(f"tool_choice names {choice!r}, which is not among the tools ({', '.join(names) or 'none'})",
                               "$.tool_choice")
        tools = [t for t in tools if t["name"] == choice]
    elif not tools:
        raise GrammarError(f"tool_choice {choice!r} needs at least one tool", "$.tool_choice")
    for i, t in enumerate(tools):  # compile each alone first: an error then names its tool
        try:
            gc.json_schema(dict(t.get("parameters") or {"type": "object"}))
        except GrammarError as e:
            where = names.index(t["name"])
            raise e.under(f"$.tools[{where}].parameters") from None
    fc = gc.tok.special_id(FUNCTION_CALL_TOKEN)
    call = f"<[{fc}]> {json_rule(call_schema(tools))}"
    if choice == "auto":
        return gc.lark(f"start: TEXT | TEXT {call}\nTEXT: /(?s:.*)/\n")
    return gc.lark(f"start: {call}\n")


def response_format_grammar(gc: GrammarCompiler, response_format: Mapping[str, Any] | None) -> Grammar | None:
    """The constraint of OpenAI's ``response_format``: ``{"type": "text"}`` (or None) none;
    ``{"type": "json_object"}`` a JSON object; ``{"type": "json_schema", "json_schema": {"schema": ...}}``
    JSON valid under the schema.

    Raises:
        GrammarError: another type, a ``json_schema`` without a ``schema`` object, or a schema that
            does not compile (``path`` starts at ``$.response_format.json_schema.schema``).
    """
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return gc.json_schema({"type": "object"})
    if kind != "json_schema":
        raise GrammarError(f"response_format type must be text, json_object or json_schema, got {json.dumps(kind)}",
                           "$.response_format.type")
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, Mapping) else None
    if not isinstance(schema, Mapping):
        raise GrammarError("response_format json_schema needs {\"name\": ..., \"schema\": {...}} with a schema object",
                           "$.response_format.json_schema.schema")
    try:
        return gc.json_schema(schema)
    except GrammarError as e:
        raise e.under("$.response_format.json_schema.schema") from None
