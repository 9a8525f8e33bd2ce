"""Repairs of sloppy tool schemas: :func:`normalize_schema`.

Schemas in the wild (datasets, users' JSON) say ``"type": "dict"``, ``"required": true`` inside a
property, ``"List[int]"``, the xlam layout without ``type``/``properties``, OpenAPI's
``nullable``... :func:`normalize_schema` rewrites them into valid JSON Schema and says, one line
per repair, what it changed; :func:`codechat.tools.schema.tool_from_schema` applies it before
:func:`codechat.tools.schema.check_schema`, and ``check_schema`` uses it to suggest a repair.

This module imports nothing else of :mod:`codechat.tools`; :mod:`.derive` reuses its
:func:`_add_null` and :func:`_union` for schemas derived from type hints.
"""
from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

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
    Anything it cannot repair is left for :func:`~.schema.check_schema` to report. Normalising twice
    changes nothing the second time; schemas from :func:`~.derive.tool_from_function` need no repair.

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


__all__ = ["normalize_schema"]
