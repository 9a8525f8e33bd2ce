"""Pretraining throughput of a preset on the current device: tokens/s and MFU.

Runs the real trainer step (bf16 autocast and fused AdamW on CUDA, fp32 on CPU) on random
tokens, after warm-up steps, and prints one line per figure.

    python benchmarks/pretrain_throughput.py --preset d20 [--steps 20] [--compile] [--vs-transformers]
    python benchmarks/pretrain_throughput.py --preset 1b --compile --profile 2 --trace-dir /tmp/traces
    python benchmarks/pretrain_throughput.py --preset d12 --compile --compile-scope blocks
    torchrun --standalone --nproc_per_node=1 benchmarks/pretrain_throughput.py --preset 1b --compile --parallel fsdp
    torchrun --standalone --nproc_per_node=1 benchmarks/pretrain_throughput.py --preset 1b --compile --ddp-bucket-cap-mb 25

Under ``torchrun`` the model is wrapped for ``--parallel`` even in a world of one (NCCL on CUDA),
so the DDP / FSDP paths can be timed against the plain one on a single GPU; one more step then
runs under the profiler and ``collectives_per_step`` (``nccl:all_reduce``: DDP's buckets, FSDP's
reduce-scatters and all-gathers where torch does not skip them over one rank) and
``fsdp_hooks_per_step`` (``FSDP::pre_forward``, ``FSDP::post_backward_reduce``, ...) show that the
wrapper is in place and what it did. ``--ddp-bucket-cap-mb`` sizes DDP's gradient buckets: compiled,
TorchDynamo's DDPOptimizer compiles one graph per bucket (1b: 67 at torch's 25 MiB, 16 at 200), so the bucket
size trades the all-reduce's overlap with backward against Inductor's fusion and launches.
``--no-fsdp-reshard`` keeps FSDP's gathered blocks from forward to backward (no second all-gather, the
whole model's bf16 weights held); ``--ac full``
recomputes every block in the backward pass; ``--compile-scope blocks`` compiles each block, and
the head with its loss, on its own instead of the whole model (regional compilation,
``train.compile_scope``). Figures: ``first_step_s`` (the first warm-up step: the compile included;
to compare scopes, run each with ``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``, or the second finds the
first's kernels in Inductor's cache), ``tokens_per_s`` (all ranks), ``mfu``,
``peak_memory_gib`` (``torch.cuda.max_memory_allocated`` over the timed steps, rank 0) and
``plan_tensors_gib`` (the memory planner's peak of tensors for the same settings, margin left out,
:mod:`codechat.train.plan`) with their ratio ``plan_over_measured``.

``--optim adamw8bit`` times torchao's 8-bit AdamW; ``--lora-rank R`` trains LoRA adapters of rank R on
every projection of the frozen (random) model instead of every weight (``--peft lora``): with
``plan_over_measured`` these check the planner's LoRA and 8-bit figures, e.g.

    python benchmarks/pretrain_throughput.py --preset 8b --seq-len 2048 --micro-batch-size 1 --lora-rank 16 --ac full

``--vs-transformers`` then trains the same shape as transformers' ``Qwen3ForCausalLM`` (QK-norm
on) or ``LlamaForCausalLM`` (off), from the same initial weights and on the same batches, with a
plain loop: bf16 autocast, SDPA attention, fused AdamW with the same hyper-parameters, gradient
clipping at the same norm, ``torch.compile`` of the whole model when ``--compile``; it prints the
same figures prefixed ``transformers_`` and ``ratio_tokens_per_s`` (ours / theirs). MFU counts the
same FLOPs per token for both (:meth:`codechat.model.GPT.flops_per_token`).

``--numerics-steps N`` then trains two fresh copies from the same initial weights on the same N
batches, one as timed (``--compile``) and one eager (the plain path), and prints the largest and
mean difference of their per-step losses (bf16 autocast in both: noise of order 1e-2 nats).

``--fp8 RECIPE`` then trains the same model in FP8 (``train.fp8``: torchao's ``tensorwise`` or
``rowwise`` on the blocks' linears) from the same initial weights on the same batches, at
``--fp8-micro-batch-size`` (default: the same; FP8's smaller footprint may allow more), and prints the
same figures prefixed ``fp8_`` and ``ratio_fp8_tokens_per_s`` (FP8 / bf16, same process). MFU of
both is against the bf16 peak. ``--fp8-head`` puts the LM head in FP8 too (``train.fp8_head``).

    python benchmarks/pretrain_throughput.py --preset 1b --compile --seq-len 2048 --micro-batch-size 8 \
        --fp8 tensorwise --fp8-micro-batch-size 12

``--profile N`` profiles N more trainer steps with ``torch.profiler`` and prints where the GPU
time of a step went (:mod:`pretrain_profile`); ``--trace-dir`` also writes the Chrome trace.
"""
from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from codechat.config.device import peak_flops
from codechat.config.lora import LoraConfig
from codechat.config.stages import (COMPILE_SCOPES, DDP_BUCKET_CAP_MB, FP8_RECIPES, OPTIMIZERS, PARALLEL_STRATEGIES,
                                    OptimConfig, RunConfig, TrainConfig, pretrain_recipe, replace)
