"""The captured prefill's bookkeeping (``codechat/engine/prefill.py``) on the CPU.

The graph path needs CUDA and FlashAttention's varlen kernel; here it runs with two stand-ins: a
varlen attention that reads the segment boundaries from the device tensor as the kernel does
(zero-length segments included), and a "graph" whose replay reruns the captured function into
the captured outputs. What is checked is everything else: the padding to a bucket, the padded
segment and its writes to the extra position only, the samples' copies, and the static buffers
reused by a later, shorter prefill — against the op-by-op prefill and against whole generations.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from codechat.config.stages import preset
from codechat.engine import Engine, EngineConfig, Request, SamplingConfig
from codechat.engine import runner
from codechat.engine import prefill
from codechat.engine.prefill import BUCKETS, Prefill, copy_prompt, graph_chunks
from codechat.engine.runner import KVCache
from codechat.model import build_model

VOCAB, MAX_LEN = 256, 160
pytestmark = pytest.mark.timeout(120)


def varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, causal, used_k=None):
    """``runner._flash`` in a prefill, in SDPA: causal attention within each segment of ``cu_q``
    (read on the device side, as the kernel does), ``max_q`` an upper bound of their lengths."""
    assert causal and torch.equal(cu_q, cu_k) and used_k is None
    out = torch.zeros_like(q)
    bounds = cu_q.tolist()
    assert bounds[0] == 0 and bounds[-1] == q.size(0) and max(b - a for a, b in zip(bounds, bounds[1:])) <= max_q
    for a, b in zip(bounds, bounds[1:]):
        if b > a:
            qs, ks, vs = (t[a:b].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
            out[a:b] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)[0].transpose(0, 1)
    return out


class ReplayedFunction:
    """A stand-in CUDA graph: ``replay`` reruns the captured function into the captured outputs."""

    def __init__(self, fn):
        self.fn, self.replays = fn, 0

    def capture(self):
        self.out = self.fn()
        return self, self.out

    def replay(self) -> None:
        self.replays += 1
        for o, n in zip(self.out, self.fn()):
            o.copy_(n)


@pytest.fixture
def graphs_on_cpu(monkeypatch):
    monkeypatch.setattr(runner, "_flash", varlen_attention)
    captured: list[ReplayedFunction] = []

    def capture(fn):
        captured.append(ReplayedFunction(fn))
        return captured[-1].capture()

    def install(engine: Engine) -> list[ReplayedFunction]:
        engine.model.flash = True  # prefill only: decode attention was chosen when the engine was built
        engine._prefill_run = Prefill(engine.model, engine.cache, True, capture, engine._h2d)
        return captured
    return install


def make_engine(slots: int = 8) -> Engine:
    torch.manual_seed(0)
    model = build_model(preset("tiny", vocab_size=VOCAB, max_seq_len=MAX_LEN, init_std=0.1)).eval()
    return Engine(model, EngineConfig(slots=slots, max_len=MAX_LEN))


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


#: Prefills in order: (prompts, each prompt's slots).
BATCHES = [([prompt(40, 1), prompt(3, 2), prompt(70, 3)], [[2, 5], [0], [1, 6, 7]]),  # 113 tokens: bucket 128
           ([prompt(9, 4)], [[3]]),  # a later, shorter prefill through the same static buffers
           ([prompt(150, 5), prompt(2, 6)], [[4], [3]]),  # bucket 256
           ([prompt(5, 7)], [[6]])]  # bucket 128 again, after a larger one: no stale index reaches it


def test_copy_prompt_copies_the_positions_of_every_layer_bitwise_and_nothing_else():
    torch.manual_seed(1)
    cache = KVCache.empty(3, 5, 9, 2, 4, torch.device("cpu"), torch.float32)
    for t in (*cache.k, *cache.v):
        t.normal_()
    before = [t.clone() for t in (*cache.k, *cache.v)]
    copy_prompt(cache, 1, [3, 4], 6)
    for t, b in zip((*cache.k, *cache.v), before):
        assert torch.equal(t[3, :6], b[1, :6]) and torch.equal(t[4, :6], b[1, :6])
        assert torch.equal(t[3:, 6:], b[3:, 6:]) and torch.equal(t[:3], b[:3])


@torch.inference_mode()
def test_a_captured_prefill_writes_the_same_cache_and_hidden_states_as_the_op_by_op_one(graphs_on_cpu):
    eager, graphed = make_engine(), make_engine()
    captured = graphs_on_cpu(graphed)
    for t in (*graphed.cache.k, *graphed.cache.v, *eager.cache.k, *eager.cache.v):
        t.fill_(7.0)  # what a finished row left behind
    for prompts, slots in BATCHES:
        want = eager._prefill_run(prompts, slots)
        got = graphed._prefill_run(prompts, slots)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert [c.replays for c in captured] == [3, 1], "each bucket captured once, then replayed"
    P = graphed.cache.positions
    for g, e in zip((*graphed.cache.k, *graphed.cache.v), (*eager.cache.k, *eager.cache.v)):
        torch.testing.assert_close(g[:, :P - 1], e[:, :P - 1], rtol=1e-5, atol=1e-5)
        assert torch.equal(g[1:, P - 1], e[1:, P - 1]), "the padding writes only slot 0's extra position"
    assert BUCKETS[0] == 128


@torch.inference_mode()
def test_a_bucket_captured_after_a_larger_ones_prefill_reads_no_stale_index(graphs_on_cpu):
    """Capturing runs the forward pass once: the last-token indices a larger bucket's prefill left
    would read past the smaller bucket's tokens (on CUDA a device-side assert that ended a GPU
    speedrun's HumanEval, 2026-12-05)."""
    eager, graphed = make_engine(), make_engine()
    graphs_on_cpu(graphed)
    for prompts, slots in (BATCHES[2], BATCHES[0]):  # bucket 256, then 128 captured
        torch.testing.assert_close(graphed._prefill_run(prompts, slots), eager._prefill_run(prompts, slots),
                                   rtol=1e-5, atol=1e-5)
    assert list(graphed._prefill_run.graphs) == [256, 128]


