"""Pipeline parallelism (``--pp N``): the transformer blocks split over N stages, each stage replicated
over the other ``world_size / N`` ranks (data parallel), driven by ``torch.distributed.pipelining``.

Layout: a 2-D :class:`~torch.distributed.device_mesh.DeviceMesh` ``("pp", "dp")`` of shape
``(N, world_size / N)``, so rank ``r`` is stage ``r // dp_size`` of pipeline ``r % dp_size``
(OpenChatKit's pipeline-group-size x data-group-size = world size). Stage ``s`` holds a contiguous
run of blocks (as even as possible, earlier stages taking one more when N does not divide the
layers), the embedding on stage 0, the final norm, the LM head and the loss on the last stage. A
stage's parameters keep the whole model's names (``layers.5.mlp.up_proj.weight``), so its pieces
of a checkpoint are the one process's; the blocks of other stages are moved to the meta device
(the model is still built whole on every rank first: its initialisation draws the one process's
random numbers).

A step: every stage of a pipeline reads the same rows (stage 0 the inputs, the last stage the
labels); each trainer micro-batch is cut into ``train.pp_microbatches`` pipeline micro-batches
run by ``ScheduleGPipe`` (all forwards, then all backwards) or ``Schedule1F1B`` (one forward, one
backward in the steady state: at most N micro-batches of activations in flight). The loss function,
called once per pipeline micro-batch on the last stage, returns that micro-batch's supervised-token
sum times the step's ``1 / global count`` (``shared/cases/05``); the schedule's own division by the
number of micro-batches is off (``scale_grads=False``). After a step's last micro-batch the
gradients are summed over the data-parallel ranks of each stage, and with a tied LM head the
embedding's and the head copy's gradients are summed between the first and the last stage, so
both copies take the same update (Megatron-LM's shared word embeddings, Shoeybi et al. 2019). The
gradient norm for clipping is taken over all stages (the tied weight counted once).

Validation runs a plain forward through the stages (point-to-point sends of the hidden states),
its result broadcast from the last stage to the pipeline, so ``evaluate(model)`` sees one model.
Checkpoints are sharded (:meth:`codechat.parallel.wrapper.Parallel.shards`): each stage writes its own
parameters (the tied head copy left out: it is the embedding) and their optimizer state by name,
and a stage reads its part of any checkpoint, a one-process one included (:meth:`Pipeline.load_state_dicts`).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from codechat.checkpoint import EMBEDDING, TIED_HEAD
from codechat.config.stages import ConfigError
from codechat.model import GPT, IGNORE_INDEX, logits_fp32, soft_cap
from codechat.parallel.state import keyed_by_name, name_optimizer_state, optimizer_parts


def stage_blocks(n_layer: int, stages: int, stage: int) -> range:
    """The blocks of ``stage`` among ``stages``: contiguous, as even as possible, the first ones one larger.

    Raises:
        ConfigError: fewer layers than stages.
    """
    if n_layer < stages:
        raise ConfigError(f"--pp {stages} stages for a model of {n_layer} layers: every stage needs at least one "
                          f"block; use --pp <= {n_layer}")
    base, extra = divmod(n_layer, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (stage < extra))


class Stage(nn.Module):
    """One pipeline stage of a :class:`GPT`: its blocks, plus the embedding (first stage) and the
    final norm and LM head (last stage). ``forward`` maps token ids (B, T) int64 (first stage) or
    hidden states (B, T, n_embd) to hidden states, or to float32 logits (B, T, vocab) on the last."""

    def __init__(self, model: GPT, blocks: range, first: bool, last: bool) -> None:
        super().__init__()
        self.embed_tokens = model.embed_tokens if first else None
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in blocks})
        self.norm = model.norm if last else None
        self.lm_head: nn.Module | None = None
        if last:
            self.lm_head = model.lm_head
            if model.cfg.tie_embeddings and not first:  # the head's own copy; gradients summed with the embedding's
                self.lm_head = nn.Linear(model.cfg.n_embd, model.cfg.vocab_size, bias=False,
                                         device=model.lm_head.weight.device)
                with torch.no_grad():
                    self.lm_head.weight.copy_(model.embed_tokens.weight)
        self.softcap = model.cfg.logit_softcap  # the model's head: GPT.head
        self.register_buffer("rope_cos", model.rope_cos, persistent=False)
        self.register_buffer("rope_sin", model.rope_sin, persistent=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        T = h.size(1)
        if self.embed_tokens is not None:
            h = self.embed_tokens(h)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        for i, block in self.layers.items():
            h = block(h, cos, sin, None, int(i))
        return h if self.lm_head is None else soft_cap(logits_fp32(self.norm(h), self.lm_head.weight), self.softcap)


class Pipeline:
    """``model`` cut into ``world.pp`` stages on a ``("pp", "dp")`` mesh, with a ``schedule``
    (``gpipe`` | ``1f1b``) of ``microbatches`` pipeline micro-batches per :meth:`step`.

    ``stage`` is this rank's :class:`Stage` (train it, build its optimizer); ``forward`` is a
    module computing the whole model's ``forward`` through the pipeline (for validation).
    """

    def __init__(self, model: GPT, world: Any, schedule: str, microbatches: int) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
        self.world, pp, dp = world, world.pp, world.dp_size
        blocks = stage_blocks(model.cfg.n_layer, pp, world.pp_rank)
        self.first, self.last = world.pp_rank == 0, world.pp_rank == pp - 1
        self.tied, self.n_embd, self.vocab_size = model.cfg.tie_embeddings, model.cfg.n_embd, model.cfg.vocab_size
        self.stage = Stage(model, blocks, self.first, self.last)
        kept = {id(t) for t in self.stage.state_dict(keep_vars=True).values()}
        for m in [*model.layers, model.embed_tokens, model.norm, model.lm_head]:  # free what other stages hold
            if all(id(p) not in kept for p in m.parameters()):
                m.to("meta")
        model.tie_weights()  # moving them apart untied them: the whole model keeps one process's parameter list
        self.mesh = init_device_mesh(world.device.type, (pp, dp), mesh_dim_names=("pp", "dp"))
        self.pp_group, self.dp_group = self.mesh.get_group("pp"), self.mesh.get_group("dp")
        # ranks of this pipeline, stage by stage; the tied pair (first, last stage) of every pipeline
        self.ranks = [s * dp + world.dp_rank for s in range(pp)]
        pairs = [dist.new_group([d, (pp - 1) * dp + d]) for d in range(dp)] if self.tied else []
        self.tie_group = pairs[world.dp_rank] if self.tied and (self.first or self.last) else None
        self.scale = 1.0
        pipe_stage = PipelineStage(self.stage, world.pp_rank, pp, world.device, group=self.pp_group)
        cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
        self.schedule = cls(pipe_stage, microbatches, loss_fn=self._loss, scale_grads=False)
        self.forward = _PipelinedForward(self)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One pipeline micro-batch's summed token loss, scaled by the step's common factor."""
        s = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
        return s * self.scale

    def step(self, x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
        """Forward and backward of one micro-batch (``x``, ``y``: (B, T) int64, the same on every
        stage) through the schedule, gradients accumulated in ``.grad`` of the gradient of
        ``scale`` x the summed token loss. Returns that sum (float32, 0 except on the last stage)."""
        self.scale, losses = scale, []  # the schedule's record, one per micro-batch (its first step also
        # calls the loss function once more, to learn the shapes)
        kwargs: dict[str, Any] = {"target": y, "losses": losses} if self.last else {}
        self.schedule.step(*((x,) if self.first else ()), return_outputs=False, **kwargs)
        if not losses:
            return torch.zeros((), device=x.device)
        return torch.stack([t.detach() for t in losses]).sum() / scale

    def sync_grads(self) -> None:
        """Sum the gradients over the data-parallel ranks of this stage, and the tied embedding's
        with the head copy's (first and last stage); after the step's last micro-batch."""
        params = list(self.stage.parameters())
        for p in params:  # a missing gradient would leave the ranks' collectives out of step
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.world.dp_size > 1:
            works = [dist.all_reduce(p.grad, group=self.dp_group, async_op=True) for p in params]
            for w in works:
                w.wait()
        if self.tie_group is not None:
            w = self.stage.embed_tokens.weight if self.first else self.stage.lm_head.weight
            dist.all_reduce(w.grad, group=self.tie_group)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip every stage's gradients by their norm over the whole model (the tied weight counted
        once); returns that norm (the same on every rank), a 0-d float32 tensor."""
        params = [p for p in self.stage.parameters() if p.grad is not None]
        head = self.stage.lm_head.weight if self.last and self.tied and not self.first else None
        counted = [p.grad for p in params if p is not head]
        local = torch.nn.utils.get_total_norm(counted) if counted else torch.zeros((), device=self.world.device)
        sq = (local.double() ** 2).reshape(1)
        dist.all_reduce(sq, group=self.pp_group)  # the data-parallel replicas hold the same gradients
        total = sq.sqrt().float().reshape(())
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total

    # ------------------------------------------------------------------ state
    def load_state_dicts(self, model_sd: dict[str, Any], optim_sd: dict[str, Any] | None, optimizer: Any,
                         whole_optimizer: Callable[[], Any] | None = None,
                         whole_model: nn.Module | None = None) -> None:
        """Load this stage's part of full states (a checkpoint of any layout). An optimizer state of one
        process (keyed by index) is first named through ``whole_optimizer()`` over ``whole_model``.

        Raises:
            KeyError, RuntimeError, ValueError: the states do not fit this model or optimizer.
        """
        self.stage.load_state_dict({k: model_sd[k] for k in self.stage.state_dict()})
        if optim_sd is None:
            return
        if not keyed_by_name(optim_sd):
            optim_sd = name_optimizer_state(whole_model, whole_optimizer(), optim_sd)
        alias = {TIED_HEAD: EMBEDDING} if self.last and self.tied and not self.first else {}
        optimizer.load_state_dict(_index_optimizer_state(self.stage, optimizer, optim_sd, alias))


class _PipelinedForward(nn.Module):
    """``GPT.forward(idx, labels, reduction=...)`` of the whole model, computed stage by stage
    (hidden states sent point to point, float32) and broadcast from the last stage to the pipeline."""

    def __init__(self, pipe: Pipeline) -> None:
        super().__init__()
        self.stage, self.pipe = pipe.stage, [pipe]  # a list: not a submodule

    def forward(self, idx: torch.Tensor, labels: torch.Tensor | None = None, *, reduction: str = "sum",
                doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        p = self.pipe[0]
        if doc_ids is not None:
            raise ConfigError("packed rows (doc_ids) are not supported with --pp; turn packing off")
        s, (B, T) = p.world.pp_rank, idx.shape
        h = idx
        if not p.first:
            h = torch.empty(B, T, p.n_embd, dtype=torch.float32, device=idx.device)
            dist.recv(h, src=p.ranks[s - 1])
        out = self.stage(h)
        if not p.last:
            dist.send(out.float().contiguous(), dst=p.ranks[s + 1])
        if labels is None:
            shape: tuple[int, ...] = (B, T, p.vocab_size)
        else:
            shape = (B, T) if reduction == "none" else ()
        if p.last:
            res = out if labels is None else F.cross_entropy(out.flatten(0, 1), labels.flatten(),
                                                             ignore_index=IGNORE_INDEX, reduction=reduction)
            res = res.reshape(shape).float().contiguous()
        else:
            res = torch.empty(shape, dtype=torch.float32, device=idx.device)
        dist.broadcast(res, src=p.ranks[-1], group=p.pp_group)
        return res


def _index_optimizer_state(module: nn.Module, optimizer: Any, named: dict[str, Any],
                           alias: dict[str, str]) -> dict[str, Any]:
    """The inverse of :func:`codechat.parallel.state.name_optimizer_state` for ``module``'s parameters:
    a state keyed by name (any layout's) as ``optimizer``'s own ``state_dict()`` (keyed by index);
    ``alias`` reads one parameter's state under another name (the tied head copy's)."""
    names = {id(p): n for n, p in module.named_parameters()}
    groups, out = iter(named["param_groups"]), []
    for part in optimizer_parts(optimizer):
        state, pgroups, i = {}, [], 0
        for g in part.param_groups:
            saved = next(groups)
            idx = list(range(i, i + len(g["params"])))
            for j, prm in zip(idx, g["params"]):
                n = alias.get(names[id(prm)], names[id(prm)])
                if n in named["state"]:
                    state[j] = named["state"][n]
            pgroups.append({**{k: v for k, v in saved.items() if k != "params"}, "params": idx})
            i += len(idx)
        out.append({"state": state, "param_groups": pgroups})
    return {"muon": out[0], "adamw": out[1]} if hasattr(optimizer, "muon") else out[0]


__all__ = ["stage_blocks", "Stage", "Pipeline"]
