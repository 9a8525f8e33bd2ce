"""The RL stage end to end on CPU: a tiny policy learns a task family by GRPO, a dead run stops
itself, a killed run resumes into the same steps, and bad settings are refused before step 0.

The task family: "Write a function `f()` that returns N." for N in 0..9, judged in the sandbox by
``assert f() == N``. The policy is SFT'd on answers that return N one time in five and N + 1
otherwise, so it writes valid code, reads N, and mostly gets it wrong (mean reward < 0.3): only
the reward can teach it which of the two to write.
"""
from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from codechat import checkpoint as ckpt
from codechat.cli import main
from codechat.config.sft import SFTConfig, SFTStageConfig
from codechat.config.stages import ConfigError, TrainConfig, OptimConfig, RunConfig, load
from codechat.speedrun.rl_stage import AFTER_RL_EVAL_SHARE, RLStage
from codechat.train.grpo import RLStageConfig, TaskSchedule, run_rl
from codechat.train.sft import run_sft
from codechat.train.stop import RunStopped

from conftest import FIXTURES, save_random_base
from test_stop import assert_same_checkpoint, step_clock

DIGITS = range(10)


def prompt(n: int) -> str:
    return f"Write a function `f()` that returns {n}."


def write_tasks(path: Path, tests: str = "assert f() == {n}", reference: bool = True, mined: bool = False) -> Path:
    """The pool's tasks; ``mined``: shaped as the corpus miners write them (``io``, a base prompt that opens f)."""
    rows = [{"task_id": f"ret{n}", "prompt": prompt(n), "tests": [tests.format(n=n)],
             **({"reference": f"def f():\n    return {n}\n"} if reference else {}),
             **({"suite": "io", "entry_point": "f", "base_prompt": f'def f():\n    """Return {n}."""\n'} if mined else {})}
            for n in DIGITS]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def policy(tok, tok_dir, tmp_path_factory) -> Path:
    """A tiny model SFT'd to answer prompt N with ``def f(): return M``, M = N (20 %) or N + 1 (80 %)."""
    tmp = tmp_path_factory.mktemp("rl_policy")
    init = save_random_base(tok_dir, tok.vocab_size, tmp / "base")
    rng = random.Random(0)
    rows = []
    for _ in range(1000):
        n = rng.choice(DIGITS)
        m = n if rng.random() < 0.2 else (n + 1) % 10
        rows.append({"messages": [{"role": "user", "content": prompt(n)},
                                  {"role": "assistant", "content": f"def f():\n    return {m}"}]})
    data = tmp / "format.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_sft(SFTStageConfig(init=str(init), sft=SFTConfig(data=str(data), max_length=64, max_prompt_length=48,
                                                         decontaminate=False),
                           optim=OptimConfig(lr=3e-3, warmup_steps=10, schedule="linear", min_lr_ratio=0.0,
                                             weight_decay=0.0),
                           train=TrainConfig(max_steps=300, micro_batch_size=16, log_every=50, eval_every=10**9,
                                             save_every=10**9),
                           run=RunConfig(out=str(tmp / "sft"), device="cpu")), show_progress=False)
    return tmp / "sft"


def rl_config(policy: Path, tasks: Path, out: Path, **over: str) -> RLStageConfig:
    # rl.judge_timeout_s 10: on a loaded 2-core CI machine the default 1 s could time out a right answer
    settings = {"init": str(policy), "rl.tasks": f"tasks:{tasks}", "rl.reward": "binary", "rl.group_size": "8",
                "rl.prompts_per_step": "8", "rl.max_new_tokens": "16", "rl.preflight_tasks": "10",
                "rl.log_rollouts_every": "0", "rl.judge_timeout_s": "10", "optim.lr": "2e-3", "train.max_steps": "60",
                "train.save_every": "1000",
                "run.out": str(out), "run.device": "cpu", **over}
    return load(RLStageConfig, None, settings)


def rewards(out: Path) -> list[float]:
    return [json.loads(ln)["reward_mean"] for ln in (out / "metrics.jsonl").read_text().splitlines()]


def best_window(curve: list[float], n: int = 5) -> float:
    return max(sum(curve[i:i + n]) / n for i in range(len(curve) - n + 1))


