"""The engine's loop and the server's handle on it: the engine thread, or the engine process.

The :class:`~codechat.engine.Engine` is not thread-safe, so one :class:`EngineLoop` owns it and steps
it. Async request handlers :meth:`EngineClient.submit` a request and read its tokens from
:meth:`Job.events`; commands (add, cancel, call, stats) reach the loop through a queue and each
step's tokens come back to the handlers' event loops in one ``loop.call_soon_threadsafe`` a loop.
Every request shares the engine's running batch: it joins as soon as a cache slot frees and leaves
when its rows finish, whatever else runs.

Where the loop runs is the server's choice (``codechat serve --engine process|thread``):

- :class:`~.engine_process.EngineProcess` (the default): a process of its own, with its own GIL, as vLLM splits its
  API server from its engine core; commands and tokens cross a pipe. Everything crossing it is
  picklable: a grammar crosses as its source and is compiled again there (once, cached), and a
  :meth:`EngineClient.call` takes a module-level function (a ``functools.partial`` of one).
- :class:`EngineWorker`: a thread of the server's process. Its Python shares the GIL with the event
  loop's HTTP, JSON and SSE work (the tests' in-process servers use it).

Both are an :class:`EngineClient`: jobs and calls are numbered there, and the loop answers by number.

Work that uses the engine without a cache slot (a teacher-forced pass: :mod:`codechat.engine.scoring`)
goes through :meth:`EngineClient.call`: the function runs on the loop between two steps and its result
comes back as a future of the caller's event loop.

The queue is bounded by sample rows: at most ``slots + queue_size`` rows (a request of ``n``
choices is ``n`` rows, a call one) are accepted and unfinished at once; :meth:`EngineClient.submit`
and :meth:`EngineClient.call` refuse more with :class:`QueueFull` (the server answers 429). A
cancelled job (a client that went away, or a choice that met a stop string) frees its slots at the
next step; a call whose future was cancelled before its turn does not run in the engine thread (the
engine process runs it, and the answer is dropped).
"""
from __future__ import annotations

import asyncio
import itertools
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
#: What the loop hands back for a job: a step's tokens, None (done) or an error.
Item = list[Token] | BaseException | None


class QueueFull(Exception):
    """No room for a request's rows: ``rows`` are in flight of at most ``capacity``."""

    def __init__(self, rows: int, capacity: int) -> None:
        super().__init__(f"the server is at capacity: {rows} of {capacity} sample rows in flight")
        self.rows, self.capacity = rows, capacity


class Job:
    """One submitted request: its tokens arrive, a step's worth at a time, on the event loop that
    submitted it."""

    def __init__(self, client: EngineClient, jid: int, request: Request, loop: asyncio.AbstractEventLoop) -> None:
        self.request, self.jid = request, jid
        self._client, self._loop = client, loop
        self._queue: asyncio.Queue[Item] = asyncio.Queue()

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
        self._client._send(("cancel", self.jid, sample))


