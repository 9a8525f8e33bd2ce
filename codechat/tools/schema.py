"""Tool schemas: what a model may call, and whether a call's arguments fit.

A tool is an OpenAI-style function schema — ``name``, ``description`` and JSON-Schema
``parameters`` (an ``object`` schema) — plus, when it can run here, the Python callable that
executes it. Tools come from three places, and every one is checked when it is *declared*
(a broken schema is a :class:`ToolError` at load, never a surprise at the first call):

- Python functions: :func:`tool_from_function` derives the schema from the signature, the type
  hints and the docstring; the :func:`tool` decorator overrides the name or description or gives
  an explicit schema; :func:`load_executors` turns an executors file into tools.
- Schemas from data or from a user's JSON: :func:`tool_from_schema` (OpenAI's
  ``{"type": "function", "function": {...}}`` wrapper accepted), after :func:`normalize_schema`
  has repaired the usual sloppiness of schemas in the wild and said what it repaired.
- :func:`check_schema`: the one check behind all of them (JSON Schema Draft 2020-12, an object).

Type hints -> JSON Schema (:func:`tool_from_function`):

=============================== ==============================================================
hint                            schema
=============================== ==============================================================
``str`` ``int`` ``float``       ``{"type": "string"}`` ``"integer"`` ``"number"``
``bool``                        ``{"type": "boolean"}``
``list`` / ``list[X]``          ``{"type": "array"}`` / ``{"type": "array", "items": X}``
``dict`` / ``dict[str, X]``     ``{"type": "object"}`` / ``{..., "additionalProperties": X}``
``Literal["a", "b"]``           ``{"type": "string", "enum": ["a", "b"]}``
``X | None``, ``Optional[X]``   X with ``"null"`` added to its type; *not required*
``X | Y``                       ``{"type": [X, Y]}`` (simple types) or ``{"anyOf": [X, Y]}``
``Any``                         ``{}`` (any JSON value)
``Annotated[X, "text"]``        X, with ``"text"`` as its description (wins over the docstring)
a default                       not required; ``"default"`` recorded when it is JSON
=============================== ==============================================================

Anything else — a class of your own, an ``Enum``, ``tuple``, ``dict[int, X]``, ``*args``,
``**kwargs``, a positional-only parameter, a parameter *without an annotation* — is a
:class:`ToolError` naming the file, the function and the parameter (a missing annotation is an
error, not a silent ``string``: the model would be told the wrong type). Give such a function an
explicit schema with ``@tool(parameters=...)``.

The layout of tools in the system turn is not defined here: it is
:func:`codechat.chat.system_text` (``TOOLS_HEADER`` then one ``json.dumps(schema)`` per line),
used by SFT rendering and by every prompt built from a :class:`~codechat.chat.Conversation`; put
``[t.schema() for t in tools]`` into ``Conversation(tools=...)``.
"""
from __future__ import annotations

import copy
import functools
import importlib.machinery
import importlib.util
import inspect
import itertools
import json
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jsonschema

from codechat.chat import normalize_tool


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


# ----------------------------------------------------------------------------- normalisation
_TYPE_ALIASES: dict[str, str] = {
    **dict.fromkeys(["object", "dict", "map", "mapping", "obj", "hash", "hashmap", "struct"], "object"),
    **dict.fromkeys(["array", "list", "tuple", "set", "arr", "sequence"], "array"),
    **dict.fromkeys(["string", "str", "text", "char"], "string"),
    **dict.fromkeys(["integer", "int", "long", "int32", "int64"], "integer"),
    **dict.fromkeys(["number", "float", "double", "decimal", "num", "float32", "float64", "numeric"], "number"),
    **dict.fromkeys(["boolean", "bool"], "boolean"),
    **dict.fromkeys(["null", "none", "nil", "nonetype"], "null"),
}
#: Type names that mean "any JSON value": the ``type`` is dropped.
_ANY_TYPES = frozenset({"any", "mixed"})
_CANONICAL = frozenset(_TYPE_ALIASES.values())
#: Type names that are string formats.
_FORMAT_TYPES: dict[str, str] = {"date": "date", "datetime": "date-time", "date-time": "date-time", "time": "time",
                                 "email": "email", "uri": "uri", "url": "uri"}
#: Keywords whose presence at the top level means "a schema", not the xlam map of properties.
_SCHEMA_KEYS = frozenset({"type", "properties", "required", "$schema", "$ref", "$defs", "definitions", "anyOf",
                          "oneOf", "allOf", "not", "items", "prefixItems", "enum", "const", "additionalProperties",
                          "patternProperties", "title", "description", "default", "examples"})
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("not", "contains", "if", "then", "else", "propertyNames", "unevaluatedItems")
_SUBSCHEMA_MAPS = ("patternProperties", "$defs", "definitions", "dependentSchemas")


