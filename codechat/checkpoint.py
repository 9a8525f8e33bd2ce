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

Every command's ``--model`` (and a stage's ``--init``) goes through :func:`resolve`: a checkpoint, a
stage directory (its newest checkpoint) or a run directory (its last code stage: ``rl/``, else
``sft/``, else ``pretrain/``, the pick logged).

Under ``torchrun`` every rank writes its part of a sharded checkpoint in parallel
(``torch.distributed.checkpoint``, :func:`save_sharded`): ``dcp/`` (``.metadata`` plus one file per
rank) replaces ``model.pt`` and ``optim.pt``; it holds ``{"model": {name: tensor}, "optim": {name:
{state: tensor}}}`` (FSDP shards, pipeline stages and replicas alike; a tied LM head stored once, as
the embedding), and ``state.json``, ``rng.pt`` and ``tokenizer/`` are rank 0's. Any layout and world
size, one process included, reads it back whole (:func:`load_sharded`, no process group needed):
resuming, ``--init``, sampling and export treat both kinds the same. One process writes
``model.pt`` / ``optim.pt``.

:func:`export` (``codechat export``) writes the consolidated form every command also loads::

    OUT/model.safetensors   the weights (as trained; a tied LM head stored once, as the embedding)
    OUT/state.json          step and meta (model config, stage); no optimizer or data position
    OUT/tokenizer/

A LoRA checkpoint (``--peft lora``, :mod:`codechat.peft.lora`) holds the adapters only (and their optimizer
state); its ``meta.peft`` names the base (a checkpoint directory, itself possibly LoRA) and fingerprints
it. :func:`load_model` loads the base, refuses one of another shape or other weights, and merges the
adapters into it in memory, so every command that loads a model takes such a checkpoint; :func:`export`
with ``merge`` writes the merged weights as a plain checkpoint (:func:`load_merged`).
"""
from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from codechat.config.atomic import write_dir

STEP_DIR = re.compile(r"^step_(\d+)$")
DCP_DIR = "dcp"  # a sharded checkpoint's torch.distributed.checkpoint files
WEIGHT_FILES = ("model.pt", "model.safetensors")  # a training checkpoint's, an export's
TIED_HEAD = "lm_head.weight"  # a tied LM head is the embedding: stored once, under EMBEDDING's name
EMBEDDING = "embed_tokens.weight"
#: A run directory's code stages, last first: ``--model RUN`` means the first holding a checkpoint.
CODE_STAGES = ("rl", "sft", "pretrain")
#: ``codechat funcall`` (and the funcall evaluation) looks for the function-calling stage first.
FUNCALL_STAGES = ("funcall", *CODE_STAGES)

log = logging.getLogger(__name__)


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
    return _finish(tmp, final, state, tokenizer_dir, keep_last)


def save_sharded(checkpoints: Path, step: int, *, shards: dict[str, Any], state: dict[str, Any], main: bool,
                 barrier: Callable[[], None], tokenizer_dir: Path | None = None, keep_last: int = 0) -> Path:
    """Write checkpoint ``step`` from every rank at once (a collective: every rank calls it with its
    ``shards``, ``{"model": ..., "optim": ...}``); rank ``main`` adds the rest and renames it when
    every rank is done. Returns the final checkpoint directory."""
    import torch.distributed.checkpoint as dcp
    final = step_dir(checkpoints, step)
    tmp = checkpoints / f".tmp-{final.name}"
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    dcp.save(shards, checkpoint_id=tmp / DCP_DIR)
    barrier()
    return _finish(tmp, final, state, tokenizer_dir, keep_last) if main else final


def is_sharded(d: Path) -> bool:
    """Whether checkpoint ``d`` was written by :func:`save_sharded`."""
    return (d / DCP_DIR / ".metadata").is_file()


def load_sharded(d: Path, template: dict[str, Any]) -> dict[str, Any]:
    """Fill ``template`` (whole, unsharded tensors of the names wanted, e.g. ``{"model": {...}}``)
    from sharded checkpoint ``d`` in this process alone, whatever layout wrote it; returns it.

    Raises:
        CheckpointError: unreadable files, or names and shapes that are not the checkpoint's.
    """
    import warnings

    import torch.distributed.checkpoint as dcp
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", message=".*load in a single process")
            dcp.load(template, checkpoint_id=d / DCP_DIR, no_dist=True)
    except Exception as e:  # DCP wraps every failure (missing key, bad shape, truncated file) in one type
        raise CheckpointError(f"{d / DCP_DIR}: cannot be read into this model ({type(e).__name__}: "
                              f"{str(e)[:500]})") from None
    return template


def _finish(tmp: Path, final: Path, state: dict[str, Any], tokenizer_dir: Path | None, keep_last: int) -> Path:
    """RNG, ``state.json`` and the tokenizer into ``tmp``, then rename it ``final`` and prune."""
    checkpoints = final.parent
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


def _checkpoint_in(p: Path) -> Path | None:
    """The checkpoint ``p`` means when it is a checkpoint, an export, a ``checkpoints/`` folder or a
    stage directory (a folder of checkpoints means its newest); None when it holds none."""
    if (p / "state.json").is_file() or any((p / f).is_file() for f in WEIGHT_FILES):
        return p
    for folder in (p / "checkpoints", p):
        found = list_checkpoints(folder)
        if found:
            return found[-1]
    return None


def resolve(path: str | os.PathLike, stages: tuple[str, ...] = CODE_STAGES) -> Path:
    """The checkpoint directory meant by ``path`` — what every ``--model`` and ``--init`` goes through.

    ``path`` is a checkpoint (or an export), a ``checkpoints/`` folder, a stage directory (its newest
    checkpoint), or a run directory such as a speedrun's output: the first of its ``stages``
    subfolders (default :data:`CODE_STAGES`: ``rl/``, else ``sft/``, else ``pretrain/``) that holds a
    checkpoint, which is logged (``codechat: RUN is a run directory: using its rl/ stage, CKPT``).

    Raises:
        CheckpointError: nothing there, or no finished checkpoint in it (nor in its ``stages``).
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p}: no such checkpoint or run directory")
    found = _checkpoint_in(p)
    if found is not None:
        return found
    present = [s for s in stages if (p / s).is_dir()]
    for stage in present:
        found = _checkpoint_in(p / stage)
        if found is not None:
            log.info("%s is a run directory: using its %s/ stage, %s", p, stage, found)
            return found
    if present:
        raise CheckpointError(f"{p}: a run directory whose {', '.join(s + '/' for s in present)} hold no checkpoint "
                              f"(expected e.g. {p / present[0]}/checkpoints/step_NNNNNN/)")
    raise CheckpointError(f"{p}: holds no checkpoint (expected {p}/checkpoints/step_NNNNNN/)")


