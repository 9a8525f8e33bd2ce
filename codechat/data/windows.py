"""Pretraining batches: windows of ``seq_len + 1`` tokens cut from token shards.

Each shard is cut into non-overlapping windows at multiples of ``seq_len``; an epoch visits
every window once in an order shuffled by ``(seed, epoch)``. The position in the stream is
two integers (epoch, windows consumed), saved in checkpoints, so a resumed run sees exactly
the windows an uninterrupted one would. With ``world_size`` ranks, each global micro-batch
of ``world_size * micro_batch_size`` windows is split into contiguous per-rank slices.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .batch import Batch


class WindowLoader:
    """Shuffled, resumable windows over token shards.

    ``next_batch()`` returns a :class:`Batch` of (micro_batch_size, seq_len) int64 CPU tensors
    whose ``labels`` are the inputs shifted by one token.

    Raises:
        ValueError: the shards hold fewer windows than one global micro-batch needs.
    """

    def __init__(self, shards: Sequence[np.ndarray], seq_len: int, micro_batch_size: int, *, seed: int,
                 rank: int = 0, world_size: int = 1) -> None:
        self.shards, self.seq_len, self.micro_batch_size = list(shards), seq_len, micro_batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        counts = [max(0, (len(s) - 1) // seq_len) for s in self.shards]
        self.first = np.cumsum([0] + counts)  # global window index where each shard starts
        self.n_windows = int(self.first[-1])
        need = world_size * micro_batch_size
        if self.n_windows < need:
            raise ValueError(f"the training shards hold {self.n_windows} windows of {seq_len + 1} tokens, fewer than "
                             f"one global micro-batch ({need}); lower --data.seq_len or --train.micro_batch_size, "
                             "or add source files")
        self.epoch, self.pos = 0, 0
        self._order: np.ndarray | None = None

    def _permutation(self) -> np.ndarray:
        if self._order is None:
            self._order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n_windows)
        return self._order

    def _window(self, w: int) -> np.ndarray:
        shard = int(np.searchsorted(self.first, w, side="right")) - 1
        start = (w - int(self.first[shard])) * self.seq_len
        return self.shards[shard][start:start + self.seq_len + 1]

    def next_window_ids(self) -> list[int]:
        """Global window indices of this rank's next micro-batch (advances the stream)."""
        step = self.world_size * self.micro_batch_size
        if self.pos + step > self.n_windows:  # drop the ragged end; every rank agrees
            self.epoch, self.pos, self._order = self.epoch + 1, 0, None
        lo = self.pos + self.rank * self.micro_batch_size
        ids = self._permutation()[lo:lo + self.micro_batch_size].tolist()
        self.pos += step
        return ids

    def next_batch(self) -> Batch:
        rows = np.stack([self._window(w) for w in self.next_window_ids()]).astype(np.int64)
        t = torch.from_numpy(rows)
        return Batch(t[:, :-1], t[:, 1:])

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos, "seed": self.seed, "n_windows": self.n_windows}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore a position; raises ValueError when the data or seed differ from the saved run."""
        if state["n_windows"] != self.n_windows or state["seed"] != self.seed:
            raise ValueError(f"the checkpoint's data stream (seed {state['seed']}, {state['n_windows']} windows) "
                             f"does not match this run's (seed {self.seed}, {self.n_windows} windows): "
                             "resume with the same --data and --seed")
        self.epoch, self.pos, self._order = state["epoch"], state["pos"], None


def eval_windows(shards: Sequence[np.ndarray], seq_len: int, max_tokens: int = 0) -> torch.Tensor:
    """Validation windows spread evenly over the whole split, up to ``max_tokens`` targets (0: all).

    The split is cut into consecutive windows of ``seq_len`` targets; when there are more than
    the budget allows, evenly spaced ones are kept, so a capped evaluation sees every part of
    the split rather than its first files. Returns (N, seq_len + 1) int64, the same rows at
    every evaluation.

    Raises:
        ValueError: the validation shards are shorter than one window.
    """
    starts = [(i, s) for i, shard in enumerate(shards) for s in range(0, len(shard) - seq_len, seq_len)]
    if not starts:
        raise ValueError(f"the validation split is shorter than one window of {seq_len + 1} tokens; "
                         "lower --data.seq_len or raise --data.val_fraction")
    budget = max(1, max_tokens // seq_len) if max_tokens else len(starts)
    if budget < len(starts):
        starts = [starts[int(k)] for k in np.linspace(0, len(starts) - 1, budget).round()]
    rows = [np.asarray(shards[i][s:s + seq_len + 1]) for i, s in starts]
    return torch.from_numpy(np.stack(rows).astype(np.int64))


def spread_order(n: int) -> list[int]:
    """A permutation of ``range(n)`` whose every prefix is spread evenly over it: the bit-reversal
    (van der Corput) order, e.g. 0, 4, 2, 6, 1, 5, 3, 7 for 8. An evaluation cut short after a
    prefix of rows in this order has scored an evenly spread sample of the whole."""
    bits = max(1, (n - 1).bit_length())
    return [r for r in (int(f"{i:0{bits}b}"[::-1], 2) for i in range(1 << bits)) if r < n]


__all__ = ["WindowLoader", "eval_windows", "spread_order"]
