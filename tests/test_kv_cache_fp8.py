"""The FP8 KV cache's host side (``EngineConfig.kv_cache_dtype="fp8"``): its per-head scales bound every
key and value the weights can produce, and an engine that cannot read such a cache refuses it.

The Triton kernel that reads and writes it is held to the reference in Triton's interpreter
(tests/test_engine_kernels.py, where Triton is installed); greedy agreement with the bf16 cache on a
trained model is measured on a GPU (``benchmarks/generate_agreement.py --kv-cache-dtype fp8``).
"""
from __future__ import annotations

import pytest
import torch

from codechat.config.stages import preset
from codechat.engine import Engine, EngineConfig
from codechat.engine.attention import FP8_MAX, decode_attention_reference, fp8_quantize
from codechat.engine.runner import InferenceModel, kv_scales
from codechat.model import build_model


@pytest.mark.parametrize("qk_norm", [True, False])
def test_the_scales_bound_every_key_and_value_the_weights_allow_and_are_not_loose_past_use(qk_norm):
    torch.manual_seed(0)
    m = build_model(preset("tiny", vocab_size=256, qk_norm=qk_norm, n_head=4, n_kv_head=2)).eval()
    with torch.no_grad():  # gains away from 1, as trained ones are
        for block in m.layers:
            block.input_layernorm.weight.uniform_(0.2, 3.0)
            if qk_norm:
                block.self_attn.k_norm.weight.uniform_(0.2, 3.0)
    im = InferenceModel(m, torch.float32, 64)
    c = m.cfg
    ks, vs = kv_scales(im.weights, c.n_layer, c.n_head, c.n_kv_head, c.head_dim)
    assert ks.shape == vs.shape == (c.n_layer, c.n_kv_head) and bool((ks > 0).all() and (vs > 0).all())
    seen_k, seen_v = torch.zeros_like(ks), torch.zeros_like(vs)

    def probe(layer, q, k, v):  # any attention output will do: the bounds hold for every input
        seen_k[layer] = torch.maximum(seen_k[layer], k.abs().amax(dim=(0, 2)))
        seen_v[layer] = torch.maximum(seen_v[layer], v.abs().amax(dim=(0, 2)))
        return q
    for scale in (1.0, 1e3):  # ordinary inputs and huge ones: an RMSNorm makes them alike
        tokens = torch.randint(0, 256, (200,))
        with torch.no_grad():
            im.weights["embed"].mul_(scale)
            im.forward(tokens, torch.arange(200) % 64, probe)
            im.weights["embed"].div_(scale)
    assert bool((seen_k <= FP8_MAX * ks).all() and (seen_v <= FP8_MAX * vs).all())  # nothing saturates
    # the typical magnitude stays in e4m3's normal range (>= 2^-6 after the scale): 3 mantissa bits kept
    assert bool((seen_k / ks > 2 ** -6 * 100).all() and (seen_v / vs > 2 ** -6 * 10).all()), (seen_k / ks, seen_v / vs)


def test_the_reference_reads_an_fp8_cache_through_its_scales():
    torch.manual_seed(0)
    b, H, Hkv, D, P = 2, 4, 2, 16, 24
    q, k, v = torch.randn(b, H, D), torch.randn(b, Hkv, D), torch.randn(b, Hkv, D)
    kf, vf = torch.randn(b, P, Hkv, D), torch.randn(b, P, Hkv, D)
    ks, vs = torch.tensor([0.01, 0.02]), torch.tensor([0.005, 0.03])
    used = torch.tensor([5, P])
    exact = decode_attention_reference(q, k, v, kf.clone(), vf.clone(), used)
    k8, v8 = fp8_quantize(kf, ks), fp8_quantize(vf, vs)
    got = decode_attention_reference(q, fp8_quantize(k, ks), fp8_quantize(v, vs), k8, v8, used, ks, vs)
    assert k8.dtype == torch.float8_e4m3fn and float((got - exact).abs().max()) < 0.1
    assert float(k8[1, used[1] - 1].float().sub(fp8_quantize(k, ks)[1].float()).abs().max()) == 0  # written


def test_an_engine_that_cannot_read_an_fp8_cache_refuses_it_in_one_line():
    model = build_model(preset("tiny", vocab_size=256)).eval()
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8' needs the Triton decode kernel .* use kv_cache_dtype='auto'"):
        Engine(model, EngineConfig(slots=2, kv_cache_dtype="fp8"))
    with pytest.raises(ValueError, match="kv_cache_dtype must be auto or fp8"):
        EngineConfig(kv_cache_dtype="int8")
