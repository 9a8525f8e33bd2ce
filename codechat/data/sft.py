"""SFT batches: rendered conversations from a mixture, as padded rows or best-fit packed rows.

The loader pulls ``chunk_examples`` records at a time from the :class:`~codechat.data.mixture.Mixture`,
renders each within its budget (:func:`codechat.chat.budget.render_with_budget`; an example that would
have no supervised token is dropped and counted there), and cuts the chunk into micro-batches:

- padded: examples sorted by length, consecutive ``micro_batch_size`` examples per micro-batch
  (little padding), micro-batch order shuffled;
- packed: best-fit decreasing bin packing of examples into rows of ``max_length`` input tokens,
  each example its own document (``doc_ids``), so attention and positions never cross it; every
  micro-batch is ``(micro_batch_size, max_length)`` (the chunk's last one is filled with empty,
  unsupervised rows), so compiled attention (flex attention on CUDA) never sees a new shape.

Labels: ``inputs = ids[:-1]``, ``labels[j] = ids[j+1]`` where ``mask[j+1]`` else -100. Padding
is found by length — never by comparing token values — so an ``<|end|>`` label survives even
when the pad value equals the end id. The position is (mixture state at the chunk's start,
chunk number, micro-batches already handed out), enough to rebuild the chunk on resume.

The next chunk is rendered and packed in a background thread while this one's micro-batches are
handed out: the batches are the same, in the same order, and the trainer does not stop every
chunk to render one (an H100's chat SFT stood ~1.3 s every ~46 steps doing it beside a busy host,
``benchmarks/RESULTS.md``, twenty-seventh session). The chunk's new texts are encoded in one
``encode_batch``, which releases the GIL: encoded one by one they held it, and the thread and the
training loop took turns (~10 s of 54 lost in the twenty-eighth session's runs;
``benchmarks/sft_loader_overhead.py``).
"""
from __future__ import annotations

import bisect
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import chain
from typing import Any, Sequence

import numpy as np
import torch

from codechat.chat.budget import BudgetCounts, RenderedExample, render_with_budget
from codechat.chat.conversation import turn_texts
from codechat.config.sft import SFTConfig
from ..model import IGNORE_INDEX
from ..tokenizer import Tokenizer
from .batch import Batch
from .mixture import Mixture