def normalize_schema(parameters: Any) -> tuple[Any, list[str]]:
    """Repair a sloppy arguments schema: ``(fixed copy, what was repaired)``; the input is not changed.

    Repairs, at every level (``properties``, ``items``, ``anyOf`` ... recursively):

    - type aliases, any case: ``dict``/``map`` -> ``object``, ``list``/``tuple`` -> ``array``,
      ``str`` -> ``string``, ``int`` -> ``integer``, ``float``/``double`` -> ``number``,
      ``bool`` -> ``boolean``, ``none`` -> ``null``; ``any`` drops the type;
    - Python type strings: ``List[int]`` -> array of integer, ``Dict[str, X]``, ``Optional[X]``
      (nullable, not required), ``Union[A, B]``, ``"str, optional"`` (not required);
    - ``"required": true`` / ``"optional": false`` inside a property -> the name goes into the
      object's ``required`` list (``required: false`` / ``optional: true`` are dropped);
    - ``required`` as one string, with duplicates, or naming a missing property (added as ``{}``);
    - ``properties`` as a list of ``{"name": ..., ...}``, ``null``, or a property written as a bare
      type name (``"x": "string"``); OpenAPI ``"nullable": true``; ``items`` as a list
      (-> ``prefixItems``) or a type name; a scalar ``enum`` -> a one-value list;

    and at the top level: no ``type`` -> ``object``; no ``properties`` -> ``{}``; a mapping of
    property schemas without ``type``/``properties`` (the xlam layout) -> those are the properties,
    required unless they have a ``default`` or are marked optional.

    Nested ``{"type": "object"}`` without properties is a valid free-form object and is kept.
    Anything it cannot repair is left for :func:`check_schema` to report. Normalising twice
    changes nothing the second time; schemas from :func:`tool_from_function` need no repair.

    Args:
        parameters: a tool's ``parameters`` (any JSON value; a non-object is returned unchanged).

    Returns:
        ``(schema, changes)``: one line per repair, ``"<json path>: <what>"``, e.g.
        ``"parameters.properties.unit: type 'str' -> 'string'"``; ``len(changes)`` counts them.
    """
    changes: list[str] = []
    if not isinstance(parameters, Mapping):
        return parameters, changes
    s = copy.deepcopy(dict(parameters))
    if s and not set(s) & _SCHEMA_KEYS and all(isinstance(v, Mapping) for v in s.values()):
        s = {"type": "object", "properties": s}
        changes.append("parameters: no 'type' and no 'properties': its keys are the properties (xlam layout)")
        s, _ = _normalize_node(s, "parameters", changes, context="root", infer_required=True)
    else:
        s, _ = _normalize_node(s, "parameters", changes, context="root")
    if "type" not in s and not set(s) & {"anyOf", "oneOf", "allOf", "$ref"}:
        s = {"type": "object", **s}
        changes.append("parameters: no 'type': 'object'")
    if s.get("type") == "object" and "properties" not in s:
        s["properties"] = {}
        changes.append("parameters: no 'properties': {}")
        _normalize_object(s, "parameters", changes, False)  # a required name now gets its property
    return s, changes


def _normalize_node(s: Any, path: str, changes: list[str], *, context: str = "other",
                    infer_required: bool = False) -> tuple[Any, bool | None]:
    """One schema node repaired in place (recursively): ``(node, required)``.

    ``context`` is ``"property"`` (a value of ``properties``), ``"root"`` or ``"other"``.
    ``required`` is what a property said about itself (``required: true``, ``"str, optional"``)
    for its object's ``required`` list: True, False, or None when it said nothing.
    """
    if isinstance(s, str):  # a schema written as a bare type name
        node, req = _type_from_string(s)
        if node is None:
            return s, None
        changes.append(f"{path}: bare type name {s!r} -> {json.dumps(node)}")
        return node, req
    if not isinstance(s, dict):
        return s, None
    required: bool | None = None
    for key, means_required in (("required", True), ("optional", False)):
        if isinstance(s.get(key), bool):
            flag = s.pop(key)
            if context == "property":
                required = flag if means_required else not flag
                changes.append(f"{path}: '{key}: {json.dumps(flag)}' inside the property"
                               + (" -> in the object's required list" if required else " dropped"))
            else:
                changes.append(f"{path}: '{key}: {json.dumps(flag)}' (a flag, not a list) dropped")
    if "type" in s:
        required = _normalize_type(s, path, changes, required)
    if "nullable" in s and isinstance(s["nullable"], bool):
        if s.pop("nullable"):
            _add_null(s)
            changes.append(f"{path}: 'nullable: true' -> 'null' added to the type")
        else:
            changes.append(f"{path}: 'nullable: false' dropped")
    if "enum" in s and not isinstance(s["enum"], list):
        changes.append(f"{path}: enum {s['enum']!r} is not a list: [{s['enum']!r}]")
        s["enum"] = [s["enum"]]
    if isinstance(s.get("items"), list):
        s["prefixItems"] = s.pop("items")
        changes.append(f"{path}: 'items' as a list -> 'prefixItems' (JSON Schema 2020-12)")
    if "items" in s:
        s["items"], _ = _normalize_node(s["items"], f"{path}.items", changes)
    if isinstance(s.get("additionalProperties"), (dict, str)):
        s["additionalProperties"], _ = _normalize_node(s["additionalProperties"], f"{path}.additionalProperties",
                                                       changes)
    for key in _SUBSCHEMA_LISTS:
        if isinstance(s.get(key), list):
            s[key] = [_normalize_node(v, f"{path}.{key}[{i}]", changes)[0] for i, v in enumerate(s[key])]
    for key in _SUBSCHEMA_ONE:
        if key in s:
            s[key], _ = _normalize_node(s[key], f"{path}.{key}", changes)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(s.get(key), dict):
            s[key] = {k: _normalize_node(v, f"{path}.{key}.{k}", changes)[0] for k, v in s[key].items()}
    if "properties" in s or "required" in s:
        _normalize_object(s, path, changes, infer_required)
    return s, required


