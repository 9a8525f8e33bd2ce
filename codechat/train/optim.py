"""The optimizers of the training loop: AdamW, or Muon on hidden matrices with AdamW on the rest.

Both are driven the same way by :class:`~codechat.train.trainer.Trainer`: it writes the scheduled
learning rate into every entry of ``param_groups``, then calls ``step()`` and ``zero_grad()``,
and saves/loads ``state_dict()`` with each checkpoint.
"""
from __future__ import annotations

from typing import Any

import torch

from ..config import OptimConfig


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


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig,
                    device: torch.device) -> torch.optim.AdamW | MuonAdamW:
    """The optimizer ``cfg.name`` names, over ``model``'s trainable parameters.

    ``adamw``: decoupled weight decay on parameters of 2+ dims (matrices) only; fused on CUDA.
    ``muon``: :class:`torch.optim.Muon` (Nesterov momentum ``cfg.muon_momentum``, 5 Newton-Schulz
    steps, ``adjust_lr_fn="match_rms_adamw"``) on :func:`hidden_matrix_names`, with weight decay;
    AdamW as above on the rest.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    hidden = hidden_matrix_names(model) if cfg.name == "muon" else set()

    def adamw(params: list[tuple[str, torch.Tensor]]) -> torch.optim.AdamW:
        decay = [p for _, p in params if p.dim() >= 2]
        no_decay = [p for _, p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                 fused=device.type == "cuda")

    rest = [(n, p) for n, p in named if n not in hidden]
    if not hidden:
        return adamw(rest)
    muon = torch.optim.Muon([p for n, p in named if n in hidden], lr=cfg.lr, weight_decay=cfg.weight_decay,
                            momentum=cfg.muon_momentum, nesterov=True, adjust_lr_fn="match_rms_adamw")
    return MuonAdamW(muon, adamw(rest))
