"""The engine thread: one background thread owns the :class:`~codechat.engine.Engine` and steps it.

The engine is not thread-safe, so only this thread touches it. Async request handlers
:meth:`EngineWorker.submit` a request and read its tokens from :meth:`Job.events`; commands
(add, cancel) reach the thread through a queue and tokens come back on the handler's event loop
through ``loop.call_soon_threadsafe``. Every request shares the engine's running batch: it joins as
soon as a cache slot frees and leaves when its rows finish, whatever else runs.

Work that uses the engine without a cache slot (a teacher-forced pass: :mod:`codechat.engine.scoring`)
goes through :meth:`EngineWorker.call`: the function runs on the engine thread between two steps and
its result comes back as a future of the caller's loop.

The queue is bounded by sample rows: at most ``slots + queue_size`` rows (a request of ``n``
choices is ``n`` rows, a call one) are accepted and unfinished at once; :meth:`EngineWorker.submit`
and :meth:`EngineWorker.call` refuse more with :class:`QueueFull` (the server answers 429). A
cancelled job (a client that went away, or a choice that met a stop string) frees its slots at the
next step; a call whose future was cancelled before its turn does not run.
"""
from __future__ import annotations

import asyncio
import queue
import sys
import threading
import time
import traceback
from collections import defaultdict
from typing import Any, AsyncIterator, Callable, TypeVar

from codechat.engine import Engine, Request, Token

from .errors import APIError

T = TypeVar("T")


class QueueFull(Exception):
    """No room for a request's rows: ``rows`` are in flight of at most ``capacity``."""

    def __init__(self, rows: int, capacity: int) -> None:
        super().__init__(f"the server is at capacity: {rows} of {capacity} sample rows in flight")
        self.rows, self.capacity = rows, capacity


