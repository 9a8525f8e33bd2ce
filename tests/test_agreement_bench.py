"""``benchmarks/generate_agreement.py``'s teacher-forced lockstep (the FP8 KV cache's faithfulness
figures), checked on the CPU with two engines of the same cache that must agree exactly: every top-1 the
same, KL 0, and the summed negative log-likelihood the plain model's own."""
from __future__ import annotations

import pytest
import torch
from conftest import benchmark_module

from codechat.config.stages import ModelConfig
from codechat.engine import Engine, EngineConfig
from codechat.model import build_model


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("generate_agreement") as module:
        yield module


def test_forced_lockstep_of_equal_engines_agrees_and_scores_the_models_own_nll(bench):
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=256, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, max_seq_len=64,
                                    init_std=0.1)).eval()
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, 256, (3, 9), generator=g).tolist()
    conts = torch.randint(0, 256, (3, 7), generator=g).tolist()
    engines = [Engine(model, EngineConfig(slots=3, max_len=32)) for _ in range(2)]
    got = bench.forced_lockstep(engines, prompts, conts)
    assert got["top1_agreement"] == [1.0] and got["mean_kl"][0] == pytest.approx(0.0, abs=1e-6)
    assert got["tokens"] == 3 * 6
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([p + c for p, c in zip(prompts, conts)])).float(), dim=-1)
    want = -sum(float(logp[r, 9 + i - 1, conts[r][i]]) for r in range(3) for i in range(1, 7))
    assert got["nll"] == [pytest.approx(want, rel=1e-4)] * 2
