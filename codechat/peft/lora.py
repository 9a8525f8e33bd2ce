"""LoRA: low-rank adapters on a frozen base (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
Models", arXiv:2106.09685), as PEFT computes and names them.

A targeted projection ``W`` (out, in) of every block becomes a :class:`LoRALinear`::

    y = W x + (alpha / r) * B(A(dropout(x)))        A: (r, in), B: (out, r)

``A`` starts Kaiming-uniform and ``B`` at zero (PEFT's ``init_lora_weights=True``), so the adapted model
starts as the base. Parameter names are PEFT's (``layers.0.self_attn.q_proj.lora_A.weight``; the base
weight keeps its name, ``layers.0.self_attn.q_proj.weight``), so a base checkpoint loads into the adapted
model unchanged and the adapters map onto PEFT's keys by a prefix (:mod:`codechat.hf.peft`).

The trainer attaches adapters before any wrapper (:func:`attach_lora`): every base parameter frozen, the
blocks' frozen projections in the compute dtype (bf16 on CUDA; the embedding, LM head and norms stay
fp32, so the residual stream is as in full fine-tuning), the adapters in fp32. A checkpoint holds the
adapters only and names its base (``meta.peft``: the base's path and :func:`fingerprint`); loading one
merges the adapters into the base in memory (:func:`merge_lora`, :func:`codechat.checkpoint.load_model`).
This module knows nothing of checkpoints or parallelism.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from codechat.config.lora import LORA_TARGETS, LoraConfig
from codechat.config.yaml_io import ConfigError, _check, to_dict

ADAPTER_KEYS = (".lora_A.", ".lora_B.")  # a parameter name holding one of these is an adapter's
#: Elements read per tensor by :func:`fingerprint`'s checksum (a strided sample: cheap on an 8B base).
FINGERPRINT_SAMPLE = 4096
#: Relative tolerance of the checksum: a base merged on another device may differ in the last bits.
FINGERPRINT_RTOL = 1e-3


class LoRALinear(nn.Module):
    """A bias-free linear layer with a frozen weight and a trainable low-rank update.

    ``forward(x)``: x (..., in) -> ``F.linear(x, weight) + scaling * lora_B(lora_A(dropout(x)))`` (..., out);
    with :attr:`adapters_on` False (:func:`adapters_disabled`) the base alone. ``weight`` (out, in) is
    the wrapped layer's own parameter (frozen; any dtype), ``lora_A.weight`` (r, in) and
    ``lora_B.weight`` (out, r) are fp32 on the weight's device.
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float, generator: torch.Generator) -> None:
        super().__init__()
        self.out_features, self.in_features = base.weight.shape
        self.weight = base.weight.requires_grad_(False)
        self.lora_A = nn.Linear(self.in_features, rank, bias=False, dtype=torch.float32)
        self.lora_B = nn.Linear(rank, self.out_features, bias=False, dtype=torch.float32)
        with torch.no_grad():  # PEFT's init: A ~ kaiming_uniform(a=sqrt(5)) (nn.Linear's), B = 0
            nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5), generator=generator)
            nn.init.zeros_(self.lora_B.weight)
        self.lora_A.to(base.weight.device)
        self.lora_B.to(base.weight.device)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.scaling = alpha / rank
        self.adapters_on = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if not self.adapters_on:
            return y
        return y + self.lora_B(self.lora_A(self.dropout(x))) * self.scaling

    @torch.no_grad()
    def merged_weight(self) -> torch.Tensor:
        """``W + scaling * B @ A`` (out, in), computed in fp32 and returned in ``weight``'s dtype."""
        delta = self.lora_B.weight.float() @ self.lora_A.weight.float()
        return (self.weight.float() + self.scaling * delta).to(self.weight.dtype)


def dense_weight(linear: nn.Module) -> torch.Tensor:
    """The (out, in) weight ``linear`` computes with: a :class:`LoRALinear`'s merged, a plain layer's own
    (the engine copies these: RL rollouts see the current adapters)."""
    return linear.merged_weight() if isinstance(linear, LoRALinear) else linear.weight


