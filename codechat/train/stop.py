"""Stopping a run cleanly before it is done: at a chosen wall time (``--stop-after-min M``) or on SIGTERM
(a preemptible machine's notice), so that ``--resume`` continues it where it stopped.

A :class:`StopWatch` is installed for one invocation (:func:`stop_watch`). Training loops ask
:meth:`StopWatch.due` at every step boundary: once it names a reason they save a checkpoint and raise
:class:`RunStopped`, and the resumed run is the uninterrupted one (the trainer's exact resume). Outside
those loops (building a corpus, sampling, an evaluation) the time limit and SIGTERM raise
:class:`RunStopped` at once, wherever the program is: such work is redone on resume, and its outputs are
written under temporary names, so nothing half-written is kept. The process then exits with
:data:`EXIT_STOPPED`, printing one line that names the command to resume with (:func:`resume_command`).

``M`` counts per invocation, from :func:`stop_watch`: a run of 16 minutes of work on a machine lent for
10 minutes a command is ``--stop-after-min 8`` twice, the second time with ``--resume``.
"""
from __future__ import annotations

import argparse
import contextlib
import shlex
import signal
import threading
import time
from typing import Callable, Iterator

#: Exit status of a run stopped by ``--stop-after-min`` or SIGTERM with its state saved: ``EX_TEMPFAIL``
#: of sysexits.h ("temporary failure, the user is invited to retry"), distinct from an error (1, 2), a
#: dead RL run (3) and Ctrl-C (130).
EXIT_STOPPED = 75


class RunStopped(BaseException):
    """The run stopped before its end, its state saved; ``--resume`` continues it.

    A ``BaseException``, as ``KeyboardInterrupt`` is: it may be raised anywhere outside a training loop
    (:meth:`StopWatch.polled`), and no ``except Exception`` on the way up may swallow it.

    Attributes:
        reason: what stopped it, e.g. ``"--stop-after-min 8"`` or ``"SIGTERM"``.
        where: where it stopped, e.g. ``"pretrain step 120"`` (empty when not in a training loop: a caller
            that knows more, such as the speedrun naming its stage, may fill it in).
    """

    def __init__(self, reason: str, where: str = "") -> None:
        super().__init__(reason, where)
        self.reason, self.where = reason, where

    def __str__(self) -> str:
        return f"stopped by {self.reason}" + (f" at {self.where}" if self.where else "")


class StopWatch:
    """When this invocation should stop: ``after_s`` seconds of wall time after it was made (None: never),
    or a SIGTERM (once :meth:`install` ed).

    Args:
        after_s: seconds from now, > 0, or None.
        clock: seconds, monotonic. Tests pass a fake one: then only the training loops' polls see the
            time limit (:meth:`install` sets no timer).

    Raises:
        ValueError: ``after_s`` <= 0.
    """

    def __init__(self, after_s: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        if after_s is not None and not after_s > 0:
            raise ValueError(f"--stop-after-min must be > 0, got {after_s / 60:g}")
        self.after_s, self.clock = after_s, clock
        self.deadline = None if after_s is None else clock() + after_s
        self.signalled: str | None = None
        self._polled = 0  # depth of polled() sections: signals there only set the flag

    @property
    def limit(self) -> str:
        """The time limit as the flag that set it."""
        return f"--stop-after-min {self.after_s / 60:g}" if self.after_s is not None else ""

    def due(self) -> str | None:
        """Why the run should stop now (the flag, or the signal's name), or None to go on."""
        if self.signalled:
            return self.signalled
        if self.deadline is not None and self.clock() >= self.deadline:
            return self.limit
        return None

    def left_s(self) -> float:
        """Seconds until the time limit (inf without one); a stage can size its work to it."""
        return float("inf") if self.deadline is None else self.deadline - self.clock()

    @contextlib.contextmanager
    def polled(self) -> Iterator[None]:
        """A section that asks :meth:`due` at its own safe points (a training loop's step boundary):
        inside it the timer and SIGTERM only mark the run as due, they do not raise."""
        self._polled += 1
        try:
            yield
        finally:
            self._polled -= 1

    def check(self, where: str = "") -> None:
        """Raise :class:`RunStopped` if :meth:`due`."""
        reason = self.due()
        if reason:
            raise RunStopped(reason, where)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signalled = self.signalled or (self.limit if signum == signal.SIGALRM else signal.Signals(signum).name)
        if not self._polled:
            raise RunStopped(self.signalled)

    @contextlib.contextmanager
    def install(self) -> Iterator["StopWatch"]:
        """Handle SIGTERM, and SIGALRM at the time limit, while the block runs (in the main thread; the
        previous handlers and timer are restored after). Elsewhere (another thread) it installs nothing
        and the training loops still poll the time limit."""
        global _active
        main = threading.current_thread() is threading.main_thread()
        old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGALRM)} if main else {}
        previous, _active = _active, self
        try:
            if main:
                for s in old:
                    signal.signal(s, self._on_signal)
                if self.deadline is not None and self.clock is time.monotonic:  # a fake clock is polled only
                    signal.setitimer(signal.ITIMER_REAL, max(1e-3, self.deadline - time.monotonic()))
            yield self
        finally:
            _active = previous
            if main:
                signal.setitimer(signal.ITIMER_REAL, 0)
                for s, h in old.items():
                    signal.signal(s, h)


#: The watch of the invocation running now (:meth:`StopWatch.install`), None outside one.
_active: StopWatch | None = None


def active() -> StopWatch:
    """The installed :class:`StopWatch`, or one that never stops (a library call without a CLI around it)."""
    return _active or StopWatch(None)


def stop_watch(after_min: float | None) -> StopWatch:
    """A watch for ``--stop-after-min`` (None: no time limit, SIGTERM still stops); use as
    ``with stop_watch(m).install(): ...``.

    Raises:
        ValueError: ``after_min`` <= 0, naming the flag.
    """
    return StopWatch(None if after_min is None else after_min * 60)


def add_stop_flag(p: argparse.ArgumentParser) -> None:
    """``--stop-after-min M`` of the training commands and the speedrun (``codechat.cli.main`` installs
    the watch around the command and turns :class:`RunStopped` into :data:`EXIT_STOPPED`)."""
    p.add_argument("--stop-after-min", type=float, metavar="M",
                   help="stop cleanly after M minutes of wall time, counted per invocation (SIGTERM does the same): "
                        f"a checkpoint at a step boundary, then exit status {EXIT_STOPPED} and one line naming the "
                        "--resume command that continues the run")


def resume_command(argv: list[str], prog: str = "codechat") -> str:
    """The command line that continues a stopped run: ``argv`` with ``--resume`` added when missing."""
    return shlex.join([prog, *argv, *([] if "--resume" in argv else ["--resume"])])


__all__ = ["EXIT_STOPPED", "RunStopped", "StopWatch", "active", "add_stop_flag", "stop_watch", "resume_command"]
