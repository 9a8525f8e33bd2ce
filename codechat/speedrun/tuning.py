"""The speedrun's tuning stages: mid-training (``--mid-share``), chat SFT and function-calling SFT.

Each runs :func:`codechat.train.sft.run_sft` from an earlier stage's checkpoint of the run: ``mid``
from ``pretrain`` (issue 33: the chat-layout mixture with the pretraining recipe's optimizer, so
that SFT starts from a model that knows the layout), ``sft`` from ``mid`` when the plan has it, else
from ``pretrain``, and ``funcall`` from ``sft``. :class:`TuningStages` is a part of
:class:`codechat.speedrun.run.Speedrun`, whose loop calls its ``_<stage>(grant, tag)`` methods.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from codechat.config.sft import SFTConfig, SFTStageConfig
from codechat.config.stages import OptimConfig, PretrainConfig, RunConfig, TrainConfig, pretrain_recipe
from codechat.data.mining import without_ids
from codechat.speedrun.plan import SpeedrunPlan
from codechat.speedrun.report import plot_loss, read_metrics
from codechat.train.sft import run_sft


class TuningStages:
    """The tuning stages of :class:`~codechat.speedrun.run.Speedrun`, which provides ``p`` (the plan),
    ``m`` (the metrics), ``run`` (the run directory), ``dev``, ``device_arg``, ``seed``, ``resume``,
    ``deadline`` (the running stage's wall-clock end, ``time.monotonic()``) and ``time_left()``,
    ``_mining`` (the background miner's future), ``_mined_files()``, ``_compile_for()`` and
    ``_rl_task_origins()``."""

    p: SpeedrunPlan
    m: dict[str, Any]
    run: Path
    deadline: float

    def _sft_data(self) -> tuple[str, dict[str, Any] | None]:
        """The SFT mixture spec (mined pairs, MBPP's train split with ``--mbpp``, then ``--data``) and
        the background miner's counts (None once an earlier stage collected them; with
        ``held_out_for_rl``, the pairs left out below, whenever there were some). The pairs come from
        the background job's files when they exist (also after a resume); otherwise the stage mines
        them itself (``mine:``). With RL planned, the pairs of the functions the RL pool's mined tasks
        ask for are left out (:meth:`_rl_task_origins`): the pool's tasks stay unseen until GRPO, so its
        pass rates and its held-out slice measure what the model can do, not what SFT showed it."""
        p, counts = self.p, None
        if self._mining is not None:
            job, self._mining = self._mining, None
            counts = job.result()
        files = self._mined_files()
        if all(f.is_file() for f in files):
            held = self._rl_task_origins()
            if held is None:  # the pool's mining took longer: its tasks may be among the pairs, and the report says so
                counts = {**(counts or {}), "held_out_for_rl": None}
                print("chat SFT: the RL pool's mining is still running: its functions' pairs are not left out")
            elif held:  # copies without those pairs, beside the originals
                out = [f.with_name(f"{f.stem}.without_rl_tasks.jsonl") for f in files]
                left_out = sum(without_ids(f, o, held) for f, o in zip(files, out))
                counts = {**(counts or {}), "held_out_for_rl": left_out}
                print(f"chat SFT: {left_out} mined pairs left out, the functions of the RL pool's {len(held)} "
                      "mined tasks")
                files = out
            mined = [f"{f}#completion:{w:g}" for f, (_, w) in zip(files, p.mine_parts) if f.stat().st_size]
        else:
            mined = [f"mine:{src}:{w:g}" for src, w in p.mine_parts]
        parts = mined + ([f"{p.mbpp}#mbpp:{p.mbpp_weight:g}"] if p.mbpp else []) + ([p.sft_data] if p.sft_data else [])
        return ",".join(parts), counts

    def _mid(self, grant: float, tag: str) -> dict[str, Any]:
        """Mid-training: SFT's mixture, the function-calling conversations' train split and ``--mid-data``,
        packed into rows of the pretraining sequence length, with the pretraining recipe's optimizer and
        learning rate (warmup 10 steps, then linear decay to zero) and its micro-batch."""
        p, cfg = self.p, self.m["pretrain"]["config"]
        t0 = time.perf_counter()
        spec, mined = self._sft_data()
        extra = ([f"{p.funcall_data}@train"] if p.funcall_data else []) + ([p.mid_data] if p.mid_data else [])
        optim = OptimConfig(**{**cfg["optim"], "warmup_steps": 10, "schedule": "linear", "min_lr_ratio": 0.0})
        return self._tune("mid", "pretrain", ",".join([spec, *extra]), mined, time.perf_counter() - t0, grant, tag,
                          optim=optim,
                          max_length=cfg["data"]["seq_len"], micro_batch_size=cfg["train"]["micro_batch_size"])

    def _sft(self, grant: float, tag: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        spec, mined = self._sft_data()
        return self._tune("sft", "mid" if "mid" in self.p.stages else "pretrain", spec, mined,
                          time.perf_counter() - t0, grant, tag)

    def _tune(self, name: str, init: str, spec: str, mined: dict[str, Any] | None, wait_s: float, grant: float,
              tag: str, *,
              optim: OptimConfig | None = None, max_length: int = 0, micro_batch_size: int = 0) -> dict[str, Any]:
        """Stage ``name``: :meth:`_sft_stage` from ``init`` on the mixture ``spec`` (packed, epoch mix mode,
        decontaminated against HumanEval and MBPP's test split); its figures for the metrics and report
        (``mined``: the background miner's counts, ``wait_s``: how long the stage waited for them)."""
        pre, p = self.m["pretrain"], self.p
        train_s = p.sft_train_share * grant
        # SFT's warm-up ran beside pretraining: still running, it is waited for at most what the stage's own
        # compile may cost (compile_max_share of its training time), the wait coming out of that time
        warm = self._wait_warmup("sft", p.compile_max_share * train_s) if name == "sft" and self._sft_warmup \
            is not None else None
        train_s -= warm["waited_s"] if warm else 0.0
        # with its graphs in the caches the stage compiles: its first step loads them. Else the compile's
        # cost is pretraining's: its warm-up's seconds, or its first step's when it had none
        pre_warm = pre.get("compile_warmup") or {}
        measured = pre_warm["warmup_s"] if pre_warm.get("done") else pre.get("first_step_s") if pre.get("compiled") \
            else None
        compile_on = bool((warm or {}).get("done")) or self._compile_for(train_s, measured or p.compile_estimate_s)
        print(f"{tag} {name} from {init}/ for {train_s:.0f} s of training in its {grant:.0f} s (the stage ending "
              f"within {self.time_left():.0f} s) on {spec}{' (compiled)' if compile_on else ' (eager)'}")
        sft = run_sft(self._sft_stage(init, name, SFTConfig(
            data=spec, mix_mode="epoch", max_length=max_length or p.sft_max_length,
            max_prompt_length=p.sft_max_prompt_length, packing=True, mine_max_files=p.max_files,
            mine_style=p.sft_mine_style, mine_workers=0, decontam_mbpp=p.mbpp, seed=self.seed),
            train_s, compile_on, optim=optim, micro_batch_size=micro_batch_size), deadline=self.deadline)
        rows = read_metrics(self.run / name / "metrics.jsonl")
        evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
        plot_loss(rows, self.run / f"{name}_loss.png", f"{p.preset} {'mid-training' if name == 'mid' else 'chat SFT'} "
                                                        f"on {self.dev.type}")
        pre_c, dec = sft["data"]["preflight"], sft["data"]["decontamination"] or {}
        return {"init": init, "steps": sft["step"], "train_budget_s": train_s, "compiled": compile_on, "data": spec,
                "first_step_s": sft.get("first_step_s"), "compile_warmup": warm,
                "sources": sft["data"].get("sources"), "mined_in_background": mined, "mining_wait_s": wait_s,
                "examples_seen": pre_c["seen"], "examples_kept": pre_c["kept"],
                "examples_prompt_truncated": pre_c["prompt_truncated"],
                "examples_completion_truncated": pre_c["completion_truncated"],
                "examples_dropped": sum(pre_c["dropped"].values()), "examples_decontaminated": dec.get("excluded", 0),
                "supervised_token_share": sft["data"]["supervised_share"],
                "loss_initial": evals[0], "loss_final": evals[-1], "train_loss_final": sft.get("loss")}

    def _sft_warmup_cfg(self, pretrain: PretrainConfig) -> SFTStageConfig | None:
        """Chat SFT's stage config as :meth:`_tune` will build it when compiled, for its compile warm-up
        (:func:`codechat.train.sft.warm_compile`) beside ``pretrain`` (pretraining's config); None when
        the plan has no chat SFT or does not compile. Its budget alone would not pay for the compile at 9
        minutes (~24 s of its 56, H100), so without a warm-up it may run eager; with one, it compiles
        for nothing."""
        p = self.p
        if "sft" not in p.stages or not p.compile:
            return None
        sft = SFTConfig(max_length=p.sft_max_length, max_prompt_length=p.sft_max_prompt_length, packing=True)
        return self._sft_stage("pretrain", "sft", sft, p.sft_train_share * p.planned_s()["sft"], True,
                               pretrain_micro_batch=pretrain.train.micro_batch_size)

    def _sft_stage(self, init: str, out: str, sft: SFTConfig, train_s: float, compile_on: bool, *,
                   optim: OptimConfig | None = None, micro_batch_size: int = 0,
                   pretrain_micro_batch: int = 0) -> SFTStageConfig:
        """An SFT stage from stage ``init`` into ``out`` of this run, ``micro_batch_size`` rows a step
        (0: the plan's SFT micro-batch, else the pretraining one: ``pretrain_micro_batch``, by default the
        one the pretraining stage ran with), with ``optim`` or by default half the preset recipe's learning
        rate (whatever ``--pretrain.optim.lr`` says, so that a pretraining sweep leaves SFT as it was),
        AdamW without weight decay, decaying linearly to 0 over ``train_s`` seconds."""
        pretrain_micro_batch = pretrain_micro_batch or self.m["pretrain"]["config"]["train"]["micro_batch_size"]
        return SFTStageConfig(
            init=str(self.run / init), sft=sft,
            train=TrainConfig(time_budget_s=train_s, micro_batch_size=micro_batch_size or self.p.sft_micro_batch_size
                              or pretrain_micro_batch,
                              log_every=10, eval_every=10**9, save_every=10**9,
                              save_every_s=self.p.checkpoint_every_s, compile=compile_on),
            optim=optim or OptimConfig(lr=pretrain_recipe(self.p.preset).optim.lr / 2, warmup_steps=10,
                                       schedule="linear", min_lr_ratio=0.0, weight_decay=0.0),
            run=RunConfig(out=str(self.run / out), seed=self.seed, device=self.device_arg, resume=self.resume))

    def _funcall(self, grant: float, tag: str) -> dict[str, Any]:
        p = self.p
        train_s = p.sft_train_share * grant
        print(f"{tag} function-calling SFT for {train_s:.0f} s of training in its {grant:.0f} s (the stage ending "
              f"within {self.time_left():.0f} s) on {p.funcall_data}@train")
        # budgets follow the model: tool schemas make long system turns
        out = run_sft(self._sft_stage("sft", "funcall", SFTConfig(data=f"{p.funcall_data}@train", packing=True,
                                                                  seed=self.seed), train_s, compile_on=False),
                      deadline=self.deadline)
        pre_c = out["data"]["preflight"]
        return {"steps": out["step"], "train_budget_s": train_s, "data": f"{p.funcall_data}@train",
                "examples_seen": pre_c["seen"], "examples_kept": pre_c["kept"],
                "supervised_token_share": out["data"]["supervised_share"], "train_loss_final": out.get("loss")}
