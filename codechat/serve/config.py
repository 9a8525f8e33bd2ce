"""``ServeConfig``: the limits of ``codechat serve`` — what one request may ask for, and how many wait."""
from __future__ import annotations

from dataclasses import dataclass

from codechat.config.stages import ConfigError

#: OpenAI's own limit on ``stop`` strings per request.
OPENAI_MAX_STOP = 4


@dataclass(frozen=True)
class ServeConfig:
    """Names and limits of the OpenAI-compatible server (:mod:`codechat.serve.app`).

    A request over a limit gets HTTP 400 (413 for the body size, 429 for the queue) with an
    OpenAI-style error object naming the field; the engine's own settings (slots, context) are
    :class:`codechat.engine.EngineConfig`'s.

    Attributes:
        model_name: the model id the server answers to: listed by ``GET /v1/models`` and echoed in
            every response; a request naming another model gets 404 ``model_not_found``.
        max_body_bytes: request body size at most, in bytes; larger gets 413.
        max_messages: messages in one request at most.
        max_tokens: ``max_tokens`` (or ``max_completion_tokens``) a request may ask for at most;
            0: any that fits the context. A request without it gets what the context leaves after
            its prompt, capped by this. Prompt plus ``max_tokens`` over the context is a 400
            ``context_length_exceeded``, as OpenAI answers; nothing is cut silently.
        max_n: choices (``n``) per request at most; they share one prefill.
        max_stop: ``stop`` strings per request at most (OpenAI allows 4).
        max_tools: ``tools`` per request at most.
        max_depth: how deep the request body's JSON may nest (``{"a": [1]}`` is 2 deep); deeper
            gets 400. It keeps a tool schema within what JSON Schema validation can recurse into.
        queue_size: sample rows (a request of ``n`` choices is ``n`` rows) that may wait for a free
            KV-cache slot besides those decoding; a request whose rows do not fit gets 429.
        retry_after_s: seconds a 429 tells the client to wait (its ``Retry-After`` header).

    Raises:
        ConfigError: a value out of range; the message names the ``--flag`` to change.
    """

    model_name: str = "codechat"
    max_body_bytes: int = 1 << 20
    max_messages: int = 256
    max_tokens: int = 0
    max_n: int = 16
    max_stop: int = OPENAI_MAX_STOP
    max_tools: int = 64
    max_depth: int = 64
    queue_size: int = 256
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        if not self.model_name.strip():
            raise ConfigError("--served-model-name must not be empty")
        for name in ("max_body_bytes", "max_messages", "max_n", "max_stop", "max_tools", "max_depth", "retry_after_s"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.max_tokens < 0:
            raise ConfigError(f"--max-tokens must be >= 0 (0: what the context leaves), got {self.max_tokens}")
        if self.queue_size < 0:
            raise ConfigError(f"--queue-size must be >= 0 (0: no waiting, only free slots), got {self.queue_size}")
