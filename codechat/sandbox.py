"""Run untrusted, model-written Python programs against tests: fast, isolated, unforgeable.

``run(program, tests)`` executes the program's definitions, then each test in order, in one
child process, and returns an :class:`ExecResult`. ``run_many(jobs, workers=N)`` does the
same for many programs with N programs in flight at once. Only the standard library is used.

How it works
------------
Each worker is a *fork server*: a warm Python interpreter (``python -I -B sandbox.py --serve``)
that preloads the common standard-library modules and forks one child per program, so a
program costs a ``fork`` rather than an interpreter start; the next child is forked while the
evaluator reads the previous result. Where the kernel allows it the fork server is started by
``unshare`` in fresh PID, network and mount namespaces, and is PID 1 of its namespace. For
every program it:

1. creates a fresh working directory (``HOME`` and ``TMPDIR`` point there) and removes it after;
2. forks a child that starts a new session, closes every inherited descriptor, redirects stdin
   to ``/dev/null`` and stdout/stderr to files outside the working directory, scrubs the
   environment, sets ``RLIMIT_AS`` (``memory_mb``), ``RLIMIT_CPU``, ``RLIMIT_FSIZE``,
   ``RLIMIT_NOFILE``, ``RLIMIT_NPROC`` and ``RLIMIT_CORE=0``, drops every capability and sets
   ``no_new_privs``; as root it also switches to an unprivileged uid (``nobody``);
3. runs the program's definitions (``__name__ == "__sandbox__"``), then each test in order,
   in that child, and reports over an inherited pipe: every line carries a per-run random
   nonce (sent to the child with the job, never part of the program's source) and the pid of
   the reporting process. A pass is counted only when the harness reports, in the same atomic
   write as the last test's outcome, that the last test finished; exiting early with status 0
   (``sys.exit``, ``os._exit``, ``SystemExit``, ``KeyboardInterrupt``), printing something,
   or a forked copy of the harness never counts;
4. kills the child at the wall-clock deadline and, whatever happened, then kills *everything*
   the program started: ``kill(-1, SIGKILL)`` inside its own PID namespace (nothing can escape
   it), or, without namespaces, the child's session and every descendant found through
   ``PR_SET_CHILD_SUBREAPER``.

In the mount namespace the whole filesystem is read-only, ``/tmp``, ``/var/tmp`` and
``/dev/shm`` are private size-limited tmpfs mounts emptied after every program, and the home
directories (``/root`` and the evaluator's ``$HOME``) are hidden behind empty tmpfs mounts,
except for the paths the interpreter needs (a pyenv interpreter under ``/root`` stays
importable). The network namespace has only a loopback device, which is down.

Which namespaces: as root, ``unshare --pid --net --mount`` and programs run as ``nobody``; as
any other user, the same inside a user namespace (``--user --map-root-user``), where programs
run as your own uid with every capability dropped. ``Sandbox(isolation="userns")`` forces the
latter and ``isolation="none"`` the plain-process fallback, so both paths are testable as root.

What it protects against (with namespaces; ``protections()`` says what is active)
-------------------------------------------------------------------------------
- Forged passes by early exit, exit status, printed markers, and forked copies of the harness.
- Infinite loops, also inside one C call (``sum(range(10**13))``): hard kill on wall clock.
- Memory bombs (``MemoryError`` under ``RLIMIT_AS``), output floods (``RLIMIT_FSIZE`` on the
  capture files, tails returned), fork bombs (``RLIMIT_NPROC``, which binds because the program
  is not root), file-descriptor exhaustion.
- Orphans, daemons, double-forked ``setsid`` children, lingering threads: killed with the
  namespace after every program; no process outlives the result.
- Killing the evaluator or its parent (``kill(getppid())``, ``killpg(0)``, ``kill(-1)``): the
  evaluator is not addressable from inside the PID namespace, and the fork server is its init.
- Writing outside the working directory (read-only filesystem), reading secrets from the
  environment (scrubbed) or the home directory (hidden), network access (empty namespace).
- Pickling tricks: results travel as text lines and JSON; nothing from a child is unpickled.

What it does NOT protect against (it is not a VM)
-------------------------------------------------
- Kernel exploits: the program shares the host kernel. There is no seccomp filter.
- A deliberately adversarial program that introspects the harness in its own process (frames,
  ``gc``, ``ctypes``) can find the nonce and forge a report; the nonce defeats accidental and
  exit-code based hacks, not a targeted attack on the harness.
- Semantic hacks inside the tests' namespace: objects whose ``__eq__`` always returns True,
  shadowing builtins used by the asserts. Tests run in the program's globals by design.
- World-readable files outside the hidden home directories stay readable.
- ``memory_mb`` is per process (``RLIMIT_AS``), so a program may use up to
  ``Limits.processes * memory_mb`` in total; the tmpfs mounts also take memory.
- ``RLIMIT_NPROC`` counts every process of the sandbox user, so a fork bomb in one worker can
  briefly stop programs in other workers from forking. It does not bind for uid 0, so a root
  evaluator whose interpreter ``nobody`` cannot reach (and no mount namespace to fix that)
  runs programs as root without capabilities and without a process cap (warned).
- CPU share and disk bandwidth: no cgroup; a program may use a whole core until its deadline.
- Without namespaces (macOS, containers without ``unshare``) most of the above degrades: a loud
  :class:`SandboxWarning` (once per process) lists exactly what is not protected.
"""
from __future__ import annotations

