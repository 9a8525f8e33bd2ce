"""``codechat serve``: the OpenAI-compatible server and its chat page on uvicorn.

:func:`add_cli` registers the subcommand; fastapi, uvicorn and the model are imported only when it
runs, and without fastapi / uvicorn it stops with one line saying ``pip install 'codechat[serve]'``.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from codechat.config.hosts import is_loopback

from .config import ServeConfig

#: The environment variable that holds the API key when ``--api-key`` is not given.
API_KEY_ENV = "CODECHAT_API_KEY"
INSTALL_HINT = "pip install 'codechat[serve]'"
SERVE_PACKAGES = ("fastapi", "starlette", "uvicorn")  #: what the serve extra brings that serving imports
#: ``--http`` and ``--loop``: uvicorn's ``http`` and ``loop`` settings. ``auto`` (the default) takes the C ones,
#: httptools and uvloop, which the serve extra installs (uvloop not on Windows), and h11 and asyncio without them.
HTTP_PARSERS = ("auto", "h11", "httptools")
EVENT_LOOPS = ("auto", "asyncio", "uvloop")


def add_cli(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``serve``; it sets ``func(args) -> int``."""
    d = ServeConfig()
    p = subparsers.add_parser(
        "serve", help="an OpenAI-compatible API (/v1/chat/completions) and a web chat page for a model",
        description="Serve --model over HTTP: POST /v1/chat/completions (OpenAI's chat completions: streaming, n, "
                    "seed, stop, tools / tool_choice / strict tools, response_format, logprobs, usage), GET /v1/models, "
                    "GET /health, and a chat page at /. Requests from every client share the engine's running batch. Binds to 127.0.0.1 "
                    f"unless --host says otherwise. Needs the serve extra: {INSTALL_HINT}.")
    p.add_argument("--model", required=True, help="checkpoint, stage directory (its newest checkpoint) or run "
                                                  "directory (its rl/, sft/ or pretrain/ stage, first found)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only; "
                                                       "another address is announced with a warning)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' on /v1 requests (default: ${API_KEY_ENV}"
                                     ", else no key)")
    p.add_argument("--served-model-name", default=d.model_name,
                   help=f"the model id clients send and /v1/models lists (default {d.model_name})")
    p.add_argument("--slots", type=int, default=0, help="sequences decoded at once (KV-cache slots; default 0: "
                                                        "256 on CUDA within half the free memory, 16 on CPU)")
    p.add_argument("--max-len", type=int, default=0, help="context positions per sequence, prompt plus reply "
                                                          "(default 0: the model's max_seq_len)")
    p.add_argument("--queue-size", type=int, default=d.queue_size,
                   help=f"sample rows that may wait for a free slot; more get HTTP 429 (default {d.queue_size})")
    p.add_argument("--retry-after-s", type=int, default=d.retry_after_s,
                   help=f"the Retry-After of a 429, in seconds (default {d.retry_after_s})")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens,
                   help="max_tokens a request may ask for (default 0: what the context leaves)")
    p.add_argument("--max-n", type=int, default=d.max_n, help=f"choices per request at most (default {d.max_n})")
    p.add_argument("--max-messages", type=int, default=d.max_messages,
                   help=f"messages per request at most (default {d.max_messages})")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                   help=f"request body size at most; larger gets HTTP 413 (default {d.max_body_bytes})")
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], default="auto", help="device (default auto)")
    p.add_argument("--engine", choices=["process", "thread"], default="process",
                   help="where the engine runs: a process of its own (default; its own GIL, commands and tokens "
                        "cross a pipe) or a thread of the HTTP front end's process (sharing its GIL: on a 2-core "
                        "CPU non-streaming load got 0.57x the tokens/s; benchmarks/RESULTS.md, serving)")
    p.add_argument("--no-warm-up", action="store_true",
                   help="start without compiling and capturing every batch and prompt bucket first (CUDA; by "
                        "default they are, so that the first requests do not pay for it: "
                        "codechat/engine/warmup.py)")
    p.add_argument("--http", choices=HTTP_PARSERS, default="auto",
                   help="uvicorn's HTTP/1.1 parser: h11 (pure Python, always there), httptools (C; the serve "
                        "extra installs it) or auto (httptools when installed, else h11; the default)")
    p.add_argument("--loop", choices=EVENT_LOOPS, default="auto",
                   help="the front end's event loop: asyncio, uvloop (C; in the serve extra, not on Windows) or "
                        "auto (uvloop when installed, else asyncio; the default)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (default info: one line per request)")
    p.set_defaults(func=_cmd_serve)
    return p


