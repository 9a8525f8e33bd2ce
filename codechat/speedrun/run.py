"""The speedrun: tokenizer -> corpus -> baselines -> pretraining [-> mid-training] -> samples -> SFT -> chat ->
HumanEval [-> MBPP] -> RL [-> function-calling SFT -> its evaluation].

RL (GRPO, :mod:`codechat.train.grpo`) trains on the tasks of its pool (doctests mined from the
standard library; with ``--mbpp`` MBPP's train split; ``--tasks``) that the SFT model sometimes
solves: a pass-rate filter samples each pool task first (:mod:`codechat.train.task_pool`), and
when fewer than ``rl_min_tasks`` are kept the stage is skipped and the report says how many were.
HumanEval and MBPP's test split (``--mbpp``) are scored on ``sft/`` before RL and, when GRPO ran,
again on ``rl/``: the effect of RL is a measured difference.

Data: the pretraining corpus leaves out every file that overlaps a HumanEval problem (or, with
``--mbpp``, an MBPP test problem) by :class:`codechat.data.decontam.Decontaminator`'s rule, and
the report lists them; chat SFT trains on functions mined from the corpus (the standard library,
and on a GPU the installed packages at a lower weight; asked for both ways,
:data:`codechat.config.sft.MINE_STYLES`), MBPP's train split with ``--mbpp`` and the sources of
``--data``, decontaminated by the same rule. On a GPU the CPU work that can wait (the compression
baselines, the mining) runs in background processes while pretraining trains. ``--mid-share F``
moves a share F of pretraining's time to a mid-training stage on the same chat-layout mixture plus
the function-calling conversations and ``--mid-data`` (:mod:`codechat.speedrun.tuning`).

Writes ``metrics.json`` and ``report.md`` into the run directory after every stage, so a run that
fails or is killed keeps what finished: the report shows the finished stages, the failing one
and its error, and the command exits non-zero. ``--resume`` continues from the first unfinished
stage (a half-done training stage from its newest checkpoint; a half-done evaluation from its
``samples.jsonl``) without redoing the finished ones.

``--time-budget-min`` is the whole run's wall clock. :func:`~codechat.speedrun.plan.plan` gives every stage a share of
it up front (printed, and in the report as planned vs actual); when a stage starts it is granted
the time left times its share of the stages still to run, so a stage that ran long shrinks the
ones after it. Training stages train for their grant less what the stage spends around its
steps (loading, evaluation); the evaluation stops sampling new problems at its grant. A training
stage whose compile would eat too much of its grant (``compile_max_share``) runs eager. A stage still
running :data:`OVERRUN_STACKS_S` after its time ran out writes every thread's stack to stderr, once.

On a CPU it trains the ``tiny`` preset (12 minutes in all by default, within 15 on 2 cores);
on a GPU a preset sized to the budget, on the standard library plus the installed packages.
"""
from __future__ import annotations

import faulthandler
import json
import multiprocessing as mp
import os
import sys
import time
import traceback
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from codechat.config.atomic import write_text
from codechat.config.device import autocast_for, machine, resolve_device
from codechat.config.stages import (ConfigError, PretrainConfig, RunConfig, load,
                                    pretrain_recipe, replace, to_dict)
from codechat.data.corpus import benchmark_decontaminator, build_corpus, load_index, read_split
from codechat.data.sources import iter_split_texts
from codechat.data.windows import eval_windows, spread_order
from codechat.speedrun.background import BackgroundJobs
from codechat.speedrun.baselines import validation_baselines
from codechat.speedrun.generation import GenerationStages
from codechat.speedrun.plan import LICENSES, SpeedrunPlan, plan, with_plan_overrides
from codechat.speedrun.record import append_record, current_commit, record_line
from codechat.speedrun.report import plot_loss, plot_throughput, read_metrics, speedrun_report
from codechat.speedrun.rl_choice import with_rl
from codechat.speedrun.rl_stage import RLStage
from codechat.speedrun.tuning import TuningStages
from codechat.tokenizer import train_tokenizer
from codechat.train.pretrain import bits_per_byte, run_pretrain
from codechat.train.stop import RunStopped, active


