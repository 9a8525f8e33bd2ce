"""``codechat export --format peft``: a LoRA checkpoint's adapters as a PEFT adapter directory.

::

    OUT/adapter_config.json          PEFT's LoraConfig: r, lora_alpha, lora_dropout, target_modules (Hugging
                                     Face module names: q_proj ... down_proj), task_type CAUSAL_LM
    OUT/adapter_model.safetensors    base_model.model.<HF module path>.lora_A.weight (r, in) and .lora_B.weight
                                     (out, r), in --dtype (default fp32)

Written under ``.tmp-NAME`` beside ``OUT`` and renamed when complete. ``peft.PeftModel.from_pretrained(base,
OUT)``, with ``base`` the ``--format hf`` export of the checkpoint's base loaded by transformers, computes what
codechat's adapted model computes: the same formula, ``W x + (lora_alpha / r) B A x`` (Hu et al. 2021,
arXiv:2106.09685), on the same weights. Nothing here imports ``peft``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from codechat.config.atomic import write_dir
from codechat.config.lora import LORA_TARGETS, LoraConfig
from codechat.config.stages import ConfigError, build
from .weights import DTYPES, to_hf_names

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: PEFT's prefix of every adapter key: the PeftModel's ``base_model`` (a LoraModel) wrapping ``model``.
PEFT_PREFIX = "base_model.model."


def adapter_config(cfg: LoraConfig, base: str) -> dict[str, Any]:
    """``adapter_config.json`` of adapters ``cfg`` (PEFT's ``LoraConfig`` fields; the others keep PEFT's
    defaults): the targets as Hugging Face module names, biases untouched, the standard ``alpha / r`` scale."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": cfg.rank, "lora_alpha": cfg.alpha,
            "lora_dropout": cfg.dropout,
            "target_modules": sorted(LORA_TARGETS[t].split(".")[1] for t in cfg.targets), "bias": "none",
            "fan_in_fan_out": False, "use_rslora": False, "init_lora_weights": True, "inference_mode": True,
            "base_model_name_or_path": base}


def export_peft(ckpt: dict[str, Any], out: str | os.PathLike, dtype: str = "fp32") -> Path:
    """Write the adapters of LoRA checkpoint ``ckpt`` (what :func:`codechat.checkpoint.load` returns) as ``out``
    (module docstring).

    Raises:
        ConfigError: the checkpoint has no adapters (no ``meta.peft``), ``out`` exists and is not an earlier
            adapter export, or an unknown ``dtype``.
    """
    from safetensors.torch import save_file
    dst, src = Path(out), Path(ckpt["dir"])
    peft = ckpt["state"].get("meta", {}).get("peft")
    if peft is None:
        raise ConfigError(f"--format peft: {src} has no LoRA adapters (no meta.peft); train with --peft lora, or "
                          "export plain weights with --format codechat or hf")
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dst.exists() and not (dst / ADAPTER_CONFIG).is_file():
        raise ConfigError(f"--out {dst}: exists and is not an adapter export; choose a new directory")
    cfg = build(LoraConfig, peft["lora"])
    sd = {PEFT_PREFIX + k: v.detach().to("cpu", DTYPES[dtype]).contiguous()
          for k, v in to_hf_names(ckpt["model"], tied=False).items()}
    with write_dir(dst) as tmp:
        save_file(sd, tmp / ADAPTER_WEIGHTS, metadata={"format": "pt", "source": str(src)})
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(cfg, peft["base"]), indent=2))
    return dst


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "adapter_config", "export_peft"]