def bind_warning(host: str, api_key: str | None) -> str | None:
    """The warning printed when ``host`` is not loopback (None when it is)."""
    if is_loopback(host):
        return None
    who = "anyone who can reach this machine" + ("" if api_key else f", with no API key (--api-key or ${API_KEY_ENV})")
    return f"WARNING: codechat serve is bound to {host}, not to loopback: {who} can use the model"


def check_port(host: str, port: int) -> None:
    """Bind ``host``:``port`` the way uvicorn will (TCP, ``SO_REUSEADDR``, IPv6 when ``host`` has a
    colon) and let it go again, so that a port another server holds is said in one line before the
    model loads. (Another process may still take the port in the moment between.)

    Raises:
        ValueError: the port is in use, or ``host`` is not an address of this machine; the message
            names ``host:port`` and the system's reason.
    """
    import errno
    import socket
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as e:
        where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        hint = ("another server is listening there: stop it or choose another --port"
                if e.errno == errno.EADDRINUSE else "give an address of this machine as --host")
        raise ValueError(f"cannot listen on {where}: {e.strerror or e} ({hint})") from None


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from .app import create_app  # fastapi
    except ImportError as e:
        if (e.name or "").split(".")[0] not in SERVE_PACKAGES:
            raise
        print(f"codechat serve: error: {e.name} is not installed: {INSTALL_HINT}", file=sys.stderr)
        return 2
    from codechat.checkpoint import load_model, resolve
    from codechat.config.device import resolve_device
    from codechat.engine import Engine, EngineConfig
    from codechat.tokenizer import Tokenizer

    from .engine_process import EngineProcess
    from .worker import EngineWorker
    config = ServeConfig(model_name=args.served_model_name, max_body_bytes=args.max_body_bytes,
                         max_messages=args.max_messages, max_tokens=args.max_tokens, max_n=args.max_n,
                         queue_size=args.queue_size, retry_after_s=args.retry_after_s)
    engine_config = EngineConfig(slots=args.slots, max_len=args.max_len, warm_up=not args.no_warm_up)
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    for flag, package in (("--http", args.http), ("--loop", args.loop)):
        if package in ("httptools", "uvloop") and importlib.util.find_spec(package) is None:
            raise ValueError(f"{flag} {package}: {package} is not installed (pip install {package}), or use "
                             f"{flag} auto")
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    if api_key is not None and not (api_key.isascii() and api_key.isprintable()):
        raise ValueError(f"--api-key (or ${API_KEY_ENV}) must be printable ASCII: clients send it in an HTTP header, "
                         "where another character could never match")
    path = resolve(args.model)
    check_port(args.host, args.port)  # a busy port is said before the model loads
    if args.engine == "process":  # the model loads there; only its tokenizer here
        tok = Tokenizer.load(path / "tokenizer")
        worker = EngineProcess(path, args.device, engine_config, config.queue_size).start()
    else:
        model, tok, _ = load_model(path, resolve_device(args.device))
        worker = EngineWorker(Engine(model, engine_config), config.queue_size).start()
    app = create_app(worker, tok, config, api_key=api_key)
    where = "a process of its own" if args.engine == "process" else "a thread"
    print(f"codechat serve: {path} as {config.model_name!r} on http://{args.host}:{args.port} (chat page at /; "
          f"{worker.slots} slots, context {worker.max_len}, {worker.device}, the engine in {where}"
          f"{f', warmed up in {worker.warm_up_s:.0f} s' if worker.warm_up_s else ''}; API key "
          f"{'required' if api_key else 'not required'})", flush=True)
    warning = bind_warning(args.host, api_key)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, http=args.http, loop=args.loop)
    finally:
        worker.close()
    return 0