import atexit
import fcntl
import json
import math
import os
import queue
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Sequence

try:  # POSIX only; the sandbox refuses to start without it.
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None  # type: ignore[assignment]

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
_HEADER = struct.Struct(">I")  # length prefix of evaluator <-> fork-server messages
_NOBODY = 65534
_PRELOAD = (  # imported once in the fork server, so programs do not pay for them
    "ast", "array", "bisect", "cmath", "collections", "collections.abc", "copy", "dataclasses",
    "datetime", "decimal", "enum", "fractions", "functools", "hashlib", "heapq", "itertools",
    "json", "math", "numbers", "operator", "random", "re", "statistics", "string", "struct",
    "sys", "textwrap", "typing", "unicodedata",
)


# ----------------------------------------------------------------------------- config
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


# ============================================================================ fork server
# Everything below down to the client section runs inside the fork server (``--serve``), which
# is this file executed as a script: it must not import codechat or anything outside the stdlib.

def _send_msg(fd: int, obj: Any) -> None:
    data = json.dumps(obj).encode()
    view = memoryview(_HEADER.pack(len(data)) + data)
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


def _recv_msg(fd: int) -> Any:
    head = _recv_exact(fd, _HEADER.size)
    if head is None:
        return None
    body = _recv_exact(fd, _HEADER.unpack(head)[0])
    return None if body is None else json.loads(body)


