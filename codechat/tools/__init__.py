"""Function calling: tool schemas (declared or derived from Python), validated dispatch, built-in tools.

- :mod:`.schema`: :class:`Tool`, schemas from Python functions and executors files, JSON-Schema
  checks, argument validation, the system-turn layout;
- :mod:`.dispatch`: running a parsed call against the declared tools, every failure a
  ``function_response`` the model can read;
- :mod:`.builtins`: the opt-in ``python`` (sandboxed) and ``calculator`` tools.
"""
from .schema import Tool, ToolError, validate_arguments

__all__ = ["Tool", "ToolError", "validate_arguments"]
