"""The evaluator's side: a pool of fork servers, and the public :func:`run` / :func:`run_many`.

:class:`Sandbox` keeps ``workers`` fork servers (:mod:`.server`), each behind a
:class:`_Worker` that starts it (through ``unshare`` when :func:`_launcher` finds that it
works), sends it jobs and restarts it if it dies. The module-level :func:`run`,
:func:`run_many` and :func:`protections` share one pool per process, closed at exit.
"""
from __future__ import annotations

import atexit
import json
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
import weakref
from dataclasses import asdict
from typing import Any, Callable, Iterable, Sequence

from . import server
from .linux import children
from .protocol import (HEADER, IDLE_NAME, PROTECTIONS, ExecResult, Job, Limits, SandboxError,
                       SandboxWarning, TestOutcome, send_msg)

try:  # POSIX only; the sandbox refuses to start without it.
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None  # type: ignore[assignment]

_SERVER = os.path.abspath(server.__file__)  # run as a script: ``python -I -B server.py --serve``
_MODE_CACHE: dict[str, list[str] | None] = {}
_WARNED: set[frozenset[str]] = set()
_SANDBOXES: "weakref.WeakSet[Sandbox]" = weakref.WeakSet()


def _mode_key(isolation: str) -> str:
    return "root" if os.geteuid() == 0 and isolation != "userns" else "user"


def _launcher(isolation: str) -> tuple[list[str] | None, bool]:
    """The ``unshare`` prefix that works here (probed once), and whether it adds a user ns."""
    if isolation == "none" or not sys.platform.startswith("linux"):
        return None, False
    key = _mode_key(isolation)
    if key not in _MODE_CACHE:
        exe = shutil.which("unshare") or next(
            (p for p in ("/usr/bin/unshare", "/bin/unshare") if os.path.exists(p)), None)
        cmd = None
        if exe:
            base = [exe, "--pid", "--fork", "--kill-child", "--net", "--mount", "--mount-proc",
                    "--propagation", "private"]
            if key == "user":
                base[1:1] = ["--user", "--map-root-user"]
            try:
                ok = subprocess.run(base + ["true"], capture_output=True,
                                    timeout=10).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
            cmd = base if ok else None
        _MODE_CACHE[key] = cmd
    cmd = _MODE_CACHE[key]
    return cmd, cmd is not None and key == "user"


