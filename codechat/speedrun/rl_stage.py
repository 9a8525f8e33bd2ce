"""The speedrun's RL stage: GRPO on the tasks of its pool that the SFT model sometimes solves.

The pool (:mod:`codechat.train.task_pool`) is the plan's ``rl_tasks``: doctest tasks (on a GPU mined
from every corpus source in a background process while pretraining runs, with up to ``rl_io_tasks``
input/output tasks of pure corpus functions, :mod:`codechat.data.io_tasks`; else from this Python's
standard library), ``--tasks``, and MBPP's train split with ``--mbpp`` and ``rl_pool_mbpp`` (off by
default). The pass-rate filter samples each pool task with ``sft/`` and GRPO trains on the kept ones when
at least ``rl_min_tasks`` remain; otherwise the stage is skipped with the counts. HumanEval (and MBPP) are
scored again on ``rl/``, so the report sets them beside the figures on ``sft/``. :class:`RLStage` is a part of
:class:`codechat.speedrun.run.Speedrun`, whose loop calls its ``_rl(grant, tag)``.
"""
from __future__ import annotations

import json
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from codechat.config.stages import ConfigError, RunConfig, TrainConfig
from codechat.speedrun.plan import SpeedrunPlan
from codechat.speedrun.report import plot_rewards, read_metrics
from codechat.train.task_pool import POOL_SEPARATOR


#: Seconds chat SFT waits for the RL pool's background mining, to leave its functions out of the SFT pairs.
RL_TASKS_WAIT_S = 15.0
#: The share of the time kept after GRPO that HumanEval and MBPP on ``rl/`` need: before them the held-out
#: slice is scored again with the trained policy (96 tasks x 8 samples took ~4-5 s on an H100; x 16, the plan's
#: ``rl_heldout_samples`` since 75b8303, twice that, unmeasured) and on ``pretrain/`` (within a tenth of the time left).
AFTER_RL_EVAL_SHARE = 0.85