class _Libc:
    """The few Linux syscalls the stdlib does not expose (ctypes; absent elsewhere)."""

    PR_SET_PDEATHSIG, PR_SET_NAME, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 1, 15, 38, 24
    PR_SET_CHILD_SUBREAPER = 36
    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
    MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 21
    MNT_DETACH, AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = 2, -100, 0x8000, 1
    SYS_MOUNT_SETATTR = 442  # the same number on x86_64 and arm64

    def __init__(self) -> None:
        import ctypes

        self.ct = ctypes
        self.lib = ctypes.CDLL(None, use_errno=True)
        self.lib.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
        self.lib.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        self.lib.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4

        class MountAttr(ctypes.Structure):
            _fields_ = [(n, ctypes.c_uint64) for n in ("set", "clr", "propagation", "userns_fd")]

        class CapHeader(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        self.MountAttr = MountAttr
        self.cap_header = CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
        self.cap_data = (ctypes.c_uint32 * 6)()  # two zeroed {effective, permitted, inheritable}

    def _check(self, ret: int, what: str) -> None:
        if ret != 0:
            err = self.ct.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def prctl(self, option: int, arg: int = 0) -> None:
        self._check(self.lib.prctl(option, arg, 0, 0, 0), f"prctl({option})")

    def set_name(self, name: bytes) -> None:
        """The process name shown by ps and /proc/PID/comm (15 bytes at most)."""
        buf = self.ct.create_string_buffer(name[:15])
        self.lib.prctl(self.PR_SET_NAME, self.ct.addressof(buf), 0, 0, 0)

    def mount(self, src: str | None, target: str, fstype: str | None, flags: int,
              data: str | None = None) -> None:
        enc = (lambda s: None if s is None else s.encode())
        self._check(self.lib.mount(enc(src), enc(target), enc(fstype), flags, enc(data)),
                    f"mount {target}")

    def umount(self, target: str) -> None:
        self._check(self.lib.umount2(target.encode(), self.MNT_DETACH), f"umount {target}")

    def make_readonly(self, path: str) -> None:
        """Recursively read-only from ``path`` down (mount_setattr, Linux >= 5.12)."""
        attr = self.MountAttr(self.MOUNT_ATTR_RDONLY, 0, 0, 0)
        self._check(self.lib.syscall(self.SYS_MOUNT_SETATTR, self.AT_FDCWD, path.encode(),
                                     self.AT_RECURSIVE, self.ct.byref(attr),
                                     self.ct.sizeof(attr)), f"mount_setattr {path}")

    def drop_capabilities(self) -> None:
        """Empty the bounding set, then the effective/permitted/inheritable sets."""
        for cap in range(64):
            if self.lib.prctl(self.PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                break  # EINVAL past the last capability
        self._check(self.lib.capset(self.ct.byref(self.cap_header), self.cap_data), "capset")


def _traversable(path: str, uid: int, gid: int) -> bool:
    """Can ``uid`` reach ``path`` (x on every ancestor, r+x on the directory itself)?"""
    import stat as st

    parts = os.path.realpath(path).split("/")[1:]
    cur = "/"
    for i, part in enumerate([""] + parts):
        cur = os.path.join(cur, part) if part else cur
        try:
            s = os.stat(cur)
        except OSError:
            return False
        if uid == 0 or not st.S_ISDIR(s.st_mode):
            continue
        shift = 6 if s.st_uid == uid else 3 if s.st_gid == gid else 0
        need = 0o1 | (0o4 if i == len(parts) else 0)
        if (s.st_mode >> shift) & need != need:
            return False
    return True


def _needed_paths() -> list[str]:
    """Directories the forked programs must still be able to import from."""
    cands = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable))] + sys.path
    out = []
    for p in cands:
        if p and os.path.exists(p):
            for q in {os.path.abspath(p), os.path.realpath(p)}:
                if q not in out:
                    out.append(q)
    return out


def _hide_dirs(libc: _Libc, hidden: list[str], needed: list[str], stash: str) -> list[str]:
    """Cover each dir in ``hidden`` with an empty tmpfs, re-binding the children on the way to
    ``needed`` paths. Deepest first, so outer binds carry inner covers (MS_REC). Returns the
    dirs actually hidden."""
    done = []
    for n, h in enumerate(sorted(hidden, key=lambda p: -p.count("/"))):
        under = [os.path.relpath(p, h) for p in needed if p == h or p.startswith(h + "/")]
        if "." in under:
            continue  # the dir itself is needed
        keep = sorted({u.split("/")[0] for u in under})
        saved = []
        for i, k in enumerate(keep):
            src, tmp = os.path.join(h, k), os.path.join(stash, f"{n}-{i}")
            if os.path.isdir(src):
                os.mkdir(tmp)
            else:
                open(tmp, "w").close()
            libc.mount(src, tmp, None, libc.MS_BIND | libc.MS_REC)
            saved.append((k, tmp))
        libc.mount("tmpfs", h, "tmpfs", libc.MS_NOSUID | libc.MS_NODEV, "mode=0755,size=1m")
        for k, tmp in saved:
            dst = os.path.join(h, k)
            if os.path.isdir(tmp):
                os.mkdir(dst)
            else:
                open(dst, "w").close()
            libc.mount(tmp, dst, None, libc.MS_BIND | libc.MS_REC)
            libc.umount(tmp)
        done.append(h)
    return done


def _network_unreachable() -> bool:
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: a route lookup, no packet is sent
        return False
    except OSError:
        return True
    finally:
        s.close()


