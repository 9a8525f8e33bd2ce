"""Memory planner: the per-GPU memory of a training layout, estimated before any GPU is touched.

``codechat plan --preset 8b --gpus 8 --parallel fsdp --ac full`` (plus any training setting spelled
as in ``codechat pretrain``: ``--train.micro_batch_size 1 --data.seq_len 2048``) prints, for every
data-parallel strategy (``ddp``, ``fsdp``, ``hsdp``, and each split into ``--pp`` pipeline stages),
what one GPU holds, a verdict against ``--gpu-mem-gb`` and a recommendation. Training stages call
:func:`codechat.train.plan_check.check_training_memory` before step 0: one line on CUDA, a warning
when the estimate exceeds the device; nothing on a CPU.

What one GPU holds, in bytes (shown in GiB, 2**30 bytes). ``Ψ`` is the parameter count of the
GPU's pipeline stage, ``shard`` the ranks its model states are split over (1 for DDP, the data-
parallel ranks for FSDP, the ranks of one node for HSDP), ``tokens = micro_batch_size * seq_len``:

- weights ``Ψ param_bytes / shard``; grads ``Ψ grad_bytes / shard``; with ``--peft lora``
  (``lora_rank``) only the adapters train (``Ψ`` is theirs) and the frozen base adds its parameters
  to the weights, the blocks' projections in the compute dtype (:mod:`codechat.train.plan_states`);
- optimizer: AdamW keeps m and v, ``2 state_bytes`` per parameter; Muon keeps one momentum buffer
  per hidden matrix (:func:`codechat.train.optim.hidden_matrix_names`) and AdamW's m and v for the
  rest; ``adamw8bit`` ~2.03 bytes per parameter (torchao's block-wise codes, scales and tables,
  :func:`codechat.train.plan_states.optimizer_bytes`); ``/ shard``;
- master: ``Ψ master_bytes / shard``, the fp32 copy an optimizer keeps when the weights are bf16;
- buckets: DDP's gradient buckets, ``Ψ grad_bytes`` on every replica when a
  ``DistributedDataParallel`` module is in place (more than one GPU, or ``distributed``: under
  torchrun): with ``gradient_as_bucket_view=False`` a second copy of the gradients, held all run
  (:func:`codechat.train.plan_states.ddp_bucket_bytes`);
- activations: ``tokens * n_layer * activation_bytes(...)`` saved for backward, plus the one
  block recomputed at a time under checkpointing (:func:`activation_bytes`; a compiled step saves
  less than an eager one), plus what ``model.x0_mix`` / ``unet_skips`` keep (:func:`skip_bytes`). With ``pp`` stages
  the 1F1B schedule keeps ``pp`` micro-batches in flight on the first stage, one on the last
  (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", sec. 2.2.1); the plan shows the fuller of the two (GPipe keeps all of them);
- logits: ``3 * 4 * tokens * vocab_size``: :meth:`codechat.model.GPT.forward` upcasts the (B, T, V)
  logits to fp32 for the cross-entropy, whose backward holds three fp32 (B, T, V) tensors at once
  (the log-softmax output it saved, the gradient from the NLL loss and the gradient of the logits);
  compiled, Inductor fuses the upcast into the loss and keeps only the compute-dtype logits;
- buffers: FSDP's gathered full parameters of the current and the prefetched block in the compute
  dtype, one block's unsharded gradients (compute dtype, cast to ``grad_bytes`` for the
  reduce-scatter) and the root unit (embedding, final norm, LM head) gathered with its gradients
  through the backward (FSDP2: the root is not resharded after forward); with
  ``train.fsdp_reshard_after_forward`` false, every block's gathered parameters instead of two. Under
  DDP with autocast, the compute-dtype copies of every matrix: ``torch.autocast`` caches each cast weight until the
  forward's autocast region exits, checkpointed blocks or not. With ``fp8`` (``train.fp8``), one byte per
  element of one block's matrices for their float8 casts (torchao casts each weight as its layer runs
  and keeps the high-precision inputs for the backward, so the activations are as in bf16);
- step: Muon's working set while it orthogonalises its largest batch of same-shape matrices (the
  Nesterov update and its stack in ``grad_bytes``, three bf16 iterates);
- margin: ``context_gib`` (CUDA context, cuBLAS workspaces, NCCL buffers) plus ``fragmentation``
  of the tensors (the caching allocator's reserved-over-allocated share).
- ``cpu_offload`` (FSDP/HSDP, AdamW): weights, grads, optimizer and master shards move to host
  memory (``Estimate.host``, per rank); the GPU keeps the activations, logits and FSDP's buffers.

Peak = weights + grads + optimizer + master + buckets + max(activations + logits + buffers, step) + margin:
a conservative upper bound for an eager step, since with ``zero_grad(set_to_none=True)`` gradients
are allocated as activations are freed. A compiled step (``train.compile``) peaks as its backward
starts, before any gradient exists: weights + optimizer + master + max(activations + logits +
buffers, grads + step) + margin. With ``--pp`` stages only the blocks are compiled (their
activations are the compiled ones, the head's are eager); ``train.compile_scope`` ``blocks``
compiles the head too (compiled logits) but has no whole-step graph: the peak is the eager one.
Compiled under DDP, ``torch._dynamo``'s DDPOptimizer cuts the graph at every bucket
(``train.ddp_bucket_cap_mb``, 200 MiB by default); where a block's trainable weights span more than
one bucket, each piece is partitioned on its own and can no longer recompute across the cuts, so
the blocks' activations are planned as eager ones (an upper bound: on a CPU, a small model cut at
every matrix saved 95% of the eager bytes). The 1b
run of ``benchmarks/RESULTS.md`` (DDP over one rank under torchrun, micro-batch 8 x 2048) measured
39.26 GiB; this plan gives 39.99 (1.02; 31.03 before buckets and cuts were modelled, 0.79).
Measured on an H200 (``benchmarks/RESULTS.md``), the whole-model compiled plan is within 1% of
``torch.cuda.max_memory_allocated`` for d20 and 1b at micro-batches 8-32 x 2048.

Dtypes: the defaults are codechat's trainer (``Trainer``, :func:`codechat.config.device.autocast_for`):
fp32 weights, fp32 gradients, fp32 AdamW state, no master copy, bf16 autocast on CUDA: 4 + 4 + 8 = 16
bytes per parameter plus the bf16 copies. The seed system's settings are bf16 weights and
gradients, an fp32 master copy and fp32 m and v (``param_bytes=2, grad_bytes=2, master_bytes=4``):
2 + 2 + 4 + 4 + 4 = 16 bytes per parameter, the mixed-precision Adam of ZeRO (Rajbhandari et al.
2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", sec. 3.1: 2Ψ + 2Ψ +
KΨ with K = 12).

Against measurements: torchtitan's Llama 3.1 8B under FSDP on 8 H100s (local batch 2 x 8192,
selective op AC, no compile; its docs/performance.md, table 1) reserved 82.4 GiB per GPU; this
planner gives 87.1 GiB. At the seed's settings (micro-batch 1 x 2048, checkpointing on, eager, 16 bytes
per parameter) it gives 150.3 GiB for ``8b`` on one GPU (the seed: ~160 GB, does not fit), but
27.0 GiB for ``2b`` on one GPU (the seed: ~60 GB) and 24.2 GiB for ``8b`` FSDP over 8 (the seed:
55-65 GB measured on A800s). Those two seed figures are more than their model states (22.5 and
16.8 GiB at 16 bytes per parameter) plus checkpointed activations (~1 GiB) can explain: they
describe the seed's own implementation (FSDP1 wrapping, its allocator's reserve), not a layout
this planner models; the GPU runs of the parallel layer are the check that matters.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from codechat.config.lora import LORA_TARGETS, LoraConfig
from codechat.config.stages import DDP_BUCKET_CAP_MB, OPTIMIZERS, ConfigError, ModelConfig, OptimConfig, TrainConfig

from .plan_activations import FP32, activation_bytes, lora_activation_bytes, skip_bytes
from .plan_states import (ParamCounts, ddp_bucket_bytes, elements, lora_tensors, optimizer_bytes, param_counts,
                          split_by_buckets, stage_tensors)

STRATEGIES = ("ddp", "hsdp", "fsdp")  # cheapest first: replicated, sharded in a node, sharded everywhere
AC_MODES = ("none", "selective", "full")  # cheapest first: recomputation costs compute
GIB = 2 ** 30
#: fp32 (B, T, V) tensors alive at once in the cross-entropy's backward (see the module docstring).
LOGITS_FP32_COPIES = 3
#: Bytes per element of Muon's Newton-Schulz iterates: bf16 on CUDA (``optim.muon_ns_dtype`` auto).
NS_BYTES = 2
#: ``--gpu-mem-gb`` without a local CUDA device: an 80 GB A100/H100.
DEFAULT_GPU_MEM_GIB = 80.0
DTYPE_BYTES = {"fp32": 4, "bf16": 2}
#: The table's columns: :class:`Estimate` fields (bytes, shown in GiB) and their headings.
COLUMNS = {"weights": "weights", "grads": "grads", "optimizer": "optim", "master": "master", "buckets": "bucket",
           "activations": "activ", "logits": "logits", "buffers": "buffers", "step": "step", "margin": "margin"}


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass(frozen=True)
class PlanConfig:
    """The inputs of a memory plan: model shape, batch, layout, dtypes and the GPU's memory.

    Sizes of one element are in bytes (4 fp32, 2 bf16); ``gpu_mem_gib`` and ``context_gib`` in
    GiB. Defaults are codechat's trainer; the seed's settings are ``param_bytes=2, grad_bytes=2,
    master_bytes=4`` (module docstring). ``parallel`` and ``pp`` are the layout asked for; the
    plan shows the other strategies beside it.

    Raises:
        ConfigError: an unknown strategy or AC mode, ``pp`` not dividing the layers or the
            GPUs, an HSDP world that is not whole nodes, fewer than one GPU, an impossible dtype.
    """

    model: ModelConfig
    micro_batch_size: int = 1  # rows per micro-batch on one data-parallel rank
    seq_len: int = 2048  # tokens per row
    gpus: int = 1  # world size
    gpus_per_node: int = 8  # HSDP shards within a node and replicates across nodes
    parallel: str = "ddp"  # see STRATEGIES
    pp: int = 1  # pipeline stages; the other gpus / pp ranks are data parallel
    ac: str = "none"  # activation checkpointing, see AC_MODES
    optim: str = "adamw"  # OptimConfig.name: adamw | muon | adamw8bit
    lora_rank: int = 0  # --peft lora --lora.rank: adapters on a frozen base (plan_states); 0 -> every weight trains
    lora_targets: tuple[str, ...] = tuple(LORA_TARGETS)  # --lora.targets: the projections adapted in every block
    lora_dropout: float = 0.0  # --lora.dropout: > 0 keeps each adapter's dropped input for its backward
    param_bytes: int = 4  # stored weights (fp32 in codechat; the seed: bf16)
    grad_bytes: int = 4  # stored gradients, also FSDP's reduce-scatter dtype
    master_bytes: int = 0  # fp32 master copy of bf16 weights (the seed: 4); 0 -> none
    state_bytes: int = 4  # each optimizer state element (fp32)
    compute_bytes: int = 2  # activations and matmul inputs: bf16 autocast on CUDA (train.dtype auto)
    compiled: bool = False  # the step runs under torch.compile (train.compile): see activation_bytes
    compiled_blocks_only: bool = False  # train.compile_scope "blocks": blocks and head compiled apart (eager peak)
    cpu_offload: bool = False  # train.cpu_offload: FSDP/HSDP shards in host memory (AdamW only)
    ddp_bucket_cap_mb: float = DDP_BUCKET_CAP_MB  # train.ddp_bucket_cap_mb: compiled DDP's graphs end at its buckets
    fsdp_reshard_after_forward: bool = True  # train.fsdp_reshard_after_forward: False keeps all blocks gathered
    distributed: bool = False  # under torchrun: the DDP/FSDP wrapper is in place even at --gpus 1 (plain python: not)
    fp8: bool = False  # train.fp8 tensorwise / rowwise: see the module docstring's buffers
    gpu_mem_gib: float = DEFAULT_GPU_MEM_GIB
    context_gib: float = 1.0  # CUDA context + cuBLAS workspaces + NCCL buffers per GPU
    fragmentation: float = 0.1  # allocator reserve, as a share of the tensors' bytes

    def __post_init__(self) -> None:
        _check(self.gpus >= 1, f"--gpus must be >= 1, got {self.gpus}")
        _check(self.parallel in STRATEGIES, f"unknown strategy --parallel {self.parallel!r}; choose one of "
               f"{', '.join(STRATEGIES)}")
        _check(self.ac in AC_MODES, f"unknown --ac {self.ac!r}; choose one of {', '.join(AC_MODES)}")
        _check(self.optim in OPTIMIZERS, f"optim.name must be one of {', '.join(OPTIMIZERS)}, got {self.optim!r}")
        _check(self.lora_rank >= 0, f"lora.rank must be > 0, got {self.lora_rank}")
        _check(not (self.lora_rank and self.optim == "muon"), "--peft lora trains its adapters with AdamW; "
               "--optim.name muon orthogonalises whole hidden matrices: use --optim.name adamw or adamw8bit")
        _check(0.0 <= self.lora_dropout < 1.0, f"lora.dropout must be in [0, 1), got {self.lora_dropout}")
        _check(self.pp >= 1 and self.model.n_layer % self.pp == 0,
               f"--pp {self.pp} does not divide the model's {self.model.n_layer} layers; pick a divisor of "
               f"{self.model.n_layer}")
        _check(self.gpus % self.pp == 0, f"--pp {self.pp} does not divide --gpus {self.gpus}; the pipeline "
               "stages times the data-parallel ranks must make up the GPUs")
        _check(self.gpus_per_node >= 1, f"--gpus-per-node must be >= 1, got {self.gpus_per_node}")
        dp = self.gpus // self.pp
        _check(self.parallel != "hsdp" or dp <= self.gpus_per_node or dp % self.gpus_per_node == 0,
               f"--parallel hsdp over {dp} data-parallel ranks needs whole nodes of --gpus-per-node "
               f"{self.gpus_per_node}")
        _check(self.micro_batch_size >= 1 and self.seq_len >= 1, "micro_batch_size and seq_len must be >= 1")
        for name in ("param_bytes", "grad_bytes", "state_bytes", "compute_bytes"):
            _check(getattr(self, name) in (2, 4), f"{name} must be 2 (bf16) or 4 (fp32), got {getattr(self, name)}")
        _check(self.master_bytes in (0, 4), f"master_bytes must be 0 (none) or 4 (fp32), got {self.master_bytes}")
        _check(not (self.master_bytes and self.param_bytes == 4),
               "an fp32 master copy of fp32 weights holds nothing new: use --master-weights with --param-dtype bf16")
        _check(not self.cpu_offload or (self.parallel != "ddp" and self.pp == 1 and self.optim == "adamw"
                                        and not self.lora_rank),
               "train.cpu_offload needs --parallel fsdp or hsdp, no --pp, optim.name adamw and no --peft")
        _check(self.gpu_mem_gib > 0 and self.context_gib >= 0 and 0 <= self.fragmentation < 1,
               "gpu_mem_gib must be > 0, context_gib >= 0 and fragmentation in [0, 1)")

    @property
    def dp(self) -> int:
        """Data-parallel ranks per pipeline stage."""
        return self.gpus // self.pp

    @property
    def shard(self) -> int:
        """Ranks one stage's model states are split over: 1 (DDP), all data-parallel ranks (FSDP),
        those of one node (HSDP)."""
        return {"ddp": 1, "fsdp": self.dp, "hsdp": min(self.dp, self.gpus_per_node)}[self.parallel]

    @property
    def ddp_wrapped(self) -> bool:
        """Whether a ``DistributedDataParallel`` module holds the model: DDP under torchrun, no stages."""
        return self.parallel == "ddp" and self.pp == 1 and (self.distributed or self.gpus > 1)


@dataclass(frozen=True)
class Estimate:
    """Bytes one GPU holds under one layout (its fullest pipeline stage); see the module docstring."""

    parallel: str
    pp: int
    weights: float
    grads: float
    optimizer: float
    master: float
    buckets: float  # DDP's gradient buckets (plan_states.ddp_bucket_bytes)
    activations: float
    logits: float
    buffers: float
    step: float
    margin: float
    compiled: bool = False  # peak before any gradient exists (see the module docstring)
    host: float = 0.0  # bytes of model states offloaded to host memory (cpu_offload), per rank

    @property
    def layout(self) -> str:
        return self.parallel if self.pp == 1 else f"pp{self.pp}x{self.parallel}"

    @property
    def tensors(self) -> float:
        """Peak bytes of tensors: model states plus the larger of the backward's and the step's
        working sets (compiled: the gradients only with the step's)."""
        kept = self.weights + self.optimizer + self.master + self.buckets
        if self.compiled:
            return kept + max(self.activations + self.logits + self.buffers, self.grads + self.step)
        return kept + self.grads + max(self.activations + self.logits + self.buffers, self.step)

    @property
    def total(self) -> float:
        """Peak bytes with the margin: what the GPU must have."""
        return self.tensors + self.margin


def _stage(cfg: PlanConfig, counts: ParamCounts, first: bool, last: bool) -> Estimate:
    """The estimate of one pipeline stage (``first`` holds the embedding, ``last`` the head and logits)."""
    m, layers, shard = cfg.model, cfg.model.n_layer // cfg.pp, cfg.shard
    tied_copy = m.tie_embeddings and last and not first  # the head's shared matrix
    root = (counts.embedding if first else 0) + (counts.head + tied_copy * counts.embedding if last else 0)
    base = stage_tensors(counts, layers, first, last, tied_copy)
    lora = lora_tensors(counts, 1, cfg.lora_rank, cfg.lora_targets) if cfg.lora_rank else []  # one block's adapters
    trainable = [t._replace(count=t.count * layers) for t in lora] if lora else base
    block_trainable = elements(lora) if lora else counts.block
    block_matrices = sum(rows * cols for rows, cols in counts.block_matrices)
    n_train = elements(trainable)
    # LoRA's frozen base: the blocks' projections in the compute dtype, the rest as stored (codechat.peft.lora)
    frozen = (layers * block_matrices * cfg.compute_bytes
              + (elements(base) - layers * block_matrices) * cfg.param_bytes) if lora else 0
    optimizer, step = optimizer_bytes(cfg.optim, trainable, cfg.state_bytes), 0.0
    if cfg.optim == "muon":
        largest = layers * max(rows * cols * n for (rows, cols), n in Counter(counts.block_matrices).items())
        step = largest * (2 * cfg.grad_bytes + 3 * NS_BYTES) / shard
    sharded = cfg.parallel != "ddp"
    c = cfg.compute_bytes
    r = c if sharded else cfg.param_bytes  # FSDP gathers the weights (the embedding too) in the compute dtype
    tokens = cfg.micro_batch_size * cfg.seq_len
    in_flight = cfg.pp if first else 1  # 1F1B: stage 0 holds pp micro-batches in flight, the last one
    buckets = ddp_bucket_bytes(n_train, cfg.grad_bytes) if cfg.ddp_wrapped else 0.0
    # compiled DDP: DDPOptimizer cuts the graph at every bucket; cut inside each block, the blocks save as eager
    blocks_compiled = cfg.compiled and not (cfg.ddp_wrapped and split_by_buckets(block_trainable * cfg.grad_bytes,
                                                                                 cfg.ddp_bucket_cap_mb))
    adapters = lora_activation_bytes(counts, cfg.lora_rank, cfg.lora_targets, cfg.lora_dropout > 0, c)
    acts = in_flight * tokens * layers * (activation_bytes(m, cfg.ac, r, c, blocks_compiled)
                                          + (adapters if cfg.ac != "full" else 0))
    if cfg.ac != "none":  # the one block recomputed during its backward
        acts += tokens * (activation_bytes(m, "none", r, c, blocks_compiled) + adapters)
    acts += tokens * skip_bytes(m, r)  # 0 without x0_mix and unet_skips (refused with pp > 1)
    logits = 0.0
    # with stages the trainer compiles each block and the head runs eager; compile_scope "blocks"
    # compiles the head (GPT.head) as a region of its own, but no graph spans the whole step
    head_compiled = cfg.compiled and cfg.pp == 1
    whole = head_compiled and not cfg.compiled_blocks_only
    if last:  # final norm input (eager: and its cast output), fp32 statistics, the (B, T, V) logits
        # (compiled: the norm's rstd and the loss's two per-token statistics)
        acts += tokens * (m.n_embd * r + FP32 * 3 if head_compiled else m.n_embd * (r + c) + FP32)
        logits = float((c if head_compiled else LOGITS_FP32_COPIES * FP32) * tokens * m.vocab_size)
    if sharded:  # two gathered blocks, one block's unsharded grads, the root gathered (with its grads)
        root_grads = 0 if lora else root * c
        gathered = 2 if cfg.fsdp_reshard_after_forward else layers  # blocks whose full parameters are held
        buffers = gathered * counts.block * c + block_trainable * (c + cfg.grad_bytes) + root * c + root_grads
    elif lora:  # the frozen projections are in the compute dtype already: autocast casts the adapters and head
        buffers = (n_train + (counts.head_matrix if last else 0)) * c if c < cfg.param_bytes else 0
    elif c < cfg.param_bytes:
        buffers = (layers * block_matrices + (counts.head_matrix if last else 0)) * c
    else:
        buffers = 0
    if cfg.fp8:  # the float8 casts of the block's weights being multiplied (1 byte each)
        buffers += block_matrices
    states = ((n_train * cfg.param_bytes + frozen) / shard, n_train * cfg.grad_bytes / shard, optimizer / shard,
              n_train * cfg.master_bytes / shard)
    host = 0.0
    if cfg.cpu_offload:  # the states live in host memory, the GPU holds none of them
        host, states = sum(states), (0.0,) * 4
    est = Estimate(cfg.parallel, cfg.pp, *states, buckets, float(acts), logits, float(buffers), step, 0.0, whole, host)
    return replace(est, margin=cfg.context_gib * GIB + cfg.fragmentation * est.tensors)


def estimate(cfg: PlanConfig) -> Estimate:
    """Per-GPU bytes of ``cfg``'s layout: its fullest pipeline stage (the first or the last)."""
    counts = param_counts(cfg.model)
    stages = [_stage(cfg, counts, True, cfg.pp == 1)] + ([_stage(cfg, counts, False, True)] if cfg.pp > 1 else [])
    return max(stages, key=lambda e: e.total)


def fits(cfg: PlanConfig, est: Estimate) -> bool:
    """Whether ``est``'s peak with its margin is within ``cfg.gpu_mem_gib``."""
    return est.total <= cfg.gpu_mem_gib * GIB


def _candidates(cfg: PlanConfig) -> list[PlanConfig]:
    """Valid variants of ``cfg``, cheapest first: the full micro-batch before a smaller one (more
    accumulation), no pipeline before stages (bubbles), less recomputation before more, then
    DDP < HSDP < FSDP (communication). HSDP within one node is FSDP and is left out."""
    pps = [p for p in range(1, cfg.gpus + 1) if cfg.gpus % p == 0 and cfg.model.n_layer % p == 0]
    mbs = [d for d in range(cfg.micro_batch_size, 0, -1) if cfg.micro_batch_size % d == 0]
    out = []
    for mb in mbs:
        for pp in pps:
            for ac in AC_MODES:
                for strategy in STRATEGIES:
                    try:
                        cand = replace(cfg, micro_batch_size=mb, ac=ac, pp=pp, parallel=strategy)
                    except ConfigError:  # HSDP over part of a node
                        continue
                    if strategy != "hsdp" or cand.shard < cand.dp:
                        out.append(cand)
    return out


def _flags(cfg: PlanConfig, base: PlanConfig) -> str:
    flags = [f"--parallel {cfg.parallel}", f"--ac {cfg.ac}"] + ([f"--pp {cfg.pp}"] if cfg.pp > 1 else [])
    if cfg.micro_batch_size != base.micro_batch_size:
        times = base.micro_batch_size // cfg.micro_batch_size
        flags.append(f"--train.micro_batch_size {cfg.micro_batch_size} with {times}x the --train.grad_accum "
                     "(the same rows per step)")
    return " ".join(flags)


def recommend(cfg: PlanConfig) -> str:
    """One sentence: the cheapest variant of ``cfg`` that fits (in :func:`_candidates`' order), or
    how many GPUs FSDP with full checkpointing at micro-batch 1 would need and what fits on these
    GPUs with LoRA or 8-bit optimizer states (:func:`_lighter`)."""
    asked_fits = fits(cfg, estimate(cfg))
    for cand in _candidates(cfg):
        if cand == cfg and asked_fits:
            return "the layout asked for is the cheapest that fits."
        est = estimate(cand)
        if fits(cand, est):
            lead = "a cheaper layout fits too" if asked_fits else "use"
            return f"{lead}: {_flags(cand, cfg)} (about {est.total / GIB:.1f} GiB per GPU)."
    floor = replace(cfg, parallel="fsdp", ac="full", pp=1, micro_batch_size=1)
    offload = ""
    if cfg.optim == "adamw" and not cfg.cpu_offload and not cfg.lora_rank:
        off = replace(floor, cpu_offload=True)
        est = estimate(off)
        if fits(off, est):
            offload = (f"; or, at AdamW's speed on the CPU, --parallel fsdp --ac full --train.cpu_offload true "
                       f"at micro-batch 1 fits now (about {est.total / GIB:.1f} GiB per GPU, "
                       f"{est.host / GIB:.1f} GiB of host memory per rank)")
    what = f"{'--peft lora' if cfg.lora_rank else 'full'} {cfg.optim}"
    for k in range(1, 15):
        big = replace(floor, gpus=cfg.gpus * 2 ** k)
        if fits(big, estimate(big)):
            return (f"nothing fits on {cfg.gpus} GPU(s) with {what}: --parallel fsdp --ac full at micro-batch 1 "
                    f"needs about {big.gpus} GPUs of {cfg.gpu_mem_gib:.0f} GiB{offload}{_lighter(cfg)}.")
    return f"nothing fits: the LM head and the logits alone exceed one GPU; lower data.seq_len{_lighter(cfg)}."


def _lighter(cfg: PlanConfig) -> str:
    """``; --peft lora fits at ...; --optim.name adamw8bit (weights fp32) fits at ...``: the cheapest
    layout (:func:`_candidates`) of each that fits on ``cfg``'s GPUs, where ``cfg`` does not use it
    already; empty when neither fits."""
    options = []
    if not cfg.lora_rank:  # adapters train with AdamW (its 8-bit form kept)
        rank = LoraConfig().rank
        options.append((f"`--peft lora --lora.rank {rank}`",
                        replace(cfg, lora_rank=rank, optim="adamw8bit" if cfg.optim == "adamw8bit" else "adamw")))
    if cfg.optim != "adamw8bit" and not cfg.cpu_offload:
        names = {4: "fp32", 2: "bf16"}
        master = " and an fp32 master copy" if cfg.master_bytes else ""
        options.append((f"`--optim.name adamw8bit` with {names[cfg.param_bytes]} weights{master}",
                        replace(cfg, optim="adamw8bit")))
    out = ""
    for flag, alt in options:
        for cand in _candidates(alt):
            est = estimate(cand)
            if fits(cand, est):
                out += f"; {flag} fits at about {est.total / GIB:.1f} GiB per GPU ({_flags(cand, cfg)})"
                break
    return out


def format_plan(cfg: PlanConfig) -> str:
    """The plan as text: the inputs, a table of GiB per GPU for every strategy, a verdict and a recommendation."""
    m, counts = cfg.model, param_counts(cfg.model)
    names = {4: "fp32", 2: "bf16"}
    lines = [f"model: {counts.total:,} parameters ({m.n_layer} layers, width {m.n_embd}, vocab {m.vocab_size}); "
             f"micro-batch {cfg.micro_batch_size} x {cfg.seq_len} tokens; {cfg.gpus} GPU(s), "
             f"{cfg.gpus_per_node} per node; optimizer {cfg.optim}; {'compiled' if cfg.compiled else 'eager'} step"
             + (f"; --peft lora rank {cfg.lora_rank} on {','.join(cfg.lora_targets)}: {_trainable(cfg):,} trainable "
                f"parameters, the blocks' projections frozen in {names[cfg.compute_bytes]}" if cfg.lora_rank else ""),
             f"dtypes: weights {names[cfg.param_bytes]}, grads {names[cfg.grad_bytes]}, optimizer state "
             f"{names[cfg.state_bytes]}, master copy {names.get(cfg.master_bytes, 'none')}, compute "
             f"{names[cfg.compute_bytes]}{' (block matmuls fp8)' if cfg.fp8 else ''}",
             "activations per GPU (" + ", ".join(f"--ac {a}: {estimate(replace(cfg, ac=a)).activations / GIB:.1f}"
                                                 for a in AC_MODES) + " GiB)",
             f"{'GiB per GPU':<19}" + "".join(f"{n:>8}" for n in COLUMNS.values()) + "    peak"]
    peaks: dict[bool, list[str]] = {}  # the rows of each peak formula: compiled or eager (Estimate.tensors)
    for pp in sorted({1, cfg.pp}):
        for strategy in STRATEGIES:
            try:  # offload is FSDP's: the DDP and pipeline rows are without it
                alt = replace(cfg, parallel=strategy, pp=pp,
                              cpu_offload=cfg.cpu_offload and strategy != "ddp" and pp == 1)
            except ConfigError:
                continue
            if strategy == "hsdp" and alt.shard == alt.dp and cfg.parallel != "hsdp":
                continue  # within one node HSDP is FSDP
            e = estimate(alt)
            peaks.setdefault(e.compiled, []).append(e.layout)
            mark = "*" if (strategy, pp) == (cfg.parallel, cfg.pp) else " "
            lines.append(f"{mark} {e.layout:<17}" + "".join(f"{getattr(e, n) / GIB:8.1f}" for n in COLUMNS)
                         + f"{e.total / GIB:8.1f}" + ("  fits" if fits(alt, e) else "  too big"))
    lines += [peak_note(c, rows if len(peaks) > 1 else None) for c, rows in sorted(peaks.items())]
    if cfg.cpu_offload:
        lines.append(f"host memory per rank (--train.cpu_offload): {estimate(cfg).host / GIB:.1f} GiB of model states")
    lines += [verdict(cfg), f"recommendation: {recommend(cfg)}"]
    return "\n".join(lines)


def _trainable(cfg: PlanConfig) -> int:
    """LoRA's trainable parameters over the whole model."""
    return elements(lora_tensors(param_counts(cfg.model), cfg.model.n_layer, cfg.lora_rank, cfg.lora_targets))


def peak_note(compiled: bool, rows: list[str] | None = None) -> str:
    """The line under the table: ``peak`` (what the verdict compares) is not the sum of the columns
    (:attr:`Estimate.tensors`); ``rows``: the layouts it is for, when the table mixes both kinds."""
    held = "max(activ + logits + buffers, grads + step)" if compiled else "grads + max(activ + logits + buffers, step)"
    which = f" ({', '.join(rows)})" if rows else ""
    why = ("a compiled step peaks as its backward starts, before any gradient exists" if compiled else
           "the optimizer step runs once the backward has freed its working set")
    return (f"peak{which} is not the sum of the columns: weights + optim + "
            f"master + {held} + margin ({why})")


def verdict(cfg: PlanConfig, est: Estimate | None = None) -> str:
    """``fits`` / ``does not fit`` for the layout asked for, with the GiB it needs and has."""
    est = est or estimate(cfg)
    need, have = est.total / GIB, cfg.gpu_mem_gib
    word = f"fits ({have - need:.1f} GiB to spare)" if need <= have else f"does not fit ({need - have:.1f} GiB over)"
    return f"verdict: {est.layout} on {cfg.gpus} GPU(s) needs about {need:.1f} GiB per GPU of {have:.1f} GiB: {word}"


def plan_config(model: ModelConfig, train: TrainConfig, optim: OptimConfig, seq_len: int,
                lora: LoraConfig | None = None, **layout: Any) -> PlanConfig:
    """The :class:`PlanConfig` of a training run's settings (``lora``: the adapters of ``--peft lora``,
    None for full training); ``layout`` sets the other fields."""
    if lora is not None:
        layout.update(lora_rank=lora.rank, lora_targets=lora.targets, lora_dropout=lora.dropout)
    layout.setdefault("compiled", train.compile)
    layout.setdefault("compiled_blocks_only", train.compile and train.compile_scope == "blocks")
    layout.setdefault("cpu_offload", train.cpu_offload)
    layout.setdefault("fp8", train.fp8 != "none")
    layout.setdefault("ddp_bucket_cap_mb", train.ddp_bucket_cap_mb)
    layout.setdefault("fsdp_reshard_after_forward", train.fsdp_reshard_after_forward)
    return PlanConfig(model=model, micro_batch_size=train.micro_batch_size, seq_len=seq_len, optim=optim.name,
                      compute_bytes=DTYPE_BYTES["fp32" if train.dtype == "fp32" else "bf16"], **layout)


__all__ = ["PlanConfig", "ParamCounts", "Estimate", "STRATEGIES", "AC_MODES", "param_counts", "activation_bytes",
           "skip_bytes", "estimate", "fits", "recommend", "verdict", "format_plan", "plan_config"]
