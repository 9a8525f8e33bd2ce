"""OpenAI's legacy completions API (``POST /v1/completions``): plain text continued, for evaluation
harnesses (lm-evaluation-harness ``local-completions``) and code-completion plugins.

:func:`parse_completion_request` checks a decoded body field by field (the readers chat uses too:
:mod:`.protocol`) into a :class:`CompletionRequest`; :class:`TextCompletion` runs it on the engine
thread (:mod:`.worker`) and builds the ``text_completion`` object, or its stream of chunks.

- ``prompt``: a string, a list of strings, a list of token ids or a list of lists of token ids; each
  prompt is one engine request, and the choices are prompt-major: choice ``p * n + i`` is sample
  ``i`` of prompt ``p`` (as OpenAI numbers them). No chat template: a string is encoded as is, after
  one ``<|end|>`` id, as ``codechat sample`` and the base-model evaluation encode a raw prompt (in
  pretraining every document follows an ``<|end|>``; no ``<|bos|>``); a special token spelled in the
  text is plain text. A list of ids is the prompt exactly as given (a client that tokenizes, as
  lm-evaluation-harness does, picks its own first token).
- The text is the generated tokens decoded, without special ids: a special id ends the choice
  (``finish_reason: "stop"``; ``<|end|>`` ends a document), as does a ``stop`` string (held back
  until it cannot be one, never sent, even in part: :class:`~.choices.ChoiceStream`), and
  ``max_tokens`` (default 16, as OpenAI; ``"length"``).
- ``echo``: the prompt's text (its ids decoded without special ids) comes before the generated text,
  in the first chunk of a stream. ``max_tokens: 0`` (allowed only with ``echo``) generates nothing.
- ``logprobs`` k (0..20): OpenAI's legacy object ``{"tokens", "token_logprobs", "top_logprobs",
  "text_offset"}``, one entry per generated token (the special id that ends a choice included, under
  its spelling, at the text's end: usage counts it too, and a harness that drops the last entry of
  a one-token generation must find it there; a stop string's entries run to the token that
  completed it, whose offset may be past the cut text). ``top_logprobs`` maps the k most likely tokens, then
  the chosen one when it is not among them, to their log-probabilities (OpenAI's "up to logprobs + 1
  elements"). Every number is under the distribution of :attr:`codechat.engine.Token.logprob_t1`:
  temperature 1, after ``logit_bias`` and the penalties; a token among the top k gets the top's own
  number for both, so ``token_logprob == max(top_logprobs)`` tells a greedy token exactly. A token
  that is not UTF-8 on its own is spelled ``bytes:\\xNN...``, as OpenAI does. With ``echo`` the
  prompt's tokens come first (the string prompt's ``<|end|>`` included): the first has
  ``token_logprob`` and ``top_logprobs`` null, each other its log-probability given those before it,
  from one teacher-forced pass per prompt on the engine thread
  (:func:`codechat.engine.scoring.prompt_logprobs`; ``logit_bias`` applies there too).
- Also read: ``n``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``presence_penalty``,
  ``frequency_penalty``, ``logit_bias``, ``stream`` and ``stream_options.include_usage``, ``user``.
  Refused (400): ``suffix`` (no fill-in-the-middle), ``best_of`` other than ``n`` (no ranking on the
  server), ``max_tokens: 0`` without ``echo``, a prompt plus ``max_tokens`` over the context
  (``context_length_exceeded``), a ``logit_bias`` id outside the vocabulary.
"""
from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, AsyncIterator, Sequence

from codechat.engine import Request, SamplingConfig, Token
from codechat.engine.sampling import MAX_TOP_LOGPROBS
from codechat.engine.scoring import PromptLogprobs, prompt_logprobs
from codechat.tokenizer import Tokenizer

from .choices import ChoiceStream, CompletionIds, Delta, merge
from .config import ServeConfig
from .errors import APIError, bad
from .protocol import MAX_SEED, _int, _stop, check_body, read_bool, read_sampling, read_stream, sampling_options
from .worker import EngineClient, Job

DEFAULT_MAX_TOKENS = 16  #: OpenAI's default ``max_tokens`` for completions