def test_prompts_split_in_order_into_runs_of_at_most_the_limit():
    assert graph_chunks([70, 50, 60, 10], 128) == [range(0, 2), range(2, 4)]
    assert graph_chunks([200, 5, 130], 128) == [range(0, 1), range(1, 2), range(2, 3)]  # an oversized one alone
    assert graph_chunks([128], 128) == [range(0, 1)] and graph_chunks([], 128) == []


@torch.inference_mode()
def test_a_prefill_over_the_largest_bucket_runs_as_several_replays_equal_to_the_op_by_op_one(graphs_on_cpu,
                                                                                           monkeypatch):
    """Past the largest bucket (here 128 tokens), prompts that each fit go in runs of replays, each
    run's hidden states kept before the next replay overwrites the graph's outputs."""
    monkeypatch.setattr(prefill, "BUCKETS", (64, 128))
    monkeypatch.setattr(prefill, "GRAPH_TOKENS", 128)
    eager, graphed = make_engine(), make_engine()
    captured = graphs_on_cpu(graphed)
    # 230 tokens: 120 + 110, both runs through the 128-token graph (the second replay overwrites its outputs)
    prompts, slots = [prompt(70, 11), prompt(50, 12), prompt(60, 13), prompt(50, 14)], [[0], [1, 2], [3], [4]]
    torch.testing.assert_close(graphed._prefill_run(prompts, slots), eager._prefill_run(prompts, slots),
                               rtol=1e-5, atol=1e-5)
    assert list(graphed._prefill_run.graphs) == [128] and [c.replays for c in captured] == [2]
    P = graphed.cache.positions
    for g, e in zip((*graphed.cache.k, *graphed.cache.v), (*eager.cache.k, *eager.cache.v)):
        torch.testing.assert_close(g[:5, :P - 1], e[:5, :P - 1], rtol=1e-5, atol=1e-5)
    long = [prompt(140, 15), prompt(5, 16)]  # one prompt over the largest bucket: op by op, no replay
    torch.testing.assert_close(graphed._prefill_run(long, [[5], [6]]), eager._prefill_run(long, [[5], [6]]),
                               rtol=1e-5, atol=1e-5)
    assert [c.replays for c in captured] == [2]


@torch.inference_mode()
def test_generation_through_captured_prefills_equals_the_op_by_op_engine(graphs_on_cpu):
    eager, graphed = make_engine(slots=6), make_engine(slots=6)
    captured = graphs_on_cpu(graphed)
    greedy, sampled = SamplingConfig(max_new_tokens=12, temperature=0.0), SamplingConfig(max_new_tokens=10)
    reqs = [Request(prompt(n, n), greedy) for n in (1, 17, 60)] + [Request(prompt(25, 9), sampled, samples=3, seed=5)]
    reqs += [Request(prompt(n, n + 100), greedy) for n in (33, 5)]  # they join as slots free
    want = [[s.token_ids for s in out] for out in eager.generate(reqs)]
    got = [[s.token_ids for s in out] for out in graphed.generate(reqs)]
    assert got == want
    assert captured and sum(c.replays for c in captured) >= 2  # the first batch, then the rows that join


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the captured prefill runs on CUDA only (its CPU stand-ins are tested above)")
@torch.inference_mode()
def test_on_cuda_captured_prefills_equal_op_by_op_ones_with_the_real_kernel_and_graphs():
    torch.manual_seed(0)
    model = build_model(preset("tiny", vocab_size=VOCAB, max_seq_len=MAX_LEN, init_std=0.1)).cuda().eval()
    eager = Engine(model, EngineConfig(slots=8, max_len=MAX_LEN, cuda_graphs=False))
    graphed = Engine(model, EngineConfig(slots=8, max_len=MAX_LEN))
    if not graphed._prefill_run.graphs_on:
        pytest.skip("FlashAttention's varlen kernel does not serve this GPU / head size")
    # bf16 through GEMMs of other shapes (the bucket's rows against the prompts' own): a few ulps apart
    # (2026-12-05, H100: 4 of 96 hidden values 0.028 apart, about 3 ulps); a wrong slot or segment is off by ~1
    tol = dict(rtol=5e-2, atol=5e-2)
    for prompts, slots in BATCHES:
        torch.testing.assert_close(graphed._prefill_run(prompts, slots).float(), eager._prefill_run(prompts, slots).float(),
                                   **tol)
    P = graphed.cache.positions
    for g, e in zip((*graphed.cache.k, *graphed.cache.v), (*eager.cache.k, *eager.cache.v)):
        torch.testing.assert_close(g[:, :P - 1].float(), e[:, :P - 1].float(), **tol)
    assert list(graphed._prefill_run.graphs) == [128, 256]
    # a bucket captured after a larger one's prefill: the capture's own forward pass must not read its stale indices
    larger_first = Engine(model, EngineConfig(slots=8, max_len=MAX_LEN))
    for prompts, slots in (BATCHES[2], BATCHES[0]):
        torch.testing.assert_close(larger_first._prefill_run(prompts, slots).float(),
                                   eager._prefill_run(prompts, slots).float(), **tol)
    assert list(larger_first._prefill_run.graphs) == [256, 128]
