"""The model wrapped for the world: DDP, FSDP2, HSDP, pipeline stages, activation checkpointing.

:class:`Parallel` wraps the model from outside (the model knows nothing of it); the package
docstring (:mod:`codechat.parallel`) describes each strategy, the data and the checkpoints.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from codechat.checkpoint import TIED_HEAD
from codechat.config.stages import PARALLEL_STRATEGIES as STRATEGIES
from codechat.config.stages import DDP_BUCKET_CAP_MB, DDP_GRADIENT_AS_BUCKET_VIEW, ConfigError, check_pipeline_options
from codechat.parallel.pipeline import Pipeline, stage_blocks
from codechat.parallel.state import keyed_by_name, name_optimizer_state, optimizer_parts
from codechat.parallel.world import World


class Parallel:
    """``model`` (already on ``world.device``) wrapped for ``strategy``; a process outside ``torchrun``
    wraps nothing.
    ``ac="full"`` recomputes every block's activations in the backward pass (any world size),
    ``ac="selective"`` only what :func:`selective_contexts` does not keep. With
    ``world.pp > 1`` the model is cut into pipeline stages run by ``pp_schedule`` over
    ``pp_microbatches`` (:class:`codechat.parallel.pipeline.Pipeline`): :attr:`model` is then this rank's
    stage (train and optimise it) and :attr:`eval_model` the whole model's forward through the stages.
    ``param_dtype`` (bf16 or None): what FSDP/HSDP gather the parameters in, gradients then reduced
    in fp32 (None: the parameters' own fp32). ``bucket_cap_mb``: DDP's gradient buckets, MiB
    (``train.ddp_bucket_cap_mb``). ``reshard_after_forward``: FSDP/HSDP free each block's gathered weights
    after its forward (``train.fsdp_reshard_after_forward``). ``cpu_offload``: FSDP/HSDP keep the shards (and so
    the gradients and the optimizer state built on them) in host memory, pinned on CUDA
    (``CPUOffloadPolicy``); :attr:`offloaded` tells the trainer to build its optimizer there.

    Raises:
        ConfigError: an unknown strategy, HSDP in a world of one node, fewer layers than ``--pp``
            stages, ``--pp`` with sharded data parallelism or with ``model.x0_mix`` / ``model.unet_skips``,
            or ``cpu_offload`` outside ``torchrun`` (``TrainConfig`` refuses it with DDP or ``--pp``).
    """

    def __init__(self, model: torch.nn.Module, world: World, strategy: str = "ddp", ac: str = "none",
                 pp_schedule: str = "1f1b", pp_microbatches: int = 1, param_dtype: torch.dtype | None = None,
                 cpu_offload: bool = False, bucket_cap_mb: float = DDP_BUCKET_CAP_MB, reshard_after_forward: bool = True) -> None:
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
            stage_blocks(model.cfg.n_layer, world.pp, world.pp_rank)  # fewer layers than stages: stop here
            check_pipeline_options(model.cfg, world.pp)  # x0_mix, unet_skips: not across stages
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
            self.module = DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=bucket_cap_mb,
                                                  gradient_as_bucket_view=DDP_GRADIENT_AS_BUCKET_VIEW)
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
            fully_shard(block, mesh=mesh, mp_policy=mp, offload_policy=off, reshard_after_forward=reshard_after_forward)
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
                         whole: tuple[torch.nn.Module, Callable[[], Any]] | None = None, strict: bool = True) -> None:
        """Load whole states (a one-process checkpoint, or a sharded one read through :func:`whole_template`).
        ``whole``: the whole model and a builder of its optimizer, which name a one-process optimizer
        state's parameters for a pipeline stage. ``strict`` False: ``model_sd`` may hold part of the
        model (LoRA adapters: the frozen base is already in place).

        Raises:
            RuntimeError, ValueError, KeyError: the states do not fit this model or optimizer.
        """
        if self.pipeline is not None:
            model, build = whole or (None, None)
            self.pipeline.load_state_dicts(model_sd, optim_sd, optimizer, build, model)
            return
        by_name = optim_sd is not None and keyed_by_name(optim_sd)
        if not self.sharded and not by_name:
            self.model.load_state_dict(model_sd, strict=strict)
            if optim_sd is not None:
                optimizer.load_state_dict(optim_sd)
            return
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)
        opts = StateDictOptions(full_state_dict=True, strict=strict)
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


__all__ = ["STRATEGIES", "Parallel", "checkpoint_forward", "selective_contexts"]
