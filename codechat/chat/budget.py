"""SFT rows within token budgets: a rendered conversation cut to fit, and every cut counted.

:func:`render_with_budget` renders a :class:`~codechat.chat.conversation.Conversation` with
:func:`~codechat.chat.conversation.render_turns` and fits it to ``max_length`` tokens, of which the prompt
(everything before the final assistant turn) takes at most ``max_prompt_length``: prompts are
truncated from the left (oldest turns first), completions on the right, and an example that
would keep no supervised token is dropped. :class:`BudgetCounts` says what happened to each.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from codechat.chat.conversation import Conversation, Turn, join_turns, render_turns
from codechat.tokenizer import Tokenizer


class BudgetConfig(Protocol):
    """What :func:`render_with_budget` reads (an :class:`~codechat.config.sft.SFTConfig`)."""

    max_length: int
    max_prompt_length: int


@dataclass
class BudgetCounts:
    """What :func:`render_with_budget` did to every conversation it saw.

    ``seen == kept + sum(dropped.values())``; ``prompt_truncated`` and ``completion_truncated``
    count kept examples (one example can be both). ``tokens`` / ``supervised_tokens`` sum the
    kept rows; ``turns_dropped`` and ``*_tokens_cut`` measure what truncation removed.
    """

    seen: int = 0
    kept: int = 0
    prompt_truncated: int = 0
    completion_truncated: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    turns_dropped: int = 0
    prompt_tokens_cut: int = 0
    completion_tokens_cut: int = 0
    tokens: int = 0
    supervised_tokens: int = 0

    @property
    def n_dropped(self) -> int:
        return sum(self.dropped.values())

    @property
    def supervised_share(self) -> float:
        """Supervised tokens / all tokens of the kept examples (0.0 when nothing was kept)."""
        return self.supervised_tokens / self.tokens if self.tokens else 0.0

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def update(self, other: BudgetCounts) -> None:
        """Add ``other``'s counts to these."""
        for name in ("seen", "kept", "prompt_truncated", "completion_truncated", "turns_dropped",
                     "prompt_tokens_cut", "completion_tokens_cut", "tokens", "supervised_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for reason, n in other.dropped.items():
            self.dropped[reason] = self.dropped.get(reason, 0) + n

    def as_dict(self) -> dict[str, Any]:
        return {"seen": self.seen, "kept": self.kept, "prompt_truncated": self.prompt_truncated,
                "completion_truncated": self.completion_truncated, "dropped": dict(self.dropped),
                "turns_dropped": self.turns_dropped, "prompt_tokens_cut": self.prompt_tokens_cut,
                "completion_tokens_cut": self.completion_tokens_cut, "tokens": self.tokens,
                "supervised_tokens": self.supervised_tokens, "supervised_share": round(self.supervised_share, 6)}


@dataclass(frozen=True)
class RenderedExample:
    """One training example: ``ids`` and ``mask`` of equal length, ``ids[:prompt_length]`` the prompt.

    The prompt ends with the completion's ``<|assistant|>`` header; ``mask`` is 1 on every
    supervised token (earlier assistant turns inside the prompt included), ``n_supervised`` >= 1.
    """

    ids: list[int]
    mask: list[int]
    prompt_length: int
    source: str = ""
    line: int = 0
    prompt_truncated: bool = False
    completion_truncated: bool = False

    @property
    def n_supervised(self) -> int:
        return sum(self.mask)

    def __len__(self) -> int:
        return len(self.ids)


def _min_len(t: Turn) -> int:
    """Smallest size a turn can be cut to: header, one content token (if it has any), end."""
    return 2 + min(1, len(t.content))


def _cut_left(t: Turn, excess: int) -> int:
    """Remove up to ``excess`` content tokens from the left of ``t``, keeping one; returns how many went."""
    n = max(0, min(excess, len(t.content) - 1))
    del t.content[:n]
    return n


def _fit_prompt(turns: list[Turn], budget: int, counts: BudgetCounts) -> list[Turn]:
    """Cut the prompt's turns to ``budget`` tokens (see :func:`render_with_budget`)."""
    total = sum(map(len, turns))
    if total <= budget:
        return turns
    last_sup = max((k for k, t in enumerate(turns) if t.supervised), default=-1)
    history, context = turns[:last_sup + 1], turns[last_sup + 1:]
    h_len = sum(map(len, history))
    if history and context and h_len + _min_len(context[-1]) <= budget:
        return history + _cut_from_left(context, budget - h_len, counts, keep_system=False)
    return _cut_from_left(turns, budget, counts, keep_system=True)


def _cut_from_left(turns: list[Turn], budget: int, counts: BudgetCounts, *, keep_system: bool) -> list[Turn]:
    """Whole turns from the left (the system turn kept when it fits), then tokens from the oldest one left."""
    turns = list(turns)
    system = turns.pop(0) if keep_system and turns and turns[0].role == "system" else None

    def total() -> int:
        return sum(map(len, turns)) + (len(system) if system else 0)

    def drop(t: Turn) -> None:
        counts.turns_dropped += 1
        counts.prompt_tokens_cut += len(t)

    while total() > budget and len(turns) > 1:
        drop(turns.pop(0))
    if system is not None and turns and total() > budget and len(system) + _min_len(turns[0]) > budget:
        drop(system)
        system = None
    for t in ([turns[0]] if turns else []) + ([system] if system else []):
        if total() > budget:
            counts.prompt_tokens_cut += _cut_left(t, total() - budget)
    if total() > budget and turns:  # the budget is below the turn's minimum: give up the turn
        drop(turns.pop(0))
    if total() > budget and system is not None:
        drop(system)
        system = None
    return ([system] if system else []) + turns


def render_with_budget(tok: Tokenizer, conv: Conversation, cfg: BudgetConfig, counts: BudgetCounts | None = None,
                       *, source: str = "", line: int = 0, encoded: Sequence[list[int]] | None = None
                       ) -> RenderedExample | None:
    """Render ``conv`` within ``cfg.max_prompt_length`` / ``cfg.max_length``, counting every cut in ``counts``.

    The last assistant turn is the completion (its content, call and ``<|end|>``); everything
    before it, from ``<|bos|>`` through the completion's ``<|assistant|>`` header, is the prompt.
    Earlier assistant turns inside the prompt stay supervised.

    Prompt over ``max_prompt_length`` (``<|bos|>`` and the final header are always kept):

    1. Split the prompt's turns into the *history* (through the last earlier assistant turn)
       and the *context* (the turns after it, which the completion answers). If the history
       fits with at least one content token of the newest context turn, the history is kept
       whole - earlier supervised turns survive - and only the context is cut: its whole
       turns from the left, then tokens from the left of its oldest remaining turn.
    2. Otherwise the whole prompt is cut the same way: whole turns from the left, oldest
       first, the system turn kept when it fits beside the newest turn, then tokens from the
       left of the oldest remaining turn (its role header and ``<|end|>`` stay).

    Step 1 departs from the plain "oldest turns first" rule: applied alone, that rule would
    drop the earlier answers of a conversation whose newest question is long (case 01,
    ``multi-turn-partial``), losing supervised tokens to keep unsupervised ones.

    The completion is then cut on the right to ``max_length - len(prompt)`` tokens (at least
    ``max_length - max_prompt_length`` >= 1), so a kept example always has supervised tokens.

    ``encoded``: the ids of :func:`~codechat.chat.conversation.turn_texts`, when the caller encoded them
    already (see :func:`~codechat.chat.conversation.render_turns`).

    Returns:
        The example, or ``None`` when it is dropped (counted in ``counts.dropped`` by reason:
        ``no_assistant_turn``, ``no_supervised_tokens``).

    Raises:
        ValueError: ``cfg.max_length`` is 0, i.e. not yet resolved by :meth:`~codechat.config.sft.SFTConfig.for_model`.
    """
    if cfg.max_length <= 0:
        raise ValueError("max_length is 0 (follow the model) and was never resolved: use SFTConfig.for_model()")
    counts = counts if counts is not None else BudgetCounts()
    counts.seen += 1
    turns = render_turns(tok, conv, encoded)
    last = max((k for k, t in enumerate(turns) if t.role == "assistant"), default=-1)
    if last < 0:
        counts.drop("no_assistant_turn")
        return None
    completion = turns[last]
    before = (counts.turns_dropped, counts.prompt_tokens_cut)
    prompt_turns = _fit_prompt(turns[:last], cfg.max_prompt_length - 2, counts)
    prompt_truncated = (counts.turns_dropped, counts.prompt_tokens_cut) != before
    ids, mask = join_turns(tok, prompt_turns)
    ids.append(completion.header)
    mask.append(0)
    prompt_length = len(ids)
    comp = completion.content + [tok.end_id]
    room = cfg.max_length - prompt_length
    completion_truncated = len(comp) > room
    if completion_truncated:
        counts.completion_tokens_cut += len(comp) - room
        comp = comp[:max(room, 0)]
    ids += comp
    mask += [1] * len(comp)
    n_sup = sum(mask)
    if n_sup == 0:
        counts.drop("no_supervised_tokens")
        return None
    counts.kept += 1
    counts.prompt_truncated += prompt_truncated
    counts.completion_truncated += completion_truncated
    counts.tokens += len(ids)
    counts.supervised_tokens += n_sup
    return RenderedExample(ids, mask, prompt_length, source, line, prompt_truncated, completion_truncated)


def render_for_completion_within(tok: Tokenizer, conv: Conversation, budget: int) -> tuple[list[int], BudgetCounts]:
    """Prompt ids to generate the next assistant turn of ``conv`` in at most ``budget`` tokens.

    The same ids as :func:`codechat.chat.conversation.render_for_completion` when they fit; otherwise the
    oldest turns are dropped whole (the system turn, with its tools, kept while it fits beside the
    newest turn), then tokens from the left of the oldest turn left — the prompt rule of
    :func:`render_with_budget`. A chat that outgrows the context goes on without its oldest turns.

    Returns:
        ``(ids, counts)``: ``counts.turns_dropped`` and ``counts.prompt_tokens_cut`` say what went.

    Raises:
        ValueError: ``budget`` < 5 (``<|bos|>``, one turn of one token, the assistant header), or
            ``conv`` already ends with an assistant message.
    """
    from codechat.chat.conversation import ROLE_TOKENS, render_for_completion
    if budget < 5:
        raise ValueError(f"a prompt budget of {budget} tokens cannot hold a turn; give the prompt at least 5")
    counts = BudgetCounts()
    ids = render_for_completion(tok, conv)
    if len(ids) <= budget:
        return ids, counts
    turns = _cut_from_left(render_turns(tok, conv), budget - 2, counts, keep_system=True)
    ids, _ = join_turns(tok, turns)
    return ids + [tok.special_id(ROLE_TOKENS["assistant"])], counts


__all__ = ["BudgetConfig", "BudgetCounts", "RenderedExample", "render_for_completion_within", "render_with_budget"]
