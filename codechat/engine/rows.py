"""The scheduler's bookkeeping (:mod:`.scheduler`): a row holding a cache slot, a launch in flight,
the shapes of a launch's outputs, and the counters of what the steps did."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
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


@dataclass
class StepCounters:
    """What :meth:`Engine.step` did since the engine was built: its step timeline in totals (take the
    difference of two :meth:`as_dict` snapshots for a window). Seconds are host wall seconds
    (``time.perf_counter``); on a CPU the compute runs inside the launches and admissions, so
    ``wait_s`` stays 0 there."""

    steps: int = 0  # Engine.step calls
    step_s: float = 0.0  # seconds inside Engine.step
    launches: int = 0  # decode launches (decode_steps steps each; a masked launch one)
    masked_launches: int = 0  # of them, under grammar masks
    launch_rows: int = 0  # rows summed over the decode launches (/ launches: the mean batch)
    wait_s: float = 0.0  # seconds blocked on the device, reading launches back
    fill_s: float = 0.0  # seconds computing grammar masks (those of joining rows too)
    prefills: int = 0  # prefills (each admits one or more requests' rows)
    prefill_rows: int = 0  # rows admitted (a request's n samples share its prompt's prefill)
    prefill_tokens: int = 0  # prompt tokens prefilled
    admit_s: float = 0.0  # seconds admitting rows: the prefill's launch, its sampling, joining rows' masks
    tokens: int = 0  # tokens returned

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def finish_of(row: Row, t: int) -> str | None:
    """How row ``row`` ends with its new token ``t`` (None: it goes on). Under a grammar: ``stop``
    once the grammar is complete, ``rejected`` (``Sample.error`` says why) when the grammar did
    not allow ``t`` — which its mask should have made impossible: an engine bug, never passed
    off as ``stop`` — and ``length`` when the budget ran out first."""
    if row.matcher is not None and not row.matcher.consume(t):
        row.out.error = (f"the grammar rejected token {t}, sampled under its own mask after "
                         f"{len(row.out.token_ids) - 1} tokens: {row.matcher.error or 'no reason given'}")
        return "rejected"
    if t in row.req.stop_ids or (row.matcher is not None and row.matcher.done):
        return "stop"
    return "length" if len(row.out.token_ids) >= row.req.sampling.max_new_tokens else None


def row_kind(rows: Sequence[Row]) -> LaunchKind:
    """The :class:`~.options.LaunchKind` of a launch of ``rows``."""
    return launch_kind([r.req.sampling for r in rows])
