"""The packed prefill: prompts' keys and values into their cache slots, and each prompt's last hidden state.

Prompts of any lengths are packed end to end (:meth:`InferenceModel.prefill_attend`). Launched op by
op, a prefill costs the host 10-20 ms on a 20-layer model whatever its size (each layer's ~15
kernels, the compiled regions' guards: ``benchmarks/RESULTS.md``, constrained decoding), while the
device needs ~3 ms for 2,048 tokens; rows that join a running batch pay it at every admission. So on
CUDA, with FlashAttention's variable-length kernel and CUDA graphs, a prefill of at most
:data:`GRAPH_TOKENS` tokens runs as the replay of a graph captured once per token bucket
(:data:`BUCKETS`), as vLLM captures its decode batches:

- the prompts are copied into static buffers, padded to the bucket: the padding is one more
  segment (token 0 at position 0, causal within itself), its keys and values written to a position
  no kept output reads (the cache's extra position ``max_len`` of slot 0: :class:`.runner.KVCache`);
- segments past the last real one have length 0, so one graph serves any number of prompts up to
  the engine's slots;
- each prompt's keys and values go to its first slot inside the graph; the request's other samples'
  slots (``n > 1``) get a copy of them afterwards (:func:`copy_prompt`, 4 ops a layer).

A longer prefill of prompts that each fit the largest bucket runs as several replays, the prompts
split in order into runs of at most :data:`GRAPH_TOKENS` tokens (:func:`graph_chunks`): launched op
by op, such a prefill cost the host 10-20 ms, over a decode launch's device time, at admissions of
14-17 rows of serve's 64-client rounds (``benchmarks/RESULTS.md``, twelfth session). A prompt longer
than that (its host cost then matters less than its device time), the CPU and devices without the
varlen kernel take the op-by-op path, which writes every slot itself. Both give the same keys,
values and hidden states (``tests/test_engine_prefill.py``).
"""
from __future__ import annotations

import itertools
from typing import Callable, Sequence

import torch

from .runner import InferenceModel, KVCache

#: Token buckets of the captured prefill (a prefill is padded to the smallest that holds it).
BUCKETS = (128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096)
#: The longest prefill run as a graph replay, in tokens (the largest bucket).
GRAPH_TOKENS = BUCKETS[-1]


def copy_prompt(cache: KVCache, src: int, dst: Sequence[int], n: int) -> None:
    """Copy positions ``0..n-1`` of slot ``src`` to slots ``dst``, every layer's keys and values
    (bitwise)."""
    if not dst:
        return
    S, P = cache.slots, cache.positions
    dev = cache.k[0].device
    pos = torch.arange(n, device=dev)
    to = (torch.tensor(list(dst), device=dev)[:, None] * P + pos).flatten()
    frm = (src * P + pos).repeat(len(dst))
    for t in (*cache.k, *cache.v):
        flat = t.view(torch.uint8).view(S * P, -1)
        flat.index_copy_(0, to, flat[frm])


def graph_chunks(lengths: Sequence[int], limit: int) -> list[range]:
    """Indices of prompts of ``lengths`` split in order into runs of at most ``limit`` tokens each
    (a prompt over ``limit`` alone in its run)."""
    out: list[range] = []
    start, total = 0, 0
    for i, n in enumerate(lengths):
        if i > start and total + n > limit:
            out.append(range(start, i))
            start, total = i, 0
        total += n
    return out + [range(start, len(lengths))] if lengths else out


def _offsets(prompts: Sequence[Sequence[int]]) -> list[int]:
    """Where each packed prompt starts, then where the last ends: ``[0, len(p0), len(p0) + len(p1), ...]``."""
    return [0, *itertools.accumulate(map(len, prompts))]


