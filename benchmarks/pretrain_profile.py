"""Where the GPU time of a training step goes: ``torch.profiler`` over a few steps, kernels grouped.

Used by ``pretrain_throughput.py --profile N``. Kernel names are sorted into groups by substring
(first match wins, :data:`GROUPS`): matmuls (cuBLAS / CUTLASS), attention (FlashAttention, cuDNN,
efficient attention), the loss (Inductor kernels fused around ``log_softmax`` / ``nll``), the
optimizer (fused AdamW, foreach kernels of clipping), other Inductor (Triton) kernels — norms,
RoPE, SwiGLU and their backward — and copies. ``idle`` is a step's wall time minus the sum of its
kernel times: time the GPU waited for the host (kernels of one stream do not overlap).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

#: (group, substrings of a kernel's name); the first group with a matching substring takes it.
GROUPS: list[tuple[str, tuple[str, ...]]] = [
    ("attention", ("flash", "fmha", "cudnn", "attention", "sdpa")),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_", "sm100_")),
    ("loss", ("log_softmax", "nll", "cross_entropy", "logsumexp")),
    ("optimizer", ("adam", "multi_tensor", "foreach", "norm_kernel", "lerp")),
    ("triton (fused elementwise / norms)", ("triton",)),
    ("copies", ("memcpy", "memset", "copy", "cat", "fill")),
]


def group_of(kernel: str) -> str:
    low = kernel.lower()
    return next((g for g, keys in GROUPS if any(k in low for k in keys)), "other")


def profile_steps(step: Callable[[int], None], n: int, device: torch.device, trace_dir: Path | None,
                  label: str) -> dict[str, float]:
    """Run ``step(i)`` for ``n`` steps under the profiler; print and return ms per step by group
    (plus ``wall`` and ``idle``). Raises ValueError off CUDA (there are no kernels to group)."""
    if device.type != "cuda":
        raise ValueError("--profile needs a CUDA device")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for i in range(n):
            step(i)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3 / n
    per: dict[str, float] = {}
    top: list[tuple[float, str]] = []
    for evt in prof.key_averages():
        if (evt.device_type != DeviceType.CUDA or evt.self_device_time_total <= 0
                or getattr(evt, "is_user_annotation", False) or "#" in evt.key):
            continue  # annotations (``Optimizer.step#AdamW.step``) span kernels counted already
        ms = evt.self_device_time_total / 1e3 / n
        per[group_of(evt.key)] = per.get(group_of(evt.key), 0.0) + ms
        top.append((ms, evt.key))
    busy = sum(per.values())
    per["idle"] = max(0.0, wall - busy)
    per["wall"] = wall
    print(f"profile {label}: {wall:.1f} ms a step under the profiler, GPU kernels {busy:.1f} ms")
    for g, ms in sorted(per.items(), key=lambda kv: -kv[1]):
        if g != "wall":
            print(f"  {g:38s} {ms:8.2f} ms  {ms / wall:6.1%}")
    print("  top kernels:")
    for ms, key in sorted(top, reverse=True)[:12]:
        print(f"    {ms:8.2f} ms  [{group_of(key)}] {key[:110]}")
    if trace_dir is not None:
        trace_dir.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace_dir / f"{label}.json"))
    return per


#: Profiler event names that are the process group's collectives (``nccl:all_reduce``,
#: ``gloo:broadcast``, ...) and the wrappers' own hooks (``FSDP::post_backward_reduce (3)``, DDP's
#: reducer is in C++: its work shows as the collectives alone).
COLLECTIVE_PREFIXES = ("nccl:", "gloo:")
HOOK_PREFIX = "FSDP::"


def count_collectives(step: Callable[[], None]) -> tuple[dict[str, int], dict[str, int]]:
    """Run ``step()`` once under the profiler (CPU events only); returns the collectives it launched
    by name (``{"nccl:all_reduce": 1, ...}``) and FSDP's hooks by kind (the layer index dropped:
    ``{"FSDP::post_backward_reduce": 21, ...}``). Proof that a wrapper is in place: DDP all-reduces,
    FSDP runs its hooks (over one rank torch may skip the collective itself: its hooks still run)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    collectives: dict[str, int] = {}
    hooks: dict[str, int] = {}
    for evt in prof.events():
        if evt.name.startswith(COLLECTIVE_PREFIXES):
            collectives[evt.name] = collectives.get(evt.name, 0) + 1
        elif evt.name.startswith(HOOK_PREFIX):
            kind = evt.name.split(" (")[0].split(" for ")[0]
            hooks[kind] = hooks.get(kind, 0) + 1
    return collectives, hooks
