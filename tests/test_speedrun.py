"""`codechat speedrun` end to end: every stage, the report, and what survives a failure.

Each test runs the real command in a subprocess on a small slice of the standard library
(``--max-files``) with the smallest budget the CPU plan accepts (its stages' floors, ``CPU_MIN_S``): one is
killed with SIGKILL during its SFT stage, one has its HumanEval stage fail, one is stopped twice by
``--stop-after-min``; each then checks what the run directory holds and that ``--resume`` finishes the run
without redoing finished stages. Their data files are the project's own
(tests/fixtures/cases_b: an MBPP-layout file, an Alpaca array, a ShareGPT function-calling sample), so the
tests run the same with or without the shared/ folder.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

BUDGET_MIN = 2.5  # the CPU plan's floors for every stage (CPU_MIN_S), mid-training, MBPP and function calling included
SMALL = ["--time-budget-min", str(BUDGET_MIN), "--max-files", "150", "--eval-limit", "2", "--device", "cpu", "--rl", "on",
         "--checkpoint-every-s", "1"]
BEFORE_SFT = ("tokenizer", "data", "pretrain", "baseline", "samples")
CASES_B = Path(__file__).parent / "fixtures" / "cases_b"


def _cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "codechat", "speedrun", "--out", str(out), *SMALL, *extra]


def _metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def _resume(out: Path, *extra: str) -> subprocess.CompletedProcess:
    p = subprocess.run(_cmd(out, "--resume", *extra), capture_output=True, text=True, timeout=600,
                       env={**os.environ, "CODECHAT_COMMIT": "abc1234"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return p


def _assert_complete(out: Path) -> dict:
    """The finished run's metrics and report hold every stage's figures (the smoke-run checks)."""
    m = _metrics(out)
    skipped = ["rl"]  # the tiny model solves too few RL tasks: its pass-rate filter skips GRPO
    assert [s for s, st in m["stages"].items() if st["status"] != "done"] == skipped
    for stage, st in m["stages"].items():
        assert st["wall_s"] > 0 and st["planned_s"] > 0 and m[stage]["wall_s"] == st["wall_s"], stage
    assert abs(sum(st["planned_s"] for st in m["stages"].values()) - BUDGET_MIN * 60) < 1e-6
    pre, base = m["pretrain"], m["baseline"]
    assert pre["steps"] > 0 and pre["val_bpb_final"] < pre["val_bpb_initial"]
    assert 0.5 < base["xz_concat_bpb"] < base["gzip_concat_bpb"] <= base["gzip_bpb"] < 8
    smp = m["samples"]
    # the first prompt always; the others while the stage's time lasts
    assert 1 <= smp["n"] <= smp["planned"] == 5 and 0 <= smp["parse_ok"] <= smp["n"] == len(smp["completions"])
    assert smp["best_of"] == 8
    sft = m["sft"]
    assert sft["steps"] > 0 and sft["examples_kept"] > 0 and 0 < sft["supervised_token_share"] < 1
    assert sft["examples_kept"] + sft["examples_dropped"] == sft["examples_seen"]
    assert sft["loss_initial"] > 0 and sft["loss_final"] > 0
    h = m["eval"]["humaneval"]
    assert h["verdict"] in ("stall", "tiered", "standard") and 0 <= h["pass@1"] <= 1 and h["stage"] == "sft"
    assert 1 <= h["problems"] <= h["problems_planned"] == 2 and list(h["pass@k"]) == ["pass@1"]  # n 2: no pass@10
    assert all(0 < c <= h["n"] for c in h["solved"].values())
    results = json.loads((out / "eval" / "humaneval" / "results.json").read_text())
    assert {t: v["c"] for t, v in results["per_task"].items() if v["c"]} == h["solved"]
    assert h["counts"] == {k: v for k, v in results["counts"].items() if v} and h["finish"] == results["finish"]
    assert sum(h["counts"].values()) == sum(h["finish"].values()) == h["problems"] * h["n"]
    rl = m["rl"]  # the tiny model solves too few of its pool's tasks: the filter skips RL, saying how many
    f = rl["filter"]
    assert rl["skipped"] and rl["reason"].startswith(f"{f['kept']} of {f['sampled']} sampled pool tasks")
    assert f["kept"] < 32 and f["never_solved"] + f["always_solved"] + f["kept"] <= f["sampled"] <= f["pool"]
    pool = rl["pool"]
    assert "doctest" in pool["specs"] and pool["duplicates"] == 0
    assert sum(pool["specs"].values()) == pool["tasks"] + len(pool["decontaminated"])
    assert m["stages"]["rl"]["status"] == "skipped" and m["stages"]["rl"]["reason"] == rl["reason"]
    assert f"| rl | skipped: {f['kept']} of {f['sampled']} sampled pool tasks" in (out / "report.md").read_text()
    assert not (out / "rl" / "metrics.jsonl").exists()
    dec = m["data"]["decontamination"]
    assert dec["problems"]["HumanEval"] == 164 and m["data"]["skipped"]["contaminated"] == len(dec["excluded"])
    report = (out / "report.md").read_text()
    assert "## RL (GRPO)" in report
    assert "stopped at stage" not in report and "gzip -9, per document" in report
    # the host is named: the same GPU trains less beside a slower CPU
    assert m["machine"]["gpu"] is None and m["machine"]["cores"] == os.cpu_count()
    cpu = m["machine"]["cpu"] or "an unnamed CPU"
    assert report.splitlines()[0].endswith(f"on cpu ({os.cpu_count()} cores of {cpu})")
    assert report.count("```python") == smp["n"] and f"{smp['parse_ok']} of {smp['n']} parse" in report
    assert "## Chat answers (after SFT)" in report and "PSF License" in report and "MIT License" in report
    assert "## HumanEval" in report and "planned up front vs actual" in report and "Solved by at least one" in report
    outcomes = ", ".join(f"{k} {v:,}" for k, v in h["counts"].items())
    assert f"| samples by outcome (syntax: no code found, or it does not parse) | {outcomes} |" in report
    assert "Decontamination: every document was checked against HumanEval (164 problems)" in report
    assert (out / "loss.png").stat().st_size > 1000 and (out / "sft_loss.png").stat().st_size > 1000
    return m


def test_speedrun_killed_during_sft_keeps_finished_stages_and_resumes_from_its_checkpoint(tmp_path):
    out = tmp_path / "run"
    # a pretraining setting over the preset's recipe, kept by the resumed plan (SFT keeps the recipe's lr / 2)
    proc = subprocess.Popen(_cmd(out, "--pretrain.optim.lr", "0.008"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                running_sft = _metrics(out)["stages"]["sft"]["status"] == "running"
            except (FileNotFoundError, json.JSONDecodeError, KeyError):
                running_sft = False
            if running_sft and list((out / "sft" / "checkpoints").glob("step_*")):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before its SFT stage saved a checkpoint"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)

    m = _metrics(out)
    assert [s for s in m["stages"] if m["stages"][s]["status"] == "done"] == list(BEFORE_SFT)
    assert m["stages"]["sft"]["status"] == "running" and m["pretrain"]["steps"] > 0
    report = (out / "report.md").read_text()
    assert "## Model and training" in report and "```python" in report and "## Chat SFT" not in report
    pre_rows = (out / "pretrain" / "metrics.jsonl").read_text()
    sft_saved = sorted(int(p.name.split("_")[1]) for p in (out / "sft" / "checkpoints").glob("step_*"))

    p = _resume(out)
    for stage in BEFORE_SFT:
        assert f"{stage}: done in an earlier attempt, skipped" in p.stdout
    assert (out / "pretrain" / "metrics.jsonl").read_text() == pre_rows  # pretraining was not re-run
    m = _assert_complete(out)
    sft_rows = [json.loads(r) for r in (out / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert sft_rows[0]["step"] == 0  # the first attempt's step-0 evaluation is kept, not redone
    assert m["sft"]["steps"] >= max(sft_saved) >= 1  # continued from its newest checkpoint
    assert m["plan"]["pretrain_overrides"] == {"optim.lr": "0.008"} and m["pretrain"]["config"]["optim"]["lr"] == 0.008
    assert "lr: 0.005" in (out / "sft" / "config.yaml").read_text()  # tiny's recipe lr 0.01, halved
    assert "muon, 0.008, cosine" in (out / "report.md").read_text()


def test_speedrun_whose_humaneval_stage_fails_keeps_its_report_and_resumes_only_that_stage(tmp_path):
    out = tmp_path / "run"
    # 12 ShareGPT conversations (9 in the train part, 3 held out: 2 with a call), an MBPP-layout file of 11 tasks
    # (the 3 few-shot prompt tasks, 3 test, 1 validation, 4 train of which 604 copies test task 12), 7 Alpaca records
    glaive = CASES_B / "glaive_sharegpt" / "sample.json"
    # A HumanEval directory left by an evaluation with other settings: the stage refuses to mix them.
    stale = out / "eval" / "humaneval"
    stale.mkdir(parents=True)
    (stale / "run.json").write_text(json.dumps({"suite": "humaneval", "seed": -1}))
    (stale / "samples.jsonl").write_text(json.dumps({"task_id": "HumanEval/0", "sample": 0}) + "\n")
    mbpp = CASES_B / "mbpp" / "mbpp.jsonl"
    alpaca = CASES_B / "alpaca" / "instructions.json"
    p = subprocess.run(_cmd(out, "--funcall-data", str(glaive), "--mbpp", str(mbpp), "--data", f"{alpaca}:0.1",
                            "--mid-share", "0.2", "--mid-data", f"{alpaca}:0.2"),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stderr[-3000:]
    assert "stage eval failed" in p.stderr and "--resume" in p.stderr

    m = _metrics(out)
    assert m["stages"]["eval"]["status"] == "failed" and "other settings" in m["stages"]["eval"]["error"]
    assert all(m["stages"][s]["status"] == "done" for s in (*BEFORE_SFT, "mid", "sft", "chat"))
    report = (out / "report.md").read_text()
    assert "The run stopped at stage `eval`" in report and "other settings" in report
    assert "## Chat SFT" in report and "## Chat answers (after SFT)" in report and "## HumanEval" not in report
    pre_rows, sft_rows = ((out / s / "metrics.jsonl").read_text() for s in ("pretrain", "sft"))

    for f in stale.iterdir():  # the user removes the stale evaluation, then resumes
        f.unlink()
    history = tmp_path / "results" / "gpu_speedrun.jsonl"
    history.parent.mkdir()
    history.write_text('{"date": "an earlier run"}\n')
    p = _resume(out, "--record", str(history))
    assert "sft: done in an earlier attempt, skipped" in p.stdout
    assert [(out / s / "metrics.jsonl").read_text() for s in ("pretrain", "sft")] == [pre_rows, sft_rows]
    m = _assert_complete(out)
    assert m["stages"]["eval"]["wall_s"] > 0
    # --funcall-data (kept by the resumed plan): function-calling SFT on FILE@train, then its evaluation
    assert [m["stages"][s]["status"] for s in ("funcall", "funcall_eval")] == ["done", "done"]
    assert m["funcall"]["data"].endswith("@train") and m["funcall"]["examples_kept"] == 9
    f = m["funcall_eval"]
    assert f["call_turns"] > 0 and f["text_turns"] > 0 and 0.0 <= f["parse_rate"] <= 1.0
    # beside the free figures the strict ones (every reply under the tool grammar): an attempted call always parses
    assert f["strict"]["parse_rate"] == f["strict"]["schema_valid_rate"] and f["strict"]["grammar_errors"] == 0
    assert json.loads((out / "eval" / "funcall" / "results.json").read_text())["settings"]["strict"] == "both"
    assert json.loads((out / "eval" / "funcall" / "results.json").read_text())["split"] == "heldout"
    assert "## Function calling (held-out conversations)" in (out / "report.md").read_text()
    assert f"| call parses | {f['parse_rate']:.1%} (strict {f['strict']['parse_rate']:.1%}) |" in \
        (out / "report.md").read_text()
    # --mbpp and --data: MBPP's train split and 10% of the Alpaca records join the mined pairs in SFT, MBPP's test
    # split is scored (2 problems x 10 samples), and the corpus is checked against the file's 3 test problems
    assert m["sft"]["data"] == f"mine:{m['plan']['sources'][0]}:1,{mbpp}#mbpp:3,{alpaca}:0.1"
    mined, from_mbpp, from_alpaca = m["sft"]["sources"]
    # MBPP keeps train + prompt tasks (7) less the one copying a test task (604); the 4 held-out go by task id
    assert (from_mbpp["records"], from_mbpp["excluded"]) == (6, 5)
    assert (from_alpaca["records"], from_alpaca["excluded"]) == (7, 0)
    assert from_mbpp["drawn"] > 0 and from_alpaca["drawn"] > 0 and mined["drawn"] > 0
    assert m["data"]["decontamination"]["problems"] == {"HumanEval": 164, "MBPP": 3}
    b = m["mbpp"]
    assert b["stage"] == "sft" and b["n"] == 10 and 1 <= b["problems"] <= b["problems_planned"] == 2
    assert list(b["pass@k"]) == ["pass@1", "pass@10"]
    assert json.loads((out / "eval" / "mbpp" / "results.json").read_text())["split"] == "test"
    assert "## MBPP (test split)" in (out / "report.md").read_text() and "CC BY 4.0" in (out / "report.md").read_text()
    # --record: the finished run appended its line to the history, after the earlier one
    earlier, line = (json.loads(r) for r in history.read_text().splitlines())
    assert earlier == {"date": "an earlier run"} and line["commit"] == "abc1234"
    assert line["command"] == f"codechat speedrun --out {out} {' '.join(SMALL)} --resume --record {history}"
    assert (line["total_wall_s"], line["val_bpb"]) == (m["total_wall_s"], m["pretrain"]["val_bpb_final"])
    he = m["eval"]["humaneval"]
    assert line["humaneval"] == {"pass@1": he["pass@k"]["pass@1"], "pass@10": None,  # n 2
                                 "pass@1_ci95": he["pass@1_ci95"], "problems": he["problems"]}
    assert line["mbpp"] == {**b["pass@k"], "pass@1_ci95": b["pass@1_ci95"], "problems": b["problems"]}
    assert line["funcall"]["parse_rate"] == f["parse_rate"]
    assert line["funcall"]["arguments_exact_match"] == f["arguments_exact_match"]
    assert line["funcall_strict"] == {k: f["strict"][k] for k in line["funcall"]}
    # the tiny model solves too few pool tasks: RL is skipped, with the filter's counts
    assert (line["rl_ran"], line["rl_steps"], line["humaneval_after_rl"], line["mbpp_after_rl"]) == (False, 0, None, None)
    assert m["rl"]["skipped"] and "sampled pool tasks" in m["rl"]["reason"] and "so RL is skipped" in m["rl"]["reason"]
    assert line["rl_tasks_kept"] == m["rl"]["filter"]["kept"] < 32 and line["rl_pool"] == m["rl"]["pool"]["tasks"]
    assert stages.index("mbpp") < stages.index("rl") if (stages := list(m["stages"])) else False
    # --mid-share (kept by the resumed plan): mid-training between pretraining and SFT, on SFT's mixture, the
    # function-calling conversations and --mid-data, with pretraining's optimizer; SFT starts from it
    stages, planned = list(m["stages"]), {s: st["planned_s"] for s, st in m["stages"].items()}
    shares = m["plan"]["shares"]  # a fifth of pretraining's share, and at least mid-training's floor in seconds
    assert stages[stages.index("pretrain") + 1] == "mid" and shares["mid"] == pytest.approx(shares["pretrain"] / 4)
    assert planned["mid"] == pytest.approx(max(m["plan"]["min_s"]["mid"], shares["mid"] * BUDGET_MIN * 60))
    mid = m["mid"]
    assert (mid["init"], m["sft"]["init"], line["mid_share"]) == ("pretrain", "mid", 0.2)
    assert mid["data"] == f"{m['sft']['data']},{glaive}@train,{alpaca}:0.2" and mid["steps"] > 0
    assert mid["examples_kept"] > m["sft"]["examples_kept"] and mid["loss_final"] > 0
    mid_cfg, pre_cfg = (yaml.safe_load((out / s / "config.yaml").read_text()) for s in ("mid", "pretrain"))
    assert {k: mid_cfg["optim"][k] for k in ("name", "lr", "weight_decay")} == \
        {k: pre_cfg["optim"][k] for k in ("name", "lr", "weight_decay")}
    assert (mid_cfg["optim"]["min_lr_ratio"], mid_cfg["sft"]["max_length"]) == (0.0, pre_cfg["data"]["seq_len"])
    assert yaml.safe_load((out / "sft" / "config.yaml").read_text())["init"] == str(out / "mid")
    assert "## Mid-training" in (out / "report.md").read_text() and (out / "mid_loss.png").is_file()


def test_a_speedrun_stopped_twice_by_stop_after_min_resumes_into_one_run_within_its_budget(tmp_path):
    """Time mode, three invocations: two stopped by ``--stop-after-min`` (exit 75, one line naming the resume
    command), the third runs to the end. The plan is read back, finished stages are not rerun, pretraining's
    batches continue where they stopped (no repeats, no gaps), its learning rate after the resume is the one
    the stop saved, and the whole run stays within its budget."""
    from codechat.data.corpus import read_split
    from codechat.data.windows import WindowLoader
    out = tmp_path / "run"
    env = {**os.environ, "CODECHAT_COMMIT": "abc1234", "PYTHONUNBUFFERED": "1"}
    cuts, outs = [], []
    for i, extra in enumerate((["--stop-after-min", "0.5"], ["--resume", "--stop-after-min", "0.5"], ["--resume"])):
        p = subprocess.run(_cmd(out, *extra, "--pretrain.train.log_every", "1"), capture_output=True, text=True,
                           timeout=600, env=env)
        outs.append(p.stdout)
        if i < 2:
            assert p.returncode == 75, p.stdout[-2000:] + p.stderr[-3000:]
            last = p.stderr.strip().splitlines()[-1]
            assert last.startswith("codechat speedrun: stopped by --stop-after-min 0.5 at ") and last.endswith(
                "; continue with: codechat speedrun " + " ".join(_cmd(out, *extra, "--pretrain.train.log_every", "1")[4:])
                + ("" if "--resume" in extra else " --resume")), last
            cuts.append(last)
        else:
            assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    m = _metrics(out)
    assert len(m["segments"]) == 3 and [s["ended"] for s in m["segments"]][2] == "done"
    assert all(s["ended"].startswith("stopped: stopped by --stop-after-min 0.5") for s in m["segments"][:2])
    # the plan as made up front, printed again by each resumed invocation
    plan_line = outs[0].splitlines()[0]
    assert plan_line.startswith(f"speedrun tiny on cpu: {BUDGET_MIN:g} min in all") and all(o.splitlines()[0] == plan_line
                                                                                  for o in outs)
    # a stage finished in an earlier segment is not run again
    done_first = [s for s in m["stages"] if f"] {s}: done in an earlier attempt" in outs[1]]
    assert done_first[:2] == ["tokenizer", "data"]
    assert all(f"] {s}: done in an earlier attempt, skipped" in outs[2] for s in done_first)
    assert all(st["status"] in ("done", "skipped") for st in m["stages"].values()), m["stages"]
    # the first stop fell in pretraining: the steps logged once each, the data stream where it would be
    assert " at pretrain step " in cuts[0]
    rows = [json.loads(r) for r in (out / "pretrain" / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "loss" in r]
    assert steps == list(range(1, m["pretrain"]["steps"] + 1))
    cfg = yaml.safe_load((out / "pretrain" / "config.yaml").read_text())
    loader = WindowLoader(read_split(out / "data", "train"), cfg["data"]["seq_len"], cfg["train"]["micro_batch_size"],
                          seed=cfg["run"]["seed"])
    for _ in range(m["pretrain"]["steps"] * cfg["train"]["grad_accum"]):
        loader.next_window_ids()
    final = json.loads((sorted((out / "pretrain" / "checkpoints").glob("step_*"))[-1] / "state.json").read_text())
    assert final["step"] == m["pretrain"]["steps"] and final["loader"] == loader.state_dict()
    # the learning rate of the first step after the stop is the one the stopped run would have used
    k = int(cuts[0].split(" at pretrain step ")[1].split(";")[0])
    saved = re.search(rf"at pretrain step {k}, its checkpoint saved \(the next step's learning rate (\S+)\)",
                      outs[0])
    assert saved, outs[0][-2000:]
    assert next(r["lr"] for r in rows if r["step"] == k + 1) == pytest.approx(float(saved.group(1)), rel=1e-5)
    # one run within its budget: the stages' wall time and the three segments' together
    assert sum(st["wall_s"] for st in m["stages"].values()) <= BUDGET_MIN * 60 * 1.05
    assert sum(s["wall_s"] for s in m["segments"]) <= BUDGET_MIN * 60 * 1.05
    assert "in 3 segments" in (out / "report.md").read_text()


def test_the_record_of_a_run_with_rl_names_its_steps_and_both_humaneval_figures(monkeypatch):
    from codechat.speedrun.record import current_commit, record_line
    host = {"gpu": "NVIDIA H100 80GB HBM3", "cpu": "Intel(R) Xeon(R) Platinum 8480+", "cores": 16}
    m = {"preset": "d12", "device": "cuda:0", "machine": host, "total_wall_s": 512.5,
         "pretrain": {"val_bpb_final": 0.61, "train_time_s": 170.2}, "sft": {"steps": 347},
         "eval": {"humaneval": {"pass@k": {"pass@1": 0.011, "pass@10": 0.05}}},
         "rl": {"skipped": False, "steps": 37, "humaneval": {"pass@k": {"pass@1": 0.02, "pass@10": 0.07}},
                "mbpp": {"pass@k": {"pass@1": 0.03, "pass@10": 0.08}, "problems": 320,
                         "before_same_problems": {"pass@k": {"pass@1": 0.01}, "problems": 320}},
                "filter": {"kept": 45}, "pool": {"tasks": 410},
                "curve": [{"reward_mean": r / 10} for r in range(7)]},
         "mbpp": {"pass@k": {"pass@1": 0.015, "pass@10": 0.06}, "pass@1_ci95": [0.01, 0.02], "problems": 500}}
    line = record_line(m, "codechat speedrun --mbpp m.jsonl", "c0ffee")
    none = {"pass@1_ci95": None, "problems": None}
    assert line["humaneval"] == {"pass@1": 0.011, "pass@10": 0.05, **none}
    assert line["humaneval_after_rl"] == {"pass@1": 0.02, "pass@10": 0.07, **none}
    assert line["mbpp"] == {"pass@1": 0.015, "pass@10": 0.06, "pass@1_ci95": [0.01, 0.02], "problems": 500}
    assert line["mbpp_after_rl"] == {"pass@1": 0.03, "pass@10": 0.08, "pass@1_ci95": None, "problems": 320,
                                     "before_same_problems": {"pass@1": 0.01, "pass@10": None, **none, "problems": 320}}
    assert (line["rl_tasks_kept"], line["rl_pool"]) == (45, 410)
    assert (line["rl_reward_first5"], line["rl_reward_last5"]) == (pytest.approx(0.2), pytest.approx(0.4))
    assert (line["rl_ran"], line["rl_steps"], line["funcall"], line["val_bpb"]) == (True, 37, None, 0.61)
    assert line["funcall_strict"] is None
    assert (line["machine"], line["pretrain_train_s"], line["sft_steps"]) == (host, 170.2, 347)
    assert line["date"].endswith("Z") and line["commit"] == "c0ffee"
    monkeypatch.setenv("CODECHAT_COMMIT", "feed123")
    assert current_commit() == "feed123"
    monkeypatch.delenv("CODECHAT_COMMIT")
    head = subprocess.run(["git", "-C", str(Path(__file__).parents[1]), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    assert current_commit() is None if head.returncode else current_commit().startswith(head.stdout.strip())


def test_a_second_speedrun_into_the_same_directory_is_refused(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    p = subprocess.run([sys.executable, "-m", "codechat", "speedrun", "--out", str(out), "--device", "cpu"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "add --resume" in p.stderr
    for arg, why in (("--pretrain.optim.nme", "unknown setting --pretrain.optim.nme"),
                     ("--pretrain.train.max_steps", "the speedrun sets this itself"),
                     ("--optim.lr", "as --pretrain.SECTION.FIELD VALUE")):
        r = subprocess.run([sys.executable, "-m", "codechat", "speedrun", "--out", str(tmp_path / "bad"), arg, "3",
                            "--device", "cpu"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and why in r.stderr, (arg, r.stderr[-500:])
    assert not (tmp_path / "bad").exists()
    q = subprocess.run([sys.executable, "-m", "codechat", "speedrun", "--out", str(tmp_path / "none"), "--resume",
                        "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert q.returncode == 2 and "does not exist" in q.stderr
    r = subprocess.run([sys.executable, "-m", "codechat", "speedrun", "--out", str(tmp_path / "bad"), "--record",
                        str(tmp_path), "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "is a directory: name the JSONL file" in r.stderr and not (tmp_path / "bad").exists()


def test_background_work_gives_the_baselines_and_mined_pairs_of_the_stages(tmp_path, tok_dir, corpus_dir):
    """The GPU plan computes the baselines and mines the SFT pairs in spawned processes while
    pretraining runs. The baseline stage then returns the same figures as computing them in place;
    the SFT mixture reads the mined files, which hold the same pairs as mining in the stage
    (each function once, under the innermost source that holds it, with the plan's weights)."""
    import shutil
    import sysconfig
    from dataclasses import replace

    import torch

    from codechat.config.sft import SFTConfig
    from codechat.data.mining import mine_records
    from codechat.data.mixture import Mixture
    from codechat.speedrun.plan import plan
    from codechat.speedrun.rl_choice import with_rl
    from codechat.speedrun.baselines import validation_baselines
    from codechat.speedrun.run import Speedrun
    run = tmp_path / "run"
    shutil.copytree(tok_dir, run / "tokenizer")
    shutil.copytree(corpus_dir, run / "data")
    src = tmp_path / "src"
    inner = src / "pkg"  # a second source inside the first: its files go to its own part
    inner.mkdir(parents=True)
    (src / "a.py").write_text('def double(x):\n    """Return twice the number x given."""\n    return 2 * x\n')
    (inner / "b.py").write_text('def halve(x):\n    """Return half of the number x given."""\n    return x / 2\n')
    (inner / "c.py").write_text((src / "a.py").read_text())  # the same function again: kept once
    p = plan(torch.device("cpu"), "tiny", 2.0)
    assert not p.background_cpu_work and list(p.stages).index("baseline") == list(p.stages).index("pretrain") + 1
    assert p.mine_parts == ((p.sources[0], 1.0),)
    g = plan(torch.device("cuda"), None, 8.5)  # planning only: nothing runs on the device
    assert g.preset == "d12" and g.pretrain_base().optim.name == "muon" and g.pretrain_base().optim.lr == 2e-3
    assert g.background_cpu_work and g.mine_parts == ((g.sources[0], 1.0),) + tuple((d, 0.1) for d in g.sources[1:])
    p = replace(p, background_cpu_work=True, background_mine_workers=2, sources=(str(src), str(inner)),
                sft_mine_other_weight=0.25)
    s = Speedrun(p, run, torch.device("cpu"), "cpu", 0, resume=False)
    s._start_background()
    job = s._baselines
    got = s._baseline(1.0, "[4/9]")
    assert job.done() and s._baselines is None
    assert got == validation_baselines(run) and 0.5 < got["xz_concat_bpb"] < got["gzip_bpb"] < 8
    spec, counts = s._sft_data()
    files = s._mined_files()
    # no doctests there, but one pure function, double: an input/output task of the RL pool (halve's floats
    # and the copy of double are not), so chat SFT reads the pairs without its two (both styles)
    assert [json.loads(row)["task_id"] for row in s.doctest_file.read_text().splitlines()] == ["io/a.py::double"]
    kept = [f.with_name(f"{f.stem}.without_rl_tasks.jsonl") for f in files]
    assert spec == f"{kept[1]}#completion:0.25" and kept[0].read_text() == "" and s._mining is None
    assert counts["kept"] == 4 and counts["skipped"] == {"duplicate": 1} and counts["held_out_for_rl"] == 2
    assert counts["records"] == {str(files[0]): 2, str(files[1]): 2}
    mix = Mixture.from_config(SFTConfig(data=spec, mix_mode="epoch", decontaminate=False))
    want = {(r.conversation.messages[0].content, r.conversation.messages[1].content)
            for r in mine_records([src], style="both") if not r.source.endswith("a.py")}
    assert {(r.conversation.messages[0].content, r.conversation.messages[1].content)
            for src_ in mix.sources for r in src_.records} == want
    assert [len(x.records) for x in mix.sources] == [2] and "    return x / 2" in {
        r.conversation.messages[1].content for r in mix.sources[0].records}
    assert s._rl_pool_spec() == f"tasks:{s.doctest_file}" and p.rl_tasks == "doctest"
    assert s._sft_data() == (spec, {"held_out_for_rl": 2})  # a resumed run reads the files the first attempt wrote
    # a run stopped or interrupted while they work (mining the whole standard library) ends its jobs at once
    s.p = replace(p, sources=(sysconfig.get_paths()["stdlib"],))
    s._start_background()
    procs = s._background_procs

    def niceness() -> list[int]:  # field 19 of /proc/PID/stat, of the workers still there
        got = []
        for proc in procs:
            try:
                got.append(int(Path(f"/proc/{proc.pid}/stat").read_text().split(")")[1].split()[16]))
            except (FileNotFoundError, ProcessLookupError):  # a worker whose job ended (the baselines')
                pass
        return got
    until = time.monotonic() + 30  # the jobs run at the lowest priority once started (spawn takes a while);
    while set(niceness()) != {19} and time.monotonic() < until:  # the two miners take seconds on the stdlib
        time.sleep(0.05)
    assert niceness().count(19) >= 2 and set(niceness()) == {19}  # inductor's compile workers beside them first
    s._end_background()
    until = time.monotonic() + 1.5  # a terminated process is gone at once; the jobs take seconds to spawn and work
    for proc in procs:
        proc.join(timeout=max(0.0, until - time.monotonic()))

    def gone(pid: int) -> bool:  # (is_alive() is unreliable once the executor's own thread reaped the process)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"  # a zombie is gone too
    assert len(procs) == 3 and all(gone(proc.pid) for proc in procs) and s._background_procs == []
    s.p = p
    shutil.rmtree(run / "sft_mined")
    assert s._sft_data() == (f"mine:{src}:1,mine:{inner}:0.25", None)  # no files: the stage mines them itself
    s.p = with_rl(p, "off", torch.device("cpu"))  # without RL no pool is mined: its sandbox workers would only take cores
    s._start_background()
    assert s._doctests is None and s._mining is not None and len(s._background_procs) == 2
    s._end_background()
