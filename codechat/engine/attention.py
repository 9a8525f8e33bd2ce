"""Decode attention: one new query per sequence against its slot of the KV cache, split over keys.

With one query per sequence, attention is a read of the cache; what makes it fast is spreading
that read over the whole GPU. FlashAttention's prefill kernel gives each (sequence, head) one
program that walks the keys alone: about 15 us per layer at batch 1 whatever the length. This is
the split-KV scheme of Flash-Decoding (Dao, Haziza, Massa, Sizov 2023, "Flash-Decoding for
long-context inference"): each (sequence, KV head, split) program reads its share of the
sequence's *filled* positions — the share is computed on the device from the sequence's length,
so the launch has a static shape and can live in a CUDA graph — and keeps an online softmax
(Milakov & Gimelshein 2018) for all the query heads of its KV head (grouped-query attention reads
each key once); a second kernel merges the splits by their log-sum-exp. The new token's key and
value come in as arguments: the kernel uses them at the row's newest position instead of reading
the cache there, and the one split that holds that position writes them into the cache, so a
decode step needs no separate cache-write kernels.

:func:`decode_attention` is the entry point; :func:`decode_attention_reference` is the same
computation in plain PyTorch (the tests hold the kernel to it, in Triton's interpreter on CPU).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the engine uses scaled_dot_product_attention there
    triton = None

#: Programs to aim for per launch: enough to fill a large GPU several times over (an H200's 132
#: SMs; ``benchmarks/decode_kernels_sweep.py`` found 2 splits best for d20 at batch 64).
TARGET_PROGRAMS = 1280
#: Keys per block a program reads at once (32 beat 64 and 128 at batch 1 and 64 on the H200).
BLOCK_N = 32
#: Splits per sequence at most.
MAX_SPLITS = 64


def available(device: torch.device) -> bool:
    """Whether the Triton kernel can run for tensors on ``device``."""
    return triton is not None and device.type == "cuda"


def num_splits(batch: int, n_kv_head: int, positions: int, block_n: int = BLOCK_N) -> int:
    """Splits per sequence: about :data:`TARGET_PROGRAMS` programs in all, no split shorter than
    one block of the cache's ``positions``."""
    want = math.ceil(TARGET_PROGRAMS / max(1, batch * n_kv_head))
    return max(1, min(MAX_SPLITS, want, math.ceil(positions / block_n)))


def decode_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                               v_cache: torch.Tensor, used: torch.Tensor) -> torch.Tensor:
    """Plain-PyTorch decode attention: same arguments, result and cache writes as
    :func:`decode_attention`."""
    b, H, D = q.shape
    P, Hkv = k_cache.size(1), k_cache.size(2)
    last = (used - 1).long()
    rows = torch.arange(b, device=q.device)
    k_cache.index_put_((rows, last), k)
    v_cache.index_put_((rows, last), v)
    mask = (torch.arange(P, device=q.device) < used.unsqueeze(1)).view(b, 1, 1, P)
    y = F.scaled_dot_product_attention(q.unsqueeze(2), k_cache[:b].transpose(1, 2), v_cache[:b].transpose(1, 2),
                                       attn_mask=mask, enable_gqa=H != Hkv)
    return y.squeeze(2)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, used: torch.Tensor, splits: int | None = None, block_n: int = BLOCK_N,
                     num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """Softmax attention of one new token per sequence over its first ``used`` positions, the last
    of which is the new token's: its key and value are ``k``, ``v``, which are also written into
    the cache at ``[r, used[r] - 1]`` (nothing else in the cache is written).

    Args:
        q: (b, H, D) queries (bf16, fp16 or fp32), already rotated.
        k, v: (b, Hkv, D) the new token's keys (already rotated) and values, in the cache's dtype;
            any strides (views of a fused projection do), copied only if the last one is not 1.
        k_cache, v_cache: (S, P, Hkv, D) with S >= b; row ``r`` of the batch is slot ``r``.
            The last dimension must be contiguous. Slot ``r``'s positions ``0..used[r] - 2`` are
            attended as stored; what is stored at ``used[r] - 1`` is ignored, then overwritten.
        used: (b,) int32 or int64, positions attended per row, each in ``1..P``.
        splits: splits per sequence (default :func:`num_splits`); ``block_n`` (keys per loop
            step), ``num_warps``, ``num_stages``: the kernel's launch settings (benchmarks tune them).

    Returns:
        (b, H, D) in ``q``'s dtype, scaled by ``1/sqrt(D)``.

    Raises:
        RuntimeError: Triton is not installed.
    """
    if triton is None:
        raise RuntimeError("decode_attention needs Triton; use decode_attention_reference")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    b, H, D = q.shape
    P, Hkv = k_cache.size(1), k_cache.size(2)
    G = H // Hkv
    ns = splits or num_splits(b, Hkv, P, block_n)
    part = torch.empty(b, H, ns, D, device=q.device, dtype=torch.float32)
    lse = torch.empty(b, H, ns, device=q.device, dtype=torch.float32)
    BD = triton.next_power_of_2(D)
    _partial[(b, Hkv, ns)](
        q, k, v, k_cache, v_cache, used, part, lse,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1),
        1.0 / math.sqrt(D), ns, D,
        G=G, BLOCK_G=max(16, triton.next_power_of_2(G)), BLOCK_D=BD, BLOCK_N=block_n, num_warps=num_warps,
        num_stages=num_stages)
    out = torch.empty_like(q)
    _combine[(b, H)](part, lse, out, part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1),
                     out.stride(0), out.stride(1), ns, D, BLOCK_S=triton.next_power_of_2(ns), BLOCK_D=BD,
                     num_warps=4)
    return out


