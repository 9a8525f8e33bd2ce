"""Tune the engine's decode kernels on this GPU: the split-K skinny matmul against cuBLAS, and the
split-KV attention kernel's launch settings, for a preset's shapes (CUDA, bf16); and the LM head's
fp32 logits three ways (:func:`time_logits`).

For each weight matrix of ``--preset`` (fused QKV, output projection, fused gate/up, down
projection, LM head) and each batch in ``--rows``, it times ``F.linear`` (cuBLAS) and every
setting of :func:`codechat.engine.skinny.linear_partials` in the grid below, each call captured
in a CUDA graph and replayed (so launch overhead is left out), checks the best against
``F.linear`` (fp32 sums vs bf16 products: max error printed), and prints per shape: cuBLAS us and
TB/s, the default setting's, the best setting's and its speedup over cuBLAS. Then the attention
kernel: for each batch, splits x keys per block x warps x stages at ``--used`` attended positions,
for each cache layout in ``--layouts`` (``position``: the engine's (slot, position, head, dim);
``head``: (slot, head, position, dim), each head's keys contiguous).

    PYTHONPATH=. python benchmarks/decode_kernels_sweep.py --preset d20 [--rows 1,64]
"""
from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F

from codechat.config.stages import preset
from codechat.engine import attention, skinny


