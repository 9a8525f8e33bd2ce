"""Frozen, validated configuration of parameter-efficient fine-tuning: ``--peft lora`` and the ``lora:``
section (``--lora.rank R --lora.alpha A --lora.dropout P --lora.targets q,k,v,o,gate,up,down``).

A stage (``pretrain`` with ``--init``, ``sft``, ``rl``) holds ``peft`` (:data:`PEFT_METHODS`) and a
:class:`LoraConfig`, and calls :func:`check_peft` in its own ``__post_init__``: what a setting alone
can refuse is refused when the config is built; what needs the model (a rank over a layer's smaller
dimension, a target that matches no layer) when the adapters are attached
(:func:`codechat.peft.lora.apply_lora`), still before step 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from codechat.config.yaml_io import _check

#: ``--peft`` values: ``none`` trains every weight, ``lora`` trains low-rank adapters on a frozen base.
PEFT_METHODS = ("none", "lora")
#: ``lora.targets`` names -> the projection they mean inside a block (``self_attn.*`` or ``mlp.*``);
#: the module names are Llama's, the names PEFT's ``target_modules`` use.
LORA_TARGETS: dict[str, str] = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
                                "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
                                "down": "mlp.down_proj"}


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models",
    arXiv:2106.09685): each targeted projection ``W`` (out, in) computes ``W x + (alpha / rank) B A
    dropout(x)``, with ``A`` (rank, in) and ``B`` (out, rank) trained and ``W`` frozen.

    ``rank``: the adapters' inner dimension r (> 0, at most each targeted layer's smaller dimension);
    ``alpha``: the scale numerator (the update is scaled by ``alpha / rank``, so a sweep over ``rank``
    keeps the learning rate); ``dropout``: on the adapters' input only (0: none); ``targets``: keys of
    :data:`LORA_TARGETS`, in every block.
    """

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")

    def __post_init__(self) -> None:
        _check(self.rank > 0, f"lora.rank must be > 0, got {self.rank}")
        _check(self.alpha > 0 and math.isfinite(self.alpha), f"lora.alpha must be a positive number, got {self.alpha}")
        _check(0.0 <= self.dropout < 1.0, f"lora.dropout must be in [0, 1), got {self.dropout}")
        _check(bool(self.targets), f"lora.targets is empty: name some of {','.join(LORA_TARGETS)}")
        unknown = [t for t in self.targets if t not in LORA_TARGETS]
        _check(not unknown, f"lora.targets: unknown {', '.join(map(repr, unknown))}; choose among "
                            f"{','.join(LORA_TARGETS)}")
        _check(len(set(self.targets)) == len(self.targets), f"lora.targets names a layer twice: {self.targets}")

    @property
    def scaling(self) -> float:
        """``alpha / rank``, the factor on ``B A x``."""
        return self.alpha / self.rank


def check_peft(peft: str, optim: Any, train: Any, init: str | None = None) -> None:
    """Refuse, with a one-line message naming the setting, what ``--peft`` cannot be combined with:
    Muon (adapters are trained with AdamW, as in Hu et al. 2021 and PEFT: Muon orthogonalises whole
    hidden matrices, an (r, in) factor is not one), ``--train.fp8`` (its converted linears would not
    carry adapters), ``--pp`` (stages do not save adapters yet) and, where ``init`` is given as ``""``
    (pretraining from scratch), a base to adapt.

    Raises:
        ConfigError: one of the above.
    """
    _check(peft in PEFT_METHODS, f"--peft must be one of {', '.join(PEFT_METHODS)}, got {peft!r}")
    if peft == "none":
        return
    _check(optim.name != "muon", "--peft lora trains its adapters with AdamW; --optim.name muon orthogonalises whole "
                                 "hidden matrices, not low-rank factors: use --optim.name adamw")
    _check(train.fp8 == "none", f"--peft lora with --train.fp8 {train.fp8}: FP8 linears do not carry adapters; "
                                "use --train.fp8 none")
    _check(train.pp == 1, f"--peft lora with --pp {train.pp}: pipeline stages do not save adapters yet; use data "
                          "parallelism (--parallel ddp or fsdp)")
    _check(init != "", "--peft lora adapts a trained model: give --init CHECKPOINT (continued pretraining), "
                       "or leave --peft out to pretrain from scratch")


__all__ = ["PEFT_METHODS", "LORA_TARGETS", "LoraConfig", "check_peft"]