def _normalize_type(s: dict[str, Any], path: str, changes: list[str], required: bool | None) -> bool | None:
    """Canonical ``s["type"]`` (aliases, Python type strings, ``any``); returns the updated ``required``."""
    t = s["type"]
    if isinstance(t, list):
        names = list(dict.fromkeys(_TYPE_ALIASES.get(x.strip().lower(), x) if isinstance(x, str) else x for x in t))
        if names != t:
            changes.append(f"{path}: type {t!r} -> {names!r}")
            s["type"] = names
        return required
    if not isinstance(t, str) or t in _CANONICAL:
        return required
    node, req = _type_from_string(t)
    if node is None:
        return required
    del s["type"]
    for k, v in node.items():  # what the node already says (its own items, format) wins
        s.setdefault(k, v)
    _reorder_first(s, list(node))
    shown = json.dumps(node) if node else "no type (any value)"
    changes.append(f"{path}: type {t!r} -> {shown}" + (" (not required)" if req is False else ""))
    return req if req is not None else required


def _reorder_first(s: dict[str, Any], first: Sequence[str]) -> None:
    """Move the keys ``first`` (those present) to the front of ``s``, in that order."""
    rest = {k: s.pop(k) for k in list(s) if k not in first}
    s.update({k: s.pop(k) for k in first if k in s})
    s.update(rest)


def _add_null(s: dict[str, Any]) -> None:
    """Let ``s`` also accept ``null`` (in place)."""
    t = s.get("type")
    if isinstance(t, str) and t != "null":
        s["type"] = [t, "null"]
    elif isinstance(t, list) and "null" not in t:
        s["type"] = [*t, "null"]
    if isinstance(s.get("enum"), list) and None not in s["enum"]:
        s["enum"] = [*s["enum"], None]
    if isinstance(s.get("anyOf"), list) and {"type": "null"} not in s["anyOf"]:
        s["anyOf"] = [*s["anyOf"], {"type": "null"}]


_OPTIONAL_SUFFIX = re.compile(r"^(.*?)\s*(?:,\s*optional|\(optional\)|\?)\s*$", re.IGNORECASE)


def _type_from_string(text: str) -> tuple[dict[str, Any] | None, bool | None]:
    """A schema for a sloppy type name (``int``, ``List[str]``, ``Optional[x]``, ``str, optional``);
    ``(None, None)`` when the text is not understood. The second value is False when the text said
    the parameter is optional."""
    t = text.strip()
    req: bool | None = None
    m = _OPTIONAL_SUFFIX.match(t)
    if m and m.group(1):
        t, req = m.group(1), False
    node = _parse_type_expr(t)
    return node, (req if node is not None else None)


def _split_args(inner: str) -> list[str]:
    """``"str, List[int]"`` -> ``["str", "List[int]"]`` (commas at bracket depth 0)."""
    out, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += (ch == "[") - (ch == "]")
        cur += ch
    out.append(cur.strip())
    return [x for x in out if x]


