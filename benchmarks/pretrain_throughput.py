"""Pretraining throughput of a preset on the current device: tokens/s and MFU.

Runs the real trainer step (bf16 autocast and fused AdamW on CUDA, fp32 on CPU) on random
tokens, after warm-up steps, and prints one line per figure.

    python benchmarks/pretrain_throughput.py --preset d20 [--steps 20] [--compile]
    torchrun --standalone --nproc_per_node=1 benchmarks/pretrain_throughput.py --preset 1b --compile --parallel fsdp

Under ``torchrun`` the model is wrapped for ``--parallel`` even in a world of one (NCCL on CUDA),
so the DDP / FSDP paths can be timed against the plain one on a single GPU; ``--ac full``
recomputes every block in the backward pass. Figures: ``tokens_per_s`` (all ranks), ``mfu``,
``peak_memory_gib`` (``torch.cuda.max_memory_allocated`` over the timed steps, rank 0) and
``plan_tensors_gib`` (the memory planner's peak of tensors for the same settings, margin left out,
:mod:`codechat.train.plan`) with their ratio ``plan_over_measured``.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from codechat.config import PARALLEL_STRATEGIES, OptimConfig, RunConfig, TrainConfig, pretrain_recipe, replace
from codechat.device import peak_flops
from codechat.model import build_model
from codechat.parallel import init_world
from codechat.train.plan import GIB, estimate, plan_config
from codechat.train.trainer import Trainer


class RandomTokens:
    def __init__(self, vocab: int, batch: int, seq_len: int) -> None:
        self.vocab, self.batch, self.seq_len = vocab, batch, seq_len

    def next_batch(self):
        t = torch.randint(0, self.vocab, (self.batch, self.seq_len + 1))
        return t[:, :-1], t[:, 1:]

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--vocab-size", type=int, default=32768)
    ap.add_argument("--micro-batch-size", type=int, help="default: the preset's recipe")
    ap.add_argument("--seq-len", type=int, help="default: the preset's recipe")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--parallel", default="ddp", choices=PARALLEL_STRATEGIES, help="layout under torchrun")
    ap.add_argument("--ac", default="none", choices=["none", "full"], help="activation checkpointing")
    args = ap.parse_args()

    recipe = pretrain_recipe(args.preset)
    world = init_world(args.device)
    device = world.device
    mbs = args.micro_batch_size or recipe.train.micro_batch_size
    seq = args.seq_len or recipe.data.seq_len
    cfg = replace(recipe.model, vocab_size=args.vocab_size)
    model = build_model(cfg, device)
    train = TrainConfig(micro_batch_size=mbs, batch_size=mbs * world.size, max_steps=1, compile=args.compile,
                        parallel=args.parallel, ac=args.ac)
    optim = OptimConfig(warmup_steps=0)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(model, train=train, optim=optim, run=RunConfig(out=tmp), out_dir=Path(tmp),
                          batches=RandomTokens(cfg.vocab_size, mbs, seq), show_progress=False, world=world)
        batches = [trainer.batches.next_batch() for _ in range(4)]
        for i in range(args.warmup):
            trainer.train_step([batches[i % 4]])
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for i in range(args.steps):
            trainer.train_step([batches[i % 4]])
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    tps = args.steps * mbs * seq * world.size / dt
    fpt = model.flops_per_token(seq)
    peak = peak_flops(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    if not world.main:
        return
    layout = f"{trainer.par.strategy} over {world.size}" if world.distributed else "plain (no torchrun)"
    print(f"device: {name}; preset {args.preset}: {model.num_params() / 1e6:.1f}M params, batch {mbs}x{seq}, "
          f"compile={args.compile}, {layout}, --ac {args.ac}")
    print(f"tokens_per_s: {tps:,.0f}")
    print(f"achieved_tflops: {tps * fpt / 1e12:.1f}")
    print(f"mfu: {tps * fpt / peak:.1%}" if peak else "mfu: n/a (no known peak for this device)")
    if device.type == "cuda":
        measured = torch.cuda.max_memory_allocated() / GIB
        plan = estimate(plan_config(cfg, train, optim, seq, gpus=world.size, parallel=args.parallel,
                                    ac=args.ac)).tensors / GIB
        print(f"peak_memory_gib: {measured:.2f}")
        print(f"plan_tensors_gib: {plan:.2f}")
        print(f"plan_over_measured: {plan / measured:.3f}")


if __name__ == "__main__":
    main()