def test_the_policy_learns_and_shuffled_rewards_teach_nothing(policy, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    res = run_rl(rl_config(policy, tasks, tmp_path / "rl"), show_progress=False)
    curve = rewards(tmp_path / "rl")
    pre = json.loads((tmp_path / "rl" / "preflight.json").read_text())
    assert pre["pass@1"] < 0.3 and pre["band"] != "stall", pre
    assert res["stopped"] == "max_steps" and res["step"] == 60 and len(curve) == 60
    assert sum(curve[:3]) / 3 < 0.3, curve
    assert best_window(curve) > 0.8, curve  # 2026-12-01, 2-core VM: 0.16 -> ~0.83 after 20 steps
    control = run_rl(rl_config(policy, tasks, tmp_path / "control", **{"rl.shuffle_rewards": "true"}),
                     show_progress=False)
    flat = rewards(tmp_path / "control")
    assert best_window(flat) < 0.4, flat  # rewards that do not follow the rollouts teach nothing
    assert control["stopped"] in ("budget", "dead")


def rl_cli(policy: Path, tasks: Path, out: Path, *extra: str) -> list[str]:
    return ["rl", "--init", str(policy), "--tasks", f"tasks:{tasks}", "--group-size", "8", "--prompts-per-step", "4",
            "--max-new-tokens", "16", "--out", str(out), "--device", "cpu", "--rl.preflight_tasks", "4",
            "--optim.lr", "2e-3", "--rl.judge_timeout_s", "10", *extra]


def test_epochs_set_the_step_count_from_the_tasks_trained_on(policy, tmp_path, capsys):
    tasks = write_tasks(tmp_path / "tasks.jsonl")  # one task a digit, 4 a step: 2 passes are ceil(2 * 10 / 4) steps
    assert main(rl_cli(policy, tasks, tmp_path / "rl", "--epochs", "2")) == 0
    out = capsys.readouterr().out
    assert f"2 passes over {len(DIGITS)} tasks: at most {math.ceil(2 * len(DIGITS) / 4)} steps" in out, out
    rows = (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == math.ceil(2 * len(DIGITS) / 4) and f"done: step {len(rows)}," in out


@pytest.mark.parametrize("reward", ["binary", "tiered"])
def test_a_run_no_sample_can_pass_is_refused_and_with_force_stops_itself(policy, tmp_path, capsys, reward):
    tasks = write_tasks(tmp_path / "never.jsonl", tests="assert f() == 'never'", reference=False)
    assert main(rl_cli(policy, tasks, tmp_path / "rl", "--reward", reward)) == 2
    err = capsys.readouterr().err
    assert "refusing to start RL: pass@1 = 0.00% < 1%" in err and "--force" in err, err
    assert not (tmp_path / "rl" / "metrics.jsonl").exists()  # nothing trained
    assert json.loads((tmp_path / "rl" / "preflight.json").read_text())["pass@1"] == 0.0
    assert main(rl_cli(policy, tasks, tmp_path / "rl", "--reward", reward, "--force", "--dead-steps", "3")) == 3
    err = capsys.readouterr().err
    assert "the RL run is dead: 3 steps in a row without signal" in err and "--reward tiered" in err, err
    assert "codechat eval filter" in err and "more SFT" in err
    rows = [json.loads(ln) for ln in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and [r["dead_streak"] for r in rows] == [1, 2, 3]
    assert all(r["tests_passed"] == 0 for r in rows)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "rl" / "checkpoints")] == ["step_000003"]


def test_a_killed_run_resumes_into_the_same_tasks_and_seeds(policy, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    args = ["--max-steps", "6", "--train.save_every", "1", "--rl.log_rollouts_every", "1"]
    cmd = [sys.executable, "-m", "codechat"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    whole = subprocess.run(cmd + rl_cli(policy, tasks, tmp_path / "whole", *args), capture_output=True, text=True,
                           timeout=300, env=env)
    assert whole.returncode == 0, whole.stderr
    proc = subprocess.Popen(cmd + rl_cli(policy, tasks, tmp_path / "killed", *args), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
    third = tmp_path / "killed" / "checkpoints" / "step_000003"
    deadline = time.time() + 240
    while not third.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert third.exists()
    resumed = subprocess.run(cmd + rl_cli(policy, tasks, tmp_path / "killed", *args, "--resume"),
                             capture_output=True, text=True, timeout=300, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "pre-RL check" not in resumed.stdout  # done once, before step 0

    def log(run: str, name: str) -> list[dict]:
        return [json.loads(ln) for ln in (tmp_path / run / name).read_text().splitlines()]
    keys = ("step", "reward_mean", "pass_rate", "completion_len", "tests_passed", "train_tokens")
    a, b = log("whole", "metrics.jsonl"), log("killed", "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6]
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]
    assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], rel=1e-4, abs=1e-7)
    texts = [[(r["step"], r["kind"], r["task_id"], r["text"]) for r in log(run, "rollouts.jsonl")]
             for run in ("whole", "killed")]
    assert texts[0] == texts[1] and len(texts[0]) == 12


def test_rl_stopped_after_step_k_and_resumed_equals_the_run_never_stopped(policy, tmp_path):
    """Step mode, a fake clock due after step 2 (``--stop-after-min``'s path): the resumed run's weights and
    optimizer state equal the uninterrupted run's bit for bit, and its steps are logged once each."""
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    over = {"train.max_steps": "4", "rl.max_new_tokens": "8"}
    run_rl(rl_config(policy, tasks, tmp_path / "whole", **over), show_progress=False)
    with step_clock(2).install(), pytest.raises(RunStopped, match="at rl step 2"):
        run_rl(rl_config(policy, tasks, tmp_path / "cut", **over), show_progress=False)
    run_rl(rl_config(policy, tasks, tmp_path / "cut", **over, **{"run.resume": "true"}), show_progress=False)
    assert_same_checkpoint(tmp_path / "whole", tmp_path / "cut")
    assert [r["step"] for r in map(json.loads, (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines())] == \
        [1, 2, 3, 4]


def test_the_task_schedule_is_a_function_of_seed_and_step():
    items = [type("T", (), {"task_id": f"t{i}"})() for i in range(5)]
    a, b = TaskSchedule(items, 3, seed=7), TaskSchedule(items, 3, seed=7)
    first = [a.next_batch() for _ in range(4)]
    b.load_state_dict({"batches": 2, "dead_streak": 0})
    assert [b.next_batch() for _ in range(2)] == first[2:]
    picked = [t.task_id for tasks, _ in first[:5] for t in tasks]
    assert sorted(picked[:5]) == [f"t{i}" for i in range(5)]  # an epoch visits every task once
    assert len({s for _, seeds in first for s in seeds}) == 12


@pytest.mark.parametrize("setting, fragment", [
    ({"rl.group_size": "1"}, "a group of one has no variance"),
    ({"rl.temperature": "0"}, "greedy samples of one prompt are all equal"),
    ({"rl.reward": "exact"}, "rl.reward must be auto or one of"),
])
def test_settings_that_cannot_learn_are_refused_when_the_config_is_built(policy, tmp_path, setting, fragment):
    from codechat.config.stages import ConfigError
    with pytest.raises(ConfigError, match=fragment):
        rl_config(policy, tmp_path / "t.jsonl", tmp_path / "rl", **setting)


def check_bad_tasks_refused(policy: Path, tmp_path: Path, glaive: Path) -> None:
    def refused(tasks: str, **over: str) -> str:
        cfg = load(RLStageConfig, None, {"init": str(policy), "rl.tasks": tasks, "run.out": str(tmp_path / "rl"),
                                         "run.device": "cpu", **over})
        with pytest.raises(ValueError) as e:
            run_rl(cfg, show_progress=False)
        assert not (tmp_path / "rl" / "metrics.jsonl").exists()
        return str(e.value)
    no_tests = tmp_path / "no_tests.jsonl"
    no_tests.write_text(json.dumps({"task_id": "t", "prompt": "Write f.", "tests": []}) + "\n")
    assert "no_tests.jsonl:1: task 't' has no tests" in refused(f"tasks:{no_tests}")
    bad_ref = tmp_path / "bad_ref.jsonl"
    bad_ref.write_text(json.dumps({"task_id": "r7", "prompt": prompt(7), "tests": ["assert f() == 7"],
                                   "reference": "def f():\n    return 0\n"}) + "\n")
    assert "r7" in refused(f"tasks:{bad_ref}")
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    msg = refused(f"tasks:{tasks}", **{"rl.reward": "funcall_tiered"})
    assert "--reward funcall_tiered judges funcall tasks" in msg and "ret" in msg and "--reward binary" in msg
    msg = refused(f"funcall:{glaive}", **{"rl.reward": "binary"})
    assert "--reward binary judges code tasks" in msg and "--reward funcall_tiered" in msg


def test_bad_tasks_and_a_reward_of_the_wrong_kind_are_errors_before_step_0(policy, tmp_path, shared_dir):
    check_bad_tasks_refused(policy, tmp_path, shared_dir / "data" / "function_calling_glaive" /
                            "glaive_toolcall_en_demo.json")


def test_bad_tasks_and_a_reward_of_the_wrong_kind_are_errors_before_step_0_on_the_mini_glaive_file(policy, tmp_path):
    """The same with the project's glaive-style conversations (tests/fixtures/cases_a/glaive_mini.json)."""
    check_bad_tasks_refused(policy, tmp_path, FIXTURES / "cases_a" / "glaive_mini.json")


def test_kl_several_updates_per_batch_and_sequence_norm_run_and_are_logged(policy, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    res = run_rl(rl_config(policy, tasks, tmp_path / "rl", **{"train.max_steps": "3", "rl.beta": "0.1",
                                                               "rl.num_iterations": "2", "rl.loss_norm": "sequence",
                                                               "rl.log_rollouts_every": "1"}),
                 show_progress=False)
    rows = [json.loads(ln) for ln in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert res["step"] == 3 and len(rows) == 3
    assert all(r["kl"] > 0 for r in rows)  # logged from the batch's last update: the policy has left its reference
    assert any(r["ratio_mean"] != 1.0 for r in rows)  # the second update of a batch is off-policy
    assert all(r["train_tokens"] > 0 and r["entropy"] > 0 and r["logprob_mismatch"] < 1e-3 for r in rows)
    kinds = [json.loads(ln)["kind"] for ln in (tmp_path / "rl" / "rollouts.jsonl").read_text().splitlines()]
    assert kinds == ["best", "typical"] * 3


def test_lora_rl_samples_from_the_current_adapters_and_its_kl_reference_is_the_base(policy, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    out = tmp_path / "rl"
    res = run_rl(rl_config(policy, tasks, out, **{"train.max_steps": "3", "rl.beta": "0.1", "peft": "lora",
                                                  "lora.rank": "8", "optim.lr": "2e-2", "optim.name": "adamw",
                                                  "rl.prompts_per_step": "4"}),
                 show_progress=False)
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert res["step"] == 3 and all(r["train_tokens"] > 0 for r in rows)
    # the engine's log-probs are the training forward's: every step's rollouts came from the updated adapters
    assert all(r["logprob_mismatch"] < 1e-3 for r in rows)
    # B starts at 0, so the first step's policy is the base exactly; the next have left it
    assert rows[0]["kl"] < 1e-6 and all(r["kl"] > 1e-4 for r in rows[1:])
    saved = torch.load(ckpt.resolve(out) / "model.pt")
    assert saved and all(".lora_" in k for k in saved)


def test_the_speedrun_rl_stage_filters_its_pool_trains_and_reports_before_and_after(policy, tmp_path):
    import shutil
    from dataclasses import replace

    from codechat.speedrun.plan import plan
    from codechat.speedrun.report import speedrun_report
    from codechat.speedrun.run import Speedrun
    tasks = write_tasks(tmp_path / "tasks.jsonl", mined=True)
    p = replace(plan(torch.device("cpu"), "tiny", 2.0), rl_tasks=f"tasks:{tasks}", rl_tokens=16, rl_prompts_per_step=4,
                rl_min_tasks=2, rl_heldout_tasks=2, rl_heldout_samples=4, rl_filter_samples=8, rl_filter_share=1.0,
                rl_epochs=1, eval_limit=1, eval_tokens=16)
    run = tmp_path / "run"
    shutil.copytree(policy, run / "sft")
    shutil.copytree(policy, run / "pretrain")  # the base the slice is also scored on
    s = Speedrun(p, run, torch.device("cpu"), "cpu", 0, resume=False)
    s.begin_stage(60.0)
    s.m["eval"] = {"humaneval": s._score("humaneval", "HumanEval", "[8/9]", n=p.eval_n, max_new_tokens=16, limit=1)}
    s.begin_stage(20.0)
    out = s._rl(20.0, "[9/9]")
    # one pass over the kept tasks less the two held out, 4 a step (rl_epochs), well within the 20 s
    assert out["skipped"] is False and out["stopped"] == "max_steps", out
    assert out["train_tasks"] == out["filter"]["kept"] - 2 and out["steps"] == math.ceil(out["train_tasks"] / 4)
    f = out["filter"]  # every task sampled (three batches of 4, well within 20 s), those with rates in (0, 1) kept
    assert f["pool"] == f["sampled"] == 10 and 4 <= f["kept"] == len(f["kept_ids"]) <= 10 and "counts" not in f
    assert out["pool"]["tasks"] == 10 and out["pool"]["decontaminated"] == []
    h = out["heldout"]  # two kept tasks never trained on, scored on sft/ and rl/ with the same seeds
    assert h == json.loads((run / "rl" / "heldout.json").read_text())
    assert h["before"]["tasks"] == h["after"]["tasks"] == 2
    # scored with rl_heldout_samples each (not the filter's 8), the filter's counts kept beside them
    assert h["before"]["samples"] == h["after"]["samples"] == 4
    assert h["before"]["filter_samples"] == p.rl_filter_samples == 8
    assert all(0 <= c <= 4 for c in h["before"]["solved"].values())
    assert set(h["before"]["filter_solved"]) == set(h["before"]["solved"])
    assert set(h["before"]["solved"]) == set(h["after"]["solved"]) <= set(f["kept_ids"])
    assert all(0 <= x[k] <= 1 for x in (h["before"], h["after"]) for k in ("pass@1",))
    for x in (h["before"], h["after"]):  # per part of the pool, summing back to the slice's pass@1
        assert sum(b["tasks"] for b in x["by_part"].values()) == 2
        assert sum(b["tasks"] * b["pass@1"] for b in x["by_part"].values()) / 2 == pytest.approx(x["pass@1"])
    b = out["heldout_pretrain"]  # the slice's tasks on pretrain/, as many samples a task, GRPO's temperature
    assert b["stage"] == "pretrain" and b["problems"] == 2 and b["n"] == 4 and b["temperature"] == 1.0
    assert (run / "eval" / "rl-heldout-pretrain" / "results.json").is_file()
    he = out["humaneval"]  # HumanEval scored again, on the RL checkpoint
    assert he["stage"] == "rl" and he["problems"] == 1 and (run / "eval" / "humaneval-rl" / "results.json").is_file()
    assert 0 <= out["reward_first"] <= 1 and len(out["curve"]) == out["steps"] and (run / "rl_reward.png").is_file()
    # no HumanEval stage finished on sft/ yet: the evaluations after GRPO keep the plan's share of the grant
    assert out["evals_reserved_s"] == pytest.approx(p.rl_evals_share * 20.0)
    # the filter samples for its share of the time before that reserve, never into it (rl_filter_share 1.0 here)
    assert out["filter_budget_s"] <= 20.0 - out["evals_reserved_s"]
    assert set(out["setup_s"]) == {"policy", "pool", "trainer", "engine", "filter", "heldout_before"}
    assert all(v >= 0 for v in out["setup_s"].values())
    # with it, they keep what HumanEval and MBPP took on sft/, scaled to the problems a deadline left out
    s.m["stages"]["eval"].update(status="done", wall_s=17.0)
    assert s._evals_after_rl_s(20.0)[0] == pytest.approx(17.0 / AFTER_RL_EVAL_SHARE)
    m = {"stages": {"eval": {"status": "done", "wall_s": 17.0}, "mbpp": {"status": "done", "wall_s": 16.0}},
         "eval": {"humaneval": {"problems": 1, "problems_planned": 2}}, "mbpp": {"problems": 320, "problems_planned": 500}}
    with_mbpp = SimpleNamespace(p=SimpleNamespace(mbpp="mbpp.jsonl", rl_evals_share=0.4), m=m)
    kept, why = RLStage._evals_after_rl_s(with_mbpp, 20.0)
    assert kept == pytest.approx((34.0 + 25.0) / AFTER_RL_EVAL_SHARE) and "HumanEval and MBPP" in why
    m["stages"]["mbpp"]["status"] = "failed"
    assert RLStage._evals_after_rl_s(with_mbpp, 20.0)[0] == pytest.approx(0.4 * 20.0)
    # MBPP cut short on rl/: sft/'s figures over the problems scored on both
    paired = SimpleNamespace(run=tmp_path / "paired")
    for d, per in (("mbpp", {"1": {"n": 10, "c": 2}, "2": {"n": 10, "c": 0}, "3": {"n": 10, "c": 10}}),
                   ("mbpp-rl", {"1": {"n": 10, "c": 3}, "3": {"n": 10, "c": 10}})):
        (paired.run / "eval" / d).mkdir(parents=True)
        (paired.run / "eval" / d / "results.json").write_text(json.dumps({"per_task": per}))
    same = RLStage._before_on_the_same_problems(paired, "mbpp", {"pass@k": {"pass@1": 0.65, "pass@10": 1.0}})
    assert same["problems"] == 2 and same["pass@1"] == pytest.approx(0.6) and same["pass@k"]["pass@10"] == 1.0
    assert RLStage._before_on_the_same_problems(paired, "humaneval", {"pass@k": {"pass@1": 0.0}}) is None
    s.m["rl"], s.m["stages"]["rl"]["status"] = out, "done"
    s.m["stages"]["rl"]["granted_s"] = 20.0
    s.m["stages"]["eval"]["status"] = "done"
    out["humaneval"]["before_same_problems"] = {"problems": 1, "pass@k": {"pass@1": 0.5}, "pass@1": 0.5,
                                                "pass@1_ci95": None}
    report = speedrun_report(s.m)
    assert "| HumanEval (1 of 1 problems, the same before and after) | pass@1 | 50.00% |" in report
    assert "## RL (GRPO)" in report
    assert f"{out['steps']} (stopped: max_steps, at most 1 pass over its {out['train_tasks']} tasks)" in report
    assert "; before step 0 (s): policy " in report and "; kept for the evaluations after it 8 s" in report
    assert "first 5 steps -> last 5" in report
    assert out["settings"]["group_size"] == p.rl_group_size and out["settings"]["tasks_per_step"] == 4
    assert "| held-out slice of the kept tasks (2, never trained on): pass@1 before -> after |" in report
    assert "| the slice's mined tasks (2) on `pretrain/`, base mode" in report
    part, b = next(iter(h["before"]["by_part"].items()))  # and per part of the pool, in the report and the record
    assert f"a task, the same seeds); {part} ({b['tasks']}) {b['pass@1']:.1%} -> " in report
    from codechat.speedrun.record import record_line
    by_part = record_line(s.m, "codechat speedrun", None)["rl_heldout"]["by_part"]
    assert by_part[part][:2] == [b["tasks"], b["pass@1"]] and sum(v[0] for v in by_part.values()) == 2
    by_rate = record_line(s.m, "codechat speedrun", None)["rl_heldout"]["by_filter_rate"]
    assert sum(v[0] for v in by_rate.values()) == 2 and "| the slice by its tasks' rate at the filter: pass@1" in report
    change = record_line(s.m, "codechat speedrun", None)["rl_heldout"]["change"]
    assert change[0] == pytest.approx(h["after"]["pass@1"] - h["before"]["pass@1"]) and change[1] <= change[0] <= change[2]
    assert f"| the slice's change, after - before: pass@1 [95% paired interval over its tasks] | {change[0] * 100:+.1f} " \
           "points [" in report
    kept_counts = {k: c for k, (_, c) in json.loads((run / "rl" / "filter.json").read_text())["counts"].items()}
    assert h["before"]["filter_solved"] == {t: kept_counts[t] for t in h["before"]["solved"]}
    assert f"| sampled tasks by samples passed (0, 1, ... of each task's {p.rl_filter_samples}) | all " in report
    assert sum(f["histogram"]["all"]) == f["sampled"]
    assert f"| GRPO settings | groups of {p.rl_group_size}, 4 tasks a step, adamw at lr 1e-05, KL weight 0," in report
    assert f"**{f['kept']} kept**" in report and "![RL reward curve](rl_reward.png)" in report
    assert "before RL (`sft/`)" in report
    assert "## HumanEval after RL" in report and "`rl/`, chat mode" in report


def test_an_rl_step_under_ddp_on_two_ranks_equals_one_process(policy, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    args = rl_cli(policy, tasks, tmp_path / "X", "--max-steps", "2", "--rl.log_rollouts_every", "1",
                  "--train.micro_batch_size", "4")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, "-m", "codechat", *args], capture_output=True, text=True, timeout=300,
                         env=env)
    assert one.returncode == 0, one.stderr[-3000:]
    args[args.index(str(tmp_path / "X"))] = str(tmp_path / "two")
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "codechat", *args, "--train.micro_batch_size", "2"], capture_output=True, text=True,
                         timeout=300, env=env)
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = (rows for rows in ([json.loads(ln) for ln in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
                              for d in ("X", "two")))
    keys = ("reward_mean", "pass_rate", "frac_reward_zero_std", "completion_len", "tests_passed", "train_tokens")
    assert [[r[k] for k in keys] for r in a[:1]] == [[r[k] for k in keys] for r in b[:1]]
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in a], rel=1e-4, abs=1e-6)
    assert b[0]["entropy"] == pytest.approx(a[0]["entropy"], rel=1e-5)
    texts = [[r["text"] for r in map(json.loads, (tmp_path / d / "rollouts.jsonl").read_text().splitlines())]
             for d in ("X", "two")]
    assert texts[0] == texts[1]  # the best and typical rollouts of every step, from the gathered groups


def test_codechat_rl_filters_its_pool_with_the_policy_and_skips_when_too_few_remain(policy, tmp_path, capsys):
    """The real tiny policy of test_rl_stage answers 'returns N' right about one time in five: those
    tasks have rates in (0, 1); a test no answer passes (rate 0) and one every answer passes (rate 1)
    are left out."""
    from codechat.train.task_pool import TooFewTasks
    from test_task_pool import _row
    rows = [_row(f"ret{n}", prompt(n), f"assert f() == {n}").replace('return 1', f'return {n}') for n in DIGITS]
    rows += [_row(f"never{n}", prompt(n), "assert f() == 'never'").replace('return 1', "return 'never'")
             for n in DIGITS]
    rows += [_row(f"any{n}", prompt(n), "assert callable(f)").replace('return 1', f'return {n}') for n in DIGITS]
    tasks = tmp_path / "pool.jsonl"
    tasks.write_text("".join(rows))
    out = tmp_path / "rl"
    args = rl_cli(policy, tasks, out, "--filter-samples", "8", "--max-steps", "2", "--rl.log_rollouts_every", "0")
    assert main([*args, "--rl.min_tasks", "4"]) == 0
    f = json.loads((out / "filter.json").read_text())
    assert f["pool"] == f["sampled"] == 30 and all(f["counts"][f"never{n}"] == [8, 0] for n in DIGITS)
    assert set(f["kept_ids"]) == {t for t, (n, c) in f["counts"].items() if 0 < c < n}
    # "ret" tasks are right about one sample in five, "any" tasks pass whenever the code runs
    assert sum(t.startswith("ret") for t in f["kept_ids"]) >= 4 and not (out / "preflight.json").exists()
    assert sum(f["counts"][f"any{n}"] == [8, 8] for n in DIGITS) >= 5
    assert json.loads((out / "pool.json").read_text())["tasks"] == 30
    steps = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps] == [1, 2]
    capsys.readouterr()
    assert main([*args[:args.index("--out") + 1], str(tmp_path / "few"), *args[args.index("--out") + 2:]]) == 2
    err = capsys.readouterr().err
    few = json.loads((tmp_path / "few" / "filter.json").read_text())
    # 32 can never be kept from a pool of 30: the filter stops after its first task
    assert few["sampled"] == 1 and few["pool"] == 30
    never, always = (sum(c == v for n, c in few["counts"].values()) for v in (0, 8))
    assert f"error: {few['kept']} of 1 sampled pool tasks (30 in the pool)" in err, err
    assert f"({never} never solved, {always} always solved;" in err
    assert "GRPO needs at least 32 (rl.min_tasks), so RL is skipped" in err
    assert not (tmp_path / "few" / "metrics.jsonl").exists()
    assert issubclass(TooFewTasks, ConfigError)


def test_the_filter_streams_tasks_into_the_engine_and_counts_as_a_batch_does(policy, tmp_path):
    """``stream_passes`` feeds tasks only while the engine's rows stay at 1.5x its slots, the next joining as
    rows finish, and counts each task's passes exactly as ``collect`` does with the same seeds (a sample's
    stream is its task's seed and index, whatever else is in the batch)."""
    from codechat.data.tasks import load_tasks
    from codechat.engine import Engine, EngineConfig, SamplingConfig
    from codechat.train.rollouts import Judge, collect, stream_passes
    model, tok, _ = ckpt.load_model(policy, torch.device("cpu"))
    tasks = load_tasks(f"tasks:{write_tasks(tmp_path / 'pool.jsonl')}")
    engine = Engine(model, EngineConfig(slots=16))
    sampling = SamplingConfig(16, temperature=1.0)
    judge = Judge("binary", workers=2, timeout_s=10)
    seeds = [100 + i for i in range(len(tasks))]
    busy: list[int] = []

    def feed():
        for t, s in zip(tasks, seeds):
            busy.append(sum(engine.busy()))
            yield t, s
    try:
        streamed = {t.task_id: c for t, c in stream_passes(engine, tok, feed(), judge, group_size=4, sampling=sampling)}
        batch = collect(engine, tok, tasks, seeds, judge, group_size=4, sampling=sampling).passes_per_task(4)
    finally:
        judge.close()
    assert streamed == {t.task_id: c for t, c in zip(tasks, batch)} and 0 < sum(batch) < 40
    assert max(busy) + 4 <= 24 and busy[:6] == [0, 4, 8, 12, 16, 20]  # 6 tasks of 4 rows fill 1.5 x 16
    assert not engine.has_work() and not engine._outputs


def test_the_held_out_slice_is_a_seeded_draw_that_leaves_min_tasks_to_train_on():
    from codechat.train.rl_heldout import split_heldout
    tasks = [f"t{i}" for i in range(40)]

    def split(*args, seed):
        return split_heldout(tasks, *args, seed=seed, group=str)
    train, held = split(8, 30, seed=3)
    assert len(held) == 8 and len(train) == 32 and not set(train) & set(held) and set(train) | set(held) == set(tasks)
    assert train == [t for t in tasks if t in train]  # the training tasks keep their order
    assert (train, held) == split(8, 30, seed=3) and held != split(8, 30, seed=4)[1]
    assert split(8, 35, seed=3)[1].__len__() == 5  # min_train wins
    assert split(8, 40, seed=3) == (tasks, []) and split(0, 2, seed=3) == (tasks, [])


def test_copies_of_a_function_fall_on_one_side_of_the_held_out_split():
    from codechat.train.rl_heldout import copy_group, split_heldout
    assert copy_group("io/pydantic/v1/json.py::decimal_encoder") == copy_group("doctest/fastapi/encoders.py::"
                                                                             "decimal_encoder") == "decimal_encoder"
    assert copy_group("mbpp/601") == "mbpp/601"
    tasks = [SimpleNamespace(task_id=f"io/pkg{i % 7}/m.py::f{i % 12}") for i in range(48)]  # 12 names, 4 copies each
    for seed in range(5):
        train, held = split_heldout(tasks, 16, 32, seed)
        assert len(held) == 16 and len(train) == 32  # whole groups of 4 fill the 16 exactly
        assert not {copy_group(t.task_id) for t in held} & {copy_group(t.task_id) for t in train}
    f0 = [t for t in tasks if t.task_id.endswith("::f0")]
    uneven = f0 + [SimpleNamespace(task_id=f"io/x.py::g{i}") for i in range(40)]  # one group of 4 and singletons
    train, held = split_heldout(uneven, 10, 30, seed=1)
    assert len(held) == 10 and not {copy_group(t.task_id) for t in held} & {copy_group(t.task_id) for t in train}


def test_the_held_out_slice_is_broken_down_by_part_of_the_pool():
    from codechat.train.rl_heldout import by_part
    solved = {"MBPP/11": 8, "io/json.dumps": 1, "MBPP/12": 2, "doctest/a.b:3": 4, "plain": 0}
    assert by_part(solved, 8) == {"MBPP": {"tasks": 2, "pass@1": 10 / 16}, "io": {"tasks": 1, "pass@1": 1 / 8},
                                  "doctest": {"tasks": 1, "pass@1": 0.5}, "other": {"tasks": 1, "pass@1": 0.0}}
    assert by_part({}, 8) == {}


def test_the_held_out_slices_change_has_a_paired_interval_over_its_tasks():
    """Every task one sample of 8 better: the change is +12.5 points exactly, though the slice's own pass@1
    intervals before and after (the spread between its tasks) overlap; tasks moving both ways straddle 0."""
    from codechat.eval.passk import bootstrap_interval
    from codechat.speedrun.record import heldout_change
    before = {f"t{i}": i % 7 for i in range(40)}
    up = {"before": {"samples": 8, "solved": before}, "after": {"samples": 8, "solved": {t: c + 1 for t, c in before.items()}}}
    assert heldout_change(up) == pytest.approx([0.125, 0.125, 0.125])
    lo_after = bootstrap_interval([(c + 1) / 8 for c in before.values()])[0]
    assert lo_after < bootstrap_interval([c / 8 for c in before.values()])[1]  # unpaired, the two overlap
    mixed = {t: c + (2 if i % 2 else -2) for i, (t, c) in enumerate({f"t{i}": 3 for i in range(40)}.items())}
    both = heldout_change({"before": {"samples": 8, "solved": {t: 3 for t in mixed}}, "after": {"samples": 8, "solved": mixed}})
    assert both[0] == pytest.approx(0.0) and both[1] < 0 < both[2]
    assert heldout_change({"before": {"samples": 8}, "after": {"samples": 8}}) is None


def test_the_held_out_slice_is_split_by_each_tasks_rate_at_the_filter():
    from codechat.speedrun.record import heldout_by_rate
    # split by the filter's reading, not by "before": task b's before (3 of 8) is below half, its filter rate is not
    at = {"a": 2, "b": 5, "c": 4, "d": 7}
    before = {"a": 1, "b": 3, "c": 4, "d": 7}
    after = {"a": 0, "b": 5, "c": 6, "d": 8}
    h = {"before": {"samples": 8, "solved": before, "filter_solved": at}, "after": {"samples": 8, "solved": after}}
    assert heldout_by_rate(h) == {"below_half": [1, 1 / 8, 0.0], "half_or_more": [3, 14 / 24, 19 / 24]}
    one = {"before": {"samples": 8, "solved": {"a": 5}, "filter_solved": {"a": 1}}, "after": {"samples": 8, "solved": {"a": 2}}}
    assert heldout_by_rate(one) == {"below_half": [1, 5 / 8, 2 / 8]}  # an empty side is left out
    assert heldout_by_rate({"before": {"samples": 8, "solved": before}, "after": {"samples": 8, "solved": after}}) == {}
    # scored with 16 samples, the filter's 8: the filter's rate is of its own 8 (b's 5 of 8 is over half, not 5 of 16)
    twice = {t: 2 * c for t, c in before.items()}
    h16 = {"before": {"samples": 16, "solved": twice, "filter_solved": at, "filter_samples": 8},
           "after": {"samples": 16, "solved": {t: 2 * c for t, c in after.items()}}}
    assert heldout_by_rate(h16) == heldout_by_rate(h)
