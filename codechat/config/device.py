"""Which device to run on, bf16 autocast, and the GPU's peak FLOP/s (for MFU).

Every stage imports these from here (the trainer, the stage commands, sampling, chat,
evaluation, the speedrun, the benchmarks); this module imports nothing of codechat.
"""
from __future__ import annotations

import contextlib
import os
import platform

import torch

#: Dense bf16 peak FLOP/s by GPU name fragment (vendor datasheets), for MFU.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12,
                   "RTX 4090": 165e12, "RTX 3090": 71e12}


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda if available, else mps, else cpu."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {name}: CUDA is not available on this machine; use --device cpu or auto")
    return torch.device(name)


def compute_dtype(device: torch.device, dtype: str) -> torch.dtype | None:
    """What ``train.dtype`` (``auto``, ``bf16``, ``fp32``) computes in on ``device``: bf16 on CUDA
    (``auto``/``bf16``) or when asked, None (fp32, no autocast) otherwise."""
    return torch.bfloat16 if dtype == "bf16" or (dtype == "auto" and device.type == "cuda") else None


def autocast_for(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """Autocast to :func:`compute_dtype` (bf16), or no autocast (fp32)."""
    low = compute_dtype(device, dtype)
    return torch.autocast(device.type, dtype=low) if low is not None else contextlib.nullcontext()


def peak_flops(device: torch.device) -> float | None:
    """Dense bf16 peak FLOP/s of ``device`` when known (None on CPU or unknown GPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def machine(device: torch.device) -> dict[str, str | int | None]:
    """The machine a run ran on: ``gpu`` (the CUDA device's name, None on another device), ``cpu`` (the
    processor's model name from ``/proc/cpuinfo``, else :func:`platform.processor`, None when neither says)
    and ``cores`` (:func:`os.cpu_count`). Runs on the same GPU differ with the host: the speedrun's
    tokenizer, mining, compiles and sandboxes are CPU work (``benchmarks/RESULTS.md``, twenty-seventh session)."""
    cpu = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        pass
    return {"gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "cpu": cpu or platform.processor() or None, "cores": os.cpu_count()}
