"""Function calling: tool schemas (declared or derived from Python), validated dispatch, built-in tools.

- :mod:`.schema`: :class:`Tool`, schemas from Python functions (:func:`tool_from_function`, the
  :func:`tool` decorator) and executors files (:func:`load_executors`), schemas from data
  (:func:`tool_from_schema`, :func:`normalize_schema`), JSON-Schema checks at load
  (:func:`check_schema`) and argument validation (:func:`validate_arguments`). The layout of
  tools in the system turn is :func:`codechat.chat.system_text`;
- :mod:`.dispatch`: running a parsed call against the declared tools, every failure a
  ``function_response`` the model can read;
- :mod:`.builtins`: the opt-in ``python`` (sandboxed) and ``calculator`` tools.
"""
from .schema import (Tool, ToolError, check_name, check_schema, load_callables, load_executors, normalize_schema,
                     parse_docstring, tool, tool_from_function, tool_from_schema, validate_arguments)

__all__ = ["Tool", "ToolError", "validate_arguments", "check_name", "check_schema", "normalize_schema",
           "parse_docstring", "tool_from_function", "tool", "tool_from_schema", "load_callables", "load_executors"]
