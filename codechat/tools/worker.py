"""The tool worker process: the parent's handle on it, the loop it runs, and the framing between them.

:class:`~.dispatch.Dispatcher` decides *whether* a call runs and what the model reads back; this
module is *how* it runs. Both ends live here because they share the wire format: requests and
replies are length-prefixed JSON (:data:`codechat.eval.sandbox.protocol.HEADER`; :func:`_frame`,
``send_msg``, ``recv_msg``) and the exception text of :func:`_describe`.

- the parent's side: :class:`_Worker` starts ``python -c`` :data:`_BOOT` (which imports this
  module and calls :func:`_worker_main`), writes one request, drains stdout/stderr while it waits
  and enforces the timeout and the print and reply limits, killing the process group when one is
  exceeded;
- the child's side: :func:`_worker_main` (the request loop), :func:`_load` (import an executor by
  file or module, once per worker) and :func:`_execute` (bind, call, encode the result as JSON).

This module imports nothing else of :mod:`codechat.tools` (the limits are duck-typed
:class:`_Limits`), so the child does not need the dispatcher and imports point one way.

Process model
-------------
Executors run in one reusable worker process per :class:`~.dispatch.Dispatcher` (a fresh
``python`` started with :mod:`subprocess`, in its own session), never in the caller's process.
The worker imports each executor itself, so nothing is pickled: for a tool whose ``source`` is
``"path.py:function"`` (tools loaded from an executors file) it imports that file by path; for a
module-level function of an importable module (``codechat.tools.builtins``) it imports the module
by name; a ``functools.partial`` of either carries its bound JSON arguments along. Lambdas,
closures and other objects the worker cannot import are a :class:`~.schema.ToolError` when the
dispatcher is built. Requests and replies travel on private pipes; the executor's stdin is
``/dev/null`` and its stdout/stderr (file descriptors 1 and 2, so ``print``, ``os.write`` and
child processes alike) are pipes the dispatcher drains while it waits, keeping at most
``max_print_bytes`` of them. On a timeout, an output flood or a reply too large, the worker's
whole process group is killed with ``SIGKILL``; the next call starts a new one (about 0.3 s). A
worker is started lazily, by the first call that passes every check, so a rejected call never
starts anything.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import selectors
import signal
import subprocess
import sys
import time
import traceback
import weakref
from typing import Any, Protocol

from codechat.eval.sandbox.protocol import HEADER, recv_msg, send_msg

_READ_CHUNK = 1 << 16  # bytes per os.read of a worker pipe
_MESSAGE_CHARS = 500  # longest exception text / parser reason quoted back to the model
_REPLY_SLACK_BYTES = 1 << 16  # a reply may exceed its escaped content by this (the envelope)
_ESCAPE_FACTOR = 6  # JSON escaping grows a character to at most 6 bytes (\uXXXX)


class _Limits(Protocol):
    """What :class:`_Worker` reads of a :class:`~.dispatch.DispatchLimits`."""

    max_output_bytes: int
    max_print_bytes: int
    memory_mb: int | None
    start_timeout_s: float


# ----------------------------------------------------------------------------- shared by both sides
def _describe(e: BaseException) -> str:
    """``Type: message`` cut to :data:`_MESSAGE_CHARS`, never raising."""
    try:
        text = str(e)
    except Exception:  # noqa: BLE001 - a hostile __str__
        text = "<unprintable>"
    out = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return out if len(out) <= _MESSAGE_CHARS else out[:_MESSAGE_CHARS] + "..."


def _frame(obj: Any) -> bytes:
    data = json.dumps(obj).encode()
    return HEADER.pack(len(data)) + data


# ----------------------------------------------------------------------------- the parent's side
_BOOT = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
         "from codechat.tools.worker import _worker_main; _worker_main(int(sys.argv[2]), json.loads(sys.argv[3]))")


class _Worker:
    """The caller's handle on one worker process: its pipes, and the wait loop of one request."""

    def __init__(self, limits: _Limits) -> None:
        self.limits = limits
        reply_r, reply_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, json.dumps(sys.path), str(reply_w), json.dumps(limits.memory_mb)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
                pass_fds=(reply_w,), start_new_session=True)
        except BaseException:
            os.close(reply_r)
            raise
        finally:
            os.close(reply_w)
        self.reply_fd = reply_r
        self.request_fd = self.proc.stdin.fileno()
        self.out_fd, self.err_fd = self.proc.stdout.fileno(), self.proc.stderr.fileno()
        for fd in (self.reply_fd, self.request_fd, self.out_fd, self.err_fd):
            os.set_blocking(fd, False)
        self.open_outputs = {self.out_fd, self.err_fd}  # not yet at EOF
        self._finalizer = weakref.finalize(self, _kill_group, self.proc)
        hello = self.exchange(None, limits.start_timeout_s)
        if hello.get("kind") != "hello":
            self.kill()
            raise RuntimeError(f"the tool worker did not start: {hello.get('error', hello)}"
                               + (f"\n{hello['stderr']}" if hello.get("stderr") else ""))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def exchange(self, request: Any, timeout_s: float) -> dict[str, Any]:
        """Send ``request`` (None: only wait for the hello) and wait for the reply.

        Returns the reply dict, or ``{"kind": "timeout" | "flood" | "dead" | "huge", ...}`` (the
        worker is then killed); ``"stdout"``/``"stderr"`` hold what it printed meanwhile.
        """
        limits = self.limits
        to_send = memoryview(b"" if request is None else _frame(request))
        captured = {self.out_fd: bytearray(), self.err_fd: bytearray()}
        reply = bytearray()
        body_len: int | None = None
        max_body = limits.max_output_bytes * _ESCAPE_FACTOR + _REPLY_SLACK_BYTES
        deadline = time.monotonic() + timeout_s
        sel = selectors.DefaultSelector()
        outcome: dict[str, Any] | None = None
        try:
            sel.register(self.reply_fd, selectors.EVENT_READ)
            for fd in self.open_outputs:
                sel.register(fd, selectors.EVENT_READ)
            if to_send:
                sel.register(self.request_fd, selectors.EVENT_WRITE)
            while outcome is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    outcome = {"kind": "timeout"}
                    break
                for key, _ in sel.select(left):
                    fd = key.fd
                    if fd == self.request_fd:
                        try:
                            to_send = to_send[os.write(fd, to_send[:_READ_CHUNK]):]
                        except BlockingIOError:
                            continue
                        except OSError:  # the worker is gone; its reply pipe will say so
                            to_send = memoryview(b"")
                        if not to_send:
                            sel.unregister(fd)
                    elif fd in captured:
                        if not self._read_output(fd, captured, sel):
                            outcome = {"kind": "flood"}
                            break
                    else:
                        try:
                            chunk = os.read(fd, _READ_CHUNK)
                        except BlockingIOError:
                            continue
                        if not chunk:
                            outcome = {"kind": "dead"}
                            break
                        reply += chunk
                        if body_len is None and len(reply) >= HEADER.size:
                            body_len = HEADER.unpack(reply[:HEADER.size])[0]
                            if body_len > max_body:
                                outcome = {"kind": "huge", "size": body_len}
                                break
                        if body_len is not None and len(reply) >= HEADER.size + body_len:
                            outcome = json.loads(bytes(reply[HEADER.size:HEADER.size + body_len]))
                            break
        finally:
            sel.close()
        if outcome["kind"] == "dead":  # keep what it printed before dying, then reap it
            self._drain(captured)
            outcome["status"] = self.kill()
        elif outcome["kind"] in ("timeout", "flood", "huge"):
            self.kill()  # stop it first: what is still in the pipes is dropped
        else:
            self._drain(captured)
        outcome["stdout"], outcome["stderr"] = (captured[fd].decode("utf-8", "replace")
                                                for fd in (self.out_fd, self.err_fd))
        return outcome

    def _read_output(self, fd: int, captured: dict[int, bytearray], sel: selectors.BaseSelector | None) -> bool:
        """Read what is there on an output pipe; False when the call printed too much."""
        while True:
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except BlockingIOError:
                return True
            except OSError:
                chunk = b""
            if not chunk:
                self.open_outputs.discard(fd)
                if sel is not None:
                    sel.unregister(fd)
                return True
            room = self.limits.max_print_bytes - sum(len(b) for b in captured.values())
            captured[fd] += chunk[:max(room, 0)]
            if len(chunk) > room:
                return False

    def _drain(self, captured: dict[int, bytearray]) -> None:
        """Collect output already in the pipes (the worker flushes before replying)."""
        for fd in list(self.open_outputs):
            self._read_output(fd, captured, None)

    def kill(self) -> int | None:
        """SIGKILL the worker's process group, reap it, close the pipes (once); its exit status
        (negative: the signal)."""
        self._finalizer.detach()
        _kill_group(self.proc)
        if self.reply_fd >= 0:
            for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                try:
                    f.close()
                except OSError:
                    pass
            os.close(self.reply_fd)
            self.reply_fd = -1  # never close a reused descriptor number twice
            self.open_outputs.clear()
        return self.proc.returncode

    def close(self) -> None:
        """Ask the worker to exit (EOF on its requests), then kill what is left."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=1.0)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker leads its own session and group
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


# ----------------------------------------------------------------------------- the child's side
def _worker_main(reply_fd: int, memory_mb: int | None) -> None:
    """The worker loop: requests on fd 0 (moved away), replies on ``reply_fd``; exits at EOF."""
    request_fd = os.dup(0)  # not inheritable: executors and their children cannot read requests
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.set_inheritable(reply_fd, False)
    if memory_mb is not None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    send_msg(reply_fd, {"kind": "hello", "pid": os.getpid()})
    loaded: dict[str, Any] = {}
    while True:
        request = recv_msg(request_fd)
        if request is None:
            return
        reply = _execute(request, loaded)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()  # everything printed is in the pipes before the reply
            except Exception:  # noqa: BLE001
                pass
        send_msg(reply_fd, reply)


def _where(e: BaseException) -> str:
    """``file:line in function`` of the innermost frame of ``e``'s traceback ('' if none)."""
    try:
        frame = traceback.extract_tb(e.__traceback__)[-1]
        return f"at {frame.filename}:{frame.lineno} in {frame.name}"
    except Exception:  # noqa: BLE001
        return ""


