"""Pretraining ablations at equal training time: named variants beside today's recipe, in one command.

Builds (or reuses) the speedrun's tokenizer and token shards of this machine's Python files, the
way :mod:`codechat.speedrun.run` builds them (the same sources, tokenizer settings, validation
split by the hash of each path, and decontamination), then pretrains each variant through the real
stage (:func:`codechat.train.pretrain.run_pretrain`, the one trainer loop) from the same seed, on
the same windows in the same order, for the same training time, and scores each on the whole
validation split as the speedrun does (bits per byte of every val token: the figure of the
speedrun's report). ``baseline`` is today's speedrun recipe (the preset's recipe under the GPU
plan's overrides: d12 with Muon at lr 2e-3), measured in the same command.

    PYTHONPATH=. python3 benchmarks/pretrain_ablation.py --variants relu2,zero_init,softcap15 \
        --train-s 232 [--mbpp .gpu/mbpp.jsonl] [--json $OUT/ablation.json]
    PYTHONPATH=. python3 benchmarks/pretrain_ablation.py --variant 'lr3e-3:optim.lr=3e-3' --train-s 120
    python benchmarks/pretrain_ablation.py --device cpu --max-files 120 --train-s 3 --variants relu2 \
        --pretrain.data.vocab_size 512        # the CPU smoke: the tiny preset, seconds a variant

Equal time: each variant trains ``--train-s`` seconds by the trainer's clock (the summed wall time
of its steps; evaluations and checkpoints are outside it), and that clock starts after the first
step (``budget_after_first_step``): ``torch.compile`` compiles in the first step, and a variant whose
graph compiles longer would otherwise train less. Each variant starts from a reset compiler
(``torch._dynamo.reset``); its compile time is reported beside it (``compile_s``: the first step).
The LR schedule decays over the same ``--train-s``. Checkpoints: only the final one (read back for
the whole-split evaluation, then deleted unless ``--keep``).

``--steps N`` trains every variant N steps instead (same seed, same windows in the same order), logs
the loss at every step and prints each variant's largest relative gap to the baseline's loss after
``--loss-after``: of the mean loss over each window of 10 steps (:data:`STEPS_WINDOW`), and of one step's
(FP8 against bf16: ``--preset d20 --steps 300 --variant 'fp8:train.fp8=tensorwise'``).

A variant that sets ``data.quality`` / ``data.quality_weights`` (document quality bands,
:mod:`codechat.data.quality`) trains on shards of its own, built once (``work/data-<quality>-<hash>``):
the same tokenizer, the same validation split, a train split written by band
(``--variant 'qfilter:data.quality=filter'``).

Variants are dotted settings of the pretraining config applied over the baseline (:data:`VARIANTS`,
or ``--variant NAME:KEY=VALUE,KEY=VALUE``); ``--pretrain.KEY VALUE`` changes the baseline and every
variant alike. They run in this order: the baseline, the ``--variant`` ones, then those of
``--variants`` (the order is printed first). ``--stop-after-s S`` starts no variant that would end
after S seconds of the command (its training time plus ``--overhead-s``, the compile and evaluations),
so that a command under a time limit ends with what it finished rather than being killed mid-run.

Prints one line per variant and a table; ``--json`` (default ``$OUT/pretrain_ablation.json`` when
``$OUT`` is set) gets every figure and each run's logged rows, rewritten after each variant, so a
command cut short keeps what finished. A variant that raises is reported with its error and the
others still run. ``--commit`` names the code's commit (a device machine's copy of the tree may
carry a stale ``.git``: its HEAD is printed otherwise).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from codechat.checkpoint import load_model
from codechat.config.device import autocast_for, resolve_device
from codechat.config.stages import (ConfigError, PretrainConfig, RunConfig, load, parse_overrides, replace,
                                    to_dict)
from codechat.data.corpus import benchmark_decontaminator, build_corpus, load_index, read_split
from codechat.data.sources import iter_split_texts
from codechat.data.windows import eval_windows
from codechat.speedrun.plan import plan
from codechat.speedrun.record import current_commit
from codechat.tokenizer import train_tokenizer
from codechat.train.pretrain import bpb_evaluator, run_pretrain

#: Named variants: dotted pretraining settings over the baseline (issue 32's NanoGPT-speedrun options).
VARIANTS: dict[str, dict[str, str]] = {
    "baseline": {},
    "relu2": {"model.mlp_act": "relu2"},
    "zero_init": {"model.zero_init_proj": "true"},
    "softcap15": {"model.logit_softcap": "15"},
    "softcap30": {"model.logit_softcap": "30"},
    "relu2_zero_init": {"model.mlp_act": "relu2", "model.zero_init_proj": "true"},
    "relu2_softcap15": {"model.mlp_act": "relu2", "model.logit_softcap": "15"},
    "all3": {"model.mlp_act": "relu2", "model.zero_init_proj": "true", "model.logit_softcap": "15"},
    "x0_mix": {"model.x0_mix": "true"},
    "unet": {"model.unet_skips": "true"},
    "skips": {"model.x0_mix": "true", "model.unet_skips": "true"},
}
#: Settings the harness owns (the equal budget and the one final checkpoint); a variant may not set them.
#: ``--steps`` mode logs the training loss at every step and compares the means of windows of this many
#: steps (the loss a trainer logging every 10 steps would report averaged over its interval): one step's loss
#: moves by ~1-2% between two runs whose trajectories drift apart (FP8 against bf16, 2026-12-04), a window's less.
STEPS_WINDOW = 10
OWN_KEYS = frozenset({"train.max_steps", "train.time_budget_s", "train.epochs", "train.save_every",
                      "train.save_every_s", "train.compile"})


def parse_variant(spec: str) -> tuple[str, dict[str, str]]:
    """``NAME:KEY=VALUE,KEY=VALUE`` -> (NAME, {KEY: VALUE}); a bare ``NAME`` from :data:`VARIANTS`.

    Raises:
        ConfigError: an unknown name, a malformed setting, or a key the harness owns.
    """
    name, _, rest = spec.partition(":")
    if not rest:
        if name not in VARIANTS:
            raise ConfigError(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}, or NAME:KEY=VALUE,...")
        return name, dict(VARIANTS[name])
    settings = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        if not eq or "." not in key:
            raise ConfigError(f"--variant {spec!r}: {item!r} is not SECTION.FIELD=VALUE")
        settings[key] = value
    bad = sorted(set(settings) & OWN_KEYS)
    if bad:
        raise ConfigError(f"--variant {spec!r}: {bad[0]} is set by the harness (equal time, one checkpoint)")
    return name, settings


def prepare_shards(sources: tuple[str, ...], data_cfg: Any, max_files: int, mbpp: str, work: Path
                   ) -> tuple[Path, Path, dict[str, Any]]:
    """The speedrun's tokenizer and token shards under ``work`` (its ``_tokenizer`` and ``_data``
    stages, without the background jobs), each reused when its stamp file says it was built from the
    same inputs. One tokenizer serves every variant; shards with ``data.quality`` on get a directory
    of their own (``data-<quality>-<hash>``: their train split differs, their val split is the same).
    Returns (tokenizer dir, data dir, what was done and how long it took)."""
    d = data_cfg
    tok_stamp = {"sources": list(sources), "vocab_size": d.vocab_size, "tokenizer_max_bytes": d.tokenizer_max_bytes,
                 "val_fraction": d.val_fraction, "extensions": list(d.extensions), "max_files": max_files}
    data_stamp = {**tok_stamp, "mbpp": mbpp, "quality": d.quality, "quality_weights": d.quality_weights}
    tag = hashlib.sha256(json.dumps(data_stamp, sort_keys=True).encode()).hexdigest()[:8]
    tok_dir = work / "tokenizer"
    data_dir = work / ("data" if d.quality == "off" else f"data-{d.quality}-{tag}")
    done: dict[str, Any] = {"reused": True, "data_dir": data_dir.name}
    if not _stamped(tok_dir, tok_stamp):
        shutil.rmtree(tok_dir, ignore_errors=True)
        t0 = time.perf_counter()
        texts = iter_split_texts(sources, "train", extensions=d.extensions, val_fraction=d.val_fraction,
                                 max_bytes=d.tokenizer_max_bytes, max_files=max_files)
        train_tokenizer(texts, d.vocab_size, show_progress=False).save(tok_dir)
        (tok_dir / "stamp.json").write_text(json.dumps(tok_stamp))
        done.update(reused=False, tokenizer_s=time.perf_counter() - t0)
        shutil.rmtree(data_dir, ignore_errors=True)  # shards of another tokenizer
    if not (_stamped(data_dir, data_stamp) and (data_dir / "index.json").is_file()):
        shutil.rmtree(data_dir, ignore_errors=True)
        t0 = time.perf_counter()
        build_corpus(sources, tok_dir, data_dir, extensions=d.extensions, val_fraction=d.val_fraction,
                     max_files=max_files, decontaminator=benchmark_decontaminator(mbpp or None), show_progress=False,
                     quality=d.quality, quality_weights=d.quality_weights)
        (data_dir / "stamp.json").write_text(json.dumps(data_stamp))
        done.update(reused=False, corpus_s=time.perf_counter() - t0)
    return tok_dir, data_dir, done


def _stamped(directory: Path, stamp: dict[str, Any]) -> bool:
    f = directory / "stamp.json"
    return f.is_file() and json.loads(f.read_text()) == stamp


def whole_split_bpb(stage: Path, data_dir: Path, cfg: PretrainConfig, device: torch.device) -> dict[str, float]:
    """Val loss and bits per byte of ``stage``'s final checkpoint over every window of the val split:
    the speedrun's headline figure (:func:`codechat.speedrun.run._full_split_bpb`, the same computation)."""
    model, tok, _ = load_model(stage, device)
    rows = eval_windows(read_split(data_dir, "val"), cfg.data.seq_len)
    evaluate = bpb_evaluator(rows, torch.tensor(tok.token_byte_lengths(), dtype=torch.long),
                             cfg.train.micro_batch_size)
    with torch.no_grad(), autocast_for(device, cfg.train.dtype):
        out = evaluate(model)
    return {**out, "val_tokens": int(rows[:, 1:].numel())}


