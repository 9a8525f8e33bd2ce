"""SFT vs pretraining throughput for the same model and sequence length: non-padding tokens/s.

Both run the real trainer step (bf16 autocast, fused AdamW, ``--compile``): pretraining on
random full rows, SFT through the real mixture -> budgets -> best-fit packing -> loader path on
Code Alpaca + the MBPP train split (task ids 601-974). Prints one line per figure and the ratio.

    python benchmarks/sft_throughput.py --alpaca code_alpaca_2k.json --mbpp mbpp.jsonl \
        --tokenizer gpt2_bpe/ --preset d20 --steps 200 --compile
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from codechat.chat.budget import render_with_budget
from codechat.config.device import resolve_device
from codechat.config.sft import SFTConfig
from codechat.config.stages import OptimConfig, RunConfig, TrainConfig, pretrain_recipe, replace
from codechat.data.mixture import Mixture
from codechat.data.sft import SFTLoader, collate, pack_best_fit
from codechat.model import build_model
from codechat.tokenizer import Tokenizer
from codechat.train.trainer import Trainer
from pretrain_throughput import RandomTokens  # the script's own folder is on sys.path

MBPP_TRAIN = range(601, 975)


def measure(trainer: Trainer, warmup: int, steps: int) -> tuple[float, float]:
    """(non-padding tokens/s, mean fill of the rows) over ``steps`` steps after ``warmup``."""
    for _ in range(warmup):
        trainer.train_step([trainer.batches.next_batch()])
    torch.cuda.synchronize() if trainer.device.type == "cuda" else None
    tokens = slots = 0
    t0 = time.perf_counter()
    for _ in range(steps):
        b = trainer.batches.next_batch()
        out = trainer.train_step([b])
        tokens += out["tokens"]
        slots += b[0].numel()
    torch.cuda.synchronize() if trainer.device.type == "cuda" else None
    return tokens / (time.perf_counter() - t0), tokens / slots


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--alpaca", required=True)
    ap.add_argument("--mbpp", required=True)
    ap.add_argument("--tokenizer", required=True, help="tokenizer dir (e.g. GPT-2 encoder.json + vocab.bpe)")
    ap.add_argument("--preset", default="d20")
    ap.add_argument("--micro-batch-size", type=int, help="default: the preset's recipe")
    ap.add_argument("--seq-len", type=int, help="default: the preset's recipe")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()

    tok = Tokenizer.load(args.tokenizer)
    recipe = pretrain_recipe(args.preset)
    mbs = args.micro_batch_size or recipe.train.micro_batch_size
    seq = args.seq_len or recipe.data.seq_len
    device = resolve_device(args.device)
    cfg = replace(recipe.model, vocab_size=tok.vocab_size, max_seq_len=max(seq, recipe.model.max_seq_len))
    train = TrainConfig(micro_batch_size=mbs, max_steps=1, compile=args.compile)

    with tempfile.TemporaryDirectory() as tmp:
        mbpp_train = Path(tmp) / "mbpp_train.jsonl"
        rows = [json.loads(ln) for ln in Path(args.mbpp).read_text().splitlines() if ln.strip()]
        mbpp_train.write_text("".join(json.dumps(r) + "\n" for r in rows if r["task_id"] in MBPP_TRAIN))
        sft_cfg = SFTConfig(max_length=seq, max_prompt_length=seq * 3 // 4, packing=True, decontaminate=False,
                            pad_to_multiple=128)
        mix = Mixture.from_spec(f"{args.alpaca}:1,{mbpp_train}:1", sft_cfg)

        def trainer(batches):
            torch.manual_seed(0)
            return Trainer(build_model(cfg, device), train=train, optim=OptimConfig(warmup_steps=0),
                           run=RunConfig(out=tmp), out_dir=Path(tmp), batches=batches, show_progress=False)

        pre_tps, _ = measure(trainer(RandomTokens(cfg.vocab_size, mbs, seq)), args.warmup, args.steps)
        sft = trainer(SFTLoader(mix, tok, sft_cfg, mbs))
        sft_tps, fill = measure(sft, args.warmup, args.steps)

        # packed rows compute what each conversation computes alone (flex-attention masks on CUDA)
        probe = Mixture.from_spec(f"{args.alpaca}:1", sft_cfg)
        exs = [render_with_budget(tok, next(probe).conversation, sft_cfg) for _ in range(8)]
        model = sft.model.eval()
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            packed = collate([[exs[i] for i in b] for b in pack_best_fit([len(e) - 1 for e in exs], seq)],
                             tok.end_id, 1, packed=True)
            a = model(packed.inputs.to(device), packed.labels.to(device), doc_ids=packed.doc_ids.to(device))
            alone = sum(model(b.inputs.to(device), b.labels.to(device))
                        for b in (collate([[e]], tok.end_id, 1, packed=False) for e in exs))
    print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; preset {args.preset}, "
          f"batch {mbs}x{seq}, compile={args.compile}, {args.steps} steps after {args.warmup}")
    print(f"pretrain_tokens_per_s: {pre_tps:,.0f}")
    print(f"sft_nonpad_tokens_per_s: {sft_tps:,.0f} (row fill {fill:.1%}, packed)")
    print(f"sft_over_pretrain: {sft_tps / pre_tps:.3f}")
    print(f"packed_vs_alone_loss_rel_diff: {abs(float(a) - float(alone)) / float(alone):.2e}")


if __name__ == "__main__":
    main()