def is_adapter_key(name: str) -> bool:
    """Whether state-dict key ``name`` is an adapter's (``...lora_A.weight`` / ``...lora_B.weight``)."""
    return any(k in name for k in ADAPTER_KEYS)


def _targets(model: nn.Module, cfg: LoraConfig) -> list[tuple[str, nn.Module, str, nn.Linear]]:
    """``(name, parent, attribute, layer)`` of every projection ``cfg.targets`` names in ``model.layers``.

    Raises:
        ConfigError: a target that matches no layer (``gate`` with ``model.mlp_act`` relu2), a rank over a
            targeted layer's smaller dimension.
    """
    found = []
    for i, block in enumerate(model.layers):
        for t in cfg.targets:
            owner, attr = LORA_TARGETS[t].split(".")
            parent = getattr(block, owner)
            layer = getattr(parent, attr, None)
            if isinstance(layer, nn.Linear):
                found.append((f"layers.{i}.{LORA_TARGETS[t]}", parent, attr, layer))
    for t in cfg.targets:
        _check(any(name.endswith(LORA_TARGETS[t]) for name, *_ in found),
               f"lora.targets: {t!r} ({LORA_TARGETS[t]}) matches no layer of this model (model.mlp_act=relu2 has "
               f"no gate_proj); drop it from --lora.targets")
    for name, _, _, layer in found:
        small = min(layer.weight.shape)
        _check(cfg.rank <= small, f"lora.rank={cfg.rank} is larger than {name} ({layer.out_features}x"
                                  f"{layer.in_features}) allows: at most its smaller dimension, {small}")
    return found


def apply_lora(model: nn.Module, cfg: LoraConfig, seed: int = 0) -> list[str]:
    """Freeze every parameter of ``model`` (a :class:`codechat.model.GPT`) and wrap each targeted
    projection in a :class:`LoRALinear`, in place; ``A`` is drawn from a generator seeded with ``seed``
    (the same adapters on every rank, whatever the global RNG). Returns the wrapped layers' names.

    Raises:
        ConfigError: see :func:`_targets`; the model is then left unchanged.
    """
    found = _targets(model, cfg)
    model.requires_grad_(False)
    g = torch.Generator().manual_seed(seed)
    for _, parent, attr, layer in found:
        setattr(parent, attr, LoRALinear(layer, cfg.rank, cfg.alpha, cfg.dropout, g))
    return [name for name, *_ in found]


def lora_layers(model: nn.Module) -> Iterator[LoRALinear]:
    return (m for m in model.modules() if isinstance(m, LoRALinear))


def has_adapters(model: nn.Module) -> bool:
    return next(lora_layers(model), None) is not None


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` computing its base alone inside the block (GRPO's KL reference: no second copy of the base)."""
    layers = list(lora_layers(model))
    for m in layers:
        m.adapters_on = False
    try:
        yield model
    finally:
        for m in layers:
            m.adapters_on = True


def base_forward(model: nn.Module) -> Callable[..., torch.Tensor]:
    """``model``'s forward with its adapters off (:func:`adapters_disabled`): GRPO's KL reference, the
    frozen base, computed without a second copy of it."""
    def forward(*args: Any, **kwargs: Any) -> torch.Tensor:
        with adapters_disabled(model):
            return model(*args, **kwargs)
    return forward


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every :class:`LoRALinear` of ``model`` by a plain ``nn.Linear`` holding its merged weight
    (:meth:`LoRALinear.merged_weight`), in place; returns ``model``, which then has a plain model's
    parameter names."""
    for parent in list(model.modules()):
        for attr, child in list(parent.named_children()):
            if isinstance(child, LoRALinear):
                plain = nn.Linear(child.in_features, child.out_features, bias=False, device="meta")
                plain.weight = nn.Parameter(child.merged_weight(), requires_grad=False)
                setattr(parent, attr, plain)
    return model


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` of ``model``'s adapters only (the keys :func:`is_adapter_key` accepts)."""
    return {k: v for k, v in model.state_dict().items() if is_adapter_key(k)}


