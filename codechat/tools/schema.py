"""Tool schemas: what a model may call, and whether a call's arguments fit.

A tool is an OpenAI-style function schema — ``name``, ``description`` and JSON-Schema
``parameters`` (an ``object`` schema) — plus, when it can run here, the Python callable that
executes it. Tools come from three places, and every one is checked when it is *declared*
(a broken schema is a :class:`ToolError` at load, never a surprise at the first call).

What lives where (imports point one way: :mod:`.normalize` <- this module <- :mod:`.derive`
<- :mod:`.executors`):

- this module: :class:`Tool`, :class:`ToolError`, :func:`tools_by_name` (two tools of one name,
  from whichever sources, are an error naming both), :func:`check_name`, :func:`check_schema` (the
  one check behind every source: JSON Schema Draft 2020-12, an object), :func:`validate_arguments`
  (does a call's arguments object fit), and :func:`tool_from_schema`: schemas from data or from a
  user's JSON (OpenAI's ``{"type": "function", "function": {...}}`` wrapper accepted), after
  :func:`~.normalize.normalize_schema` has repaired the usual sloppiness of schemas in the wild
  and said what it repaired;
- :mod:`.normalize`: :func:`~.normalize.normalize_schema` and its repairs (re-exported here);
- :mod:`.derive`: schemas from Python functions: :func:`~.derive.tool_from_function` derives the
  schema from the signature, the type hints (the mapping is in that module's docstring) and the
  docstring (:func:`~.derive.parse_docstring`); the :func:`~.derive.tool` decorator overrides the
  name or description or gives an explicit schema;
- :mod:`.executors`: :func:`~.executors.load_executors` turns an executors file into tools
  (:func:`~.executors.load_callables`: its callables, to bind schemas declared elsewhere).

The layout of tools in the system turn is not defined here: it is
:func:`codechat.chat.conversation.system_text` (``TOOLS_HEADER`` then one ``json.dumps(schema)`` per line),
used by SFT rendering and by every prompt built from a :class:`~codechat.chat.conversation.Conversation`; put
``[t.schema() for t in tools]`` into ``Conversation(tools=...)``.
"""
from __future__ import annotations

import copy
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from codechat.chat.conversation import normalize_tool

from .normalize import normalize_schema


class ToolError(ValueError):
    """A tool that cannot be declared: the message names the file and function (or schema)."""


@dataclass(frozen=True)
class Tool:
    """One callable function.

    Attributes:
        name: the name the model calls it by.
        description: what it does (shown to the model).
        parameters: JSON Schema of the arguments object (``{"type": "object", "properties": ...}``).
        fn: the Python callable that executes it (None for a schema known only from data).
        source: where it was declared (``file.py:function``, ``builtin``, a data file), for errors.
        changes: what :func:`normalize_schema` repaired in the declared schema (empty when it was clean).
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    fn: Callable[..., Any] | None = None
    source: str = ""
    changes: tuple[str, ...] = ()

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema ``{"name", "description", "parameters"}``."""
        return {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}


def validate_arguments(tool: Tool, arguments: Mapping[str, Any]) -> str | None:
    """None when ``arguments`` fit ``tool.parameters``; else one line saying what is wrong and where
    (the JSON path of the first error, e.g. ``calories: [300, 200] is not of type 'number'``)."""
    validator = jsonschema.Draft202012Validator(dict(tool.parameters))
    errors = sorted(validator.iter_errors(dict(arguments)), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    e = errors[0]
    where = ".".join(str(p) for p in e.absolute_path) or "arguments"
    return f"{where}: {e.message}"


# ----------------------------------------------------------------------------- checking
#: Tool names the model may call: OpenAI's ``^[a-zA-Z0-9_-]{1,64}$``, plus ``.`` (namespaced tools).
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def check_name(name: Any, where: str) -> str:
    """``name`` when it is a tool name the model can call (:data:`NAME_PATTERN`).

    Raises:
        ToolError: not a string, empty, too long (> 64) or with characters outside ``[A-Za-z0-9_.-]``.
    """
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ToolError(f"{where}: tool name {name!r} must be 1-64 characters of A-Z a-z 0-9 _ . -")
    return name


def tools_by_name(tools: Iterable[Tool], where: str = "") -> dict[str, Tool]:
    """``{name: tool}`` of ``tools``, in order: the one place tools from several sources are keyed.

    Args:
        where: what an error starts with (an executors file), if anything.

    Raises:
        ToolError: two tools of one name, naming both sources (``Tool.source``).
    """
    out: dict[str, Tool] = {}
    for t in tools:
        if t.name in out:
            raise ToolError(f"{where + ': ' if where else ''}two tools named {t.name!r} "
                            f"({out[t.name].source or 'no source'} and {t.source or 'no source'})")
        out[t.name] = t
    return out


def check_schema(parameters: Any, where: str) -> dict[str, Any]:
    """A deep copy of ``parameters`` when it is a valid arguments schema; else :class:`ToolError`.

    Valid means: a JSON Schema (Draft 2020-12 meta-schema, ``jsonschema.Draft202012Validator.check_schema``)
    whose top level is ``"type": "object"``, with every ``required`` name among its ``properties``.
    The check is strict (``"type": "dict"`` fails); when :func:`normalize_schema` would repair the
    schema the message says so.

    Args:
        parameters: the ``parameters`` of one tool (not the whole tool schema).
        where: what to name in the error (``file.py:function``, ``data.json: tools[3]``).

    Raises:
        ToolError: one line naming ``where`` and what is wrong (with its JSON path).
    """
    problem = _schema_problem(parameters)
    if problem is None:
        return copy.deepcopy(dict(parameters))
    hint = ""
    if isinstance(parameters, Mapping) and {"name", "parameters"} <= set(parameters):
        hint = " (this looks like a whole tool schema: pass its 'parameters')"
    else:
        fixed, changes = normalize_schema(parameters)
        if changes and _schema_problem(fixed) is None:
            more = f" and {len(changes) - 1} more" if len(changes) > 1 else ""
            hint = f" (normalize_schema would repair it: {changes[0]}{more})"
    raise ToolError(f"{where}: {problem}{hint}")


def _schema_problem(parameters: Any) -> str | None:
    """What makes ``parameters`` an invalid arguments schema, in one line; None when it is valid."""
    if not isinstance(parameters, Mapping):
        return f"parameters must be a JSON Schema object, got {type(parameters).__name__}"
    try:
        jsonschema.Draft202012Validator.check_schema(dict(parameters))
    except jsonschema.SchemaError as e:
        path = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in e.absolute_path)
        return f"parameters{path} is not valid JSON Schema: {_one_line(e.message)}"
    if parameters.get("type") != "object":
        return f"parameters must be an object schema (\"type\": \"object\"), got type {parameters.get('type')!r}"
    missing = [r for r in parameters.get("required", []) if r not in parameters.get("properties", {})]
    if missing:
        return f"parameters: required {missing} not among the properties"
    return None


