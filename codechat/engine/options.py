"""OpenAI's per-row sampling options beyond temperature, top-k and top-p, as device tables of the
engine's slots: ``presence_penalty`` / ``frequency_penalty`` (with each row's counts of the tokens it
generated), ``logit_bias`` and ``top_logprobs`` (:class:`~.sampling.SamplingConfig` documents them,
:func:`~.sampling.adjust` and :func:`~.sampling.top_logprobs` compute them).

A launch applies an option only when one of its rows uses it (:class:`LaunchKind`, part of the key
of each captured CUDA graph): a batch in which no row uses any runs exactly the steps it ran before
the options existed. The tables are allocated the first time a row needs them: the counts are
(slots, vocabulary) float32 (32 MB for 256 slots of a 32k vocabulary), the biases (slots,
:data:`~.sampling.MAX_LOGIT_BIAS`) ids and values.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import torch

from .sampling import MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS, SamplingConfig, adjust, top_logprobs


class LaunchKind(NamedTuple):
    """What a launch's rows use: ``filtered`` (any sampled row has top-k or top-p), ``sampled`` (any
    row has a temperature above 0), ``penalized`` (presence or frequency penalties), ``biased``
    (``logit_bias``), ``top`` (``top_logprobs``)."""

    filtered: bool
    sampled: bool
    penalized: bool = False
    biased: bool = False
    top: bool = False


def launch_kind(configs: Sequence[SamplingConfig]) -> LaunchKind:
    """The :class:`LaunchKind` of rows with sampling settings ``configs`` (greedy rows filter nothing)."""
    sampled = [c for c in configs if c.temperature > 0]
    return LaunchKind(any(c.top_k > 0 or c.top_p < 1.0 for c in sampled), bool(sampled),
                      any(c.penalized for c in configs), any(c.logit_bias for c in configs),
                      any(c.top_logprobs for c in configs))


class RowOptions:
    """The option tables of ``slots`` rows over a ``vocab_size`` vocabulary on ``device``.

    Index ``idx`` is a slice of the first slots (a decode step) or a (B,) int64 tensor of slots (a prefill).
    """

    def __init__(self, slots: int, vocab_size: int, device: torch.device) -> None:
        self.slots, self.vocab_size, self.device = slots, vocab_size, device
        self.presence = torch.zeros(slots, device=device)
        self.frequency = torch.zeros(slots, device=device)
        self.counts: torch.Tensor | None = None  # (S, V) float32: each row's generated tokens
        self.bias_ids: torch.Tensor | None = None  # (S, MAX_LOGIT_BIAS) int64 (unused entries: id 0, bias 0)
        self.bias: torch.Tensor | None = None

    def admit(self, slots: torch.Tensor, configs: Sequence[SamplingConfig],
              h2d: Callable[[list, torch.dtype], torch.Tensor]) -> None:
        """Set the tables of new rows in ``slots`` ((B,) int64 on the device) with settings ``configs``
        (``h2d`` copies host lists to the device without a sync)."""
        if any(c.penalized for c in configs) and self.counts is None:
            self.counts = torch.zeros(self.slots, self.vocab_size, device=self.device)
        if any(c.logit_bias for c in configs) and self.bias_ids is None:
            self.bias_ids = torch.zeros(self.slots, MAX_LOGIT_BIAS, dtype=torch.long, device=self.device)
            self.bias = torch.zeros(self.slots, MAX_LOGIT_BIAS, device=self.device)
        self.presence[slots] = h2d([c.presence_penalty for c in configs], torch.float32)
        self.frequency[slots] = h2d([c.frequency_penalty for c in configs], torch.float32)
        if self.counts is not None:
            self.counts[slots] = 0.0
        if self.bias_ids is not None:
            pad = [(0, 0.0)] * MAX_LOGIT_BIAS
            entries = [(list(c.logit_bias) + pad)[:MAX_LOGIT_BIAS] for c in configs]
            self.bias_ids[slots] = h2d([[i for i, _ in e] for e in entries], torch.long)
            self.bias[slots] = h2d([[v for _, v in e] for e in entries], torch.float32)

    def apply(self, idx: slice | torch.Tensor, logits: torch.Tensor, kind: LaunchKind) -> torch.Tensor:
        """``logits`` (B, V) of rows ``idx`` with the penalties and biases ``kind`` says are in use."""
        if not (kind.penalized or kind.biased):
            return logits
        return adjust(logits, self.counts[idx] if kind.penalized else None, self.presence[idx], self.frequency[idx],
                      self.bias_ids[idx] if kind.biased else None, self.bias[idx] if kind.biased else None)

    def count(self, idx: slice | torch.Tensor, tokens: torch.Tensor, go: torch.Tensor, kind: LaunchKind) -> None:
        """Add each row's new token ``tokens`` (B,) to its counts where ``go`` (B,) bool (penalized launches)."""
        if not kind.penalized:
            return
        if isinstance(idx, slice):
            self.counts[idx].scatter_add_(1, tokens.unsqueeze(1), go.float().unsqueeze(1))
        else:
            self.counts.index_put_((idx, tokens), go.float(), accumulate=True)

    @staticmethod
    def top(logits: torch.Tensor, kind: LaunchKind) -> tuple[torch.Tensor, ...]:
        """``(ids, log-probabilities)`` ((B, :data:`~.sampling.MAX_TOP_LOGPROBS`) each) when a row asks
        for ``top_logprobs``, else ``()``."""
        return top_logprobs(logits, MAX_TOP_LOGPROBS) if kind.top else ()
