"""``codechat export --format hf``: a codechat checkpoint as a directory ``transformers`` loads.

::

    OUT/model.safetensors            weights, Hugging Face names, in --dtype (bf16 or fp32); above
                                     ExportConfig.max_shard_bytes: model-0000K-of-0000N.safetensors
                                     + model.safetensors.index.json
    OUT/config.json                  Qwen3ForCausalLM (QK-norm) or LlamaForCausalLM (codechat.hf.config)
    OUT/generation_config.json       bos <|bos|>, eos and pad <|end|> (the end of an assistant turn)
    OUT/tokenizer.json               codechat's BPE, every special id an added special token
    OUT/tokenizer_config.json        PreTrainedTokenizerFast, bos/eos/pad, the chat template
    OUT/README.md                    the model card (codechat.hf.card)

Written under ``.tmp-NAME`` beside ``OUT`` and renamed when complete. The result loads with
``AutoModelForCausalLM.from_pretrained(OUT)`` and ``AutoTokenizer.from_pretrained(OUT)``, with no
missing or unexpected keys; it does not import transformers.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codechat.config.atomic import write_dir
from ..checkpoint import TIED_HEAD
from codechat.config.stages import ConfigError, ModelConfig, build, to_dict
from ..tokenizer import Tokenizer
from .card import model_card
from .config import check_exportable, hf_config
from .tokenizer import write_tokenizer
from .weights import DTYPE_NAMES, DTYPES, INDEX, SINGLE, save_safetensors, to_hf_names

HF_FILES = ("config.json", SINGLE, INDEX)  # one of these marks an earlier export, which may be replaced


@dataclass(frozen=True)
class ExportConfig:
    """How an export is written: ``dtype`` of the weights (``bf16`` | ``fp32``) and the largest
    safetensors file before the weights are sharded (transformers' own default, 5 GB)."""

    dtype: str = "bf16"
    max_shard_bytes: int = 5 * 10**9

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.max_shard_bytes <= 0:
            raise ConfigError(f"max_shard_bytes must be > 0, got {self.max_shard_bytes}")


def export_hf(ckpt: dict[str, Any], out: str | os.PathLike, config: ExportConfig = ExportConfig()) -> Path:
    """Write checkpoint ``ckpt`` (what :func:`codechat.checkpoint.load` returns) as ``out`` (module docstring).

    Raises:
        ConfigError: ``out`` exists and is not an earlier Hugging Face export, the checkpoint has no
            model config or no tokenizer, or holds LoRA adapters (:func:`codechat.checkpoint.load_merged`
            gives their merged model).
        HFExportError: the model has an option transformers' Llama / Qwen3 cannot express
            (``model.mlp_act`` relu2, ``model.logit_softcap``, ``model.x0_mix``, ``model.unet_skips``;
            :data:`codechat.hf.config.NOT_EXPORTABLE`).
    """
    dst, src = Path(out), Path(ckpt["dir"])
    if dst.exists() and not any((dst / f).is_file() for f in HF_FILES):
        raise ConfigError(f"--out {dst}: exists and is not an export; choose a new directory")
    meta = ckpt["state"].get("meta", {})
    if "model" not in meta:
        raise ConfigError(f"{src / 'state.json'}: has no meta.model (not a codechat checkpoint?)")
    if "peft" in meta:
        raise ConfigError(f"{src} holds LoRA adapters, not whole weights: export with --merge for the merged model, "
                          "or --format peft for the adapters")
    if not (src / "tokenizer").is_dir():
        raise ConfigError(f"{src / 'tokenizer'}: missing; the checkpoint is incomplete")
    cfg = build(ModelConfig, meta["model"])
    check_exportable(cfg)  # before any file is written
    tok = Tokenizer.load(src / "tokenizer")
    dtype = DTYPES[config.dtype]
    sd = {k: v.detach().to("cpu", dtype) for k, v in ckpt["model"].items()}
    hf_cfg = hf_config(cfg, dtype=DTYPE_NAMES[config.dtype], bos_id=tok.bos_id, eos_id=tok.end_id)
    params = sum(v.numel() for k, v in sd.items() if not (cfg.tie_embeddings and k == TIED_HEAD))
    run = src.parent.parent.parent if src.parent.name == "checkpoints" else src
    with write_dir(dst) as tmp:
        save_safetensors(to_hf_names(sd, cfg.tie_embeddings), tmp, config.max_shard_bytes)
        (tmp / "config.json").write_text(json.dumps(hf_cfg, indent=2))
        generation = {"bos_token_id": tok.bos_id, "eos_token_id": tok.end_id, "pad_token_id": tok.end_id}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2))
        write_tokenizer(src / "tokenizer", tmp, cfg.max_seq_len)
        (tmp / "README.md").write_text(model_card(run.name, to_dict(cfg), hf_cfg, src, params), encoding="utf-8")
    return dst