def _parse_type_expr(t: str) -> dict[str, Any] | None:
    """Schema of a Python-ish type expression (``int``, ``List[str]``, ``Optional[x]``, ``a or b``), or None."""
    t = t.strip()
    low = t.lower()
    if low in _TYPE_ALIASES:
        return {"type": _TYPE_ALIASES[low]}
    if low in _FORMAT_TYPES:
        return {"type": "string", "format": _FORMAT_TYPES[low]}
    if low in _ANY_TYPES:
        return {}
    if " or " in low:
        return _union([_parse_type_expr(x) for x in re.split(r"\s+or\s+", t, flags=re.IGNORECASE)])
    if "|" in t and "[" not in t:
        return _union([_parse_type_expr(x) for x in t.split("|")])
    m = re.fullmatch(r"([A-Za-z_.]+)\s*\[(.*)\]", t)
    if not m:
        return None
    head, args = m.group(1).split(".")[-1].lower(), _split_args(m.group(2))
    if head == "tuple" and len(args) == 2 and args[1] == "...":
        item = _parse_type_expr(args[0])
        return None if item is None else {"type": "array", "items": item}
    parsed = [_parse_type_expr(a) for a in args]
    if not parsed or any(p is None for p in parsed):
        return None
    if head in ("list", "sequence", "set", "array", "iterable") and len(parsed) == 1:
        return {"type": "array", "items": parsed[0]}
    if head == "tuple":
        return {"type": "array", "prefixItems": parsed, "minItems": len(parsed), "maxItems": len(parsed)}
    if head in ("dict", "mapping") and len(parsed) == 2 and parsed[0] == {"type": "string"}:
        return {"type": "object"} if parsed[1] == {} else {"type": "object", "additionalProperties": parsed[1]}
    if head == "optional" and len(parsed) == 1:
        node = dict(parsed[0])  # type: ignore[arg-type]
        _add_null(node)
        return node
    if head == "union":
        return _union(parsed)
    return None


def _union(parts: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """One schema accepting any of ``parts``: a type list when all are bare types, else ``anyOf``."""
    if any(p is None for p in parts):
        return None
    if any(p == {} for p in parts):
        return {}
    if all(set(p) == {"type"} for p in parts):
        names: list[str] = []
        for p in parts:
            for n in (p["type"] if isinstance(p["type"], list) else [p["type"]]):
                if n not in names:
                    names.append(n)
        return {"type": names[0] if len(names) == 1 else names}
    return {"anyOf": list(parts)}


def _normalize_object(s: dict[str, Any], path: str, changes: list[str], infer_required: bool) -> None:
    """Repair ``properties`` and ``required`` of an object node in place."""
    if "properties" in s and s["properties"] is None:
        s["properties"] = {}
        changes.append(f"{path}: 'properties: null' -> {{}}")
    props = s.get("properties")
    if isinstance(props, list) and all(isinstance(p, Mapping) and isinstance(p.get("name"), str) for p in props):
        s["properties"] = props = {p["name"]: {k: v for k, v in p.items() if k != "name"} for p in props}
        changes.append(f"{path}: 'properties' as a list of named schemas -> an object")
    req = s.get("required")
    if isinstance(req, str):
        s["required"] = req = [req]
        changes.append(f"{path}: 'required' as a string -> [{req[0]!r}]")
    elif "required" in s and not isinstance(req, list):
        changes.append(f"{path}: 'required: {json.dumps(s.pop('required'))}' on the object dropped")
        req = None
    if not isinstance(props, dict):
        return
    required = list(req) if isinstance(req, list) else []
    inferred: list[str] = []
    for name in list(props):
        props[name], flag = _normalize_node(props[name], f"{path}.properties.{name}", changes, context="property")
        if flag is None and infer_required and isinstance(props[name], dict) and "default" not in props[name]:
            inferred.append(name)
            flag = True
        if flag is True and name not in required:
            required.append(name)
    if inferred:
        changes.append(f"{path}: required inferred (no default, not optional): {inferred}")
    if all(isinstance(n, str) for n in required) and len(set(required)) != len(required):
        required = list(dict.fromkeys(required))
        changes.append(f"{path}: duplicate names in 'required' removed")
    for name in required:
        if isinstance(name, str) and name not in props:
            props[name] = {}
            changes.append(f"{path}: required '{name}' is not a property: added as {{}} (any value)")
    if required != (req if isinstance(req, list) else []):
        s["required"] = required


# ----------------------------------------------------------------------------- schemas from Python
_PRIMITIVES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean",
                               type(None): "null"}
_SUPPORTED = "str, int, float, bool, list[X], dict[str, X], Literal[...], X | None, Any"
#: Attribute the :func:`tool` decorator sets on a function: its checked :class:`Tool`.
TOOL_ATTR = "__codechat_tool__"


class _Unsupported(Exception):
    """A type hint without a JSON Schema (internal: becomes a ToolError naming the parameter)."""


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is not None:  # tuple[int, int], collections.abc.Sequence[str]
        return repr(tp).replace("typing.", "")
    return getattr(tp, "__qualname__", None) or getattr(tp, "__name__", None) or repr(tp)


