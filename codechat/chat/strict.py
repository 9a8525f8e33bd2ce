"""Strict function calling in codechat's reply layout: the grammars behind ``tool_choice``, strict tools
and ``response_format``, and the rules their schemas follow.

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
forbids (:mod:`codechat.engine.grammar`); a reply cut by ``max_tokens`` first ends ``length``.

Closed objects
--------------
Wherever codechat holds output to a schema — a tool's ``arguments`` under ``tool_choice`` ``required``
or a name or with ``strict``, ``response_format`` ``json_schema`` (``strict`` or not), ``codechat
funcall --strict`` and ``codechat eval --strict`` — the schema is first rewritten by
:func:`closed_schema`: every object schema that says nothing of extra keys gets
``"additionalProperties": false``. JSON Schema (and llguidance, which follows it) reads an unset
``additionalProperties`` as *open*: a small model then writes unknown and repeated keys until
``max_tokens`` (``{"a": 0, "f": 0.0, "f": 0.0, …``), and the call never parses. Closed, an object
admits its declared properties only, each at most once, in the declared order.

=================================== ============================================ =================================
                                    OpenAI (``strict: true``)                     codechat
=================================== ============================================ =================================
``additionalProperties`` unset       refused: must be ``false`` on every object   set to ``false`` (closed)
``additionalProperties: true`` / a   refused                                      kept: the object stays open
schema                                                                            (keys may then repeat)
optional properties                  refused: every property in ``required``,     kept optional: the model may
                                     optional ones typed as a union with null     leave them out
schema without ``strict``            not constrained (``auto``)                   closed too under ``required``
                                                                                  or a name; never refused
``json_object``                      any JSON object                              the same (open: JSON's rules)
=================================== ============================================ =================================

codechat keeps optional properties optional rather than copying OpenAI's everything-required rule:
a derived tool's defaults (``unit: str = "c"``) then stay the function's, "left out" stays
different from ``null`` for :class:`codechat.tools.Dispatcher`, and a client's schema is compiled
as its author wrote it. The closing goes through ``properties``, ``patternProperties``, ``items``,
``prefixItems``, an ``additionalProperties`` schema, ``anyOf`` / ``oneOf`` branches and ``$defs`` /
``definitions``; it leaves ``allOf`` branches (and an object with ``allOf``) as written, since a
closed branch would forbid its siblings' properties, and ``not`` / ``if`` / ``then`` / ``else``.
Derived schemas (:mod:`codechat.tools.derive`) are closed already; a bare ``dict`` parameter is
derived as an explicitly open object.

A strict tool's or ``response_format``'s schema that cannot be honoured is a :class:`GrammarError`
naming its path (one line in the CLI, a 400 naming the body field in the server): one the grammar
library cannot compile, or an object that ``required``-s a property it does not declare. A tool
without ``strict`` is never refused for its schema: held to its schema as written when the closed
one cannot be honoured, else to any JSON object.
"""
from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from codechat.chat.calls import FUNCTION_CALL_TOKEN, TOOL_CHOICES
from codechat.engine.grammar import Grammar, GrammarCompiler, GrammarError, json_rule


#: Keywords that decide what an object does with keys it does not declare: a schema with either is
#: left as its author wrote it.
_EXTRA_KEYS = ("additionalProperties", "unevaluatedProperties")


def _is_object(s: Mapping[str, Any]) -> bool:
    t = s.get("type")
    if t is not None:
        return t == "object" or (isinstance(t, list) and "object" in t)
    return any(k in s for k in ("properties", "required", "patternProperties"))


def closed_schema(schema: Any, path: str = "$") -> Any:
    """``schema`` with every object that says nothing of extra keys closed (``"additionalProperties":
    false``), recursively (module docstring, "Closed objects"); a new schema, ``schema`` unchanged.

    Raises:
        GrammarError: an object to close ``required``-s a property that its ``properties`` do not
            declare (``path`` names its ``required``): closed, it could never be satisfied.
    """
    if not isinstance(schema, Mapping):
        return schema
    s = dict(schema)
    for key in ("properties", "patternProperties", "$defs", "definitions"):
        if isinstance(s.get(key), Mapping):
            s[key] = {n: closed_schema(v, f"{path}.{key}.{n}") for n, v in s[key].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(s.get(key), Mapping):
            s[key] = closed_schema(s[key], f"{path}.{key}")
    for key in ("prefixItems", "anyOf", "oneOf"):
        if isinstance(s.get(key), list):
            s[key] = [closed_schema(v, f"{path}.{key}[{i}]") for i, v in enumerate(s[key])]
    if _is_object(s) and "allOf" not in s and not any(k in s for k in _EXTRA_KEYS):
        declared = s.get("properties") if isinstance(s.get("properties"), Mapping) else {}
        missing = [r for r in s.get("required") or () if r not in declared]
        if missing and "patternProperties" not in s:
            raise GrammarError(f"required {', '.join(map(repr, missing))} is not among the object's properties: "
                               "closed (additionalProperties false, codechat's rule for strict output) it could never "
                               "be satisfied; declare it in properties or open the object with additionalProperties",
                               f"{path}.required", "required")
        s["additionalProperties"] = False
    return s


#: The arguments of a tool declared without ``parameters``: none (OpenAI's reading of a missing schema).
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}


