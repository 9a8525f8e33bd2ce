"""Weights in Hugging Face's layout: parameter names, (sharded) safetensors, and vocabulary growth.

codechat's parameter names are Hugging Face Llama's without the ``model.`` prefix
(``layers.0.self_attn.q_proj.weight`` is ``model.layers.0.self_attn.q_proj.weight``); the LM head is
``lm_head.weight`` in both, and absent from the files when tied to the embedding. A checkpoint
above :attr:`ExportConfig.max_shard_bytes` is written as ``model-00001-of-0000N.safetensors`` files
with ``model.safetensors.index.json`` (``{"metadata": {"total_size"}, "weight_map": {name: file}}``),
the layout ``from_pretrained`` reads.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..checkpoint import TIED_HEAD
from .config import HFImportError

PREFIX = "model."
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp32": torch.float32}
DTYPE_NAMES: dict[str, str] = {"bf16": "bfloat16", "fp32": "float32"}


def to_hf_names(sd: dict[str, torch.Tensor], tied: bool) -> dict[str, torch.Tensor]:
    """codechat state dict -> Hugging Face names; a tied head is left out (stored once, as the embedding)."""
    return {(k if k == TIED_HEAD else PREFIX + k): v for k, v in sd.items() if not (tied and k == TIED_HEAD)}


def from_hf_names(sd: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """Hugging Face state dict -> codechat names.

    Raises:
        HFImportError: a tensor outside ``model.*`` and ``lm_head.weight`` (named).
    """
    out = {}
    for k, v in sd.items():
        if k == TIED_HEAD:
            out[k] = v
        elif k.startswith(PREFIX):
            out[k[len(PREFIX):]] = v
        else:
            raise HFImportError(f"{where}: tensor {k!r} is not part of a Llama / Qwen3 causal LM")
    return out


def save_safetensors(sd: dict[str, torch.Tensor], directory: Path, max_shard_bytes: int) -> list[str]:
    """Write ``sd`` into ``directory`` as one file, or as shards of at most ``max_shard_bytes`` each
    (a tensor larger than that gets a shard of its own) plus the index. Returns the file names."""
    from safetensors.torch import save_file
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k, v in sd.items():
        n = v.numel() * v.element_size()
        if shards[-1] and size + n > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v.contiguous()
        size += n
    meta = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], directory / SINGLE, metadata=meta)
        return [SINGLE]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, shard in zip(names, shards):
        save_file(shard, directory / name, metadata=meta)
    index = {"metadata": {"total_size": sum(v.numel() * v.element_size() for v in sd.values())},
             "weight_map": {k: name for name, shard in zip(names, shards) for k in shard}}
    (directory / INDEX).write_text(json.dumps(index, indent=2))
    return [*names, INDEX]


def load_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``directory``'s ``model.safetensors`` or of the shards its index names (CPU).

    Raises:
        HFImportError: no weights there, or a shard the index names is missing or unreadable.
    """
    from safetensors.torch import load_file
    if (directory / INDEX).is_file():
        files = sorted(set(json.loads((directory / INDEX).read_text())["weight_map"].values()))
    elif (directory / SINGLE).is_file():
        files = [SINGLE]
    else:
        raise HFImportError(f"{directory}: holds neither {SINGLE} nor {INDEX} (PyTorch .bin weights are not read; "
                            "convert them to safetensors)")
    sd: dict[str, torch.Tensor] = {}
    for name in files:
        try:
            sd.update(load_file(directory / name))
        except Exception as e:  # missing or truncated: name the file
            raise HFImportError(f"{directory / name}: cannot be read ({type(e).__name__}: {e})") from None
    return sd


def grow_vocab(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """``weight`` (V, D) with ``rows`` more rows, each the mean of the existing rows (in fp32): (V + rows, D).

    A new token then starts with the average embedding (and, in the head, the average logit
    direction), so it neither dominates nor vanishes before it is trained; the existing rows are
    unchanged.
    """
    if rows == 0:
        return weight
    mean = weight.float().mean(dim=0, keepdim=True).to(weight.dtype)
    return torch.cat([weight, mean.expand(rows, -1)], dim=0)
