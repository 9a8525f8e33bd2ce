"""CPU threads on a busy machine.

PyTorch's CPU kernels run on GNU OpenMP threads, which spin for a while at the end of each parallel
region before they sleep. When other programs keep the cores busy, a thread that spins while its peer
waits for a core wastes its time slice, and every region waits for the slowest thread: on a 2-core VM
with two busy loops beside it, ``tiny`` trained at 800-4,000 tokens/s with 2 threads, 4,300 with 1, and
5,200-6,200 with 2 threads that sleep at once (``GOMP_SPINCOUNT=0``); on the idle machine 11,600, 6,600
and 10,100 (2026-12-04, ``tiny`` forward + backward + AdamW, 4 x 512 tokens a step). So the training
commands of ``codechat`` (``speedrun``, ``pretrain``, ``sft``, ``rl``) let the threads sleep at once when the
machine is busy as they start, and leave the default when it is idle. It has to be set before PyTorch
loads (OpenMP reads it once).
"""
from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)


def calm_threads_when_busy(load: float | None = None, cores: int | None = None) -> bool:
    """Set ``GOMP_SPINCOUNT=0`` in this process's environment (its children inherit it) when the machine
    is busy: the 1-minute load average ``load`` (default: the system's) at least half the ``cores``
    (default: ``os.cpu_count()``). Returns whether it did. Silent (a debug record): a command's errors stay
    one line; the speedrun records the setting in ``metrics.json`` (``gomp_spincount``).

    Nothing is changed when the user set ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY``, or when PyTorch is
    already loaded (too late for this process).
    """
    if "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ or "torch" in sys.modules:
        return False
    load = os.getloadavg()[0] if load is None else load
    cores = cores or os.cpu_count() or 1
    if load < cores / 2:
        return False
    os.environ["GOMP_SPINCOUNT"] = "0"
    log.debug(f"this machine is busy (load {load:.1f} on {cores} cores): CPU threads sleep as soon as they wait "
             "(GOMP_SPINCOUNT=0; set it yourself to choose)")
    return True


__all__ = ["calm_threads_when_busy"]