@dataclass(frozen=True)
class CompletionRequest:
    """A checked completions request (module docstring).

    Attributes:
        prompts: each prompt's ids (a string's after one ``<|end|>``).
        budgets: each prompt's ``max_tokens`` (0: nothing generated; ``echo`` only).
        sampling: the settings every prompt shares but its budget.
        n: choices per prompt; ``seed``: the request's seed.
        stop: stop strings; ``stop_ids``: the special ids, each of which ends a choice.
        echo: the prompt comes first; ``logprobs``: the top-k of the legacy object (None: no log-probs).
        stream, include_usage: as chat's.
    """

    prompts: tuple[tuple[int, ...], ...]
    budgets: tuple[int, ...]
    sampling: SamplingConfig
    n: int
    seed: int
    stop: tuple[str, ...]
    stop_ids: tuple[int, ...]
    echo: bool = False
    logprobs: int | None = None
    stream: bool = False
    include_usage: bool = False

    @property
    def scored(self) -> bool:
        """Whether each prompt's log-probabilities are computed (``echo`` with ``logprobs``)."""
        return self.echo and self.logprobs is not None

    @property
    def rows(self) -> int:
        """Queue rows the request takes: ``n`` per prompt that generates, one per prompt scored."""
        return sum(self.n for b in self.budgets if b) + (len(self.prompts) if self.scored else 0)

    def engine_request(self, p: int) -> Request:
        """Prompt ``p``'s engine request: samples ``p * n .. p * n + n - 1`` (its choices' indices, so
        every choice draws its own noise)."""
        return Request(self.prompts[p], replace(self.sampling, max_new_tokens=self.budgets[p]),
                       samples=range(p * self.n, (p + 1) * self.n), seed=self.seed, stop_ids=self.stop_ids)


# ----------------------------------------------------------------------------- the request
def _prompts(body: Mapping[str, Any], tok: Tokenizer, vocab: int) -> list[list[int]]:
    """The ``prompt`` field as ids per prompt (module docstring).

    Raises:
        APIError: 400 (``param="prompt"``): another shape, an empty list of ids, an id outside
            ``[0, vocab)`` (the ids both the tokenizer and the model have).
    """
    v = body.get("prompt")
    shape = "must be a string, a list of strings, a list of token ids or a list of lists of token ids"
    is_id = lambda x: isinstance(x, int) and not isinstance(x, bool)  # noqa: E731
    if isinstance(v, str):
        texts, lists = [v], None
    elif isinstance(v, list) and v and all(isinstance(x, str) for x in v):
        texts, lists = v, None
    elif isinstance(v, list) and v and all(is_id(x) for x in v):
        texts, lists = None, [v]
    elif isinstance(v, list) and v and all(isinstance(x, list) and all(is_id(t) for t in x) for x in v):
        texts, lists = None, v
    else:
        raise bad("prompt", f"{shape}, got {json.dumps(v)[:60]}")
    if texts is not None:
        return [[tok.end_id] + ids for ids in tok.encode_batch(texts)]
    for k, ids in enumerate(lists):
        where = "prompt" if len(lists) == 1 else f"prompt[{k}]"
        if not ids:
            raise bad("prompt", f"{where} is an empty list of token ids")
        wrong = next((t for t in ids if not 0 <= t < vocab), None)
        if wrong is not None:
            raise bad("prompt", f"{where} holds {wrong}, not a token id of this model's vocabulary (0 to {vocab - 1})")
    return [list(ids) for ids in lists]


def _budgets(body: Mapping[str, Any], prompts: list[list[int]], echo: bool, max_len: int, cfg: ServeConfig
             ) -> tuple[int, ...]:
    """Each prompt's ``max_tokens``: the one asked for, else :data:`DEFAULT_MAX_TOKENS` (no more than
    the context leaves, nor than ``cfg.max_tokens``).

    Raises:
        APIError: 400 naming ``max_tokens`` (0 without ``echo``, over ``cfg.max_tokens``), or
            ``context_length_exceeded`` (``param="prompt"``) when a prompt and its tokens do not fit.
    """
    asked = _int(body, "max_tokens", 0, MAX_SEED)
    if asked == 0 and not echo:
        raise bad("max_tokens", "0 generates nothing: give 1 or more, or echo: true to get the prompt back (with "
                                "logprobs: its log-probabilities)")
    if asked is not None and asked > cfg.max_tokens > 0:
        raise bad("max_tokens", f"{asked} is over this server's limit of {cfg.max_tokens} (--max-tokens)")
    out = []
    for k, ids in enumerate(prompts):
        which, room = ("the prompt" if len(prompts) == 1 else f"prompt {k}"), max_len - len(ids)
        if asked is None and room < 1:
            raise APIError(400, f"This model's maximum context length is {max_len} tokens, and {which} takes "
                                f"{len(ids)}: shorten it", param="prompt", code="context_length_exceeded")
        if asked is not None and asked > room:
            raise APIError(400, f"This model's maximum context length is {max_len} tokens. However, you requested "
                                f"{len(ids) + asked} tokens ({len(ids)} in {which}, {asked} in the completion). "
                                "Please reduce the length of the prompt or max_tokens.",
                           param="prompt", code="context_length_exceeded")
        out.append(asked if asked is not None else min(DEFAULT_MAX_TOKENS, cfg.max_tokens or DEFAULT_MAX_TOKENS, room))
    return tuple(out)


