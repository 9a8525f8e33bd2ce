"""The engine: continuous batching of generation requests over a fixed pool of KV-cache slots.

A :class:`Request` is a prompt, its sampling settings, a seed and the sample indices to draw
(``n`` samples of one prompt share one prefill: its keys and values are written to ``n`` slots).
:meth:`Engine.step` runs one scheduler step:

1. launch ``decode_steps`` decode steps for every running row (one CUDA graph per batch-size
   bucket on CUDA runs them back to back; a row whose token budget runs out inside the launch
   stops advancing on the device);
2. read back the tokens of the *previous* launches — the device is already busy with the new one,
   so the host never stalls it — append them, and finish rows that emitted a stop id or reached
   ``max_new_tokens``, freeing their slots;
3. admit waiting requests into free slots (FIFO, up to ``max_prefill_tokens`` prompt tokens a
   step): one packed prefill of their prompts but the last token, which the next launch reads as
   each new row's current token: a row's first token is sampled there, as every other one.

A row therefore joins a running batch as soon as a slot frees and leaves it when it finishes;
a row that emitted a stop id may run on until the host sees it (the rest of its launch and the
next one), and those tokens are dropped.
Tokens come back as :class:`Token` events, in order per row, for streaming.

Constrained rows (a :class:`Request` with a ``grammar``, :mod:`codechat.engine.grammar`): each token's
mask depends on the token before it, so while any running row is constrained a step drains every
launch first, then launches one decode step in two halves, as vLLM and SGLang do with their grammar
backends: the forward pass (one graph) is launched, the host computes the rows' masks while the
device runs it, copies the rows in use to a device buffer, and launches the masked sampling (a
second graph; free rows get an all-ones mask); the step is read back at once. Free rows then draw
the same tokens as alone (the noise is counter-based, the mask changes nothing for them), one step
a launch. New rows then join only once an eighth of the slots is free (or no row runs), in one
prefill: a prefill has a fixed host cost, and a masked step makes one token (``benchmarks/RESULTS.md``,
constrained decoding: 1.65-1.85x on ``d20`` when a prefill cost 10-20 ms of host time; on CUDA it is
now one graph replay up to 4,096 tokens, :mod:`.prefill`). Without a constrained row the fast path
above is unchanged.
"""
from __future__ import annotations

import heapq
import itertools
import time
from typing import Callable, Iterator, Sequence

import torch

from ..model import GPT
from .grammar import fill_rows, unpack, words
from .options import LaunchKind, RowOptions
from .rows import Launch, Row, StepCounters, finish_of, row_kind, stacked
from .prefill import Prefill
from .runner import InferenceModel, KVCache, capture_graph
from .sampling import RowParams, row_seed, sample
from .types import CPU_CACHE_BYTES, EngineConfig, Request, Sample, Token
from .warmup import warm_up