class Prefill:
    """:meth:`__call__` writes packed prompts' keys and values into their slots and returns each
    prompt's last hidden state; graph replays where they apply (module docstring).

    Args:
        model, cache: the engine's.
        graphs: capture and replay prefills of up to :data:`GRAPH_TOKENS` tokens (CUDA with
            FlashAttention's varlen kernel only; elsewhere ignored).
        capture: the engine's graph capture (``fn -> (graph, outputs)``, in its memory pool).
        h2d: the engine's host-to-device copy (``(values, dtype) -> tensor``, no host sync).
    """

    def __init__(self, model: InferenceModel, cache: KVCache, graphs: bool,
                 capture: Callable[[Callable[[], tuple[torch.Tensor, ...]]], tuple],
                 h2d: Callable[[list, torch.dtype], torch.Tensor]) -> None:
        self.model, self.cache, self.capture, self.h2d = model, cache, capture, h2d
        self.graphs_on = graphs and model.flash
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = {}
        if self.graphs_on:
            dev, S, T = model.device, cache.slots, GRAPH_TOKENS
            self.trash = cache.positions - 1  # the extra position: no kept output reads it
            # static inputs, sliced to the bucket: tokens, positions, each token's (slot, position),
            # segment starts (S segments, the padding, their end), each segment's last token
            self.tokens, self.positions = (torch.zeros(T, dtype=torch.long, device=dev) for _ in range(2))
            self.slot = torch.zeros(T, dtype=torch.long, device=dev)
            self.pos = torch.full((T,), self.trash, dtype=torch.long, device=dev)
            self.cu = torch.zeros(S + 2, dtype=torch.int32, device=dev)
            self.last = torch.zeros(S, dtype=torch.long, device=dev)

    def __call__(self, prompts: Sequence[Sequence[int]], slots: Sequence[Sequence[int]]) -> torch.Tensor:
        """Prefill ``prompts`` (token ids, each non-empty) into ``slots`` (each prompt's slots, at least
        one: its samples' rows); returns (len(prompts), C) final-norm hidden states of each prompt's
        last token, in the inference dtype (valid until the next call: use it, on the same stream, first)."""
        n = sum(map(len, prompts))
        if self.graphs_on and n > GRAPH_TOKENS and max(map(len, prompts)) <= GRAPH_TOKENS:
            # several replays; each one's outputs copied before the next overwrites them (stream order)
            return torch.cat([self._replay([prompts[i] for i in run], [slots[i] for i in run]).clone()
                              for run in graph_chunks([len(p) for p in prompts], GRAPH_TOKENS)])
        return self._replay(prompts, slots)

    def _replay(self, prompts: Sequence[Sequence[int]], slots: Sequence[Sequence[int]]) -> torch.Tensor:
        """:meth:`__call__` as one replay of the smallest bucket's graph, or op by op where none holds it."""
        n = sum(map(len, prompts))
        bucket = next((b for b in BUCKETS if b >= n), None) if self.graphs_on else None
        if bucket is None or len(prompts) > self.cache.slots:
            return self._eager(prompts, slots)
        if bucket not in self.graphs:
            self.graphs[bucket] = self._capture(bucket)
        h2d, long = self.h2d, torch.long
        cu = _offsets(prompts)
        self.tokens[:n] = h2d([t for p in prompts for t in p], long)
        self.positions[:n] = h2d([i for p in prompts for i in range(len(p))], long)
        self.slot[:n] = h2d([s[0] for p, s in zip(prompts, slots) for _ in p], long)
        self.pos[:n] = self.positions[:n]
        self.cu.copy_(h2d(cu + [bucket] * (self.cu.numel() - len(cu)), torch.int32))
        # every entry: a stale index of a larger bucket's prefill would read past this graph's tokens
        self.last.copy_(h2d([c - 1 for c in cu[1:]] + [0] * (self.last.numel() - len(prompts)), long))
        graph, (h,) = self.graphs[bucket]
        graph.replay()
        self.slot[:n], self.pos[:n] = 0, self.trash  # where the next, shorter prefill's padding writes
        for p, s in zip(prompts, slots):
            copy_prompt(self.cache, s[0], s[1:], len(p))
        return h[:len(prompts)]  # the graph's output: read before the next prefill replays it

    def _capture(self, bucket: int) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]:
        """The graph of a ``bucket``-token prefill over the static buffers (captured with every token
        written to the extra position and one segment: capturing changes no kept state)."""
        self.cu.fill_(bucket)
        self.cu[0] = 0
        self.last.zero_()  # capturing runs the forward once: a larger bucket's last indices would read past this one
        m, cache = self.model, self.cache
        tokens, positions, slot, pos, cu = (self.tokens[:bucket], self.positions[:bucket], self.slot[:bucket],
                                            self.pos[:bucket], self.cu)
        attend = m.prefill_attend(cache, None, cu, (None, slot, pos), max_len=bucket)
        return self.capture(lambda: (m.forward(tokens, positions, attend)[self.last],))

    def _eager(self, prompts: Sequence[Sequence[int]], slots: Sequence[Sequence[int]]) -> torch.Tensor:
        """The op-by-op prefill: every sample's slot written by the forward pass itself."""
        h2d, long = self.h2d, torch.long
        seg_lens = [len(p) for p in prompts]
        cu_host = _offsets(prompts)
        src, dslot, dpos = [], [], []
        for g, (n, ss) in enumerate(zip(seg_lens, slots)):
            for slot in ss:
                src.extend(range(cu_host[g], cu_host[g] + n))
                dslot.extend([slot] * n)
                dpos.extend(range(n))
        tokens = h2d([t for p in prompts for t in p], long)
        positions = h2d([i for n in seg_lens for i in range(n)], long)
        dest = (h2d(src, long), h2d(dslot, long), h2d(dpos, long))
        m = self.model
        h = m.forward(tokens, positions, m.prefill_attend(self.cache, seg_lens, h2d(cu_host, torch.int32), dest))
        return h[h2d([c - 1 for c in cu_host[1:]], long)]