def _hint_schema(tp: Any) -> tuple[dict[str, Any], str | None]:
    """``(schema, description from Annotated or None)`` of one type hint.

    Raises:
        _Unsupported: the hint has no JSON-Schema equivalent here.
    """
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        schema, desc = _hint_schema(args[0])
        texts = [a for a in args[1:] if isinstance(a, str)]
        return schema, (texts[0] if texts else desc)
    if tp is Any:
        return {}, None
    if isinstance(tp, type) and tp in _PRIMITIVES:
        return {"type": _PRIMITIVES[tp]}, None
    if tp is None:
        return {"type": "null"}, None
    if tp is list or origin is list:
        if len(args) > 1:
            raise _Unsupported(f"{_type_name(tp)} takes one item type")
        return ({"type": "array", "items": _hint_schema(args[0])[0]} if args else {"type": "array"}), None
    if tp is dict or origin is dict:
        if not args:
            return {"type": "object"}, None
        if args[0] is not str:
            raise _Unsupported(f"dict keys must be str (JSON object keys are strings), got {_type_name(args[0])}")
        value = _hint_schema(args[1])[0]
        return ({"type": "object"} if value == {} else {"type": "object", "additionalProperties": value}), None
    if origin is typing.Literal:
        kinds: list[str] = []
        for v in args:
            if type(v) not in _PRIMITIVES or isinstance(v, float):
                raise _Unsupported(f"Literal value {v!r} is not a JSON string, integer, boolean or null")
            if _PRIMITIVES[type(v)] not in kinds:
                kinds.append(_PRIMITIVES[type(v)])
        return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(args)}, None
    if origin is typing.Union or origin is types.UnionType:
        members = [a for a in args if a is not type(None)]
        schema = _union([_hint_schema(a)[0] for a in members]) if len(members) > 1 else _hint_schema(members[0])[0]
        assert schema is not None
        if len(members) < len(args):
            schema = dict(schema)
            _add_null(schema)
        return schema, None
    if isinstance(tp, str):
        raise _Unsupported(f"annotation {tp!r} is a string that is not a type")
    raise _Unsupported(f"type {_type_name(tp)} has no JSON Schema (supported: {_SUPPORTED}); "
                       "give the function an explicit schema with @tool(parameters=...)")


def _accepts_none(schema: Mapping[str, Any]) -> bool:
    t = schema.get("type")
    return schema == {} or t == "null" or (isinstance(t, list) and "null" in t)


def _target(fn: Any) -> Any:
    """What documents a callable: the function of a ``functools.partial``, the class of a callable object."""
    if isinstance(fn, functools.partial):
        return _target(fn.func)
    if inspect.isroutine(fn) or inspect.isclass(fn):
        return fn
    return type(fn)


def _doc_of(fn: Any) -> str | None:
    """The raw docstring of a callable (a callable object's ``__call__``, else its class).

    Raw, not :func:`inspect.getdoc`: that dedents the lines after the first by their common
    indent, which flattens a docstring that starts with its ``Args:`` line.
    """
    target = _target(fn)
    if target is not fn and not isinstance(fn, functools.partial):
        return getattr(getattr(target, "__call__", None), "__doc__", None) or target.__doc__
    return getattr(target, "__doc__", None)


def _where(fn: Any) -> str:
    """``file.py:qualname`` of a callable, for messages."""
    target = _target(fn)
    code = getattr(inspect.unwrap(target), "__code__", None) if inspect.isroutine(target) else None
    module = getattr(target, "__module__", None) or "?"
    file = code.co_filename if code is not None else getattr(sys.modules.get(module), "__file__", None) or module
    return f"{file}:{getattr(target, '__qualname__', type(target).__qualname__)}"


_SECTION = re.compile(r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Other Parameters|Returns?|"
                      r"Yields?|Raises|Examples?|Notes?|Attributes|See Also|References|Warnings?|Todo|Methods)"
                      r"\s*:?\s*$")
_PARAM_SECTIONS = frozenset({"args", "arguments", "parameters", "params", "keyword args", "keyword arguments",
                             "other parameters"})
_GOOGLE_ITEM = re.compile(r"^\*{0,2}(\w+)\s*(?:\((?:[^()]|\([^()]*\))*\))?\s*:\s*(.*)$")
_NUMPY_ITEM = re.compile(r"^\*{0,2}(\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?::.*)?$")
_SPHINX_PARAM = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """``(description, {parameter: description})`` of a Google, NumPy or Sphinx docstring.

    The description is the first paragraph (up to a blank line or a section header), its lines
    joined by spaces. Parameters come from Google ``Args:`` (``name (type): text`` or
    ``name: text``, continuation lines indented deeper), NumPy ``Parameters`` + dashes
    (``name : type`` then indented text; ``a, b : int`` documents both) or Sphinx ``:param name:``.

    Args:
        doc: a docstring (``fn.__doc__``) or None.

    Returns:
        ``("", {})`` for None or an empty docstring.
    """
    if not doc or not doc.strip():
        return "", {}
    lines = inspect.cleandoc("\n" + doc).splitlines()  # "\n": keep the first line's indent like the others
    numpy_header = {i for i in range(len(lines) - 1) if lines[i].strip() and re.fullmatch(r"\s*-{3,}\s*", lines[i + 1])}
    first: list[str] = []
    for i, line in enumerate(lines):
        s = line.strip()
        if not s or i in numpy_header or _SECTION.match(s) or s.startswith(":"):
            break
        first.append(s)
    params: dict[str, str] = {}
    i = 0
    while i < len(lines):
        s, base = lines[i].strip(), _indent(lines[i])
        m = _SPHINX_PARAM.match(s)
        if m:
            text, i = [m.group(2)], i + 1
            while i < len(lines) and lines[i].strip() and _indent(lines[i]) > base \
                    and not lines[i].strip().startswith(":"):
                text.append(lines[i].strip())
                i += 1
            params[m.group(1)] = " ".join(t for t in text if t)
            continue
        if i in numpy_header and s.lower() in _PARAM_SECTIONS:
            i = _numpy_params(lines, i + 2, base, numpy_header, params)
            continue
        if s.endswith(":") and s[:-1].strip().lower() in _PARAM_SECTIONS:
            i = _google_params(lines, i + 1, base, params)
            continue
        i += 1
    return " ".join(first), params


