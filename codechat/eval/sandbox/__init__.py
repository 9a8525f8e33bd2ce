"""Run untrusted, model-written Python programs against tests: fast, isolated, unforgeable.

``run(program, tests)`` executes the program's definitions, then each test in order, in one
child process, and returns an :class:`ExecResult`. ``run_many(jobs, workers=N)`` does the
same for many programs with N programs in flight at once. Only the standard library is used.

How it works
------------
Each worker is a *fork server*: a warm Python interpreter (``python -I -B server.py --serve``)
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
importable; a venv under ``/tmp`` stays visible, read-only, in the private ``/tmp``, so
programs can still run ``sys.executable``). The network namespace has only a loopback device,
which is down.

Which namespaces: as root, ``unshare --pid --net --mount`` and programs run as ``nobody``; as
any other user, the same inside a user namespace (``--user --map-root-user``), where programs
run as your own uid with every capability dropped. ``Sandbox(isolation="userns")`` forces the
latter and ``isolation="none"`` the plain-process fallback, so both paths are testable as root.

Modules
-------
:mod:`.protocol` (limits, jobs, results, errors, message framing), :mod:`.linux` (syscalls,
hidden directories, process listing), :mod:`.harness` (what runs in the child, and the parsing
of its reports), :mod:`.server` (the fork server and the child's lock-down) and :mod:`.pool`
(the evaluator's side: :class:`Sandbox`, :func:`run`, :func:`run_many`). The first four run in
the fork server, which loads them by path and imports nothing outside the standard library.

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

from .pool import Sandbox, protections, run, run_many
from .protocol import (OUTCOMES, PROTECTIONS, STATUSES, ExecResult, Job, Limits, SandboxError,
                       SandboxWarning, TestOutcome)

__all__ = ["run", "run_many", "protections", "Sandbox", "Limits", "Job", "TestOutcome", "ExecResult",
           "STATUSES", "OUTCOMES", "PROTECTIONS", "SandboxError", "SandboxWarning"]
