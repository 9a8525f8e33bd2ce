"""Code completion with a base model: where a completion ends, and the best of n samples.

A completion of a prompt that ends inside a function ends with that function (:func:`end_of_block`).
Of ``n`` sampled completions, :func:`best_completion` shows one that *finished* — wrote at least
one line and then left the function before the token budget ran out — with the highest mean
log-probability. Small models fall into loops that only the token budget stops; a sample that
ended on its own is the model's own answer, not a cut-off.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .engine import SamplingConfig, complete, mean_logprob
from .model import GPT
from .tokenizer import Tokenizer


@dataclass(frozen=True)
class Completion:
    """One sampled completion: ``text`` (without the prompt) already ended by :func:`end_of_block`;
    ``finished`` when it is non-empty and ended before the token budget (it left the function or
    emitted ``<|end|>``); ``mean_logprob`` in nats per token of its own tokens after the prompt."""

    text: str
    finished: bool
    mean_logprob: float


def end_of_block(prompt: str, completion: str) -> str:
    """``completion`` up to (not including) its first non-blank line that leaves the function or
    class the prompt ends in: a line indented no deeper than that ``def``/``class`` header
    (column 0 when the prompt's end is in no function or class).

    The same idea as HumanEval's stop sequences (``\\ndef``, ``\\nclass``, ``\\nif``, ...) for a
    top-level function, extended to methods and nested functions and to any statement.
    """
    lines = [ln for ln in prompt.splitlines() if ln.strip()]
    stop = 0
    if lines:
        depth = _indent(lines[-1]) + (1 if lines[-1].rstrip().endswith(":") else 0)
        for ln in reversed(lines):
            if _indent(ln) < depth:
                if re.match(r"\s*(async\s+def|def|class)\b", ln):
                    stop = _indent(ln)
                    break
                depth = _indent(ln)
    text = "\n" + completion  # the prompt ends with a newline: the completion starts a line
    for m in re.finditer(r"\n(?=[ \t]*\S)", text):
        if _indent(text[m.end():].split("\n", 1)[0]) <= stop:
            return completion[:m.start()]
    return completion


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def sample_completions(model: GPT, tok: Tokenizer, prompt: str, cfg: SamplingConfig, n: int,
                       seed: int | None = None) -> list[Completion]:
    """``n`` completions of the code ``prompt`` (one batch), each ended by :func:`end_of_block`
    and scored by :func:`~codechat.engine.mean_logprob`.

    The prompt follows an ``<|end|>``, as every document does in pretraining.

    Raises:
        ValueError: ``n`` < 1, or the prompt leaves no room under the model's ``max_seq_len``.
    """
    if n < 1:
        raise ValueError(f"need at least one sample, got n={n}")
    prompt_ids = [tok.end_id] + tok.encode(prompt)
    out = []
    for ids in complete(model, prompt_ids, cfg, stop_ids=[tok.end_id], num_samples=n, seed=seed):
        raw = tok.decode([t for t in ids if t != tok.end_id])
        text = end_of_block(prompt, raw)
        ended = text != raw or ids[-1] == tok.end_id
        text_ids = tok.encode(text) or [tok.end_id]  # empty: scored as ending the document at once
        out.append(Completion(text, ended and bool(text.strip()), mean_logprob(model, prompt_ids, text_ids)))
    return out


def best_completion(completions: list[Completion]) -> Completion:
    """The finished completion with the highest mean log-probability; when none finished, the
    unfinished one with the highest (Chen et al. 2021, arXiv:2107.03374: ranking samples by
    mean token log-probability beats picking one at random).

    Raises:
        ValueError: ``completions`` is empty.
    """
    if not completions:
        raise ValueError("no completions to choose from")
    return max(completions, key=lambda c: (c.finished, c.mean_logprob))