def _median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def run_variant(name: str, settings: dict[str, str], base: PretrainConfig, train_s: float,
                compile_on: bool, work: Path, device: torch.device, device_arg: str, seed: int, keep: bool,
                steps: int = 0, shards_for: Callable[[Any], Path] | None = None) -> dict[str, Any]:
    """Pretrain one variant for ``train_s`` seconds after its first step (or ``steps`` steps); its figures.
    ``shards_for(data_cfg)``: the data dir of a variant whose ``data.quality*`` differs from the baseline's."""
    out = work / "runs" / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    budget = ({"train.max_steps": steps, "train.time_budget_s": 0, "train.log_every": 1} if steps else
              {"train.max_steps": 0, "train.time_budget_s": train_s})
    overrides = {**settings, **budget, "train.epochs": 0,
                 "train.compile": compile_on, "train.save_every": 10**9, "train.save_every_s": 0}
    cfg = load(PretrainConfig, None, overrides, base=replace(base, run=RunConfig(out=str(out), seed=seed,
                                                                                  device=device_arg)))
    if shards_for is not None and (cfg.data.quality, cfg.data.quality_weights) != (base.data.quality,
                                                                                    base.data.quality_weights):
        cfg = replace(cfg, data=replace(cfg.data, data_dir=str(shards_for(cfg.data))))
    torch._dynamo.reset()  # every variant compiles from the same state
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with open(out / "stdout.log", "w") as log, contextlib.redirect_stdout(log):
        result = run_pretrain(cfg, show_progress=False, budget_after_first_step=True)
    wall = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    t1 = time.perf_counter()
    full = whole_split_bpb(out, Path(cfg.data.data_dir), cfg, device)
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln]
    train_rows = [r for r in rows if "tokens_per_s" in r]
    first = result.get("first_step_s") or 0.0
    tokens_per_step = cfg.train.micro_batch_size * cfg.train.accum_steps(1) * cfg.data.seq_len
    if not keep:
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
    return {"name": name, "settings": settings, "steps": result["step"], "compile_s": first,
            "train_s": result["elapsed_s"] - first, "params": result["params"],
            "tokens_seen": result["step"] * tokens_per_step,
            # tokens of the counted steps over the counted time (the first step is in neither)
            "tokens_per_s": (result["step"] - 1) * tokens_per_step / max(result["elapsed_s"] - first, 1e-9),
            "mfu": _median([r["mfu"] for r in train_rows[1:] if "mfu" in r]),
            "train_loss_final": train_rows[-1]["loss"] if train_rows else None,
            "val_bpb_sampled": [r["val_bpb"] for r in rows if "val_bpb" in r][-1],
            "val_bpb": full["val_bpb"], "val_loss": full["val_loss"], "val_tokens": full["val_tokens"],
            "peak_memory_gib": peak, "stage_wall_s": wall, "eval_s": time.perf_counter() - t1,
            "model": to_dict(cfg.model), "rows": rows}


