"""The speedrun: tokenizer -> corpus -> pretraining -> samples -> SFT -> chat -> HumanEval -> report.

Writes ``report.md`` and ``metrics.json`` into the run directory.

On a CPU it trains the ``tiny`` preset to a time budget sized so that the whole command ends
within 15 minutes on 2 cores; on a GPU it picks a preset sized to ``--time-budget-min`` and
adds the machine's installed Python packages to the corpus.
"""
from __future__ import annotations

import json
import site
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .config import (OptimConfig, PretrainConfig, RunConfig, SFTConfig, SFTStageConfig, TrainConfig, load,
                     pretrain_recipe, replace, to_dict)
from .data.corpus import build_corpus, iter_split_texts, load_index, read_split
from .completion import best_completion, sample_completions
from .engine import SamplingConfig
from .report import (compression_baselines, markdown_table, parses_after_dropping_last_line, plot_loss,
                     read_metrics, write_atomic)
from .tokenizer import Tokenizer, train_tokenizer
from .data.windows import eval_windows
from .device import autocast_for, resolve_device
from .train.pretrain import bpb_evaluator, run_pretrain
from .train.sft import run_sft


@dataclass(frozen=True)
class SpeedrunPlan:
    """What a speedrun does on this machine (every number a field, chosen by :func:`plan`)."""

    preset: str
    time_budget_min: float
    sources: tuple[str, ...]
    max_files: int = 0
    sample_prompts: tuple[str, ...] = (
        "import os\nimport sys\n\n\ndef main():\n",
        "def read_lines(path):\n    \"\"\"Return the lines of a text file.\"\"\"\n",
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
        "def count_words(text):\n    counts = {}\n    for word in text.split():\n",
        "import unittest\n\n\nclass TestMath(unittest.TestCase):\n    def test_sum(self):\n",
    )
    # Completions stop where the function or class they complete ends; 256 tokens lets most end
    # (cut at 120 tokens, even the stdlib's own function bodies parse only ~75% of the time).
    sample_tokens: int = 256
    # Low-temperature nucleus sampling, not greedy: greedy decoding of a small model falls into
    # loops (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration", ICLR).
    sample_temperature: float = 0.3
    sample_top_p: float = 0.95
    # Samples per prompt; the report shows the best (completion.best_completion): most of the tiny
    # model's samples loop until the token budget cuts them, and one that ended its function is
    # the model's own answer (benchmarks/RESULTS.md: +0 to +7 of 15 completions parse).
    sample_best_of: int = 8
    sft_time_budget_min: float = 1.25
    sft_max_length: int = 384
    sft_max_prompt_length: int = 128
    chat_prompts: tuple[str, ...] = (
        "Write a Python function `add(a, b)` that returns the sum of a and b.",
        "Write a Python function `is_even(n)` that says whether n is even.",
        "Write a Python function `reverse_words(s)` that reverses the order of the words in s.",
    )
    chat_tokens: int = 120
    eval_limit: int = 40  # HumanEval problems (0: all 164)
    eval_n: int = 2  # samples per problem
    eval_tokens: int = 128
    eval_temperature: float = 0.8


#: Presets a GPU speedrun picks by time budget: (minutes at most, preset).
GPU_PRESET_BY_BUDGET = ((45.0, "d12"), (240.0, "d20"), (float("inf"), "1b"))
CPU_TIME_BUDGET_MIN = 9.0
GPU_TIME_BUDGET_MIN = 30.0
GPU_SFT_SHARE = 0.15  # SFT minutes per pretraining minute on a GPU
#: Where the speedrun's data comes from, for the report.
LICENSES = {"pretraining corpus": "this Python's standard library (PSF License)"
                                  " [+ installed site-packages on GPU: each package's own licence]",
            "SFT data": "docstring -> function pairs mined from the same standard library (PSF License)"}


def plan(device: torch.device, preset: str | None, time_budget_min: float | None, max_files: int = 0
         ) -> SpeedrunPlan:
    """Preset, budget and corpus for ``device`` (explicit arguments win)."""
    stdlib = sysconfig.get_paths()["stdlib"]
    if device.type == "cuda":
        budget = time_budget_min or GPU_TIME_BUDGET_MIN
        chosen = preset or next(p for limit, p in GPU_PRESET_BY_BUDGET if budget <= limit)
        packages = tuple(d for d in site.getsitepackages() if Path(d).is_dir())
        return SpeedrunPlan(chosen, budget, (stdlib, *packages), max_files,
                            sft_time_budget_min=budget * GPU_SFT_SHARE, sft_max_length=1024, sft_max_prompt_length=512,
                            eval_limit=0, eval_n=20, eval_tokens=512)
    budget = time_budget_min or CPU_TIME_BUDGET_MIN
    return SpeedrunPlan(preset or "tiny", budget, (stdlib,), max_files,
                        sft_time_budget_min=min(SpeedrunPlan.sft_time_budget_min, budget))


