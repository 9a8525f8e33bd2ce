"""The RL stage, ``codechat rl``: GRPO with code-execution and function-call rewards.

One step: draw ``prompts_per_step`` tasks (a seeded order, epoch after epoch), sample
``group_size`` completions of each through the engine and judge them
(:mod:`codechat.train.rollouts`), turn rewards into group-relative advantages and take
``num_iterations`` optimizer steps on the clipped surrogate (:mod:`codechat.train.rl`: GRPO,
Shao et al. 2024, "DeepSeekMath" §4; DAPO, Yu et al. 2025). The model, optimizer, checkpoints,
LR schedule and ``metrics.jsonl`` / TensorBoard are the shared trainer's
(:class:`codechat.train.trainer.Trainer`); ``--resume`` continues from the newest checkpoint and
the next steps see the same tasks and seeds as an uninterrupted run (both are functions of the
seed and the step).

Under ``torchrun`` (``--parallel ddp``) each rank samples and judges ``prompts_per_step / world``
of the step's tasks (whole groups), every rank's rewards give the advantages and the metrics, and
each rank trains on its own rollouts (:mod:`codechat.train.grpo_update`): a step equals one
process's with the same ``prompts_per_step``.

Training rows: a rollout's prompt then its sampled ids (the stop id included: the policy learns
to stop), loss on the sampled ids only. Rows of a flat group (advantage exactly 0) carry no
gradient and are not trained on unless ``beta > 0`` (DAPO's dynamic sampling, §3.2: they would
only dilute the token normaliser). The old policy's log-probs are the training forward pass's
own, taken before the first update of the step (the engine's log-probs are compared against
them as ``logprob_mismatch``, a health check of the engine).

**Guards.** Before step 0 a pass@k check samples ``group_size`` completions of
``preflight_tasks`` tasks and gives the pass@k verdict (:func:`codechat.eval.passk.verdict`);
below its floor (pass@1 < 1 %, "stall") the stage refuses to start unless ``force``
(``preflight.json`` keeps the figures). With ``filter_samples`` the pass-rate filter replaces it
(:mod:`codechat.train.task_pool`): every pool task is sampled, those the policy sometimes solves
are trained on, and fewer than ``min_tasks`` of them skip RL (``filter.json``; the pool and what
decontamination left out: ``pool.json``); with ``heldout_tasks`` a slice of the kept tasks is never
trained on and is scored before and after (:mod:`codechat.train.rl_heldout`, ``heldout.json``).
During the run a step is *dead* when every group has zero reward variance, or, for execution
rewards, when no rollout passed a single test; after
``dead_steps`` dead steps in a row the stage saves a checkpoint and stops with a message naming
the fixes.

Metrics of every step (``metrics.jsonl``, TensorBoard, stdout):

=========================  =====================================================================
``reward_mean/std``        mean and population std of the scorable rewards of the step
``frac_reward_zero_std``   share of groups with no signal (all rewards equal): 1.0 is a dead step
``pass_rate``              share of rollouts that pass every test (code) / are the exact call
``tests_passed``           tests passed, summed over the step's rollouts (code; 0 for funcall)
``n_unscorable``           rollouts whose judging failed (advantage 0)
``completion_len``         mean sampled tokens per rollout
``frac_truncated``         share cut at ``max_new_tokens`` (their loss is masked with ``mask_truncated``)
``prompts_truncated``      prompts shortened to leave room for the completion
``loss``                   the surrogate loss of the last update of the step
``clip_frac``              share of trained tokens whose ratio the clip cut (0 when ``num_iterations`` is 1)
``ratio_mean``             mean importance ratio over trained tokens (last update)
``kl``                     mean k3 KL to the reference per trained token (only with ``beta > 0``)
``entropy``                mean entropy (nats) of the policy at trained tokens, before the update
``logprob_mismatch``       mean absolute difference, per trained token, between the engine's
                           log-prob and the training forward's (at the sampling temperature;
                           top-k/top-p renormalise the engine's, so expect a gap with them)
``train_tokens``           tokens of the rows trained on (0: every group was flat, no update)
``grad_norm``, ``lr``      of the last update
``gen_tokens_per_s``       sampled tokens per second of generation
``train_tokens_per_s``     trained row tokens x ``num_iterations`` per second of training
``time_generate_s`` etc.   ``time_generate_s``, ``time_judge_s`` (judging left after the last
                           token), ``time_train_s``: the step's wall time split
``dead_streak``            consecutive dead steps so far
=========================  =====================================================================

Every ``log_rollouts_every`` steps the step's best and a typical (median-reward) rollout are
printed and appended to ``rollouts.jsonl``.
"""
from __future__ import annotations

