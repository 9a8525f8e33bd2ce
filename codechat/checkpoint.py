"""Checkpoints: atomic save, newest-first discovery, pruning, and loads with clear errors.

Layout of one checkpoint (a directory, so a stage's checkpoints sort by name)::

    DIR/checkpoints/step_000500/
        model.pt      model state dict (fp32 tensors)
        optim.pt      optimizer state dict
        state.json    step, schedule position, data-loader position, configs, metrics
        rng.pt        torch / numpy / python RNG states
        tokenizer/    the tokenizer, so the checkpoint is self-contained

A checkpoint is written under ``.tmp-step_000500`` and renamed when complete, so a crash
mid-write never leaves a directory that looks finished.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

STEP_DIR = re.compile(r"^step_(\d+)$")
REQUIRED = ("model.pt", "state.json")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated or does not match the run; the message names the file."""


def step_dir(checkpoints: Path, step: int) -> Path:
    return checkpoints / f"step_{step:06d}"


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(checkpoints: Path, step: int, *, model: dict[str, torch.Tensor], state: dict[str, Any],
         optim: dict[str, Any] | None = None, tokenizer_dir: Path | None = None, keep_last: int = 0) -> Path:
    """Write checkpoint ``step`` atomically and keep only the newest ``keep_last`` (0: all).

    Returns the final checkpoint directory.
    """
    final = step_dir(checkpoints, step)
    tmp = checkpoints / f".tmp-{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(model, tmp / "model.pt")
    if optim is not None:
        torch.save(optim, tmp / "optim.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    if tokenizer_dir is not None:
        shutil.copytree(tokenizer_dir, tmp / "tokenizer")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    if keep_last:
        for old in list_checkpoints(checkpoints)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(checkpoints: Path) -> list[Path]:
    """Finished checkpoint directories under ``checkpoints``, oldest first."""
    if not checkpoints.is_dir():
        return []
    found = [p for p in checkpoints.iterdir() if p.is_dir() and STEP_DIR.match(p.name)]
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


def resolve(path: str | os.PathLike) -> Path:
    """The checkpoint directory meant by ``path``: a checkpoint, a ``checkpoints/`` folder or a stage dir.

    A folder of checkpoints or a stage directory means its newest checkpoint.

    Raises:
        CheckpointError: nothing there, or no finished checkpoint in it.
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p}: no such checkpoint or run directory")
    if (p / "state.json").is_file() or (p / "model.pt").is_file():
        return p
    for folder in (p / "checkpoints", p):
        found = list_checkpoints(folder)
        if found:
            return found[-1]
    raise CheckpointError(f"{p}: holds no checkpoint (expected {p}/checkpoints/step_NNNNNN/)")


def load(path: str | os.PathLike, *, map_location: str | torch.device = "cpu", with_optim: bool = False
         ) -> dict[str, Any]:
    """Read a checkpoint: ``{"dir", "state", "model", "optim"?, "rng"?}``.

    Raises:
        CheckpointError: a missing or truncated file, named in the message.
    """
    d = resolve(path)
    for name in REQUIRED:
        if not (d / name).is_file():
            raise CheckpointError(f"{d / name}: missing; the checkpoint is incomplete")
    try:
        state = json.loads((d / "state.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{d / 'state.json'}: not valid JSON ({e}); the checkpoint is corrupt") from None
    out: dict[str, Any] = {"dir": d, "state": state, "model": _torch_load(d / "model.pt", map_location)}
    if with_optim:
        if not (d / "optim.pt").is_file():
            raise CheckpointError(f"{d / 'optim.pt'}: missing; cannot resume the optimizer from {d}")
        out["optim"] = _torch_load(d / "optim.pt", map_location)
        out["rng"] = _torch_load(d / "rng.pt", "cpu") if (d / "rng.pt").is_file() else None
    return out


def _torch_load(f: Path, map_location: str | torch.device) -> Any:
    try:
        return torch.load(f, map_location=map_location, weights_only=False)
    except Exception as e:  # truncated zip, bad pickle, wrong format: all mean "this file is broken"
        raise CheckpointError(f"{f}: cannot be read ({type(e).__name__}: {e}); the file is truncated or "
                              "corrupt — delete this checkpoint to resume from the one before it") from None


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu"):
    """Model and tokenizer of a checkpoint (or of a stage directory's newest checkpoint), in eval mode.

    Returns ``(model, tokenizer, state)``.

    Raises:
        CheckpointError: unreadable checkpoint, or weights that do not fit the saved model config.
    """
    from .config import ModelConfig, build
    from .model import build_model
    from .tokenizer import Tokenizer

    c = load(path, map_location=device)
    d = c["dir"]
    try:
        cfg = build(ModelConfig, c["state"]["meta"]["model"])
    except KeyError:
        raise CheckpointError(f"{d / 'state.json'}: has no meta.model (not a codechat checkpoint?)") from None
    model = build_model(cfg, device)
    try:
        model.load_state_dict(c["model"])
    except RuntimeError as e:
        raise CheckpointError(f"{d / 'model.pt'}: does not match its config ({e})") from None
    if not (d / "tokenizer").is_dir():
        raise CheckpointError(f"{d / 'tokenizer'}: missing; the checkpoint is incomplete")
    return model.eval(), Tokenizer.load(d / "tokenizer"), c["state"]
