"""An engine's first-use work done before its first request: compiling and capturing.

On CUDA the engine compiles its decode step and captures a CUDA graph the first time it meets a
batch bucket and a kind of rows (:class:`~.options.LaunchKind`), and captures a prefill graph the
first time it meets a prompt-token bucket (:data:`~.prefill.BUCKETS`). Met by a server's first
requests, that work lands on them: a fresh H100's serve round at 64 clients ran at 0.38x its engine,
against 0.67-0.70x once an earlier round had met the buckets (``benchmarks/RESULTS.md``, twelfth
session). :func:`warm_up` meets them all first; ``codechat serve`` calls it as its engine starts
(``EngineConfig.warm_up``), as vLLM captures its batch sizes at start.
"""
from __future__ import annotations

import time
from typing import Protocol, Sequence

from .prefill import BUCKETS
from .rows import StepCounters
from .sampling import SamplingConfig
from .types import EngineConfig, Request, Sample


class Warmable(Protocol):
    """What :func:`warm_up` uses of a :class:`~.scheduler.Engine` (which builds and calls it)."""

    config: EngineConfig
    decode_steps: int
    max_len: int
    slots: int
    counters: StepCounters

    def has_work(self) -> bool: ...
    def batch_buckets(self) -> list[int]: ...
    def generate(self, requests: Sequence[Request], deadline: float | None = None) -> list[list[Sample]]: ...


def warm_up(engine: Warmable) -> float:
    """Generate on ``engine`` what meets every batch bucket (:meth:`~.scheduler.Engine.batch_buckets`)
    with greedy rows and with sampled ones (temperature 1, no top-k or top-p: OpenAI's defaults), and
    every prefill bucket that the engine's context and slots can fill; then zero its step counters.
    Other kinds (top-p, penalties, ``logit_bias``, ``top_logprobs``, grammars) still meet their first
    use with a request. Returns the seconds it took.

    Raises:
        RuntimeError: the engine has work (warm it up before the first request).
    """
    if engine.has_work():
        raise RuntimeError("warm_up: the engine already has requests; warm it up before the first one")
    t0 = time.perf_counter()
    new = engine.decode_steps  # every row's first token comes from its first decode launch: one launch
    for b in engine.batch_buckets():
        for temperature in (0.0, 1.0):
            engine.generate([Request([1, 2], SamplingConfig(new, temperature, 0, 1.0), seed=i) for i in range(b)])
    longest = engine.max_len - 1  # a prompt's tokens but its last are prefilled; one position for the reply
    for bucket in BUCKETS:  # prompts whose prefilled tokens sum to the bucket exactly
        rows = -(-bucket // (longest - 1))
        if rows > engine.slots or bucket > engine.config.max_prefill_tokens:
            break
        sizes = [bucket // rows + (i < bucket % rows) for i in range(rows)]
        engine.generate([Request([3] * (n + 1), SamplingConfig(1, 0.0, 0, 1.0)) for n in sizes])
    engine.counters = StepCounters()
    return time.perf_counter() - t0
