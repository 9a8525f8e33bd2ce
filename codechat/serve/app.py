"""The OpenAI-compatible HTTP API on the engine's scheduler, and the web chat page.

Routes (:func:`create_app`):

- ``POST /v1/chat/completions``: OpenAI's chat completions (:mod:`.protocol` reads the request,
  :mod:`.choices` builds the answer); ``stream: true`` answers with server-sent events, one
  ``chat.completion.chunk`` per ``data:`` line, ending with ``data: [DONE]``.
- ``POST /v1/completions``: OpenAI's legacy completions, plain text continued (:mod:`.completions`:
  prompts as text or token ids, ``echo``, legacy ``logprobs`` with the prompt's own from a
  teacher-forced pass on the engine thread); ``stream: true`` answers with ``text_completion``
  chunks, ending with ``data: [DONE]``.
- ``POST /v1/responses``: OpenAI's Responses API on the same engine, grammars and choices
  (:mod:`.responses` reads the request and builds the ``response`` object); ``stream: true`` answers
  with its typed events (``event: TYPE`` and ``data:`` lines), from ``response.created`` to
  ``response.completed`` or ``response.incomplete``. Stateless: ``previous_response_id``, ``store:
  true`` and the like are 400s.
- ``GET /v1/models`` and ``GET /v1/models/{id}``: the one served model.
- ``GET /health``: ``{"status": "ok", "model", "running", "waiting", "in_flight", "capacity",
  "slots", "max_len", "engine"}`` (:meth:`.worker.EngineClient.stats`; ``engine`` is the step
  timeline in totals since the start: steps, launches, prefills, host seconds) and ``unparsed_calls`` (choices since
  the start whose reply began a function call that did not parse, sent as text:
  :attr:`.choices.ChoiceStream.unparsed`) and ``rejected_tokens`` (rows whose grammar rejected the
  token sampled under its own mask: each a 500 ``grammar_rejected_token``, a bug to report; 0
  always); never needs the key.
- ``GET /``: the chat page (``static/index.html``, its script and style under ``/static/``).

Grammars (strict tools, ``tool_choice`` required or named, ``response_format``: :mod:`.constraints`)
are compiled by one compiler built at the first request that needs it, for the model's vocabulary.

Errors are OpenAI's ``{"error": {"message", "type", "param", "code"}}``: 400 for a malformed
request (bad JSON, a schema that does not compile, a grammar without the grammar library included),
401 without the API key (``Authorization: Bearer KEY``) when the server has one, 404 for an
unknown model or path, 413 for a body over :attr:`~.config.ServeConfig.max_body_bytes`, 429 with
``Retry-After`` when the queue is full, 500 when the engine failed. An unexpected exception is a
logged 500, never a dead server. A client that disconnects — mid-stream or while waiting for a
whole answer — cancels its request, so its cache slots free at the next engine step.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from pathlib import Path
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from codechat.engine import Request as EngineRequest
from codechat.tokenizer import Tokenizer

from .choices import ChoiceStream, CompletionIds, Delta, chunk, completion, merge, usage
from .completions import TextCompletion, parse_completion_request
from .config import ServeConfig
from .constraints import Grammars
from .errors import APIError, bad
from .protocol import ChatRequest, parse_chat_request
from .responses import ResponseBuilder, parse_responses_request
from .worker import EngineClient, Job, QueueFull

STATIC = Path(__file__).with_name("static")
log = logging.getLogger("codechat.serve")


def _event_stream(events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _sse(obj: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event: ``data:`` the object as JSON (or the string), after ``event:`` when named."""
    named = f"event: {event}\n" if event else ""
    return f"{named}data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n".encode()