def load(path: str | os.PathLike, *, map_location: str | torch.device = "cpu", with_optim: bool = False
         ) -> dict[str, Any]:
    """Read the checkpoint ``path`` means (:func:`resolve`: a checkpoint, stage or run directory):
    ``{"dir", "state", "model", "optim"?, "rng"?}``.

    Raises:
        CheckpointError: a missing or truncated file, named in the message.
    """
    d = resolve(path)
    if is_sharded(d):
        return _load_sharded_model(d, with_optim)
    weights = next((d / f for f in WEIGHT_FILES if (d / f).is_file()), d / WEIGHT_FILES[0])
    for f in (weights, d / "state.json"):
        if not f.is_file():
            raise CheckpointError(f"{f}: missing; the checkpoint is incomplete")
    try:
        state = json.loads((d / "state.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{d / 'state.json'}: not valid JSON ({e}); the checkpoint is corrupt") from None
    if weights.suffix == ".safetensors":
        model = _safetensors_load(weights, map_location, state)
    else:
        model = _torch_load(weights, map_location)
    out: dict[str, Any] = {"dir": d, "state": state, "model": model}
    if with_optim:
        if not (d / "optim.pt").is_file():
            raise CheckpointError(f"{d / 'optim.pt'}: missing; cannot resume the optimizer from {d}")
        out["optim"] = _torch_load(d / "optim.pt", map_location)
        out["rng"] = _torch_load(d / "rng.pt", "cpu") if (d / "rng.pt").is_file() else None
    return out


def _load_sharded_model(d: Path, with_optim: bool) -> dict[str, Any]:
    """:func:`load` of a sharded checkpoint: the whole model read into a CPU model built from its config
    (about the model's size in memory); ``"optim"`` is None (the trainer reads it with its optimizer)."""
    from codechat.config.stages import ModelConfig, build
    from .model import build_model
    f = d / "state.json"
    if not f.is_file():
        raise CheckpointError(f"{f}: missing; the checkpoint is incomplete")
    state = json.loads(f.read_text())
    try:
        cfg = build(ModelConfig, state["meta"]["model"])
    except KeyError:
        raise CheckpointError(f"{f}: has no meta.model (not a codechat checkpoint?)") from None
    peft = state["meta"].get("peft")
    if peft is not None:  # the adapters only: the shapes from a model on the meta device, the tensors on the CPU
        from codechat.config.lora import LoraConfig
        from codechat.peft.lora import adapter_state_dict, apply_lora
        shapes = build_model(cfg, "meta")
        apply_lora(shapes, build(LoraConfig, peft["lora"]))
        sd = {k: torch.empty(v.shape, dtype=v.dtype) for k, v in adapter_state_dict(shapes).items()}
    else:
        sd = build_model(cfg, "cpu").state_dict()
    tied = cfg.tie_embeddings and peft is None
    model = load_sharded(d, {"model": {k: v for k, v in sd.items() if not (tied and k == TIED_HEAD)}})["model"]
    if tied:
        model[TIED_HEAD] = model[EMBEDDING]
    out: dict[str, Any] = {"dir": d, "state": state, "model": model}
    if with_optim:
        out["optim"] = None
        out["rng"] = _torch_load(d / "rng.pt", "cpu") if (d / "rng.pt").is_file() else None
    return out


def _tied(state: dict[str, Any]) -> bool:
    """Whether the model of a checkpoint's ``state.json`` ties its LM head to the embedding."""
    return bool(state.get("meta", {}).get("model", {}).get("tie_embeddings"))


def _safetensors_load(f: Path, map_location: str | torch.device, state: dict[str, Any]) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    try:
        sd = load_file(f, device=str(map_location))
    except Exception as e:  # truncated header, bad JSON: the file is broken
        raise CheckpointError(f"{f}: cannot be read ({type(e).__name__}: {e}); the file is truncated or corrupt") from None
    if _tied(state) and TIED_HEAD not in sd and EMBEDDING in sd:  # (an export of LoRA adapters has neither)
        sd[TIED_HEAD] = sd[EMBEDDING]
    return sd


def export(path: str | os.PathLike, out: str | os.PathLike, merge: bool = False) -> Path:
    """Write the checkpoint at ``path`` (:func:`resolve`: a stage directory means its newest, a run
    directory its last code stage's) as a consolidated
    directory ``out`` (module docstring): one process, on the CPU, with about the model's size in
    host memory. Written under ``.tmp-NAME`` beside ``out`` and renamed when complete. A LoRA
    checkpoint is written as it is (its adapters, naming its base), or with ``merge`` as the plain
    merged weights (:func:`load_merged`).

    Raises:
        CheckpointError: an unreadable checkpoint, ``out`` exists and is not an earlier export, or
            ``merge`` of a checkpoint without adapters.
    """
    from safetensors.torch import save_file
    c = load_merged(path) if merge else load(path, map_location="cpu")
    dst = Path(out)
    if dst.exists() and not (dst / "model.safetensors").is_file():
        raise CheckpointError(f"--out {dst}: exists and is not an export; choose a new directory")
    tied = _tied(c["state"])
    sd = {k: v.detach().contiguous() for k, v in c["model"].items() if not (tied and k == TIED_HEAD)}
    with write_dir(dst) as tmp:
        save_file(sd, tmp / "model.safetensors", metadata={"format": "pt", "source": str(c["dir"])})
        state = {"step": c["state"].get("step"), "meta": c["state"].get("meta", {}), "exported_from": str(c["dir"])}
        (tmp / "state.json").write_text(json.dumps(state, indent=1))
        if (c["dir"] / "tokenizer").is_dir():
            shutil.copytree(c["dir"] / "tokenizer", tmp / "tokenizer")
    return dst


def _torch_load(f: Path, map_location: str | torch.device) -> Any:
    try:
        return torch.load(f, map_location=map_location, weights_only=False)
    except Exception as e:  # truncated zip, bad pickle, wrong format: all mean "this file is broken"
        raise CheckpointError(f"{f}: cannot be read ({type(e).__name__}: {e}); the file is truncated or "
                              "corrupt — delete this checkpoint to resume from the one before it") from None


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu"):
    """Model and tokenizer of a checkpoint (or of a stage directory's newest checkpoint, or of a run
    directory's last code stage: :func:`resolve`), in eval mode.

    Returns ``(model, tokenizer, state)``.

    Raises:
        CheckpointError: unreadable checkpoint, or weights that do not fit the saved model config.
    """
    from .tokenizer import Tokenizer
    model, c = _load_model(path, device)
    d = c["dir"]
    if not (d / "tokenizer").is_dir():
        raise CheckpointError(f"{d / 'tokenizer'}: missing; the checkpoint is incomplete")
    return model.eval(), Tokenizer.load(d / "tokenizer"), c["state"]


def _load_model(path: str | os.PathLike, device: str | torch.device) -> tuple[Any, dict[str, Any]]:
    """The model of checkpoint ``path`` (a LoRA checkpoint's adapters merged into its base) and what
    :func:`load` read of it.

    Raises:
        CheckpointError: unreadable checkpoint, weights that do not fit the saved config, a LoRA base that
            is missing. ConfigError: a LoRA base of another shape or with other weights.
    """
    from codechat.config.stages import ModelConfig, build
    from .model import build_model
    c = load(path, map_location=device)
    d = c["dir"]
    try:
        cfg = build(ModelConfig, c["state"]["meta"]["model"])
    except KeyError:
        raise CheckpointError(f"{d / 'state.json'}: has no meta.model (not a codechat checkpoint?)") from None
    peft = c["state"]["meta"].get("peft")
    if peft is not None:
        return _merged(c, peft, device), c
    model = build_model(cfg, device)
    try:
        model.load_state_dict(c["model"])
    except RuntimeError as e:
        raise CheckpointError(f"{d}: the weights do not match its config ({e})") from None
    return model, c


def _merged(c: dict[str, Any], peft: dict[str, Any], device: str | torch.device) -> Any:
    """The base ``peft["base"]`` names, checked against its fingerprint, with the adapters of checkpoint
    ``c`` merged in (:func:`codechat.peft.lora.merge_lora`)."""
    from codechat.config.lora import LoraConfig
    from codechat.config.stages import build
    from codechat.peft.lora import adapter_state_dict, apply_lora, check_base, merge_lora
    d = c["dir"]
    try:
        base, _ = _load_model(peft["base"], device)
    except CheckpointError as e:
        raise CheckpointError(f"{d}: its LoRA base (meta.peft.base) cannot be loaded: {e}") from None
    check_base(base.state_dict(), peft, str(d))
    apply_lora(base, build(LoraConfig, peft["lora"]))
    if set(c["model"]) != set(adapter_state_dict(base)):
        raise CheckpointError(f"{d}: its adapters do not fit its meta.peft.lora settings on the base")
    base.load_state_dict(c["model"], strict=False)
    return merge_lora(base)


def load_merged(path: str | os.PathLike) -> dict[str, Any]:
    """:func:`load` of LoRA checkpoint ``path`` as a plain one, on the CPU: ``model`` the merged weights,
    ``state.meta`` without ``peft`` (``merged_onto``: the base it named).

    Raises:
        CheckpointError: ``path`` holds no adapters (``--merge`` needs a LoRA checkpoint), or see
            :func:`load_model`.
    """
    d = resolve(path)
    f = d / "state.json"
    if not f.is_file() or "peft" not in json.loads(f.read_text()).get("meta", {}):
        raise CheckpointError(f"--merge: {d} has no LoRA adapters (no meta.peft in state.json) to merge; export it "
                              "without --merge")
    model, c = _load_model(d, "cpu")
    meta = dict(c["state"]["meta"])
    base = meta.pop("peft")["base"]
    return {**c, "model": model.state_dict(), "state": {**c["state"], "meta": {**meta, "merged_onto": base}}}