class _Server:
    """State of one fork server: where programs run, as whom, and what is protected."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.limits = Limits(**cfg["limits"])
        self.linux = sys.platform.startswith("linux")
        self.libc = _Libc() if self.linux else None
        self.init = os.getpid() == 1  # PID 1 of our own namespace: kill(-1) is scoped to it
        self.uid = self.gid = None  # switch to this uid in children (root only)
        self.counter = 0
        self.pending: tuple[int, int, int, str] | None = None  # pre-forked child
        prot = {k: False for k in PROTECTIONS}
        prot["pid_namespace"] = self.init
        prot["resource_limits"] = resource is not None
        if self.linux and not self.init:
            try:
                self.libc.prctl(_Libc.PR_SET_CHILD_SUBREAPER, 1)  # orphans come back to us
            except OSError:
                pass
        if cfg["mount_ns"]:
            self.base = "/tmp"
            self._setup_mounts(cfg, prot)
        else:
            self.base = tempfile.mkdtemp(prefix="codechat-sandbox-")
        if self.linux:
            prot["network_namespace"] = cfg["net_ns"] and _network_unreachable()
        self.outdir = os.path.join(self.base, ".capture")
        os.makedirs(self.outdir, mode=0o700, exist_ok=True)
        if os.geteuid() == 0 and cfg["drop_privileges"] and not cfg["user_ns"]:
            if all(_traversable(p, _NOBODY, _NOBODY) for p in _needed_paths()):
                self.uid = self.gid = _NOBODY
        # the uid the kernel sees for a program (outside any user namespace)
        outer = (self.uid if self.uid is not None
                 else cfg["evaluator_uid"] if cfg["user_ns"] else os.geteuid())
        prot["separate_user"] = outer != cfg["evaluator_uid"]
        prot["process_limit"] = prot["resource_limits"] and outer != 0  # root is exempt
        self.protections = prot

    def _setup_mounts(self, cfg: dict[str, Any], prot: dict[str, bool]) -> None:
        libc, size = self.libc, self.limits.tmpfs_mb
        tmpfs_opts = f"mode=1777,size={size}m,nr_inodes=65536"
        stash = "/tmp"
        try:
            libc.mount("tmpfs", stash, "tmpfs", 0, "mode=0700,size=1m")
            homes = {h for h in cfg["homes"] + ["/root"] if h and h != "/" and os.path.isdir(h)}
            needed = _needed_paths()
            if os.geteuid() == 0 and cfg["drop_privileges"] and not cfg["user_ns"]:
                for p in needed:  # dirs the unprivileged user could not traverse
                    cur = "/"
                    for part in os.path.realpath(p).split("/")[1:]:
                        cur = os.path.join(cur, part)
                        if os.path.isdir(cur) and not _traversable(cur, _NOBODY, _NOBODY):
                            homes.add(cur)
                            break
            hidden = _hide_dirs(libc, sorted(homes), needed, stash)
            prot["hidden_home"] = all(h in hidden for h in homes if not any(
                p == h for p in needed))
            libc.umount(stash)
        except OSError as e:
            print(f"codechat.sandbox: could not hide home directories: {e}", file=sys.stderr)
        try:
            try:
                libc.make_readonly("/")
            except OSError:
                self._remount_all_readonly()
            prot["readonly_filesystem"] = True
        except OSError as e:
            print(f"codechat.sandbox: could not make the filesystem read-only: {e}",
                  file=sys.stderr)
        private = True
        for d in ("/tmp", "/var/tmp", "/dev/shm"):
            if os.path.isdir(d):
                try:
                    libc.mount("tmpfs", d, "tmpfs", libc.MS_NOSUID | libc.MS_NODEV, tmpfs_opts)
                except OSError as e:
                    private = private and d != "/tmp"
                    print(f"codechat.sandbox: no private {d}: {e}", file=sys.stderr)
        prot["private_tmp"] = private

    def _remount_all_readonly(self) -> None:
        """Fallback for kernels without mount_setattr: remount each mount read-only."""
        libc = self.libc
        flag_of = {"nosuid": libc.MS_NOSUID, "nodev": libc.MS_NODEV, "noexec": libc.MS_NOEXEC,
                   "noatime": libc.MS_NOATIME, "nodiratime": libc.MS_NODIRATIME,
                   "relatime": libc.MS_RELATIME}
        with open("/proc/self/mountinfo") as f:
            rows = [line.split() for line in f]
        for row in rows:
            point = row[4].encode().decode("unicode_escape")
            flags = libc.MS_REMOUNT | libc.MS_BIND | libc.MS_RDONLY
            for opt in row[5].split(","):
                flags |= flag_of.get(opt, 0)
            libc.mount(None, point, None, flags)

    # ------------------------------------------------------------------ one program
    def prefork(self) -> None:
        """Fork the next child now, so that its fork and set-up overlap the evaluator's round
        trip; it waits on a pipe for its job. Called only after the previous program's
        processes were all killed (``kill(-1)`` would take this one too)."""
        self.counter += 1
        workdir = os.path.join(self.base, f"run-{self.counter}")
        os.mkdir(workdir, 0o700)
        if self.uid is not None:
            os.chown(workdir, self.uid, self.gid)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        out_fd = os.open(os.path.join(self.outdir, "stdout"), flags, 0o600)
        err_fd = os.open(os.path.join(self.outdir, "stderr"), flags, 0o600)
        null_fd = os.open(os.devnull, os.O_RDWR)
        r, w = os.pipe()  # reports, child -> us
        job_r, job_w = os.pipe()  # the job, us -> child
        pid = os.fork()
        if pid == 0:  # the child never returns from here
            _child(self, workdir, [null_fd, out_fd, err_fd, w, job_r])
        for fd in (w, out_fd, err_fd, null_fd, job_r):
            os.close(fd)
        self.pending = (pid, r, job_w, workdir)

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        """Judge one program in the pre-forked child; returns an ExecResult dict."""
        if self.pending is None:
            self.prefork()
        pid, r, job_w, workdir = self.pending
        self.pending = None
        nonce = os.urandom(16).hex()
        t0 = time.monotonic()
        try:
            _send_msg(job_w, {"job": job, "nonce": nonce})
        except OSError:  # the child died before its job (e.g. killed from outside)
            pass
        os.close(job_w)
        ended, raw = self._wait(pid, r, nonce, t0 + job["timeout_s"])
        wall = time.monotonic() - t0
        os.close(r)
        status = self._finish(pid)
        result = _assemble(job, ended, status, _parse(raw, nonce, pid), wall)
        result["stdout"] = _tail(os.path.join(self.outdir, "stdout"),
                                 self.limits.output_tail_chars)
        result["stderr"] = _tail(os.path.join(self.outdir, "stderr"),
                                 self.limits.output_tail_chars)
        self._clean(workdir)
        return result

    def _wait(self, pid: int, r: int, nonce: str, deadline: float) -> tuple[str, bytes]:
        """Wait until the child reports done, exits, or passes the deadline; do not reap it.

        Returns how it ended ("done" | "exited" | "deadline") and the bytes read from the
        report pipe. The child stays a zombie until :meth:`_finish`, so its pid (and process
        group id) cannot be reused while we kill what it left behind."""
        done_marker = f"{nonce} {pid} done".encode()
        raw = bytearray()
        os.set_blocking(r, False)
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None
        watch = [r] + ([pidfd] if pidfd is not None else [])
        ended = "deadline"
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                ready = select.select(watch, [], [], left if pidfd is not None
                                      else min(left, 0.005))[0]
                if r in ready:
                    if _read_available(r, raw):  # EOF: every copy of the write end closed
                        watch.remove(r)
                    if done_marker in raw:
                        ended = "done"
                        break
                if pidfd is not None and pidfd in ready:
                    ended = "exited"
                    break
                if pidfd is None and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG
                                               | os.WNOWAIT) is not None:
                    ended = "exited"
                    break
        finally:
            if pidfd is not None:
                os.close(pidfd)
        _read_available(r, raw)  # whatever it wrote before it ended
        if ended == "exited" and done_marker in raw:
            ended = "done"
        return ended, bytes(raw)

    def _finish(self, pid: int) -> int:
        """SIGKILL everything the program started, reap it all; return the child's status."""
        status = None
        t_end = time.monotonic() + 5.0
        while True:
            if self.init:
                try:
                    os.kill(-1, signal.SIGKILL)  # everyone in our namespace but us
                except ProcessLookupError:
                    pass
            else:  # the child's group and session, then whatever was re-parented to us
                for target in [pid] + _children(os.getpid()):
                    for kill in (os.killpg, os.kill):
                        try:
                            kill(target, signal.SIGKILL)
                        except (ProcessLookupError, PermissionError):
                            pass
            if status is None:
                status = os.waitpid(pid, 0)[1]
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                return status
            if time.monotonic() > t_end:
                return status
            time.sleep(0.001)

    def _clean(self, workdir: str) -> None:
        shutil.rmtree(workdir, ignore_errors=True)
        if self.init and self.protections["private_tmp"]:  # private tmpfs: empty it all
            for d in ("/tmp", "/var/tmp", "/dev/shm"):
                try:
                    names = os.listdir(d)
                except OSError:
                    continue
                for name in names:
                    p = os.path.join(d, name)
                    if p == self.outdir:
                        continue
                    if os.path.isdir(p) and not os.path.islink(p):
                        shutil.rmtree(p, ignore_errors=True)
                    else:
                        try:
                            os.unlink(p)
                        except OSError:
                            pass