#: Stage statuses of a finished stage: ``done``, or ``skipped`` (finished without doing its work, the
#: stage's ``reason`` saying why); neither runs again on ``--resume``.
FINISHED = ("done", "skipped")
#: What each stage reads from an earlier one: a stage whose input was skipped is skipped too.
NEEDS = {"chat": "sft", "eval": "sft", "mbpp": "sft", "rl": "sft", "funcall": "sft", "funcall_eval": "funcall"}
#: Seconds past the time a stage has left after which every thread's stack is written to stderr once
#: (:func:`faulthandler.dump_traceback_later`), so that a stage that overruns says where it was: on a fresh
#: H200 the eval stage, granted 27 s, ran 208 s without a line (``benchmarks/RESULTS.md``, twenty-second session).
OVERRUN_STACKS_S = 60.0


def _dump_stacks_after(seconds: float) -> None:
    """Arm :func:`faulthandler.dump_traceback_later` on stderr (the process's own where ``sys.stderr`` has
    no file descriptor, as under pytest's capture); nowhere to write: not armed."""
    for f in (sys.stderr, sys.__stderr__):
        try:
            faulthandler.dump_traceback_later(seconds, file=f)
            return
        except (AttributeError, ValueError, OSError):  # None, or no fileno (io.UnsupportedOperation)
            continue


class SpeedrunFailed(RuntimeError):
    """A stage raised; ``metrics.json`` and ``report.md`` hold the finished stages and the error."""