from codechat.model import IGNORE_INDEX, build_model
from codechat.parallel.world import init_world
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


def timed(step: Callable[[int], None], warmup: int, steps: int, device: torch.device
          ) -> tuple[float, float, float]:
    """(seconds for ``steps`` calls of ``step(i)`` after ``warmup`` untimed ones, peak GiB allocated
    over the timed ones: 0 off CUDA, seconds of the first warmup call: ``torch.compile``'s compile
    included)."""
    cuda = device.type == "cuda"
    t0, first = time.perf_counter(), 0.0
    for i in range(warmup):
        step(i)
        if i == 0:
            if cuda:
                torch.cuda.synchronize()
            first = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0, (torch.cuda.max_memory_allocated() / GIB if cuda else 0.0), first


def transformers_step(model: torch.nn.Module, optim: OptimConfig, compile: bool, device: torch.device
                      ) -> tuple[Callable[[tuple[torch.Tensor, torch.Tensor]], None], torch.nn.Module]:
    """A plain training step for the transformers twin of ``model`` (same weights): bf16 autocast
    on CUDA, SDPA, fused AdamW (weight decay on matrices only, as ours), clipping at
    ``optim.grad_clip``; the loss is read back every step, as our trainer does."""
    from generate_throughput import to_hf  # the weight copy the generation benchmark checks
    hf = to_hf(model, torch.float32).train()
    hf.config._attn_implementation = "sdpa"
    decay = [p for p in hf.parameters() if p.dim() >= 2]
    rest = [p for p in hf.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": optim.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=optim.lr, betas=(optim.beta1, optim.beta2), eps=optim.eps, fused=device.type == "cuda")
    fwd = torch.compile(hf) if compile else hf

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        x, y = (t.to(device, non_blocking=True) for t in batch)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = fwd(input_ids=x).logits
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1), ignore_index=IGNORE_INDEX)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        float(loss.detach())
    return step, hf