import copy
import json
import math
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .. import checkpoint as ckpt
from codechat.config.atomic import write_text
from codechat.config.stages import ConfigError, _check, save_yaml, to_dict
from codechat.parallel.world import init_world
from codechat.peft.lora import base_forward
from .grpo_update import GRPOStep
from .init import resolve_init
from .metrics_log import MetricsLog, restart_jsonl
from .rl import group_advantages
from .rl_config import RLConfig, RLStageConfig
from .rl_heldout import score_slice, split_heldout
from .rollouts import Judge, Rollout, collect, stream_passes
from .stop import active
from .task_pool import TooFewTasks, filter_pool, load_pool, too_few_message
from .trainer import Trainer

DEAD_FIXES = ("use --reward tiered (partial credit for getting further), a larger --group-size, tasks the "
              "policy sometimes solves (`codechat eval filter` -> --tasks tasks:FILE), or more SFT before RL")


class TaskSchedule:
    """The tasks and seeds of every step: a pure function of ``(seed, step)``, so a resumed run
    draws what an uninterrupted one would. Its state (saved in checkpoints) is the number of
    batches drawn and the current dead streak."""

    def __init__(self, tasks: list, per_step: int, seed: int) -> None:
        self.tasks, self.per_step, self.seed = tasks, per_step, seed
        self.batches, self.dead_streak = 0, 0
        self._perm: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._perm:
            self._perm = {epoch: random.Random(f"{self.seed}:tasks:{epoch}").sample(range(len(self.tasks)),
                                                                                  len(self.tasks))}
        return self._perm[epoch]

    def next_batch(self) -> tuple[list, list[int]]:
        """``(tasks, seeds)`` of the next step."""
        from codechat.eval.suites import derive_seed
        n, b = len(self.tasks), self.batches
        picked = [self.tasks[self._order(p // n)[p % n]] for p in range(b * self.per_step, (b + 1) * self.per_step)]
        self.batches += 1
        return picked, [derive_seed(self.seed, f"rl:{b}:{j}:{t.task_id}") for j, t in enumerate(picked)]

    def state_dict(self) -> dict[str, int]:
        return {"batches": self.batches, "dead_streak": self.dead_streak}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.batches, self.dead_streak = int(state["batches"]), int(state["dead_streak"])


def preflight(engine: Any, tok: Any, tasks: list, judge: Judge, cfg: RLConfig, sampling: Any, seed: int) -> dict:
    """The pass@k check before step 0 (module docstring): figures, the verdict band and its advice."""
    from codechat.eval.passk import mean_pass_at_k, verdict, verdict_band
    from codechat.eval.suites import derive_seed
    n = min(cfg.preflight_tasks, len(tasks))
    sample = [tasks[i] for i in random.Random(f"{seed}:preflight").sample(range(len(tasks)), n)]
    batch = collect(engine, tok, sample, [derive_seed(seed, f"preflight:{t.task_id}") for t in sample], judge,
                    group_size=cfg.group_size, sampling=sampling)
    g = cfg.group_size
    counts = [(g, c) for c in batch.passes_per_task(g)]
    p1 = mean_pass_at_k(counts, 1)
    scored = [r.reward for r in batch.rollouts if r.reward is not None]
    return {"tasks": n, "group_size": g, "pass@1": p1, f"pass@{g}": mean_pass_at_k(counts, g),
            "reward_mean": sum(scored) / len(scored) if scored else math.nan, "band": verdict_band(p1),
            "verdict": verdict(p1), "seconds": batch.generate_s + batch.judge_s}


def pass_rate_filter(engine: Any, tok: Any, tasks: list, judge: Judge, cfg: RLConfig, sampling: Any, seed: int,
                     out: Path, main: bool, resumed: bool, echo: Any) -> tuple[list, dict[str, int]]:
    """The tasks GRPO trains on: those of ``tasks`` the policy sometimes solves
    (:mod:`codechat.train.task_pool`; figures in ``filter.json``, read back on a resume), and how many of
    each kept task's ``cfg.filter_samples`` samples passed (by task id).

    Raises:
        TooFewTasks: fewer than ``cfg.min_tasks`` were kept.
    """
    path = out / "filter.json"
    if resumed and path.exists():
        saved = json.loads(path.read_text())
        kept = set(saved["kept_ids"])
        return [t for t in tasks if t.task_id in kept], {k: saved["counts"][k][1] for k in kept}
    g = cfg.filter_samples

    def sample(feed: Iterator[tuple[Any, int]]) -> Iterator[tuple[Any, int]]:
        return stream_passes(engine, tok, feed, judge, group_size=g, sampling=sampling)
    res = filter_pool(tasks, sample, n=g, min_rate=cfg.filter_min, max_rate=cfg.filter_max, seed=seed,
                      deadline_s=cfg.filter_deadline_s, need=cfg.min_tasks, enough=cfg.filter_enough,
                      order=cfg.filter_order)
    figures = res.as_dict(cfg.filter_min, cfg.filter_max)
    if main:
        write_text(path, json.dumps(figures, indent=1))
    echo(f"pass-rate filter: {res.sampled} of {res.pool} pool tasks x {g} samples in {res.seconds:.0f} s (the first "
         f"verdict after {res.first_s:.1f} s), pool "
         f"pass@1 {figures['pass@1']:.2%}; kept {len(res.kept)} (rate in [{cfg.filter_min:g}, {cfg.filter_max:g}], "
         f"neither 0 nor 1)")
    if len(res.kept) < cfg.min_tasks:
        raise TooFewTasks(too_few_message(res, cfg.min_tasks, cfg.filter_min, cfg.filter_max))
    kept = set(res.kept)
    return [t for t in tasks if t.task_id in kept], {k: res.counts[k][1] for k in kept}


def _step_metrics(rs: list[Rollout], stats: Any, prompts_truncated: int) -> dict[str, float]:
    """The step's rollout metrics (module docstring) over every rank's rollouts ``rs``."""
    return {"reward_mean": stats.reward_mean, "reward_std": stats.reward_std,
            "frac_reward_zero_std": stats.frac_reward_zero_std, "pass_rate": sum(r.passed for r in rs) / len(rs),
            "tests_passed": sum(r.tests_passed for r in rs), "n_unscorable": stats.n_unscorable,
            "completion_len": sum(len(r.completion_ids) for r in rs) / len(rs),
            "frac_truncated": sum(r.finish == "length" for r in rs) / len(rs),
            "prompts_truncated": prompts_truncated}


def _log_rollouts(out: Path, step: int, rollouts: list[Rollout], echo: Any) -> None:
    ranked = sorted(rollouts, key=lambda r: -math.inf if r.reward is None else r.reward)
    picks = {"best": ranked[-1], "typical": ranked[len(ranked) // 2]}
    with (out / "rollouts.jsonl").open("a") as f:
        for name, r in picks.items():
            f.write(json.dumps({"step": step, "kind": name, "task_id": r.task_id, "reward": r.reward,
                                "finish": r.finish, "detail": r.detail, "text": r.text}) + "\n")
            echo(f"--- step {step} {name} rollout ({r.task_id}, reward {r.reward}, {r.detail or r.finish}):\n"
                 f"{r.text[:600]}")


def run_rl(cfg: RLStageConfig, *, show_progress: bool = True, deadline: float | None = None) -> dict[str, Any]:
    """Run GRPO from ``cfg.init`` on ``cfg.rl.tasks``; returns the last metrics, ``stopped``
    (``max_steps``: ``train.max_steps``, or ``train.epochs`` passes over the ``train_tasks`` GRPO trained on;
    ``budget``: ``train.time_budget_s`` or ``deadline``; or ``dead``), when dead ``message``, ``setup_s``
    (seconds before step 0: loading the ``policy``, the ``pool`` (its references run when
    ``rl.check_references``), the ``trainer``, the ``engine``, and with the filter the ``filter`` and the
    held-out slice's scoring, ``heldout_before``) and with a held-out slice ``heldout``. ``deadline``: the
    trainer's wall-clock stop (:class:`~codechat.train.trainer.Trainer`), None for none.

    Raises:
        ConfigError: a missing --init, a torchrun world with a layout other than ``ddp`` or a
            ``prompts_per_step`` it does not divide, or the pre-RL verdict says the run will stall
            (without ``force``); :class:`~codechat.train.task_pool.TooFewTasks` when the pass-rate
            filter (``rl.filter_samples``) keeps fewer than ``rl.min_tasks`` tasks.
        ValueError: bad tasks (no tests, failing references, a file or line named), a reward that
            does not fit the task kind.
        TrainingDiverged: a non-finite loss or gradient (no update applied; resume from the last checkpoint).
    """
    from codechat.engine import Engine, EngineConfig, SamplingConfig
    cfg.check_init()
    rl, out = cfg.rl, Path(cfg.run.out)
    world = init_world(cfg.run.device)
    _check(world.size == 1 or cfg.train.parallel == "ddp",
           f"codechat rl under torchrun needs --parallel ddp (got {cfg.train.parallel}): each rank samples from "
           "whole weights")
    _check(rl.prompts_per_step % world.size == 0,
           f"rl.prompts_per_step={rl.prompts_per_step} does not divide over {world.size} ranks (whole groups per rank)")
    device = world.device
    setup_s: dict[str, float] = {}  # seconds before step 0, by part (the result's setup_s)
    since = time.perf_counter()

    def took(part: str) -> None:
        nonlocal since
        now = time.perf_counter()
        setup_s[part], since = now - since, now
    init_dir = resolve_init(cfg.init, out, world)
    model, tok, state = ckpt.load_model(init_dir, device)
    took("policy")
    tasks, pool = load_pool(rl.tasks, mbpp_file=rl.mbpp_file, decontaminate=rl.decontaminate,
                            **({"split": rl.split} if rl.split else {}), limit=rl.limit or None,
                            check_references=rl.check_references, workers=rl.judge_workers, timeout_s=rl.judge_timeout_s)
    reward = rl.reward if rl.reward != "auto" else "funcall_tiered" if tasks[0].kind == "funcall" else "tiered"
    judge = Judge(reward, workers=rl.judge_workers, timeout_s=rl.judge_timeout_s, memory_mb=rl.judge_memory_mb)
    judge.check(tasks)
    took("pool")
    out.mkdir(parents=True, exist_ok=True)
    if world.main:
        save_yaml(cfg, out / "config.yaml")
        write_text(out / "pool.json", json.dumps(pool, indent=1))
    schedule = TaskSchedule(tasks, rl.prompts_per_step, cfg.run.seed)
    trainer = Trainer(model.train(), train=cfg.train, optim=cfg.optim, run=cfg.run, batches=schedule, out_dir=out,
                      meta={"stage": "rl", "model": state["meta"]["model"], "config": to_dict(cfg),
                            "init": str(init_dir)}, tokenizer_dir=init_dir / "tokenizer",
                      show_progress=show_progress and world.main, world=world, deadline=deadline,
                      lora=cfg.lora if cfg.peft == "lora" else None)
    resumed = cfg.run.resume and trainer.resume()
    took("trainer")
    per_rank = rl.prompts_per_step // world.size
    engine = Engine(model, EngineConfig(slots=rl.engine_slots or per_rank * rl.group_size))
    took("engine")
    sampling = SamplingConfig(rl.max_new_tokens, temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k)
    echo = print if world.main else (lambda *a, **k: None)
    heldout: list = []
    try:
        if rl.filter_samples:
            model.eval()
            kept, passed = pass_rate_filter(engine, tok, tasks, judge, rl, sampling, cfg.run.seed, out, world.main,
                                            resumed, echo)
            took("filter")
            schedule.tasks, heldout = split_heldout(kept, rl.heldout_tasks, rl.min_tasks, cfg.run.seed)
            before = _heldout_before(engine, tok, heldout, passed, judge, rl, sampling, cfg.run.seed, out, world.main,
                                     resumed, echo)
            took("heldout_before")
        elif not (resumed and (out / "preflight.json").exists()):
            model.eval()
            pre = preflight(engine, tok, tasks, judge, rl, sampling, cfg.run.seed)  # every rank: the same figures
            if world.main:
                write_text(out / "preflight.json", json.dumps({**pre, "forced": rl.force}, indent=1))
            echo(f"pre-RL check on {pre['tasks']} tasks x {pre['group_size']} samples: pass@1 {pre['pass@1']:.2%}, "
                 f"pass@{rl.group_size} {pre[f'pass@{rl.group_size}']:.2%}, mean reward {pre['reward_mean']:.3f}\n"
                 f"verdict: {pre['verdict']}")
            if pre["band"] == "stall":
                if not rl.force:
                    raise ConfigError(f"refusing to start RL: {pre['verdict']} (figures in {out / 'preflight.json'}); "
                                      "fix that, or pass --force to run anyway (the run stops itself after "
                                      f"--dead-steps {rl.dead_steps} dead steps)")
                echo("--force: starting anyway")
        # --epochs: the step limit from the tasks GRPO trains on, known only now (after the filter and the split)
        given, trainer.tcfg = trainer.tcfg, trainer.tcfg.with_epochs(len(schedule.tasks) / rl.prompts_per_step)
        if trainer.tcfg is not given:
            echo(f"{cfg.train.epochs:g} passes over {len(schedule.tasks)} tasks: at most {trainer.tcfg.max_steps} steps")
        # the KL reference: the initial policy; under LoRA the base with the adapters off (no second copy)
        ref = None if rl.beta == 0 else base_forward(model) if cfg.peft == "lora" else \
            copy.deepcopy(model).eval().requires_grad_(False)
        update = GRPOStep(trainer, rl, tok.end_id, ref)
        log = MetricsLog(out, trainer.step if resumed else None) if world.main else None
        if world.main:
            restart_jsonl(out / "rollouts.jsonl", trainer.step if resumed else None)
        echo("before step 0: " + ", ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in setup_s.items()))
        with active().polled():
            result = _loop(trainer, schedule, engine, tok, judge, update, log, rl, sampling, out, echo)
        result["setup_s"], result["train_tasks"] = setup_s, len(schedule.tasks)
        if heldout:  # the slice again, with the trained policy and the same seeds
            engine.load_weights(model)
            model.eval()
            after = score_slice(engine, tok, heldout, judge, rl.slice_samples, sampling, cfg.run.seed)
            result["heldout"] = {"before": before, "after": after}
            if world.main:
                write_text(out / "heldout.json", json.dumps(result["heldout"], indent=1))
            echo(f"held-out slice ({len(heldout)} kept tasks never trained on): pass@1 {before['pass@1']:.2%} before "
                 f"RL, {after['pass@1']:.2%} after")
    finally:
        judge.close()
    return result


def _heldout_before(engine: Any, tok: Any, heldout: list, passed: dict[str, int], judge: Judge, rl: RLConfig,
                    sampling: Any, seed: int, out: Path, main: bool, resumed: bool, echo: Any) -> dict[str, Any] | None:
    """The held-out slice's figures with the initial policy (:mod:`.rl_heldout`; ``heldout.json``, read
    back on a resume), with ``filter_solved``, each task's samples passed at the filter (``passed``: an
    independent reading of the same policy, other seeds); None without a slice."""
    path = out / "heldout.json"
    if not heldout:
        return None
    if resumed and path.exists():
        return json.loads(path.read_text())["before"]
    before = score_slice(engine, tok, heldout, judge, rl.slice_samples, sampling, seed)
    before["filter_solved"] = {t.task_id: passed[t.task_id] for t in heldout}
    before["filter_samples"] = rl.filter_samples
    if main:
        write_text(path, json.dumps({"before": before}, indent=1))
    echo(f"held-out slice: {len(heldout)} kept tasks set aside, pass@1 {before['pass@1']:.2%} before RL")
    return before


def _loop(trainer: Trainer, schedule: TaskSchedule, engine: Any, tok: Any, judge: Judge, update: GRPOStep,
          log: MetricsLog | None, rl: RLConfig, sampling: Any, out: Path, echo: Any) -> dict[str, Any]:
    """The steps. Each rank samples and judges its share of the step's tasks (whole groups); the
    rewards of all ranks give the advantages (the same on every rank: one process's) and the
    metrics, and each rank trains on its own rollouts."""
    from dataclasses import replace as copy_with
    model, saved_at = trainer.model, trainer.elapsed_s
    world, par = trainer.world, trainer.par
    per = rl.prompts_per_step // world.size
    mine = slice(world.rank * per * rl.group_size, (world.rank + 1) * per * rl.group_size)
    stopped, message = "budget", None
    loader_state = schedule.state_dict()
    try:
        while not trainer.done():
            trainer.stop_if_due(loader_state, echo)
            t0 = time.perf_counter()
            loader_state = schedule.state_dict()  # before this step: a Ctrl-C save redoes it
            tasks, seeds = schedule.next_batch()
            engine.load_weights(model)
            model.eval()
            batch = collect(engine, tok, tasks[world.rank * per:(world.rank + 1) * per],
                            seeds[world.rank * per:(world.rank + 1) * per], judge, group_size=rl.group_size,
                            sampling=sampling)
            every = [r for part in par.all_gather([copy_with(r, prompt_ids=[], engine_logprobs=[])
                                                   for r in batch.rollouts]) for r in part]  # task-major, all ranks
            rewards = [r.reward for r in every]
            if rl.shuffle_rewards:
                random.Random(f"{trainer.rcfg.seed}:shuffle:{trainer.step}").shuffle(rewards)
            adv, stats = group_advantages(rewards, [r.task_id for r in every], scale=rl.advantage_scale)
            model.train()
            t1 = time.perf_counter()
            upd = update(batch, adv[mine])
            if trainer.device.type == "cuda":
                torch.cuda.synchronize()
            t2 = time.perf_counter()
            row = _step_metrics(every, stats, int(par.all_sum(batch.prompts_truncated)))
            dead = stats.frac_reward_zero_std == 1.0 or (judge.kind == "code" and row["tests_passed"] == 0)
            schedule.dead_streak = schedule.dead_streak + 1 if dead else 0
            trainer.step += 1
            trainer.elapsed_s += par.all_max(t2 - t0)
            loader_state = schedule.state_dict()
            row = {"step": trainer.step, **row, **upd, "dead_streak": schedule.dead_streak,
                   "gen_tokens_per_s": par.all_sum(batch.completion_tokens) / max(par.all_max(batch.generate_s), 1e-9),
                   "train_tokens_per_s": upd["train_tokens"] * rl.num_iterations / max(t2 - t1, 1e-9),
                   "time_generate_s": batch.generate_s, "time_judge_s": batch.judge_s, "time_train_s": t2 - t1,
                   "elapsed_s": trainer.elapsed_s}
            is_dead = schedule.dead_streak >= rl.dead_steps
            if trainer.step % trainer.tcfg.log_every == 0 or is_dead or trainer.done():
                trainer.record(log, echo, row)
            if rl.log_rollouts_every and trainer.step % rl.log_rollouts_every == 0 and world.main:
                _log_rollouts(out, trainer.step, every, echo)
            tc = trainer.tcfg
            if (is_dead or trainer.done() or trainer.step % tc.save_every == 0
                    or (tc.save_every_s and trainer.elapsed_s - saved_at >= tc.save_every_s)):
                path = trainer.save(loader_state)
                saved_at = trainer.elapsed_s
            if is_dead:
                why = ("every group had the same reward (no advantage, no gradient)" if stats.frac_reward_zero_std == 1.0
                       else "no rollout passed a single test")
                stopped = "dead"
                message = (f"the RL run is dead: {rl.dead_steps} steps in a row without signal (last: {why}); "
                           f"stopped at step {trainer.step}, checkpoint {path}. Fixes: {DEAD_FIXES}")
                echo(message)
                break
    except KeyboardInterrupt:
        echo(f"interrupted at step {trainer.step}: saving a checkpoint, resume with --resume")
        trainer.save(loader_state)
        raise
    finally:
        if log is not None:
            log.close()
    if stopped == "budget" and trainer.tcfg.max_steps and trainer.step >= trainer.tcfg.max_steps:
        stopped = "max_steps"
    return {"step": trainer.step, "elapsed_s": trainer.elapsed_s, "stopped": stopped, "message": message,
            **trainer.last}


__all__ = ["RLConfig", "RLStageConfig", "TaskSchedule", "GRPOStep", "preflight", "run_rl", "DEAD_FIXES"]
