"""Training across processes: the world from ``torchrun``'s environment, DDP, FSDP2, HSDP, pipeline stages.

Every training stage runs the same code in one process or under ``torchrun``: :func:`init_world`
reads ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` (a process not started by
``torchrun`` is a world of one and nothing is wrapped; ``torchrun --nproc_per_node=1`` is a real
world of one, wrapped like any other, so the DDP / FSDP paths can be timed on one GPU), starts the
process group (NCCL on CUDA, gloo on CPU) and pins each rank to its GPU; :class:`Parallel` wraps the model from outside (the model knows nothing of it):

- ``ddp``: :class:`torch.nn.parallel.DistributedDataParallel`; gradients are all-reduced once per
  optimizer step, on the last micro-step only (``no_sync`` before it: ``shared/cases/06``);
- ``fsdp``: FSDP2 ``fully_shard`` on every transformer block and on the root (parameters,
  gradients and optimizer state sharded over all ranks: ZeRO-3, Rajbhandari et al. 2020);
  gradients reduce-scattered on the last micro-step only (``set_requires_gradient_sync``); in bf16
  training (``train.dtype`` auto on CUDA) each block's parameters are gathered in bf16 and its
  gradients reduce-scattered in fp32 (``MixedPrecisionPolicy``), the sharded copies staying fp32;
  ``train.cpu_offload`` keeps the shards in host memory (``CPUOffloadPolicy``), AdamW stepping there;
- ``hsdp``: the same, sharded within a node (``LOCAL_WORLD_SIZE`` ranks) and replicated across
  nodes, on a 2-D :class:`~torch.distributed.device_mesh.DeviceMesh` (``replicate``, ``shard``);
- ``--pp N`` (``train.pp``): N pipeline stages x ``world_size / N`` data-parallel replicas of each
  (:mod:`codechat.pipeline`, on a ``("pp", "dp")`` mesh); the data-parallel side is DDP's rule
  (gradients summed once per step), sharding within a stage is not offered yet.

Data: every rank builds the same loader for the *global* micro-batch (``micro_batch_size x
dp_size`` rows, ``dp_size = world_size / pp``) and takes its data-parallel rank's rows
(:class:`RankSlice`; the stages of one pipeline read the same rows), so the order of rows is a function
of the step alone and a run resumed at another world size with the same global batch continues
the same sequence. The loss of a step is the sum over supervised tokens of every micro-batch and
rank divided by their global count (``shared/cases/05``); DDP and FSDP average gradients over
ranks, so each rank's loss is scaled by ``world_size`` first (:attr:`Parallel.loss_scale`).

Checkpoints under ``torchrun`` are sharded: every rank writes its part (:meth:`Parallel.shards`,
:func:`codechat.checkpoint.save_sharded`: FSDP's DTensor shards, a pipeline stage's parameters,
one copy of replicated ones), the optimizer state keyed by parameter name; any world size and
layout, one process included, reads them whole (:func:`whole_template`) and loads them with
:meth:`Parallel.load_state_dicts`, as it loads a one-process checkpoint (the optimizer's own format,
keyed by index). Muon orthogonalises whole matrices: under FSDP each rank gathers them for its step
(:class:`codechat.train.optim.Muon`).
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from .checkpoint import TIED_HEAD
from .config import PARALLEL_STRATEGIES as STRATEGIES
from .config import ConfigError
from .data.batch import Batch
from .device import resolve_device


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


class Parallel:
    """``model`` (already on ``world.device``) wrapped for ``strategy``; a process outside ``torchrun``
    wraps nothing.
    ``ac="full"`` recomputes every block's activations in the backward pass (any world size),
    ``ac="selective"`` only what :func:`selective_contexts` does not keep. With
    ``world.pp > 1`` the model is cut into pipeline stages run by ``pp_schedule`` over
    ``pp_microbatches`` (:class:`codechat.pipeline.Pipeline`): :attr:`model` is then this rank's
    stage (train and optimise it) and :attr:`eval_model` the whole model's forward through the stages.
    ``param_dtype`` (bf16 or None): what FSDP/HSDP gather the parameters in, gradients then reduced
    in fp32 (None: the parameters' own fp32). ``cpu_offload``: FSDP/HSDP keep the shards (and so
    the gradients and the optimizer state built on them) in host memory, pinned on CUDA
    (``CPUOffloadPolicy``); :attr:`offloaded` tells the trainer to build its optimizer there.

    Raises:
        ConfigError: an unknown strategy, HSDP in a world of one node, fewer layers than ``--pp``
            stages, ``--pp`` with sharded data parallelism, or ``cpu_offload`` outside ``torchrun``
            (``TrainConfig`` refuses it with DDP or ``--pp``).
    """

    def __init__(self, model: torch.nn.Module, world: World, strategy: str = "ddp", ac: str = "none",
                 pp_schedule: str = "1f1b", pp_microbatches: int = 1, param_dtype: torch.dtype | None = None,
                 cpu_offload: bool = False) -> None:
        if strategy not in STRATEGIES:
            raise ConfigError(f"--parallel must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        if cpu_offload and not world.distributed:
            raise ConfigError("train.cpu_offload keeps FSDP's shards in host memory: run under torchrun (even "
                              "--nproc_per_node 1)")
        self.offloaded = cpu_offload
        self.model, self.world = model, world
        self.tied_head = bool(getattr(getattr(model, "cfg", None), "tie_embeddings", False))
        self.pipeline = None
        if world.pp > 1:
            from .pipeline import stage_blocks
            stage_blocks(model.cfg.n_layer, world.pp, world.pp_rank)  # fewer layers than stages: stop here
            if strategy != "ddp" and world.dp_size > 1:
                raise ConfigError(f"--pp {world.pp} with --parallel {strategy}: stages are replicated over the "
                                  "data-parallel ranks, not sharded, yet; use --parallel ddp")
        if ac in ("full", "selective"):
            for block in model.layers:
                checkpoint_forward(block, selective_contexts if ac == "selective" else None)
        self.strategy = strategy if world.distributed else "none"
        self.module: torch.nn.Module = model
        self.eval_model: torch.nn.Module = model
        if world.pp > 1:
            from .pipeline import Pipeline
            self.strategy = "pp"
            self.pipeline = Pipeline(model, world, pp_schedule, pp_microbatches)
            self.model = self.module = self.pipeline.stage
            self.eval_model = self.pipeline.forward
            return
        if self.strategy == "none":
            return
        if self.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            ids = [world.device.index] if world.device.type == "cuda" else None
            self.module = DistributedDataParallel(model, device_ids=ids)
            return
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
        if self.strategy == "hsdp":
            if world.size == world.local_size:
                raise ConfigError("--parallel hsdp replicates across nodes and shards within one; this world is a "
                                  "single node: use --parallel fsdp")
            mesh = init_device_mesh(world.device.type, (world.size // world.local_size, world.local_size),
                                    mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh(world.device.type, (world.size,))
        # bf16 training: gather the parameters in bf16, reduce-scatter the gradients in fp32
        mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
        off = CPUOffloadPolicy(pin_memory=world.device.type == "cuda") if cpu_offload else OffloadPolicy()
        for block in model.layers:
            fully_shard(block, mesh=mesh, mp_policy=mp, offload_policy=off)
        fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=off)

    @property
    def sharded(self) -> bool:
        return self.strategy in ("fsdp", "hsdp")

    @property
    def loss_scale(self) -> float:
        """Factor on each rank's loss: DDP and FSDP average gradients over ranks; the step's loss is a
        sum (the pipeline sums them: 1)."""
        return 1.0 if self.pipeline is not None else float(self.world.size)

    @contextlib.contextmanager
    def micro_step(self, last: bool) -> Iterator[None]:
        """Backward of one micro-batch; gradients are synchronised only when ``last``."""
        if self.pipeline is not None:
            yield
            if last:
                self.pipeline.sync_grads()
            return
        if self.strategy == "ddp" and not last:
            with self.module.no_sync():
                yield
            return
        if self.sharded:
            self.model.set_requires_gradient_sync(last)
        yield

    def all_sum(self, value: float | torch.Tensor) -> float | torch.Tensor:
        """``value`` summed over ranks (itself in a world of one); a tensor is reduced in place on
        the device, with no host sync."""
        if self.world.size == 1:
            return value
        if isinstance(value, torch.Tensor):
            dist.all_reduce(value)
            return value
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.world.device)
        dist.all_reduce(t)
        return float(t)

    def data_sum(self, value: float) -> float:
        """``value`` summed over the data-parallel replicas (every stage of a pipeline holds the same rows)."""
        return self.all_sum(value) / self.world.pp

    def all_max(self, value: float) -> float:
        """The largest ``value`` over ranks (so that every rank takes the same stop decision)."""
        if self.world.size == 1:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.world.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order (``[obj]`` in a world of one)."""
        if self.world.size == 1:
            return [obj]
        out: list[Any] = [None] * self.world.size
        dist.all_gather_object(out, obj)
        return out

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip the gradients to total norm ``max_norm`` (over the whole model: every shard and
        stage); returns the norm before clipping, a 0-d float32 tensor on ``world.device`` (no
        host sync, except to bring it from offloaded shards)."""
        if self.pipeline is not None:
            return self.pipeline.clip_grad_norm(max_norm)
        total = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        total = total.full_tensor() if hasattr(total, "full_tensor") else total  # a DTensor under FSDP
        return total.to(self.world.device)

    def barrier(self) -> None:
        if self.world.size > 1:
            dist.barrier()

    # ------------------------------------------------------------------ state
    def shards(self, optimizer: Any) -> dict[str, Any]:
        """This rank's part of a sharded checkpoint (:func:`codechat.checkpoint.save_sharded`):
        ``{"model": {name: tensor}, "optim": {name: {state: tensor}}}``, FSDP's as DTensor shards, a
        pipeline stage's own parameters, a tied LM head left out (it is the embedding)."""
        module = self.model  # under --pp this rank's stage
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
            model_sd = get_model_state_dict(module)
            optim_state = get_optimizer_state_dict(module, optimizer_parts(optimizer))["state"]
        else:
            model_sd = module.state_dict()
            optim_state = name_optimizer_state(module, optimizer, optimizer.state_dict())["state"]
        if self.tied_head:
            model_sd = {k: v for k, v in model_sd.items() if k != TIED_HEAD}
            optim_state = {k: v for k, v in optim_state.items() if k != TIED_HEAD}
        return {"model": model_sd, "optim": optim_state}

    def load_state_dicts(self, model_sd: dict[str, Any], optim_sd: dict[str, Any] | None, optimizer: Any,
                         whole: tuple[torch.nn.Module, Callable[[], Any]] | None = None) -> None:
        """Load whole states (a one-process checkpoint, or a sharded one read through :func:`whole_template`).
        ``whole``: the whole model and a builder of its optimizer, which name a one-process optimizer
        state's parameters for a pipeline stage.

        Raises:
            RuntimeError, ValueError, KeyError: the states do not fit this model or optimizer.
        """
        if self.pipeline is not None:
            model, build = whole or (None, None)
            self.pipeline.load_state_dicts(model_sd, optim_sd, optimizer, build, model)
            return
        by_name = optim_sd is not None and keyed_by_name(optim_sd)
        if not self.sharded and not by_name:
            self.model.load_state_dict(model_sd)
            if optim_sd is not None:
                optimizer.load_state_dict(optim_sd)
            return
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)
        opts = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.model, model_sd, options=opts)
        if optim_sd is not None:
            if not by_name:  # a one-process checkpoint resumed under FSDP: name its parameters first
                optim_sd = name_optimizer_state(self.model, optimizer, optim_sd)
            set_optimizer_state_dict(self.model, optimizer_parts(optimizer), optim_sd, options=opts)


