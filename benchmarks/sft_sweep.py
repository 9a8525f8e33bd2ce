"""One pretrained base, several SFT recipes, each scored on HumanEval (and MBPP): the speedrun's
SFT questions answered on one base inside one device call.

    python benchmarks/sft_sweep.py --run runs/NAME --budget-s 50 \\
        --variant same= \\
        --variant nosite='--sft.data runs/NAME/sft_mined/0.jsonl#completion:1,mbpp.jsonl#mbpp:3' \\
        --variant lr1e-4='--optim.lr 1e-4'

``--run`` is a finished speedrun (its ``pretrain/`` and ``sft/config.yaml``). Each variant runs
``codechat sft --config RUN/sft/config.yaml --init RUN/pretrain --out RUN/sweep/NAME/sft`` for
``--budget-s`` seconds of training (the speedrun's own SFT settings, then the variant's
overrides; ``{data}`` in them is the speedrun's SFT data spec), then ``codechat eval run`` on
HumanEval (and on MBPP with ``--mbpp``) with the speedrun's sampling (``--n``,
``--temperature``, ``--max-new-tokens``). MBPP is scored on its validation split (tasks 511-600)
unless ``--mbpp-split test`` is given: a recipe is chosen on validation, never on the test split
(tasks 11-510) that the speedrun reports. HumanEval has no validation split: its rows are a report,
not a criterion. A variant whose results exist is not run again, so a killed sweep resumes (a
cached row scored on the other MBPP split is refused).

Printed: one row per variant: SFT steps, its fixed-set loss (``eval_loss`` at the end: the first
training examples', or held-out records' with ``--sft.eval_data SPEC`` among the overrides), pass@1 and
pass@10 on each suite, and the problems solved; the same rows, with the whole ``eval_curve``
(``[step, eval_loss]``; add ``--train.eval_every N`` for more points), go to
``RUN/sweep/results.json`` (written whole, then renamed). ``--loss-only`` skips the suites: LoRA
against full fine-tuning at three learning rates each, on held-out mined pairs, for instance::

    python benchmarks/sft_sweep.py --run runs/NAME --budget-s 40 --loss-only \
        --variant full_3e-5='--optim.lr 3e-5 --sft.eval_data held.jsonl --train.eval_every 50' \
        --variant lora_1e-3='--peft lora --lora.rank 16 --optim.lr 1e-3 --sft.eval_data held.jsonl ...' ...
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path


def run_codechat(args: list[str], log: Path) -> None:
    """Run ``codechat ARGS`` with its output in ``log``; raise with the log's tail if it fails."""
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "-m", "codechat", *args], stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:])
        raise SystemExit(f"codechat {' '.join(args[:2])} failed (exit {rc}); the end of {log}:\n{tail}")


