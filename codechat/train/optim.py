"""The optimizers of the training loop: AdamW, or Muon on hidden matrices with AdamW on the rest.

Both are driven the same way by :class:`~codechat.train.trainer.Trainer`: it writes the scheduled
learning rate, times the group's ``lr_mult`` (1 where absent), into every entry of ``param_groups``
(:func:`set_lr`), then calls ``step()`` and ``zero_grad()``,
and saves/loads ``state_dict()`` with each checkpoint.

``adamw8bit`` is AdamW with its moments in 8 bits, torchao's (:mod:`codechat.train.optim8bit`: why
torchao's rather than bitsandbytes', its bytes per parameter, the devices it runs on).
"""
from __future__ import annotations

import math
from typing import Any

import torch

from codechat.config.stages import OptimConfig

#: Quintic Newton-Schulz coefficients (a, b, c) of Jordan et al. 2024 (the values torch's Muon uses).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7


def hidden_matrix_names(model: torch.nn.Module) -> set[str]:
    """Names of the 2-D weights inside the transformer blocks (attention and MLP projections).

    The embedding and the LM head (tied or not) are excluded: Muon is meant for hidden layers
    only (Jordan et al. 2024), the input and output layers keep AdamW.
    """
    skip = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    head = getattr(model, "lm_head", None)
    if head is not None:
        skip |= {id(p) for p in head.parameters()}
    return {n for n, p in model.named_parameters() if p.requires_grad and p.dim() == 2 and id(p) not in skip}