_REPORT_CAP = 1 << 20  # bytes of report kept per program; a flood beyond is dropped


def _read_available(fd: int, buf: bytearray) -> bool:
    """Append what a non-blocking pipe holds now to ``buf`` (up to the cap); True at EOF."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, InterruptedError):
            return False
        if not chunk:
            return True
        if len(buf) < _REPORT_CAP:
            buf += chunk


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc; empty elsewhere)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        pass
    kids = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return kids
    for name in names:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(name))
            except (OSError, ValueError, IndexError):
                pass
    return kids


def _close_fds_from(first: int) -> None:
    """Close every descriptor >= ``first`` (listing them: no huge close loops)."""
    fd_dir = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    try:
        fds = [int(x) for x in os.listdir(fd_dir) if x.isdigit()]
    except OSError:
        fds = list(range(first, 1024))
    for fd in fds:
        if fd >= first:
            try:
                os.close(fd)
            except OSError:
                pass


def _tail(path: str, n_chars: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4 * n_chars))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return text[-n_chars:]


def _child(srv: _Server, workdir: str, fds: list[int]) -> None:
    """Forked child: lock itself down, wait for its job, hand over to the harness.

    ``fds`` = [/dev/null, stdout file, stderr file, report pipe, job pipe]. Never returns."""
    _exit, _write, _getpid = os._exit, os.write, os.getpid
    report, nonce = fds[3], "-"
    try:
        # --- before the job arrives (overlaps the evaluator's round trip)
        os.setsid()
        libc, lim = srv.libc, srv.limits
        if libc is not None:
            libc.prctl(_Libc.PR_SET_PDEATHSIG, signal.SIGKILL)
            libc.set_name(IDLE_NAME)
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]
        for target, fd in enumerate(high):  # 0 /dev/null, 1 stdout, 2 stderr, 3 report, 4 job
            os.dup2(fd, target)
        report = 3
        _close_fds_from(5)
        os.chdir(workdir)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir,
                           "TMPDIR": workdir, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                           "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1",
                           "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if "random" in sys.modules:
            sys.modules["random"].seed()  # the fork server's state is shared by every fork
        sys.argv = ["<program>"]
        tempfile.tempdir = None
        # --- the job
        msg = _recv_msg(4)
        os.close(4)
        if msg is None:
            _exit(0)  # the fork server is shutting down
        job, nonce = msg["job"], msg["nonce"]
        if libc is not None:
            libc.set_name(b"codechat-job")
        if resource is not None:
            cpu = math.ceil(job["timeout_s"]) + lim.cpu_grace_s
            mem = job["memory_mb"] * 1024 * 1024
            for res, val in ((resource.RLIMIT_CPU, (cpu, cpu + 1)),
                             (resource.RLIMIT_AS, (mem, mem)),
                             (resource.RLIMIT_FSIZE, (lim.file_size_mb << 20,) * 2),
                             (resource.RLIMIT_NOFILE, (lim.open_files,) * 2),
                             (resource.RLIMIT_NPROC, (lim.processes,) * 2),
                             (resource.RLIMIT_CORE, (0, 0))):
                resource.setrlimit(res, val)
        if libc is not None:
            if srv.uid is not None:  # setuid clears the capability sets; empty the bound too
                for cap in range(64):
                    if libc.lib.prctl(_Libc.PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                        break
            else:
                libc.drop_capabilities()
        if srv.uid is not None:
            os.setgroups([])
            os.setgid(srv.gid)
            os.setuid(srv.uid)
        if libc is not None:
            libc.prctl(_Libc.PR_SET_NO_NEW_PRIVS, 1)
    except BaseException as e:  # noqa: BLE001 - anything here is a sandbox failure
        try:
            msg = f"\n{nonce} {_getpid()} setup 0 error {_describe(e).encode().hex()}\n"
            _write(report, msg.encode())
        finally:
            _exit(111)
    _harness(job["program"], job["tests"], nonce)


def _describe(e: BaseException) -> str:
    """``Type: message``, never raising (it may run the program's own __str__)."""
    try:
        name = type(e).__name__
        text = str(e)
    except BaseException:  # noqa: BLE001
        return "<unprintable exception>"
    return (f"{name}: {text}" if text else name)[:300]  # keeps a report line < PIPE_BUF


def _harness(program: str, tests: Sequence[str], nonce: str) -> None:
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
            send(line("definitions", 0, "memory", _describe(e)))
            _exit(0)
        except _BaseException as e:  # SyntaxError, ValueError (NUL bytes), RecursionError
            send(line("syntax", 0, "syntax", _describe(e)))
            _exit(0)
        del tree
        env: dict[str, Any] = {"__name__": "__sandbox__", "__builtins__": __builtins__}
        try:
            _exec(code, env)
        except _BaseException as e:  # SystemExit and KeyboardInterrupt too
            flush()
            send(line("definitions", 0, kind_of(e), _describe(e)))
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
                msg = line("test", i, kind_of(e), _describe(e))
            if i == n - 1:  # the last report and "done" in one atomic write
                flush()
                msg += line("done", n, "ok")
            send(msg)
    except _BaseException:  # noqa: BLE001 - harness broken by the program: no pass
        _exit(113)
    _exit(0)


def _parse(raw: bytes, nonce: str, pid: int) -> list[tuple[str, int, str, str]]:
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


def _assemble(job: dict[str, Any], ended: str, status: int | None,
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


def _serve(cfg: dict[str, Any]) -> None:
    """Fork-server main loop: hello, then one job in -> one result out, until EOF."""
    ctl_in, ctl_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as PID 1 an ignored signal cannot reach us
    srv = _Server(cfg)
    for name in _PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    import gc

    gc.collect()
    gc.freeze()  # fewer copy-on-write page faults in the children
    _send_msg(ctl_out, {"hello": True, "protections": srv.protections,
                        "scratch": None if cfg["mount_ns"] else srv.base})
    srv.prefork()
    while True:
        job = _recv_msg(ctl_in)
        if job is None:
            if not cfg["mount_ns"]:  # a private tmpfs vanishes by itself; this does not
                shutil.rmtree(srv.base, ignore_errors=True)
            return
        try:
            result = srv.run(job)
        except Exception as e:  # noqa: BLE001 - report, keep serving
            result = {"status": "error", "tests_passed": 0, "tests_total": len(job["tests"]),
                      "error": f"sandbox failure: {_describe(e)}", "wall_s": 0.0}
        _send_msg(ctl_out, result)
        srv.prefork()  # the next child forks while the evaluator reads this result


# ============================================================================ client
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
            print(f"codechat.sandbox: {e}; falling back to plain processes", file=sys.stderr)
            _MODE_CACHE[_mode_key(self.isolation)] = None
            self._spawn(None, False)

    def _spawn(self, prefix: list[str] | None, user_ns: bool) -> None:
        homes = sorted({os.path.expanduser("~"), os.environ.get("HOME", "")} - {""})
        cfg = {"limits": asdict(self.limits), "mount_ns": prefix is not None,
               "net_ns": prefix is not None, "user_ns": user_ns, "homes": homes,
               "drop_privileges": self.drop, "evaluator_uid": os.geteuid()}
        cmd = (prefix or []) + [sys.executable, "-I", "-B", os.path.abspath(__file__),
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
        need = _HEADER.size
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
                    body_len = _HEADER.unpack(buf)[0]
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
            _send_msg(self.proc.stdin.fileno(), msg)
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
            pids += _children(self.proc.pid)
        for server in list(pids):
            for child in _children(server):
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
            raise SandboxError("codechat.sandbox needs a POSIX system (the resource module)")
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
                "codechat.sandbox is running WITHOUT some isolation on this machine; NOT "
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


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--serve":
    _serve(json.loads(sys.argv[2]))