def _timed(fn, *args, **kwargs) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def run_speedrun(preset: str | None = None, out: str | None = None, time_budget_min: float | None = None,
                 seed: int | None = None, device: str = "auto", max_files: int = 0,
                 eval_limit: int | None = None) -> dict[str, Any]:
    """Run every stage into ``out`` and write ``report.md`` and ``metrics.json``; returns the metrics."""
    t_start = time.perf_counter()
    dev = resolve_device(device)
    p = plan(dev, preset, time_budget_min, max_files)
    if eval_limit is not None:
        p = replace(p, eval_limit=eval_limit)
    run = Path(out or f"runs/speedrun-{p.preset}")
    run.mkdir(parents=True, exist_ok=True)
    base = pretrain_recipe(p.preset)
    data_cfg = replace(base.data, src=p.sources, max_files=p.max_files)
    metrics: dict[str, Any] = {"preset": p.preset, "device": str(dev), "time_budget_min": p.time_budget_min}

    # 1. tokenizer (trained on the train split only)
    tok_dir = run / "tokenizer"
    print(f"[1/7] tokenizer: vocab {data_cfg.vocab_size} on {', '.join(p.sources)}")
    texts = iter_split_texts(p.sources, "train", extensions=data_cfg.extensions, val_fraction=data_cfg.val_fraction,
                             max_bytes=data_cfg.tokenizer_max_bytes, max_files=p.max_files)
    tok, wall = _timed(train_tokenizer, texts, data_cfg.vocab_size)
    tok.save(tok_dir)
    metrics["tokenizer"] = {"wall_s": wall, "vocab_size": tok.vocab_size}

    # 2. corpus -> token shards
    data_dir = run / "data"
    print(f"[2/7] corpus -> {data_dir}")
    index, wall = _timed(build_corpus, p.sources, tok_dir, data_dir, extensions=data_cfg.extensions,
                         val_fraction=data_cfg.val_fraction, max_files=p.max_files)
    index = load_index(data_dir)
    sp = index["splits"]
    metrics["data"] = {"wall_s": wall, "files_seen": index["files_seen"], "skipped": index["skipped"],
                       **{f"{s}_{k}": sp[s][k] for s in ("train", "val") for k in ("documents", "tokens", "bytes")}}
    metrics["tokenizer"]["val_bytes_per_token"] = sp["val"]["bytes"] / max(1, sp["val"]["tokens"] - sp["val"]["documents"])

    # 3. baselines on the validation documents
    print("[3/7] compression baselines on the validation split")
    docs = _val_documents(tok, data_dir)
    metrics["baseline"], wall = _timed(compression_baselines, docs)
    metrics["baseline"]["wall_s"] = wall
    _save(run, metrics)

    # 4. pretraining to the time budget
    print(f"[4/7] pretraining {p.preset} for {p.time_budget_min:g} min on {dev}")
    overrides = {"train.max_steps": 0, "train.time_budget_s": p.time_budget_min * 60}
    cfg = load(PretrainConfig, None, overrides, base=replace(
        base, data=replace(data_cfg, data_dir=str(data_dir), tokenizer_dir=str(tok_dir)),
        run=RunConfig(out=str(run / "pretrain"), seed=seed if seed is not None else base.run.seed, device=device)))
    result, wall = _timed(run_pretrain, cfg)
    full, full_wall = _timed(_full_split_bpb, run / "pretrain", data_dir, cfg, dev)
    rows = read_metrics(run / "pretrain" / "metrics.jsonl")
    val = [r for r in rows if "val_bpb" in r]
    train_rows = [r for r in rows if "tokens_per_s" in r]
    metrics["pretrain"] = {
        "wall_s": wall, "steps": result["step"], "params": result["params"], "train_time_s": result["elapsed_s"],
        "tokens_seen": result["step"] * cfg.train.micro_batch_size * cfg.train.accum_steps(1) * cfg.data.seq_len,
        "tokens_per_s": _median([r["tokens_per_s"] for r in train_rows]),
        "mfu": _median([r["mfu"] for r in train_rows if "mfu" in r]) if any("mfu" in r for r in train_rows) else None,
        "val_bpb_initial": val[0]["val_bpb"], "val_bpb_final": full["val_bpb"], "val_loss_final": full["val_loss"],
        "val_bpb_final_sampled": val[-1]["val_bpb"], "full_split_eval_s": full_wall, "train_loss_final": train_rows[-1]["loss"] if train_rows else None,
        "config": to_dict(cfg)}
    plot_loss(rows, run / "loss.png", f"{p.preset} pretraining on {dev.type}")
    _save(run, metrics)

    # 5. samples
    print("[5/7] samples")
    seed = seed if seed is not None else base.run.seed
    samples, wall = _timed(_samples, run / "pretrain", p, dev, seed)
    metrics["samples"] = {"wall_s": wall, "n": len(samples), "parse_ok": sum(s["parses"] for s in samples),
                          "best_of": p.sample_best_of,
                          "parse_ok_first_sample": sum(s["parses_each"][0] for s in samples),
                          "parse_ok_all_samples": sum(sum(s["parses_each"]) for s in samples),
                          "finished_all_samples": sum(sum(s["finished_each"]) for s in samples),
                          "temperature": p.sample_temperature, "top_p": p.sample_top_p, "max_new_tokens": p.sample_tokens}

    # 6. chat SFT on mined docstring -> function pairs
    print(f"[6/7] SFT for {p.sft_time_budget_min:g} min on mined docstring -> function pairs")
    sft_cfg = SFTStageConfig(
        init=str(run / "pretrain"),
        sft=SFTConfig(max_length=p.sft_max_length, max_prompt_length=p.sft_max_prompt_length, packing=True,
                      mine_src=p.sources[:1], mine_max_files=p.max_files, seed=seed),
        train=TrainConfig(time_budget_s=p.sft_time_budget_min * 60, micro_batch_size=cfg.train.micro_batch_size,
                          log_every=10, eval_every=10**9, save_every=10**9, compile=cfg.train.compile),
        optim=OptimConfig(lr=cfg.optim.lr / 2, warmup_steps=10, schedule="linear", min_lr_ratio=0.0, weight_decay=0.0),
        run=RunConfig(out=str(run / "sft"), seed=seed, device=device))
    sft, wall = _timed(run_sft, sft_cfg)
    sft_evals = [r["eval_loss"] for r in read_metrics(run / "sft" / "metrics.jsonl") if "eval_loss" in r]
    pre_c, dec = sft["data"]["preflight"], sft["data"]["decontamination"] or {}
    metrics["sft"] = {"wall_s": wall, "steps": sft["step"], "examples_seen": pre_c["seen"],
                      "examples_kept": pre_c["kept"], "examples_prompt_truncated": pre_c["prompt_truncated"],
                      "examples_completion_truncated": pre_c["completion_truncated"],
                      "examples_dropped": sum(pre_c["dropped"].values()), "examples_decontaminated": dec.get("excluded", 0),
                      "supervised_token_share": sft["data"]["supervised_share"],
                      "loss_initial": sft_evals[0], "loss_final": sft_evals[-1], "train_loss_final": sft.get("loss")}
    chats, wall = _timed(_chats, run / "sft", p, dev, seed)
    metrics["chat"] = {"wall_s": wall, "n": len(chats)}
    _save(run, metrics)

    # 7. HumanEval pass@1 of the chat model, and the verdict for RL
    print(f"[7/7] HumanEval pass@1 ({p.eval_limit or 'all'} problems x {p.eval_n} samples)")
    res, wall = _timed(_humaneval, run, p, dev, seed)
    metrics["eval"] = {"wall_s": wall, "humaneval": {"pass@1": res["pass@1"], "pass@1_stderr": res["pass@1_stderr"],
                                                     "problems": res["problems"], "n": res["n"]},
                       "verdict": res["verdict_band"], "verdict_text": res["verdict"]}
    metrics["total_wall_s"] = time.perf_counter() - t_start

    _save(run, metrics)
    write_atomic(run / "report.md", _report(metrics, samples, chats))
    print(f"val_bpb {metrics['pretrain']['val_bpb_final']:.3f} vs gzip {metrics['baseline']['gzip_bpb']:.3f}; "
          f"report: {run / 'report.md'}")
    return metrics