def loss_gap(rows: list[dict[str, Any]], ref_rows: list[dict[str, Any]], after: int,
             window: int = STEPS_WINDOW) -> dict[str, Any] | None:
    """How far ``rows``' training loss is from ``ref_rows``' over the steps after ``after`` that both logged
    (``--steps`` mode: the same steps): the largest relative gap |loss - ref| / ref of the mean loss over each
    window of ``window`` steps ending at a multiple of ``window`` (``max_rel_gap``, with the window's last step
    ``at_step``), and of one step's loss (``max_step_rel_gap`` at ``at_single_step``). None when no window of
    steps after ``after`` is complete in both."""
    def losses(rs: list[dict[str, Any]]) -> dict[int, float]:
        return {r["step"]: r["loss"] for r in rs if "loss" in r and "tokens_per_s" in r and r["step"] > after}
    mine, ref = losses(rows), losses(ref_rows)
    shared = sorted(set(mine) & set(ref))
    ends = [s for s in shared if s % window == 0 and all(s - i in ref and s - i in mine for i in range(window))]
    if not ends:
        return None
    win = [(abs(sum(mine[e - i] - ref[e - i] for i in range(window))) / sum(ref[e - i] for i in range(window)), e)
           for e in ends]
    one = [(abs(mine[s] - ref[s]) / ref[s], s) for s in shared]
    (gap, step), (step_gap, single) = max(win), max(one)
    return {"max_rel_gap": gap, "at_step": step, "windows_compared": len(win), "window": window,
            "max_step_rel_gap": step_gap, "at_single_step": single, "after_step": after}