def arguments_schema(gc: GrammarCompiler, tool: Mapping[str, Any], strict: bool, where: str = "$") -> dict[str, Any]:
    """The schema a call's ``arguments`` to ``tool`` are held to: its ``parameters`` closed
    (:func:`closed_schema`), compiled once alone so that an error names the tool.

    Args:
        gc: the compiler of the model's tokenizer.
        tool: ``{"name", "parameters"?}``.
        strict: whether a schema that cannot be honoured is refused (a strict tool); a tool without
            ``strict`` falls back to its schema as written, then to any JSON object.
        where: the path of ``tool["parameters"]`` in the caller's document (``$.tools[2].parameters``).

    Raises:
        GrammarError: ``strict`` and the closed schema cannot be honoured (``path`` under ``where``).
    """
    given = dict(tool.get("parameters") or NO_ARGUMENTS)
    try:
        closed = closed_schema(given)
        gc.json_schema(closed)
        return closed
    except GrammarError as e:
        if strict:
            raise e.under(where) from None
    for fallback in (given, {"type": "object"}):
        try:
            gc.json_schema(fallback)
            return fallback
        except GrammarError:
            continue
    raise AssertionError("unreachable: any JSON object compiles")


def call_schema(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The JSON schema of a call to one of ``tools`` (each ``{"name", "parameters"?}``, the
    ``parameters`` used as given; a tool without them takes no arguments):
    ``{"name": const, "arguments": parameters}``, one ``anyOf`` branch per tool, keys in that order."""
    return {"anyOf": [{"type": "object", "properties": {"name": {"const": t["name"]},
                                                        "arguments": dict(t.get("parameters") or NO_ARGUMENTS)},
                       "required": ["name", "arguments"], "additionalProperties": False} for t in tools]}


def tool_grammar(gc: GrammarCompiler, tools: Sequence[Mapping[str, Any]], choice: str = "required",
                 strict: bool | Collection[str] = True) -> Grammar | None:
    """The constraint of a reply under ``tool_choice`` ``choice`` (module docstring); None when the reply is free.

    Every tool's arguments are held to its closed schema (:func:`arguments_schema`).

    Args:
        gc: the compiler of the model's tokenizer.
        tools: the declared tools, ``{"name", "description"?, "parameters"?}`` each.
        choice: ``auto``, ``required``, ``none`` or a tool's name.
        strict: which tools are strict: True (all), False (none) or their names. ``auto`` is
            constrained when any is; a strict tool's schema that cannot be honoured is refused.

    Raises:
        GrammarError: ``choice`` names no declared tool, no tools are declared for ``required`` / a
            name, or a strict tool's ``parameters`` cannot be honoured (``path`` starts at
            ``$.tools[i].parameters``).
    """
    names = [t["name"] for t in tools]
    strict_names = set(names) if strict is True else set() if strict is False else set(strict)
    if choice == "none" or (choice == "auto" and not (strict_names & set(names))):
        return None
    if choice not in TOOL_CHOICES:
        if choice not in names:
            raise GrammarError(f"tool_choice names {choice!r}, which is not among the tools ({', '.join(names) or 'none'})",
                               "$.tool_choice")
        tools = [t for t in tools if t["name"] == choice]
    elif not tools:
        raise GrammarError(f"tool_choice {choice!r} needs at least one tool", "$.tool_choice")
    held = [{"name": t["name"], "parameters": arguments_schema(gc, t, t["name"] in strict_names,
                                                               f"$.tools[{names.index(t['name'])}].parameters")}
            for t in tools]
    fc = gc.tok.special_id(FUNCTION_CALL_TOKEN)
    call = f"<[{fc}]> {json_rule(call_schema(held))}"
    if choice == "auto":
        return gc.lark(f"start: TEXT | TEXT {call}\nTEXT: /(?s:.*)/\n")
    return gc.lark(f"start: {call}\n")


def response_format_grammar(gc: GrammarCompiler, response_format: Mapping[str, Any] | None) -> Grammar | None:
    """The constraint of OpenAI's ``response_format``: ``{"type": "text"}`` (or None) none;
    ``{"type": "json_object"}`` a JSON object (open: JSON's own rules); ``{"type": "json_schema",
    "json_schema": {"schema": ...}}`` JSON valid under the schema closed (:func:`closed_schema`),
    ``strict`` or not.

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
        return gc.json_schema(closed_schema(schema))
    except GrammarError as e:
        raise e.under("$.response_format.json_schema.schema") from None
