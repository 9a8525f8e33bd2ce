"""Choosing the next token: temperature, top-k, top-p, greedy, and the log-probs of the choice.

Every row of a batch carries its own settings and its own random stream. The randomness is
counter-based: the noise for row ``r``, generated position ``c`` and vocabulary entry ``v`` is a
hash of ``(seed_r, c, v)``, so a request's samples depend on its seed and sample index alone —
never on which other requests share its batch, on the batch's order, or on how many steps ran
before it joined. That is what lets a resumed evaluation or RL run redraw exactly the samples an
uninterrupted one would have drawn (same device and software).

Before temperature, OpenAI's adjustments apply to the logits of the rows that ask for them
(:func:`adjust`): ``presence_penalty`` and ``frequency_penalty`` over the tokens the row has
generated so far, ``mu[j] - c[j] * frequency_penalty - (c[j] > 0) * presence_penalty`` (OpenAI, "Text
generation: parameter details"; ``c[j]`` how often token ``j`` was generated), then ``logit_bias``
added per token id. ``top_logprobs`` are the most likely tokens under the same plain softmax as
``logprob_t1`` (temperature 1, after a grammar's mask and these adjustments).

A draw is the Gumbel-max trick: ``argmax(logits / T + g)`` with ``g = -log(-log(u))`` and ``u``
uniform is an exact sample of ``softmax(logits / T)`` (Gumbel 1954; Maddison et al. 2014, "A*
Sampling", §2). Filters follow Hugging Face's order: temperature, then top-k, then top-p
(nucleus sampling, Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration").
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

_M31 = (1 << 31) - 1
#: Most ``logit_bias`` entries a row may carry (OpenAI documents no limit; 300 keeps the device
#: table small: one (slots, 300) id and bias table).
MAX_LOGIT_BIAS = 300
#: Most ``top_logprobs`` (OpenAI's limit); the engine computes this many whenever a row asks for any.
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen, and how many may be generated.

    Attributes:
        max_new_tokens: generated tokens at most (the stop token, when one ends the row, counts).
        temperature: 0 is greedy (argmax); otherwise logits are divided by it.
        top_k: keep the k most likely tokens; 0 keeps all.
        top_p: keep the smallest set of most likely tokens whose probability reaches top_p
            (the first token always stays); 1.0 keeps all.
        presence_penalty: subtracted from the logit of every token generated at least once so
            far, in [-2, 2] (module docstring; OpenAI's semantics).
        frequency_penalty: subtracted once per time a token was generated so far, in [-2, 2].
        logit_bias: ``(token id, bias)`` pairs (a dict is accepted), bias in [-100, 100] added to
            that id's logit (-100 bans it in effect, 100 makes it all but certain); at most
            :data:`MAX_LOGIT_BIAS` ids, each below the model's vocabulary (checked by the engine).
        top_logprobs: 0, or how many of the most likely tokens (up to :data:`MAX_TOP_LOGPROBS`)
            to return with their log-probabilities at each generated position.

    Raises:
        ValueError: a value out of range.
    """

    max_new_tokens: int = 256
    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 0.95
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0 or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_k must be >= 0 and top_p in (0, 1], got {self.top_k}, {self.top_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2] (OpenAI's range), got {getattr(self, name)}")
        bias = tuple((int(i), float(v)) for i, v in dict(self.logit_bias).items())
        object.__setattr__(self, "logit_bias", bias)
        if len(bias) > MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias has {len(bias)} entries; at most {MAX_LOGIT_BIAS}")
        bad = next(((i, v) for i, v in bias if i < 0 or not -100.0 <= v <= 100.0), None)
        if bad is not None:
            raise ValueError(f"logit_bias {{{bad[0]}: {bad[1]}}}: ids are >= 0 and biases in [-100, 100]")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")

    @property
    def penalized(self) -> bool:
        """Whether the presence or frequency penalty is in use."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def _hash31(x: torch.Tensor) -> torch.Tensor:
    """A 31-bit integer mixing function on int64 tensors holding values in [0, 2^31).

    xorshift-multiply rounds in the style of Wellons' "lowbias32", with 31-bit constants so that
    no int64 product overflows.
    """
    x = x & _M31
    x = x ^ (x >> 16)
    x = (x * 0x2C1B3C6D) & _M31
    x = x ^ (x >> 15)
    x = (x * 0x297A2D39) & _M31
    return x ^ (x >> 16)


def row_seed(seed: int, sample: int) -> int:
    """The 31-bit noise seed of sample ``sample`` of a request seeded ``seed`` (any Python ints)."""
    h = _hash31(torch.tensor([(seed ^ (seed >> 31) ^ (seed >> 62)) & _M31], dtype=torch.long))
    return int(_hash31((h + sample * 0x9E3779B1) & _M31))


def gumbel_noise(seeds: torch.Tensor, counters: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise for vocabulary ids ``ids`` (B, V) int64 of rows with ``seeds`` and
    ``counters`` (B,) int64 (the generated position). Returns (B, V) float32, a pure function of
    ``(seed, counter, id)``.
    """
    row = _hash31(seeds + _hash31(counters * 0x5BD1E995 + 0x1B873593))
    h = _hash31(row.unsqueeze(1) + _hash31(ids * 0x27D4EB2F + 0x165667B1))
    # 23 bits: (2^23 - 1 + 0.5) / 2^23 = 1 - 2^-24 is exact in float32, so u stays strictly inside (0, 1).
    # (24 bits rounded 2^24 - 0.5 up to 2^24: u = 1, noise +inf, and that id won whatever its logit,
    # -inf included: about one token in 512 with a 32k vocabulary.)
    u = ((h >> 8).float() + 0.5) * (1.0 / (1 << 23))
    return -torch.log(-torch.log(u))


@dataclass
class RowParams:
    """Per-row sampling settings as device tensors, (B,) each.

    ``temperature`` float32 (0: greedy), ``top_k`` int64 (0: off), ``top_p`` float32 (1: off),
    ``seed`` int64 (from :func:`row_seed`), ``counter`` int64 (tokens this row has generated).
    ``filtered`` says whether any row uses top-k or top-p (the sort is skipped when none does);
    ``sampled`` whether any row has a temperature above 0.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seed: torch.Tensor
    counter: torch.Tensor
    filtered: bool = True
    sampled: bool = True


def adjust(logits: torch.Tensor, counts: torch.Tensor | None, presence: torch.Tensor, frequency: torch.Tensor,
           bias_ids: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """OpenAI's penalties and ``logit_bias`` applied to ``logits`` (B, V) float32 (module docstring).

    Args:
        counts: (B, V) float32, how often each token was generated so far per row; None: no penalties.
        presence, frequency: (B,) float32 penalties (0 for a row without them).
        bias_ids: (B, K) int64 ids and ``bias`` (B, K) float32 values (0 for unused entries); None: no bias.

    Returns:
        New (B, V) float32 logits (``-inf`` stays ``-inf``).
    """
    if counts is not None:
        logits = logits - frequency.unsqueeze(1) * counts - presence.unsqueeze(1) * (counts > 0)
    if bias_ids is not None:
        logits = logits.scatter_add(1, bias_ids, bias)
    return logits


def top_logprobs(logits: torch.Tensor, k: int = MAX_TOP_LOGPROBS) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely tokens of each row of ``logits`` (B, V) under the plain softmax
    (temperature 1): ``(ids (B, k) int64, log-probabilities (B, k) float32)``, best first."""
    lp, ids = logits.log_softmax(dim=-1).topk(k, dim=-1)
    return ids, lp


def sample(logits: torch.Tensor, p: RowParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draw one token per row.

    Args:
        logits: (B, V) float32.
        p: the rows' settings (:class:`RowParams`), on the logits' device.

    Returns:
        ``(tokens, logprob, logprob_t1)``: (B,) int64 ids; (B,) float32 log-probability of each
        token under the distribution it was drawn from (after temperature, top-k and top-p; 0 for
        a greedy row, whose distribution is a point mass); (B,) float32 log-probability under the
        plain softmax of the logits (temperature 1, no filter).
    """
    logz = torch.logsumexp(logits, dim=-1)
    greedy = logits.argmax(dim=-1)
    if not p.sampled:
        lp1 = logits.gather(1, greedy.unsqueeze(1)).squeeze(1) - logz
        return greedy, torch.zeros_like(lp1), lp1
    temp = torch.where(p.temperature > 0, p.temperature, 1.0).unsqueeze(1)
    scaled = logits / temp
    if p.filtered:
        scaled, ids = scaled.sort(dim=-1, descending=True)
        V = logits.size(-1)
        rank = torch.arange(V, device=logits.device)
        keep = rank < torch.where(p.top_k > 0, p.top_k, V).unsqueeze(1)
        scaled = scaled.masked_fill(~keep, float("-inf"))
        probs = scaled.softmax(dim=-1)
        # the first token always stays; top_p 1 keeps all (a float32 cumsum can reach 1 before the tail)
        keep = ((probs.cumsum(dim=-1) - probs) < p.top_p.unsqueeze(1)) | (p.top_p >= 1.0).unsqueeze(1)
        scaled = scaled.masked_fill(~keep, float("-inf"))
    else:
        ids = torch.arange(logits.size(-1), device=logits.device).expand_as(logits)
    choice = (scaled + gumbel_noise(p.seed, p.counter, ids)).argmax(dim=-1, keepdim=True)
    tokens = ids.gather(1, choice).squeeze(1)
    lp = (scaled.gather(1, choice) - torch.logsumexp(scaled, dim=-1, keepdim=True)).squeeze(1)
    is_greedy = p.temperature <= 0
    tokens = torch.where(is_greedy, greedy, tokens)
    lp = torch.where(is_greedy, 0.0, lp)
    lp1 = logits.gather(1, tokens.unsqueeze(1)).squeeze(1) - logz
    return tokens, lp, lp1
