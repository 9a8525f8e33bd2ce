"""Decode matmuls: ``x @ W.T`` for a few rows of ``x`` (a decode step's batch), split over K.

A decode step multiplies at most a few dozen activation rows by each weight matrix, so the
matmul is a read of the weights: what makes it fast is keeping enough of that read in flight on
every SM. cuBLAS picks tiles for square problems and reached about 1.6-1.7 TB/s on an H200 for
d20's decode GEMMs (``benchmarks/RESULTS.md``); this kernel gives each program one ``BLOCK_N``
slice of the output columns and one of ``splits`` equal slices of K (split-K, as in
Stream-K / CUTLASS's split-K GEMMs), and writes fp32 partial sums ``(splits, M, N)``. Their sum
over the first dimension is the product; :class:`~codechat.engine.runner.InferenceModel` does
that sum inside the compiled elementwise kernel that reads the product anyway (residual add +
RMSNorm, RoPE, SwiGLU), so split-K costs no extra kernel.

:func:`linear` is the entry point; it falls back to ``F.linear`` (one partial) where the kernel
does not apply (no Triton, CPU, fp32, more than :data:`MAX_ROWS` rows).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: F.linear
    triton = None

#: Rows above this go to cuBLAS (a prefill, or a decode batch large enough to be compute-bound).
MAX_ROWS = 64
#: Programs to aim for per launch (an H200 has 132 SMs; a few programs each keep loads in flight).
TARGET_PROGRAMS = 528
#: Columns of W per program and elements of K per loop step.
BLOCK_N = 32
BLOCK_K = 128
#: Launch settings for the LM head's fp32 logits: one slice of K (no partial sums to add), 64
#: columns a program. On an H200, d20's head (``benchmarks/RESULTS.md``): 23.3 us at 1 row and 27.8
#: us at 64, against 26.7 / 34.8 us for cuBLAS's bf16 product and its fp32 cast.
LM_HEAD = dict(splits=1, block_n=64, block_k=128, num_stages=3)


def applies(x: torch.Tensor) -> bool:
    """Whether :func:`linear` runs the kernel for ``x`` (else ``F.linear``): Triton on a CUDA
    device, bf16 or fp16, at most :data:`MAX_ROWS` rows."""
    return (triton is not None and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)
            and x.size(0) <= MAX_ROWS)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(S, M, N) partial products of ``x`` (M, K) and ``w`` (N, K) whose sum over dim 0 is
    ``x @ w.T``: :func:`linear_partials` where it :func:`applies` (fp32), else ``F.linear`` as one
    partial in ``x``'s dtype."""
    return linear_partials(x, w) if applies(x) else F.linear(x, w).unsqueeze(0)


def num_splits(n: int, k: int, block_n: int = BLOCK_N, block_k: int = BLOCK_K) -> int:
    """Slices of K: about :data:`TARGET_PROGRAMS` programs in all, each slice at least 2 blocks."""
    col_blocks = -(-n // block_n)
    want = max(1, TARGET_PROGRAMS // col_blocks)
    return max(1, min(want, k // (2 * block_k)))


def linear_partials(x: torch.Tensor, w: torch.Tensor, splits: int | None = None,
                    block_n: int = BLOCK_N, block_k: int = BLOCK_K, num_warps: int = 4,
                    num_stages: int = 4) -> torch.Tensor:
    """Partial sums of ``x @ w.T`` over slices of K.

    Args:
        x: (M, K) activations (bf16, fp16 or fp32), last dimension contiguous.
        w: (N, K) weights in ``x``'s dtype, contiguous (a ``nn.Linear`` weight).
        splits: slices of K (default :func:`num_splits`); ``block_n``, ``block_k``,
            ``num_warps``, ``num_stages``: the kernel's tile and launch settings (benchmarks tune them).

    Returns:
        (S, M, N) float32 whose sum over dim 0 is ``x @ w.T`` (fp32 accumulation); S is
        ``splits`` or fewer (each slice is whole ``block_k`` blocks; none is empty).

    Raises:
        RuntimeError: Triton is not installed.
    """
    if triton is None:
        raise RuntimeError("linear_partials needs Triton; use F.linear")
    M, K = x.shape
    N = w.size(0)
    x = x if x.stride(-1) == 1 else x.contiguous()
    s = splits or num_splits(N, K, block_n, block_k)
    per_split = -(-K // s)
    chunk = -(-per_split // block_k) * block_k  # K per split, whole blocks
    s = -(-K // chunk)
    out = torch.empty(s, M, N, device=x.device, dtype=torch.float32)
    _partials[(triton.cdiv(N, block_n), s)](
        x, w, out, M, N, K, x.stride(0), w.stride(0), out.stride(0), out.stride(1), chunk,
        BLOCK_M=max(16, triton.next_power_of_2(M)), BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages)
    return out


if triton is not None:
    @triton.jit
    def _partials(X, W, OUT, M, N, K, sxm, swn, sos, som, CHUNK,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_n = tl.program_id(0)
        s = tl.program_id(1)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        mmask = offs_m < M
        nmask = offs_n < N
        start = s * CHUNK
        end = tl.minimum(start + CHUNK, K)
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(start, end, BLOCK_K):
            kk = k0 + offs_k
            kmask = kk < end
            x = tl.load(X + offs_m[:, None] * sxm + kk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
            w = tl.load(W + offs_n[:, None] * swn + kk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
            acc += tl.dot(x, tl.trans(w))
        tl.store(OUT + s * sos + offs_m[:, None] * som + offs_n[None, :], acc, mask=mmask[:, None] & nmask[None, :])
