"""Teacher-forced scoring: the log-probability of each token of a known sequence, in one forward pass.

:func:`forced_logprobs` runs the engine's inference model over a whole sequence at once (a prefill
that writes no cache slot, so it can run between two engine steps without disturbing a running
batch) and returns, for every position from ``first`` on, the log-probability of the token there
given those before it, and the ``top`` most likely tokens. Both are under the distribution of
:attr:`~.types.Token.logprob_t1`: the plain softmax (temperature 1) of the model's logits plus any
``logit_bias`` (:func:`~.sampling.adjust`; the penalties count generated tokens, so none apply to a
known sequence). Logits are materialised :data:`LOGITS_CHUNK` positions at a time, so a long
sequence never holds a (length, vocabulary) matrix.

- :meth:`codechat.engine.Engine.score`: a completion's log-probabilities after a prompt
  (mean log-probability ranking, :mod:`.completion`);
- :func:`prompt_logprobs`: every token of a prompt after the first, with the top-k (the server's
  ``echo`` with ``logprobs``: the log-likelihood requests of lm-evaluation-harness).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from .runner import InferenceModel, KVCache
from .sampling import MAX_TOP_LOGPROBS, adjust

#: Positions whose (N, vocabulary) float32 logits are held at once (512 x 64k ids: 128 MiB).
LOGITS_CHUNK = 512


class Forwarding(Protocol):
    """What a teacher-forced pass needs of an engine (:class:`codechat.engine.Engine` has it)."""

    model: InferenceModel
    cache: KVCache
    device: torch.device
    max_len: int


@dataclass(frozen=True)
class PromptLogprobs:
    """Log-probabilities of a prompt's tokens ``ids[1:]``, each given the tokens before it.

    Attributes:
        logprobs: ``len(ids) - 1`` floats: token ``ids[i + 1]``'s log-probability.
        top: per position, the ``top`` most likely ``(id, log-probability)`` pairs, best first
            (empty tuples when ``top`` is 0).
    """

    logprobs: list[float]
    top: list[tuple[tuple[int, float], ...]]


@torch.inference_mode()
def forced_logprobs(engine: Forwarding, ids: Sequence[int], first: int, top: int = 0,
                    logit_bias: Sequence[tuple[int, float]] = ()
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities of ``ids[first:]``, each given the ids before it: one teacher-forced pass
    (module docstring; no cache slot is written).

    Args:
        engine: the engine whose inference model runs the pass.
        ids: the whole sequence.
        first: the first position scored (>= 1: the first token has no context).
        top: the most likely tokens to return per position, 0..:data:`~.sampling.MAX_TOP_LOGPROBS`.
        logit_bias: ``(id, bias)`` pairs added to the logits first.

    Returns:
        ``(logprobs, top_ids, top_logprobs)`` on the CPU: (M,) float32 with ``M = len(ids) - first``,
        (M, top) int64 and (M, top) float32, best first.

    Raises:
        ValueError: ``first`` outside ``[1, len(ids) - 1]``, a sequence over the engine's
            ``max_len``, or ``top`` out of range.
    """
    n = len(ids)
    if not 1 <= first < n:
        raise ValueError(f"need at least one token before and one after position {first}, got {n} tokens")
    if n > engine.max_len:
        raise ValueError(f"a sequence of {n} tokens is over the engine's context of {engine.max_len}")
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top must be in [0, {MAX_TOP_LOGPROBS}], got {top}")
    dev, m = engine.device, engine.model
    none = torch.zeros(0, dtype=torch.long, device=dev)
    cu = torch.tensor([0, n], dtype=torch.int32, device=dev)
    tokens = torch.tensor(list(ids), device=dev)
    h = m.forward(tokens, torch.arange(n, device=dev), m.prefill_attend(engine.cache, [n], cu, (none, none, none)))
    bias = None
    if logit_bias:
        bias = (torch.tensor([[i for i, _ in logit_bias]], device=dev), torch.tensor([[v for _, v in logit_bias]],
                                                                                     device=dev))
    chosen, best_ids, best = [], [], []
    for start in range(first - 1, n - 1, LOGITS_CHUNK):  # position p's logits predict token p + 1
        stop = min(start + LOGITS_CHUNK, n - 1)
        logits = m.logits(h[start:stop])  # (c, V) float32
        if bias is not None:
            c = logits.size(0)
            logits = adjust(logits, None, none, none, bias[0].expand(c, -1), bias[1].expand(c, -1))
        lp = logits.log_softmax(-1)
        chosen.append(lp.gather(1, tokens[start + 1:stop + 1].unsqueeze(1)).squeeze(1))
        if top:
            v, i = lp.topk(top, dim=-1)
            best.append(v)
            best_ids.append(i)
    empty = torch.zeros(n - first, 0)
    return (torch.cat(chosen).cpu(), torch.cat(best_ids).cpu() if top else empty.long(),
            torch.cat(best).cpu() if top else empty)


def prompt_logprobs(engine: Forwarding, ids: Sequence[int], top: int = 0,
                    logit_bias: Sequence[tuple[int, float]] = ()) -> PromptLogprobs:
    """Every token of the prompt ``ids`` after the first with its log-probability and the ``top``
    most likely tokens at its position (:func:`forced_logprobs`); a one-token prompt has none.
    Run it where the engine runs (it is not thread-safe: the server's engine thread).

    Raises:
        ValueError: a prompt over the engine's ``max_len``, or ``top`` out of range.
    """
    if len(ids) < 2:
        return PromptLogprobs([], [])
    lp, top_ids, top_lp = forced_logprobs(engine, ids, 1, top, logit_bias)
    pairs = [tuple(zip(i, v)) for i, v in zip(top_ids.tolist(), top_lp.tolist())]
    return PromptLogprobs(lp.tolist(), pairs)


__all__ = ["Forwarding", "LOGITS_CHUNK", "PromptLogprobs", "forced_logprobs", "prompt_logprobs"]
