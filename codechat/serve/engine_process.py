"""The engine in a process of its own (``codechat serve --engine process``, the default): its Python
has its own GIL, so the HTTP front end's event loop (parsing, SSE chunks, JSON) no longer takes turns with the
engine's host work, as vLLM splits its API server from its engine core.

The front end (this process) loads only the tokenizer; the engine process (spawned: CUDA is never
touched here) loads the model, builds the :class:`~codechat.engine.Engine` and runs the
:class:`~.worker.EngineLoop` on its main thread. One :func:`multiprocessing.Pipe` carries both ways:

- to the engine: ``(kind, id, arg)`` commands of :class:`~.worker.EngineLoop`; an ``add`` carries
  the request without its grammar and the grammar's llguidance source, compiled again there
  (:meth:`~codechat.engine.grammar.GrammarCompiler.from_source`, cached);
- back: ``("deliver", [(job id, item)])`` once a step (a step's tokens as tuples of
  :class:`~codechat.engine.Token`'s fields: pickled 7x faster than the dataclasses) and
  ``("settle", id, result, error)`` for a call or stats.

A reader thread on each side turns what arrives into the loop's commands (engine side) or into the
jobs' tokens (:meth:`~.worker.EngineClient.deliver`, front-end side). When the engine process dies,
every job and call in flight ends with a 503 and new ones get 503 at once.
"""
from __future__ import annotations

import multiprocessing as mp
import queue
import signal
import threading
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

from codechat.engine import EngineConfig, Token

from .errors import APIError
from .worker import EngineClient, EngineLoop, Item