def graph_us(fn, replays: int = 50) -> float:
    """Microseconds per call of ``fn`` replayed from a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays * 1e3


def sweep_matmul(name: str, n: int, k: int, rows: list[int]) -> None:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
    gb = n * k * 2 / 1e9
    for m in rows:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x, w)
        base = graph_us(lambda: F.linear(x, w))
        default = graph_us(lambda: skinny.linear_partials(x, w))
        best = (float("inf"), None)
        for bn, bk, (nw, ns) in itertools.product((16, 32, 64, 128), (64, 128, 256), ((4, 3), (4, 5), (8, 4), (2, 4))):
            for s in sorted({1, 2, 4, 8, 16, skinny.num_splits(n, k, bn, bk)}):
                if k // s < bk:
                    continue
                try:
                    us = graph_us(lambda: skinny.linear_partials(x, w, s, bn, bk, nw, ns))
                except Exception as e:  # a setting the compiler refuses (shared memory): skip it
                    print(f"  skip bn{bn} bk{bk} w{nw} st{ns} s{s}: {type(e).__name__}")
                    continue
                best = min(best, (us, (s, bn, bk, nw, ns)), key=lambda t: t[0])
        s, bn, bk, nw, ns = best[1]
        err = float((skinny.linear_partials(x, w, s, bn, bk, nw, ns).sum(0) - ref.float()).abs().max())
        print(f"{name:6s} N{n} K{k} M{m}: cuBLAS {base:6.1f} us {gb / base * 1e3:4.2f} TB/s | default "
              f"{default:6.1f} us | best {best[0]:6.1f} us {gb / best[0] * 1e3:4.2f} TB/s splits {s} block_n {bn} "
              f"block_k {bk} warps {nw} stages {ns} -> {base / best[0]:.2f}x cuBLAS (max err {err:.3g})", flush=True)


def time_logits(n: int, k: int, rows: list[int]) -> None:
    """The LM head's fp32 logits three ways: cuBLAS's bf16 product then a cast (rounded to bf16),
    cuBLAS with an fp32 output (``torch.mm(..., out_dtype=torch.float32)``) and the split-K kernel
    in one slice (:data:`codechat.engine.skinny.LM_HEAD`, what the engine runs); with each one's
    largest error against a float64 product."""
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
    for m in rows:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = x.double() @ w.double().t()
        ways = {"bf16 + cast": lambda: F.linear(x, w).float(),
                "fp32 out": lambda: torch.mm(x, w.t(), out_dtype=torch.float32),
                "split-K": lambda: skinny.linear_partials(x, w, **skinny.LM_HEAD)[0]}
        parts = [f"{name} {graph_us(fn):6.1f} us (err {float((fn().double() - ref).abs().max()):.1e})"
                 for name, fn in ways.items() if name != "split-K" or skinny.applies(x)]
        print(f"logits N{n} K{k} M{m}: " + " | ".join(parts), flush=True)


def sweep_attention(b: int, h: int, hkv: int, d: int, used: int, positions: int, head_major: bool) -> None:
    if head_major:  # (slot, head, position, dim) in memory, seen through the (slot, position, head, dim) view
        kc = torch.randn(b, hkv, positions, d, device="cuda", dtype=torch.bfloat16).permute(0, 2, 1, 3)
        vc = torch.randn(b, hkv, positions, d, device="cuda", dtype=torch.bfloat16).permute(0, 2, 1, 3)
    else:
        kc = torch.randn(b, positions, hkv, d, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
    q = torch.randn(b, h, d, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn(b, hkv, d, device="cuda", dtype=torch.bfloat16), torch.randn(b, hkv, d, device="cuda",
                                                                                    dtype=torch.bfloat16)
    u = torch.full((b,), used, device="cuda", dtype=torch.int32)
    gb = 2 * b * hkv * used * d * 2 / 1e9
    default = graph_us(lambda: attention.decode_attention(q, k, v, kc, vc, u))
    results = []
    for s, bn, nw, ns in itertools.product((1, 2, 3, 4, 6, 8, 12, 16), (32, 64, 128), (2, 4, 8), (2, 3, 4)):
        if used < s * bn // 2:
            continue
        try:
            us = graph_us(lambda: attention.decode_attention(q, k, v, kc, vc, u, s, bn, nw, ns))
        except Exception as e:
            print(f"  skip s{s} bn{bn} w{nw} st{ns}: {type(e).__name__}")
            continue
        results.append((us, s, bn, nw, ns))
    results.sort()
    print(f"attention {'head-major' if head_major else 'position-major'} b{b} H{h}/{hkv} used {used}: default {default:6.1f} us {gb / default * 1e3:4.2f} TB/s "
          f"(splits {attention.num_splits(b, hkv, positions)})", flush=True)
    for us, s, bn, nw, ns in results[:5]:
        print(f"   {us:6.1f} us {gb / us * 1e3:4.2f} TB/s  splits {s} block_n {bn} warps {nw} stages {ns}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="d20")
    ap.add_argument("--rows", default="1,64", help="decode batch sizes (comma-separated)")
    ap.add_argument("--used", type=int, default=384, help="attended positions per row")
    ap.add_argument("--positions", type=int, default=513, help="cache positions per slot")
    ap.add_argument("--skip-attention", action="store_true")
    ap.add_argument("--skip-matmul", action="store_true")
    ap.add_argument("--shapes", default="qkv,o,gate_up,down,head", help="weight matrices to time (comma-separated)")
    ap.add_argument("--layouts", default="position", help="cache layouts to time: position,head (comma-separated)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("decode_kernels_sweep.py needs CUDA")
    c = preset(args.preset, vocab_size=32768)
    rows = [int(r) for r in args.rows.split(",")]
    q, kv = c.n_head * c.head_dim, c.n_kv_head * c.head_dim
    shapes = (("qkv", q + 2 * kv, c.n_embd), ("o", c.n_embd, q), ("gate_up", 2 * c.intermediate_size, c.n_embd),
              ("down", c.n_embd, c.intermediate_size), ("head", c.vocab_size, c.n_embd))
    for name, n, k in () if args.skip_matmul else [t for t in shapes if t[0] in args.shapes.split(",")]:
        sweep_matmul(name, n, k, rows)
    if "head" in args.shapes.split(",") and not args.skip_matmul:
        time_logits(c.vocab_size, c.n_embd, rows)
    for layout in () if args.skip_attention else args.layouts.split(","):
        for b in rows:
            sweep_attention(b, c.n_head, c.n_kv_head, c.head_dim, args.used, args.positions, layout == "head")


if __name__ == "__main__":
    main()