class Speedrun(TuningStages, GenerationStages, RLStage, BackgroundJobs):
    """One run directory's stages, their grants, and the metrics/report written after each.

    ``metrics["stages"][name]`` is ``{"status": "pending"|"running"|"done"|"skipped"|"failed",
    "planned_s" (up front), "granted_s" (when it started), "wall_s", "reason", "error", "traceback"}``;
    ``wall_s`` adds up over attempts when a run is resumed. A stage left ``running`` was killed
    mid-way. ``skipped`` (with ``reason``, one line) is a stage that finished without doing its
    work: RL when the verdict says it would stall; like ``done`` it is not run again on resume.
    """

    #: The clock of the budget and the stages' deadlines (``time.monotonic``, seconds; the trainers and
    #: generation compare deadlines with it). Tests of the loop give a fake one.
    clock = staticmethod(time.monotonic)

    def __init__(self, p: SpeedrunPlan, run: Path, device: torch.device, device_arg: str, seed: int,
                 resume: bool) -> None:
        self.p, self.run, self.dev, self.device_arg, self.seed = p, run, device, device_arg, seed
        path = run / "metrics.json"
        if resume:
            if not path.is_file():
                raise ConfigError(f"--resume: {path} does not exist; start the run without --resume")
            self.m = json.loads(path.read_text())
            if self.m.get("preset") != p.preset or self.m.get("device_type") != device.type:
                raise ConfigError(f"--resume: {path} is a {self.m.get('preset')} run on "
                                  f"{self.m.get('device_type')}, not {p.preset} on {device.type}; resume with "
                                  "the same --preset and --device, or use a new --out")
            self.p = p = with_plan_overrides(
                replace(p, plan_overrides={}, **{k: v for k, v in self.m["plan"].items()
                                                 if k in ("time_budget_min", "shares", "min_s", "eval_limit",
                                                          "funcall_data", "mbpp", "sft_data", "pretrain_overrides",
                                                          "mid_share", "mid_data", "rl_tasks", "rl", "rl_reason")}),
                self.m["plan"].get("plan_overrides", {}))
        else:
            if path.is_file():
                raise ConfigError(f"{run} already holds a speedrun (metrics.json): add --resume to continue it, "
                                  "or choose another --out")
            licenses = {**LICENSES,
                        **({"MBPP (train split in SFT and RL, test split evaluated)": f"{p.mbpp} (CC BY 4.0)"}
                           if p.mbpp else {}),
                        **({"more SFT data (--data)": f"{p.sft_data} (each source's own licence)"} if p.sft_data else {}),
                        **({"function-calling data": f"{p.funcall_data} (its own licence)"} if p.funcall_data else {})}
            self.m = {"preset": p.preset, "device": str(device), "device_type": device.type, "machine": machine(device),
                      # "0" when the machine was busy as the command started (codechat.config.threads)
                      "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
                      "time_budget_min": p.time_budget_min, "licenses": licenses,
                      "plan": {k: v for k, v in asdict(p).items() if k in
                               ("time_budget_min", "shares", "min_s", "eval_limit", "max_files", "compile", "sources",
                                "funcall_data", "mbpp", "sft_data", "pretrain_overrides", "plan_overrides",
                                "mid_share", "mid_data", "rl_tasks", "rl", "rl_reason")},
                      "stages": {s: {"status": "pending", "planned_s": t} for s, t in p.planned_s().items()}}
        # the preset's recipe under --pretrain.* (checked here, before any stage runs)
        self.base = p.pretrain_base()
        self.data_cfg = replace(self.base.data, src=p.sources, max_files=p.max_files)
        self.resume = resume
        self._baselines: Future | None = None  # the baselines being computed in another process
        self._mining: Future | None = None  # the SFT pairs being mined in another process
        self._doctests: Future | None = None  # the RL pool's doctest tasks being mined in another process
        self._warmup: Future | None = None  # pretraining's compile warm-up in another process (GPU)
        self._sft_warmup: Future | None = None  # chat SFT's, in the same process after it
        self._warmup_procs: list[mp.process.BaseProcess] = []  # their process
        self._background_procs: list[mp.process.BaseProcess] = []  # the processes of those jobs

    # ------------------------------------------------------------------ the loop
    def execute(self) -> dict[str, Any]:
        """Run every unfinished stage in order; returns the metrics.

        Each invocation is a segment (``metrics["segments"]``: its wall time and how it ended); the
        budget counts them all. A stage whose grant is nothing (the budget spent) or whose input stage
        was skipped is skipped, saying so. When the invocation's stop watch is due
        (``--stop-after-min``, SIGTERM: :mod:`codechat.train.stop`) the running stage stops (a training
        stage at a step boundary with its checkpoint), is marked ``stopped`` and runs again on resume.

        Raises:
            SpeedrunFailed: a stage raised (its error is in the metrics and the report).
            RunStopped: the stop watch was due; the metrics say where the run stopped.
        """
        self.t_invocation = self.clock()
        segments = self.m.setdefault("segments", [])
        segments.append({"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "wall_s": 0.0,
                         "ended": "running"})
        self._print_plan()
        try:
            if self.m["stages"]["pretrain"]["status"] not in FINISHED:
                self._start_warmup()
            self._stages()
        except RunStopped as e:
            self._end_background()
            self._end_segment(f"stopped: {e}")
            raise
        except BaseException as e:
            self._end_background()
            self._end_segment("interrupted (Ctrl-C)" if isinstance(e, KeyboardInterrupt) else "failed")
            raise
        self._end_segment("done")
        pre, base = self.m.get("pretrain") or {}, self.m.get("baseline") or {}
        print((f"val_bpb {pre['val_bpb_final']:.3f}" if "val_bpb_final" in pre else "no pretrained model")
              + (f" vs gzip {base['gzip_bpb']:.3f}" if "gzip_bpb" in base else "")
              + f"; {self.spent_s() / 60:.1f} min of the {self.p.time_budget_min:g}-minute budget in "
              f"{len(self.m['segments'])} segment(s); report: {self.run / 'report.md'}")
        return self.m

    def _stages(self) -> None:
        stages = self.p.stages
        for i, name in enumerate(stages):
            st, tag = self.m["stages"][name], f"[{i + 1}/{len(stages)}]"
            if st["status"] in FINISHED:
                print(f"{tag} {name}: " + ("done in an earlier attempt, skipped" if st["status"] ==
                      "done" else f"skipped in an earlier attempt ({st.get('reason')})"))
                continue
            active().check(f"the start of stage {name}")
            # a stage resumed keeps its grant (a training stage's budget is the plan's), less what it spent
            again = st["status"] in ("running", "failed", "stopped") and st.get("granted_s") is not None
            grant = st["granted_s"] if again else self._grant(name)
            left = min(grant - (st.get("wall_s", 0.0) if again else 0.0), self.left_s())
            st.update(status="running", granted_s=grant, error=None, reason=None)
            skip = self._skip_reason(name, left)
            if skip:
                print(f"{tag} {name} skipped: {skip}")
                st.update(status="skipped", reason=skip, wall_s=st.get("wall_s", 0.0))
                self.m[name] = {"skipped": True, "not_run": True, "reason": skip, "wall_s": st["wall_s"]}
                self._write()
                continue
            self._write()
            t0 = self.clock()
            self.begin_stage(left)
            _dump_stacks_after(left + OVERRUN_STACKS_S)
            try:
                self.m[name] = getattr(self, f"_{name}")(grant, tag)
            except BaseException as e:
                st["wall_s"] = st.get("wall_s", 0.0) + self.clock() - t0
                if isinstance(e, RunStopped):
                    e.where = e.where or f"stage {name}"
                    st.update(status="stopped", reason=f"{e}; runs again on --resume")
                    self._write()
                    raise
                interrupted = isinstance(e, KeyboardInterrupt)
                st.update(status="failed", error="interrupted (Ctrl-C)" if interrupted else
                          f"{type(e).__name__}: {e}", traceback=None if interrupted else traceback.format_exc())
                self._write()
                if interrupted:
                    raise
                raise SpeedrunFailed(f"stage {name} failed: {type(e).__name__}: {e}\n"
                                     f"finished stages are in {self.run / 'report.md'}; after fixing the cause, "
                                     f"continue with --out {self.run} --resume") from e
            finally:
                faulthandler.cancel_dump_traceback_later()
            st["wall_s"] = st.get("wall_s", 0.0) + self.clock() - t0
            self.m[name]["wall_s"] = st["wall_s"]
            if self.m[name].get("skipped") is True:  # (the data stage's "skipped" counts files)
                st.update(status="skipped", reason=" ".join(str(self.m[name]["reason"]).split()))
            else:
                st["status"] = "done"
            self._write()

    def spent_s(self) -> float:
        """Wall seconds of the run so far: the earlier segments' and this invocation's (stages, and what
        runs between them)."""
        earlier = sum(seg["wall_s"] for seg in self.m["segments"][:-1])
        return earlier + self.clock() - self.t_invocation

    def left_s(self) -> float:
        """Seconds of the budget left (<= 0 once spent)."""
        return self.p.time_budget_min * 60 - self.spent_s()

    def _end_segment(self, ended: str) -> None:
        self.m["segments"][-1]["ended"] = ended
        self._write()

    def _skip_reason(self, name: str, left: float) -> str | None:
        """Why stage ``name`` does not run: an input stage skipped, or no time left (``left`` seconds); None: it runs."""
        needs = self._needs(name)
        if needs and self.m["stages"][needs]["status"] == "skipped":
            return f"it needs {needs}/, and {needs} was skipped"
        if left <= 0:
            return (f"no time left: the stages before it spent the {self.p.time_budget_min:g}-minute budget "
                    f"({self.spent_s():.0f} s so far)")
        return None

    def _needs(self, name: str) -> str | None:
        """The stage whose output stage ``name`` reads (None: none that can be skipped)."""
        if name in NEEDS:
            return NEEDS[name]
        if name in ("mid", "samples"):
            return "pretrain"
        if name == "sft":
            return "mid" if "mid" in self.p.stages else "pretrain"
        return None

    def _grant(self, name: str) -> float:
        """Seconds for stage ``name``: its part of the budget left among the stages still to run
        (:meth:`SpeedrunPlan.allocate <codechat.speedrun.plan.SpeedrunPlan.allocate>`)."""
        stages = self.p.stages
        rest = [s for s in stages[stages.index(name):] if self.m["stages"][s]["status"] not in FINISHED]
        return self.p.allocate(max(0.0, self.left_s()), rest)[name]

    def begin_stage(self, left_s: float) -> None:
        """Start the clock of a stage that has ``left_s`` seconds: sets :attr:`deadline`, which the stage
        methods size their work to."""
        self.deadline = self.clock() + left_s  # the stage's wall-clock end, in this process's clock
        self.time_left_at_start = left_s

    def time_left(self) -> float:
        """Seconds until the running stage's wall-clock end (:attr:`deadline`)."""
        return self.deadline - self.clock()

    def _print_plan(self) -> None:
        st = self.m["stages"]
        print(f"speedrun {self.p.preset} on {self.dev}: {self.p.time_budget_min:g} min in all, planned as "
              + ", ".join(f"{s} {st[s]['planned_s']:.0f} s" for s in self.p.stages)
              + f"; RL {'on' if self.p.rl else 'off'} ({self.p.rl_reason})")

    def _write(self) -> None:
        """``metrics.json`` and ``report.md`` as they stand (both written atomically)."""
        self.m["total_wall_s"] = sum(self.m["stages"][s].get("wall_s", 0.0) for s in self.p.stages)
        if self.m.get("segments"):  # this invocation's time so far (a killed one keeps its last write's)
            self.m["segments"][-1]["wall_s"] = self.clock() - self.t_invocation
        write_text(self.run / "metrics.json", json.dumps(self.m, indent=1))
        write_text(self.run / "report.md", speedrun_report(self.m))

    def _compile_for(self, train_s: float, estimate_s: float) -> bool:
        return self.p.compile and estimate_s <= self.p.compile_max_share * train_s

    # ------------------------------------------------------------------ stages
    def _tokenizer(self, grant: float, tag: str) -> dict[str, Any]:
        d = self.data_cfg
        print(f"{tag} tokenizer: vocab {d.vocab_size} on {', '.join(self.p.sources)}")
        texts = iter_split_texts(self.p.sources, "train", extensions=d.extensions, val_fraction=d.val_fraction,
                                 max_bytes=d.tokenizer_max_bytes, max_files=self.p.max_files)
        tok = train_tokenizer(texts, d.vocab_size)
        tok.save(self.run / "tokenizer")
        return {"vocab_size": tok.vocab_size}

    def _data(self, grant: float, tag: str) -> dict[str, Any]:
        data_dir, d = self.run / "data", self.data_cfg
        print(f"{tag} corpus -> {data_dir}")
        build_corpus(self.p.sources, self.run / "tokenizer", data_dir, extensions=d.extensions,
                     val_fraction=d.val_fraction, max_files=self.p.max_files,
                     # without --mbpp the run reports no MBPP score, and with it MBPP is checked: no warning either way
                     decontaminator=benchmark_decontaminator(self.p.mbpp, unchecked=()), quality=d.quality,
                     quality_weights=d.quality_weights)
        if self.p.background_cpu_work:
            self._start_background()
        index = load_index(data_dir)
        sp = index["splits"]
        return {"files_seen": index["files_seen"], "skipped": index["skipped"],
                "decontamination": index["decontamination"], "quality": index.get("quality"),
                "val_bytes_per_token": sp["val"]["bytes"] / max(1, sp["val"]["tokens"] - sp["val"]["documents"]),
                **{f"{s}_{k}": sp[s][k] for s in ("train", "val") for k in ("documents", "tokens", "bytes")}}

    def _mined_files(self) -> list[Path]:
        """Where the background job writes the pairs mined from each of ``plan.mine_parts``."""
        return [self.run / "sft_mined" / f"{i}.jsonl" for i in range(len(self.p.mine_parts))]

    def _baseline(self, grant: float, tag: str) -> dict[str, Any]:
        job, self._baselines = self._baselines, None
        print(f"{tag} compression baselines on the validation split"
              + (" (computed in the background during pretraining)" if job else ""))
        return job.result() if job else validation_baselines(self.run)

    def _pretrain_cfg(self, train_s: float, compile_on: bool, data: bool = True) -> PretrainConfig:
        """The pretraining stage's config: ``train_s`` seconds of training, compiled or not; without
        ``data``, its tokenizer and corpus unset (before the stages that build them)."""
        overrides = {"train.max_steps": 0, "train.time_budget_s": train_s, "train.compile": compile_on,
                     "train.save_every_s": self.p.checkpoint_every_s}
        dirs = (self.run / "data", self.run / "tokenizer") if data else ("", "")
        return load(PretrainConfig, None, overrides, base=replace(
            self.base, data=replace(self.data_cfg, data_dir=str(dirs[0]), tokenizer_dir=str(dirs[1])),
            run=RunConfig(out=str(self.run / "pretrain"), seed=self.seed, device=self.device_arg, resume=self.resume)))

    def _pretrain(self, grant: float, tag: str) -> dict[str, Any]:
        """Pretraining for ``pretrain_train_share`` of the grant, the trainer stopping in any case
        ``final_eval_share`` of the grant (at least ``final_eval_min_s``) before the stage's end; then the
        whole-split evaluation, which scores an evenly spread sample of the split when the stage's time runs
        out first."""
        p = self.p
        warm = self._wait_warmup("pretrain") if self._warmup is not None else None  # the wait comes out of training's time
        train_s = p.pretrain_train_share * grant - (warm["waited_s"] if warm else 0.0)
        compile_on = self._compile_for(train_s, p.compile_estimate_s)
        print(f"{tag} pretraining {p.preset} for {train_s:.0f} s of its {grant:.0f} s on {self.dev}"
              f"{' (compiled)' if compile_on else ' (eager)'}, the stage ending within {self.time_left():.0f} s"
              + ("" if warm is None else f"; the compile warm-up {'done' if warm['done'] else 'stopped'} "
                                         f"(waited {warm['waited_s']:.0f} s)"))
        cfg = self._pretrain_cfg(train_s, compile_on)
        result = run_pretrain(cfg, deadline=self.deadline - max(p.final_eval_share * grant, p.final_eval_min_s))
        active().check("pretraining's whole-split evaluation")
        t0 = time.monotonic()
        full = _full_split_bpb(self.run / "pretrain", self.run / "data", cfg, self.dev, self.deadline)
        full_wall = time.monotonic() - t0
        print(f"{tag} val bits/byte {full['val_bpb']:.3f} on " + (
            "the whole split" if full["complete"] else
            f"an evenly spread {full['bytes_scored'] / full['bytes_total']:.0%} of it (the stage's time ran out)")
              + f" ({full['bytes_scored']:,} bytes, {full_wall:.0f} s)")
        rows = read_metrics(self.run / "pretrain" / "metrics.jsonl")
        val = [r for r in rows if "val_bpb" in r]
        train_rows = [r for r in rows if "tokens_per_s" in r]
        mfus = [r["mfu"] for r in train_rows if "mfu" in r]
        plot_loss(rows, self.run / "loss.png", f"{p.preset} pretraining on {self.dev.type}")
        plot_throughput(train_rows, self.run / "throughput.png", f"{p.preset} pretraining on {self.dev.type}")
        tps = [r["tokens_per_s"] for r in train_rows]
        return {"steps": result["step"], "params": result["params"], "train_time_s": result["elapsed_s"],
                "train_budget_s": train_s, "compiled": compile_on, "first_step_s": result.get("first_step_s"),
                "compile_warmup": warm,
                "tokens_seen": result["step"] * cfg.train.micro_batch_size * cfg.train.accum_steps(1) * cfg.data.seq_len,
                "tokens_per_s": _quantile(tps, 0.5), "tokens_per_s_p10": _quantile(tps, 0.1),
                "mfu": _quantile(mfus, 0.5),
                "val_bpb_initial": val[0]["val_bpb"], "val_bpb_final": full["val_bpb"],
                "val_loss_final": full["val_loss"], "val_bpb_final_sampled": val[-1]["val_bpb"],
                "val_bpb_final_complete": full["complete"], "val_bytes_scored": full["bytes_scored"],
                "val_bytes_total": full["bytes_total"],
                "full_split_eval_s": full_wall, "train_loss_final": train_rows[-1]["loss"] if train_rows else None,
                "config": to_dict(cfg)}