def print_figures(prefix: str, first: float, tps: float, fpt: float, peak: float | None, measured: float | None,
                  mfu_label: str = "") -> None:
    """One compared run's lines: first step (s), tokens/s, MFU, peak GiB (``measured`` None off CUDA)."""
    print(f"{prefix}first_step_s: {first:.1f}")
    print(f"{prefix}tokens_per_s: {tps:,.0f}")
    label = mfu_label or f"{prefix}mfu"
    print(f"{label}: {tps * fpt / peak:.1%}" if peak else f"{prefix}mfu: n/a")
    if measured is not None:
        print(f"{prefix}peak_memory_gib: {measured:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--vocab-size", type=int, default=32768)
    ap.add_argument("--micro-batch-size", type=int, help="default: the preset's recipe")
    ap.add_argument("--seq-len", type=int, help="default: the preset's recipe")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--compile-scope", choices=COMPILE_SCOPES, default="model",
                    help="with --compile: the whole model, or each block on its own (train.compile_scope)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--parallel", default="ddp", choices=PARALLEL_STRATEGIES, help="layout under torchrun")
    ap.add_argument("--ddp-bucket-cap-mb", type=float, default=DDP_BUCKET_CAP_MB, metavar="MIB",
                    help=f"DDP's gradient buckets under torchrun (train.ddp_bucket_cap_mb, {DDP_BUCKET_CAP_MB:g}; "
                         "torch's default 25)")
    ap.add_argument("--no-fsdp-reshard", action="store_true",
                    help="FSDP keeps every block's gathered weights after its forward "
                         "(train.fsdp_reshard_after_forward false)")
    ap.add_argument("--ac", default="none", choices=["none", "selective", "full"], help="activation checkpointing")
    ap.add_argument("--optim", default="adamw", choices=OPTIMIZERS, help="optim.name (default adamw)")
    ap.add_argument("--lora-rank", type=int, default=0, metavar="R",
                    help="train LoRA adapters of rank R on every projection of the frozen random model "
                         "(--peft lora; 0: every weight, the default)")
    ap.add_argument("--vs-transformers", action="store_true", help="also time transformers' model of the same shape")
    ap.add_argument("--numerics-steps", type=int, default=0, metavar="N", help="compare N steps with the eager path")
    ap.add_argument("--fp8", choices=FP8_RECIPES[1:], help="also time FP8 training with this torchao recipe")
    ap.add_argument("--fp8-micro-batch-size", type=int, help="FP8's micro-batch (default: the bf16 run's)")
    ap.add_argument("--fp8-head", action="store_true", help="with --fp8: the LM head in FP8 too (train.fp8_head)")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="profile N more steps (torch.profiler)")
    ap.add_argument("--trace-dir", type=Path, help="with --profile: write the Chrome trace here")
    args = ap.parse_args()

    if args.fp8_head and not args.fp8:
        ap.error("--fp8-head goes with --fp8 RECIPE")
    if args.lora_rank and (args.vs_transformers or args.numerics_steps or args.fp8):
        ap.error("--lora-rank times the adapters alone: leave out --vs-transformers, --numerics-steps and --fp8")
    recipe = pretrain_recipe(args.preset)
    world = init_world(args.device)
    device = world.device
    mbs = args.micro_batch_size or recipe.train.micro_batch_size
    seq = args.seq_len or recipe.data.seq_len
    cfg = replace(recipe.model, vocab_size=args.vocab_size)
    model = build_model(cfg, device)
    train = TrainConfig(micro_batch_size=mbs, batch_size=mbs * world.size, max_steps=1, compile=args.compile,
                        compile_scope=args.compile_scope, parallel=args.parallel, ac=args.ac,
                        ddp_bucket_cap_mb=args.ddp_bucket_cap_mb, fsdp_reshard_after_forward=not args.no_fsdp_reshard)
    optim = OptimConfig(name=args.optim, warmup_steps=0)
    lora = LoraConfig(rank=args.lora_rank) if args.lora_rank else None
    fpt, peak = model.flops_per_token(seq), peak_flops(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(model, train=train, optim=optim, run=RunConfig(out=tmp), out_dir=Path(tmp), lora=lora,
                          meta={"init": "random weights"} if lora else None,
                          batches=RandomTokens(cfg.vocab_size, mbs, seq), show_progress=False, world=world)
        batches = [trainer.batches.next_batch() for _ in range(4)]
        keep = args.vs_transformers or args.numerics_steps or args.fp8
        # on the host, so that the peak memory measured below is the training step's alone
        initial = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()} if keep else None
        dt, measured, first = timed(lambda i: trainer.train_step([batches[i % 4]]), args.warmup, args.steps, device)
        if args.profile and world.main:
            from pretrain_profile import profile_steps
            profile_steps(lambda i: trainer.train_step([batches[i % 4]]), args.profile, device, args.trace_dir,
                          f"codechat-{args.preset}")
        layout = f"{trainer.par.strategy} over {world.size}" if world.distributed else "plain (no torchrun)"
        trainer_ddp, sharded = trainer.par.strategy == "ddp", trainer.par.sharded
        if world.distributed:  # the wrapper's work in one more step: collectives and FSDP hooks
            from pretrain_profile import count_collectives
            collectives, hooks = count_collectives(lambda: trainer.train_step([batches[0]]))
        trainer = None  # frees the optimizer state before the transformers run
    tps = args.steps * mbs * seq * world.size / dt
    if not world.main:
        return
    print(f"device: {name}; torch {torch.__version__}; preset {args.preset}: {model.num_params() / 1e6:.1f}M params, "
          f"batch {mbs}x{seq}, compile={args.compile}{f' ({args.compile_scope})' if args.compile else ''}, "
          f"{layout}{f' (buckets of {args.ddp_bucket_cap_mb:g} MiB)' if trainer_ddp else ''}"
          f"{' (blocks kept gathered)' if sharded and args.no_fsdp_reshard else ''}, --ac {args.ac}, "
          f"optim {args.optim}"
          + (f", LoRA rank {args.lora_rank} on every projection of the frozen model (MFU counts 6N a token)"
             if args.lora_rank else ""))
    print(f"first_step_s: {first:.1f}")
    if world.distributed:
        print(f"collectives_per_step: {collectives or 'none'}")
        print(f"fsdp_hooks_per_step: {hooks or 'none'}")
    print(f"tokens_per_s: {tps:,.0f}")
    print(f"achieved_tflops: {tps * fpt / 1e12:.1f}")
    print(f"mfu: {tps * fpt / peak:.1%}" if peak else "mfu: n/a (no known peak for this device)")
    if device.type == "cuda":
        plan = estimate(plan_config(cfg, train, optim, seq, lora=lora, gpus=world.size, parallel=args.parallel,
                                    ac=args.ac, distributed=world.distributed)).tensors / GIB
        print(f"peak_memory_gib: {measured:.2f}")
        print(f"plan_tensors_gib: {plan:.2f}")
        print(f"plan_over_measured: {plan / measured:.3f}")
    if args.numerics_steps:
        curves = {}
        for compiled in (args.compile, False):
            model.load_state_dict(initial)
            with tempfile.TemporaryDirectory() as tmp:
                t = Trainer(model, train=replace(train, compile=compiled), optim=optim, run=RunConfig(out=tmp),
                            out_dir=Path(tmp), batches=RandomTokens(cfg.vocab_size, mbs, seq), show_progress=False,
                            world=world)
                fixed = [batches[i % 4] for i in range(args.numerics_steps)]
                curves[compiled] = [float(t.train_step([b])["loss"]) for b in fixed]
            t = None
        diff = [abs(a - b) for a, b in zip(curves[args.compile], curves[False])]
        print(f"numerics over {args.numerics_steps} steps (compile={args.compile} vs eager): loss {curves[False][0]:.4f} "
              f"-> {curves[False][-1]:.4f}; max |diff| {max(diff):.4f}, mean {sum(diff) / len(diff):.4f} nats")
    if args.fp8:
        model.load_state_dict(initial)
        fp8_mbs = args.fp8_micro_batch_size or mbs
        fp8_train = replace(train, fp8=args.fp8, fp8_head=args.fp8_head, micro_batch_size=fp8_mbs,
                            batch_size=fp8_mbs * world.size)
        torch._dynamo.reset()  # its compile from a clean state, as the bf16 run's
        gc.collect()
        torch.cuda.empty_cache() if device.type == "cuda" else None
        with tempfile.TemporaryDirectory() as tmp:
            t = Trainer(model, train=fp8_train, optim=optim, run=RunConfig(out=tmp), out_dir=Path(tmp),
                        batches=RandomTokens(cfg.vocab_size, fp8_mbs, seq), show_progress=False, world=world)
            fp8_batches = [t.batches.next_batch() for _ in range(4)]
            dt8, measured8, first8 = timed(lambda i: t.train_step([fp8_batches[i % 4]]), args.warmup, args.steps,
                                           device)
            t = None
        tps8 = args.steps * fp8_mbs * seq * world.size / dt8
        print(f"fp8 ({args.fp8}, torchao, the blocks' linears{' and the LM head' if args.fp8_head else ''}), "
              f"micro-batch {fp8_mbs}x{seq}")
        print_figures("fp8_", first8, tps8, fpt, peak, measured8 if device.type == "cuda" else None,
                      mfu_label="fp8_mfu (of the bf16 peak)")
        print(f"ratio_fp8_tokens_per_s: {tps8 / tps:.3f}x (bf16 at micro-batch {mbs}, fp8 at {fp8_mbs})")
    if args.vs_transformers:
        if world.distributed:
            raise SystemExit("--vs-transformers runs in one process: leave torchrun out")
        model.load_state_dict(initial)
        gc.collect()
        torch.cuda.empty_cache() if device.type == "cuda" else None
        step, hf = transformers_step(model, optim, args.compile, device)
        del model, initial
        dt_hf, measured_hf, first_hf = timed(lambda i: step(batches[i % 4]), args.warmup, args.steps, device)
        if args.profile:
            from pretrain_profile import profile_steps
            profile_steps(lambda i: step(batches[i % 4]), args.profile, device, args.trace_dir,
                          f"transformers-{args.preset}")
        tps_hf = args.steps * mbs * seq / dt_hf
        import transformers
        print(f"transformers {transformers.__version__} {type(hf).__name__}, same shape, weights and batches")
        print_figures("transformers_", first_hf, tps_hf, fpt, peak, measured_hf if device.type == "cuda" else None)
        print(f"ratio_tokens_per_s: {tps / tps_hf:.2f}x")


if __name__ == "__main__":
    main()
