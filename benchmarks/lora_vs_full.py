"""LoRA against full fine-tuning on one base at equal SFT budgets: held-out loss, each at its best of
three learning rates (issue 37's quality check), in one command.

    PYTHONPATH=. python benchmarks/lora_vs_full.py --preset d20 --pretrain-min 3 --budget-s 40 --out $OUT/lora.json
    PYTHONPATH=. python benchmarks/lora_vs_full.py --preset tiny --pretrain-min 0.3 --budget-s 8 --max-files 300 \\
        --full-lrs 1e-3 --lora-lrs 3e-3          # a CPU smoke run

1. ``codechat pretrain --preset P --time-budget-min M --out WORK/pretrain`` (the default tokenizer and
   corpus: this Python's standard library); a finished one in ``--work`` is kept.
2. (docstring -> function) pairs mined from the same library (:func:`codechat.data.mining.write_mined`,
   ``--max-files`` files at most), split by a hash of each function's file: ``--heldout-share`` of the
   files (default 0.05) give ``WORK/mined/held.jsonl``, the rest ``train.jsonl`` (no function, and no file,
   on both sides).
3. For each learning rate of ``--full-lrs`` and of ``--lora-lrs``: ``codechat sft --init WORK/pretrain
   --data train.jsonl --sft.eval_data held.jsonl`` for ``--budget-s`` seconds of training (compile
   included, as a user's run counts it), AdamW, the recipe's schedule, ``eval_loss`` over the first
   ``--eval-examples`` held-out examples every ``--eval-every`` steps; the LoRA runs add ``--peft lora
   --lora.rank R --lora.alpha 2R`` (every projection). A finished run in ``--work`` is kept, so a
   killed comparison resumes.

Printed: one line per run (kind, learning rate, steps, held-out loss at the end), the best of each
kind, and ``lora_over_full``: the best LoRA loss over the best full fine-tuning loss (the acceptance
asks <= 1.05). ``--out`` writes every run's settings and whole ``eval_curve`` ([step, loss]) as JSON.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from codechat.config.stages import default_corpus_dirs
from codechat.data.mining import write_mined
from sft_sweep import run_codechat


def split_mined(work: Path, max_files: int, heldout_share: float) -> tuple[Path, Path, dict[str, int]]:
    """Mine the library's pairs once into ``work/mined/all.jsonl`` and split them by file."""
    d = work / "mined"
    train, held = d / "train.jsonl", d / "held.jsonl"
    if not held.is_file():
        every = d / "all.jsonl"
        write_mined([default_corpus_dirs()[0]], [every], max_files=max_files, workers=0)
        parts: dict[Path, list[str]] = {train: [], held: []}
        for line in every.read_text(encoding="utf-8").splitlines():
            file = json.loads(line)["id"].rsplit(":", 1)[0]
            h = int.from_bytes(hashlib.sha256(file.encode()).digest()[:8], "big") / 2 ** 64
            parts[held if h < heldout_share else train].append(line)
        for path, lines in parts.items():
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(ln + "\n" for ln in lines), encoding="utf-8")
            os.replace(tmp, path)
    counts = {p.stem: sum(1 for _ in p.open(encoding="utf-8")) for p in (train, held)}
    if not counts["held"] or not counts["train"]:
        sys.exit(f"the split left no {'held-out' if not counts['held'] else 'training'} pairs ({counts}): raise "
                 "--max-files or change --heldout-share")
    return train, held, counts