def _load(target: dict[str, Any], loaded: dict[str, Any]) -> Any:
    """The executor a target names, importing its file or module once per worker."""
    if "file" in target:
        path = target["file"]
        module = loaded.get(path)
        if module is None:
            name = "_codechat_tool_" + hashlib.sha1(path.encode()).hexdigest()[:12]
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot import {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            directory = os.path.dirname(path)
            if directory not in sys.path:
                sys.path.append(directory)  # its sibling modules, as for a script; never shadowing
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
            loaded[path] = module
    else:
        module = importlib.import_module(target["module"])
    obj = module
    for part in target["qualname"].split("."):
        obj = getattr(obj, part)
    return obj


def _execute(request: dict[str, Any], loaded: dict[str, Any]) -> dict[str, Any]:
    """Run one request; the reply dict (``kind`` says how it went)."""
    target = request["target"]
    try:
        fn = _load(target, loaded)
    except BaseException as e:  # noqa: BLE001 - SystemExit in an executors file too
        return {"kind": "load", "error": _describe(e), "where": _where(e)}
    args, kwargs = list(target["args"]), {**target["kwargs"], **request["arguments"]}
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have none: let the call say it
        signature = None
    if signature is not None:
        try:
            signature.bind(*args, **kwargs)
        except TypeError as e:
            return {"kind": "signature", "error": _describe(e).removeprefix("TypeError: ")}
    try:
        value = fn(*args, **kwargs)
    except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are the tool's too
        return {"kind": "raised", "error": _describe(e), "where": _where(e)}
    try:
        content = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        what = type(value).__name__
        what = f"a {what}" if not isinstance(value, (dict, list, tuple, float)) else f"a {what} ({_describe(e)})"
        return {"kind": "not_json", "error": what}
    try:
        size = len(content.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogates: escape them, so the content is valid UTF-8
        content = json.dumps(value, allow_nan=False)
        size = len(content)
    if size > request["max_output_bytes"]:
        return {"kind": "too_large", "size": size}
    return {"kind": "ok", "content": content}
