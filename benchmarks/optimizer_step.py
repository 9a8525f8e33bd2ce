"""Cost of a pretraining step with Muon or 8-bit AdamW against AdamW, on the current device.

Runs the real trainer step of a preset's recipe (the ``tiny`` one by default: Muon, 4 x 512 tokens,
vocab 4,096 as in the speedrun) on random tokens, with four optimizers built from the same
initial weights: AdamW, Muon with its Newton-Schulz iteration in fp32, Muon in bf16 (what
``torch.optim.Muon`` always does) and torchao's 8-bit AdamW (``adamw8bit``; its compiles happen in
the warm-up steps). Timed rounds alternate between them so that a machine whose
speed drifts (neighbours on a VM) affects all alike; each figure is the median over rounds.
Prints tokens/s per optimizer, the step-time ratio of each to AdamW and each one's optimizer-state
bytes per parameter.

    python benchmarks/optimizer_step.py [--preset tiny] [--rounds 8] [--steps 5] [--device cpu]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from codechat.config.device import resolve_device
from codechat.config.stages import RunConfig, TrainConfig, pretrain_recipe, replace
from codechat.model import build_model
from codechat.train.trainer import Trainer
from pretrain_throughput import RandomTokens

VARIANTS = {"adamw": dict(name="adamw"), "muon_fp32": dict(name="muon", muon_ns_dtype="fp32"),
            "muon_bf16": dict(name="muon", muon_ns_dtype="bf16"), "adamw8bit": dict(name="adamw8bit")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=8, help="timed rounds per optimizer, interleaved")
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps per round")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()

    recipe = pretrain_recipe(args.preset)
    device = resolve_device(args.device)
    mbs, seq = recipe.train.micro_batch_size, recipe.data.seq_len
    accum = recipe.train.accum_steps(1)
    cfg = replace(recipe.model, vocab_size=args.vocab_size)
    torch.manual_seed(0)
    init = build_model(cfg, device).state_dict()
    data = RandomTokens(cfg.vocab_size, mbs, seq)
    batches = [data.next_batch() for _ in range(4 * accum)]
    trainers, times = {}, {k: [] for k in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for name, over in VARIANTS.items():
            model = build_model(cfg, device)
            model.load_state_dict(init)
            trainers[name] = Trainer(model, train=TrainConfig(micro_batch_size=mbs, max_steps=1),
                                     optim=replace(recipe.optim, warmup_steps=0, **over), run=RunConfig(out=tmp),
                                     out_dir=Path(tmp), batches=data, show_progress=False)
            for i in range(args.warmup):
                trainers[name].train_step(batches[(i * accum) % len(batches):][:accum])
        for r in range(args.rounds):
            for name, tr in trainers.items():
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                for i in range(args.steps):
                    tr.train_step(batches[(i * accum) % len(batches):][:accum])
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times[name].append((time.perf_counter() - t0) / args.steps)
    step = {k: statistics.median(v) for k, v in times.items()}
    tokens = mbs * accum * seq
    print(f"device: {device}; preset {args.preset}, {tokens} tokens/step, {args.rounds} rounds x {args.steps} steps")
    for name, s in step.items():
        print(f"{name}_tokens_per_s: {tokens / s:,.0f}  (step {s * 1e3:.1f} ms)")
    for name in step:
        if name != "adamw":
            print(f"{name}_step_over_adamw: {step[name] / step['adamw']:.2f}")
    for name, tr in trainers.items():
        n = sum(p.numel() for p in tr.model.parameters())
        print(f"{name}_state_bytes_per_param: {state_bytes_held(tr.optimizer) / n:.3f}")


def state_bytes_held(optimizer: Any) -> int:
    """Bytes of every tensor in ``optimizer``'s state (an 8-bit moment's codes, scales and table)."""
    parts = [optimizer.muon, optimizer.adamw] if hasattr(optimizer, "muon") else [optimizer]
    total = 0
    for part in parts:
        for s in part.state.values():
            for t in s.values():
                pieces = (t.codes, t.scale, t.qmap) if hasattr(t, "codes") else (t,)
                total += sum(x.numel() * x.element_size() for x in pieces if x.dim() > 0)
    return total


if __name__ == "__main__":
    main()
