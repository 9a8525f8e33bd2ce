"""Compile warm-ups: a stage's ``torch.compile`` graphs built ahead of the stage, in another process.

``torch.compile`` keeps what it compiles in on-disk caches (Inductor's FX graphs, AOTAutograd's,
Triton's kernels), keyed by the graph and its input shapes, not by the weights. So a process that
runs one training step of a stage's model and batch shapes on random tokens leaves behind what the
stage would compile at its first step, and the stage, started later in another process, loads it
instead. The speedrun warms pretraining while it builds its tokenizer and corpus, and chat SFT while
it pretrains (``benchmarks/RESULTS.md``: the first step, the compile, took 46-50 s of a 9-minute
GPU run's pretraining and ~24 s of its 56 s of chat SFT). The stages' own warm-ups:
:func:`codechat.train.pretrain.warm_compile`, :func:`codechat.train.sft.warm_compile`.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from codechat.config.stages import TrainConfig, _check
from codechat.parallel.world import World, init_world
from ..data.batch import Batch
from .trainer import Trainer


def warm_compile_trainer(train: TrainConfig, device: str,
                         build: Callable[[World, Path], tuple[Trainer, list[Batch]]]) -> float:
    """Run what :meth:`Trainer.fit` runs first, the evaluation of step 0 and one training step, on the
    trainer and micro-batches that ``build(world, tmp)`` returns (its directory ``tmp`` is temporary:
    nothing is written but torch's caches). One process only (no ``torchrun``). Returns the wall
    time in seconds.

    Raises:
        ConfigError: ``train.compile`` is off (nothing to warm), or this runs under ``torchrun``.
    """
    _check(train.compile, "warm_compile: train.compile is off, nothing to compile")
    _check("WORLD_SIZE" not in os.environ, "warm_compile runs in one process, not under torchrun")
    t0 = time.perf_counter()
    world = init_world(device, train.pp)
    with tempfile.TemporaryDirectory(prefix="codechat-warm-compile-") as tmp:
        trainer, micro_batches = build(world, Path(tmp))
        trainer.run_eval()
        trainer.train_step(micro_batches)
        if world.device.type == "cuda":
            torch.cuda.synchronize(world.device)
    return time.perf_counter() - t0