def parse_completion_request(body: Any, tok: Tokenizer, max_len: int, vocab_size: int, cfg: ServeConfig
                             ) -> CompletionRequest:
    """Check a decoded ``POST /v1/completions`` body and encode its prompts (module docstring).

    Args:
        body: the decoded JSON body.
        tok: the model's tokenizer.
        max_len: the engine's context (prompt plus completion positions).
        vocab_size: the model's vocabulary (prompt and ``logit_bias`` ids are checked against the
            smaller of it and the tokenizer's).
        cfg: the server's limits.

    Raises:
        APIError: 400 for a malformed, refused or over-limit field (``param`` names it), 404 for a
            model other than ``cfg.model_name``.
    """
    body = check_body(body, cfg)
    if body.get("suffix") not in (None, ""):
        raise bad("suffix", "is not supported: codechat continues the prompt only (no fill-in-the-middle); leave "
                            "suffix out", "unsupported_parameter")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise bad("user", "must be a string")
    echo, vocab = read_bool(body, "echo"), min(vocab_size, tok.vocab_size)
    prompts = _prompts(body, tok, vocab)
    n = _int(body, "n", 1, cfg.max_n) or 1
    best_of = _int(body, "best_of", 1, MAX_SEED)
    if best_of is not None and best_of != n:
        raise bad("best_of", f"{best_of} with n {n}: codechat returns every sample and ranks none on the server; "
                             "leave best_of out (or equal to n) and rank the n choices by their logprobs",
                  "unsupported_parameter")
    logprobs = _int(body, "logprobs", 0, MAX_TOP_LOGPROBS)
    stream, include_usage = read_stream(body)
    budgets = _budgets(body, prompts, echo, max_len, cfg)
    temperature, top_p, seed = read_sampling(body)
    sampling = SamplingConfig(1, temperature, 0, top_p, top_logprobs=logprobs or 0, **sampling_options(body, vocab))
    return CompletionRequest(tuple(tuple(p) for p in prompts), budgets, sampling, n, seed, _stop(body, cfg),
                             tuple(sorted(tok.special_ids)), echo, logprobs, stream, include_usage)


# ----------------------------------------------------------------------------- one choice
def token_text(tok: Tokenizer, t: int) -> str:
    """Token ``t`` as the legacy ``tokens`` list spells it: its text, a special id's spelling, or
    ``bytes:\\xNN...`` for bytes that are not UTF-8 on their own (OpenAI's spelling)."""
    if t in tok.special_ids:
        return tok.decode([t])
    raw = tok.token_bytes(t)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def legacy_logprobs(entries: Sequence[dict[str, Any]]) -> dict[str, list]:
    """OpenAI's legacy ``logprobs`` object of per-token ``entries`` (``{"token", "logprob", "top", "offset"}``)."""
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [e["top"] for e in entries], "text_offset": [e["offset"] for e in entries]}