class EngineLoop:
    """Owns ``engine`` and steps it while it has work, between the commands from ``commands``
    (tuples ``(kind, id, arg)``: ``add`` a request, ``cancel`` sample ``arg`` (None: all) of job
    ``id``, ``call`` function ``arg`` on the engine, ``stats``, ``stop``). It hands each step's
    tokens to ``deliver`` as ``[(job id, item)]`` (a job's last item None, or an error) and a call's
    or stats' outcome to ``settle(id, result, error)``; ``wanted(id)`` says whether a call's caller
    still waits."""

    def __init__(self, engine: Engine, commands: queue.SimpleQueue, deliver: Callable[[list[tuple[int, Item]]], None],
                 settle: Callable[[int, Any, BaseException | None], None],
                 wanted: Callable[[int], bool] = lambda cid: True) -> None:
        self.engine, self._commands = engine, commands
        self._deliver, self._settle, self._wanted = deliver, settle, wanted
        self._jobs: dict[int, int] = {}  # engine request id -> job id
        self._rids: dict[int, int] = {}  # job id -> engine request id
        self._busy = {"running": 0, "waiting": 0}
        self._thread_s = {"idle_s": 0.0, "deliver_s": 0.0}  # waiting for work; handing tokens over
        self._idle_since: float | None = None

    def run(self) -> None:
        """Step until a ``stop`` command; a failing step fails what runs and the loop goes on."""
        while True:
            try:
                idle = not self.engine.has_work()
                self._idle_since = time.perf_counter() if idle else None
                if not self._apply(block=idle):
                    return
                if idle:
                    self._thread_s["idle_s"] += time.perf_counter() - self._idle_since
                    self._idle_since = None
                if self.engine.has_work():
                    self._step()
                running, waiting = self.engine.busy()
                self._busy = {"running": running, "waiting": waiting}
            except Exception as e:  # a bug or a device error: fail what runs, keep serving
                traceback.print_exc(file=sys.stderr)
                self._fail_all(APIError(500, f"the engine failed: {type(e).__name__}: {e}", type="server_error"))

    def stats(self) -> dict[str, Any]:
        """``running`` (rows holding a slot), ``waiting`` (rows queued for one; both as of the last
        step), ``slots``, ``max_len``, and ``engine``: the engine's
        :class:`~codechat.engine.rows.StepCounters` since the start, with the loop's ``idle_s``
        (seconds waiting for work) and ``deliver_s`` (seconds handing tokens over) beside them."""
        thread_s = dict(self._thread_s)
        if self._idle_since is not None:  # waiting now: the wait so far counts
            thread_s["idle_s"] += time.perf_counter() - self._idle_since
        return {**self._busy, "slots": self.engine.slots, "max_len": self.engine.max_len,
                "engine": {**self.engine.counters.as_dict(), **thread_s}}

    def _apply(self, block: bool) -> bool:
        """Carry out the queued commands (waiting for one when ``block``); False on stop."""
        try:
            cmd = self._commands.get(block=block)
        except queue.Empty:
            return True
        while True:
            kind, ident, arg = cmd
            if kind == "stop":
                self._fail_all(APIError(503, "the server is shutting down", type="server_error"))
                return False
            if kind == "add":
                self._add(ident, arg)
            elif kind == "call":
                self._call(ident, arg)
            elif kind == "stats":
                self._settle(ident, self.stats(), None)
            elif ident in self._rids:  # cancel
                rid = self._rids[ident]
                self.engine.cancel(rid, arg)
                if self._finished(rid):
                    self._deliver([(ident, None)])
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _add(self, jid: int, request: Request) -> None:
        try:
            rid = self.engine.add(request)
        except ValueError as e:  # the handler checks the context first; this is the engine's own check
            self._deliver([(jid, APIError(400, str(e), param="messages", code="context_length_exceeded"))])
            return
        self._jobs[rid], self._rids[jid] = jid, rid

    def _call(self, cid: int, fn: Callable[[Engine], Any]) -> None:
        """Run a call (unless its caller left) and hand its outcome over."""
        if not self._wanted(cid):
            self._settle(cid, None, None)
            return
        try:
            result, error = fn(self.engine), None
        except Exception as e:  # the caller's to answer (a ValueError is the request's fault)
            result, error = None, e
        self._settle(cid, result, error)

    def _step(self) -> None:
        """One engine step; every job's tokens (and the end of the jobs it finished) handed over at once."""
        events = self.engine.step()
        t0 = time.perf_counter()
        by_rid: dict[int, list[Token]] = defaultdict(list)
        for ev in events:
            by_rid[ev.request].append(ev)
        items: list[tuple[int, Item]] = []
        for rid, toks in by_rid.items():
            jid = self._jobs.get(rid)
            if jid is None:
                continue
            items.append((jid, toks))
            if self._finished(rid):
                items.append((jid, None))
        if items:
            self._deliver(items)
        self._thread_s["deliver_s"] += time.perf_counter() - t0

    def _finished(self, rid: int) -> bool:
        """Whether the engine finished request ``rid`` (then forgotten, its rows freed)."""
        if not self.engine.done(rid):
            return False
        self.engine.pop(rid)
        self._rids.pop(self._jobs.pop(rid))
        return True

    def _fail_all(self, error: APIError) -> None:
        items: list[tuple[int, Item]] = []
        for rid, jid in list(self._jobs.items()):
            try:
                self.engine.cancel(rid)
                self.engine.pop(rid)
            except Exception:  # the engine's state is what failed: forget the request regardless
                pass
            items.append((jid, error))
        self._jobs.clear()
        self._rids.clear()
        if items:
            self._deliver(items)


