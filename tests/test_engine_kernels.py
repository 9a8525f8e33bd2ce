"""The engine's Triton decode kernels against plain PyTorch, in Triton's interpreter on CPU: the
split-KV attention and the split-K skinny matmul.

Runs where Triton is installed (``pip install triton``; CUDA machines have it, the CPU CI does
not); on CUDA the same kernels are checked end to end by ``benchmarks/generate_agreement.py``,
and alone by ``benchmarks/decode_attention_check.py`` / ``decode_kernels_sweep.py``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ATTENTION = r"""
import torch
from codechat.engine.attention import decode_attention, decode_attention_reference, num_splits
torch.manual_seed(0)
worst = 0.0
NAN = float("nan")


def err(a, b):
    d = float((a - b).abs().max())
    return d if d == d else float("inf")  # a NaN (a poisoned position was read) is the worst error


def same_bytes(a, b):
    return torch.equal(a.view(torch.int32), b.view(torch.int32))  # bit for bit: NaN equals NaN


CASES = [(3, 4, 2, 32, 150, 5), (2, 2, 2, 48, 70, 2), (1, 8, 1, 16, 200, 1), (4, 6, 3, 64, 64, 4),
         (3, 4, 4, 32, 130, 3)]  # (b, H, Hkv, D, P, slots)
for b, H, Hkv, D, P, S in CASES:
    q = torch.randn(b, H, D)
    _, k, v = torch.randn(b, (H + 2 * Hkv) * D).split([H * D, Hkv * D, Hkv * D], dim=-1)
    k, v = k.view(b, Hkv, D), v.view(b, Hkv, D)  # strided views of a fused projection, as the engine has them
    used = torch.randint(1, P + 1, (b,))
    used[0], used[-1] = 1, P  # one key only (the new one); the whole cache, its extra position included
    if b > 2:
        used[1] = min(65, P)  # one key past the first block: with 3 or more splits the last ones are empty
    kc, vc = torch.randn(S, P, Hkv, D), torch.randn(S, P, Hkv, D)  # at used - 1: a stale key and value
    want_k, want_v = kc.clone(), vc.clone()  # what the cache must hold after the call: only k, v added
    for r in range(b):
        want_k[r, used[r] - 1], want_v[r, used[r] - 1] = k[r], v[r]
    ref_k, ref_v = kc.clone(), vc.clone()
    ref = decode_attention_reference(q, k, v, ref_k, ref_v, used)
    assert same_bytes(ref_k, want_k) and same_bytes(ref_v, want_v), "reference: cache writes"
    for r in range(b):  # the new position (stale) and those past it must not be attended from the cache
        kc[r, used[r] - 1:] = vc[r, used[r] - 1:] = NAN
        want_k[r, used[r]:] = want_v[r, used[r]:] = NAN
    kc[b:] = vc[b:] = want_k[b:] = want_v[b:] = NAN  # nor slots past the batch
    for splits in (None, 1, 3, 7):
        ck, cv = kc.clone(), vc.clone()
        worst = max(worst, err(decode_attention(q, k, v, ck, cv, used, splits=splits), ref))
        assert same_bytes(ck, want_k) and same_bytes(cv, want_v), f"cache writes: b={b} splits={splits}"
assert num_splits(1, 8, 4096) > num_splits(64, 8, 4096) >= 1
print(worst)
"""


SKINNY = r"""
import torch
from codechat.engine.skinny import linear_partials, num_splits
torch.manual_seed(0)
worst = 0.0
# (M, N, K, splits, block_n, block_k): ragged N and K, one row, more rows than a block, 1 split
for M, N, K, s, bn, bk in [(1, 40, 300, None, 16, 64), (5, 33, 256, 3, 16, 64), (17, 64, 130, 2, 32, 32),
                           (64, 20, 64, 1, 16, 16)]:
    x, w = torch.randn(M, K + 8)[:, :K], torch.randn(N, K)  # rows strided as a view's are
    p = linear_partials(x, w, splits=s, block_n=bn, block_k=bk)
    assert p.dim() == 3 and p.shape[1:] == (M, N) and p.shape[0] <= (s or K) and p.dtype == torch.float32
    assert s is None or s == 1 or p.shape[0] > 1, "split-K must split"
    worst = max(worst, float((p.sum(0) - x @ w.T).abs().max()))
assert num_splits(1280, 3456) > num_splits(32768, 1280) == 1
print(worst)
"""


def interpret(script: str) -> float:
    """Run ``script`` under ``TRITON_INTERPRET=1``; its last printed line (the worst error)."""
    root = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(root)) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0 and "only 0-dimensional arrays" in out.stderr:
        pytest.skip("Triton's interpreter needs numpy < 2.3 (int() of 1-element arrays)")
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.strip().splitlines()[-1])


def test_split_kv_kernel_equals_reference_attention_and_writes_the_new_kv_for_any_split():
    assert interpret(ATTENTION) < 1e-5


def test_split_k_matmul_partials_sum_to_the_product():
    assert interpret(SKINNY) < 1e-4