def _google_params(lines: list[str], i: int, base: int, out: dict[str, str]) -> int:
    """Items of a Google ``Args:`` section starting at line ``i``; returns the line after the section."""
    item_indent: int | None = None
    name: str | None = None
    while i < len(lines):
        line = lines[i]
        if line.strip():
            ind = _indent(line)
            if ind <= base:
                break
            if item_indent is None:
                item_indent = ind
            m = _GOOGLE_ITEM.match(line.strip())
            if ind <= item_indent and m:
                name = m.group(1)
                out[name] = m.group(2).strip()
            elif name is not None and ind > item_indent:
                out[name] = f"{out[name]} {line.strip()}".strip()
        i += 1
    return i


def _numpy_params(lines: list[str], i: int, base: int, headers: set[int], out: dict[str, str]) -> int:
    """Items of a NumPy ``Parameters`` section (after its dashes); returns the line after the section."""
    names: list[str] = []
    while i < len(lines) and i not in headers:
        line = lines[i]
        if line.strip():
            ind = _indent(line)
            m = _NUMPY_ITEM.match(line.strip())
            if ind <= base and m:
                names = [n.strip().lstrip("*") for n in m.group(1).split(",")]
                for n in names:
                    out[n] = ""
            elif ind <= base:
                break
            else:
                for n in names:
                    out[n] = f"{out[n]} {line.strip()}".strip()
        i += 1
    return i