class Engine:
    """Generation for everyone: sample, chat, evaluation, RL rollouts, function calling, serving.

    Args:
        model: a :class:`codechat.model.GPT`; its weights are copied (:meth:`load_weights` copies
            them again after training changed them).
        config: an :class:`EngineConfig`.

    Raises:
        ValueError: ``config.max_len`` is over the model's ``max_seq_len``, or an ``attention``
            kernel this device cannot run.
    """

    def __init__(self, model: GPT, config: EngineConfig = EngineConfig()) -> None:
        self.config = c = config
        dev = model.embed_tokens.weight.device
        cuda = dev.type == "cuda"
        dtype = torch.bfloat16 if c.dtype == "bf16" or (c.dtype == "auto" and cuda) else torch.float32
        if c.max_len > model.cfg.max_seq_len:
            raise ValueError(f"EngineConfig.max_len={c.max_len} is over the model's max_seq_len={model.cfg.max_seq_len}: "
                             "positions past what it was trained on are untrained; lower max_len (0: the model's)")
        self.max_len = c.max_len or model.cfg.max_seq_len
        self.decode_steps = c.decode_steps or (4 if cuda else 1)
        self.model = InferenceModel(model, dtype, self.max_len, compile=c.compile and cuda, attention=c.attention)
        self.device, self.cuda = dev, cuda
        mc = model.cfg
        per_slot = 2 * mc.n_layer * (self.max_len + 1) * mc.n_kv_head * mc.head_dim * dtype.itemsize
        slots = c.slots
        if slots == 0:
            room = c.cache_memory_frac * torch.cuda.mem_get_info(dev)[0] if cuda else CPU_CACHE_BYTES
            slots = max(1, min(256 if cuda else 16, int(room // per_slot)))
        self.cache = KVCache.empty(mc.n_layer, slots, self.max_len, mc.n_kv_head, mc.head_dim, dev, dtype)
        S = self.slots = slots
        z = lambda dt: torch.zeros(S, dtype=dt, device=dev)  # noqa: E731
        self.tokens, self.lengths, self.counter, self.seed = z(torch.long), z(torch.long), z(torch.long), z(torch.long)
        self.budget = z(torch.long)  # tokens each slot's row may still generate
        self.temperature, self.top_p, self.top_k = z(torch.float32), torch.ones(S, device=dev), z(torch.long)
        self.active = torch.zeros(S, dtype=torch.bool, device=dev)
        self.options = RowOptions(S, mc.vocab_size, dev)  # penalties, logit_bias, top_logprobs
        self.vocab_size = mc.vocab_size
        # allowed tokens of each slot's next position (grammar.py's bitmask; all ones for a free row)
        self.bitmask = torch.full((S, words(mc.vocab_size)), -1, dtype=torch.int32, device=dev)
        self._host_mask = torch.full((S, words(mc.vocab_size)), -1, dtype=torch.int32, pin_memory=cuda)
        self.cu_q = torch.arange(S + 1, dtype=torch.int32, device=dev)
        self.cu_k = self.cu_q * self.cache.positions
        # (batch bucket, "forward") / (batch bucket, LaunchKind, "free" | "masked") -> a captured
        # graph and its outputs: the free decode steps; a masked step's forward pass and its masked sampling
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = {}
        self._pool = None
        self._prefill_run = Prefill(self.model, self.cache, cuda and c.cuda_graphs, lambda fn: self._capture(0, fn),
                                    self._h2d)
        self._free = list(range(S))  # a heap: the lowest free slot first keeps batches small
        self._rows: list[Row | None] = [None] * S
        self._waiting: list[tuple[int, Request, list[int]]] = []
        self._pending: list[Launch] = []
        self._outputs: dict[int, dict[int, Sample]] = {}
        self._open: dict[int, int] = {}  # request id -> rows not yet finished
        self._next_id = 0
        self._active_rows: tuple[int, ...] = ()
        self.counters = StepCounters()  # the step timeline in totals (serve's /health, benchmarks)
        # seconds warm_up took (compiling and capturing every bucket first; CUDA and config.warm_up only)
        self.warm_up_s = warm_up(self) if cuda and c.warm_up else 0.0

    # -- public API ---------------------------------------------------------------------------

    def load_weights(self, model: GPT) -> None:
        """Copy ``model``'s weights in again (in place: captured graphs stay valid)."""
        self.model.load(model)

    def add(self, request: Request) -> int:
        """Queue ``request``; returns its id.

        Raises:
            ValueError: prompt plus ``max_new_tokens`` is longer than the engine's ``max_len``
                (shorten the prompt, lower ``max_new_tokens`` or raise ``EngineConfig.max_len``;
                nothing is cut silently), a grammar compiled for more ids than the model has, or a
                ``logit_bias`` id past the vocabulary.
        """
        bad = [i for i, _ in request.sampling.logit_bias if i >= self.vocab_size]
        if bad:
            raise ValueError(f"logit_bias names token id {bad[0]}, past the model's vocabulary of {self.vocab_size} ids")
        if request.grammar is not None and request.grammar.vocab_size > self.vocab_size:
            raise ValueError(f"the request's grammar was compiled for a tokenizer of {request.grammar.vocab_size} ids, "
                             f"the model has {self.vocab_size}: compile it with the model's own tokenizer")
        total = len(request.prompt) + request.sampling.max_new_tokens
        if total > self.max_len:
            raise ValueError(f"prompt of {len(request.prompt)} tokens + max_new_tokens "
                             f"{request.sampling.max_new_tokens} = {total} is over the engine's context of "
                             f"{self.max_len} positions (model.max_seq_len={self.model.cfg.max_seq_len}): shorten "
                             "the prompt or lower max_new_tokens")
        rid = self._next_id
        self._next_id += 1
        self._outputs[rid] = {i: Sample() for i in request.samples}
        self._open[rid] = len(request.samples)
        if request.samples:
            self._waiting.append((rid, request, list(request.samples)))
        return rid

    def cancel(self, rid: int, sample: int | None = None) -> None:
        """Stop request ``rid``'s row ``sample`` (every row when None): its slot frees, other rows
        go on, and its output keeps what was generated with finish ``cancelled``."""
        for i, (wid, req, idx) in enumerate(self._waiting):
            if wid == rid:
                drop = idx if sample is None else [s for s in idx if s == sample]
                for s in drop:
                    self._finish_output(rid, s, "cancelled")
                self._waiting[i] = (wid, req, [s for s in idx if s not in drop])
        self._waiting = [w for w in self._waiting if w[2]]
        for row in self._rows:
            if row is not None and row.rid == rid and (sample is None or row.sample == sample):
                self._release(row, "cancelled")

    def busy(self) -> tuple[int, int]:
        """``(running, waiting)``: rows holding a cache slot, and sample rows queued for one."""
        return sum(r is not None for r in self._rows), sum(len(w[2]) for w in self._waiting)

    def has_work(self) -> bool:
        """Whether any request is waiting, running or has tokens not yet returned."""
        return bool(self._waiting or self._pending or any(r is not None for r in self._rows))

    def step(self) -> list[Token]:
        """One scheduler step (module docstring); returns the tokens that came back."""
        t0 = time.perf_counter()
        if any(r is not None and r.matcher is not None for r in self._rows):
            events = self._drain(keep=None)  # every token in: the next masks depend on them
            launched = self._launch_decode(masked=True)
            events += self._drain(keep=None, also=launched)
            # a prefill has a fixed host cost, and a masked step makes one token:
            # new rows wait until an eighth of the slots is free (or none runs), then join in one prefill
            admit = len(self._free) >= max(1, self.slots // 8) or not any(r is not None for r in self._rows)
        else:
            events, admit = self._drain(keep=self._launch_decode()), True
        if admit:
            t1 = time.perf_counter()
            self._admit()
            self.counters.admit_s += time.perf_counter() - t1
        c = self.counters
        c.steps += 1
        c.tokens += len(events)
        c.step_s += time.perf_counter() - t0
        return events

    def run(self) -> Iterator[Token]:
        """Step until no work is left, yielding every token as it comes back."""
        while self.has_work():
            yield from self.step()

    def output(self, rid: int) -> list[Sample]:
        """Request ``rid``'s samples, in the order of its sample indices (finished or not)."""
        return list(self._outputs[rid].values())

    def done(self, rid: int) -> bool:
        return self._open.get(rid, 0) == 0

    def pop(self, rid: int) -> list[Sample]:
        """:meth:`output` of a finished request, forgetting it."""
        if not self.done(rid):
            raise ValueError(f"request {rid} is still running")
        self._open.pop(rid, None)
        return list(self._outputs.pop(rid).values())

    def generate(self, requests: Sequence[Request], deadline: float | None = None) -> list[list[Sample]]:
        """Run ``requests`` (with whatever else is queued) to the end; their samples, in order. With a
        ``deadline`` (``time.monotonic()``), rows still running when it passes are cancelled (finish
        ``cancelled``, keeping what they generated) after the step in flight."""
        ids = [self.add(r) for r in requests]
        while self.has_work():
            self.step()
            if deadline is not None and time.monotonic() >= deadline:
                for i in ids:
                    self.cancel(i)
                deadline = None  # what is in flight drains; nothing new runs for these requests
        return [self.pop(i) for i in ids]

    def stream(self, request: Request) -> Iterator[Token]:
        """Add ``request`` and yield its tokens as they come (other requests advance too).
        Closing the iterator early cancels the request."""
        rid = self.add(request)
        try:
            while not self.done(rid):
                for ev in self.step():
                    if ev.request == rid:
                        yield ev
        finally:
            if not self.done(rid):
                self.cancel(rid)
            self._open.pop(rid, None)
            self._outputs.pop(rid, None)

    @torch.inference_mode()
    def score(self, prompt: Sequence[int], completion: Sequence[int]) -> list[float]:
        """Log-probability at temperature 1 of each token of ``completion`` after ``prompt``: one
        teacher-forced pass (no cache slot is used).

        Raises:
            ValueError: ``prompt`` or ``completion`` is empty, or together they exceed ``max_len``.
        """
        if not prompt or not completion:
            raise ValueError(f"need a non-empty prompt and completion, got {len(prompt)} and {len(completion)} tokens")
        from .scoring import forced_logprobs  # the pass shared with the server's prompt log-probabilities
        return forced_logprobs(self, list(prompt) + list(completion), len(prompt))[0].tolist()

    # -- internals ----------------------------------------------------------------------------

    def _params(self, idx: torch.Tensor | slice, kind: LaunchKind) -> RowParams:
        """The sampling settings of slots ``idx`` for rows of ``kind``."""
        return RowParams(self.temperature[idx], self.top_k[idx], self.top_p[idx], self.seed[idx], self.counter[idx],
                         filtered=kind.filtered, sampled=kind.sampled)

    def _h2d(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        """``values`` on the device without a host sync (pinned memory, asynchronous copy)."""
        t = torch.tensor(values, dtype=dtype)
        return t.pin_memory().to(self.device, non_blocking=True) if self.cuda else t

    def _launch(self, rows: list[Row], out: tuple[torch.Tensor, ...], index: list[int]) -> Launch:
        """Queue the copy of a launch's results ``out`` to the host: tokens (steps, n), log-probabilities
        (steps, 2, n) (:class:`Token`'s ``logprob``, ``logprob_t1``) and, when a row asked for
        ``top_logprobs``, the (steps, n, K) top ids and log-probs; row ``rows[j]`` is entry ``index[j]``."""
        if not self.cuda:
            return Launch(rows, index, out[0], out[1], tuple(out[2:]), None)
        host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in out]
        for h, t in zip(host, out):
            h.copy_(t, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        return Launch(rows, index, host[0], host[1], tuple(host[2:]), ev)

    @torch.inference_mode()
    def _launch_decode(self, masked: bool = False) -> Launch | None:
        """Launch the decode steps of every running row (one step, under the grammars' masks, when ``masked``)."""
        rows = [r for r in self._rows if r is not None and r.out.finish is None and r.launched < r.req.sampling.max_new_tokens]
        if not rows:
            return None
        steps = 1 if masked else self.decode_steps
        top = max(r.slot for r in rows) + 1
        b = next(k for k in self.batch_buckets() if k >= top)
        key = tuple(r.slot for r in rows)
        if key != self._active_rows:
            mask = [False] * self.slots
            for k in key:
                mask[k] = True
            self.active.copy_(self._h2d(mask, torch.bool))
            self._active_rows = key
        kind = row_kind(rows)
        graphs = self.cuda and self.config.cuda_graphs
        max_used = None if self.cuda else max(r.launched + len(r.req.prompt) for r in rows)
        if masked:  # the forward pass runs on the device while the host computes the masks
            if graphs:
                if (b, "forward") not in self.graphs:
                    self.graphs[b, "forward"] = self._capture(b, lambda: (self._forward(b),))
                graph, (logits,) = self.graphs[b, "forward"]
                graph.replay()
            else:
                logits = self._forward(b, max_used)
            t0 = time.perf_counter()
            fill_rows([(r.matcher, r.slot) for r in rows if r.matcher is not None], self._host_mask)
            self.counters.fill_s += time.perf_counter() - t0
            self.bitmask[:b].copy_(self._host_mask[:b], non_blocking=True)  # the rows in use only
            if graphs:
                if (b, kind, "masked") not in self.graphs:
                    self.graphs[b, kind, "masked"] = self._capture(b, lambda: self._masked_sample(b, kind, logits))
                graph, out = self.graphs[b, kind, "masked"]
                graph.replay()
            else:
                out = self._masked_sample(b, kind, logits)
        elif graphs:
            if (b, kind, "free") not in self.graphs:
                self.graphs[b, kind, "free"] = self._capture(b, lambda: self._decode_steps(b, kind))
            graph, out = self.graphs[b, kind, "free"]
            graph.replay()
        else:
            out = self._decode_steps(b, kind, max_used)
        for r in rows:
            r.launched = min(r.launched + steps, r.req.sampling.max_new_tokens)
        self.counters.launches += 1
        self.counters.masked_launches += masked
        self.counters.launch_rows += len(rows)
        return self._launch(rows, out, [r.slot for r in rows])

    def batch_buckets(self) -> list[int]:
        """The decode batch sizes a launch is padded to (one compile and graph each): 1, 2, 4, ... and ``slots``."""
        out, k = [], 1
        while k < self.slots:
            out.append(k)
            k *= 2
        return out + [self.slots]

    def _forward(self, b: int, max_used: int | None = None) -> torch.Tensor:
        """The (b, V) logits of slots ``0..b-1``'s next token (the forward pass writes their keys and
        values). ``max_used`` (host) bounds the attended positions off CUDA."""
        m = self.model
        attend = m.decode_attend(self.cache, self.lengths[:b], self.cu_q[:b + 1], self.cu_k[:b + 1], max_used)
        return m.logits(m.forward(self.tokens[:b], self.lengths[:b], attend))

    def _advance(self, b: int, kind: LaunchKind, logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Sample slots ``0..b-1``'s tokens from ``logits`` (after the options ``kind`` uses:
        :class:`~.options.RowOptions`) and, for active rows with budget left, update their current
        token, length, counter, budget and token counts. Returns (b,) tokens, the two (b,)
        log-probabilities and, with ``top_logprobs``, the (b, K) top ids and log-probs."""
        logits = self.options.apply(slice(0, b), logits, kind)
        top = self.options.top(logits, kind)
        tok, lp, lp1 = sample(logits, self._params(slice(0, b), kind))
        go = self.active[:b] & (self.budget[:b] > 0)
        self.options.count(slice(0, b), tok, go, kind)
        self.tokens[:b] = torch.where(go, tok, self.tokens[:b])
        self.lengths[:b] += go
        self.counter[:b] += go
        self.budget[:b] -= go.long()
        return (tok, lp, lp1, *top)

    def _decode_steps(self, b: int, kind: LaunchKind, max_used: int | None = None) -> tuple[torch.Tensor, ...]:
        """``decode_steps`` free decode steps of slots ``0..b-1``, all on the device (a CUDA graph
        captures them whole): :meth:`_forward` then :meth:`_advance`, each step. ``max_used`` bounds
        the first step's attended positions off CUDA. Returns the (steps, b) tokens, the
        (steps, 2, b) log-probabilities and, with ``top_logprobs``, the (steps, b, K) top ids and log-probs."""
        steps = [self._advance(b, kind, self._forward(b, None if max_used is None else max_used + i))
                 for i in range(self.decode_steps)]
        return stacked(steps)

    def _masked_sample(self, b: int, kind: LaunchKind, logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The second half of a masked decode step: ``logits`` ((b, V), from :meth:`_forward`) of the
        tokens ``self.bitmask`` forbids set to ``-inf``, then :meth:`_advance`; one step's outputs
        shaped as :meth:`_decode_steps`'."""
        logits = logits.masked_fill(~unpack(self.bitmask[:b], logits.size(-1)), float("-inf"))
        return stacked([self._advance(b, kind, logits)])

    def _capture(self, b: int, fn: Callable[[], tuple[torch.Tensor, ...]]
                 ) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]:
        """:func:`capture_graph` of ``fn`` (work on slots ``0..b-1``) in the engine's one memory pool,
        the rows' state restored. A masked step's two graphs are captured, and replayed, forward first."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        kept = [t[:b] for t in (self.tokens, self.lengths, self.counter, self.budget)]
        if self.options.counts is not None:  # a penalized warm-up counts its tokens too
            kept.append(self.options.counts[:b])
        return capture_graph(fn, kept, self._pool)

    def _drain(self, keep: Launch | None, also: Launch | None = None) -> list[Token]:
        """Read back every pending launch but ``keep`` (and then ``also``, a launch not yet pending)."""
        events: list[Token] = []
        todo = [x for x in self._pending if x is not keep] + ([also] if also is not None else [])
        self._pending = [keep] if keep is not None else []
        for launch in todo:
            if launch.event is not None:
                t0 = time.perf_counter()
                launch.event.synchronize()
                self.counters.wait_s += time.perf_counter() - t0
            tops = zip(*(t.tolist() for t in launch.top)) if launch.top else itertools.repeat(None)
            for toks, lps, top in zip(launch.tokens.tolist(), launch.lps.tolist(), tops):  # step by step
                for row, j in zip(launch.rows, launch.index):
                    if row.out.finish is not None:
                        continue  # stopped or cancelled: this token was computed after the fact
                    t = toks[j]
                    out = row.out
                    out.token_ids.append(t)
                    out.logprobs.append(lps[0][j])
                    out.logprobs_t1.append(lps[1][j])
                    k = row.req.sampling.top_logprobs
                    best = tuple(zip(top[0][j][:k], top[1][j][:k])) if k else None
                    if k:
                        out.top_logprobs.append(best)
                    finish = finish_of(row, t)
                    events.append(Token(row.rid, row.sample, t, lps[0][j], lps[1][j], finish, best))
                    if finish:
                        self._release(row, finish)
        return events

    def _release(self, row: Row, finish: str) -> None:
        row.out.finish = finish
        if row.matcher is not None:
            self._host_mask[row.slot] = -1  # the slot's next row may be free
        self._open[row.rid] -= 1
        if self._rows[row.slot] is row:
            self._rows[row.slot] = None
            heapq.heappush(self._free, row.slot)

    def _finish_output(self, rid: int, sample: int, finish: str) -> None:
        self._outputs[rid][sample].finish = finish
        self._open[rid] -= 1

    @torch.inference_mode()
    def _admit(self) -> None:
        groups: list[tuple[int, Request, list[int]]] = []
        budget = self.config.max_prefill_tokens
        while self._waiting and self._free:
            rid, req, idx = self._waiting[0]
            if groups and len(req.prompt) > budget:
                break
            take = idx[:len(self._free)]
            slots = [heapq.heappop(self._free) for _ in take]
            groups.append((rid, req, list(zip(take, slots))))
            budget -= len(req.prompt)
            if len(take) < len(idx):
                self._waiting[0] = (rid, req, idx[len(take):])
                break
            self._waiting.pop(0)
        if groups:
            self._prefill(groups)

    def _prefill(self, groups: list) -> None:
        """Admit ``groups`` ((request id, request, [(sample, slot)]) each): prefill each prompt but its
        last token into the group's slots and set the rows' state so that the next decode launch reads
        that token as the row's current one. Each row's first token is then sampled by the decode
        launch like every other (its graph, its masks for a constrained row): admission launches no
        logits, no sampling and no per-row copies (that eager tail cost the H100's host ~8 ms an
        admission: ``benchmarks/RESULTS.md``, eleventh session)."""
        rows: list[Row] = []
        for rid, req, pairs in groups:
            for s, slot in pairs:
                row = Row(rid, s, req, slot, out=self._outputs[rid][s])
                if req.grammar is not None:
                    row.matcher = req.grammar.matcher()
                self._rows[slot] = row
                rows.append(row)
        todo = [(req.prompt[:-1], [slot for _, slot in pairs]) for _, req, pairs in groups if len(req.prompt) > 1]
        c = self.counters
        c.prefills += 1
        c.prefill_rows += len(rows)
        c.prefill_tokens += sum(len(p) for p, _ in todo)
        if todo:
            self._prefill_run([p for p, _ in todo], [slots for _, slots in todo])
        sc = [r.req.sampling for r in rows]
        # each row's settings in two copies: (6, rows) int64 and (2, rows) float32
        ints = self._h2d([[r.slot for r in rows], [x.top_k for x in sc], [row_seed(r.req.seed, r.sample) for r in rows],
                          [r.req.prompt[-1] for r in rows], [len(r.req.prompt) - 1 for r in rows],
                          [x.max_new_tokens for x in sc]], torch.long)
        floats = self._h2d([[x.temperature for x in sc], [x.top_p for x in sc]], torch.float32)
        slots = ints[0]
        self.top_k[slots], self.seed[slots], self.tokens[slots] = ints[1], ints[2], ints[3]
        self.lengths[slots], self.budget[slots] = ints[4], ints[5]
        self.temperature[slots], self.top_p[slots] = floats[0], floats[1]
        self.counter[slots] = 0
        self.options.admit(slots, sc, self._h2d)
        self._active_rows = ()  # the active mask changes
