"""The fork server: one warm interpreter per worker that forks, locks down and judges each program.

The evaluator (:mod:`.pool`) starts this file as a script, ``python -I -B server.py --serve
CFG``, under ``unshare`` where the kernel allows it (see the package docstring). It must not
import codechat or anything outside the standard library: ``-I`` keeps the evaluator's
environment, user site and working directory out, and every module the fork server holds is
inherited by every program. Its siblings :mod:`.protocol`, :mod:`.harness` and :mod:`.linux`
are loaded from this directory by path.

:class:`_Server` sets up the mounts and the user programs run as, pre-forks the next child,
waits for its report or its deadline and kills everything it started; :func:`_child` is the
child's lock-down before :func:`.harness.run_and_report` takes over; :func:`_serve` is the
main loop (one job in, one result out).
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import select
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

if __package__:  # imported (the evaluator, tests): the package's own modules
    from . import harness, linux, protocol
else:  # run as the fork server: the sibling files, found by path; they then leave sys.path and
    # sys.modules so that a program importing a module of the same name does not get ours
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import harness
    import linux
    import protocol
    del sys.path[0]
    for _name in ("harness", "linux", "protocol"):
        del sys.modules[_name]

try:  # POSIX only; the sandbox refuses to start without it.
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None  # type: ignore[assignment]

_NOBODY = 65534
_PRELOAD = (  # imported once in the fork server, so programs do not pay for them
    "ast", "array", "bisect", "cmath", "collections", "collections.abc", "copy", "dataclasses",
    "datetime", "decimal", "enum", "fractions", "functools", "hashlib", "heapq", "itertools",
    "json", "math", "numbers", "operator", "random", "re", "statistics", "string", "struct",
    "sys", "textwrap", "typing", "unicodedata",
)


class _Server:
    """State of one fork server: where programs run, as whom, and what is protected."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.limits = protocol.Limits(**cfg["limits"])
        self.on_linux = sys.platform.startswith("linux")
        self.libc = linux.Libc() if self.on_linux else None
        self.init = os.getpid() == 1  # PID 1 of our own namespace: kill(-1) is scoped to it
        self.uid = self.gid = None  # switch to this uid in children (root only)
        self.counter = 0
        self.pending: tuple[int, int, int, str] | None = None  # pre-forked child
        self.kept: list[str] = []  # interpreter paths bound into the private /tmp & co.
        prot = {k: False for k in protocol.PROTECTIONS}
        prot["pid_namespace"] = self.init
        prot["resource_limits"] = resource is not None
        if self.on_linux and not self.init:
            try:
                self.libc.prctl(linux.Libc.PR_SET_CHILD_SUBREAPER, 1)  # orphans come back to us
            except OSError:
                pass
        if cfg["mount_ns"]:
            self.base = "/tmp"
            self._setup_mounts(cfg, prot)
        else:
            self.base = tempfile.mkdtemp(prefix="codechat-sandbox-")
        if self.on_linux:
            prot["network_namespace"] = cfg["net_ns"] and linux.network_unreachable()
        self.outdir = os.path.join(self.base, ".capture")
        os.makedirs(self.outdir, mode=0o700, exist_ok=True)
        if os.geteuid() == 0 and cfg["drop_privileges"] and not cfg["user_ns"]:
            if all(linux.traversable(p, _NOBODY, _NOBODY) for p in linux.needed_paths()):
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
            needed = linux.needed_paths()
            if os.geteuid() == 0 and cfg["drop_privileges"] and not cfg["user_ns"]:
                for p in needed:  # dirs the unprivileged user could not traverse
                    cur = "/"
                    for part in os.path.realpath(p).split("/")[1:]:
                        cur = os.path.join(cur, part)
                        if os.path.isdir(cur) and not linux.traversable(cur, _NOBODY, _NOBODY):
                            homes.add(cur)
                            break
            hidden = linux.hide_dirs(libc, sorted(homes), needed, stash)
            prot["hidden_home"] = all(h in hidden for h in homes if not any(
                p == h for p in needed))
            libc.umount(stash)
        except OSError as e:
            print(f"codechat.eval.sandbox: could not hide home directories: {e}", file=sys.stderr)
        try:
            try:
                libc.make_readonly("/")
            except OSError:
                self._remount_all_readonly()
            prot["readonly_filesystem"] = True
        except OSError as e:
            print(f"codechat.eval.sandbox: could not make the filesystem read-only: {e}",
                  file=sys.stderr)
        private = True
        needed = linux.needed_paths()  # again: the stash hid whatever lives under /tmp
        for d in ("/tmp", "/var/tmp", "/dev/shm"):
            if os.path.isdir(d):
                try:
                    self.kept += linux.private_tmpfs(libc, d, tmpfs_opts, needed)
                except OSError as e:
                    private = private and d != "/tmp"
                    print(f"codechat.eval.sandbox: no private {d}: {e}", file=sys.stderr)
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
            protocol.send_msg(job_w, {"job": job, "nonce": nonce})
        except OSError:  # the child died before its job (e.g. killed from outside)
            pass
        os.close(job_w)
        ended, raw = self._wait(pid, r, nonce, t0 + job["timeout_s"])
        wall = time.monotonic() - t0
        os.close(r)
        status = self._finish(pid)
        reports = harness.parse_reports(raw, nonce, pid)
        result = harness.assemble_result(job, ended, status, reports, wall)
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
                for target in [pid] + linux.children(os.getpid()):
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
                    if p == self.outdir or p in self.kept:
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
            libc.prctl(linux.Libc.PR_SET_PDEATHSIG, signal.SIGKILL)
            libc.set_name(protocol.IDLE_NAME)
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]
        for target, fd in enumerate(high):  # 0 /dev/null, 1 stdout, 2 stderr, 3 report, 4 job
            os.dup2(fd, target)
        report = 3
        linux.close_fds_from(5)
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
        msg = protocol.recv_msg(4)
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
                    if libc.lib.prctl(linux.Libc.PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                        break
            else:
                libc.drop_capabilities()
        if srv.uid is not None:
            os.setgroups([])
            os.setgid(srv.gid)
            os.setuid(srv.uid)
        if libc is not None:
            libc.prctl(linux.Libc.PR_SET_NO_NEW_PRIVS, 1)
    except BaseException as e:  # noqa: BLE001 - anything here is a sandbox failure
        try:
            msg = f"\n{nonce} {_getpid()} setup 0 error {harness.describe(e).encode().hex()}\n"
            _write(report, msg.encode())
        finally:
            _exit(111)
    harness.run_and_report(job["program"], job["tests"], nonce)


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
    protocol.send_msg(ctl_out, {"hello": True, "protections": srv.protections,
                                "scratch": None if cfg["mount_ns"] else srv.base})
    srv.prefork()
    while True:
        job = protocol.recv_msg(ctl_in)
        if job is None:
            if not cfg["mount_ns"]:  # a private tmpfs vanishes by itself; this does not
                shutil.rmtree(srv.base, ignore_errors=True)
            return
        try:
            result = srv.run(job)
        except Exception as e:  # noqa: BLE001 - report, keep serving
            result = {"status": "error", "tests_passed": 0, "tests_total": len(job["tests"]),
                      "error": f"sandbox failure: {harness.describe(e)}", "wall_s": 0.0}
        protocol.send_msg(ctl_out, result)
        srv.prefork()  # the next child forks while the evaluator reads this result


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--serve":
    _serve(json.loads(sys.argv[2]))