def _json_default(value: Any) -> tuple[bool, Any]:
    """``(True, value as JSON)`` when a default can be shown to the model, else ``(False, None)``."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False, None
    return True, json.loads(text)


def _derive_parameters(fn: Callable[..., Any], where: str) -> dict[str, Any]:
    """The arguments schema of ``fn`` from its signature, type hints and docstring.

    Raises:
        ToolError: a parameter that cannot be expressed (see the module docstring).
    """
    try:
        sig = inspect.signature(fn, eval_str=True)
    except (NameError, SyntaxError, TypeError, ValueError, AttributeError) as e:
        raise ToolError(f"{where}: cannot read the signature or resolve its type hints "
                        f"({type(e).__name__}: {_one_line(e)})") from None
    _, docs = parse_docstring(_doc_of(fn))
    props: dict[str, Any] = {}
    required: list[str] = []
    for p in sig.parameters.values():
        what = f"{where}: parameter '{p.name}'"
        if p.kind == p.VAR_POSITIONAL:
            raise ToolError(f"{what}: *{p.name} cannot be passed by a call (arguments are a JSON object); "
                            "declare each argument, or give @tool(parameters=...)")
        if p.kind == p.VAR_KEYWORD:
            raise ToolError(f"{what}: **{p.name} has no schema; declare each argument, or give @tool(parameters=...)")
        if p.kind == p.POSITIONAL_ONLY:
            raise ToolError(f"{what}: positional-only; a call passes arguments by name")
        if p.annotation is p.empty:
            raise ToolError(f"{what} has no type annotation (supported: {_SUPPORTED})")
        try:
            schema, desc = _hint_schema(p.annotation)
        except _Unsupported as e:
            raise ToolError(f"{what}: {e}") from None
        schema = dict(schema)
        nullable = _accepts_none(schema)
        if p.default is None and not nullable:  # `x: int = None`: None is a value the function takes
            _add_null(schema)
        desc = desc or docs.get(p.name)
        if desc:
            schema["description"] = desc
        if p.default is not p.empty:
            ok, value = _json_default(p.default)
            if ok:
                problem = next(iter(jsonschema.Draft202012Validator(schema).iter_errors(value)), None)
                if problem is not None:
                    raise ToolError(f"{what}: default {p.default!r} does not fit its type: "
                                    f"{_one_line(problem.message)}")
                schema["default"] = value
        elif not nullable:
            required.append(p.name)
        props[p.name] = schema
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out


def tool_from_function(fn: Callable[..., Any], *, name: str | None = None, where: str | None = None) -> Tool:
    """The :class:`Tool` of a Python callable: schema from its signature, hints and docstring.

    A function decorated with :func:`tool` gives the tool the decorator checked (its explicit
    schema, name or description). Otherwise the name is ``fn.__name__``, the description the
    first paragraph of the docstring, each parameter's description its entry in the docstring's
    ``Args:`` / ``Parameters`` / ``:param:``; see the module docstring for the type mapping.
    A parameter with a default, or whose hint accepts None, is not required. (A parameter hinted
    ``X | None`` *without* a default is not required either: the caller must pass it None when
    the call leaves it out.)

    Args:
        fn: a function, bound method, ``functools.partial`` or callable object.
        name: the tool name (default: the decorator's name, else ``fn.__name__``).
        where: what errors name (default ``file.py:qualname`` of ``fn``).

    Raises:
        ToolError: a name that is not a valid tool name, an unreadable signature, or a parameter
            that cannot be expressed (``*args``, ``**kwargs``, positional-only, no annotation, an
            unsupported type, a default that does not fit its type): one line naming ``where``
            and the parameter.
    """
    where = where or _where(fn)
    declared = getattr(fn, TOOL_ATTR, None)
    if isinstance(declared, Tool):
        if name is not None and name != declared.name:
            declared = replace(declared, name=check_name(name, where))
        if declared.fn is not fn:  # a wrapper (functools.wraps copies the attribute): call the wrapper
            declared = replace(declared, fn=fn)
        return declared
    if not callable(fn):
        raise ToolError(f"{where}: not callable ({type(fn).__name__})")
    tool_name = name if name is not None else getattr(_target(fn), "__name__", None)
    check_name(tool_name, where)
    description, _ = parse_docstring(_doc_of(fn))
    return Tool(tool_name, description, _derive_parameters(fn, where), fn, where)


def tool(fn: Callable[..., Any] | None = None, /, *, name: str | None = None, description: str | None = None,
         parameters: Mapping[str, Any] | None = None) -> Any:
    """Declare a function as a tool, checked now: ``@tool``, or ``@tool(name=..., description=..., parameters=...)``.

    The function is returned unchanged (still callable as before), carrying its :class:`Tool` in
    :data:`TOOL_ATTR`; :func:`tool_from_function` and :func:`load_executors` use that tool.
    ``parameters`` replaces the derived schema: it must pass :func:`check_schema` (strict, no
    normalisation) and fit the signature (every property is a keyword the function takes, every
    parameter without a default is required); annotations are then not needed.

    Args:
        fn: the function (when used bare, ``@tool``).
        name: the tool name (default ``fn.__name__``).
        description: what it does (default: the docstring's first paragraph).
        parameters: an explicit arguments schema (default: derived from the signature).

    Returns:
        ``fn`` itself, or a decorator when called with options only.

    Raises:
        ToolError: at decoration (that is, when the executors file is imported): an invalid name,
            schema or signature, one line naming the file and function.
    """
    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        where = _where(f)
        if parameters is not None:
            params = check_schema(parameters, where)
            _check_signature(f, params, where)
            tool_name = check_name(name if name is not None else getattr(f, "__name__", None), where)
            t = Tool(tool_name, parse_docstring(_doc_of(f))[0], params, f, where)
        else:
            t = tool_from_function(f, name=name, where=where)
        if description is not None:
            if not isinstance(description, str):
                raise ToolError(f"{where}: description must be a string, got {type(description).__name__}")
            t = replace(t, description=description)
        try:
            setattr(f, TOOL_ATTR, t)
        except (AttributeError, TypeError):
            raise ToolError(f"{where}: cannot attach a tool to a {type(f).__name__}; "
                            "wrap it in a def") from None
        return f

    if fn is not None:
        if not callable(fn):
            raise TypeError(f"@tool takes a function or keyword options, got {type(fn).__name__}")
        return decorate(fn)
    return decorate


def tool_from_schema(schema: Mapping[str, Any], where: str, *, fn: Callable[..., Any] | None = None,
                     normalize: bool = True) -> Tool:
    """The :class:`Tool` of a function schema from data or JSON (``{"name", "description", "parameters"}``).

    OpenAI's ``{"type": "function", "function": {...}}`` wrapper is removed
    (:func:`codechat.chat.normalize_tool`). Missing ``parameters`` means no arguments. With
    ``normalize`` (default) the parameters go through :func:`normalize_schema` first and
    ``Tool.changes`` lists what was repaired; then :func:`check_schema`. Keys other than name,
    description and parameters are not kept.

    Args:
        schema: one tool schema.
        where: what errors name (``tools.json: tools[2]``).
        fn: the callable that executes it; when given, the schema must fit its signature.
        normalize: repair sloppy schemas (False: strict, as the :func:`tool` decorator).

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


# ----------------------------------------------------------------------------- executors files
_MODULE_IDS = itertools.count()


def _import_file(path: Path, shown: str) -> types.ModuleType:
    """Import the Python file at ``path`` as a fresh module with a unique name.

    The file's folder is on ``sys.path`` while it runs, so it can import modules beside it.

    Raises:
        ToolError: it raised while importing (type and message shown); a ToolError from a
            :func:`tool` decorator inside it passes through unchanged.
    """
    stem = re.sub(r"\W", "_", path.stem)
    mod_name = f"_codechat_executors_{stem}_{os.getpid()}_{next(_MODULE_IDS)}"
    loader = importlib.machinery.SourceFileLoader(mod_name, str(path))
    spec = importlib.util.spec_from_file_location(mod_name, str(path), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    folder = str(path.parent.resolve())
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        loader.exec_module(module)
    except ToolError:
        sys.modules.pop(mod_name, None)
        raise
    except (Exception, SystemExit) as e:
        sys.modules.pop(mod_name, None)
        raise ToolError(f"{shown}: does not import: {type(e).__name__}: {_one_line(e)}") from None
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)
    return module


def load_callables(path: str | os.PathLike[str]) -> dict[str, Callable[..., Any]]:
    """The callables an executors file offers, by tool name, in order (no schema derived yet).

    The file is imported under a unique module name (loading it twice gives two independent
    modules). When it defines an ``EXECUTORS`` dict (the seed system's convention, ``name ->
    callable``), exactly those, named by their keys (an imported function may be listed).
    Otherwise every public function *defined in the file*, in definition order: not names it
    imports, not names starting with ``_``, not classes. Use this to bind schemas declared
    elsewhere (``tool_from_schema(schema, where, fn=callables[name])``); :func:`load_executors`
    derives the schemas from the functions.

    Args:
        path: the ``.py`` file.

    Raises:
        ToolError: one line naming the file: missing, does not import (exception type and
            message), an ``EXECUTORS`` that is not a non-empty dict of str -> callable, or no
            public function.
    """
    return _load_callables(path)[0]


def _load_callables(path: str | os.PathLike[str]) -> tuple[dict[str, Callable[..., Any]], bool]:
    """:func:`load_callables`, and whether they came from an ``EXECUTORS`` dict."""
    shown = os.fspath(path)
    p = Path(path)
    if not p.is_file():
        raise ToolError(f"{shown}: no such executors file" + (" (it is a directory)" if p.is_dir() else ""))
    module = _import_file(p, shown)
    if hasattr(module, "EXECUTORS"):
        table = module.EXECUTORS
        if not isinstance(table, Mapping) or not table:
            raise ToolError(f"{shown}: EXECUTORS must be a non-empty dict of name -> callable, "
                            f"got {type(table).__name__} {_one_line(table)[:60]}")
        for key, fn in table.items():
            if not isinstance(key, str) or not callable(fn):
                raise ToolError(f"{shown}: EXECUTORS[{key!r}] must map a string name to a callable, "
                                f"got {type(fn).__name__}")
        return dict(table), True
    found = {attr: obj for attr, obj in vars(module).items()
             if not attr.startswith("_") and inspect.isfunction(obj) and obj.__module__ == module.__name__}
    if not found:
        raise ToolError(f"{shown}: no public function defined in the file (and no EXECUTORS dict)")
    return found, False


def load_executors(path: str | os.PathLike[str]) -> list[Tool]:
    """The tools of an executors file: each callable of :func:`load_callables`, through :func:`tool_from_function`.

    ``@tool`` declarations are honoured; with an ``EXECUTORS`` dict the key is the tool name;
    otherwise the name is the function's (or its ``@tool(name=...)``).

    Args:
        path: the ``.py`` file.

    Returns:
        The tools in order, each with ``fn`` set and ``source`` ``"<path>:<function>"``.

    Raises:
        ToolError: one line naming the file (and the function): every error of
            :func:`load_callables`, a function whose schema cannot be derived (see
            :func:`tool_from_function`), or two tools with one name.
    """
    shown = os.fspath(path)
    callables, keyed = _load_callables(path)
    tools = [tool_from_function(fn, name=key if keyed else None, where=f"{shown}:{key}")
             for key, fn in callables.items()]
    seen: dict[str, str] = {}
    for t in tools:
        if t.name in seen:
            raise ToolError(f"{shown}: two tools named '{t.name}' ({seen[t.name]} and {t.source})")
        seen[t.name] = t.source
    return tools


__all__ = ["Tool", "ToolError", "TOOL_ATTR", "NAME_PATTERN", "validate_arguments", "check_name", "check_schema",
           "normalize_schema", "parse_docstring", "tool_from_function", "tool", "tool_from_schema", "load_callables",
           "load_executors"]
