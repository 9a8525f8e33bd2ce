"""Run a model's function call against the declared tools; every failure is a response the model can read.

``Dispatcher(tools)(call)`` (or the one-shot :func:`dispatch`) takes a parsed call
``{"name": str, "arguments": dict}`` and returns a :class:`CallResult` whose ``content`` is the
text of the ``<|function_response|>`` turn that goes back to the model: the executor's return
value as JSON, or ``{"error": "..."}`` saying what went wrong in words the model can act on.

What model output can do, and what it gets back (nothing raises, nothing undeclared runs):

============================================  ==================================================
the call                                      the response
============================================  ==================================================
did not parse (``call=None, error=...``)      ``could not be parsed: ...`` (the parser's reason)
a name not in ``tools`` (``eval``, ``open``,  ``there is no function named ...; the functions you
``__import__``, ``os.system``, a file path)   can call are: ...`` — looked up as a dict key, never
                                              resolved as Python
arguments bigger than ``max_argument_bytes``  ``the arguments ... are N bytes; at most M ...``
arguments not fitting the JSON schema         ``invalid arguments for ...: a: '1' is not of type
                                              'integer'`` (:func:`~.schema.validate_arguments`)
the executor raises                           ``... failed: ValueError: message`` (no traceback;
                                              ``CallResult.error`` adds the file and line)
it runs past ``timeout_s``                    ``... did not finish within T s and was stopped``
it prints more than ``max_print_bytes``       ``... printed more than N bytes ... and was stopped``
it returns more than ``max_output_bytes``     ``the result of ... is N bytes of JSON; at most M``
it returns a non-JSON value (a set, NaN)      ``... returned a set, which is not JSON`` (no
                                              ``str()`` fallback: see below)
its process dies (``os._exit``, a signal)     ``... crashed: its process exited with status 3``
============================================  ==================================================

Argument *values* are only data: ``"__import__('os').system(...)"`` or ``"../../etc/passwd"`` reach
the executor as strings, exactly as written; the dispatcher never evaluates, opens or resolves them.

Where things live: this module is the caller's side — the checks above, the words of every
response, :class:`DispatchLimits` and :class:`CallResult`; :mod:`.worker` is the worker process
(its start, pipes, limits and kill from the caller's side, and the loop that imports and runs
executors in the child; its docstring describes the process model). Executors run in one reusable
worker process per :class:`Dispatcher`, never in the caller's process, started lazily by the
first call that passes every check.

A parameter hinted ``X | None`` without a default is not required by its derived schema
(:mod:`.derive`), but the function still needs it: when a call leaves such a parameter out (one
whose schema accepts null and that the function takes without a default), the dispatcher passes
None for it. Nothing else is filled in.

Why a non-JSON return value is an error rather than ``str(value)``: the response must be JSON the
model can learn to read, and a ``repr`` (``<object at 0x7f...>``, ``{1, 2}``) silently teaches it a
different format; the error tells the tool's author what to return instead.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.machinery
import inspect
import json
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema

from .schema import Tool, ToolError, tools_by_name, validate_arguments
from .worker import _MESSAGE_CHARS, _describe, _Worker

__all__ = ["CallResult", "DispatchLimits", "Dispatcher", "dispatch"]

_NAME_CHARS = 60  # longest model-written name quoted back to the model
_LISTED_NAMES = 50  # most declared names listed in an "unknown function" response



@dataclass(frozen=True)
class DispatchLimits:
    """What one call may cost. Sizes in bytes (UTF-8), times in seconds.

    Attributes:
        timeout_s: wall clock for the executor, from the request to its reply (worker start-up
            not included); past it the worker is killed.
        max_argument_bytes: size of the arguments object as compact JSON; 1 MiB is far more
            than a model generates in one turn (its context is smaller), and bounds what is
            sent to the worker and checked against the schema.
        max_output_bytes: size of the JSON return value, i.e. of ``content``: 64 KiB already
            exceeds the context of the models trained here, so a larger result only wastes it.
        max_print_bytes: what the executor may write to stdout + stderr in one call; the
            dispatcher keeps at most this much (memory bounded whatever is printed) and
            stops the worker when it is exceeded.
        memory_mb: ``RLIMIT_AS`` of the worker process in MiB, or None for no limit (tools that
            load CUDA need a large address space; the ``python`` built-in has its own limit).
        start_timeout_s: how long a new worker may take to start.

    Raises:
        ValueError: a non-positive limit.
    """

    timeout_s: float = 10.0
    max_argument_bytes: int = 1 << 20
    max_output_bytes: int = 1 << 16
    max_print_bytes: int = 1 << 20
    memory_mb: int | None = None
    start_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("timeout_s", "max_argument_bytes", "max_output_bytes", "max_print_bytes",
                     "start_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"DispatchLimits.{name} must be > 0, got {getattr(self, name)!r}")
        if self.memory_mb is not None and self.memory_mb < 16:
            raise ValueError(f"DispatchLimits.memory_mb must be >= 16 or None, got {self.memory_mb}")


@dataclass(frozen=True)
class CallResult:
    """The outcome of one function call.

    Attributes:
        name: the called name as the model wrote it (None when the call did not parse or had
            no string name).
        ok: the executor ran and returned a JSON value within the limits. A tool that reports
            a failure in its own value (the ``python`` built-in's ``{"status": "error"}``) is ok.
        content: the text of the ``function_response`` message: the return value as JSON, or
            ``{"error": "..."}``.
        error: None when ok, else the reason (the same words as in ``content``, plus the file
            and line for an executor that raised, for the tool's author).
        wall_s: seconds the dispatch took, worker start-up included.
        stdout, stderr: what the executor printed during this call, decoded as UTF-8 (at most
            ``max_print_bytes`` together); not part of ``content``.
    """

    name: str | None
    ok: bool
    content: str
    error: str | None
    wall_s: float
    stdout: str = ""
    stderr: str = ""

    def message(self) -> Any:
        """This result as a ``codechat.chat.conversation.Message`` of role ``function_response``."""
        from codechat.chat.conversation import Message  # lazy: chat imports the tokenizer

        return Message("function_response", self.content)


# ----------------------------------------------------------------------------- the caller's side
def _quote(name: str) -> str:
    """A model-written name for a message: ``repr``, cut to :data:`_NAME_CHARS` characters."""
    return repr(name[:_NAME_CHARS]) + ("..." if len(name) > _NAME_CHARS else "")


def _target(tool: Tool) -> dict[str, Any] | None:
    """How the worker finds ``tool.fn``: ``{"file"|"module", "qualname", "args", "kwargs"}``.

    None when the tool has no executor.

    Raises:
        ToolError: the executor cannot be imported by another process (a lambda, a closure, a
            partial with non-JSON bound arguments, a function of an unimportable module).
    """
    fn = tool.fn
    if fn is None:
        return None
    where = f"tool {tool.name!r} ({tool.source or 'no source'})"
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    while isinstance(fn, functools.partial):
        args, kwargs = list(fn.args) + args, {**fn.keywords, **kwargs}
        fn = fn.func
    try:
        json.dumps([args, kwargs], allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ToolError(f"{where}: the arguments bound by functools.partial must be JSON values "
                        f"(the executor runs in another process): {e}") from None
    qualname = getattr(fn, "__qualname__", None)
    module_name = getattr(fn, "__module__", None)
    if not isinstance(qualname, str) or "<" in qualname:
        raise ToolError(f"{where}: the executor {qualname or fn!r} must be a module-level function: "
                        "it runs in a worker process, which imports it by module or file")
    base = {"qualname": qualname, "args": args, "kwargs": kwargs}
    path, _, function = tool.source.rpartition(":")
    if path.endswith(".py") and function == qualname and os.path.isfile(path):
        return {"file": os.path.abspath(path), **base}
    module = sys.modules.get(module_name) if isinstance(module_name, str) else None
    spec = getattr(module, "__spec__", None)
    if module_name != "__main__" and spec is not None and spec.name == module_name and _importable(module_name):
        return {"module": module_name, **base}
    filename = getattr(getattr(fn, "__code__", None), "co_filename", "")
    if filename.endswith(".py") and os.path.isfile(filename):
        return {"file": os.path.abspath(filename), **base}
    raise ToolError(f"{where}: cannot find the executor {qualname!r} of module {module_name!r} in a new "
                    "process; declare it with source='path.py:function' or put it in an importable module")


def _importable(module_name: str) -> bool:
    """Whether a fresh interpreter with this ``sys.path`` can import ``module_name``'s top package."""
    top = module_name.partition(".")[0]
    return (top in sys.builtin_module_names or importlib.machinery.PathFinder.find_spec(top, sys.path) is not None
            or importlib.machinery.FrozenImporter.find_spec(top) is not None)


def _error_result(name: str | None, message: str, t0: float, *, detail: str = "", stdout: str = "",
                  stderr: str = "") -> CallResult:
    return CallResult(name, False, json.dumps({"error": message}, ensure_ascii=False),
                      message + (f" ({detail})" if detail else ""), time.monotonic() - t0, stdout, stderr)


def _omittable_nulls(tool: Tool) -> tuple[str, ...]:
    """The parameters to pass None for when a call leaves them out: those ``tool.fn`` takes by
    keyword without a default whose schema is not required and accepts null (``X | None`` without
    a default, see :mod:`.derive`). Empty for a tool without ``fn`` or a readable signature."""
    if tool.fn is None:
        return ()
    try:
        params = inspect.signature(tool.fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    props, required = tool.parameters.get("properties", {}), set(tool.parameters.get("required", []))
    out: list[str] = []
    for p in params:
        schema = props.get(p.name) if isinstance(props, Mapping) else None
        if (p.default is not p.empty or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                or p.name in required or not isinstance(schema, Mapping)):
            continue
        try:
            if jsonschema.Draft202012Validator(dict(schema)).is_valid(None):
                out.append(p.name)
        except Exception:  # noqa: BLE001 - e.g. a $ref into the root schema: fill nothing
            continue
    return tuple(out)


def _exit_words(status: int | None) -> str:
    if status is None:
        return "its process ended"
    if status < 0:
        try:
            return f"its process was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"its process was killed by signal {-status}"
    return f"its process exited with status {status}"


class Dispatcher:
    """Runs calls against ``tools`` in a reusable worker process; use it as a context manager.

    Args:
        tools: name -> :class:`~.schema.Tool` (or an iterable of tools, keyed by their names:
            :func:`~.schema.tools_by_name`).
            A tool without ``fn`` is declared but answers that it cannot run here.
        limits: a :class:`DispatchLimits`; keyword arguments override single fields
            (``Dispatcher(tools, timeout_s=2)``).

    One call runs at a time (calls from several threads queue on a lock); for parallel calls use
    one dispatcher per thread.

    Raises:
        ToolError: a key that differs from its tool's name, two tools of one name in an iterable,
            or an executor the worker cannot import (see :func:`_target`).
        ValueError: an invalid limit.
    """

    def __init__(self, tools: Mapping[str, Tool] | Iterable[Tool], *, limits: DispatchLimits | None = None,
                 **overrides: Any) -> None:
        self.limits = dataclasses.replace(limits or DispatchLimits(), **overrides)
        self.tools: dict[str, Tool] = dict(tools) if isinstance(tools, Mapping) else tools_by_name(tools)
        for key, tool in self.tools.items():
            if not isinstance(tool, Tool):
                raise ToolError(f"tools[{key!r}] must be a Tool, got {type(tool).__name__}")
            if key != tool.name:
                raise ToolError(f"tools[{key!r}] is the tool {tool.name!r} (from {tool.source or 'no source'}): "
                                "the key must be its name")
        self._targets = {name: _target(tool) for name, tool in self.tools.items()}
        self._nulls = {name: _omittable_nulls(tool) for name, tool in self.tools.items()}
        self._worker: _Worker | None = None
        self._lock = threading.Lock()
        self.starts = 0  # workers started so far (1 + restarts after a kill)

    # ------------------------------------------------------------------ lifecycle
    @property
    def worker_pid(self) -> int | None:
        """Pid of the running worker, None before the first executed call or after a kill."""
        w = self._worker
        return w.pid if w is not None and w.alive() else None

    def start(self) -> None:
        """Start the worker now (else the first call that runs an executor does).

        Raises:
            RuntimeError: it did not start within ``limits.start_timeout_s``.
        """
        with self._lock:
            self._ensure_worker()

    def _ensure_worker(self) -> _Worker:
        if self._worker is None or not self._worker.alive():
            if self._worker is not None:
                self._worker.kill()
            self._worker = None
            self._worker = _Worker(self.limits)
            self.starts += 1
        return self._worker

    def close(self) -> None:
        """Stop the worker (idempotent); a later call starts a new one."""
        with self._lock:
            if self._worker is not None:
                self._worker.close()
                self._worker = None

    def __enter__(self) -> Dispatcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ calls
    def __call__(self, call: Mapping[str, Any] | str | BaseException | None, *, error: str | None = None,
                 timeout_s: float | None = None) -> CallResult:
        """Run one call; never raises for anything in ``call``.

        Args:
            call: the parsed call ``{"name": str, "arguments": dict}`` (arguments may also be a
                JSON string, decoded once, or missing: ``{}``); call text, parsed with
                :func:`codechat.chat.calls.parse_call`; or, when the model's call did not parse,
                None with ``error`` the parser's reason, or the parser's exception itself.
            error: the parse failure when ``call`` is None.
            timeout_s: this call's executor timeout in seconds (default ``limits.timeout_s``).

        Returns:
            A :class:`CallResult`; ``content`` is what goes back to the model.
        """
        t0 = time.monotonic()
        try:
            with self._lock:
                return self._dispatch(call, error, self.limits.timeout_s if timeout_s is None else timeout_s, t0)
        except Exception as e:  # noqa: BLE001 - model output must never crash the caller
            warnings.warn(f"codechat.tools.dispatch: internal error on a call: {_describe(e)}", RuntimeWarning,
                          stacklevel=2)
            return _error_result(None, f"the call could not be run (internal error: {_describe(e)})", t0)

    dispatch = __call__

    def _dispatch(self, call: Any, error: str | None, timeout_s: float, t0: float) -> CallResult:
        if isinstance(call, str):
            try:
                from codechat.chat.calls import parse_call  # lazy: calls imports the tokenizer

                call = parse_call(call)
            except Exception as e:  # noqa: BLE001
                error, call = _describe(e), None
        if isinstance(call, BaseException):
            error, call = _describe(call), None
        if call is None:
            reason = (error or "no function call was given")[:_MESSAGE_CHARS]
            return _error_result(None, "your function call could not be parsed: " + reason
                                 + '. Write it as a JSON object {"name": ..., "arguments": {...}}.', t0)
        if not isinstance(call, Mapping):
            return _error_result(None, f"a function call must be a JSON object with a name and arguments, "
                                       f"not {type(call).__name__}", t0)
        name = call.get("name")
        if not isinstance(name, str) or not name:
            return _error_result(None, "the function call has no name (a non-empty string)", t0)
        tool = self.tools.get(name)
        if tool is None:
            names = list(self.tools)
            listed = ", ".join(names[:_LISTED_NAMES]) + (", ..." if len(names) > _LISTED_NAMES else "")
            return _error_result(name, f"there is no function named {_quote(name)}; the functions you can call "
                                       f"are: {listed or '(none)'}", t0)
        shown = _quote(name)
        arguments = call.get("arguments", {})
        if arguments is None:
            arguments = {}
        if isinstance(arguments, str):  # a JSON string inside the JSON call, decoded once
            if len(arguments.encode("utf-8", "surrogatepass")) > self.limits.max_argument_bytes:
                return self._too_big(name, len(arguments.encode("utf-8", "surrogatepass")), t0)
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError) as e:
                return _error_result(name, f"the arguments of {shown} are not JSON: {_describe(e)}", t0)
        if not isinstance(arguments, Mapping):
            return _error_result(name, f"the arguments of {shown} must be a JSON object, "
                                       f"not {type(arguments).__name__}", t0)
        try:
            encoded = json.dumps(arguments, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError) as e:
            return _error_result(name, f"the arguments of {shown} are not plain JSON: {_describe(e)}", t0)
        size = len(encoded.encode("utf-8", "surrogatepass"))
        if size > self.limits.max_argument_bytes:
            return self._too_big(name, size, t0)
        try:
            problem = validate_arguments(tool, arguments)
        except Exception as e:  # noqa: BLE001 - e.g. RecursionError on deep nesting
            problem = f"they could not be checked ({_describe(e)})"
        if problem is not None:
            return _error_result(name, f"invalid arguments for {shown}: {problem}", t0)
        target = self._targets[name]
        if target is None:
            return _error_result(name, f"{shown} is declared but cannot be run here (it has no executor)", t0)
        arguments = json.loads(encoded)
        for omitted in self._nulls[name]:  # `x: T | None` without a default, left out: None
            arguments.setdefault(omitted, None)
        return self._run(name, target, arguments, timeout_s, t0)

    def _too_big(self, name: str, size: int, t0: float) -> CallResult:
        return _error_result(name, f"the arguments of {_quote(name)} are {size:,} bytes; at most "
                                   f"{self.limits.max_argument_bytes:,} bytes are accepted", t0)

    def _run(self, name: str, target: dict[str, Any], arguments: dict[str, Any], timeout_s: float,
             t0: float) -> CallResult:
        shown = _quote(name)
        try:
            worker = self._ensure_worker()
        except Exception as e:  # noqa: BLE001 - the environment, not the model: say it loudly
            warnings.warn(f"codechat.tools.dispatch: {_describe(e)}", RuntimeWarning, stacklevel=4)
            return _error_result(name, f"{shown} could not be run: the tool worker did not start", t0,
                                 detail=_describe(e))
        request = {"target": target, "arguments": arguments, "max_output_bytes": self.limits.max_output_bytes}
        reply = worker.exchange(request, timeout_s)
        out, err = reply.pop("stdout"), reply.pop("stderr")
        kind = reply["kind"]
        if kind in ("timeout", "flood", "huge", "dead"):
            self._worker = None
        if kind == "ok":
            return CallResult(name, True, reply["content"], None, time.monotonic() - t0, out, err)
        limits = self.limits
        message, detail = {
            "timeout": (f"{shown} did not finish within {timeout_s:g} s and was stopped", ""),
            "flood": (f"{shown} printed more than {limits.max_print_bytes:,} bytes of output (the limit) "
                      "and was stopped", ""),
            "huge": (f"the result of {shown} is larger than {limits.max_output_bytes:,} bytes of JSON (the limit)",
                     f"reply of {reply.get('size', 0):,} bytes"),
            "dead": (f"{shown} crashed: {_exit_words(reply.get('status'))} before returning", ""),
            "too_large": (f"the result of {shown} is {reply.get('size', 0):,} bytes of JSON; at most "
                          f"{limits.max_output_bytes:,} bytes can be returned", ""),
            "not_json": (f"{shown} returned {reply.get('error', 'a value')}, which is not JSON (a bug in the tool)",
                         ""),
            "raised": (f"{shown} failed: {reply.get('error', '')}", reply.get("where", "")),
            "signature": (f"the arguments do not fit {shown}: {reply.get('error', '')}", ""),
            "load": (f"{shown} is unavailable: its executor could not be loaded ({reply.get('error', '')})",
                     reply.get("where", "")),
        }.get(kind, (f"{shown} could not be run (unexpected worker reply {kind!r})", ""))
        return _error_result(name, message, t0, detail=detail, stdout=out, stderr=err)


def dispatch(call: Mapping[str, Any] | str | BaseException | None, tools: Mapping[str, Tool] | Iterable[Tool], *,
             error: str | None = None, limits: DispatchLimits | None = None, **overrides: Any) -> CallResult:
    """Run one call in a fresh :class:`Dispatcher` (a worker started and stopped for it).

    ``timeout_s``, ``max_argument_bytes``, ``max_output_bytes``, ``max_print_bytes`` and
    ``memory_mb`` override :class:`DispatchLimits` fields. For more than one call keep a
    :class:`Dispatcher`: this one pays a worker start (about 0.3 s) per executed call.

    Raises:
        ToolError: a tool whose executor cannot run in a worker (never for anything in ``call``).
    """
    with Dispatcher(tools, limits=limits, **overrides) as d:
        return d(call, error=error)