def table(results: list[dict[str, Any]]) -> str:
    """The results as a Markdown table, each val bits/byte beside the baseline's."""
    ref = next((r["val_bpb"] for r in results if r["name"] == "baseline" and "val_bpb" in r), None)
    lines = ["| variant | settings | steps | compile s | train s | tokens/s | whole-split val bits/byte "
             "| vs baseline |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        s = ", ".join(f"{k}={v}" for k, v in r["settings"].items()) or "today's recipe"
        if "error" in r:
            lines.append(f"| {r['name']} | {s} | {r['error'][:100]} | | | | | |")
            continue
        delta = f"{r['val_bpb'] - ref:+.4f}" if ref is not None and r["name"] != "baseline" else ""
        lines.append(f"| {r['name']} | {s} | {r['steps']:,} | {r['compile_s']:.1f} | {r['train_s']:.1f} | "
                     f"{r['tokens_per_s'] or 0:,.0f} | {r['val_bpb']:.4f} | {delta} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="", help=f"comma-separated names among {', '.join(VARIANTS)}")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                    help="an ad-hoc variant (repeatable)")
    ap.add_argument("--train-s", type=float, default=232.0,
                    help="training seconds per variant after its first (compiling) step; 232: the 9-minute speedrun's")
    ap.add_argument("--preset", help="default: the speedrun's (d12 on a GPU, tiny on a CPU)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, help="default: the recipe's")
    ap.add_argument("--src", action="append", help="source dirs/files instead of the speedrun's (repeatable)")
    ap.add_argument("--max-files", type=int, default=0, help="the speedrun's --max-files (0: all)")
    ap.add_argument("--mbpp", default="", help="the speedrun's --mbpp: its test problems are kept out of the corpus")
    ap.add_argument("--eager", action="store_true", help="no torch.compile (default: the recipe's train.compile)")
    ap.add_argument("--work", type=Path, default=Path("runs/ablation"), help="shards and runs; shards are reused")
    ap.add_argument("--keep", action="store_true", help="keep each variant's final checkpoint")
    ap.add_argument("--json", type=Path, help="default: $OUT/pretrain_ablation.json when $OUT is set")
    ap.add_argument("--stop-after-s", type=float, default=0.0,
                    help="start no variant that would end after this many seconds of the command (0: no limit)")
    ap.add_argument("--overhead-s", type=float, default=50.0,
                    help="a variant's seconds besides training (compile, evaluations), for --stop-after-s")
    ap.add_argument("--no-baseline", action="store_true",
                    help="exploration only: run the variants without today's recipe beside them (compare with a "
                         "baseline of an earlier command on the same shards; the table then has no deltas)")
    ap.add_argument("--steps", type=int, default=0,
                    help="equal steps instead of equal time: each variant trains this many steps, logging the loss "
                         f"at every step, and prints its largest relative gap to the baseline's loss, as means over "
                         f"windows of {STEPS_WINDOW} steps and step by step, after --loss-after (e.g. FP8 against "
                         "bf16: same seed, same data windows in the same order)")
    ap.add_argument("--loss-after", type=int, default=50, help="with --steps: compare the losses after this step")
    ap.add_argument("--commit", help="the code's commit, for the report (default: $CODECHAT_COMMIT, else git's HEAD "
                                     "where there is a .git)")
    args, rest = ap.parse_known_args(argv)
    common = parse_overrides(rest)  # --pretrain.KEY VALUE -> every variant, baseline included
    bad = [k for k in common if not k.startswith("pretrain.")]
    if bad:
        raise ConfigError(f"unrecognised argument --{bad[0]}; settings for every variant are --pretrain.SECTION.FIELD")
    common = {k[len("pretrain."):]: v for k, v in common.items()}
    if set(common) & OWN_KEYS:
        raise ConfigError(f"--pretrain.{sorted(set(common) & OWN_KEYS)[0]} is set by the harness (equal time, "
                          "one checkpoint)")
    if args.train_s <= 0 or args.steps < 0:
        raise ConfigError(f"--train-s must be > 0 and --steps >= 0, got {args.train_s} and {args.steps}")
    variants = [parse_variant(v) for v in args.variant] + [parse_variant(v) for v in args.variants.split(",") if v]
    variants = ([] if args.no_baseline else [("baseline", {})]) + [v for v in variants if v[0] != "baseline"]
    if not variants:
        raise ConfigError("--no-baseline with no --variant/--variants: nothing to run")
    if len({n for n, _ in variants}) != len(variants):
        raise ConfigError("two variants share a name")

    device = resolve_device(args.device)
    p = plan(device, args.preset, None, args.max_files, mbpp=args.mbpp)
    if args.src:
        p = replace(p, sources=tuple(args.src))
    p = replace(p, pretrain_overrides={**p.pretrain_overrides, **common})
    base = p.pretrain_base()  # the speedrun's recipe: the preset's, its GPU overrides, then --pretrain.*
    data_cfg = replace(base.data, src=p.sources, max_files=p.max_files)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    json_path = args.json or (Path(os.environ["OUT"]) / "pretrain_ablation.json" if os.environ.get("OUT") else None)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    compile_on = base.train.compile and not args.eager
    seed = args.seed if args.seed is not None else base.run.seed
    commit = args.commit or current_commit()
    print(f"pretrain ablation: {p.preset} on {name}, torch {torch.__version__}, commit {commit}; "
          + (f"{args.steps} steps a variant" if args.steps else
             f"{args.train_s:g} s of training a variant after its first step")
          + f", compile={compile_on}, seed {seed}; "
          f"runs: {', '.join(n for n, _ in variants)}")

    t0 = time.perf_counter()
    tok_dir, data_dir, shards = prepare_shards(p.sources, data_cfg, p.max_files, args.mbpp, work)
    index = load_index(data_dir)
    sp = index["splits"]
    print(f"shards: {'reused' if shards['reused'] else 'built'} in {time.perf_counter() - t0:.0f} s; "
          f"train {sp['train']['tokens']:,} tokens ({sp['train']['documents']:,} files), "
          f"val {sp['val']['tokens']:,} tokens ({sp['val']['documents']:,} files), sources {', '.join(p.sources)}")
    base = replace(base, data=replace(data_cfg, data_dir=str(data_dir), tokenizer_dir=str(tok_dir)))
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "commit": commit, "device": name,
        "command": " ".join([sys.argv[0], *(sys.argv[1:] if argv is None else argv)]),
        "torch": torch.__version__, "preset": p.preset, "train_s": args.train_s, "compile": compile_on, "seed": seed,
        "baseline_config": to_dict(base), "common_overrides": common, "shards": {**shards, "splits": sp},
        "variants": []}
    for vname, settings in variants:
        if args.stop_after_s and time.perf_counter() - started + args.train_s + args.overhead_s > args.stop_after_s:
            r = {"name": vname, "settings": settings, "error": f"not run: would end after --stop-after-s "
                                                                f"{args.stop_after_s:g}"}
            print(f"{vname}: {r['error']}", flush=True)
            report["variants"].append(r)
            continue
        try:
            r = run_variant(vname, settings, base, args.train_s, compile_on, work, device, args.device,
                            seed, args.keep, args.steps,
                            lambda d: prepare_shards(p.sources, d, p.max_files, args.mbpp, work)[1])
            ref = next((v for v in report["variants"] if v["name"] == "baseline" and "rows" in v), None)
            if args.steps and ref is not None:
                r["loss_gap_vs_baseline"] = gap = loss_gap(r["rows"], ref["rows"], args.loss_after)
                if gap:
                    print(f"{vname}: loss within {gap['max_rel_gap']:.2%} of the baseline's over every "
                          f"{gap['window']}-step window after step {args.loss_after} ({gap['windows_compared']} "
                          f"windows; largest ending at step {gap['at_step']}); one step's loss within "
                          f"{gap['max_step_rel_gap']:.2%} (largest at step {gap['at_single_step']})")
            print(f"{vname}: {r['steps']} steps, compile {r['compile_s']:.1f} s, train {r['train_s']:.1f} s, "
                  f"{r['tokens_per_s'] or 0:,.0f} tokens/s, whole-split val {r['val_bpb']:.4f} bits/byte "
                  f"(sampled {r['val_bpb_sampled']:.4f}), {r['stage_wall_s'] + r['eval_s']:.0f} s in all", flush=True)
        except Exception as e:  # one broken variant must not cost the others' figures
            traceback.print_exc()
            r = {"name": vname, "settings": settings, "error": f"{type(e).__name__}: {e}"}
            print(f"{vname}: FAILED {r['error']}", flush=True)
        report["variants"].append(r)
        if json_path is not None:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(report, indent=1))
    report["wall_s"] = time.perf_counter() - t0
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=1))
    print(table(report["variants"]))
    return report


if __name__ == "__main__":
    main()
