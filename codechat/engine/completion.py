"""Code completion with a base model: where a completion ends, and the best of n samples.

A completion of a prompt that ends inside a function ends with that function (:func:`end_of_block`).
Of ``n`` sampled completions, :func:`best_completion` shows one that *finished* — wrote at least
one line and then left the function before the token budget ran out — with the highest mean
log-probability. Small models fall into loops that only the token budget stops; a sample that
ended on its own is the model's own answer, not a cut-off.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from codechat.engine.sampling import SamplingConfig
from codechat.engine.scheduler import Engine
from codechat.engine.types import Request
from codechat.tokenizer import Tokenizer


def mean_logprob(engine: Engine, prompt: list[int], completion: list[int]) -> float:
    """Mean log-probability, in nats per token, of ``completion`` following ``prompt``, scored by
    one teacher-forced pass at temperature 1 (:meth:`Engine.score`) whatever the sampling was.

    Ranking samples by it is the "mean log-probability" selection of Chen et al. 2021 ("Evaluating
    Large Language Models Trained on Code", arXiv:2107.03374) and the ``best_of`` of OpenAI's
    completions API.

    Raises:
        ValueError: ``prompt`` or ``completion`` is empty, or together they exceed the context.
    """
    lps = engine.score(prompt, completion)
    return sum(lps) / len(lps)


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


def sample_completions(engine: Engine, tok: Tokenizer, prompt: str, cfg: SamplingConfig, n: int,
                       seed: int = 0, deadline: float | None = None) -> list[Completion]:
    """``n`` completions of the code ``prompt`` (sharing one prefill), each ended by
    :func:`end_of_block` and scored by :func:`mean_logprob`. Rows still generating at ``deadline``
    (``time.monotonic()``) are cut there, unfinished (:meth:`Engine.generate`).

    The prompt follows an ``<|end|>``, as every document does in pretraining. A prompt that
    leaves fewer than ``cfg.max_new_tokens`` positions in the engine's context gets what is left.

    Raises:
        ValueError: ``n`` < 1, or the prompt leaves no room in the engine's context.
    """
    if n < 1:
        raise ValueError(f"need at least one sample, got n={n}")
    prompt_ids = [tok.end_id] + tok.encode(prompt)
    room = engine.max_len - len(prompt_ids)
    if room < 1:
        raise ValueError(f"a prompt of {len(prompt_ids)} tokens leaves no room in the context of {engine.max_len}")
    cfg = replace(cfg, max_new_tokens=min(cfg.max_new_tokens, room))
    out = []
    [samples] = engine.generate([Request(prompt_ids, cfg, samples=n, seed=seed, stop_ids=[tok.end_id])], deadline)
    for s in samples:
        ids = s.token_ids
        raw = tok.decode([t for t in ids if t != tok.end_id])
        text = end_of_block(prompt, raw)
        ended = text != raw or ids[-1] == tok.end_id
        text_ids = tok.encode(text) or [tok.end_id]  # empty: scored as ending the document at once
        out.append(Completion(text, ended and bool(text.strip()), mean_logprob(engine, prompt_ids, text_ids)))
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