class RLStage:
    """The RL stage of :class:`~codechat.speedrun.run.Speedrun`, which provides ``p`` (the plan), ``run``
    (the run directory), ``m`` (the run's metrics so far: the stages' seconds and figures), ``seed``,
    ``device_arg``, ``resume``, ``deadline`` (the running stage's wall-clock end, ``time.monotonic()``) and
    ``time_left()``, ``_doctests`` (the background doctest miner's future, or None) and ``_score()``."""

    p: SpeedrunPlan
    run: Path
    deadline: float
    m: dict[str, Any]
    _doctests: Future | None

    @property
    def doctest_file(self) -> Path:
        """The doctest and input/output tasks mined from every corpus source in the background (``tasks:`` rows)."""
        return self.run / "rl_doctests.jsonl"

    def _rl_task_origins(self) -> set[str] | None:
        """``FILE:LINE`` of the corpus functions the RL pool's mined tasks ask for (:attr:`doctest_file`, the
        background job waited for up to :data:`RL_TASKS_WAIT_S`), which chat SFT leaves out; empty without
        RL or without that file (the pool then mines the standard library at the RL stage, on a CPU, and
        nothing is left out); None when the job was still running after the wait."""
        if not self.p.rl:
            return set()
        if self._doctests is not None:
            try:
                self._doctests.result(timeout=RL_TASKS_WAIT_S)
            except FutureTimeout:
                return None
            except Exception as e:  # the RL stage mines the standard library instead
                print(f"chat SFT: the RL pool's background mining failed ({type(e).__name__}: {e}): no pairs are "
                      "left out for it")
                return set()
        f = self.doctest_file
        if not f.is_file():
            return set()
        rows = (json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip())
        origins = {r["origin"] for r in rows if r.get("origin")}
        if not origins:
            print(f"chat SFT: the RL pool's background mining kept no corpus task ({f}): no pairs are left out for it")
        return origins

    def _rl_pool_spec(self) -> str:
        """The RL pool's spec: the plan's (:attr:`~codechat.speedrun.plan.SpeedrunPlan.rl_pool`), its
        ``doctest`` part (this Python's standard library) replaced by the tasks mined from every corpus source in
        the background when that job wrote any."""
        job, self._doctests = self._doctests, None
        if job is not None:
            try:
                counts = job.result()
                d, io = counts["doctest"], counts["io"]
                print(f"RL pool: {d['kept']} doctest and {io['kept']} input/output tasks mined from "
                      f"{len(self.p.sources)} corpus source(s) in the background ({d['functions']} functions with "
                      f"doctests; {io['candidates']} pure candidates of {io['functions']} functions)")
            except Exception as e:  # the pool falls back to mining the standard library here
                print(f"RL pool: the background doctest mining failed ({type(e).__name__}: {e}); mining the "
                      "standard library instead")
        f = self.doctest_file
        if not (f.is_file() and f.stat().st_size):
            return POOL_SEPARATOR.join(self.p.rl_pool)
        return POOL_SEPARATOR.join(f"tasks:{f}" if s == "doctest" else s for s in self.p.rl_pool)

    def _rl(self, grant: float, tag: str) -> dict[str, Any]:
        """GRPO from ``sft/`` on the pool's tasks that ``sft/`` sometimes solves (the pass-rate filter,
        :mod:`codechat.train.task_pool`), then HumanEval and, with ``--mbpp``, MBPP again on ``rl/``.
        Skipped, with the filter's counts, when fewer than ``rl_min_tasks`` tasks are kept."""
        from codechat.train.grpo import RLConfig, RLStageConfig, run_rl
        p, t0, out_dir, tasks = self.p, time.monotonic(), self.run / "rl", self._rl_pool_spec()
        # GRPO stops in time for the evaluations on rl/; its own budget is the most it could get
        evals_s, evals_why = self._evals_after_rl_s(grant)
        left = self.time_left()
        train_s = max(1.0, left - evals_s)
        # the filter's deadline (0 would mean none): its share of the time before that reserve, never all of it
        # (what it keeps needs GRPO's steps), and at least its first task
        filter_s = max(1.0, p.rl_filter_share * (left - evals_s))
        print(f"{tag} RL pool {tasks}: pass-rate filter ({p.rl_filter_samples} samples a task, at most "
              f"{filter_s:.0f} s, stopping at {p.rl_filter_enough or 'all'} kept), then GRPO when >= {p.rl_min_tasks} "
              f"tasks remain (tiered reward, groups of {p.rl_group_size}"
              + (f", at most {p.rl_epochs:g} passes over them" if p.rl_epochs else "")
              + f") until {evals_s:.0f} s before the stage's end ({left:.0f} s from now), kept for "
              f"{evals_why}")
        cfg = RLStageConfig(
            init=str(self.run / "sft"),
            rl=RLConfig(tasks=tasks, mbpp_file=p.mbpp, reward="tiered", group_size=p.rl_group_size,
                        prompts_per_step=p.rl_prompts_per_step, max_new_tokens=p.rl_tokens,
                        judge_workers=p.judge_workers,
                        filter_samples=p.rl_filter_samples, filter_min=p.rl_filter_min, filter_max=p.rl_filter_max,
                        min_tasks=p.rl_min_tasks, filter_deadline_s=filter_s, filter_enough=p.rl_filter_enough,
                        engine_slots=p.rl_engine_slots, heldout_tasks=p.rl_heldout_tasks,
                        heldout_samples=p.rl_heldout_samples, check_references=False),
            train=TrainConfig(max_steps=0, epochs=p.rl_epochs, time_budget_s=train_s,
                              micro_batch_size=p.rl_micro_batch_size, log_every=1, eval_every=10**9, save_every=10**9,
                              save_every_s=p.checkpoint_every_s),
            run=RunConfig(out=str(out_dir), seed=self.seed, device=self.device_arg, resume=self.resume))
        try:
            out = run_rl(cfg, show_progress=False, deadline=self.deadline - evals_s)
        except ConfigError as e:  # too few tasks kept, or a pool that does not load
            print(f"{tag} RL skipped: {e}")
            return {"skipped": True, "reason": str(e), **self._rl_pool(out_dir)}
        rows = read_metrics(out_dir / "metrics.jsonl")
        trained_s = time.monotonic() - t0
        curve = [{k: r[k] for k in ("step", "reward_mean", "pass_rate", "frac_reward_zero_std")} for r in rows]
        if curve:
            plot_rewards(curve, self.run / "rl_reward.png", f"{p.preset} GRPO on {len(curve)} steps")
        # the held-out slice on pretrain/ first (a tenth of the time left at most), then HumanEval and MBPP
        memorised = self._heldout_on_pretrain(tasks, out.get("heldout"), cfg.rl.temperature, tag)
        # the time left is shared by the evaluations after RL: HumanEval stops at its half when MBPP follows
        half = time.monotonic() + self.time_left() / 2
        after = {"heldout_pretrain": memorised, "humaneval": self._score("humaneval", "HumanEval", tag, n=p.eval_n, max_new_tokens=p.eval_tokens,
                                          limit=p.eval_limit or None, stage="rl",
                                          deadline=half if p.mbpp else self.deadline)}
        if p.mbpp:
            after["mbpp"] = self._score(f"mbpp:{p.mbpp}", "MBPP", tag, n=p.mbpp_n, max_new_tokens=p.mbpp_tokens,
                                        limit=p.eval_limit or None, stage="rl")
        for key in ("humaneval", "mbpp"):
            if after.get(key) and (same := self._before_on_the_same_problems(key, after[key])):
                after[key]["before_same_problems"] = same
        r, o = cfg.rl, cfg.optim
        settings = {"group_size": r.group_size, "tasks_per_step": r.prompts_per_step, "lr": o.lr, "optimizer": o.name,
                    "kl_beta": r.beta, "reward": r.reward, "temperature": r.temperature,
                    "max_new_tokens": r.max_new_tokens, "clip_eps": [r.clip_eps, r.clip_eps_high],
                    "loss_norm": r.loss_norm, "advantage_scale": r.advantage_scale}
        return {"skipped": False, "tasks": tasks, "settings": settings, "steps": out["step"], "stopped": out["stopped"],
                "epochs": p.rl_epochs, "train_tasks": out.get("train_tasks"),
                "message": out["message"], "train_budget_s": train_s, "filter_budget_s": filter_s,
                "evals_reserved_s": evals_s, "setup_s": out.get("setup_s"),
                "train_wall_s": trained_s, **self._rl_pool(out_dir),
                "curve": curve,
                "reward_first": rows[0]["reward_mean"] if rows else None,
                "reward_last": rows[-1]["reward_mean"] if rows else None,
                "pass_rate_last": rows[-1]["pass_rate"] if rows else None, "heldout": out.get("heldout"), **after}

    def _evals_after_rl_s(self, grant: float) -> tuple[float, str]:
        """Seconds kept after GRPO for the evaluations on ``rl/``, and what they are: the seconds HumanEval
        (and MBPP) took on ``sft/`` in this run (the same suites, samples and model; scaled up where a
        deadline cut one short) over :data:`AFTER_RL_EVAL_SHARE`; ``rl_evals_share`` of the grant when a
        figure is missing (a stage skipped or failed)."""
        names = ("eval", "mbpp") if self.p.mbpp else ("eval",)
        walls = []
        for name in names:
            st, res = self.m["stages"].get(name, {}), self.m.get(name) or {}
            res = res.get("humaneval", res)
            if st.get("status") != "done" or not res.get("problems"):
                s = self.p.rl_evals_share * grant
                return s, f"the evaluations on rl/ ({self.p.rl_evals_share:g} of the grant: no {name} figure on sft/)"
            walls.append(st["wall_s"] * max(1.0, res["problems_planned"] / res["problems"]))
        s = sum(walls) / AFTER_RL_EVAL_SHARE
        return s, (f"the held-out slice and {' and '.join(('HumanEval', 'MBPP')[:len(names)])} on rl/ ("
                   f"{' + '.join(f'{w:.0f}' for w in walls)} s on sft/, over {AFTER_RL_EVAL_SHARE:g})")

    def _before_on_the_same_problems(self, suite: str, after: dict[str, Any]) -> dict[str, Any] | None:
        """``sft/``'s figures on ``suite`` (``humaneval`` or ``mbpp``) over the problems ``rl/`` was scored on
        (:func:`~codechat.eval.passk.pass_figures` of ``eval/<suite>/results.json`` restricted to
        ``eval/<suite>-rl/``'s problems), when a deadline scored fewer on ``rl/``: a before/after pair over the
        same problems. None when both scored the same problems or a results file is missing."""
        from codechat.eval.passk import pass_figures
        d = self.run / "eval"
        try:
            before = json.loads((d / suite / "results.json").read_text())["per_task"]
            done = json.loads((d / f"{suite}-rl" / "results.json").read_text())["per_task"]
        except (OSError, KeyError, ValueError):
            return None
        if set(done) == set(before) or not done or not set(done) <= set(before):
            return None
        ks = [int(k.split("@")[1]) for k in after["pass@k"]]
        return {"problems": len(done), **pass_figures({t: before[t] for t in done}, ks)}

    def _heldout_on_pretrain(self, spec: str, heldout: dict[str, Any] | None, temperature: float,
                             tag: str) -> dict[str, Any] | None:
        """pass@1 of ``pretrain/`` in base mode on the held-out slice's tasks that open their function
        (mined from the corpus: signature and docstring continued, :data:`~codechat.eval.suites.FUNCTION_PROMPT_SUITES`),
        with as many samples a task as the slice's own scoring, at GRPO's ``temperature``: how much of the
        pool the base model solves already (tasks of the pretraining corpus may be memorised). None without
        a slice or such tasks."""
        from codechat.eval.suites import FUNCTION_PROMPT_SUITES
        from codechat.train.task_pool import load_pool
        if not heldout:
            return None
        ids = set(heldout["before"]["solved"])
        pool, _ = load_pool(spec, mbpp_file=self.p.mbpp)
        problems = [t.problem for t in pool if t.task_id in ids and t.problem is not None
                    and t.problem.suite in FUNCTION_PROMPT_SUITES]
        if not problems:
            return None
        return self._score(problems, "RL-heldout", tag, n=heldout["before"]["samples"], max_new_tokens=self.p.rl_tokens,
                           limit=None, stage="pretrain", temperature=temperature,
                           deadline=time.monotonic() + self.time_left() / 10)

    @staticmethod
    def _rl_pool(out_dir: Path) -> dict[str, Any]:
        """The pool (``pool.json``) and the filter's figures (``filter.json``, its per-task counts left
        out) of an RL stage directory, as far as they were written."""
        got = {}
        for key, name in (("pool", "pool.json"), ("filter", "filter.json")):
            if (out_dir / name).is_file():
                d = json.loads((out_dir / name).read_text())
                got[key] = {k: v for k, v in d.items() if k != "counts"}
        return got