class TextChoice:
    """Choice ``index``: the echoed prompt, then the generated text built by a
    :class:`~.choices.ChoiceStream` (stop strings held back), with legacy log-prob entries.

    Args:
        tok: the model's tokenizer.
        index: the choice's index (its engine sample index).
        stop: stop strings.
        logprobs: the top-k of each entry; None: no log-probs.
    """

    def __init__(self, tok: Tokenizer, index: int, stop: Sequence[str], logprobs: int | None) -> None:
        self.tok, self.index, self.k = tok, index, logprobs
        self.reply = ChoiceStream(tok, index, stop=stop)
        self.text = ""  # every text sent so far
        self.entries: list[dict[str, Any]] | None = [] if logprobs is not None else None
        self._decoder = tok.stream(skip_special=True)  # the reply's text offsets, held-back text included
        self._offset = 0  # where the next generated token's text begins: after the echo, in the whole reply
        self._closed: str | None = None  # the finish of a choice that generates nothing

    @property
    def finish(self) -> str | None:
        """``stop`` or ``length`` once the choice is closed, else None."""
        return self._closed or self.reply.finish

    @property
    def tokens(self) -> int:
        """Generated tokens consumed (``usage.completion_tokens``)."""
        return self.reply.tokens

    def _entry(self, t: int, lp: float | None, top: Sequence[tuple[int, float]] | None, offset: int) -> dict:
        if lp is None:
            return {"token": token_text(self.tok, t), "logprob": None, "top": None, "offset": offset}
        best = dict(top or ())
        lp = best.get(t, lp)  # the same number twice: a greedy token's logprob equals the top's
        best.setdefault(t, lp)
        return {"token": token_text(self.tok, t), "logprob": lp,
                "top": {token_text(self.tok, i): v for i, v in best.items()}, "offset": offset}

    def open(self, prompt: Sequence[int] | None, scored: PromptLogprobs | None, done: bool) -> Delta:
        """The choice's first delta: the echoed ``prompt`` (None: no echo) with its entries (from
        ``scored``); closed (``length``) when ``done`` (``max_tokens`` 0)."""
        text, entries = "", []
        if prompt is not None:
            decoder = self.tok.stream(skip_special=True)
            for j, t in enumerate(prompt):
                if self.entries is not None:
                    got = scored if j and scored is not None else None
                    entries.append(self._entry(t, got.logprobs[j - 1] if got else None,
                                               got.top[j - 1][:self.k] if got else None, len(text)))
                text += decoder.push(t)
            text += decoder.flush()
        self._offset = len(text)
        self._closed = "length" if done else None
        return self._add(Delta(self.index, text, finish=self._closed), entries)

    def push(self, ev: Token) -> Delta:
        """The delta of the choice's next generated token ``ev`` (maybe no text yet)."""
        entries = [] if self.entries is None else [self._entry(ev.token, ev.logprob_t1, ev.top, self._offset)]
        self._offset += len(self._decoder.push(ev.token))
        d = self.reply.push(ev)
        return self._add(Delta(self.index, d.content, finish=d.finish), entries)

    def _add(self, d: Delta, entries: list[dict[str, Any]]) -> Delta:
        if self.entries is not None:
            self.entries += entries
            d.logprobs = entries
        self.text += d.content
        return d

    def object(self) -> dict[str, Any]:
        """The choice in a ``text_completion``."""
        return {"text": self.text, "index": self.index, "finish_reason": self.finish,
                "logprobs": legacy_logprobs(self.entries) if self.entries is not None else None}


# ----------------------------------------------------------------------------- the running request
async def _merged(jobs: Mapping[int, Job]) -> AsyncIterator[tuple[int, list[Token]]]:
    """``(prompt, tokens)``: each job's batches of tokens (:meth:`Job.events`) as they come, until every
    job is done; the first error of one is raised."""
    queue: asyncio.Queue[tuple[int, list[Token] | BaseException | None]] = asyncio.Queue()

    async def pump(p: int, job: Job) -> None:
        try:
            async for events in job.events():
                queue.put_nowait((p, events))
            queue.put_nowait((p, None))
        except Exception as e:  # an APIError of the engine thread: the reader raises it
            queue.put_nowait((p, e))

    tasks = [asyncio.ensure_future(pump(p, job)) for p, job in jobs.items()]
    try:
        left = len(tasks)
        while left:
            p, item = await queue.get()
            if item is None:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield p, item
    finally:
        for t in tasks:
            t.cancel()