def _variant(run: Path, name: str, extra: list[str], args: argparse.Namespace) -> dict:
    out = run / "sweep" / name
    done = out / "row.json"
    if done.is_file():
        row = json.loads(done.read_text())
        cached = row["mbpp"].get("split", "test") if "mbpp" in row else None  # rows before --mbpp-split: test
        if cached and args.mbpp and cached != args.mbpp_split:
            raise SystemExit(f"{done} scored MBPP {cached}, not {args.mbpp_split}: give the variant another name")
        return row
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    run_codechat(["sft", "--config", str(run / "sft" / "config.yaml"), "--init", str(run / "pretrain"),
               "--out", str(out / "sft"), "--train.time_budget_s", str(args.budget_s), "--train.max_steps", "0",
               "--train.epochs", "0", *extra], out / "sft.log")
    sft_s = time.perf_counter() - t0
    rows = [json.loads(ln) for ln in (out / "sft" / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    curve = [[r["step"], r["eval_loss"]] for r in rows if "eval_loss" in r]
    row = {"variant": name, "overrides": shlex.join(extra), "sft_wall_s": round(sft_s, 1),
           "steps": max((r.get("step", 0) for r in rows), default=0), "fixed_set_loss": curve[-1][1] if curve else None,
           "eval_curve": curve}
    suites = [] if args.loss_only else [("humaneval", "humaneval", "test")] + (
        [("mbpp", f"mbpp:{args.mbpp}", args.mbpp_split)] if args.mbpp else [])
    for key, suite, split in suites:
        t0 = time.perf_counter()
        run_codechat(["eval", "run", "--model", str(out / "sft"), "--suite", suite, "--n", str(args.n),
                   "--k", "1,10" if args.n >= 10 else "1", "--temperature", str(args.temperature),
                   "--max-new-tokens", str(args.max_new_tokens), "--out", str(out / "eval" / key), "--quiet",
                   "--split", split,
                   *(["--limit", str(args.limit)] if args.limit else [])], out / f"eval_{key}.log")
        res = json.loads((out / "eval" / key / "results.json").read_text())
        row[key] = {"split": split, "pass@1": res["pass@1"], "pass@10": res["pass@k"].get("pass@10"),
                    "problems": res["problems"],
                    "solved": sorted(t for t, v in res["per_task"].items() if v["c"]),
                    "wall_s": round(time.perf_counter() - t0, 1)}
    tmp = done.with_suffix(".tmp")
    tmp.write_text(json.dumps(row, indent=1))
    os.replace(tmp, done)
    return row


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--run", required=True, help="a finished speedrun directory (pretrain/, sft/config.yaml)")
    ap.add_argument("--variant", action="append", required=True, metavar="NAME=OVERRIDES",
                    help="a name and the `codechat sft` flags that make it ({data}: the speedrun's SFT data spec); "
                         "NAME= alone repeats the speedrun's SFT")
    ap.add_argument("--budget-s", type=float, default=50.0, help="seconds of SFT training per variant (default 50)")
    ap.add_argument("--mbpp", help="MBPP's mbpp.jsonl: also score MBPP")
    ap.add_argument("--mbpp-split", choices=("validation", "test"), default="validation",
                    help="MBPP split scored (default validation, 511-600: choose recipes here; "
                         "test, 11-510: report only)")
    ap.add_argument("--n", type=int, default=20, help="samples per problem (default 20)")
    ap.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default 0.8)")
    ap.add_argument("--max-new-tokens", type=int, default=512, help="tokens per sample at most (default 512)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N problems of each suite (0: all)")
    ap.add_argument("--loss-only", action="store_true",
                    help="no suite: each variant's eval_loss curve alone (held-out with --sft.eval_data in its overrides)")
    args = ap.parse_args()
    run = Path(args.run)
    for need in (run / "pretrain", run / "sft" / "config.yaml"):
        if not need.exists():
            ap.error(f"{need} is missing: --run must be a finished speedrun directory")
    data = json.loads((run / "metrics.json").read_text()).get("sft", {}).get("data", "")
    rows = []
    for spec in args.variant:
        name, sep, flags = spec.partition("=")
        if not sep or not name or "/" in name:
            ap.error(f"--variant {spec!r}: give NAME=OVERRIDES (NAME without '/')")
        rows.append(_variant(run, name, shlex.split(flags.replace("{data}", data)), args))
        r = rows[-1]
        print(f"{r['variant']:<16} steps {r['steps']:>5}  fixed-set loss {r['fixed_set_loss'] or float('nan'):.3f}  "
              + "  ".join(f"{k} pass@1 {_pct(r[k]['pass@1'])} pass@10 {_pct(r[k]['pass@10'])} "
                          f"solved {len(r[k]['solved'])}/{r[k]['problems']} ({r[k].get('split', 'test')})"
                          for k in ("humaneval", "mbpp") if k in r), flush=True)
    out = run / "sweep" / "results.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(rows, indent=1))
    os.replace(tmp, out)
    print(f"-> {out}")


if __name__ == "__main__":
    main()