def fingerprint(sd: dict[str, torch.Tensor]) -> dict[str, Any]:
    """What names a base beyond its path: ``shapes`` (sha256 of every tensor's name and shape, in order of
    name) and ``checksum`` (the float64 sum of ``|w|`` over a strided sample of :data:`FINGERPRINT_SAMPLE`
    elements of each tensor): a base of another shape changes the first, other weights the second."""
    h = hashlib.sha256()
    total = 0.0
    for k in sorted(sd):
        v = sd[k].detach()
        h.update(f"{k}:{tuple(v.shape)};".encode())
        flat = v.reshape(-1)
        total += float(flat[::max(1, flat.numel() // FINGERPRINT_SAMPLE)].cpu().double().abs().sum())  # any device
    return {"shapes": h.hexdigest(), "checksum": total}


def same_peft(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two ``meta.peft`` records (None: no adapters) mean the same adapters on the same base: equal but
    for the checksums, which agree to :data:`FINGERPRINT_RTOL` (a base merged on another device)."""
    if a is None or b is None:
        return a is b
    def rest(m: dict[str, Any]) -> dict[str, Any]:
        return {**m, "fingerprint": m["fingerprint"]["shapes"]}
    return rest(a) == rest(b) and math.isclose(a["fingerprint"]["checksum"], b["fingerprint"]["checksum"],
                                               rel_tol=FINGERPRINT_RTOL)


def check_base(sd: dict[str, torch.Tensor], peft: dict[str, Any], where: str) -> None:
    """Raise unless base state dict ``sd`` is the one the adapters of checkpoint ``where`` were trained on
    (its ``meta.peft``).

    Raises:
        ConfigError: a base of another shape, or other weights (the base was overwritten since).
    """
    got, want = fingerprint(sd), peft["fingerprint"]
    _check(got["shapes"] == want["shapes"],
           f"{where}: its LoRA adapters were trained on a base of another shape than {peft['base']} (meta.peft.base); "
           "load them onto the base they were trained on")
    _check(math.isclose(got["checksum"], want["checksum"], rel_tol=FINGERPRINT_RTOL),
           f"{where}: the base {peft['base']} (meta.peft.base) holds other weights than the adapters were trained on "
           f"(checksum {got['checksum']:.6g}, trained on {want['checksum']:.6g}); restore that base")


def attach_lora(model: nn.Module, cfg: LoraConfig, base: str | Path, *, seed: int = 0,
                base_dtype: torch.dtype | None = None) -> dict[str, Any]:
    """Fingerprint ``model`` as base ``base`` (a checkpoint directory), wrap its targets (:func:`apply_lora`)
    and store the blocks' frozen projections in ``base_dtype`` (None: as they are). Returns what a
    checkpoint's ``meta.peft`` holds: ``{"method": "lora", "lora": cfg, "base": absolute path,
    "fingerprint": ...}``.

    Raises:
        ConfigError: see :func:`apply_lora`; a model that already has adapters.
    """
    if has_adapters(model):
        raise ConfigError("the model already carries LoRA adapters; attach them once")
    meta = {"method": "lora", "lora": to_dict(cfg), "base": str(Path(base).resolve()),
            "fingerprint": fingerprint(model.state_dict())}
    apply_lora(model, cfg, seed)
    if base_dtype is not None:
        for m in lora_layers(model):
            m.weight.data = m.weight.data.to(base_dtype)
        for block in model.layers:
            for m in block.modules():
                if type(m) is nn.Linear:  # the frozen projections without adapters
                    m.weight.data = m.weight.data.to(base_dtype)
    return meta


__all__ = ["LoRALinear", "dense_weight", "is_adapter_key", "apply_lora", "lora_layers", "has_adapters",
           "adapters_disabled", "base_forward", "merge_lora", "adapter_state_dict", "fingerprint", "same_peft", "check_base", "attach_lora"]
