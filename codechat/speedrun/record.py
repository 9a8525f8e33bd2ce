"""One JSON line per speedrun, appended to a history file (``codechat speedrun --record FILE``).

The line (every key always present; ``None`` where the run had no such stage)::

    date            UTC time the run ended, ISO 8601 (``2026-12-03T21:04:11Z``)
    commit          $CODECHAT_COMMIT if set (a copy of the tree whose .git is stale), else ``git rev-parse HEAD``
                    of the checkout codechat runs from, else None; ``+dirty`` appended when tracked files differ
    command         the command line, ``codechat speedrun ...`` (shell-quoted)
    preset, device  the model preset and the torch device
    machine         {"gpu": name or None, "cpu": model name or None, "cores": n}
                    (:func:`codechat.config.device.machine`; None in runs written before it): the same
                    GPU trains less on a slower host
    pretrain_train_s  seconds pretraining trained (its first step included); sft_steps chat SFT's optimizer steps
    total_wall_s    seconds of all stages (setup excluded), float
    val_bpb         whole-split validation bits per byte after pretraining
    humaneval       {"pass@1": p, "pass@10": p, "pass@1_ci95": [lo, hi], "problems": n} as fractions (None where
                    k > n; the interval over problems): the SFT model's
    humaneval_after_rl  the same for the RL model, None when GRPO did not run; with ``before_same_problems``
                    (the SFT model's figures over the same problems) when a deadline scored fewer problems
    mbpp            the same on MBPP's test split (with ``--mbpp``), the SFT model's
    mbpp_after_rl   the same for the RL model, None when GRPO did not run (or without ``--mbpp``)
    funcall         parse_rate, schema_valid_rate, name_accuracy, arguments_exact_match, no_call_accuracy
                    (fractions) of the held-out function-calling evaluation (with ``--funcall-data``)
                    and of its call turns: no_call, cut_by_length, does_not_parse, rejected (counts),
                    finished_parse_rate, finished_schema_valid_rate (over the calls begun and ended)
    funcall_strict  the same with every reply under the strict tool grammar (``--funcall-data``
                    with the grammar extra installed; None otherwise)
    rl_ran          True when GRPO trained (not skipped), rl_steps its optimizer steps (0 when skipped),
                    rl_reward_first5 / rl_reward_last5 the mean reward over its first / last 5 steps
    rl_tasks_kept   tasks the pass-rate filter kept, of rl_pool tasks in the pool (None when no filter ran)
    rl_heldout      {"tasks": k, "before": p, "after": p, "before_ci95": [lo, hi], "after_ci95": [lo, hi]}:
                    pass@1 of the kept tasks GRPO never trained on, on sft/ and rl/ (None without a slice);
                    ``pretrain``: of its corpus-mined tasks on pretrain/ in base mode (None: none such);
                    ``change``: [after - before, lo, hi], the paired 95% interval over its tasks;
                    ``by_part``: {part of the pool (``MBPP``, ``io``, ``doctest``): [tasks, before, after]};
                    ``by_filter_rate``: the same for its tasks solved below half / at least half the time at the
                    pass-rate filter
    rl_planned      False when the plan had no RL stage (``--rl off``, or ``auto``'s rule), with ``rl_reason``
    mid_share       the share of pretraining's time given to mid-training (``--mid-share``; 0: none)
    segments        the invocations the run took: 1, or more when stopped (``--stop-after-min``, SIGTERM)
                    and resumed; ``run_wall_s`` their wall seconds together (what the budget bounds)

The file is appended with one ``write`` of a whole line, so concurrent runs and a crash never leave
a half line in the middle of the history.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

FUNCALL_KEYS = ("parse_rate", "schema_valid_rate", "name_accuracy", "arguments_exact_match", "no_call_accuracy")
#: How the call turns' replies ended, and the rates over finished calls (:func:`codechat.eval.funcall.summarise`).
FUNCALL_OUTCOMES = ("no_call", "cut_by_length", "does_not_parse", "rejected", "finished_parse_rate",
                    "finished_schema_valid_rate")


def current_commit() -> str | None:
    """$CODECHAT_COMMIT, else the HEAD of codechat's own checkout (``+dirty`` when tracked files changed)."""
    if os.environ.get("CODECHAT_COMMIT"):
        return os.environ["CODECHAT_COMMIT"]
    repo = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            p = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return p.stdout.strip() if p.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if head is None:
        return None
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def _passk(ev: dict[str, Any] | None) -> dict[str, Any] | None:
    if not ev:
        return None
    out = {**{k: ev.get("pass@k", {}).get(k) for k in ("pass@1", "pass@10")}, "pass@1_ci95": ev.get("pass@1_ci95"),
           "problems": ev.get("problems")}
    return {**out, "before_same_problems": _passk(same)} if (same := ev.get("before_same_problems")) else out


def mean_reward(curve: list[dict[str, Any]]) -> float | None:
    """The mean of ``reward_mean`` over GRPO curve rows ``curve`` (None for none): the record's and the report's
    first-5 and last-5 figures."""
    return sum(r["reward_mean"] for r in curve) / len(curve) if curve else None


def heldout_by_part(heldout: dict[str, Any]) -> dict[str, list]:
    """``{part: [tasks, pass@1 before, pass@1 after]}`` of the RL held-out slice (``heldout.json``: ``before`` and
    ``after`` each with ``by_part``, :func:`codechat.train.rl_heldout.by_part`); empty for figures without it.
    The record's ``rl_heldout.by_part`` and the report's row."""
    return {part: [b["tasks"], b["pass@1"], heldout["after"]["by_part"][part]["pass@1"]]
            for part, b in (heldout["before"].get("by_part") or {}).items()}