def orthogonalize(g: torch.Tensor, dtype: torch.dtype, steps: int = NS_STEPS,
                  coefficients: tuple[float, float, float] = NS_COEFFICIENTS, eps: float = NS_EPS) -> torch.Tensor:
    """An approximately orthogonal matrix ``U S' V^T`` for each ``g = U S V^T``, ``S'_ii`` in about (0.5, 1.5).

    ``steps`` quintic Newton-Schulz iterations ``X <- a X + (b A + c A^2) X`` with ``A = X X^T``,
    after scaling ``X`` to spectral norm <= 1 by its Frobenius norm (Jordan et al. 2024,
    https://kellerjordan.github.io/posts/muon/). Computed in ``dtype``.

    Args:
        g: ``(rows, cols)`` or a batch ``(n, rows, cols)`` of float matrices (momentum-smoothed
            gradients; a batch is one kernel call per product instead of one per matrix).
        dtype: the iteration's dtype (``torch.bfloat16`` on GPUs, ``torch.float32`` on CPUs
            without native bf16).
    Returns:
        a tensor of ``g``'s shape and of ``dtype``.
    """
    a, b, c = coefficients
    x = g.to(dtype)
    tall = x.size(-2) > x.size(-1)
    if tall:  # iterate on the short side: A is (min, min)
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    mm = torch.addmm if x.dim() == 2 else torch.baddbmm
    for _ in range(steps):
        gram = x @ x.mT
        x = mm(x, mm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


class Muon(torch.optim.Optimizer):
    """Muon (Jordan et al. 2024): SGD with Nesterov momentum whose update is orthogonalised.

    Per 2-D parameter ``W`` with gradient ``G``: ``B <- momentum B + (1 - momentum) G``;
    ``U = orthogonalize(G + momentum (B - G))`` (Nesterov) or ``orthogonalize(B)``;
    ``W <- (1 - lr wd) W - lr 0.2 sqrt(max(rows, cols)) U``. The ``0.2 sqrt(max(rows, cols))``
    factor matches AdamW's update RMS (Liu et al. 2025, "Muon is Scalable for LLM Training",
    sec. 2.2), as torch's ``Muon(adjust_lr_fn="match_rms_adamw")``. Under FSDP (parameters are
    DTensor shards) each rank gathers the whole momentum-smoothed matrices, orthogonalises them
    (the same computation on every rank) and applies its own shard of the result; the momentum
    buffers stay sharded. State and param-group keys are
    torch's, plus ``ns_dtype`` (kept in the param groups as its name, ``"bfloat16"`` / ``"float32"``,
    so that the state dict holds only plain values). Ours because torch's always orthogonalises in bf16, which a CPU
    without native bf16 runs ~100x slower than fp32 (a ``tiny`` step 3x slower than AdamW's).

    Raises:
        ValueError: a parameter is not 2-D.
    """

    def __init__(self, params: Any, lr: float, weight_decay: float, momentum: float = 0.95,
                 nesterov: bool = True, ns_dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                                  "nesterov": nesterov, "ns_coefficients": NS_COEFFICIENTS, "eps": NS_EPS,
                                  "ns_steps": NS_STEPS, "adjust_lr_fn": "match_rms_adamw",
                                  "ns_dtype": _dtype_name(ns_dtype)})
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon takes 2-D parameters only, got one of shape {tuple(p.shape)}")
        self._ns_dtype = ns_dtype

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:  # a state saved by torch's own Muon has no ns_dtype
            group["ns_dtype"] = _dtype_name(group.get("ns_dtype", getattr(self, "_ns_dtype", torch.bfloat16)))

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            lr, wd, mom = group["lr"], group["weight_decay"], group["momentum"]
            by_shape: dict[tuple, list[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is not None:
                    by_shape.setdefault((p.shape, p.dtype, p.device), []).append(p)
            for params in by_shape.values():  # matrices of one shape are orthogonalised as one batch
                grads = [p.grad for p in params]
                bufs = []
                for p in params:
                    if "momentum_buffer" not in self.state[p]:
                        self.state[p]["momentum_buffer"] = torch.zeros_like(p.grad)
                    bufs.append(self.state[p]["momentum_buffer"])
                torch._foreach_lerp_(bufs, grads, 1 - mom)
                updates = torch._foreach_lerp(grads, bufs, mom) if group["nesterov"] else bufs
                sharded = hasattr(params[0], "full_tensor")  # FSDP's DTensor shards: orthogonalise whole matrices
                u = orthogonalize(torch.stack([x.full_tensor() for x in updates] if sharded else updates),
                                  getattr(torch, _dtype_name(group["ns_dtype"])), group["ns_steps"],
                                  group["ns_coefficients"], group["eps"])
                u = list(u.to(params[0].dtype).unbind(0))
                if sharded:  # every rank computed the same whole update: keep this rank's shard of it
                    from torch.distributed.tensor import distribute_tensor
                    u = [distribute_tensor(x, p.device_mesh, p.placements, src_data_rank=None) for x, p in zip(u, params)]
                torch._foreach_mul_(params, 1 - lr * wd)
                torch._foreach_add_(params, u, alpha=-lr * 0.2 * math.sqrt(max(params[0].shape)))


def _dtype_name(dtype: torch.dtype | str) -> str:
    """``torch.bfloat16`` (or ``"bfloat16"``, as a state dict keeps it) -> ``"bfloat16"``."""
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


class MuonAdamW:
    """Muon on the hidden matrices plus AdamW on every other parameter, stepped as one optimizer.

    ``param_groups`` lists the groups of both (Muon's first), so a schedule that sets
    ``group["lr"]`` reaches all of them; ``state_dict()`` is ``{"muon": ..., "adamw": ...}``.
    """

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer) -> None:
        self.muon, self.adamw = muon, adamw

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.muon.param_groups + self.adamw.param_groups

    def step(self) -> None:
        self.muon.step()
        self.adamw.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Raises KeyError when ``state`` is not a Muon+AdamW state (e.g. a plain AdamW checkpoint)."""
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])


def set_lr(optimizer: Any, lr: float) -> None:
    """Write the scheduled ``lr`` into every param group, scaled by the group's ``lr_mult``; into the
    group's 0-dim tensor where it keeps one (``adamw8bit``: torchao's)."""
    for g in optimizer.param_groups:
        value = lr * g.get("lr_mult", 1.0)
        if isinstance(g["lr"], torch.Tensor):
            g["lr"].fill_(value)
        else:
            g["lr"] = value


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig,
                    device: torch.device) -> torch.optim.Optimizer | MuonAdamW:
    """The optimizer ``cfg.name`` names, over ``model``'s trainable parameters (``requires_grad``:
    every weight, or LoRA's adapters alone).

    ``adamw``: decoupled weight decay on parameters of 2+ dims (matrices) only; fused on CUDA.
    ``adamw8bit``: the same groups in torchao's 8-bit AdamW
    (:func:`codechat.train.optim8bit.build_adamw8bit`; raises ConfigError off CUDA and CPU or
    without torchao).
    ``muon``: :class:`Muon` (Nesterov momentum ``cfg.muon_momentum``, 5 Newton-Schulz steps in
    ``cfg.muon_ns_dtype``, the update RMS matched to AdamW's) on :func:`hidden_matrix_names`, with
    weight decay; AdamW as above on the rest. With ``cfg.embed_lr_mult`` or ``cfg.head_lr_mult``
    other than 1, the embedding and the LM head get AdamW groups of their own whose ``lr_mult``
    :func:`set_lr` applies.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    hidden = hidden_matrix_names(model) if cfg.name == "muon" else set()

    def adamw(params: list[tuple[str, torch.Tensor]]) -> torch.optim.Optimizer:
        own: dict[int, float] = {}  # id(param) -> lr_mult, for the embedding's and head's own groups
        if (cfg.embed_lr_mult, cfg.head_lr_mult) != (1.0, 1.0):
            head = getattr(model, "lm_head", None)
            for p in (head.parameters() if head is not None else ()):
                own[id(p)] = cfg.head_lr_mult
            for m in model.modules():  # after the head: a tied head follows the embedding
                if isinstance(m, torch.nn.Embedding):
                    own.update({id(p): cfg.embed_lr_mult for p in m.parameters()})
        decay = [p for _, p in params if p.dim() >= 2 and id(p) not in own]
        no_decay = [p for _, p in params if p.dim() < 2 and id(p) not in own]
        groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        for mult in sorted(set(own.values())):
            mine = [p for _, p in params if own.get(id(p)) == mult]
            if mine:
                groups.append({"params": mine, "weight_decay": cfg.weight_decay, "lr_mult": mult})
        if cfg.name == "adamw8bit":
            from .optim8bit import build_adamw8bit
            return build_adamw8bit(groups, cfg.lr, (cfg.beta1, cfg.beta2), cfg.eps, device)
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                 fused=device.type == "cuda")

    rest = [(n, p) for n, p in named if n not in hidden]
    if not hidden:
        return adamw(rest)
    ns = cfg.muon_ns_dtype if cfg.muon_ns_dtype != "auto" else ("bf16" if device.type == "cuda" else "fp32")
    muon = Muon([p for n, p in named if n in hidden], lr=cfg.lr, weight_decay=cfg.weight_decay,
                momentum=cfg.muon_momentum, ns_dtype=torch.bfloat16 if ns == "bf16" else torch.float32)
    return MuonAdamW(muon, adamw(rest))