def _full_split_bpb(stage: Path, data_dir: Path, cfg: PretrainConfig, device: torch.device) -> dict[str, float]:
    """Validation loss and bits per byte of the final model over (nearly) every token of the val split.

    The trainer evaluates a capped, evenly spread sample of windows; the headline figure compared
    with gzip uses the whole split, the same bytes gzip compresses (less each shard's last
    partial window).
    """
    from .checkpoint import load_model
    model, tok, _ = load_model(stage, device)
    rows = eval_windows(read_split(data_dir, "val"), cfg.data.seq_len)
    evaluate = bpb_evaluator(rows, torch.tensor(tok.token_byte_lengths(), dtype=torch.long),
                             cfg.train.micro_batch_size)
    with torch.no_grad(), autocast_for(device, cfg.train.dtype):
        return evaluate(model)


def _save(run: Path, metrics: dict[str, Any]) -> None:
    """Write what is known so far, so a run that dies late still leaves its figures."""
    write_atomic(run / "metrics.json", json.dumps(metrics, indent=1))


def _median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def _val_documents(tok: Tokenizer, data_dir: Path) -> list[bytes]:
    """The validation documents as UTF-8 bytes, decoded back from the shards (split on ``<|end|>``)."""
    docs: list[bytes] = []
    for shard in read_split(data_dir, "val"):
        ids = shard.tolist()
        start = 0
        for i, t in enumerate(ids):
            if t == tok.end_id:
                docs.append(tok.decode(ids[start:i]).encode("utf-8"))
                start = i + 1
    return docs