class Job:
    """One submitted request: its tokens arrive, a step's worth at a time, on the event loop that
    submitted it."""

    def __init__(self, worker: EngineWorker, request: Request, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.rid: int | None = None  # the engine's id, set on the engine thread
        self._worker, self._loop = worker, loop
        self._queue: asyncio.Queue[Any] = asyncio.Queue()

    def _put(self, item: list[Token] | BaseException | None) -> None:
        """From the engine thread: tokens, an error, or None (done)."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening
            pass

    async def events(self) -> AsyncIterator[list[Token]]:
        """The request's tokens, in order per sample, until every sample finished: each list is
        every token that arrived since the last one was taken — one engine step's while the
        reader keeps up, several steps' once it lags (so a slow reader gets bigger pieces, not a
        growing backlog).

        Raises:
            APIError: the engine refused the request or failed while running it (after the
                tokens that came before it).
        """
        while True:
            items = [await self._queue.get()]
            while not self._queue.empty():
                items.append(self._queue.get_nowait())
            end = next((i for i, item in enumerate(items) if not isinstance(item, list)), len(items))
            tokens = [t for item in items[:end] for t in item]
            if tokens:
                yield tokens
            if end < len(items):  # None (done) or an error: nothing after it counts
                if isinstance(items[end], BaseException):
                    raise items[end]
                return

    def cancel(self, sample: int | None = None) -> None:
        """Stop sample ``sample`` (every sample when None); harmless once the job is done."""
        self._worker._commands.put(("cancel", self, sample))


class EngineWorker:
    """The thread that steps ``engine`` (module docstring).

    Args:
        engine: the engine; nothing else may use it once :meth:`start` ran.
        queue_size: sample rows accepted beyond the engine's slots.
    """

    def __init__(self, engine: Engine, queue_size: int) -> None:
        self.engine = engine
        self.capacity = engine.slots + queue_size
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._rows = 0  # rows accepted and not finished
        self._jobs: dict[int, Job] = {}  # engine thread only
        self._stats = {"running": 0, "waiting": 0}
        self._thread_s = {"idle_s": 0.0, "deliver_s": 0.0}  # waiting for work; handing tokens to the loops
        self._idle_since: float | None = None  # when the engine thread began waiting for work (under _lock)
        self._thread = threading.Thread(target=self._run, name="codechat-engine", daemon=True)

    def start(self) -> EngineWorker:
        """Start the engine thread; returns ``self``."""
        self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread; unfinished jobs end with a 503 error."""
        if self._thread.is_alive():
            self._commands.put(("stop", None, None))
            self._thread.join(timeout)

    def stats(self) -> dict[str, Any]:
        """``running`` (rows holding a slot), ``waiting`` (rows queued for one; both as of the last
        step), ``in_flight`` (rows accepted and unfinished), ``capacity``, ``slots``, ``max_len``, and
        ``engine``: the engine's :class:`~codechat.engine.rows.StepCounters` since the start, with this
        thread's ``idle_s`` (seconds waiting for work) and ``deliver_s`` (seconds handing tokens to the
        event loops) beside them."""
        with self._lock:
            thread_s = dict(self._thread_s)
            if self._idle_since is not None:  # waiting now: the wait so far counts
                thread_s["idle_s"] += time.perf_counter() - self._idle_since
        return {**self._stats, "in_flight": self._rows, "capacity": self.capacity, "slots": self.engine.slots,
                "max_len": self.engine.max_len, "engine": {**self.engine.counters.as_dict(), **thread_s}}

    def submit(self, request: Request) -> Job:
        """Queue ``request`` on the engine; call from a coroutine (its loop receives the tokens).

        Raises:
            QueueFull: its rows do not fit beside those in flight.
        """
        n = len(request.samples)
        with self._lock:
            if self._rows + n > self.capacity:
                raise QueueFull(self._rows, self.capacity)
            self._rows += n
        job = Job(self, request, asyncio.get_running_loop())
        self._commands.put(("add", job, None))
        return job

    def call(self, fn: Callable[[Engine], T]) -> asyncio.Future[T]:
        """Run ``fn(engine)`` on the engine thread between two steps (one row while it waits and
        runs); call from a coroutine, whose loop's future gets the result, or ``fn``'s exception.

        Raises:
            QueueFull: no room for one more row.
        """
        with self._lock:
            if self._rows + 1 > self.capacity:
                raise QueueFull(self._rows, self.capacity)
            self._rows += 1
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._commands.put(("call", (fn, future, loop), None))
        return future

    # -- the engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                idle = not self.engine.has_work()
                if idle:
                    with self._lock:
                        self._idle_since = time.perf_counter()
                if not self._apply(block=idle):
                    return
                if idle:
                    with self._lock:
                        self._thread_s["idle_s"] += time.perf_counter() - self._idle_since
                        self._idle_since = None
                if self.engine.has_work():
                    self._step()
                running, waiting = self.engine.busy()
                self._stats = {"running": running, "waiting": waiting}
            except Exception as e:  # a bug or a device error: fail what runs, keep serving
                traceback.print_exc(file=sys.stderr)
                self._fail_all(APIError(500, f"the engine failed: {type(e).__name__}: {e}", type="server_error"))

    def _apply(self, block: bool) -> bool:
        """Carry out the queued commands (waiting for one when ``block``); False on stop."""
        try:
            cmd = self._commands.get(block=block)
        except queue.Empty:
            return True
        while True:
            kind, job, sample = cmd
            if kind == "stop":
                self._fail_all(APIError(503, "the server is shutting down", type="server_error"))
                return False
            if kind == "add":
                self._add(job)
            elif kind == "call":
                self._call(*job)
            elif job.rid in self._jobs:
                self.engine.cancel(job.rid, sample)
                self._check_done(job.rid)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _add(self, job: Job) -> None:
        try:
            job.rid = self.engine.add(job.request)
        except ValueError as e:  # the handler checks the context first; this is the engine's own check
            self._release(job)
            job._put(APIError(400, str(e), param="messages", code="context_length_exceeded"))
            return
        self._jobs[job.rid] = job

    def _call(self, fn: Callable[[Engine], Any], future: asyncio.Future, loop: asyncio.AbstractEventLoop) -> None:
        """Run a :meth:`call` (unless its caller left) and hand its outcome to the caller's loop."""
        try:
            if future.cancelled():
                return
            try:
                result, error = fn(self.engine), None
            except Exception as e:  # the caller's to answer (a ValueError is the request's fault)
                result, error = None, e
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the loop is closed: nobody is listening
                pass
        finally:
            with self._lock:
                self._rows -= 1

    def _step(self) -> None:
        """One engine step; every job's tokens (and the end of the jobs it finished) reach each event
        loop in one callback, not one per job: waking a loop is a write to its self-pipe, made while
        this thread holds the GIL the loop needs too."""
        by_rid: dict[int, list[Token]] = defaultdict(list)
        events = self.engine.step()
        t0 = time.perf_counter()
        for ev in events:
            by_rid[ev.request].append(ev)
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Job, list[Token] | None]]] = defaultdict(list)
        for rid, events in by_rid.items():
            job = self._jobs.get(rid)
            if job is None:
                continue
            by_loop[job._loop].append((job, events))
            if self._finished(rid) is not None:
                by_loop[job._loop].append((job, None))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the loop is closed: nobody is listening
                pass
        self._thread_s["deliver_s"] += time.perf_counter() - t0

    def _check_done(self, rid: int) -> None:
        job = self._finished(rid)
        if job is not None:
            job._put(None)

    def _finished(self, rid: int) -> Job | None:
        """The job of request ``rid`` if the engine finished it (forgotten, its rows freed), else None."""
        if not self.engine.done(rid):
            return None
        self.engine.pop(rid)
        job = self._jobs.pop(rid)
        self._release(job)
        return job

    def _release(self, job: Job) -> None:
        with self._lock:
            self._rows -= len(job.request.samples)

    def _fail_all(self, error: APIError) -> None:
        for rid, job in list(self._jobs.items()):
            try:
                self.engine.cancel(rid)
                self.engine.pop(rid)
            except Exception:  # the engine's state is what failed: forget the request regardless
                pass
            self._release(job)
            job._put(error)
        self._jobs.clear()


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    """On a caller's loop: the outcome of its :meth:`EngineWorker.call`, unless it stopped waiting."""
    if not future.done():
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def _deliver(items: list[tuple[Job, list[Token] | None]]) -> None:
    """On a job's event loop: hand each job its tokens, or None (done), in order."""
    for job, item in items:
        job._queue.put_nowait(item)


__all__ = ["EngineWorker", "Job", "QueueFull"]
