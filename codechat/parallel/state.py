"""Optimizer state keyed by parameter name, the layout every sharded checkpoint is written in.

A one-process ``torch.optim`` state is keyed by parameter index; a sharded checkpoint
(:meth:`codechat.parallel.wrapper.Parallel.shards`, a pipeline stage's part) names each parameter,
so any world size and layout reads it whole (:func:`whole_template`) and loads it back.
"""
from __future__ import annotations

from typing import Any

import torch

from codechat.checkpoint import TIED_HEAD


def whole_template(model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """What :meth:`Parallel.shards` writes, as whole tensors of ``model`` (one process's, on the CPU)
    and ``optimizer`` (built over it): the template a sharded checkpoint is read into. The
    optimizer's state is first created by one step of learning rate 0 on zero gradients."""
    parts = optimizer_parts(optimizer)
    for part in parts:
        lrs = [g["lr"] for g in part.param_groups]
        for g in part.param_groups:  # a tensor LR stays a tensor (torchao's 8-bit AdamW keeps one)
            g["lr"] = torch.zeros_like(g["lr"]) if isinstance(g["lr"], torch.Tensor) else 0.0
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


__all__ = ["whole_template", "optimizer_parts", "keyed_by_name", "name_optimizer_state"]