def _samples(stage: Path, p: SpeedrunPlan, device: torch.device, seed: int) -> list[dict[str, Any]]:
    """Per prompt: the best of ``p.sample_best_of`` completions, and whether each sample parses."""
    from .checkpoint import load_model
    model, tok, _ = load_model(stage, device)
    cfg = SamplingConfig(max_new_tokens=p.sample_tokens, temperature=p.sample_temperature, top_p=p.sample_top_p)
    out = []
    for i, prompt in enumerate(p.sample_prompts):
        cands = sample_completions(model, tok, prompt, cfg, p.sample_best_of, seed=seed + i)
        best = best_completion(cands)
        out.append({"prompt": prompt, "text": prompt + best.text, "finished": best.finished,
                    "mean_logprob": best.mean_logprob, "parses": parses_after_dropping_last_line(prompt + best.text),
                    "parses_each": [parses_after_dropping_last_line(prompt + c.text) for c in cands],
                    "finished_each": [c.finished for c in cands]})
    return out


def _chats(stage: Path, p: SpeedrunPlan, device: torch.device, seed: int) -> list[dict[str, str]]:
    from .chat import Conversation, Message
    from .chat_repl import reply
    from .checkpoint import load_model
    model, tok, _ = load_model(stage, device)
    cfg = SamplingConfig(max_new_tokens=p.chat_tokens, temperature=p.sample_temperature, top_p=p.sample_top_p)
    return [{"prompt": q, "answer": reply(model, tok, Conversation([Message("user", q)]), cfg, seed=seed + i).content}
            for i, q in enumerate(p.chat_prompts)]


def _humaneval(run: Path, p: SpeedrunPlan, device: torch.device, seed: int) -> dict[str, Any]:
    from .checkpoint import load_model
    from .eval.suites import format_summary, run_suite
    model, tok, state = load_model(run / "sft", device)
    res = run_suite(model, tok, out_dir=run / "eval" / "humaneval", suite="humaneval", stage=state["meta"]["stage"],
                    n=p.eval_n, ks=(1,), temperature=p.eval_temperature, max_new_tokens=p.eval_tokens,
                    limit=p.eval_limit or None, seed=seed, progress=False, model_id=str(run / "sft"))
    print(format_summary(res))
    return res


