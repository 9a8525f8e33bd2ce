"""Function calling: tool schemas (declared or derived from Python), validated dispatch, built-in tools.

- :mod:`.schema`: :class:`Tool`, :class:`ToolError`, :func:`tools_by_name` (one tool per name),
  JSON-Schema checks at load (:func:`check_name`, :func:`check_schema`), argument validation
  (:func:`validate_arguments`) and schemas from data (:func:`tool_from_schema`). The layout of
  tools in the system turn is :func:`codechat.chat.conversation.system_text`;
- :mod:`.normalize`: :func:`normalize_schema`, the repairs of sloppy schemas from data;
- :mod:`.derive`: schemas from Python functions (:func:`tool_from_function`, the :func:`tool`
  decorator, :func:`parse_docstring`);
- :mod:`.executors`: executors files (:func:`load_executors`, :func:`load_callables`);
- :mod:`.dispatch`: running a parsed call against the declared tools (:class:`Dispatcher`,
  :func:`dispatch`, :class:`CallResult`, :class:`DispatchLimits`), every failure a
  ``function_response`` the model can read;
- :mod:`.worker`: the worker process the dispatcher runs executors in (both ends of its pipes);
- :mod:`.builtins`: the opt-in ``python`` (sandboxed) and ``calculator`` tools (:func:`builtin_tools`).

Imports point one way: normalize <- schema <- derive <- executors; worker <- dispatch;
schema <- builtins, dispatch.
"""
from .builtins import builtin_tools
from .derive import parse_docstring, tool, tool_from_function
from .dispatch import CallResult, DispatchLimits, Dispatcher, dispatch
from .executors import load_callables, load_executors
from .normalize import normalize_schema
from .schema import Tool, ToolError, check_name, check_schema, tool_from_schema, tools_by_name, validate_arguments

__all__ = ["Tool", "ToolError", "tools_by_name", "validate_arguments", "check_name", "check_schema",
           "normalize_schema", "parse_docstring", "tool_from_function", "tool", "tool_from_schema", "load_callables",
           "load_executors", "Dispatcher", "dispatch", "CallResult", "DispatchLimits", "builtin_tools"]