def checkpoint_forward(module: torch.nn.Module, context_fn: Any = None) -> None:
    """Recompute ``module``'s activations in the backward pass (non-reentrant
    ``torch.utils.checkpoint``; ``context_fn``: a selective policy such as
    :func:`selective_contexts`, None recomputes everything), by replacing its ``forward`` on the
    instance: parameter names stay as they are (checkpoints stay interchangeable), FSDP2's hooks
    still wrap the call, and under ``torch.compile`` the checkpoint is traced into the compiled
    graph. (The composable ``torch.distributed._composable.checkpoint`` hooks fail under
    ``torch.compile``: the recomputed tensors' shapes differ from the saved ones, pytorch/pytorch#166926.)"""
    from torch.utils.checkpoint import checkpoint
    forward = module.forward
    extra = {} if context_fn is None else {"context_fn": context_fn}

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)
    module.forward = checkpointed


def selective_contexts() -> tuple[Any, Any]:
    """The contexts of ``--ac selective`` for one checkpointed block (torchtitan's op-level policy,
    what :func:`codechat.train.plan.activation_bytes` counts): keep the attention's output and every
    other matmul's (in a block's order q, k, v, o, gate, up, down: q, v, gate and down), recompute
    the rest (norms, RoPE, SiLU, products, the other matmuls) in the backward pass."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    aten = torch.ops.aten
    keep = {getattr(aten, n).default for n in ("_scaled_dot_product_flash_attention",
                                                 "_scaled_dot_product_efficient_attention",
                                                 "_scaled_dot_product_cudnn_attention",
                                                 "_scaled_dot_product_flash_attention_for_cpu") if hasattr(aten, n)}
    counts = {True: 0, False: 0}  # matmuls seen in the forward and in its recomputation

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func in keep:
            return CheckpointPolicy.MUST_SAVE
        if func == aten.mm.default:
            counts[ctx.is_recompute] += 1
            return CheckpointPolicy.MUST_SAVE if counts[ctx.is_recompute] % 2 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def whole_template(model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """What :meth:`Parallel.shards` writes, as whole tensors of ``model`` (one process's, on the CPU)
    and ``optimizer`` (built over it): the template a sharded checkpoint is read into. The
    optimizer's state is first created by one step of learning rate 0 on zero gradients."""
    parts = optimizer_parts(optimizer)
    for part in parts:
        lrs = [g["lr"] for g in part.param_groups]
        for g in part.param_groups:
            g["lr"] = 0.0
            for p in g["params"]:
                p.grad = torch.zeros_like(p)
        part.step()
        for g, lr in zip(part.param_groups, lrs):
            g["lr"] = lr
        part.zero_grad(set_to_none=True)
    tied = getattr(getattr(model, "cfg", None), "tie_embeddings", False)
    named = name_optimizer_state(model, optimizer, optimizer.state_dict())
    return {"model": {k: v for k, v in model.state_dict().items() if not (tied and k == TIED_HEAD)},
            "optim": named["state"], "param_groups": named["param_groups"]}


def optimizer_parts(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The ``torch.optim`` optimizers of ``optimizer`` (Muon + AdamW is two)."""
    return [optimizer.muon, optimizer.adamw] if hasattr(optimizer, "muon") else [optimizer]


def keyed_by_name(optim_sd: dict[str, Any]) -> bool:
    groups = optim_sd.get("param_groups") or [{}]
    params = groups[0].get("params") or [0]
    return isinstance(params[0], str)


def name_optimizer_state(model: torch.nn.Module, optimizer: Any, optim_sd: dict[str, Any]) -> dict[str, Any]:
    """A one-process optimizer state (``torch.optim``'s, keyed by parameter index; Muon + AdamW's
    ``{"muon": ..., "adamw": ...}``) re-keyed by parameter name, one dict for all parts."""
    names = {id(p): n for n, p in model.named_parameters()}
    sds = [optim_sd["muon"], optim_sd["adamw"]] if hasattr(optimizer, "muon") else [optim_sd]
    state: dict[str, Any] = {}
    groups: list[dict[str, Any]] = []
    for part, sd in zip(optimizer_parts(optimizer), sds):
        order = [names[id(p)] for g in part.param_groups for p in g["params"]]
        state.update({order[i]: s for i, s in sd["state"].items()})
        groups += [{**g, "params": [order[i] for i in g["params"]]} for g in sd["param_groups"]]
    return {"state": state, "param_groups": groups}


__all__ = ["STRATEGIES", "World", "init_world", "main_first", "RankSlice", "Parallel"]