if triton is not None:
    @triton.jit
    def _partial(Q, KN, VN, K, V, USED, PART, LSE,
                 sqb, sqh, sknb, sknh, svnb, svnh, skb, skp, skh, svb, svp, svh, spb, sph, sps, slb, slh,
                 sm_scale, NS, D,
                 G: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
        b = tl.program_id(0)
        hk = tl.program_id(1)
        s = tl.program_id(2)
        used = tl.load(USED + b).to(tl.int32)
        chunk = tl.cdiv(tl.cdiv(used, NS), BLOCK_N) * BLOCK_N  # this row's positions per split
        start = s * chunk
        end = tl.minimum(start + chunk, used)
        last = used - 1  # the new token's position: its k and v come from KN, VN
        offs_g = tl.arange(0, BLOCK_G)
        offs_d = tl.arange(0, BLOCK_D)
        offs_n = tl.arange(0, BLOCK_N)
        gmask = offs_g < G
        dmask = offs_d < D
        heads = hk * G + offs_g
        q = tl.load(Q + b * sqb + heads[:, None] * sqh + offs_d[None, :],
                    mask=gmask[:, None] & dmask[None, :], other=0.0)
        k_new = tl.load(KN + b * sknb + hk * sknh + offs_d, mask=dmask, other=0.0).to(K.dtype.element_ty)
        v_new = tl.load(VN + b * svnb + hk * svnh + offs_d, mask=dmask, other=0.0).to(V.dtype.element_ty)
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            pos = n0 + offs_n
            nmask = pos < end
            is_new = (pos == last)[:, None]
            kv_mask = nmask[:, None] & dmask[None, :]
            k = tl.load(K + b * skb + pos[:, None] * skp + hk * skh + offs_d[None, :], mask=kv_mask, other=0.0)
            k = tl.where(is_new, k_new[None, :], k)
            qk = tl.dot(q, tl.trans(k)).to(tl.float32) * sm_scale
            qk = tl.where(nmask[None, :], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(qk - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + b * svb + pos[:, None] * svp + hk * svh + offs_d[None, :], mask=kv_mask, other=0.0)
            v = tl.where(is_new, v_new[None, :], v)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            m_i = m_new
        nonempty = l_i > 0
        out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
        lse = tl.where(nonempty, m_i + tl.log(tl.where(nonempty, l_i, 1.0)), float("-inf"))
        tl.store(PART + b * spb + heads[:, None] * sph + s * sps + offs_d[None, :], out,
                 mask=gmask[:, None] & dmask[None, :])
        tl.store(LSE + b * slb + heads * slh + s, lse, mask=gmask)
        owner = (start <= last) & (last < end)  # exactly one split per (row, KV head); empty ones never
        tl.store(K + b * skb + last * skp + hk * skh + offs_d, k_new, mask=dmask & owner)
        tl.store(V + b * svb + last * svp + hk * svh + offs_d, v_new, mask=dmask & owner)

    @triton.jit
    def _combine(PART, LSE, OUT, spb, sph, sps, slb, slh, sob, soh, NS, D,
                 BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
        b = tl.program_id(0)
        h = tl.program_id(1)
        offs_s = tl.arange(0, BLOCK_S)
        offs_d = tl.arange(0, BLOCK_D)
        smask = offs_s < NS
        dmask = offs_d < D
        lse = tl.load(LSE + b * slb + h * slh + offs_s, mask=smask, other=float("-inf"))
        m = tl.max(lse, 0)
        w = tl.where(lse > float("-inf"), tl.exp(lse - m), 0.0)
        part = tl.load(PART + b * spb + h * sph + offs_s[:, None] * sps + offs_d[None, :],
                       mask=smask[:, None] & dmask[None, :], other=0.0)
        out = tl.sum(part * w[:, None], 0) / tl.sum(w, 0)
        tl.store(OUT + b * sob + h * soh + offs_d, out.to(OUT.dtype.element_ty), mask=dmask)
