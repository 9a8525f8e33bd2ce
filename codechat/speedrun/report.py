"""The run's report card: the loss-curve and throughput plots and the speedrun's ``report.md`` (the compression
baselines it shows: :mod:`.baselines`)."""
from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from codechat.speedrun.record import heldout_by_part, heldout_by_rate, heldout_change, mean_reward


def parses_after_dropping_last_line(code: str) -> bool:
    """Whether ``code`` minus its last (possibly unfinished) line is valid Python."""
    lines = code.split("\n")
    try:
        ast.parse("\n".join(lines[:-1]) if len(lines) > 1 else "")
        return True
    except (SyntaxError, ValueError):
        return False


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` file (empty when it does not exist)."""
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


#: The curves :func:`plot_loss` draws: a ``metrics.jsonl`` key, its legend label and its line style.
#: ``eval_loss`` is the SFT stage's loss on a fixed set of its examples (``sft.eval_examples``,
#: taken from the training data: not held out).
CURVES = (("loss", "train loss (nats/token)", "-"), ("val_loss", "val loss (nats/token)", "o-"),
          ("eval_loss", "loss on a fixed set of its examples (nats/token)", "o-"))


def loss_curves(rows: Iterable[dict[str, Any]]) -> list[tuple[str, str, list[int], list[float]]]:
    """``(label, style, steps, losses)`` of every curve of :data:`CURVES` that ``rows`` (a
    ``metrics.jsonl``'s) hold, losses in nats/token."""
    rows = list(rows)
    out = []
    for key, label, style in CURVES:
        points = [(r["step"], r[key]) for r in rows if key in r]
        if points:
            out.append((label, style, [s for s, _ in points], [v for _, v in points]))
    return out


def plot_loss(rows: Iterable[dict[str, Any]], png: Path, title: str) -> Path:
    """The curves of :func:`loss_curves` (train loss; the validation loss in pretraining, the
    fixed-examples loss in SFT) against the optimizer step on one pair of axes with a legend, as a
    PNG. Returns ``png``."""
    return _plot(loss_curves(rows), png, title, "optimizer step", "loss")


def plot_throughput(rows: Iterable[dict[str, Any]], png: Path, title: str) -> Path:
    """Training tokens/s over the training time (each ``metrics.jsonl`` row with ``tokens_per_s`` and
    ``elapsed_s``: the mean over its logging window), so a slowdown (a busy machine, a thermal limit)
    shows where a median hides it. Returns ``png``."""
    pts = [(r["elapsed_s"] / 60, r["tokens_per_s"]) for r in rows if "tokens_per_s" in r and "elapsed_s" in r]
    return _plot([("tokens/s (each logging window)", ".-", [x for x, _ in pts], [y for _, y in pts])], png, title,
                 "training time (min, steps only)", "tokens/s", ylim=(0, max([y for _, y in pts], default=1) * 1.1))


def _plot(curves: Iterable[tuple[str, str, list, list]], png: Path, title: str, xlabel: str, ylabel: str = "",
          ylim: tuple[float, float] | None = None) -> Path:
    """``curves`` (label, matplotlib style, xs, ys) on one pair of axes, written to ``png``. A curve of one
    point gets a marker (a line of one point draws nothing), a curve of none is left out, and the legend
    names the curves drawn (with none drawn, the axes say so)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = [c for c in curves if len(c[2])]
    for label, style, xs, ys in drawn:
        line, = ax.plot(xs, ys, style, label=label)
        if len(xs) == 1 and line.get_marker() == "None":
            line.set_marker("o")
    ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no points logged", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def _throughput(pre: dict[str, Any]) -> str:
    """Pretraining's tokens/s, median and the slowest decile's edge (runs recorded before that have the median)."""
    p10 = pre.get("tokens_per_s_p10")
    return _fmt(pre["tokens_per_s"]) + (f"; {_fmt(p10)}" if p10 is not None else "")


def _first_step(pre: dict[str, Any]) -> str:
    """The first step's seconds, and what the compile warm-up (``compile_warmup``) did before it."""
    w = pre.get("compile_warmup")
    return f"{pre['first_step_s']:.1f} s" + (
        "" if not w else f"; the graphs compiled beforehand in the background in {w['warmup_s']:.0f} s "
                         f"(the stage waited {w['waited_s']:.0f} s for them)" if w["done"] else
        f"; the background compile warm-up {'failed: ' + w['error'] if w.get('error') else 'was stopped, late'}")


def _final_bpb_row(pre: dict[str, Any]) -> tuple[str, str]:
    """The headline val bits/byte row: the whole split, or the evenly spread part of it the stage's time allowed."""
    if pre.get("val_bpb_final_complete", True):
        return "val bits/byte, whole split (final model)", f"{pre['val_bpb_final']:.3f}"
    return (f"val bits/byte, an evenly spread {pre['val_bytes_scored'] / pre['val_bytes_total']:.0%} of the split "
            f"({pre['val_bytes_scored']:,} of {pre['val_bytes_total']:,} bytes: the stage's time ran out; final model)",
            f"{pre['val_bpb_final']:.3f}")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def markdown_table(rows: Sequence[tuple[str, Any]]) -> str:
    return "| | |\n|---|---|\n" + "".join(f"| {k} | {_fmt(v)} |\n" for k, v in rows)


#: A finished stage's status: ``done``, or ``skipped`` with a ``reason`` (:class:`codechat.speedrun.run.Speedrun`).
FINISHED = ("done", "skipped")


def _outcomes(f: dict[str, Any]) -> str:
    """How a function-calling pass's call turns ended, when not in a call (``-`` for a run made before they were counted)."""
    if "cut_by_length" not in f:
        return "-"
    return (f"{f['no_call']} no call, {f['cut_by_length']} cut by length, {f['does_not_parse']} do not parse"
            + (f", {f['rejected']} rejected tokens (a bug)" if f.get("rejected") else ""))


def _section(m: dict[str, Any], stage: str) -> bool:
    """Whether ``stage`` has a section: it finished and ran (a stage the loop skipped without running it,
    ``not_run``, has only its reason, in the time table)."""
    return (m.get("stages", {}).get(stage, {}).get("status") in FINISHED and stage in m
            and not m[stage].get("not_run"))


def _decontamination_lines(dec: dict[str, Any] | None) -> list[str]:
    """What the corpus left out as overlapping benchmark problems."""
    if dec is None:
        return ["The corpus was not checked against benchmark problems.", ""]
    checked = ", ".join(f"{b} ({n} problems)" for b, n in dec["problems"].items())
    out = [f"Decontamination: every document was checked against {checked} ({dec['ngram']}-grams, share "
           f"{dec['threshold']:g}); {len(dec['excluded'])} left out" + (":" if dec["excluded"] else "."), ""]
    out += [f"- `{e['document']}`: {e['share']:.0%} of {e['problem']}'s {e['part']}" for e in dec["excluded"]]
    return out + ([""] if dec["excluded"] else [])


def _quality_lines(q: dict[str, Any] | None) -> list[str]:
    """The corpus's document quality bands (``data.quality``): per split and band, documents, bytes,
    the weight and the first examples."""
    if not q:
        return []
    out = [f"Document quality (`data.quality {q['mode']}`, codechat.data.quality):", "",
           "| split | band | documents | bytes | weight | written | why (count) | first examples |",
           "|---|---|---|---|---|---|---|---|"]
    for split, info in q["splits"].items():
        for band, b in info["bands"].items():
            weight = q["weights"][band] if q["mode"] == "filter" and split == "train" else 1
            why = ", ".join(f"{r} ({n})" for r, n in b["reasons"].items())
            out.append(f"| {split} | {band} | {b['documents']:,} | {b['bytes']:,} | {weight:g} | {b['written']:,} | "
                       f"{why} | {', '.join(f'`{e}`' for e in b['examples'][:3])} |")
        out.append(f"| {split} | **kept** | | | | {info['kept_share']:.1%} of the bytes | | |")
    return out + [""]


def _code_eval_section(h: dict[str, Any], title: str) -> list[str]:
    """A code evaluation's table (pass@k, the checkpoint, sampling) and the problems it solved."""
    rows = [("checkpoint", f"`{h['stage']}/`, {h['mode']} mode"),
            ("problems x samples", f"{h['problems']} x {h['n']}, temperature {h['temperature']:g}" + (
                f" (of {h['problems_planned']} planned: the stage's time ran out)"
                if h["problems"] < h["problems_planned"] else ""))]
    for k, v in h["pass@k"].items():
        ci = h.get("pass@1_ci95") if k == "pass@1" else None
        rows.append((k, f"{v:.2%}" + (f" ± {h['pass@1_stderr']:.2%}" if k == "pass@1" and h["pass@1_stderr"]
                                        is not None else "")
                     + (f" (95% bootstrap interval over problems: {ci[0]:.2%} to {ci[1]:.2%})" if ci else "")))
    if "counts" in h:  # metrics.json of runs before 2026-12-07 lack them
        rows += [("samples by outcome (syntax: no code found, or it does not parse)",
                  ", ".join(f"{k} {v:,}" for k, v in h["counts"].items())),
                 ("generations ended by", ", ".join(f"{k} {v:,}" for k, v in sorted(h["finish"].items())))]
    rows.append(("verdict for RL", h["verdict_text"]))
    solved = sorted(h["solved"].items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{t} ({c}/{h['n']})" for t, c in solved) or "none"
    return [f"## {title} (sandboxed execution)", markdown_table(rows), "",
            f"Solved by at least one sample ({len(solved)}): {text}", ""]


def speedrun_report(m: dict[str, Any]) -> str:
    """``report.md`` of a speedrun from its ``metrics.json`` (:mod:`codechat.speedrun.run`).

    Works on a partial run: each stage's section appears once the stage is done, and a stage
    that failed shows its error; the time table shows every stage planned vs actual.
    """
    stages = m["stages"]
    order = list(stages)
    failed = [s for s in order if stages[s]["status"] == "failed"]
    done = [s for s in order if stages[s]["status"] in FINISHED]
    head = f"# codechat speedrun — `{m['preset']}` on {m['device']}"
    if mc := m.get("machine"):  # runs written before it have none
        head += f" ({mc['gpu'] + '; ' if mc['gpu'] else ''}{mc['cores']} cores of {mc['cpu'] or 'an unnamed CPU'})"
    lines = [head, ""]
    if failed:
        s = failed[0]
        lines += [f"**The run stopped at stage `{s}`**: `{stages[s]['error']}`. Finished: "
                  f"{', '.join(done) or 'none'}. Continue it with `codechat speedrun --out DIR --resume` "
                  "(finished stages are not redone).", ""]
        if stages[s].get("traceback"):
            lines += ["<details><summary>traceback</summary>", "", "```", stages[s]["traceback"].rstrip(), "```",
                      "", "</details>", ""]
    elif len(done) < len(order):
        lines += [f"**Run in progress or stopped**: finished {', '.join(done) or 'none'}.", ""]
    if _section(m, "pretrain"):
        pre, segs = m["pretrain"], m.get("segments") or []
        run_s = sum(seg["wall_s"] for seg in segs) or m["total_wall_s"]
        lines += [f"Total wall time {run_s / 60:.1f} min of a {m['time_budget_min']:g}-minute budget"
                  + (f", in {len(segs)} segments (`--stop-after-min` / SIGTERM, then `--resume`)" if len(segs) > 1
                     else "") + f". The model compresses unseen Python to **{pre['val_bpb_final']:.3f} bits/byte** "
                  + ("" if pre.get("val_bpb_final_complete", True) else
                     f"(on an evenly spread {pre['val_bytes_scored'] / pre['val_bytes_total']:.0%} of the split: "
                     "pretraining's time ran out) ")
                  + (f"against gzip -9's {m['baseline']['gzip_bpb']:.3f} (each validation document compressed on "
                     "its own)." if _section(m, "baseline") else "(the compression baselines did not run)."), ""]
    if _section(m, "data") and _section(m, "tokenizer"):
        d = m["data"]
        lines += ["## Data", markdown_table([
            ("corpus", ", ".join(m["plan"].get("sources", [])) or "see pretrain config"),
            *([("plan settings (--plan.*)", ", ".join(f"{k}={v}" for k, v in m["plan"]["plan_overrides"].items()))]
              if m["plan"].get("plan_overrides") else []),
            ("files seen", d["files_seen"]),
            ("skipped", ", ".join(f"{k} {v}" for k, v in d["skipped"].items())),
            ("train documents / tokens / bytes", f"{d['train_documents']:,} / {d['train_tokens']:,} / "
                                                 f"{d['train_bytes']:,}"),
            ("val documents / tokens / bytes", f"{d['val_documents']:,} / {d['val_tokens']:,} / {d['val_bytes']:,}"),
            ("vocabulary", m["tokenizer"]["vocab_size"]), ("val bytes per token", d["val_bytes_per_token"])]), ""]
        lines += _decontamination_lines(d.get("decontamination")) + _quality_lines(d.get("quality"))
    if _section(m, "pretrain"):
        pre = m["pretrain"]
        c = pre["config"]
        lines += ["## Model and training", markdown_table([
            ("preset", m["preset"]), ("parameters", pre["params"]),
            ("layers / width / heads / kv heads", f"{c['model']['n_layer']} / {c['model']['n_embd']} / "
                                                  f"{c['model']['n_head']} / {c['model']['n_kv_head']}"),
            ("sequence length", c["data"]["seq_len"]),
            ("batch (rows x accum)", f"{c['train']['micro_batch_size']} x {c['train']['grad_accum']}"),
            ("optimizer, peak learning rate, schedule", f"{c['optim']['name']}, {c['optim']['lr']:g}, "
                                                        f"{c['optim']['schedule']}"),
            *([("settings over the preset's recipe (the plan's, then --pretrain.*)",
                ", ".join(f"{k}={v}" for k, v in m["plan"]["pretrain_overrides"].items()))]
              if m.get("plan", {}).get("pretrain_overrides") else []),
            ("training time budget", f"{pre['train_budget_s']:.0f} s ({'compiled' if pre['compiled'] else 'eager'})"),
            *([("first step (the compile, when compiled)", _first_step(pre))] if pre.get("first_step_s") else []),
            ("optimizer steps", pre["steps"]), ("tokens seen", pre["tokens_seen"]),
            ("tokens/s: median, slowest tenth of the logging windows below", _throughput(pre)),
            ("MFU", f"{pre['mfu']:.1%}" if pre["mfu"] is not None else "n/a (no known peak on this device)"),
            ("val bits/byte, evenly spread sample: initial -> final",
             f"{pre['val_bpb_initial']:.3f} -> {pre['val_bpb_final_sampled']:.3f}"),
            _final_bpb_row(pre)]),
            "", "![loss curve](loss.png)", "", "![throughput](throughput.png)", ""]
    if _section(m, "baseline"):
        b = m["baseline"]
        rows = [("gzip -9, per document", b["gzip_bpb"]), ("gzip -9, whole split as one stream", b["gzip_concat_bpb"]),
                ("xz -9, whole split as one stream", b["xz_concat_bpb"])]
        if _section(m, "pretrain"):
            rows.insert(0, ("codechat model (" + ("whole split" if m["pretrain"].get("val_bpb_final_complete", True)
                                                  else "an evenly spread sample of the split") + ")",
                            m["pretrain"]["val_bpb_final"]))
        lines += ["## Baselines (bits per byte on the validation split)", markdown_table(rows), ""]
    for stage, title in (("mid", "Mid-training"), ("sft", "Chat SFT")):
        if _section(m, stage):
            lines += _tuning_section(m[stage], stage, title)
    if _section(m, "eval"):
        lines += _code_eval_section(m["eval"]["humaneval"], "HumanEval")
    if _section(m, "mbpp"):
        lines += _code_eval_section(m["mbpp"], "MBPP (test split)")
    if _section(m, "rl"):
        lines += _rl_section(m)
    elif m.get("plan", {}).get("rl") is False:
        lines += ["## RL (GRPO)", "", f"Not planned ({m['plan'].get('rl_reason') or '--rl off'}): its share of the "
                  "budget went to pretraining.", ""]
    if _section(m, "funcall_eval"):
        f, t = m["funcall_eval"], m.get("funcall", {})

        def pct(x: float | None) -> str:
            return "-" if x is None else f"{x:.1%}"
        strict = f.get("strict")

        def both(key: str) -> str:  # free, then strict (every reply under the tool grammar) when it ran
            return pct(f[key]) + (f" (strict {pct(strict[key])})" if strict else "")
        lines += ["## Function calling (held-out conversations)", markdown_table([
            ("trained on", f"{t.get('data', '?')}: {t.get('examples_kept', '?')} conversations, {t.get('steps', '?')} steps"),
            ("assistant turns scored", f"{f['call_turns']} that call, {f['text_turns']} that answer in text"),
            ("call parses", both("parse_rate")), ("arguments valid against the schema", both("schema_valid_rate")),
            ("right function", both("name_accuracy")), ("arguments exactly right", both("arguments_exact_match")),
            ("no call where none is due", both("no_call_accuracy")),
            ("call turns that did not end in a call", _outcomes(f) + (f" (strict {_outcomes(strict)})" if strict else "")),
            ("finished calls that parse / are schema-valid",
             f"{pct(f.get('finished_parse_rate'))} / {pct(f.get('finished_schema_valid_rate'))}"
             + (f" (strict {pct(strict.get('finished_parse_rate'))} / {pct(strict.get('finished_schema_valid_rate'))})"
                if strict else "")),
            ("strict decoding", f"every reply generated again under the tool grammar (tool_choice auto); "
                                f"{strict['grammar_errors']} case(s) whose schemas did not compile generated free"
             if strict
             else "not run" + (f": {f['strict_skipped']}" if f.get("strict_skipped") else ""))]), ""]
    lines += ["## Data sources and licences", markdown_table(list(m.get("licenses", {}).items())), ""]
    lines += [_time_table(stages, m.get("total_wall_s", 0.0)), ""]
    if _section(m, "samples"):
        smp = m["samples"]
        lines += ["## Completions ({parse_ok} of {n} parse with `ast.parse` once the last, unfinished line is "
                  "dropped)".format(**smp), "",
                  "Each is the best of {best_of} samples (temperature {temperature}, top-p {top_p}, at most "
                  "{max_new_tokens} new tokens, ended with the function or class its prompt ends in): of those that "
                  "finished — ended their function before the budget — the one with the highest mean token "
                  "log-probability. Of all {total} samples, {finished_all_samples} finished and "
                  "{parse_ok_all_samples} parse; the first sample of each prompt alone: {parse_ok_first_sample} of "
                  "{n}.".format(total=smp["n"] * smp["best_of"], **smp)
                  + (f" The stage's time allowed {smp['n']} of its {smp['planned']} prompts."
                     if smp.get("planned", smp["n"]) > smp["n"] else ""), ""]
        for s in smp["completions"]:
            verdict = ("parses" if s["parses"] else "does not parse") + ("" if s["finished"] else ", cut by the budget")
            lines += [f"**{verdict}** (mean log-prob {s['mean_logprob']:.2f} nats/token)", "", "```python",
                      s["text"], "```", ""]
    if _section(m, "chat"):
        c = m["chat"]
        lines += ["## Chat answers (after SFT)", ""] + (
            [f"The stage's time allowed {c['n']} of its {c['planned']} questions.", ""]
            if c.get("planned", c["n"]) > c["n"] else [])
        for c in m["chat"]["answers"]:
            lines += [f"**user:** {c['prompt']}", "", "```", c["answer"], "```", ""]
    return "\n".join(lines)