async def _read_json(request: Request, limit: int) -> Any:
    """The request body as JSON, refused past ``limit`` bytes before it is all read.

    Raises:
        APIError: 413 over the limit; 400 for a body that is not UTF-8 JSON, or that Python's decoder
            refuses (nested about 1000 deep, an integer of more than 4300 digits), or one the client
            left before sending whole (``client_disconnected``; the client never reads it).
    """
    too_large = APIError(413, f"the request body is over the server's limit of {limit} bytes (--max-body-bytes)",
                         code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    try:
        async for piece in request.stream():
            body += piece
            if len(body) > limit:
                raise too_large
    except ClientDisconnect:  # nobody is left to read the answer: no reason to log an error either
        raise bad(None, "the client disconnected before its whole request body arrived", "client_disconnected") \
            from None
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, or past what the decoder takes
        raise bad(None, f"the request body is not JSON this server can read ({type(e).__name__}: {e})",
                  "invalid_json") from None


def _queue_full(e: QueueFull, retry_after_s: int) -> APIError:
    """The 429 of a request whose rows do not fit beside those in flight."""
    return APIError(429, f"{e}; retry after {retry_after_s} s", type="rate_limit_error", code="queue_full",
                    headers={"Retry-After": str(retry_after_s)})


async def _cancel_on_disconnect(request: Request, job: Job | TextCompletion) -> None:
    """Wait for the client to go away (its body is read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel()


def create_app(worker: EngineClient, tok: Tokenizer, config: ServeConfig = ServeConfig(), *,
               api_key: str | None = None) -> FastAPI:
    """The FastAPI app serving ``worker``'s engine (module docstring for the routes).

    Args:
        worker: the started engine thread or process (:mod:`.worker`).
        tok: the model's tokenizer.
        config: names and limits.
        api_key: the key every ``/v1`` request must bring as ``Authorization: Bearer KEY``; None
            lets anyone in.
    """
    app = FastAPI(title="codechat serve", docs_url=None, redoc_url=None, openapi_url=None)
    started = int(time.time())
    max_len = worker.max_len
    grammars = Grammars(tok, worker.vocab_size)  # the compiler itself comes with the first grammar
    counters = {"unparsed_calls": 0, "rejected_tokens": 0}  # since the start (/health)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        return _error(e)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return _error(APIError(e.status_code, f"{request.method} {request.url.path}: {e.detail}", type=kind,
                               code="not_found" if e.status_code == 404 else None))

    @app.exception_handler(Exception)
    async def crash(request: Request, e: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return _error(APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error"))

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, key = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), api_key.encode()):
            raise APIError(401, "Incorrect or missing API key: send the header 'Authorization: Bearer KEY' with "
                                "the server's --api-key", type="authentication_error", code="invalid_api_key")

    def model_card() -> dict[str, Any]:
        return {"id": config.model_name, "object": "model", "created": started, "owned_by": "codechat",
                "max_model_len": max_len}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": config.model_name, **await worker.stats(), **counters}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        authorize(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str, request: Request) -> dict[str, Any]:
        authorize(request)
        if name != config.model_name:
            raise APIError(404, f"The model {name!r} does not exist; this server serves {config.model_name!r}",
                           type="not_found_error", param="model", code="model_not_found")
        return model_card()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        authorize(request)
        body = await _read_json(request, config.max_body_bytes)
        req = await run_in_threadpool(parse_chat_request, body, tok, max_len, config, grammars)
        if req.n > worker.capacity:  # it would never fit: not a reason to retry
            raise bad("n", f"{req.n} choices are more rows than this server holds at once ({worker.capacity}: "
                           "--slots plus --queue-size)")
        job = submit(req.engine_request)
        ids = CompletionIds(config.model_name)
        if req.stream:
            return _event_stream(_stream(job, req, ids))
        watch = asyncio.ensure_future(_cancel_on_disconnect(request, job))
        try:
            choices = choices_of(req)
            async for _ in _deltas(job, choices):
                pass
        finally:
            watch.cancel()
        return JSONResponse(completion(ids, list(choices.values()), req.prompt_tokens))

    @app.post("/v1/completions")
    async def text_completions(request: Request) -> Response:
        authorize(request)
        body = await _read_json(request, config.max_body_bytes)
        req = await run_in_threadpool(parse_completion_request, body, tok, max_len, worker.vocab_size, config)
        if req.rows > worker.capacity:  # it would never fit: not a reason to retry
            raise bad("n", f"{req.rows} rows (n per prompt, and one per prompt scored) are more than this server "
                           f"holds at once ({worker.capacity}: --slots plus --queue-size)")
        run = TextCompletion(req, tok, config.model_name)
        try:
            run.start(worker)
        except QueueFull as e:
            raise _queue_full(e, config.retry_after_s) from None
        if req.stream:
            return _event_stream(_sse(obj) async for obj in run.chunks())
        watch = asyncio.ensure_future(_cancel_on_disconnect(request, run))
        try:
            return JSONResponse(await run.whole())
        finally:
            watch.cancel()

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        authorize(request)
        body = await _read_json(request, config.max_body_bytes)
        req = await run_in_threadpool(parse_responses_request, body, tok, max_len, config, grammars)
        job = submit(req.engine_request)
        choice = ChoiceStream(tok, 0, tools=req.tools, stream_calls=req.engine_request.grammar is not None)
        out = ResponseBuilder(req, config.model_name)
        if req.stream:
            return _event_stream(_response_stream(job, choice, out))
        watch = asyncio.ensure_future(_cancel_on_disconnect(request, job))
        try:
            async for batch in _deltas(job, {0: choice}):
                for delta in batch:
                    out.push(delta)
        finally:
            watch.cancel()
        out.closed(choice)
        return JSONResponse(out.final)

    def submit(engine_request: EngineRequest) -> Job:
        """Queue a request on the engine thread; a full queue is a 429 with ``Retry-After``."""
        try:
            return worker.submit(engine_request)
        except QueueFull as e:
            raise _queue_full(e, config.retry_after_s) from None

    def choices_of(req: ChatRequest) -> dict[int, ChoiceStream]:
        """One :class:`ChoiceStream` per sample index, in index order."""
        return {i: ChoiceStream(tok, i, stop=req.stop, tools=req.tools, logprobs=req.logprobs,
                                stream_calls=req.engine_request.grammar is not None)
                for i in req.engine_request.samples}

    async def _deltas(job: Job, choices: dict[int, ChoiceStream]) -> AsyncIterator[list[Delta]]:
        """The deltas of each batch of tokens (:meth:`Job.events`), in the order the tokens came;
        cancels the job when left."""
        try:
            async for events in job.events():
                batch = []
                for ev in events:
                    c = choices[ev.sample]
                    if c.finish is not None:
                        continue  # closed by a stop string; its row is being cancelled
                    if ev.finish == "rejected":
                        counters["rejected_tokens"] += 1
                        raise APIError(500, "the reply's grammar rejected a token sampled under its own mask (a bug in "
                                            "codechat's constrained decoding; please report it): no reply is returned",
                                       type="server_error", code="grammar_rejected_token")
                    batch.append(c.push(ev))
                    if c.unparsed:  # set as the choice closes: once
                        counters["unparsed_calls"] += 1
                    if c.finish is not None and ev.finish is None:
                        job.cancel(ev.sample)
                yield batch
        finally:
            if any(c.finish is None for c in choices.values()):
                job.cancel()

    async def _stream(job: Job, req: ChatRequest, ids: CompletionIds) -> AsyncIterator[bytes]:
        choices = choices_of(req)
        for i in choices:
            yield _sse(chunk(ids, role=i))
        try:
            async for batch in _deltas(job, choices):
                for delta in merge(batch):  # one chunk per choice per batch, not per token
                    if delta.content or delta.tool_call or delta.arguments or delta.finish or delta.logprobs:
                        yield _sse(chunk(ids, delta))
        except APIError as e:
            yield _sse(e.body())
            return
        if req.include_usage:
            yield _sse(chunk(ids, usage_of=usage(req.prompt_tokens, list(choices.values()))))
        yield _sse("[DONE]")

    async def _response_stream(job: Job, choice: ChoiceStream, out: ResponseBuilder) -> AsyncIterator[bytes]:
        """The Responses API's typed events of one reply (:class:`.responses.ResponseBuilder`)."""
        for ev in out.opened():
            yield _sse(ev, ev["type"])
        try:
            async for batch in _deltas(job, {0: choice}):
                for delta in merge(batch):  # one text delta per engine step, not per token
                    for ev in out.push(delta):
                        yield _sse(ev, ev["type"])
        except APIError as e:
            last = out.failed(e)
        else:
            last = out.closed(choice)
        for ev in last:
            yield _sse(ev, ev["type"])

    @app.api_route("/", methods=["GET", "HEAD"])  # HEAD: what uptime checks and link previews send
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


__all__ = ["create_app"]
