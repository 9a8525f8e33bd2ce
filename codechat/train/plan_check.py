"""The memory plan a training stage prints before step 0 (:func:`check_training_memory`): one line on
CUDA, a warning with the planner's recommendation when the estimate exceeds the device, a hint where
FSDP could keep its gathered blocks; nothing on a CPU. The estimate itself: :mod:`codechat.train.plan`."""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Callable

from codechat.config.stages import ConfigError, ModelConfig, OptimConfig, TrainConfig

from .plan import GIB, Estimate, PlanConfig, estimate, fits, plan_config, recommend, verdict

log = logging.getLogger(__name__)


def print_plan(cfg: PlanConfig, echo: Callable[[str], None] = print) -> Estimate:
    """Echo one line: the estimated peak per GPU of ``cfg``'s layout and what it is made of."""
    e = estimate(cfg)
    parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in (
        ("weights", e.weights), ("grads", e.grads), ("optimizer", e.optimizer + e.master),
        ("activations", e.activations), ("logits", e.logits), ("buffers", max(e.buffers, e.step)),
        ("margin", e.margin)))
    host = f"; {e.host / GIB:.1f} GiB offloaded to host memory" if cfg.cpu_offload else ""
    echo(f"memory plan: ~{e.total / GIB:.1f} GiB per GPU of {cfg.gpu_mem_gib:.1f} GiB ({e.layout}, --ac {cfg.ac}; "
         f"{parts}{host}); see `codechat plan`")
    return e


def warn_if_exceeds(cfg: PlanConfig, est: Estimate) -> bool:
    """Log a warning (one line, logger ``codechat.train.plan_check``) when ``est`` exceeds
    ``cfg.gpu_mem_gib``, with the recommendation.

    Returns:
        whether it warned.
    """
    if fits(cfg, est):
        return False
    log.warning(f"{verdict(cfg, est)}; this run will likely run out of memory. Try {recommend(cfg)}")
    return True


def device_memory_gib(device: Any = None) -> float | None:
    """Total memory of a CUDA ``device`` (default: the current one) in GiB, or None without CUDA."""
    import torch
    if not torch.cuda.is_available() or (device is not None and torch.device(device).type != "cuda"):
        return None
    return torch.cuda.get_device_properties(device or torch.cuda.current_device()).total_memory / GIB


def check_training_memory(model: ModelConfig, train: TrainConfig, optim: OptimConfig, seq_len: int, device: Any,
                          echo: Callable[[str], None] = print, **layout: Any) -> Estimate | None:
    """What a training stage calls before step 0: on CUDA print the plan's line and warn if it
    exceeds the device; on other devices do nothing and return None. A layout the planner does not
    model (``--pp`` not dividing the layers) is said in one line, not an error. ``layout`` may hold
    ``lora`` (:func:`plan_config`); a started process group (torchrun) plans the wrapper in place."""
    mem = device_memory_gib(device)
    if mem is None:
        return None
    import torch.distributed as dist
    layout.setdefault("distributed", dist.is_available() and dist.is_initialized())
    if train.pp > 1:  # the planner's micro-batch is what a stage holds at once: one pipeline micro-batch
        train = replace(train, micro_batch_size=train.micro_batch_size // train.pipeline_microbatches,
                        pp_microbatches=1, pp=1)
    try:
        cfg = plan_config(model, train, optim, seq_len, gpu_mem_gib=mem, **layout)
    except ConfigError as e:
        echo(f"memory plan: not estimated ({e})")
        return None
    est = print_plan(cfg, echo)
    if not warn_if_exceeds(cfg, est):
        _hint_fsdp_kept(cfg, echo)
    return est


def _hint_fsdp_kept(cfg: PlanConfig, echo: Callable[[str], None]) -> None:
    """Under FSDP/HSDP resharding after forward, one line when keeping the gathered blocks fits too: it
    saves the backward pass's all-gathers (1b over one H100: 0.994x the plain path's tokens/s against
    0.901x; ``benchmarks/RESULTS.md``, sixteenth session)."""
    if cfg.parallel == "ddp" or not cfg.fsdp_reshard_after_forward or cfg.cpu_offload:
        return
    kept = replace(cfg, fsdp_reshard_after_forward=False)
    est = estimate(kept)
    if fits(kept, est):
        echo(f"memory plan: --train.fsdp_reshard_after_forward false fits too (~{est.total / GIB:.1f} GiB per GPU) "
             "and skips the backward pass's all-gathers: faster where the memory is not needed")


__all__ = ["print_plan", "warn_if_exceeds", "device_memory_gib", "check_training_memory"]
