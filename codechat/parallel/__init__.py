"""Training across processes: the world from ``torchrun``'s environment, DDP, FSDP2, HSDP, pipeline stages.

Every training stage runs the same code in one process or under ``torchrun``: :func:`init_world`
reads ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` (a process not started by
``torchrun`` is a world of one and nothing is wrapped; ``torchrun --nproc_per_node=1`` is a real
world of one, wrapped like any other, so the DDP / FSDP paths can be timed on one GPU), starts the
process group (NCCL on CUDA, gloo on CPU) and pins each rank to its GPU; :class:`Parallel` wraps the model from
outside (the model knows nothing of it):

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
  (:mod:`codechat.parallel.pipeline`, on a ``("pp", "dp")`` mesh); the data-parallel side is DDP's rule
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

Modules, imports pointing down: :mod:`.wrapper` (:class:`Parallel`, activation checkpointing) ->
:mod:`.pipeline` (``--pp`` stages) -> :mod:`.state` (optimizer state keyed by name); :mod:`.world`
(:func:`init_world`, :func:`main_first`, :class:`RankSlice`).
"""
