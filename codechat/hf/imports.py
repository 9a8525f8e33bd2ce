"""``--init hf:PATH``: a Hugging Face Llama / Qwen3 checkpoint as a codechat checkpoint.

:func:`import_hf` reads ``config.json`` (:mod:`codechat.hf.config`: unsupported fields refused by
name), the safetensors weights and ``tokenizer.json`` (:mod:`codechat.hf.tokenizer`: the token
layout), and writes the consolidated form every codechat command loads::

    OUT/model.safetensors   codechat names, fp32; a tied head stored once, as the embedding
    OUT/state.json          step 0, meta {stage "hf_import", model, source, vocab layout}
    OUT/tokenizer/

codechat's special tokens that the model lacks get new rows after the model's whole vocabulary,
in the embedding and in an untied head, each initialised to the mean of the existing rows
(:func:`codechat.hf.weights.grow_vocab`); no existing row changes. ``PATH`` is a local directory
when one exists, else a Hub repo id downloaded with ``huggingface_hub.snapshot_download``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from codechat.config.atomic import write_dir
from ..checkpoint import EMBEDDING, TIED_HEAD
from codechat.config.stages import ModelConfig, to_dict
from ..model import GPT
from ..tokenizer import Tokenizer
from .config import HFImportError, model_config_from_hf, read_config
from .tokenizer import import_tokenizer
from .weights import from_hf_names, grow_vocab, load_safetensors

PREFIX = "hf:"
STAGE = "hf_import"
HUB_FILES = ["config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer.json",
             "tokenizer_config.json", "generation_config.json"]


def locate(source: str) -> Path:
    """The local directory of ``source``: itself when it is a directory, else a Hub download of its
    config, safetensors and tokenizer (``huggingface_hub``, into its cache).

    Raises:
        HFImportError: not a directory and the download fails (offline, unknown repo, gated model).
    """
    if Path(source).is_dir():
        return Path(source)
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(repo_id=source, allow_patterns=HUB_FILES))
    except Exception as e:  # offline, 404, gated, invalid id: one message naming the source
        raise HFImportError(f"hf:{source}: not a local directory, and downloading it from the Hugging Face Hub "
                            f"failed ({type(e).__name__}: {e})") from None


def convert(directory: Path) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer, dict[str, Any]]:
    """``(config, fp32 state dict in codechat names, Tokenizer, vocab layout)`` of HF checkpoint ``directory``.

    Raises:
        HFImportError: an unsupported field, missing or unexpected tensors, or a shape that does not
            fit the config; each names the file and the field or tensor.
    """
    where = str(directory / "config.json")
    hf = read_config(directory)
    sd = from_hf_names(load_safetensors(directory), str(directory))
    if EMBEDDING not in sd:
        raise HFImportError(f"{directory}: no tensor model.{EMBEDDING}")
    rows = sd[EMBEDDING].size(0)
    if hf.get("vocab_size", rows) != rows:
        raise HFImportError(f"{where}: vocab_size={hf['vocab_size']} but model.{EMBEDDING} has {rows} rows")
    tok, layout = import_tokenizer(directory, rows)
    cfg = model_config_from_hf(hf, where, tok.vocab_size)
    new = tok.vocab_size - rows
    if cfg.tie_embeddings:
        sd.pop(TIED_HEAD, None)  # tied: the head is the embedding, whatever a file also stores
    sd[EMBEDDING] = grow_vocab(sd[EMBEDDING], new)
    if TIED_HEAD in sd:
        sd[TIED_HEAD] = grow_vocab(sd[TIED_HEAD], new)
    with torch.device("meta"):
        expected = {k: v.shape for k, v in GPT(cfg).state_dict().items() if not (cfg.tie_embeddings and k == TIED_HEAD)}
    missing, unexpected = sorted(expected.keys() - sd.keys()), sorted(sd.keys() - expected.keys())
    if missing or unexpected:
        raise HFImportError(f"{directory}: the weights do not fit {where} (missing {missing[:4]}, unexpected "
                            f"{unexpected[:4]}); biases or other extra tensors are not supported")
    for k, shape in expected.items():
        if sd[k].shape != shape:
            raise HFImportError(f"{directory}: tensor {k} has shape {tuple(sd[k].shape)}, {where} implies {tuple(shape)}")
    return cfg, {k: v.float().contiguous() for k, v in sd.items()}, tok, layout


def import_hf(source: str, out: str | os.PathLike) -> Path:
    """Import HF checkpoint ``source`` (a directory or a Hub repo id) as codechat checkpoint ``out``.

    Written under ``.tmp-NAME`` beside ``out`` and renamed when complete. Returns ``out``.

    Raises:
        HFImportError: see :func:`locate` and :func:`convert`.
    """
    from safetensors.torch import save_file
    directory = locate(source)
    cfg, sd, tok, layout = convert(directory)
    dst = Path(out)
    layout["new_rows_init"] = "mean of the existing rows (embedding and untied head)"
    state = {"step": 0, "meta": {"stage": STAGE, "model": to_dict(cfg), "source": PREFIX + source,
                                 "resolved": str(directory), "vocab_layout": layout}}
    with write_dir(dst) as tmp:
        save_file(sd, tmp / "model.safetensors", metadata={"format": "pt", "source": PREFIX + source})
        (tmp / "state.json").write_text(json.dumps(state, indent=1))
        tok.save(tmp / "tokenizer")
    return dst


def imported_from(directory: Path) -> str | None:
    """The ``hf:`` source an earlier :func:`import_hf` wrote into ``directory``, or None."""
    try:
        meta = json.loads((directory / "state.json").read_text())["meta"]
    except (OSError, ValueError, KeyError):
        return None
    return meta.get("source") if meta.get("stage") == STAGE else None
