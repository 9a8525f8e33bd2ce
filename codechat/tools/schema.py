"""Tool schemas: what a model may call, and whether a call's arguments fit.

A tool is an OpenAI-style function schema — ``name``, ``description`` and JSON-Schema
``parameters`` (an ``object`` schema) — plus, when it can run here, the Python callable that
executes it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import jsonschema


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
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    fn: Callable[..., Any] | None = None
    source: str = ""

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