def pack_best_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Best-fit decreasing: indices of ``lengths`` grouped into bins of at most ``capacity``.

    Each item goes to the fullest bin that still has room for it (Johnson 1974). Items longer
    than ``capacity`` must be cut beforehand.

    Raises:
        ValueError: an item is longer than ``capacity``.
    """
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # sorted (room left, bin index)
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[i]
        if n > capacity:
            raise ValueError(f"an example of {n} tokens does not fit a row of {capacity}")
        j = bisect.bisect_left(free, (n, -1))
        if j < len(free):
            room, b = free.pop(j)
            bins[b].append(i)
            if room - n > 0:
                bisect.insort(free, (room - n, b))
        else:
            bins.append([i])
            if capacity - n > 0:
                bisect.insort(free, (capacity - n, len(bins) - 1))
    return bins


def collate(rows: Sequence[Sequence[RenderedExample]], pad_id: int, pad_to_multiple: int, packed: bool) -> Batch:
    """One micro-batch: each row is one example (padded) or several (packed), right-padded.

    Returns a :class:`Batch` of (B, T) tensors with ``n_tokens`` the real (non-padding) inputs
    and, when ``packed``, ``doc_ids`` numbering the examples of each row (padding its own document).
    The rows are laid out with numpy from one flat copy of their ids: a Python loop over tokens would
    take ~0.5 ms a row of 1,024 from the training thread.
    """
    examples = [ex for row in rows for ex in row]
    n = np.array([len(ex) - 1 for ex in examples], dtype=np.int64)  # inputs of each example
    ids = np.fromiter(chain.from_iterable(ex.ids for ex in examples), np.int64, int(n.sum()) + len(examples))
    mask = np.fromiter(chain.from_iterable(ex.mask for ex in examples), np.bool_, len(ids))
    last = np.cumsum(n + 1) - 1  # each example's last id: an input of none, the label of the one before
    keep = np.ones(len(ids), dtype=np.bool_)
    keep[last] = False
    first = np.ones(len(ids), dtype=np.bool_)
    first[last - n] = False
    flat_inputs, flat_labels = ids[keep], np.where(mask[first], ids[first], IGNORE_INDEX)
    lengths = [int(n[i:i + len(row)].sum()) for i, row in zip(np.cumsum([0] + [len(r) for r in rows]), rows)]
    T = -(-max(lengths) // pad_to_multiple) * pad_to_multiple
    inputs = np.full((len(rows), T), pad_id, dtype=np.int64)
    labels = np.full((len(rows), T), IGNORE_INDEX, dtype=np.int64)
    doc_ids = np.zeros((len(rows), T), dtype=np.int64) if packed else None
    at, k = 0, 0
    for r, (row, length) in enumerate(zip(rows, lengths)):
        inputs[r, :length] = flat_inputs[at:at + length]
        labels[r, :length] = flat_labels[at:at + length]
        if doc_ids is not None:
            doc_ids[r, :length] = np.repeat(np.arange(len(row)), n[k:k + len(row)])
            doc_ids[r, length:] = len(row)
        at, k = at + length, k + len(row)
    return Batch(torch.from_numpy(inputs), torch.from_numpy(labels),
                 None if doc_ids is None else torch.from_numpy(doc_ids), sum(lengths))


class SFTLoader:
    """Resumable micro-batches of SFT examples (see the module docstring).

    Args:
        mixture: the record stream; its position is part of this loader's state.
        cfg: budgets, packing, chunk size, padding multiple.
        micro_batch_size: rows per micro-batch.
        rank, world_size: this rank takes micro-batches ``rank, rank + world_size, ...`` of each chunk.
        counts: accumulates what rendering kept, truncated and dropped (each distinct record once).
    """

    def __init__(self, mixture: Mixture, tok: Tokenizer, cfg: SFTConfig, micro_batch_size: int, *,
                 rank: int = 0, world_size: int = 1, counts: BudgetCounts | None = None) -> None:
        self.mixture, self.tok, self.cfg, self.micro_batch_size = mixture, tok, cfg, micro_batch_size
        self.rank, self.world_size = rank, world_size
        self.counts = counts if counts is not None else BudgetCounts()
        self.chunk, self.emitted = 0, 0
        self._chunk_start = mixture.state_dict()
        self._batches: list[list[list[RenderedExample]]] | None = None
        self._rendered: dict[int, RenderedExample | None] = {}  # each record is rendered once per process
        # the next chunk (its mixture state at its start, its micro-batches), being built in the background; the
        # thread alone draws from the mixture while it runs
        self._ahead: Future | None = None
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="sft-chunk")

    def _render_chunk(self) -> list[RenderedExample]:
        """The chunk's kept examples, in draw order. The texts of the records not yet rendered are encoded in one
        :meth:`~codechat.tokenizer.Tokenizer.encode_batch`, which releases the GIL: encoded one by one they held it
        and slowed the training thread by half while the chunk was built (``benchmarks/RESULTS.md``)."""
        records = [next(self.mixture) for _ in range(self.cfg.chunk_examples)]
        # records live as long as the mixture, so their ids are stable keys
        new = list({id(rec): rec for rec in records if id(rec) not in self._rendered}.values())
        texts = [turn_texts(rec.conversation) for rec in new]
        ids = iter(self.tok.encode_batch([t for ts in texts for t in ts]))
        for rec, ts in zip(new, texts):
            self._rendered[id(rec)] = render_with_budget(self.tok, rec.conversation, self.cfg, self.counts,
                                                         source=rec.source, line=rec.line,
                                                         encoded=[next(ids) for _ in ts])
        return [ex for ex in (self._rendered[id(rec)] for rec in records) if ex is not None]

    def _build(self, chunk: int) -> list[list[list[RenderedExample]]]:
        """The micro-batches (lists of rows, each a list of examples) of chunk number ``chunk``, drawn
        from the mixture's position."""
        examples = self._render_chunk()
        if self.cfg.packing:
            bins = pack_best_fit([len(ex) - 1 for ex in examples], self.cfg.max_length)
            rows = [[examples[i] for i in b] for b in bins]
        else:
            rows = [[ex] for ex in sorted(examples, key=len)]
        batches = [rows[i:i + self.micro_batch_size] for i in range(0, len(rows), self.micro_batch_size)]
        if self.cfg.packing and batches:  # empty rows fill the last micro-batch: one (B, T) for every step,
            batches[-1] += [[]] * (self.micro_batch_size - len(batches[-1]))  # so compiled kernels never recompile
        order = np.random.default_rng([self.cfg.seed, chunk]).permutation(len(batches))
        usable = len(batches) - len(batches) % self.world_size  # every rank gets as many
        return [batches[i] for i in order[:usable]]

    def next_batch(self) -> Batch:
        """This rank's next micro-batch.

        Raises:
            ValueError: a whole chunk rendered to nothing usable (every example dropped).
        """
        for _ in range(2):
            if self._batches is None:
                ahead, self._ahead = self._ahead, None
                self._enter(*(ahead.result() if ahead is not None else self._start_and_build(self.chunk)))
            i = self.emitted + self.rank
            if i < len(self._batches):
                self.emitted += self.world_size
                # packed rows are padded to the full row: one shape for every step (no recompiles)
                multiple = self.cfg.max_length if self.cfg.packing else self.cfg.pad_to_multiple
                return collate(self._batches[i], self.tok.end_id, multiple, self.cfg.packing)
            self.chunk, self.emitted, self._batches = self.chunk + 1, 0, None
        raise ValueError(f"a chunk of {self.cfg.chunk_examples} records gave no micro-batch for {self.world_size} "
                         f"rank(s): kept {self.counts.kept}, dropped {self.counts.dropped}; check the data and "
                         "--sft.max_length / --sft.max_prompt_length")

    def _start_and_build(self, chunk: int) -> tuple[dict[str, Any], list[list[list[RenderedExample]]]]:
        """The mixture's state at chunk ``chunk``'s start (its position now) and the chunk's micro-batches."""
        return self.mixture.state_dict(), self._build(chunk)

    def _enter(self, start: dict[str, Any], batches: list[list[list[RenderedExample]]]) -> None:
        """Make the chunk that starts at mixture state ``start`` the current one, and begin building the next."""
        self._chunk_start, self._batches = start, batches
        self._ahead = self._worker.submit(self._start_and_build, self.chunk + 1)

    def settle(self) -> None:
        """Wait for the chunk being built ahead: the mixture's position and draws and :attr:`counts` then stay
        still (they include that chunk). Its error, if any, is raised when the chunk is needed."""
        if self._ahead is not None:
            self._ahead.exception()

    def state_dict(self) -> dict[str, Any]:
        return {"mixture": self._chunk_start, "chunk": self.chunk, "emitted": self.emitted}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Rebuild the saved chunk and skip what was already handed out."""
        self.settle()  # it draws from the mixture; then forgotten
        self._ahead = None
        self.mixture.load_state_dict(state["mixture"])
        self.chunk, self.emitted = state["chunk"], state["emitted"]
        self._enter(state["mixture"], self._build(self.chunk))


def preflight(mixture: Mixture, tok: Tokenizer, cfg: SFTConfig, n: int
              ) -> tuple[BudgetCounts, list[RenderedExample]]:
    """Render the first ``n`` records of ``mixture`` (left at its start): what budgets do, and the kept examples."""
    start = mixture.state_dict()
    counts = BudgetCounts()
    kept = []
    for _ in range(n):
        rec = next(mixture)
        ex = render_with_budget(tok, rec.conversation, cfg, counts, source=rec.source, line=rec.line)
        if ex is not None:
            kept.append(ex)
    mixture.load_state_dict(start)
    return counts, kept
