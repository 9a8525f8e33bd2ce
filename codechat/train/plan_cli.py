"""``codechat plan``: the memory planner (:mod:`codechat.train.plan`) on the command line."""
from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from .plan import AC_MODES, DEFAULT_GPU_MEM_GIB, DTYPE_BYTES, FP32, STRATEGIES, estimate, fits, format_plan, plan_config
from .plan_check import device_memory_gib


def add_cli(sub: Any) -> None:
    """Register ``codechat plan`` on the ``codechat`` subparsers."""
    from codechat.config.lora import PEFT_METHODS
    from codechat.config.stages import PRESETS
    p = sub.add_parser("plan", help="estimate per-GPU memory of a training layout (no GPU needed)",
                       description="Per-GPU memory (weights, grads, optimizer, master copy, activations, logits, "
                                   "buffers, margin) of pretraining --preset under DDP, FSDP, HSDP and --pp stages, "
                                   "a verdict against --gpu-mem-gb and a recommendation. Training settings are spelled "
                                   "as in `codechat pretrain` (--train.micro_batch_size 1 --data.seq_len 2048 "
                                   "--optim.name muon); --peft lora plans LoRA adapters (--lora.rank, --lora.targets, "
                                   "--lora.dropout as in `codechat sft`) on a frozen base. When nothing fits, the "
                                   "recommendation says what fits with --peft lora and with --optim.name adamw8bit. "
                                   "The vocabulary is the tokenizer's (--data.tokenizer_dir) or "
                                   "the one pretraining would train (--data.vocab_size), unless --model.vocab_size "
                                   "is given. Exit code 0: fits, 1: does not.")
    p.add_argument("--preset", default="tiny", choices=list(PRESETS), help="model shape and its recipe (default tiny)")
    p.add_argument("--config", help="YAML file of settings, applied over the preset")
    p.add_argument("--gpus", type=int, default=1, help="world size (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs of one node, HSDP's shard group (default 8)")
    p.add_argument("--parallel", choices=STRATEGIES, default="ddp", help="data-parallel strategy (default ddp)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (default 1)")
    p.add_argument("--ac", choices=AC_MODES, default="none", help="activation checkpointing (default none)")
    p.add_argument("--gpu-mem-gb", type=float,
                   help="memory of one GPU in GiB (default: this machine's CUDA device, else "
                        f"{DEFAULT_GPU_MEM_GIB:.0f})")
    p.add_argument("--param-dtype", choices=list(DTYPE_BYTES), default="fp32", help="stored weights (default fp32, "
                   "codechat's trainer; the seed: bf16)")
    p.add_argument("--grad-dtype", choices=list(DTYPE_BYTES), help="stored gradients (default: the weights' dtype)")
    p.add_argument("--master-weights", action="store_true", help="an fp32 master copy of bf16 weights (the seed's)")
    p.add_argument("--peft", choices=PEFT_METHODS, default="none",
                   help="none (every weight trains, default) or lora (adapters of --lora.* on a frozen bf16 base)")
    p.add_argument("--torchrun", action="store_true", help="a torchrun world: the DDP/FSDP wrapper is in place even "
                   "at --gpus 1 (DDP's gradient buckets counted); more than one GPU implies it")
    p.set_defaults(func=_cmd_plan, accepts_overrides=True)


def _cmd_plan(args: argparse.Namespace, overrides: dict[str, str]) -> int:
    from codechat.config.stages import PretrainConfig, load, pretrain_recipe
    # the layout flags are the plan's own; the training config sees the strategy (train.cpu_offload checks it)
    run = load(PretrainConfig, args.config, {**overrides, "train.parallel": args.parallel},
               base=pretrain_recipe(args.preset))
    model = run.model
    if "model.vocab_size" not in overrides:  # pretraining takes the vocabulary from its tokenizer
        from ..tokenizer import Tokenizer
        vocab = Tokenizer.load(run.data.tokenizer_dir).vocab_size if run.data.tokenizer_dir else run.data.vocab_size
        model = replace(model, vocab_size=vocab)
    mem = args.gpu_mem_gb if args.gpu_mem_gb is not None else (device_memory_gib() or DEFAULT_GPU_MEM_GIB)
    cfg = plan_config(model, run.train, run.optim, run.data.seq_len, run.lora if args.peft == "lora" else None,
                      distributed=args.torchrun, gpus=args.gpus,
                      gpus_per_node=args.gpus_per_node, parallel=args.parallel, pp=args.pp, ac=args.ac,
                      gpu_mem_gib=mem, param_bytes=DTYPE_BYTES[args.param_dtype],
                      grad_bytes=DTYPE_BYTES[args.grad_dtype or args.param_dtype],
                      master_bytes=FP32 if args.master_weights else 0)
    print(format_plan(cfg))
    return 0 if fits(cfg, estimate(cfg)) else 1