def run_speedrun(preset: str | None = None, out: str | None = None, time_budget_min: float | None = None,
                 seed: int | None = None, device: str = "auto", max_files: int = 0,
                 eval_limit: int | None = None, checkpoint_every_s: float | None = None,
                 resume: bool = False, funcall_data: str = "", mbpp: str = "", sft_data: str = "",
                 mid_share: float = 0.0, mid_data: str = "", tasks: str = "", rl: str = "auto",
                 pretrain_overrides: dict[str, str] | None = None, plan_overrides: dict[str, str] | None = None,
                 record: str = "",
                 command: str = "codechat speedrun") -> dict[str, Any]:
    """Run every stage into ``out`` (``report.md``, ``metrics.json`` after each); returns the metrics.

    ``pretrain_overrides`` are dotted settings of the pretraining recipe (``{"optim.name": "muon"}``,
    :attr:`SpeedrunPlan.pretrain_overrides <codechat.speedrun.plan.SpeedrunPlan.pretrain_overrides>`);
    ``plan_overrides`` set the plan's own fields (``{"rl_prompts_per_step": "4"}``,
    :func:`~codechat.speedrun.plan.with_plan_overrides`; kept for ``--resume``).
    ``tasks``: more RL task specs for the pool (joined by ``+``, :mod:`codechat.train.task_pool`).
    ``rl``: ``on``, ``off`` or ``auto``, whether the RL stage runs (:func:`~codechat.speedrun.rl_choice.with_rl`).
    ``record``: a file to which the finished run appends its line (:mod:`codechat.speedrun.record`),
    ``command`` being the command line it names.

    Raises:
        ConfigError: a bad setting, ``--resume`` without a run to resume, or a new run over an old one.
        SpeedrunFailed: a stage raised; the finished ones are kept and ``resume=True`` continues.
    """
    dev = resolve_device(device)
    p = plan(dev, preset, time_budget_min, max_files, funcall_data, mbpp, sft_data, mid_share, mid_data)
    if eval_limit is not None:
        p = replace(p, eval_limit=eval_limit)
    if checkpoint_every_s is not None:
        p = replace(p, checkpoint_every_s=checkpoint_every_s)
    if tasks:
        from codechat.data.tasks import parse_spec
        from codechat.train.task_pool import POOL_SEPARATOR
        for spec in tasks.split(POOL_SEPARATOR):
            parse_spec(spec)  # a bad spec stops here, before the run directory exists
        p = replace(p, rl_tasks=p.rl_tasks + POOL_SEPARATOR + tasks)
    if plan_overrides:  # before with_rl, which moves the shares of a stage not run
        p = with_plan_overrides(p, plan_overrides)
    p = with_rl(p, rl, dev)
    if pretrain_overrides:
        p = replace(p, pretrain_overrides={**p.pretrain_overrides, **pretrain_overrides})
        p.pretrain_base()  # a bad setting stops here, before the run directory exists
    if record and Path(record).is_dir():
        raise ConfigError(f"--record {record} is a directory: name the JSONL file to append to")
    run = Path(out or f"runs/speedrun-{p.preset}")
    run.mkdir(parents=True, exist_ok=True)
    seed = seed if seed is not None else pretrain_recipe(p.preset).run.seed
    m = Speedrun(p, run, dev, device, seed, resume).execute()
    if record:
        append_record(Path(record), record_line(m, command, current_commit()))
        print(f"recorded in {record}")
    return m


