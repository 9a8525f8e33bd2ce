"""Generation with a KV cache: temperature, top-k and top-p sampling, stop tokens, streaming.

Every row of a batch shares one prompt length (sampling ``n`` completions of one prompt, the
pass@k case, is a batch of copies). The prompt is run once (prefill); each further token
costs one forward pass of a single position against the cache.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from .model import GPT, IGNORE_INDEX, KVCache


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen.

    ``temperature`` 0 is greedy (argmax). ``top_k`` 0 and ``top_p`` 1.0 disable those filters.
    Nucleus sampling follows Holtzman et al. 2020 ("The Curious Case of Neural Text Degeneration").
    """

    max_new_tokens: int = 256
    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 0.95

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0 or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_k must be >= 0 and top_p in (0, 1], got {self.top_k}, {self.top_p}")


def sample_next(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None = None
                ) -> torch.Tensor:
    """Pick one token per row from ``logits`` (B, V) float32; returns (B,) int64."""
    if cfg.temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / cfg.temperature
    if cfg.top_k:
        kth = torch.topk(logits, min(cfg.top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(dim=-1)
        # drop a token when the mass before it already reaches top_p (the first token always stays)
        drop = probs.cumsum(dim=-1) - probs >= cfg.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.inference_mode()
def generate(model: GPT, prompt: Sequence[int] | torch.Tensor, cfg: SamplingConfig, *,
             stop_ids: Sequence[int] = (), num_samples: int = 1, seed: int | None = None
             ) -> Iterator[torch.Tensor]:
    """Yield the next token of every row, one step at a time, using a KV cache.

    Args:
        prompt: token ids of one prompt (T,) or a batch of equal-length prompts (B, T).
        stop_ids: a row that emits one of these is finished; it keeps yielding its stop
            token until every row is finished, after which generation ends.
        num_samples: copies of a single prompt to sample in one batch.
        seed: seeds the sampling generator (None: the global RNG).

    Yields:
        (B,) int64 tensors on the model's device, one per generated position.

    Raises:
        ValueError: the prompt is empty or prompt + max_new_tokens exceeds ``max_seq_len``.
    """
    device = model.embed_tokens.weight.device
    idx = torch.as_tensor(prompt, dtype=torch.long, device=device)
    if idx.dim() == 1:
        idx = idx.unsqueeze(0).expand(num_samples, -1)
    B, T = idx.shape
    if T == 0:
        raise ValueError("empty prompt: give at least one token (e.g. <|bos|>)")
    total = min(T + cfg.max_new_tokens, model.cfg.max_seq_len)
    if total <= T:
        raise ValueError(f"prompt of {T} tokens leaves no room under max_seq_len={model.cfg.max_seq_len}")
    gen = None
    if seed is not None:
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
    dtype = model.embed_tokens.weight.dtype
    if device.type == "cuda" and dtype == torch.float32:
        dtype = torch.bfloat16
    cache = KVCache.empty(model.cfg, B, total, device, dtype)
    stops = torch.tensor(list(stop_ids), dtype=torch.long, device=device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    x = idx
    for _ in range(total - T):
        with _autocast(device):
            logits = model(x, cache=cache)[:, -1, :]
        cache.pos += x.size(1)
        nxt = sample_next(logits.float(), cfg, gen)
        if len(stops):
            prev = finished
            nxt = torch.where(prev, stops[0], nxt)
            finished = prev | torch.isin(nxt, stops)
        yield nxt
        if len(stops) and bool(finished.all()):
            return
        x = nxt.unsqueeze(1)


def _autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA (generation and scoring), nothing elsewhere."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


@torch.inference_mode()
def mean_logprob(model: GPT, prompt: Sequence[int], completion: Sequence[int]) -> float:
    """Mean log-probability, in nats per token, of ``completion`` following ``prompt``.

    Scored by one forward pass at temperature 1 (whatever the sampling settings were). Ranking
    samples by it is the "mean log-probability" selection of Chen et al. 2021 ("Evaluating Large
    Language Models Trained on Code", arXiv:2107.03374) and the ``best_of`` of OpenAI's
    completions API.

    Raises:
        ValueError: ``prompt`` or ``completion`` is empty, or together they exceed ``max_seq_len``.
    """
    if not prompt or not completion:
        raise ValueError(f"need a non-empty prompt and completion, got {len(prompt)} and {len(completion)} tokens")
    device = model.embed_tokens.weight.device
    ids = torch.tensor([list(prompt) + list(completion)], dtype=torch.long, device=device)
    labels = ids[:, 1:].clone()
    labels[:, :len(prompt) - 1] = IGNORE_INDEX  # only the completion's tokens are scored
    with _autocast(device):
        nll = model(ids[:, :-1], labels)
    return -float(nll) / len(completion)


def complete(model: GPT, prompt: Sequence[int], cfg: SamplingConfig, *, stop_ids: Sequence[int] = (),
             num_samples: int = 1, seed: int | None = None) -> list[list[int]]:
    """Generated ids per sample, each cut after its first stop token (which is kept)."""
    rows: list[list[int]] = [[] for _ in range(num_samples)]
    done = [False] * num_samples
    stop = set(stop_ids)
    for step in generate(model, prompt, cfg, stop_ids=stop_ids, num_samples=num_samples, seed=seed):
        for i, t in enumerate(step.tolist()):
            if not done[i]:
                rows[i].append(t)
                done[i] = t in stop
    return rows