def _rl_section(m: dict[str, Any]) -> list[str]:
    """The RL stage: its pool, the pass-rate filter, GRPO's curve and time, and the code evaluations
    before (``sft/``) and after (``rl/``) it side by side."""
    r, st = m["rl"], m["stages"]["rl"]
    rows = []
    if pool := r.get("pool"):
        specs = ", ".join(f"`{k}` {v}" for k, v in pool["specs"].items())
        checked = ", ".join(f"{b} ({n} problems)" for b, n in pool.get("checked", {}).items())
        left_out = ", ".join(d["task_id"] for d in pool["decontaminated"][:5])
        rows.append(("task pool", f"{pool['tasks']} tasks ({specs}); " + (f"checked against {checked}: " if checked
                                                                         else "")
                     + f"{len(pool['decontaminated'])} left out as overlapping a benchmark problem"
                     + (f": {left_out}" if left_out else "")))
    if f := r.get("filter"):
        first = f", the first verdict after {f['first_s']:.1f} s" if "first_s" in f else ""
        rows.append(("pass-rate filter", f"{f['sampled']} of {f['pool']} tasks sampled in {f['seconds']:.0f} s{first} "
                                         f"(pool pass@1 {f['pass@1']:.2%}): {f['never_solved']} never solved, "
                                         f"{f['always_solved']} always solved, **{f['kept']} kept** (rate in "
                                         f"[{f['min_rate']:g}, {f['max_rate']:g}], neither 0 nor 1)"))
    if f and f.get("histogram"):
        rows.append(("sampled tasks by samples passed (0, 1, ... of each task's "
                     f"{len(f['histogram']['all']) - 1})", "; ".join(f"{part} {' '.join(map(str, h))}"
                                                                    for part, h in f["histogram"].items())))
    if r["skipped"]:
        rows.append(("skipped", r["reason"]))
    else:
        curve = r.get("curve") or []
        if g := r.get("settings"):
            rows.append(("GRPO settings", f"groups of {g['group_size']}, {g['tasks_per_step']} tasks a step, "
                                          f"{g['optimizer']} at lr {g['lr']:g}, KL weight {g['kl_beta']:g}, "
                                          f"{g['reward']} reward, temperature {g['temperature']:g}, at most "
                                          f"{g['max_new_tokens']} new tokens, ratio clipped to [1 - "
                                          f"{g['clip_eps'][0]:g}, 1 + {g['clip_eps'][1]:g}], {g['loss_norm']}-level "
                                          f"loss, advantages scaled by {g['advantage_scale']}"))
        setup = ", ".join(f"{k.replace('_', ' ')} {v:.0f}" for k, v in (r.get("setup_s") or {}).items())
        reserved = f"; kept for the evaluations after it {r['evals_reserved_s']:.0f} s" if "evals_reserved_s" in r else ""
        limit = (f", at most {r['epochs']:g} pass{'' if r['epochs'] == 1 else 'es'} over its {r['train_tasks']} "
                 "tasks") if r.get("epochs") else ""
        rows += [("steps", f"{r['steps']} (stopped: {r['stopped']}{limit})"),
                 ("time", f"the stage: planned {st['planned_s']:.0f} s, granted {st.get('granted_s', 0):.0f} s"
                          + (f"; before step 0 (s): {setup}" if setup else "")
                          + f"; GRPO done after {r['train_wall_s']:.0f} s{reserved}"),
                 ("mean reward: first step -> last; first 5 steps -> last 5",
                  f"{r['reward_first']:.3f} -> {r['reward_last']:.3f}"
                  + (f"; {mean_reward(curve[:5]):.3f} -> {mean_reward(curve[-5:]):.3f}" if curve else "")),
                 ("groups without signal (frac_reward_zero_std): first step -> last",
                  f"{curve[0]['frac_reward_zero_std']:.2f} -> {curve[-1]['frac_reward_zero_std']:.2f}" if curve else "-"),
                 ("rollouts passing every test, last step", f"{r['pass_rate_last']:.1%}")]
        def p1(x: dict[str, Any]) -> str:
            ci = x.get("pass@1_ci95")
            return f"{x['pass@1']:.1%}" + (f" [{ci[0]:.1%}, {ci[1]:.1%}]" if ci else "")
        if h := r.get("heldout"):
            rows.append((f"held-out slice of the kept tasks ({h['before']['tasks']}, never trained on): pass@1 "
                         f"before -> after", f"{p1(h['before'])} -> {p1(h['after'])} ({h['before']['samples']} samples "
                                             "a task, the same seeds)" + "".join(  # per part of the pool
                             f"; {part} ({k}) {b:.1%} -> {a:.1%}" for part, (k, b, a) in heldout_by_part(h).items())))
            if change := heldout_change(h):
                rows.append(("the slice's change, after - before: pass@1 [95% paired interval over its tasks]",
                             f"{change[0] * 100:+.1f} points [{change[1] * 100:+.1f}, {change[2] * 100:+.1f}]"))
            if by_rate := heldout_by_rate(h):  # sharpening alone raises the second and lowers the first
                rows.append(("the slice by its tasks' rate at the filter: pass@1 before -> after", "; ".join(
                    f"{name.replace('_', ' ')} ({k}) {b:.1%} -> {a:.1%}" for name, (k, b, a) in by_rate.items())))
        if b := r.get("heldout_pretrain"):
            rows.append((f"the slice's mined tasks ({b['problems']}) on `pretrain/`, base mode (signature and "
                         "docstring continued): pass@1; tasks solved at least once",
                         f"{p1(b)}; {len(b['solved'])} of {b['problems']} (the base model solves these already: "
                         "easy, or memorised from the corpus)"))
        rows += [("stopped because", r["message"])] if r.get("message") else []
    lines = ["## RL (GRPO)", markdown_table(rows), ""]
    if not r["skipped"] and r.get("curve"):
        lines += ["![RL reward curve](rl_reward.png)", ""]
    before = [("HumanEval", m.get("eval", {}).get("humaneval"), r.get("humaneval")),
              ("MBPP (test split)", m.get("mbpp"), r.get("mbpp"))]
    # (suite, its row label, sft/'s figures, rl/'s); a suite a deadline cut short on rl/: sft/ on the same problems
    pairs = [(name, f"{name} ({a['problems']} of {b['problems']} problems, the same before and after)",
              a["before_same_problems"], a) if a.get("before_same_problems") else (name, name, b, a)
             for name, b, a in before if b and a]
    if pairs:
        def fig(h: dict[str, Any], k: str) -> str:
            ci = h.get("pass@1_ci95") if k == "pass@1" else None
            return f"{h['pass@k'][k]:.2%}" + (f" [{ci[0]:.2%}, {ci[1]:.2%}]" if ci else "")
        table = ["| suite | pass@k | before RL (`sft/`) | after RL (`rl/`) |", "|---|---|---|---|"]
        table += [f"| {label} | {k} | {fig(b, k)} | {fig(a, k)} |" for _, label, b, a in pairs for k in a["pass@k"]
                  if k in b["pass@k"]]
        lines += ["Before and after RL (pass@1 with its 95% bootstrap interval over problems):", "", *table, ""]
        for name, _, _, a in pairs:
            lines += _code_eval_section(a, f"{name} after RL")
    return lines


