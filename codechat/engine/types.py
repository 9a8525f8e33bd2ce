"""What goes into the engine and what comes out: :class:`EngineConfig`, :class:`Request`, the
:class:`Token` events of a running row and a row's whole :class:`Sample`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from .sampling import SamplingConfig

if TYPE_CHECKING:
    from .grammar import Grammar

#: How a row ends: ``stop`` (a stop id, or its grammar complete), ``length`` (``max_new_tokens``
#: reached first), ``cancelled`` (:meth:`Engine.cancel`, a deadline), ``rejected`` (its grammar did not
#: allow the token sampled under its own mask: an engine bug, reported, never passed off as ``stop``).
FINISH_REASONS = ("stop", "length", "cancelled", "rejected")
CPU_CACHE_BYTES = 1 << 30  #: the automatic slot count keeps a CPU cache under this


@dataclass(frozen=True)
class EngineConfig:
    """How the engine lays out memory and runs steps.

    Attributes:
        slots: sequences decoded at once (KV-cache slots); 0 picks 256 on CUDA (fewer when the
            cache would take over ``cache_memory_frac`` of free GPU memory) and 16 elsewhere
            (fewer when the cache would pass :data:`CPU_CACHE_BYTES`).
        max_len: positions per slot, prompt plus generated tokens; 0 is the model's
            ``max_seq_len``, which bounds it. A request longer than this is refused when it is added.
        max_prefill_tokens: prompt tokens prefilled in one step at most (one prompt always goes).
        cuda_graphs: capture each decode batch size in a CUDA graph (CUDA only).
        compile: fuse the elementwise work between matmuls with ``torch.compile`` (CUDA only).
        dtype: ``auto`` (bf16 on CUDA, fp32 elsewhere: bf16 matmuls are ~50x slower on CPUs
            without native support), ``bf16`` or ``fp32``.
        cache_memory_frac: share of free GPU memory the automatic ``slots`` may give the cache.
        attention: decode attention kernel (:class:`codechat.engine.runner.InferenceModel`):
            ``auto``, ``triton``, ``flash`` or ``sdpa``.
        decode_steps: decode steps per launch (one graph replay, one read-back); 0 picks 4 on
            CUDA (the host's per-step work — graph launch, read-back, bookkeeping — is paid once
            per 4 tokens) and 1 elsewhere. Tokens then come back that many at a time, and a
            waiting request joins up to that many steps later. Samples do not depend on it.
        warm_up: on CUDA, compile and capture every decode batch bucket (greedy and sampled rows)
            and every prefill bucket as the engine is built (:func:`codechat.engine.warmup.warm_up`),
            so that no request pays that first-use work; ``codechat serve`` turns it on.

    Raises:
        ValueError: a value out of range.
    """

    slots: int = 0
    max_len: int = 0
    max_prefill_tokens: int = 16384
    cuda_graphs: bool = True
    compile: bool = True
    dtype: str = "auto"
    cache_memory_frac: float = 0.5
    attention: str = "auto"
    decode_steps: int = 0
    warm_up: bool = False

    def __post_init__(self) -> None:
        if self.decode_steps < 0:
            raise ValueError(f"decode_steps must be >= 0 (0: automatic), got {self.decode_steps}")
        if self.slots < 0 or self.max_len < 0 or self.max_prefill_tokens < 1:
            raise ValueError(f"slots and max_len must be >= 0 and max_prefill_tokens >= 1, got "
                             f"{self.slots}, {self.max_len}, {self.max_prefill_tokens}")
        if self.dtype not in ("auto", "bf16", "fp32"):
            raise ValueError(f"dtype must be auto, bf16 or fp32, got {self.dtype!r}")
        if self.attention not in ("auto", "triton", "flash", "sdpa"):
            raise ValueError(f"attention must be auto, triton, flash or sdpa, got {self.attention!r}")
        if not 0.0 < self.cache_memory_frac <= 1.0:
            raise ValueError(f"cache_memory_frac must be in (0, 1], got {self.cache_memory_frac}")


@dataclass(frozen=True)
class Request:
    """A prompt to continue.

    Attributes:
        prompt: token ids (at least one).
        sampling: temperature, top-k, top-p and ``max_new_tokens``.
        samples: how many samples (an int n: indices ``0..n-1``) or which sample indices to draw.
            Sample ``i`` of seed ``s`` is the same whatever else runs beside it.
        seed: the request's seed.
        stop_ids: a row that emits one of these finishes with reason ``stop`` (the id is kept).
        grammar: a compiled constraint (:class:`codechat.engine.grammar.Grammar`) every row of the
            request follows: tokens it forbids get probability 0 before temperature, top-k and
            top-p, both returned log-probs are taken after that mask, and a row also finishes
            (``stop``) when its grammar is complete. None: free.
    """

    prompt: Sequence[int]
    sampling: SamplingConfig = SamplingConfig()
    samples: int | Sequence[int] = 1
    seed: int = 0
    stop_ids: Sequence[int] = ()
    grammar: Grammar | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", tuple(int(t) for t in self.prompt))
        s = self.samples
        object.__setattr__(self, "samples", tuple(range(s)) if isinstance(s, int) else tuple(int(i) for i in s))
        object.__setattr__(self, "stop_ids", tuple(int(t) for t in self.stop_ids))
        if not self.prompt:
            raise ValueError("empty prompt: give at least one token (e.g. <|bos|>)")
        if len(set(self.samples)) != len(self.samples) or any(i < 0 for i in self.samples):
            raise ValueError(f"samples must be distinct indices >= 0, got {self.samples}")


@dataclass(frozen=True)
class Token:
    """One generated token of row ``(request, sample)``: its id, its log-probability under the
    distribution it was drawn from (0 for greedy) and under temperature 1, and ``finish``
    (:data:`FINISH_REASONS`) on a row's last token, else None; ``top``: with ``top_logprobs`` k,
    the k most likely ``(id, log-probability)`` at this position under temperature 1, best first."""

    request: int
    sample: int
    token: int
    logprob: float
    logprob_t1: float
    finish: str | None
    top: tuple[tuple[int, float], ...] | None = None


@dataclass
class Sample:
    """A row's whole output: ``token_ids`` (the stop id included), per-token ``logprobs`` and
    ``logprobs_t1`` (as in :class:`Token`), ``finish`` (one of :data:`FINISH_REASONS`, None
    while running), ``error``: why a ``rejected`` row was ("" otherwise), and ``top_logprobs``:
    each position's :attr:`Token.top` (empty without ``top_logprobs``)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    logprobs_t1: list[float] = field(default_factory=list)
    finish: str | None = None
    error: str = ""
    top_logprobs: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
