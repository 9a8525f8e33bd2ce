"""The world of this process from ``torchrun``'s environment, and the rows each rank reads.

:func:`init_world` reads ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` (a process
not started by ``torchrun`` is a world of one; ``torchrun --nproc_per_node=1`` is a real world of
one), starts the process group (NCCL on CUDA, gloo on CPU) and pins each rank to its GPU.
:class:`RankSlice` gives each data-parallel rank its rows of the global micro-batch (the package
docstring, :mod:`codechat.parallel`, says why).
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import os
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist

from codechat.config.device import resolve_device
from codechat.config.stages import ConfigError
from codechat.data.batch import Batch


@dataclass(frozen=True)
class World:
    """This process's place: ``rank`` of ``size`` processes, ``local_rank`` of ``local_size`` on
    its node, and its ``device`` (``cuda:LOCAL_RANK`` under ``torchrun`` on GPUs); ``distributed``:
    a process group is up (under ``torchrun``, whatever the size)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    device: torch.device = torch.device("cpu")
    pp: int = 1  # pipeline stages; rank = stage * dp_size + dp_rank
    distributed: bool = False

    @property
    def main(self) -> bool:
        """Rank 0: the process that logs, prints and writes files."""
        return self.rank == 0

    @property
    def dp_size(self) -> int:
        """Data-parallel replicas: ``size / pp`` (the ranks that read different rows)."""
        return self.size // self.pp

    @property
    def dp_rank(self) -> int:
        return self.rank % self.dp_size

    @property
    def pp_rank(self) -> int:
        """This rank's pipeline stage (0 without ``--pp``)."""
        return self.rank // self.dp_size


def init_world(device: str = "auto", pp: int = 1, cpu_collectives: bool = False) -> World:
    """The world of this process from ``torchrun``'s environment (one process without it), cut
    into ``pp`` pipeline stages x ``size / pp`` data-parallel ranks. On GPUs the process group is
    NCCL's; ``cpu_collectives`` adds gloo for tensors in host memory (``train.cpu_offload``:
    the gradient norm over offloaded shards is reduced on the CPU).

    Raises:
        ConfigError: an inconsistent environment (``RANK`` outside ``WORLD_SIZE``, a node size
            that does not divide the world), or ``pp`` not dividing the world size (raised on
            every rank before the process group starts).
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    dev = resolve_device(device)
    if size % pp:
        raise ConfigError(f"--pp {pp} does not divide the world size {size}: run a multiple of {pp} processes "
                          f"(torchrun --nproc_per_node) or pick a --pp that divides {size}")
    if "WORLD_SIZE" not in os.environ:
        return World(device=dev)
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(size)))
    if not (0 <= rank < size and 0 <= local < local_size and size % local_size == 0):
        raise ConfigError(f"inconsistent torchrun environment: RANK={rank} WORLD_SIZE={size} LOCAL_RANK={local} "
                          f"LOCAL_WORLD_SIZE={local_size}")
    if dev.type == "cuda":
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        backend = ("cuda:nccl,cpu:gloo" if cpu_collectives else "nccl") if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend, device_id=dev if dev.type == "cuda" else None)
        atexit.register(_close_world)
    return World(rank, size, local, local_size, dev, pp, distributed=True)


def _close_world() -> None:
    """At exit, while the interpreter is whole: free what still holds the process group (FSDP's
    device mesh in a model caught in a reference cycle), then destroy the group. Left to the
    interpreter's finalization, that teardown can abort a run that succeeded with ``terminate
    called without an active exception`` (rc -6; seen in 1 of 80 two-rank FSDP runs whose model
    was a module global, as a gloo thread races the shutdown)."""
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def main_first(world: World) -> Iterator[None]:
    """Rank 0 runs the block first (e.g. builds files); the other ranks run it after rank 0 is done."""
    if world.size > 1 and not world.main:
        dist.barrier()
    yield
    if world.size > 1 and world.main:
        dist.barrier()


class RankSlice:
    """A loader of global micro-batches (``rows x world.dp_size`` rows each) seen through one rank:
    rows ``[dp_rank * rows, (dp_rank + 1) * rows)`` of each. State is the global loader's."""

    def __init__(self, loader: Any, world: World) -> None:
        self.loader, self.world = loader, world

    def next_batch(self) -> Batch:
        b = Batch(*self.loader.next_batch())
        dp, rank = self.world.dp_size, self.world.dp_rank
        if dp == 1:
            return b
        n = b.inputs.size(0) // dp
        rows = slice(rank * n, (rank + 1) * n)
        doc = None if b.doc_ids is None else b.doc_ids[rows]
        real = None if b.n_tokens is None else round(b.n_tokens / dp)  # for tokens/s only
        return Batch(b.inputs[rows], b.labels[rows], doc, real)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)


__all__ = ["World", "init_world", "main_first", "RankSlice"]
