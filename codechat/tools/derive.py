"""Tool schemas derived from Python: signatures, type hints and docstrings.

:func:`tool_from_function` derives a :class:`~.schema.Tool` from a callable (the name from
``__name__``, the description and the parameters' descriptions from the docstring through
:func:`parse_docstring`, the ``parameters`` schema from the signature and the type hints); the
:func:`tool` decorator overrides the name or description or gives an explicit schema, checked at
decoration. Executors files (:func:`codechat.tools.executors.load_executors`) use both.

Type hints -> JSON Schema:

=============================== ==============================================================
hint                            schema
=============================== ==============================================================
``str`` ``int`` ``float``       ``{"type": "string"}`` ``"integer"`` ``"number"``
``bool``                        ``{"type": "boolean"}``
``list`` / ``list[X]``          ``{"type": "array"}`` / ``{"type": "array", "items": X}``
``dict`` / ``dict[str, X]``     ``{"type": "object", "additionalProperties": true}`` / ``{..., "additionalProperties": X}``
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

The arguments object says nothing of extra keys, so the schema the model is shown stays as lean
as the ones it was trained on; wherever a call is held to the schema it is closed
(:func:`codechat.chat.strict.closed_schema`: only the function's parameters, each at most once).
A ``dict`` parameter is the one open object, and says so (``"additionalProperties": true``), so
closing leaves it open.

A parameter hinted ``X | None`` *without* a default is not required in the schema, though the
function needs it: :class:`~.dispatch.Dispatcher` passes it None when a call leaves it out.
"""
from __future__ import annotations

import functools
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import jsonschema

from .normalize import _add_null, _union
from .schema import Tool, ToolError, _check_signature, _one_line, check_name, check_schema

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
            return {"type": "object", "additionalProperties": True}, None
        if args[0] is not str:
            raise _Unsupported(f"dict keys must be str (JSON object keys are strings), got {_type_name(args[0])}")
        value = _hint_schema(args[1])[0]
        return {"type": "object", "additionalProperties": True if value == {} else value}, None
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
    ``X | None`` *without* a default is not required either: :class:`~.dispatch.Dispatcher` passes
    it None when the call leaves it out.)

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
    :data:`TOOL_ATTR`; :func:`tool_from_function` and :func:`~.executors.load_executors` use that tool.
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


__all__ = ["TOOL_ATTR", "parse_docstring", "tool_from_function", "tool"]