def _check_signature(fn: Callable[..., Any], parameters: Mapping[str, Any], where: str) -> None:
    """A call that fits ``parameters`` must bind to ``fn``: every property is a keyword it takes, and
    every parameter without a default is required.

    Raises:
        ToolError: a property ``fn`` does not take, or a parameter ``fn`` needs that may be left out.
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise ToolError(f"{where}: cannot read the signature ({_one_line(e)})") from None
    params = sig.parameters.values()
    by_keyword = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in params)
    props, required = parameters.get("properties", {}), set(parameters.get("required", []))
    for name in props:
        if name not in by_keyword and not takes_kwargs:
            raise ToolError(f"{where}: schema property '{name}' is not a parameter of the function")
    for p in params:
        if p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.kind == p.POSITIONAL_ONLY:
            raise ToolError(f"{where}: parameter '{p.name}' is positional-only; a call passes arguments by name")
        if p.name not in required:
            raise ToolError(f"{where}: parameter '{p.name}' has no default but the schema does not require it")


# ----------------------------------------------------------------------------- schemas from data
def tool_from_schema(schema: Mapping[str, Any], where: str, *, fn: Callable[..., Any] | None = None,
                     normalize: bool = True) -> Tool:
    """The :class:`Tool` of a function schema from data or JSON (``{"name", "description", "parameters"}``).

    OpenAI's ``{"type": "function", "function": {...}}`` wrapper is removed
    (:func:`codechat.chat.conversation.normalize_tool`). Missing ``parameters`` means no arguments. With
    ``normalize`` (default) the parameters go through :func:`normalize_schema` first and
    ``Tool.changes`` lists what was repaired; then :func:`check_schema`. Keys other than name,
    description and parameters are not kept.

    Args:
        schema: one tool schema.
        where: what errors name (``tools.json: tools[2]``).
        fn: the callable that executes it; when given, the schema must fit its signature.
        normalize: repair sloppy schemas (False: strict, as the :func:`~.derive.tool` decorator).

    Raises:
        ToolError: not a tool schema, an invalid name, a non-string description, parameters that
            are not a valid object schema, or a schema that does not fit ``fn``'s signature.
    """
    try:
        d = normalize_tool(schema)
    except ValueError as e:
        raise ToolError(f"{where}: {e}") from None
    name = check_name(d["name"], f"{where} ({d['name']!r})" if isinstance(d["name"], str) else where)
    where = f"{where} ({name})"
    description = d.get("description") or ""
    if not isinstance(description, str):
        raise ToolError(f"{where}: description must be a string, got {type(description).__name__}")
    changes: list[str] = []
    params = d.get("parameters")
    if params is None:
        params = copy.deepcopy(_EMPTY_PARAMETERS)
        changes.append("parameters: missing: no arguments")
    if normalize:
        params, more = normalize_schema(params)
        changes += more
    params = check_schema(params, where)
    if fn is not None:
        _check_signature(fn, params, where)
    return Tool(name, description, params, fn, where, tuple(changes))


__all__ = ["Tool", "ToolError", "NAME_PATTERN", "validate_arguments", "tools_by_name", "check_name", "check_schema",
           "normalize_schema", "tool_from_schema"]