def _report(m: dict[str, Any], samples: list[dict[str, Any]], chats: list[dict[str, str]]) -> str:
    pre, base, data = m["pretrain"], m["baseline"], m["data"]
    c = pre["config"]
    lines = [f"# codechat speedrun — `{m['preset']}` on {m['device']}", "",
             f"Total wall time {m['total_wall_s'] / 60:.1f} min. The model compresses unseen Python to "
             f"**{pre['val_bpb_final']:.3f} bits/byte** against gzip -9's {base['gzip_bpb']:.3f} "
             f"(each validation document compressed on its own).", "",
             "## Data", markdown_table([
                 ("corpus", ", ".join(c["data"]["src"])), ("files seen", data["files_seen"]),
                 ("skipped", ", ".join(f"{k} {v}" for k, v in data["skipped"].items())),
                 ("train documents / tokens / bytes", f"{data['train_documents']:,} / {data['train_tokens']:,} / "
                                                      f"{data['train_bytes']:,}"),
                 ("val documents / tokens / bytes", f"{data['val_documents']:,} / {data['val_tokens']:,} / "
                                                    f"{data['val_bytes']:,}"),
                 ("vocabulary", m["tokenizer"]["vocab_size"]),
                 ("val bytes per token", m["tokenizer"]["val_bytes_per_token"])]), "",
             "## Model and training", markdown_table([
                 ("preset", m["preset"]), ("parameters", pre["params"]),
                 ("layers / width / heads / kv heads", f"{c['model']['n_layer']} / {c['model']['n_embd']} / "
                                                       f"{c['model']['n_head']} / {c['model']['n_kv_head']}"),
                 ("sequence length", c["data"]["seq_len"]),
                 ("batch (rows x accum)", f"{c['train']['micro_batch_size']} x {c['train']['grad_accum']}"),
                 ("optimizer steps", pre["steps"]), ("tokens seen", pre["tokens_seen"]),
                 ("tokens/s (median)", pre["tokens_per_s"]),
                 ("MFU", f"{pre['mfu']:.1%}" if pre["mfu"] is not None else "n/a (no known peak on this device)"),
                 ("val bits/byte, evenly spread sample: initial -> final",
                  f"{pre['val_bpb_initial']:.3f} -> {pre['val_bpb_final_sampled']:.3f}"),
                 ("val bits/byte, whole split (final model)", f"{pre['val_bpb_final']:.3f}")]),
             "", "![loss curve](loss.png)", "",
             "## Baselines (bits per byte on the validation split)", markdown_table([
                 ("codechat model (whole split)", pre["val_bpb_final"]), ("gzip -9, per document", base["gzip_bpb"]),
                 ("gzip -9, whole split as one stream", base["gzip_concat_bpb"]),
                 ("xz -9, whole split as one stream", base["xz_concat_bpb"])]), "",
             "## Chat SFT", markdown_table([
                 ("examples seen / kept (preflight)", f"{m['sft']['examples_seen']:,} / {m['sft']['examples_kept']:,}"),
                 ("prompt- / completion-truncated", f"{m['sft']['examples_prompt_truncated']} / "
                                                    f"{m['sft']['examples_completion_truncated']}"),
                 ("dropped", m["sft"]["examples_dropped"]),
                 ("excluded as overlapping HumanEval/MBPP", m["sft"]["examples_decontaminated"]),
                 ("supervised share of tokens", f"{m['sft']['supervised_token_share']:.1%}"),
                 ("optimizer steps", m["sft"]["steps"]),
                 ("loss on a fixed set of its examples: step 0 -> end",
                  f"{m['sft']['loss_initial']:.3f} -> {m['sft']['loss_final']:.3f}")]), "",
             "## HumanEval (chat model, sandboxed execution)", markdown_table([
                 ("problems x samples", f"{m['eval']['humaneval']['problems']} x {m['eval']['humaneval']['n']}"),
                 ("pass@1", f"{m['eval']['humaneval']['pass@1']:.1%} ± {m['eval']['humaneval']['pass@1_stderr']:.1%}"),
                 ("verdict for RL", m["eval"]["verdict_text"])]), "",
             "## Data sources and licences", markdown_table(list(LICENSES.items())), "",
             "## Time per stage", markdown_table([(k, f"{m[k]['wall_s']:.1f} s") for k in
                                                  ("tokenizer", "data", "baseline", "pretrain", "samples", "sft",
                                                   "chat", "eval")]), "",
             "## Completions ({parse_ok} of {n} parse with `ast.parse` once the last, unfinished line is dropped)"
             .format(**m["samples"]), "",
             "Each is the best of {best_of} samples (temperature {temperature}, top-p {top_p}, at most "
             "{max_new_tokens} new tokens, ended with the function or class its prompt ends in): of those that "
             "finished — ended their function before the budget — the one with the highest mean token "
             "log-probability. Of all {total} samples, {finished_all_samples} finished and "
             "{parse_ok_all_samples} parse; the first sample of each prompt alone: {parse_ok_first_sample} of {n}."
             .format(total=m["samples"]["n"] * m["samples"]["best_of"], **m["samples"]), ""]
    for s in samples:
        verdict = ("parses" if s["parses"] else "does not parse") + ("" if s["finished"] else ", cut by the budget")
        lines += [f"**{verdict}** (mean log-prob {s['mean_logprob']:.2f} nats/token)", "", "```python", s["text"],
                  "```", ""]
    lines += ["## Chat answers (after SFT)", ""]
    for c in chats:
        lines += [f"**user:** {c['prompt']}", "", "```", c["answer"], "```", ""]
    return "\n".join(lines)

