"""The Linux pieces the standard library lacks: a few syscalls through ctypes, hiding directories
behind tmpfs mounts (and keeping the interpreter visible in a private ``/tmp``), listing a
process's children, closing inherited descriptors.

Standard library only, and no import of codechat: the fork server loads this file by path
(see :mod:`.server`). Elsewhere than Linux, :class:`Libc` is not built and :func:`children`
finds nothing.
"""
from __future__ import annotations

import os
import shutil
import sys


class Libc:
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


def traversable(path: str, uid: int, gid: int) -> bool:
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


def needed_paths() -> list[str]:
    """Directories the forked programs must still be able to import from, and to start
    ``sys.executable`` from: the interpreter's directory as invoked (a venv's ``bin``, which
    holds only a symlink) and as resolved, the prefixes (a venv's ``pyvenv.cfg`` is in
    ``sys.prefix``) and ``sys.path``."""
    cands = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.abspath(sys.executable)),
             os.path.dirname(os.path.realpath(sys.executable))] + sys.path
    out = []
    for p in cands:
        if p and os.path.exists(p):
            for q in {os.path.abspath(p), os.path.realpath(p)}:
                if q not in out:
                    out.append(q)
    return out


def hide_dirs(libc: Libc, hidden: list[str], needed: list[str], stash: str) -> list[str]:
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


def private_tmpfs(libc: Libc, d: str, opts: str, needed: list[str]) -> list[str]:
    """Mount a private tmpfs on ``d`` (``/tmp``, ``/var/tmp``, ``/dev/shm``), then bind the
    ``needed`` paths under ``d`` back at the same paths, read-only. Returns the kept entries of
    ``d`` (paths), which emptying ``d`` after every program must leave alone.

    Why: an empty private ``/tmp`` also hides an interpreter that lives there (a checkout under
    ``/tmp`` with its ``.venv``): the fork server has already started, but a program that runs
    ``subprocess.run([sys.executable, ...])`` gets ``FileNotFoundError`` for the interpreter,
    and one that imports from the venv's site-packages an ``ImportError``. The sources are
    opened (``O_PATH``) before ``d`` is covered and bound from ``/proc/self/fd``, as covering
    ``d`` makes them unreachable by name. A kept entry that is not itself a needed path (the
    checkout around ``.venv``) is a small tmpfs holding only the way to the needed paths, made
    read-only like the binds, so a program can neither write there nor leave anything behind.
    """
    under = sorted({os.path.relpath(p, d) for p in needed if p.startswith(d + "/")})
    outer = [u for u in under if not any(u.startswith(o + "/") for o in under)]
    fds: dict[str, int] = {}
    kept: list[str] = []
    try:
        for u in outer:
            try:
                fds[u] = os.open(os.path.join(d, u), os.O_PATH | os.O_CLOEXEC)
            except OSError:
                pass
        libc.mount("tmpfs", d, "tmpfs", libc.MS_NOSUID | libc.MS_NODEV, opts)
        for top in sorted({u.split("/")[0] for u in fds}):
            top_path = os.path.join(d, top)
            try:
                if top not in fds:  # a skeleton tmpfs leading to the needed paths
                    os.mkdir(top_path, 0o755)
                    libc.mount("tmpfs", top_path, "tmpfs", libc.MS_NOSUID | libc.MS_NODEV,
                               "mode=0755,size=1m")
                for u, fd in fds.items():
                    if u != top and not u.startswith(top + "/"):
                        continue
                    dst = os.path.join(d, u)
                    os.makedirs(os.path.dirname(dst), 0o755, exist_ok=True)
                    if os.path.isdir(f"/proc/self/fd/{fd}"):
                        os.mkdir(dst)
                    else:
                        open(dst, "w").close()
                    libc.mount(f"/proc/self/fd/{fd}", dst, None, libc.MS_BIND | libc.MS_REC)
                try:
                    libc.make_readonly(top_path)
                except OSError:  # no mount_setattr: the binds are read-only already (copies of
                    # read-only mounts); the skeleton is our own tmpfs, plain to remount
                    if top not in fds:
                        libc.mount(None, top_path, None, libc.MS_REMOUNT | libc.MS_BIND
                                   | libc.MS_RDONLY | libc.MS_NOSUID | libc.MS_NODEV)
                kept.append(top_path)
            except OSError as e:
                print(f"codechat.eval.sandbox: {top_path} stays hidden: {e}", file=sys.stderr)
                try:
                    libc.umount(top_path)
                except OSError:
                    pass
                shutil.rmtree(top_path, ignore_errors=True)
    finally:
        for fd in fds.values():
            os.close(fd)
    return kept


def network_unreachable() -> bool:
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: a route lookup, no packet is sent
        return False
    except OSError:
        return True
    finally:
        s.close()


def children(pid: int) -> list[int]:
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


def close_fds_from(first: int) -> None:
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