def heldout_change(heldout: dict[str, Any]) -> list[float] | None:
    """``[after - before, lo, hi]``: the change of the RL held-out slice's pass@1 and its 95% paired bootstrap
    interval over tasks (:func:`codechat.eval.passk.bootstrap_interval` of each task's after-minus-before rate,
    from ``heldout.json``'s per-task ``solved`` counts); None without them. The two pass@1 intervals of the
    slice are each mostly the spread between its tasks, which the paired interval cancels: it says whether RL
    moved the slice at all (``benchmarks/RESULTS.md``, eighteenth session: -3.3 points [-6.4, -0.3] at d39a339)."""
    from codechat.eval.passk import bootstrap_interval
    b, a, n = heldout["before"].get("solved"), heldout["after"].get("solved"), heldout["before"].get("samples")
    if not b or not a or not n:
        return None
    diffs = [(a[t] - c) / n for t, c in b.items()]
    ci = bootstrap_interval(diffs)
    return [sum(diffs) / len(diffs), *ci] if ci else None


def heldout_by_rate(heldout: dict[str, Any]) -> dict[str, list]:
    """``{"below_half" | "half_or_more": [tasks, pass@1 before, pass@1 after]}`` of the RL held-out slice, its tasks
    split by their rate at the pass-rate filter (``heldout.json``'s ``before.filter_solved`` of ``filter_samples``;
    of ``samples`` in figures written before ``filter_samples`` was); empty without it.
    Whether GRPO taught something that carries over or only sharpened each task's mode: sharpening
    alone raises the tasks solved more often than not and lowers the rest, and the slice's mean can stay flat.
    The filter's samples are an independent reading of the same policy: split by the "before" counts instead,
    the groups would move apart by regression to the mean alone (``benchmarks/RESULTS.md``, seventeenth session)."""
    from codechat.train.rl_heldout import by_part
    at, b, a, n = (heldout["before"].get("filter_solved"), heldout["before"].get("solved"),
                   heldout["after"].get("solved"), heldout["before"].get("samples"))
    if not at or not b or not a or not n:
        return {}
    filter_n = heldout["before"].get("filter_samples", n)

    def rate(task_id: str) -> str:
        return "below_half" if 2 * at[task_id] < filter_n else "half_or_more"
    before, after = by_part(b, n, rate), by_part(a, n, rate)
    return {g: [before[g]["tasks"], before[g]["pass@1"], after[g]["pass@1"]]
            for g in ("below_half", "half_or_more") if g in before}


def record_line(m: dict[str, Any], command: str, commit: str | None) -> dict[str, Any]:
    """The history line of a finished speedrun whose ``metrics.json`` is ``m`` (keys: module docstring)."""
    rl = m.get("rl") or {}
    rl_ran = bool(rl) and rl.get("skipped") is False
    fc = m.get("funcall_eval")
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit, "command": command,
            "preset": m.get("preset"), "device": m.get("device"), "machine": m.get("machine"),
            "total_wall_s": m.get("total_wall_s"),
            "pretrain_train_s": (m.get("pretrain") or {}).get("train_time_s"),
            "sft_steps": (m.get("sft") or {}).get("steps"),
            "val_bpb": (m.get("pretrain") or {}).get("val_bpb_final"),
            "humaneval": _passk((m.get("eval") or {}).get("humaneval")),
            "humaneval_after_rl": _passk(rl.get("humaneval")) if rl_ran else None,
            "mbpp": _passk(m.get("mbpp")),
            "funcall": {k: fc.get(k) for k in (*FUNCALL_KEYS, *FUNCALL_OUTCOMES)} if fc else None,
            "funcall_strict": {k: fc["strict"].get(k) for k in (*FUNCALL_KEYS, *FUNCALL_OUTCOMES)}
            if fc and fc.get("strict") else None,
            "mbpp_after_rl": _passk(rl.get("mbpp")) if rl_ran else None,
            "rl_ran": rl_ran, "rl_steps": int(rl.get("steps") or 0) if rl_ran else 0,
            "rl_reward_first5": mean_reward((rl.get("curve") or [])[:5]) if rl_ran else None,
            "rl_reward_last5": mean_reward((rl.get("curve") or [])[-5:]) if rl_ran else None,
            "rl_tasks_kept": (rl.get("filter") or {}).get("kept"), "rl_pool": (rl.get("pool") or {}).get("tasks"),
            "rl_heldout": {"tasks": h["before"]["tasks"], "before": h["before"]["pass@1"], "after": h["after"]["pass@1"],
                           "before_ci95": h["before"]["pass@1_ci95"], "after_ci95": h["after"]["pass@1_ci95"],
                           "pretrain": (rl.get("heldout_pretrain") or {}).get("pass@1"),
                           "change": heldout_change(h), "by_part": heldout_by_part(h),
                           "by_filter_rate": heldout_by_rate(h)}
            if rl_ran and (h := rl.get("heldout")) else None,
            "rl_planned": (m.get("plan") or {}).get("rl", True), "rl_reason": (m.get("plan") or {}).get("rl_reason", ""),
            "mid_share": (m.get("plan") or {}).get("mid_share", 0.0),
            "segments": len(m.get("segments") or [None]),
            "run_wall_s": sum(seg["wall_s"] for seg in m["segments"]) if m.get("segments") else m.get("total_wall_s")}


def append_record(path: Path, line: dict[str, Any]) -> None:
    """Append ``line`` as one JSON line to ``path`` (parents created; one ``write``, then fsync)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
        f.flush()
        os.fsync(f.fileno())