def sft_run(work: Path, base: Path, train: Path, held: Path, kind: str, lr: float, args: argparse.Namespace) -> dict:
    """One SFT run (module docstring, step 3); its row."""
    out = work / "sft" / f"{kind}_lr{lr:g}"
    row_file = out / "row.json"
    if row_file.is_file():
        return json.loads(row_file.read_text())
    out.mkdir(parents=True, exist_ok=True)
    flags = ["sft", "--init", str(base), "--data", str(train), "--out", str(out / "run"),
             "--sft.eval_data", str(held), "--sft.eval_examples", str(args.eval_examples),
             "--train.eval_every", str(args.eval_every), "--train.time_budget_s", str(args.budget_s),
             "--train.max_steps", "0", "--train.epochs", "0", "--optim.name", "adamw", "--optim.lr", str(lr),
             "--sft.decontaminate", "false"]  # mined stdlib pairs; HumanEval is not scored here
    if kind == "lora":
        flags += ["--peft", "lora", "--lora.rank", str(args.rank), "--lora.alpha", str(2 * args.rank)]
    t0 = time.perf_counter()
    run_codechat(flags, out / "sft.log")
    rows = [json.loads(ln) for ln in (out / "run" / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    curve = [[r["step"], r["eval_loss"]] for r in rows if "eval_loss" in r]
    row = {"kind": kind, "lr": lr, "steps": max((r.get("step", 0) for r in rows), default=0),
           "wall_s": round(time.perf_counter() - t0, 1), "heldout_loss": curve[-1][1], "eval_curve": curve}
    tmp = row_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(row))
    os.replace(tmp, row_file)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--preset", default="d20", help="the base's preset (default d20)")
    ap.add_argument("--pretrain-min", type=float, default=3.0, help="minutes of pretraining (default 3)")
    ap.add_argument("--budget-s", type=float, default=40.0, help="seconds of SFT training per run (default 40)")
    ap.add_argument("--full-lrs", default="3e-5,1e-4,3e-4", help="full fine-tuning's learning rates")
    ap.add_argument("--lora-lrs", default="3e-4,1e-3,3e-3", help="LoRA's learning rates")
    ap.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 x rank; default 16)")
    ap.add_argument("--max-files", type=int, default=0, help="mine at most N files (0: all)")
    ap.add_argument("--heldout-share", type=float, default=0.05, help="share of files held out (default 0.05)")
    ap.add_argument("--eval-examples", type=int, default=256, help="held-out examples scored (default 256)")
    ap.add_argument("--eval-every", type=int, default=50, help="steps between held-out evaluations (default 50)")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "codechat-lora-vs-full"),
                    help="where the base, the pairs and the runs are kept")
    ap.add_argument("--out", help="write the rows and the ratio as JSON here")
    args = ap.parse_args()
    if not 0 < args.heldout_share < 1:
        ap.error(f"--heldout-share must be in (0, 1), got {args.heldout_share}")
    lrs = {k: [float(x) for x in getattr(args, f"{k}_lrs").split(",") if x] for k in ("full", "lora")}
    if not lrs["full"] or not lrs["lora"]:
        ap.error("--full-lrs and --lora-lrs need a learning rate each at least")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    base = work / "pretrain"
    if not (base / "checkpoints").is_dir():
        print(f"# pretraining {args.preset} for {args.pretrain_min} min into {base}", flush=True)
        run_codechat(["pretrain", "--preset", args.preset, "--time-budget-min", str(args.pretrain_min), "--out",
                  str(base)], work / "pretrain.log")
    train, held, counts = split_mined(work, args.max_files, args.heldout_share)
    print(f"# mined pairs: {counts['train']} training, {counts['held']} held out (by file)", flush=True)
    rows = []
    for kind in ("full", "lora"):
        for lr in lrs[kind]:
            r = sft_run(work, base, train, held, kind, lr, args)
            rows.append(r)
            print(f"{kind:<5} lr {lr:<8g} steps {r['steps']:>5}  held-out loss {r['heldout_loss']:.4f}", flush=True)
    best = {k: min((r for r in rows if r["kind"] == k), key=lambda r: r["heldout_loss"]) for k in ("full", "lora")}
    ratio = best["lora"]["heldout_loss"] / best["full"]["heldout_loss"]
    print(f"best full: lr {best['full']['lr']:g}, {best['full']['heldout_loss']:.4f}; best lora (rank {args.rank}): "
          f"lr {best['lora']['lr']:g}, {best['lora']['heldout_loss']:.4f}")
    print(f"lora_over_full: {ratio:.4f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"settings": vars(args), "pairs": counts, "rows": rows,
                                              "lora_over_full": ratio}, indent=1))


if __name__ == "__main__":
    main()
