"""The scheduler's bookkeeping (:mod:`.scheduler`): a row holding a cache slot, a launch in flight,
and the shapes of a launch's outputs."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from .grammar import GrammarMatcher
from .options import LaunchKind, launch_kind
from .types import Request, Sample


def stacked(steps: list[tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
    """The outputs of decode steps (each :meth:`Engine._advance`'s) stacked: (steps, B) tokens,
    (steps, 2, B) log-probabilities, and with ``top_logprobs`` (steps, B, K) top ids and log-probs."""
    out = (torch.stack([x[0] for x in steps]), torch.stack([torch.stack([x[1], x[2]]) for x in steps]))
    return out + tuple(torch.stack([x[i] for x in steps]) for i in range(3, len(steps[0])))


@dataclass
class Row:
    """One sample of a request while it holds a cache slot: its request id and sample index, the
    slot, tokens launched so far, its output, and its grammar matcher (None: free)."""

    rid: int
    sample: int
    req: Request
    slot: int = -1
    launched: int = 0  # tokens whose computation has been launched
    out: Sample = field(default_factory=Sample)
    matcher: GrammarMatcher | None = None  # the row's place in its request's grammar


@dataclass
class Launch:
    """Decode steps (or a prefill) in flight: their rows and the host copies of their outputs."""

    rows: list[Row]
    index: list[int]  # rows[j]'s entry in the tensors below
    tokens: torch.Tensor  # (steps, B) int64, on the host once ``event`` completed
    lps: torch.Tensor  # (steps, 2, B) float32
    top: tuple[torch.Tensor, ...]  # () or (steps, B, K) int64 ids and float32 log-probs (top_logprobs)
    event: torch.cuda.Event | None


def row_kind(rows: Sequence[Row]) -> LaunchKind:
    """The :class:`~.options.LaunchKind` of a launch of ``rows``."""
    return launch_kind([r.req.sampling for r in rows])
