"""The harness that runs inside each forked child, and the parsing of what it reports.

:func:`run_and_report` runs a program's definitions, then each test, in the child's own
process and writes one line per event to fd 3; :func:`parse_reports` keeps the lines of the
watched child that carry the run's nonce, and :func:`assemble_result` turns them, with how the
child ended, into an :class:`~.protocol.ExecResult` dict.

Standard library only, and no import of codechat: the fork server loads this file by path
(see :mod:`.server`).
"""
from __future__ import annotations

import builtins
import os
import signal
import sys
from typing import Any, Sequence


def describe(e: BaseException) -> str:
    """``Type: message``, never raising (it may run the program's own __str__)."""
    try:
        name = type(e).__name__
        text = str(e)
    except BaseException:  # noqa: BLE001
        return "<unprintable exception>"
    return (f"{name}: {text}" if text else name)[:300]  # keeps a report line < PIPE_BUF


def run_and_report(program: str, tests: Sequence[str], nonce: str) -> None:
    """Run definitions then tests in this process; report through fd 3. Never returns.

    Every builtin the harness needs is bound to a local before the program runs, so patching
    ``os``, ``json`` or ``builtins`` from the program cannot change what is reported.
    """
    _exit, _write, _getpid, _compile, _exec = os._exit, os.write, os.getpid, compile, exec
    _isinstance, _len, _enumerate, _BaseException = isinstance, len, enumerate, BaseException
    out, err = sys.stdout, sys.stderr

    def line(kind: str, index: int, outcome: str, error: str = "") -> bytes:
        # the pid is read at send time: a forked copy of this harness reports under its own
        # pid, which the fork server ignores
        hexed = error.encode("utf-8", "replace").hex()
        return f"\n{nonce} {_getpid()} {kind} {index} {outcome} {hexed}\n".encode()

    def send(data: bytes) -> None:
        _write(3, data)

    def flush() -> None:
        for stream in (out, err):
            try:
                stream.flush()
            except _BaseException:  # noqa: BLE001
                pass

    def kind_of(e: BaseException) -> str:
        return ("failed" if _isinstance(e, AssertionError)
                else "memory" if _isinstance(e, MemoryError) else "error")

    try:
        import ast

        try:
            tree = _compile(program, "<program>", "exec", ast.PyCF_ONLY_AST, True)
            if not tree.body:
                raise SyntaxError("the program has no code")
            code = _compile(tree, "<program>", "exec", 0, True)
        except MemoryError as e:
            send(line("definitions", 0, "memory", describe(e)))
            _exit(0)
        except _BaseException as e:  # SyntaxError, ValueError (NUL bytes), RecursionError
            send(line("syntax", 0, "syntax", describe(e)))
            _exit(0)
        del tree
        # the builtins module itself, as a script's globals hold it
        env: dict[str, Any] = {"__name__": "__sandbox__", "__builtins__": builtins}
        try:
            _exec(code, env)
        except _BaseException as e:  # SystemExit and KeyboardInterrupt too
            flush()
            send(line("definitions", 0, kind_of(e), describe(e)))
            _exit(0)
        del code
        n = _len(tests)
        if n == 0:
            flush()
            send(line("definitions", 0, "ok") + line("done", n, "ok"))
            _exit(0)
        send(line("definitions", 0, "ok"))
        for i, test in _enumerate(tests):
            try:
                _exec(_compile(test, f"<test {i}>", "exec", 0, True), env)
                msg = line("test", i, "passed")
            except _BaseException as e:
                msg = line("test", i, kind_of(e), describe(e))
            if i == n - 1:  # the last report and "done" in one atomic write
                flush()
                msg += line("done", n, "ok")
            send(msg)
    except _BaseException:  # noqa: BLE001 - harness broken by the program: no pass
        _exit(113)
    _exit(0)


def parse_reports(raw: bytes, nonce: str, pid: int) -> list[tuple[str, int, str, str]]:
    """Report lines of the watched child carrying this run's nonce; anything else is ignored."""
    prefix = f"{nonce} {pid} "
    out = []
    for text in raw.decode("utf-8", "replace").split("\n"):
        if not text.startswith(prefix):
            continue
        parts = text[len(prefix):].split(" ")
        if len(parts) != 4 or not parts[1].isdigit():
            continue
        try:
            error = bytes.fromhex(parts[3]).decode("utf-8", "replace")
        except ValueError:
            continue
        out.append((parts[0], int(parts[1]), parts[2], error))
    return out


def assemble_result(job: dict[str, Any], ended: str, status: int | None,
              msgs: list[tuple[str, int, str, str]], wall: float) -> dict[str, Any]:
    """Turn reports + how the child ended into an ExecResult dict."""
    tests = job["tests"]
    n = len(tests)
    code = None
    if status is not None:
        code = (-os.WTERMSIG(status) if os.WIFSIGNALED(status)
                else os.WEXITSTATUS(status) if os.WIFEXITED(status) else None)
    if ended == "done":
        code = None  # we reaped it after the harness finished; its exit code is ours
    by_kind: dict[str, list[tuple[int, str, str]]] = {}
    for kind, index, outcome, error in msgs:
        by_kind.setdefault(kind, []).append((index, outcome, error))
    done = "done" in by_kind
    if ended == "deadline":
        death = ("timeout", "timeout")
    elif code is not None and code < 0:
        sig = -code
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        death = ("timeout", f"killed by {name} (CPU limit)") if sig == signal.SIGXCPU else (
            "error", f"killed by {name}")
    else:
        death = ("error", f"exited with status {code} before finishing")

    def result(status_: str, outcomes: list[tuple[str, str]], defs_ok: bool, error: str) -> dict:
        return {"status": status_, "tests_passed": sum(o == "passed" for o, _ in outcomes),
                "tests_total": n, "definitions_ok": defs_ok, "wall_s": round(wall, 6),
                "error": error, "returncode": code,
                "tests": [{"index": i, "source": t, "outcome": o, "error": e}
                          for i, (t, (o, e)) in enumerate(zip(tests, outcomes))]}

    not_run = [("not_run", "")] * n
    if "setup" in by_kind:
        return result("error", not_run, False, "sandbox setup failed: " + by_kind["setup"][0][2])
    if "syntax" in by_kind:
        return result("syntax", not_run, False, by_kind["syntax"][0][2])
    defs = by_kind.get("definitions", [])
    if not defs or defs[0][1] != "ok":
        if defs:  # the definitions raised
            outcome, error = defs[0][1], defs[0][2]
            return result("memory" if outcome == "memory" else "error", not_run, False, error)
        return result(death[0], not_run, False, death[1] + " (while running the definitions)")
    reported = {i: (o, e) for i, o, e in by_kind.get("test", []) if 0 <= i < n}
    outcomes: list[tuple[str, str]] = []
    blamed = done  # the first unreported test is the one running when the child died
    for i in range(n):
        if i in reported:
            outcomes.append(reported[i])
        elif not blamed:
            outcomes.append(death)
            blamed = True
        else:
            outcomes.append(("not_run", ""))
    if done and all(o == "passed" for o, _ in outcomes):
        return result("passed", outcomes, True, "")
    kinds = {o for o, _ in outcomes}
    status_ = "timeout" if "timeout" in kinds else "memory" if "memory" in kinds else "failed"
    first_bad = next(f"test {i}: {o}" + (f" ({e})" if e and e != o else "")
                     for i, (o, e) in enumerate(outcomes) if o != "passed")
    return result(status_, outcomes, True, first_bad)

