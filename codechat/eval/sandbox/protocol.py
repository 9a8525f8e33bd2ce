"""What the evaluator and the fork server share: limits, jobs, results, errors, message framing.

Standard library only, and no import of codechat: the fork server loads this file by path
(see :mod:`.server`).
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import asdict, dataclass
from typing import Any

STATUSES = ("passed", "failed", "error", "timeout", "memory", "syntax")
"""``ExecResult.status`` values. ``syntax``: empty or uncompilable program; ``error``,
``timeout``, ``memory``: the definitions did not finish (or, for the last two, a test did not);
``failed``: tests ran and at least one did not pass; ``passed``: every test passed."""

OUTCOMES = ("passed", "failed", "error", "timeout", "memory", "not_run")
"""``TestOutcome.outcome`` values: ``failed`` is a false assert, ``error`` any other exception
or a crash/early exit during the test, ``not_run`` a test never reached."""

PROTECTIONS: dict[str, str] = {
    # name -> what is NOT protected when it is missing (used in the warning)
    "pid_namespace": "programs can see and signal other processes of the sandbox user (the "
                     "evaluator too when that user is yours), and escaped descendants are only "
                     "hunted through a child subreaper",
    "network_namespace": "programs can open network connections",
    "readonly_filesystem": "programs can write anywhere the sandbox user may write",
    "private_tmp": "files written to /tmp, /var/tmp or /dev/shm are shared and outlive the run",
    "hidden_home": "programs can read your home directory (tokens, keys) if its mode allows",
    "separate_user": "programs run under the evaluator's uid and may read or signal what it can",
    "process_limit": "RLIMIT_NPROC does not bind (root), so fork bombs are limited only by the "
                     "deadline",
    "resource_limits": "no RLIMIT_AS/CPU/FSIZE/NOFILE: memory, CPU, output and file limits off",
}

IDLE_NAME = b"codechat-idle"  # process name of a pre-forked child waiting for its job
HEADER = struct.Struct(">I")  # length prefix of evaluator <-> fork-server messages


@dataclass(frozen=True)
class Limits:
    """Per-program limits besides ``timeout_s`` and ``memory_mb`` (which ``run`` takes)."""

    cpu_grace_s: int = 1  # RLIMIT_CPU = ceil(timeout_s) + this (the wall clock fires first)
    file_size_mb: int = 16  # RLIMIT_FSIZE: caps every file written, stdout/stderr captures too
    open_files: int = 64  # RLIMIT_NOFILE
    processes: int = 64  # RLIMIT_NPROC (tasks of the sandbox uid, threads included)
    output_tail_chars: int = 4096  # how much of the end of stdout/stderr is returned
    tmpfs_mb: int = 256  # size of each private /tmp, /var/tmp, /dev/shm (namespaces only)
    worker_grace_s: float = 10.0  # evaluator gives up on a silent fork server after deadline+this
    start_timeout_s: float = 60.0  # a fork server must say hello within this

    def __post_init__(self) -> None:
        for name in ("cpu_grace_s", "file_size_mb", "open_files", "processes", "output_tail_chars",
                     "tmpfs_mb"):
            if getattr(self, name) < 1:
                raise ValueError(f"Limits.{name} must be >= 1, got {getattr(self, name)}")
        if self.open_files < 16:
            raise ValueError("Limits.open_files must be >= 16: the interpreter itself needs some")


@dataclass(frozen=True)
class Job:
    """One program to judge: definitions, then ``tests`` in order, in one process."""

    program: str
    tests: tuple[str, ...] | list[str] = ()
    timeout_s: float = 10.0
    memory_mb: int = 1024

    def __post_init__(self) -> None:
        if not isinstance(self.program, str):
            raise TypeError(f"program must be a str, got {type(self.program).__name__}")
        tests = () if self.tests is None else tuple(self.tests)
        if not all(isinstance(t, str) for t in tests):
            raise TypeError("tests must be a list of str")
        object.__setattr__(self, "tests", tests)
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise ValueError(f"timeout_s must be a positive finite number, got {self.timeout_s}")
        if self.memory_mb < 16:
            raise ValueError(f"memory_mb must be >= 16, got {self.memory_mb}")


@dataclass(frozen=True)
class TestOutcome:
    """What happened to one test: ``outcome`` is one of :data:`OUTCOMES`."""

    __test__ = False  # not a pytest class

    index: int
    source: str
    outcome: str
    error: str = ""  # "AssertionError", "ZeroDivisionError: division by zero", "timeout", ...


@dataclass(frozen=True)
class ExecResult:
    """The verdict on one program.

    ``status`` is one of :data:`STATUSES`. ``definitions_ok`` says the program's top level ran
    to completion (tests can only run after it). ``tests_passed``/``tests_total`` count tests;
    a test that raised, failed, timed out or was never reached is not passed. ``stdout`` and
    ``stderr`` are the last ``Limits.output_tail_chars`` characters. ``wall_s`` is seconds from
    fork to verdict. ``returncode`` is the child's exit status, negative for a signal, ``None``
    when the harness finished and the child was reaped by the sandbox.
    """

    status: str
    tests_passed: int
    tests_total: int
    tests: tuple[TestOutcome, ...] = ()
    definitions_ok: bool = False
    stdout: str = ""
    stderr: str = ""
    wall_s: float = 0.0
    error: str = ""
    returncode: int | None = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExecResult:
        d = dict(d)
        d["tests"] = tuple(TestOutcome(**t) for t in d.get("tests", ()))
        return cls(**d)


class SandboxWarning(UserWarning):
    """Some isolation mechanism is unavailable; the message lists what is not protected."""


class SandboxError(RuntimeError):
    """The sandbox itself could not run (no fork server could start)."""


# ----------------------------------------------------------------------------- messages
def send_msg(fd: int, obj: Any) -> None:
    """Write ``obj`` to ``fd`` as JSON behind a 4-byte big-endian length (:data:`HEADER`)."""
    data = json.dumps(obj).encode()
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _recv_exact(fd: int, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def recv_msg(fd: int) -> Any:
    """The next message :func:`send_msg` wrote to ``fd``; ``None`` at EOF."""
    head = _recv_exact(fd, HEADER.size)
    if head is None:
        return None
    body = _recv_exact(fd, HEADER.unpack(head)[0])
    return None if body is None else json.loads(body)