class EngineClient:
    """The server's side of an :class:`EngineLoop`: numbered jobs and calls, the row budget, and the
    hand-over of tokens and outcomes to each caller's event loop. Subclasses send the commands
    (:meth:`_send`) and set ``slots``, ``max_len``, ``vocab_size``, ``device`` and ``warm_up_s`` (the
    engine's)."""

    slots: int
    max_len: int
    vocab_size: int
    device: str
    warm_up_s: float  # the engine's warm-up as it started (0: none)

    def __init__(self, queue_size: int) -> None:
        self.queue_size = queue_size
        self._lock = threading.Lock()
        self._rows = 0  # rows accepted and not finished
        self._ids = itertools.count()
        self._jobs: dict[int, Job] = {}
        self._calls: dict[int, tuple[asyncio.Future, asyncio.AbstractEventLoop, int]] = {}  # id -> future, loop, rows

    @property
    def capacity(self) -> int:
        """Sample rows accepted at once: the engine's slots plus ``queue_size``."""
        return self.slots + self.queue_size

    def _send(self, cmd: tuple[str, int | None, Any]) -> None:
        raise NotImplementedError

    def submit(self, request: Request) -> Job:
        """Queue ``request`` on the engine; call from a coroutine (its loop receives the tokens).

        Raises:
            QueueFull: its rows do not fit beside those in flight.
        """
        self._reserve(len(request.samples))
        job = Job(self, next(self._ids), request, asyncio.get_running_loop())
        with self._lock:
            self._jobs[job.jid] = job
        try:
            self._send(("add", job.jid, request))
        except BaseException:
            with self._lock:
                if self._jobs.pop(job.jid, None) is not None:
                    self._rows -= len(request.samples)
            raise
        return job

    def call(self, fn: Callable[[Engine], T]) -> asyncio.Future[T]:
        """Run ``fn(engine)`` on the engine's loop between two steps (one row while it waits and
        runs); call from a coroutine, whose loop's future gets the result, or ``fn``'s exception.
        ``fn`` must pickle for an engine process: a module-level function or a partial of one.

        Raises:
            QueueFull: no room for one more row.
        """
        self._reserve(1)
        return self._ask("call", fn, rows=1)

    async def stats(self) -> dict[str, Any]:
        """:meth:`EngineLoop.stats` (asked of the loop between two steps), with ``in_flight`` (rows
        accepted and unfinished) and ``capacity``."""
        got = await self._ask("stats", None, rows=0)
        return {**got, "in_flight": self._rows, "capacity": self.capacity}

    def _reserve(self, n: int) -> None:
        """Count ``n`` more rows in flight, or raise :class:`QueueFull`."""
        with self._lock:
            if self._rows + n > self.capacity:
                raise QueueFull(self._rows, self.capacity)
            self._rows += n

    def _ask(self, kind: str, arg: Any, rows: int) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        cid = next(self._ids)
        with self._lock:
            self._calls[cid] = (future, loop, rows)
        try:
            self._send((kind, cid, arg))
        except BaseException:
            with self._lock:
                if self._calls.pop(cid, None) is not None:
                    self._rows -= rows
            raise
        return future

    def wanted(self, cid: int) -> bool:
        """Whether call ``cid``'s caller still waits for it."""
        with self._lock:
            call = self._calls.get(cid)
        return call is not None and not call[0].cancelled()

    def deliver(self, items: list[tuple[int, Item]]) -> None:
        """From the loop's side: hand each job its items, one callback per event loop; a job's last
        item (None or an error) frees its rows."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Job, Item]]] = defaultdict(list)
        with self._lock:
            for jid, item in items:
                job = self._jobs.get(jid)
                if job is None:
                    continue
                by_loop[job._loop].append((job, item))
                if not isinstance(item, list):
                    del self._jobs[jid]
                    self._rows -= len(job.request.samples)
        for loop, its in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, its)
            except RuntimeError:  # the loop is closed: nobody is listening
                pass

    def settle(self, cid: int, result: Any, error: BaseException | None) -> None:
        """From the loop's side: call ``cid``'s outcome to its caller's event loop; its row frees."""
        with self._lock:
            call = self._calls.pop(cid, None)
            if call is None:
                return
            self._rows -= call[2]
        future, loop, _ = call
        try:
            loop.call_soon_threadsafe(_settle, future, result, error)
        except RuntimeError:  # the loop is closed: nobody is listening
            pass

    def fail_all(self, error: APIError) -> None:
        """End every job and call in flight with ``error`` (the engine is gone)."""
        with self._lock:
            jobs, calls = list(self._jobs), list(self._calls)
        self.deliver([(jid, error) for jid in jobs])
        for cid in calls:
            self.settle(cid, None, error)


class EngineWorker(EngineClient):
    """The :class:`EngineLoop` in a thread of this process (module docstring).

    Args:
        engine: the engine; nothing else may use it once :meth:`start` ran.
        queue_size: sample rows accepted beyond the engine's slots.
    """

    def __init__(self, engine: Engine, queue_size: int) -> None:
        super().__init__(queue_size)
        self.engine = engine
        self.slots, self.max_len, self.vocab_size = engine.slots, engine.max_len, engine.vocab_size
        self.device, self.warm_up_s = str(engine.device), engine.warm_up_s
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        loop = EngineLoop(engine, self._commands, self.deliver, self.settle, self.wanted)
        self._thread = threading.Thread(target=loop.run, name="codechat-engine", daemon=True)

    def start(self) -> EngineWorker:
        """Start the engine thread; returns ``self``."""
        self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread; unfinished jobs end with a 503 error."""
        if self._thread.is_alive():
            self._commands.put(("stop", None, None))
            self._thread.join(timeout)

    def _send(self, cmd: tuple[str, int | None, Any]) -> None:
        self._commands.put(cmd)


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    """On a caller's loop: the outcome of its :meth:`EngineClient.call`, unless it stopped waiting."""
    if not future.done():
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def _deliver(items: list[tuple[Job, Item]]) -> None:
    """On a job's event loop: hand each job its tokens, or None (done), in order."""
    for job, item in items:
        job._queue.put_nowait(item)


__all__ = ["EngineClient", "EngineLoop", "EngineWorker", "Item", "Job", "QueueFull"]