class TextCompletion:
    """A :class:`CompletionRequest` on the engine thread: one job per prompt that generates, one
    scoring pass per prompt when ``echo`` asks for log-probabilities, the choices they feed, and the
    ``text_completion`` object (:meth:`whole`) or its chunks (:meth:`chunks`): the same deltas, so a
    stream joined equals the whole answer.

    Args:
        req: the checked request.
        tok: the model's tokenizer.
        model: the served model's name.
    """

    def __init__(self, req: CompletionRequest, tok: Tokenizer, model: str) -> None:
        self.req = req
        self.ids = CompletionIds(model, id=f"cmpl-{secrets.token_hex(12)}")
        self.choices = [TextChoice(tok, i, req.stop, req.logprobs) for i in range(len(req.prompts) * req.n)]
        self.jobs: dict[int, Job] = {}
        self.scores: list[asyncio.Future[PromptLogprobs]] = []
        self._cancelled = False

    def start(self, worker: EngineClient) -> None:
        """Queue the engine requests and scoring passes (call from a coroutine).

        Raises:
            QueueFull: the rows do not fit beside those in flight (nothing of this request stays queued).
        """
        k, bias = self.req.logprobs or 0, self.req.sampling.logit_bias
        try:
            for p, budget in enumerate(self.req.budgets):
                if budget:
                    self.jobs[p] = worker.submit(self.req.engine_request(p))
            if self.req.scored:
                for ids in self.req.prompts:
                    self.scores.append(worker.call(partial(prompt_logprobs, ids=ids, top=k, logit_bias=bias)))
        except Exception:
            self.cancel()
            raise

    def cancel(self) -> None:
        """Stop every row and scoring pass not yet done (a client that left)."""
        self._cancelled = True
        for job in self.jobs.values():
            job.cancel()
        for f in self.scores:
            f.cancel()

    async def _scored(self) -> list[PromptLogprobs | None]:
        if not self.scores:
            return [None] * len(self.req.prompts)
        try:
            return [await f for f in self.scores]
        except asyncio.CancelledError:
            if not self._cancelled:
                raise
            raise bad(None, "the client disconnected before its answer was ready", "client_disconnected") from None
        except Exception as e:  # the engine failed: the request cannot be answered
            raise APIError(500, f"the engine failed scoring the prompt: {type(e).__name__}: {e}",
                           type="server_error") from None

    async def deltas(self) -> AsyncIterator[list[Delta]]:
        """Each choice's opening delta (:meth:`TextChoice.open`), then the deltas of each batch of
        tokens in the order they came; closes a choice's row at its stop string and cancels what is
        left when the reader leaves."""
        req = self.req
        try:
            scored = await self._scored()
            yield [c.open(req.prompts[c.index // req.n] if req.echo else None, scored[c.index // req.n],
                          req.budgets[c.index // req.n] == 0) for c in self.choices]
            async for p, events in _merged(self.jobs):
                batch = []
                for ev in events:
                    c = self.choices[ev.sample]
                    if c.finish is not None:
                        continue  # closed by a stop string; its row is being cancelled
                    batch.append(c.push(ev))
                    if c.finish is not None and ev.finish is None:
                        self.jobs[p].cancel(ev.sample)
                yield batch
        finally:
            if any(c.finish is None for c in self.choices):
                self.cancel()

    def usage(self) -> dict[str, int]:
        """OpenAI's ``usage``: every prompt's ids once (its ``n`` choices share one prefill) and every
        choice's generated tokens (closing special ids included)."""
        prompt = sum(len(p) for p in self.req.prompts)
        done = sum(c.tokens for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}

    def _base(self) -> dict[str, Any]:
        return {"id": self.ids.id, "object": "text_completion", "created": self.ids.created, "model": self.ids.model,
                "system_fingerprint": None}

    async def whole(self) -> dict[str, Any]:
        """The ``text_completion`` object, once every choice closed."""
        async for _ in self.deltas():
            pass
        return {**self._base(), "choices": [c.object() for c in self.choices], "usage": self.usage()}

    async def chunks(self) -> AsyncIterator[dict[str, Any] | str]:
        """The stream: one ``text_completion`` chunk per choice per batch (text, log-prob entries,
        finish reason), then with ``include_usage`` a chunk of no choices and the ``usage``, then
        ``"[DONE]"``; an error after the first chunk is sent as OpenAI's error object, and ends it."""
        try:
            async for batch in self.deltas():
                for d in merge(batch):
                    if d.content or d.finish or d.logprobs:
                        lp = legacy_logprobs(d.logprobs or []) if self.req.logprobs is not None else None
                        yield {**self._base(), "choices": [{"text": d.content, "index": d.index, "logprobs": lp,
                                                            "finish_reason": d.finish}]}
        except APIError as e:
            yield e.body()
            return
        if self.req.include_usage:
            yield {**self._base(), "choices": [], "usage": self.usage()}
        yield "[DONE]"


__all__ = ["CompletionRequest", "DEFAULT_MAX_TOKENS", "TextChoice", "TextCompletion", "legacy_logprobs",
           "parse_completion_request", "token_text"]