def plot_rewards(curve: list[dict[str, Any]], png: Path, title: str) -> Path:
    """GRPO's mean reward, share of rollouts passing and share of groups without signal per step, as a PNG."""
    steps = [r["step"] for r in curve]
    return _plot([(label, style, steps, [r[key] for r in curve]) for key, label, style in (
        ("reward_mean", "mean reward", "-"), ("pass_rate", "rollouts passing", "--"),
        ("frac_reward_zero_std", "groups without signal", ":"))], png, title, "GRPO step", ylim=(0, 1))


def _tuning_section(t: dict[str, Any], stage: str, title: str) -> list[str]:
    """The report lines of a tuning stage (``mid`` or ``sft``, :mod:`codechat.speedrun.tuning`)."""
    return ["## " + title, markdown_table([
        *([("starts from", f"`{t['init']}/`")] if t.get("init") else []),
        ("data (mixture spec, copies per epoch)", f"`{t['data']}`" if t.get("data") else "mined pairs"),
        *([("pairs mined in the background during pretraining",
            f"{mined['kept']:,} from {mined['functions']:,} functions in {mined['files']:,} files; the stage "
            f"waited {t['mining_wait_s']:.1f} s for them")] if "kept" in (mined := t.get("mined_in_background") or {})
          else []),
        *([("mined pairs left out: the functions of the RL pool's mined tasks (unseen until GRPO)",
            f"{mined['held_out_for_rl']:,}" if mined["held_out_for_rl"] is not None else
            "none: the pool's mining was still running as the stage began (its tasks may be among the pairs)")]
          if "held_out_for_rl" in mined else []),
        ("examples seen / kept (preflight)", f"{t['examples_seen']:,} / {t['examples_kept']:,}"),
        ("prompt- / completion-truncated", f"{t['examples_prompt_truncated']} / {t['examples_completion_truncated']}"),
        ("dropped", t["examples_dropped"]), ("excluded as overlapping HumanEval/MBPP", t["examples_decontaminated"]),
        ("supervised share of tokens", f"{t['supervised_token_share']:.1%}"),
        ("training time budget", f"{t['train_budget_s']:.0f} s ({'compiled' if t['compiled'] else 'eager'})"),
        *([("first step (the compile)", _first_step(t))] if t.get("compiled") and t.get("first_step_s") else []),
        ("optimizer steps", t["steps"]),
        ("loss on a fixed set of its examples: step 0 -> end", f"{t['loss_initial']:.3f} -> {t['loss_final']:.3f}")]),
        ""] + ([f"![{title} loss curve]({stage}_loss.png)", ""] if t.get("data") else [])


def _time_table(stages: dict[str, dict[str, Any]], total: float) -> str:
    """The table of stages: status (a skipped stage with its reason), planned, granted and actual seconds."""
    rows = []
    for s, st in stages.items():
        granted = f"{st['granted_s']:.0f} s" if st.get("granted_s") is not None else "-"
        actual = f"{st['wall_s']:.1f} s" if st.get("wall_s") is not None else "-"
        status = f"{st['status']}: {st['reason']}" if st["status"] in ("skipped", "stopped") and st.get("reason") \
            else st["status"]
        rows.append(f"| {s} | {status.replace('|', '/')} | {st['planned_s']:.0f} s | {granted} | {actual} |")
    planned = sum(st["planned_s"] for st in stages.values())
    rows.append(f"| **total** | | {planned:.0f} s | | {total:.1f} s |")
    return ("## Time per stage (planned up front vs actual)\n\n| stage | status | planned | granted at start | actual |\n"
            "|---|---|---|---|---|\n" + "\n".join(rows))
