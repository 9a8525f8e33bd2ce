"""Pretraining throughput of a preset on the current device: tokens/s and MFU.

Runs the real trainer step (bf16 autocast and fused AdamW on CUDA, fp32 on CPU) on random
tokens, after warm-up steps, and prints one line per figure.

    python benchmarks/pretrain_throughput.py --preset d20 [--steps 20] [--compile]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from codechat.config import OptimConfig, RunConfig, TrainConfig, pretrain_recipe, replace
from codechat.device import peak_flops, resolve_device
from codechat.model import build_model
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
    args = ap.parse_args()

    recipe = pretrain_recipe(args.preset)
    device = resolve_device(args.device)
    mbs = args.micro_batch_size or recipe.train.micro_batch_size
    seq = args.seq_len or recipe.data.seq_len
    cfg = replace(recipe.model, vocab_size=args.vocab_size)
    model = build_model(cfg, device)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(model, train=TrainConfig(micro_batch_size=mbs, max_steps=1, compile=args.compile),
                          optim=OptimConfig(warmup_steps=0), run=RunConfig(out=tmp), out_dir=Path(tmp),
                          batches=RandomTokens(cfg.vocab_size, mbs, seq), show_progress=False)
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
    tps = args.steps * mbs * seq / dt
    fpt = model.flops_per_token(seq)
    peak = peak_flops(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name}; preset {args.preset}: {model.num_params() / 1e6:.1f}M params, batch {mbs}x{seq}, "
          f"compile={args.compile}")
    print(f"tokens_per_s: {tps:,.0f}")
    print(f"achieved_tflops: {tps * fpt / 1e12:.1f}")
    print(f"mfu: {tps * fpt / peak:.1%}" if peak else "mfu: n/a (no known peak for this device)")
    if device.type == "cuda":
        print(f"peak_memory_gib: {torch.cuda.max_memory_allocated() / 2**30:.1f}")


if __name__ == "__main__":
    main()
