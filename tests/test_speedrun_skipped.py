"""The speedrun's stage table says ``skipped`` and why for a stage that did not do its work (RL
with too few tasks kept by its pass-rate filter) — in ``metrics.json`` (``status``, ``reason``) and ``report.md`` — and a
resumed run does not redo it; the SFT plot draws the train loss and the fixed-examples loss, a curve of
one point visibly, and its legend names only the curves drawn."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from codechat.config.stages import ConfigError
from codechat.speedrun.plan import GPU_SHARES, plan, with_plan_overrides
from codechat.speedrun.report import loss_curves, plot_loss, speedrun_report
from codechat.speedrun.run import Speedrun

MBPP_FIXTURE = Path(__file__).parent / "fixtures" / "cases_b" / "mbpp" / "mbpp.jsonl"
REASON = ("3 of 37 sampled pool tasks (37 in the pool) have a pass rate in [0, 1] and neither 0 nor 1 (34 never "
          "solved, 0 always solved; pool pass@1 1.01%); GRPO needs at least 32 (rl.min_tasks), so RL is skipped")


class Stubbed(Speedrun):
    """Every stage stubbed to a few figures; RL skips itself as the filter makes it."""

    calls: list[str] = []

    def _stub(self, name: str, result: dict) -> dict:
        Stubbed.calls.append(name)
        return result

    def _tokenizer(self, grant, tag): return self._stub("tokenizer", {"vocab_size": 300})
    def _data(self, grant, tag): return self._stub("data", {"files_seen": 3})
    def _pretrain(self, grant, tag): return self._stub("pretrain", {"val_bpb_final": 2.5})
    def _baseline(self, grant, tag): return self._stub("baseline", {"gzip_bpb": 3.0})
    def _samples(self, grant, tag): return self._stub("samples", {"n": 0})
    def _sft(self, grant, tag): return self._stub("sft", {"steps": 1})
    def _chat(self, grant, tag): return self._stub("chat", {"n": 0})
    def _eval(self, grant, tag): return self._stub("eval", {"humaneval": {"verdict": "stall"}})
    def _rl(self, grant, tag): return self._stub("rl", {"skipped": True, "reason": REASON})

    def _write(self) -> None:  # metrics.json only: the stubs hold too little for the report's sections
        self.m["total_wall_s"] = sum(self.m["stages"][s].get("wall_s", 0.0) for s in self.p.stages)
        (self.run / "metrics.json").write_text(json.dumps(self.m))


def test_a_skipped_stage_says_skipped_and_why_and_is_not_run_again(tmp_path, capsys):
    p = plan(torch.device("cpu"), "tiny", 2.0)
    run = tmp_path / "run"
    run.mkdir()
    Stubbed.calls = []
    m = Stubbed(p, run, torch.device("cpu"), "cpu", 0, resume=False).execute()
    assert Stubbed.calls == list(p.stages)
    rl = m["stages"]["rl"]
    assert rl["status"] == "skipped" and rl["reason"] == REASON and rl["wall_s"] >= 0
    assert m["rl"] == {"skipped": True, "reason": REASON, "wall_s": rl["wall_s"]}
    assert [s for s, st in m["stages"].items() if st["status"] != "done"] == ["rl"]
    assert json.loads((run / "metrics.json").read_text())["stages"]["rl"]["status"] == "skipped"
    capsys.readouterr()

    Stubbed.calls = []
    Stubbed(p, run, torch.device("cpu"), "cpu", 0, resume=True).execute()
    assert Stubbed.calls == []  # every stage finished: done or skipped
    out = capsys.readouterr().out
    assert f"[9/9] rl: skipped in an earlier attempt ({REASON})" in out
    assert "[8/9] eval: done in an earlier attempt, skipped" in out

    report = speedrun_report({"preset": "tiny", "device": "cpu", "stages": m["stages"], "rl": m["rl"],
                              "total_wall_s": m["total_wall_s"]})
    row = next(line for line in report.splitlines() if line.startswith("| rl |"))
    assert row.startswith(f"| rl | skipped: {REASON} | ")
    assert f"| skipped | {REASON} |" in report  # the RL section says why too
    assert "Run in progress" not in report and "stopped at stage" not in report


def test_each_stage_arms_a_dump_of_its_stacks_for_when_it_overruns_and_disarms_it_after(tmp_path, monkeypatch):
    import faulthandler

    from codechat.speedrun import run as run_module
    calls: list[tuple] = []
    monkeypatch.setattr(faulthandler, "dump_traceback_later", lambda timeout, file: calls.append(("arm", timeout)))
    monkeypatch.setattr(faulthandler, "cancel_dump_traceback_later", lambda: calls.append(("disarm",)))
    p = plan(torch.device("cpu"), "tiny", 2.0)
    Stubbed(p, tmp_path, torch.device("cpu"), "cpu", 0, resume=False).execute()
    assert [c[0] for c in calls] == ["arm", "disarm"] * len(p.stages)
    first = p.planned_s()[p.stages[0]]  # the stage's time left, then a minute more
    assert calls[0][1] == pytest.approx(first + run_module.OVERRUN_STACKS_S, abs=1.0) and run_module.OVERRUN_STACKS_S == 60


class Overrun(Stubbed):
    """Stubs on a fake clock: each stage takes its grant, pretraining 100 s more (a busy machine)."""

    now = 0.0
    grants: dict[str, float] = {}

    @classmethod
    def clock(cls) -> float:
        return cls.now

    def _stub(self, name: str, result: dict) -> dict:
        st = self.m["stages"][name]
        Overrun.grants[name] = st["granted_s"]
        Overrun.now += st["granted_s"] + (100.0 if name == "pretrain" else 0.0)
        assert self.time_left() == pytest.approx(-100.0 if name == "pretrain" else 0.0)
        return super()._stub(name, result)


def test_a_stage_left_no_time_is_skipped_and_so_are_the_stages_that_need_it(tmp_path):
    """The budget is a ceiling: after pretraining overran by 100 s of a 120-s budget the stages with no time
    left are skipped, saying so, and those that read their output say which input is missing."""
    p = plan(torch.device("cpu"), "tiny", 2.0)
    Overrun.now, Overrun.grants, Stubbed.calls = 0.0, {}, []
    m = Overrun(p, tmp_path, torch.device("cpu"), "cpu", 0, resume=False).execute()
    assert Stubbed.calls == ["tokenizer", "data", "pretrain"]
    planned = p.planned_s()
    assert Overrun.grants == pytest.approx({s: planned[s] for s in ("tokenizer", "data", "pretrain")})
    st = m["stages"]
    assert st["baseline"]["reason"] == st["samples"]["reason"] == st["sft"]["reason"] == \
        f"no time left: the stages before it spent the 2-minute budget ({sum(Overrun.grants.values()) + 100:.0f} s so far)"
    assert [st[s]["reason"] for s in ("chat", "eval", "rl")] == ["it needs sft/, and sft was skipped"] * 3
    assert all(st[s]["status"] == "skipped" and st[s]["wall_s"] == 0 for s in p.stages[3:])
    assert m["segments"][0]["ended"] == "done" and len(m["segments"]) == 1


def test_the_cpu_plan_gives_each_stage_its_floor_and_pretraining_the_rest():
    cpu = torch.device("cpu")
    p = plan(cpu, "tiny", 1.5)
    got = p.planned_s()
    assert sum(got.values()) == pytest.approx(90.0)
    assert {s: got[s] for s in ("samples", "sft", "chat", "eval", "rl")} == {
        s: p.min_s[s] for s in ("samples", "sft", "chat", "eval", "rl")}  # floors bind at 1.5 minutes
    assert got["tokenizer"] == pytest.approx(90 * p.shares["tokenizer"])  # its share is above its floor
    big = plan(cpu, "tiny", 12.0).planned_s()
    assert big["sft"] == pytest.approx(720 * p.shares["sft"]) and big["rl"] == p.min_s["rl"]
    need = next(m / 10 for m in range(1, 1000) if p.training_s(m * 6.0) >= p.min_s["pretrain"])
    with pytest.raises(ConfigError, match=rf"--time-budget-min 0.5 leaves pretraining 0.0 s .*give at least {need:g}$"):
        plan(cpu, "tiny", 0.5)
    assert plan(cpu, "tiny", need).training_s(need * 60) >= p.min_s["pretrain"] > p.training_s(need * 60 - 6)
    assert plan(torch.device("cuda"), None, 1.0).min_s == {}  # GPU shares as measured: no floors


def test_the_sft_plot_draws_the_train_loss_and_the_fixed_examples_loss(tmp_path):
    rows = [{"step": 0, "eval_loss": 3.609}, {"step": 1, "loss": 3.7, "lr": 1e-3}, {"step": 2, "loss": 3.1},
            {"step": 3, "loss": 2.9}, {"step": 3, "eval_loss": 2.744}]
    curves = loss_curves(rows)
    assert [(label, steps, losses) for label, _, steps, losses in curves] == [
        ("train loss (nats/token)", [1, 2, 3], [3.7, 3.1, 2.9]),
        ("loss on a fixed set of its examples (nats/token)", [0, 3], [3.609, 2.744])]
    png = plot_loss(rows, tmp_path / "sft_loss.png", "tiny chat SFT on cpu")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    pre = loss_curves([{"step": 0, "val_loss": 5.0}, {"step": 1, "loss": 5.5}])
    assert [c[0] for c in pre] == ["train loss (nats/token)", "val loss (nats/token)"]


def test_a_loss_curve_of_one_point_is_drawn_and_the_legend_names_only_curves_drawn(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt
    figures, close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig: (figures.append(fig), close(fig)))
    # SFT that logged one train row: its point gets a marker (a line of one point draws nothing)
    plot_loss([{"step": 0, "eval_loss": 3.6}, {"step": 1, "loss": 3.7}, {"step": 1, "eval_loss": 3.5}],
              tmp_path / "sft_loss.png", "tiny chat SFT on cpu")
    ax = figures[-1].axes[0]
    train, fixed = ax.lines
    assert (train.get_label(), list(train.get_xdata()), list(train.get_ydata()), train.get_marker()) == \
        ("train loss (nats/token)", [1], [3.7], "o")
    assert list(fixed.get_xdata()) == [0, 1] and fixed.get_marker() == "o" and fixed.get_linestyle() == "-"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "train loss (nats/token)", "loss on a fixed set of its examples (nats/token)"]
    # no train row, no eval row: nothing drawn, no legend, and the axes say why
    png = plot_loss([{"step": 0, "lr": 1e-3}], tmp_path / "empty.png", "tiny chat SFT on cpu")
    ax = figures[-1].axes[0]
    assert len(ax.lines) == 0 and ax.get_legend() is None and [t.get_text() for t in ax.texts] == ["no points logged"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_mid_training_takes_its_share_from_pretraining_and_bad_shares_are_refused(tmp_path):
    import pytest

    from codechat.config.stages import ConfigError
    cpu = torch.device("cpu")
    p, mid = plan(cpu, "tiny", 10.0), plan(cpu, "tiny", 10.0, mid_share=0.25, mid_data="more.jsonl:2")
    assert mid.stages == ("tokenizer", "data", "pretrain", "mid", *p.stages[3:])
    assert mid.shares["pretrain"] + mid.shares["mid"] == pytest.approx(p.shares["pretrain"])
    assert mid.shares["mid"] == pytest.approx(0.25 * p.shares["pretrain"]) and mid.mid_data == "more.jsonl:2"
    assert {k: v for k, v in mid.shares.items() if k not in ("pretrain", "mid")} == \
        {k: v for k, v in p.shares.items() if k != "pretrain"}
    for kwargs, fragment in (({"mid_share": 1.0}, "--mid-share must be in [0, 1)"),
                             ({"mid_share": -0.1}, "--mid-share must be in [0, 1)"),
                             ({"mid_data": "x.jsonl"}, "--mid-data needs it")):
        with pytest.raises(ConfigError, match=fragment.replace("[", r"\[").replace(")", r"\)")):
            plan(cpu, "tiny", 10.0, **kwargs)
    with pytest.raises(ConfigError, match=r"rl_epochs must be >= 0 \(0: GRPO until its time is up\), got -1"):
        replace(p, rl_epochs=-1)


def test_rl_auto_plans_grpo_only_where_its_pool_can_keep_enough_tasks_and_gives_its_share_to_pretraining():
    from codechat.speedrun.rl_choice import with_rl
    cpu, gpu = torch.device("cpu"), torch.device("cuda")  # planning only: nothing runs on the device
    g = plan(gpu, None, 9.0, mbpp=str(MBPP_FIXTURE))
    on = with_rl(g, "auto", gpu)
    assert on.rl and "rl" in on.stages and on.shares == g.shares and "9 minutes or more" in on.rl_reason
    assert with_rl(plan(gpu, None, 9.0), "auto", gpu).rl  # the tasks mined from the corpus alone are the pool
    short = with_rl(plan(gpu, None, 5.0), "auto", gpu)  # the filter's yield is not measured that short
    assert not short.rl and "rl" not in short.stages and "below a 9-minute GPU budget" in short.rl_reason
    assert with_rl(plan(gpu, None, 5.0), "on", gpu).rl
    assert short.shares["pretrain"] == pytest.approx(plan(gpu, None, 5.0).shares["pretrain"] + GPU_SHARES["rl"])
    assert sum(short.shares.values()) == pytest.approx(1.0) and short.training_s(300) > plan(gpu, None, 5.0).training_s(300)
    assert not with_rl(plan(cpu, "tiny", 12.0), "auto", cpu).rl and with_rl(plan(cpu, "tiny", 12.0), "on", cpu).rl
    forced = with_rl(g, "off", gpu)
    assert not forced.rl and forced.rl_reason == "--rl off" and "mbpp" in forced.stages
    mid = with_rl(plan(gpu, None, 9.0, mid_share=0.2), "off", gpu)  # mid-training keeps its part of the gain
    assert mid.shares["mid"] / (mid.shares["mid"] + mid.shares["pretrain"]) == pytest.approx(0.2)
    with pytest.raises(ConfigError, match="--rl must be one of auto, on, off"):
        with_rl(g, "maybe", gpu)
    assert g.rl_pool == ("doctest",)  # MBPP's train split stays in SFT, out of the pool (rl_pool_mbpp false)
    both = with_plan_overrides(g, {"rl_pool_mbpp": "true"})
    assert both.rl_pool == (f"mbpp:{MBPP_FIXTURE}", "doctest") and both.rl_tasks == g.rl_tasks
    assert "mbpp" in g.stages and both.mbpp == g.mbpp


def test_plan_overrides_set_typed_fields_refuse_the_rest_and_come_back_on_resume(tmp_path):
    cpu = torch.device("cpu")
    p = with_plan_overrides(plan(cpu, "tiny", 2.0), {"rl_prompts_per_step": "4", "rl_evals_share": "0.5",
                                                      "compile": "false", "sft_mine_style": "signature"})
    assert (p.rl_prompts_per_step, p.rl_evals_share, p.compile, p.sft_mine_style) == (4, 0.5, False, "signature")
    assert p.plan_overrides == {"rl_prompts_per_step": "4", "rl_evals_share": "0.5", "compile": "false",
                                "sft_mine_style": "signature"}
    for key, value, fragment in (("mbpp", "x.jsonl", "set it with --mbpp"), ("shares", "{}", "not a setting"),
                                 ("nope", "1", "not a setting"), ("rl_group_size", "4.5", "a number without a fraction"),
                                 ("compile", "maybe", "true or false"), ("rl_evals_share", "-1", "must be >= 0"),
                                 ("checkpoint_every_s", "5", "--checkpoint-every-s")):
        with pytest.raises(ConfigError, match=fragment):
            with_plan_overrides(plan(cpu, "tiny", 2.0), {key: value})
    run = tmp_path / "run"
    run.mkdir()
    Stubbed.calls = []
    m = Stubbed(p, run, cpu, "cpu", 0, resume=False).execute()
    assert m["plan"]["plan_overrides"]["rl_prompts_per_step"] == "4"
    resumed = Stubbed(plan(cpu, "tiny", 2.0), run, cpu, "cpu", 0, resume=True)  # the flags not given again
    assert resumed.p.rl_prompts_per_step == 4 and resumed.p.rl_evals_share == 0.5
    assert resumed.p.plan_overrides == p.plan_overrides


def test_the_held_out_slice_is_scored_on_pretrain_in_base_mode_for_its_mined_tasks_only(tmp_path, monkeypatch):
    """After GRPO the slice's corpus tasks go to ``pretrain/`` in base mode (its MBPP tasks, whose base
    prompt does not open the function, do not), with the slice's own samples a task and GRPO's temperature."""
    from codechat.data.io_tasks import write_corpus_tasks
    from codechat.data.tasks import load_tasks
    from codechat.eval import sandbox
    src = tmp_path / "src"
    src.mkdir()
    (src / "funcs.py").write_text(
        'def clamp(value: int, low=0):\n    """Clamp value from below at low, the smallest it may be."""\n'
        '    return max(value, low)\n\n\n'
        'def initials(name: str):\n    """The first letter of each word of name, upper-cased."""\n'
        '    return "".join(w[0].upper() for w in name.split())\n')
    with sandbox.Sandbox(workers=1) as box:
        write_corpus_tasks([src], tmp_path / "tasks.jsonl", box=box)
    spec = f"tasks:{tmp_path / 'tasks.jsonl'}+mbpp:{MBPP_FIXTURE}"
    pool = load_tasks(f"tasks:{tmp_path / 'tasks.jsonl'}")
    from codechat.train.task_pool import load_pool
    assert len(pool) == 2 and {"MBPP/601", "MBPP/602"} <= {t.task_id for t in load_pool(spec)[0]}
    ids = [t.task_id for t in pool]
    p = plan(torch.device("cpu"), "tiny", 2.0)
    run = tmp_path / "run"
    run.mkdir()
    s = Stubbed(p, run, torch.device("cpu"), "cpu", 0, resume=False)
    s.deadline = __import__("time").monotonic() + 100
    seen = {}
    monkeypatch.setattr(Stubbed, "_score", lambda self, suite, name, tag, **kw: seen.update(suite=suite, **kw) or
                        {"pass@1": 0.25, "problems": len(suite), "solved": {ids[0]: 2}})
    heldout = {"before": {"solved": {i: 1 for i in ids + ["MBPP/601", "MBPP/602"]}, "samples": 4}}
    got = s._heldout_on_pretrain(spec, heldout, 0.9, "[rl]")
    assert got["pass@1"] == 0.25 and [q.task_id for q in seen["suite"]] == [t.problem.task_id for t in pool]
    assert seen["stage"] == "pretrain" and seen["n"] == 4 and seen["temperature"] == 0.9
    assert s._heldout_on_pretrain(spec, None, 0.9, "[rl]") is None


def test_chat_sft_leaves_out_the_mined_pairs_of_the_rl_pools_functions(tmp_path, monkeypatch):
    """The RL pool's corpus tasks ask for functions that chat SFT would otherwise train on (every one of
    them: the pairs are mined from the same corpus); with RL planned those pairs are left out."""
    import shutil

    from codechat.data.io_tasks import write_corpus_tasks
    from codechat.data.mining import write_mined
    from codechat.eval import sandbox
    from codechat.speedrun.rl_choice import with_rl
    src = tmp_path / "src"
    src.mkdir()
    (src / "funcs.py").write_text(
        'def clamp(value: int, low=0):\n    """Clamp value from below at low, the smallest it may be."""\n'
        '    return max(value, low)\n\n\n'
        'def greet(name: str):\n    """Print a greeting for name on the terminal."""\n    print("hi", name)\n')
    cpu = torch.device("cpu")
    p = replace(plan(cpu, "tiny", 2.0), sources=(str(src),))
    run = tmp_path / "run"
    run.mkdir()
    s = Stubbed(p, run, cpu, "cpu", 0, resume=False)
    write_mined([str(src)], s._mined_files(), style="both")
    with sandbox.Sandbox(workers=1) as box:
        write_corpus_tasks([src], s.doctest_file, box=box)
    rows = [json.loads(line) for line in s._mined_files()[0].read_text().splitlines()]
    assert {r["id"].rsplit(":", 1)[1] for r in rows} == {"1", "6"} and len(rows) == 4  # 2 styles x 2 functions
    origins = s._rl_task_origins()
    assert origins == {f"{src / 'funcs.py'}:1"}  # clamp is a task; greet prints (impure): SFT keeps it
    spec, counts = s._sft_data()
    kept = s._mined_files()[0].with_name("0.without_rl_tasks.jsonl")
    assert spec.startswith(f"{kept}#completion:1") and counts == {"held_out_for_rl": 2}
    assert [json.loads(line)["id"] for line in kept.read_text().splitlines()] == [f"{src / 'funcs.py'}:6"] * 2
    shutil.copytree(run, tmp_path / "run2")
    no_rl = Stubbed(with_rl(p, "off", cpu), tmp_path / "run2", cpu, "cpu", 0, resume=False)
    assert no_rl._rl_task_origins() == set() and "without_rl_tasks" not in no_rl._sft_data()[0]
    from concurrent.futures import Future

    from codechat.speedrun import rl_stage
    monkeypatch.setattr(rl_stage, "RL_TASKS_WAIT_S", 0.01)
    s._doctests = Future()  # the pool's mining still running: SFT does not wait for it longer, and says so
    spec, counts = s._sft_data()
    assert counts == {"held_out_for_rl": None} and "without_rl_tasks" not in spec