class _Worker:
    """Evaluator-side handle on one fork server process."""

    def __init__(self, limits: Limits, isolation: str, drop_privileges: bool) -> None:
        self.limits, self.isolation, self.drop = limits, isolation, drop_privileges
        self.proc: subprocess.Popen | None = None
        self.launched = False  # started through unshare (the fork server is its child)
        self.scratch: str | None = None
        self.protections: dict[str, bool] = {}
        self.start()

    def start(self) -> None:
        prefix, user_ns = _launcher(self.isolation)
        try:
            self._spawn(prefix, user_ns)
        except SandboxError as e:
            if prefix is None:
                raise
            # namespaces probed fine but the fork server could not set itself up in them
            print(f"codechat.eval.sandbox: {e}; falling back to plain processes", file=sys.stderr)
            _MODE_CACHE[_mode_key(self.isolation)] = None
            self._spawn(None, False)

    def _spawn(self, prefix: list[str] | None, user_ns: bool) -> None:
        homes = sorted({os.path.expanduser("~"), os.environ.get("HOME", "")} - {""})
        cfg = {"limits": asdict(self.limits), "mount_ns": prefix is not None,
               "net_ns": prefix is not None, "user_ns": user_ns, "homes": homes,
               "drop_privileges": self.drop, "evaluator_uid": os.geteuid()}
        cmd = (prefix or []) + [sys.executable, "-I", "-B", _SERVER,
                                "--serve", json.dumps(cfg)]
        self.launched = prefix is not None
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     bufsize=0, cwd="/", start_new_session=True, close_fds=True,
                                     env={"PATH": "/usr/local/bin:/usr/bin:/bin",
                                          "LANG": "C.UTF-8"})
        hello = self._recv(time.monotonic() + self.limits.start_timeout_s)
        if not isinstance(hello, dict) or not hello.get("hello"):
            self.kill()
            raise SandboxError(f"fork server did not start (command: {' '.join(cmd[:12])} ...)")
        self.protections = hello["protections"]
        self.scratch = hello.get("scratch")  # host dir to remove if the server dies

    def _recv(self, deadline: float) -> Any:
        fd = self.proc.stdout.fileno()
        buf = b""
        need = HEADER.size
        body_len = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, need - len(buf))
            if not chunk:
                return None
            buf += chunk
            if len(buf) == need:
                if body_len is None:
                    body_len = HEADER.unpack(buf)[0]
                    buf, need = b"", body_len
                    if need == 0:
                        return None
                else:
                    return json.loads(buf)

    def execute(self, job: Job) -> ExecResult:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        msg = {"program": job.program, "tests": list(job.tests), "timeout_s": job.timeout_s,
               "memory_mb": job.memory_mb}
        try:
            send_msg(self.proc.stdin.fileno(), msg)
            reply = self._recv(time.monotonic() + job.timeout_s + self.limits.worker_grace_s)
        except OSError:
            reply = None
        if reply is None:  # the fork server died (or hung): the program is to blame
            self.kill()
            return ExecResult("error", 0, len(job.tests), tuple(
                TestOutcome(i, t, "not_run") for i, t in enumerate(job.tests)),
                error="the sandbox worker died or hung while running this program; restarted")
        return ExecResult.from_dict(reply)

    def pids(self) -> list[int]:
        """Host pids of this worker's own processes: launcher, fork server, and the idle
        pre-forked child (named ``codechat-idle``) waiting for the next program."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        pids = [self.proc.pid]
        if self.launched:
            pids += children(self.proc.pid)
        for parent in list(pids):
            for child in children(parent):
                try:
                    with open(f"/proc/{child}/comm", "rb") as f:
                        if f.read().strip() == IDLE_NAME:
                            pids.append(child)
                except OSError:
                    pass
        return pids

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None:  # not reaped yet, so its group id is still ours
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self.proc = None
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()  # EOF: the server exits, its namespace dies with it
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class Sandbox:
    """A pool of fork servers. Use it as a context manager, or the module-level ``run``.

    ``isolation="auto"`` uses namespaces when the kernel allows them (as root: PID, network
    and mount namespaces, programs run as ``nobody``; otherwise inside a user namespace too),
    ``"userns"`` forces the user-namespace path (what a non-root evaluator gets), ``"none"``
    uses plain processes (what macOS or a locked-down container gets; for tests of the
    fallback). ``drop_privileges`` runs programs as ``nobody`` when the evaluator is root.
    """

    def __init__(self, workers: int = 1, *, limits: Limits | None = None,
                 isolation: str = "auto", drop_privileges: bool = True) -> None:
        if isolation not in ("auto", "userns", "none"):
            raise ValueError(f"isolation must be 'auto', 'userns' or 'none', got {isolation!r}")
        if resource is None:
            raise SandboxError("codechat.eval.sandbox needs a POSIX system (the resource module)")
        self.limits = limits or Limits()
        self.isolation, self.drop_privileges = isolation, drop_privileges
        self._workers: list[_Worker] = []
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._lock = threading.Lock()
        _SANDBOXES.add(self)
        self.ensure_workers(workers)

    def ensure_workers(self, n: int) -> None:
        """Grow the pool to at least ``n`` fork servers."""
        if n < 1:
            raise ValueError(f"workers must be >= 1, got {n}")
        with self._lock:
            while len(self._workers) < n:
                w = _Worker(self.limits, self.isolation, self.drop_privileges)
                self._workers.append(w)
                self._idle.put(w)
        self._warn()

    @property
    def protections(self) -> dict[str, bool]:
        """Which mechanisms are active (the weakest worker's view)."""
        prot = {k: True for k in PROTECTIONS}
        for w in self._workers:
            for k in PROTECTIONS:
                prot[k] = prot[k] and bool(w.protections.get(k))
        return prot

    def _warn(self) -> None:
        missing = frozenset(k for k, v in self.protections.items() if not v)
        if missing and missing not in _WARNED:
            _WARNED.add(missing)
            lines = "\n".join(f"  - {k}: {PROTECTIONS[k]}" for k in PROTECTIONS if k in missing)
            fix = ("isolation='none' was requested" if self.isolation == "none" else
                   "run as root, or enable unprivileged user namespaces (sysctl "
                   "kernel.unprivileged_userns_clone=1 / user.max_user_namespaces) on Linux")
            warnings.warn(SandboxWarning(
                "codechat.eval.sandbox is running WITHOUT some isolation on this machine; NOT "
                f"protected:\n{lines}\nFor full isolation: {fix}."), stacklevel=_caller_level())

    def run(self, program: str, tests: Sequence[str] | None = None, *, timeout_s: float = 10.0,
            memory_mb: int = 1024) -> ExecResult:
        """Judge one program; see :func:`run`."""
        return self._execute(Job(program, tests or (), timeout_s, memory_mb))

    def _execute(self, job: Job) -> ExecResult:
        w = self._idle.get()
        try:
            return w.execute(job)
        finally:
            self._idle.put(w)

    def run_many(self, jobs: Iterable[Job | tuple[str, Sequence[str]]], *,
                 workers: int | None = None, timeout_s: float = 10.0, memory_mb: int = 1024,
                 callback: Callable[[int, ExecResult], None] | None = None) -> list[ExecResult]:
        """Judge many programs, ``workers`` at a time; results in input order.

        ``jobs`` are :class:`Job` or ``(program, tests)`` pairs (those get ``timeout_s`` and
        ``memory_mb``). ``callback(index, result)`` is called as each finishes (from a pool
        thread), e.g. to append to a JSONL file so an interrupted run can resume.
        """
        items = [j if isinstance(j, Job) else Job(j[0], j[1] or (), timeout_s, memory_mb)
                 for j in jobs]
        workers = workers or len(self._workers)
        self.ensure_workers(workers)
        results: list[ExecResult | None] = [None] * len(items)
        it = iter(range(len(items)))
        lock = threading.Lock()
        errors: list[BaseException] = []

        def loop() -> None:
            while not errors:
                with lock:
                    i = next(it, None)
                if i is None:
                    return
                try:
                    results[i] = self._execute(items[i])
                    if callback is not None:
                        callback(i, results[i])
                except BaseException as e:  # noqa: BLE001 - re-raised in the caller
                    errors.append(e)

        threads = [threading.Thread(target=loop, daemon=True)
                   for _ in range(min(workers, max(1, len(items))))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results  # type: ignore[return-value]

    def worker_pids(self) -> list[int]:
        """Host pids of the pool's own processes (to tell them from leftovers in tests)."""
        return [p for w in self._workers for p in w.pids()]

    def close(self) -> None:
        with self._lock:
            for w in self._workers:
                w.close()
            self._workers.clear()
            self._idle = queue.Queue()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _caller_level() -> int:
    """``stacklevel`` that points a warning at the first frame outside this module."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    return level


_shared: Sandbox | None = None
_shared_lock = threading.Lock()


def _get_shared(workers: int = 1) -> Sandbox:
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Sandbox(workers)
            atexit.register(_shared.close)
    _shared.ensure_workers(workers)
    return _shared


def run(program: str, tests: Sequence[str] | None = None, *, timeout_s: float = 10.0,
        memory_mb: int = 1024) -> ExecResult:
    """Run ``program``'s definitions, then each test in order, in one sandboxed process.

    Args:
        program: Python source; it runs with ``__name__ == "__sandbox__"`` (so a
            ``if __name__ == "__main__":`` block does not run).
        tests: Python statements (usually ``assert``s) run one by one in the program's globals;
            ``None`` or empty just runs the program (``passed`` when it completes).
        timeout_s: wall-clock limit for the whole run, in seconds.
        memory_mb: address-space limit of each process (``RLIMIT_AS``), MiB.

    Returns:
        An :class:`ExecResult`; ``status == "passed"`` only when the harness reported that the
        last test finished and every test passed.
    """
    return _get_shared(1).run(program, tests, timeout_s=timeout_s, memory_mb=memory_mb)


def run_many(jobs: Iterable[Job | tuple[str, Sequence[str]]], workers: int = 2, *,
             timeout_s: float = 10.0, memory_mb: int = 1024,
             callback: Callable[[int, ExecResult], None] | None = None) -> list[ExecResult]:
    """Run many programs with at most ``workers`` in flight; see :meth:`Sandbox.run_many`."""
    return _get_shared(workers).run_many(jobs, workers=workers, timeout_s=timeout_s,
                                         memory_mb=memory_mb, callback=callback)


def protections() -> dict[str, bool]:
    """Which isolation mechanisms are active on this machine (starts a worker if needed)."""
    return _get_shared(1).protections
