"""Executors files: a Python file whose functions become tools.

:func:`load_executors` imports the file (under a fresh, unique module name) and turns each of its
callables into a :class:`~.schema.Tool` through :func:`~.derive.tool_from_function` (``@tool``
declarations honoured); :func:`load_callables` gives the callables alone, to bind schemas declared
elsewhere with :func:`~.schema.tool_from_schema`. The dispatcher's worker process imports such a
file again by path (:mod:`.worker`), so the functions never cross a process boundary.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import inspect
import itertools
import os
import re
import sys
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .derive import tool_from_function
from .schema import Tool, ToolError, _one_line, tools_by_name

_MODULE_IDS = itertools.count()


def _import_file(path: Path, shown: str) -> types.ModuleType:
    """Import the Python file at ``path`` as a fresh module with a unique name.

    The file's folder is on ``sys.path`` while it runs, so it can import modules beside it.

    Raises:
        ToolError: it raised while importing (type and message shown); a ToolError from a
            :func:`~.derive.tool` decorator inside it passes through unchanged.
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
    tools_by_name(tools, shown)  # two tools of one name: an error naming both functions
    return tools


__all__ = ["load_callables", "load_executors"]