def _full_split_bpb(stage: Path, data_dir: Path, cfg: PretrainConfig, device: torch.device,
                    deadline: float) -> dict[str, Any]:
    """Validation loss and bits per byte of the final model over (nearly) every token of the val split,
    or, when ``deadline`` (``time.monotonic()``) comes first, over an evenly spread sample of it.

    The trainer evaluates a capped, evenly spread sample of windows; the headline figure compared
    with gzip uses the whole split, the same bytes gzip compresses (less each shard's last
    partial window). The windows are scored in :func:`~codechat.data.windows.spread_order`, so a cut
    evaluation has covered every part of the split. Returns ``val_loss``, ``val_bpb``, ``complete``,
    ``bytes_scored`` and ``bytes_total`` (the UTF-8 bytes of the windows' targets).
    """
    from codechat.checkpoint import load_model
    model, tok, _ = load_model(stage, device)
    rows = eval_windows(read_split(data_dir, "val"), cfg.data.seq_len)
    rows = rows[torch.tensor(spread_order(len(rows)))]
    token_bytes = torch.tensor(tok.token_byte_lengths(), dtype=torch.long)
    with torch.no_grad(), autocast_for(device, cfg.train.dtype):
        got = bits_per_byte(model.eval(), rows, token_bytes, cfg.train.micro_batch_size, deadline)
    return {**got, "complete": got["rows_scored"] == len(rows), "bytes_total": int(token_bytes[rows[:, 1:]].sum())}


def _quantile(xs: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``xs`` (the nearest rank below; None when empty): 0.5 the median, 0.1 the
    slowest decile's edge of a throughput series."""
    xs = sorted(xs)
    return xs[int(q * (len(xs) - 1))] if xs else None