class EngineProcess(EngineClient):
    """The :class:`~.worker.EngineLoop` in a spawned process (module docstring).

    Args:
        model: the checkpoint directory (:func:`codechat.checkpoint.resolve`'s answer).
        device: ``auto``, ``cpu``, ``cuda`` or ``mps``, resolved in the engine process.
        engine_config: the engine's settings.
        queue_size: sample rows accepted beyond the engine's slots.
    """

    def __init__(self, model: Path, device: str, engine_config: EngineConfig, queue_size: int) -> None:
        super().__init__(queue_size)
        ctx = mp.get_context("spawn")
        self._conn, self._child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_engine_main, args=(self._child_conn, str(model), device, engine_config),
                                 name="codechat-engine", daemon=True)
        self._send_lock = threading.Lock()
        self._dead: str | None = None  # why the engine process is gone

    def start(self) -> EngineProcess:
        """Start the engine process and wait until its engine is built; returns ``self``.

        Raises:
            CheckpointError, ValueError: the engine process could not load the checkpoint, or the
                engine's settings do not fit it (as :func:`~codechat.checkpoint.load_model` and
                :class:`~codechat.engine.Engine` raise them).
            RuntimeError: anything else that stopped it (its traceback in the message).
        """
        self._proc.start()
        self._child_conn.close()  # the child's end lives in the child: EOF here once it exits
        try:
            kind, info = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"the engine process exited with {self._proc.exitcode} before it was ready") from None
        if kind != "ready":
            self._proc.join(10)
            error, trace = info
            if error is not None:
                raise error
            raise RuntimeError(f"the engine process failed to start:\n{trace}")
        self.slots, self.max_len, self.vocab_size, self.device, self.warm_up_s = (
            info[k] for k in ("slots", "max_len", "vocab_size", "device", "warm_up_s"))
        threading.Thread(target=self._read, name="codechat-engine-reader", daemon=True).start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop the engine process; unfinished jobs end with a 503 error."""
        if self._proc.is_alive():
            try:
                self._send(("stop", None, None))
            except APIError:
                pass
            self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.kill()

    def _send(self, cmd: tuple[str, int | None, Any]) -> None:
        kind, ident, arg = cmd
        if kind == "add":  # a compiled grammar stays here: its source crosses
            grammar = arg.grammar
            cmd = (kind, ident, (replace(arg, grammar=None), None if grammar is None else grammar.source))
        try:
            if self._dead is not None:
                raise OSError(self._dead)
            with self._send_lock:
                self._conn.send(cmd)
        except (OSError, ValueError) as e:  # the engine process is gone (its reader thread fails the rest)
            if kind != "cancel":  # a cancel of what is gone has nothing left to stop
                raise _gone(str(e)) from None

    def _read(self) -> None:
        """The front end's reader thread: the engine's answers to the jobs and calls, until EOF."""
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                break
            if msg[0] == "deliver":
                self.deliver([(jid, [Token(*t) for t in item] if isinstance(item, list) else item)
                              for jid, item in msg[1]])
            else:
                self.settle(*msg[1:])
        self._proc.join(5)
        self._dead = f"the engine process exited with {self._proc.exitcode}"
        self.fail_all(_gone(self._dead))


def _gone(why: str) -> APIError:
    return APIError(503, f"the engine is not running ({why}); restart the server", type="server_error")


def _engine_main(conn: Any, model: str, device: str, engine_config: EngineConfig) -> None:
    """The engine process: build the engine, say ``ready`` with its facts, then run its loop with
    a reader thread feeding it commands (the front end's Ctrl-C is the front end's to handle)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        from codechat.checkpoint import load_model
        from codechat.config.device import resolve_device
        from codechat.engine import Engine
        model_, tok, _ = load_model(model, resolve_device(device))
        engine = Engine(model_, engine_config)
    except BaseException as e:  # the user's errors (a bad checkpoint, settings) cross as themselves
        user = isinstance(e, (ValueError, FileNotFoundError)) or type(e).__name__ == "CheckpointError"
        conn.send(("failed", (e if user else None, traceback.format_exc())))
        return
    lock = threading.Lock()

    def send(msg: tuple) -> None:
        with lock:
            conn.send(msg)

    commands: queue.SimpleQueue = queue.SimpleQueue()
    compiler: list[Any] = []  # built with the first grammar

    def read() -> None:
        while True:
            try:
                kind, ident, arg = conn.recv()
            except (EOFError, OSError):  # the front end is gone
                commands.put(("stop", None, None))
                return
            if kind == "add":
                request, source = arg
                if source is not None:
                    try:
                        if not compiler:
                            from codechat.engine.grammar import GrammarCompiler
                            compiler.append(GrammarCompiler(tok, engine.vocab_size))
                        request = replace(request, grammar=compiler[0].from_source(source))
                    except Exception as e:  # compiled in the front end already: not the request's fault
                        send(("deliver", [(ident, APIError(500, f"the engine process could not compile the "
                                                                f"request's grammar: {e}", type="server_error"))]))
                        continue
                arg = request
            commands.put((kind, ident, arg))
            if kind == "stop":
                return

    def settle(cid: int, result: Any, error: BaseException | None) -> None:
        try:
            send(("settle", cid, result, error))
        except Exception as e:  # an outcome that does not pickle: the caller still gets an answer
            send(("settle", cid, None, RuntimeError(f"the engine's answer could not cross to the server: {e}")))

    def deliver(items: list[tuple[int, Item]]) -> None:  # tokens as tuples: 7x faster to pickle than dataclasses
        send(("deliver", [(jid, [(t.request, t.sample, t.token, t.logprob, t.logprob_t1, t.finish, t.top)
                                 for t in item] if isinstance(item, list) else item) for jid, item in items]))

    threading.Thread(target=read, name="codechat-engine-commands", daemon=True).start()
    loop = EngineLoop(engine, commands, deliver=deliver, settle=settle)
    send(("ready", {"slots": engine.slots, "max_len": engine.max_len, "vocab_size": engine.vocab_size,
                    "device": str(engine.device), "warm_up_s": engine.warm_up_s}))
    loop.run()


__all__ = ["EngineProcess"]
