"""The one training loop of codechat, shared by pretraining, SFT and RL.

One optimizer step takes ``grad_accum`` micro-batches. The loss of the step is the SUM of the
per-token cross-entropy over every supervised token (label != -100) of all its micro-batches,
divided by the number of those tokens in the whole step — so (batch 2, accum 1) and
(batch 1, accum 2) give the same gradient whatever the token counts (torchtitan's rule; a mean
per micro-batch divided by ``grad_accum`` is wrong when counts differ).

Around that: AdamW, or Muon on the hidden matrices (see :mod:`.optim`), warmup then cosine or
linear decay to a floor, gradient clipping, bf16 autocast on CUDA, a step or time budget,
validation every N steps, logging to stdout / TensorBoard / ``metrics.jsonl``, checkpoints
every N steps, at the end and on Ctrl-C, exact resume, and a stop on a non-finite loss
that leaves the last good checkpoint intact. A run stops at a step boundary with a checkpoint when the
invocation's :class:`~codechat.train.stop.StopWatch` says so (``--stop-after-min``, SIGTERM), raising
:class:`~codechat.train.stop.RunStopped`; resumed, it is the uninterrupted run. With ``lora`` the same loop trains LoRA adapters on
the frozen model (:mod:`codechat.peft.lora`), its checkpoints holding the adapters only.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import torch
from tqdm.auto import tqdm

from .. import checkpoint as ckpt
from codechat.config.lora import LoraConfig
from codechat.config.stages import ConfigError, ModelConfig, OptimConfig, RunConfig, TrainConfig, build, to_dict
from ..data.batch import Batch
from codechat.config.device import autocast_for, compute_dtype, peak_flops
from ..model import GPT, IGNORE_INDEX, build_model
from codechat.peft.lora import adapter_state_dict, apply_lora, attach_lora, is_adapter_key, same_peft
from codechat.parallel.state import whole_template
from codechat.parallel.world import World
from codechat.parallel.wrapper import Parallel
from .metrics_log import MetricsLog
from .optim import build_optimizer, set_lr
from .stop import RunStopped, active


class BatchSource(Protocol):
    """What the trainer draws micro-batches from: :class:`Batch` (or ``(inputs, labels)``), and a position."""

    def next_batch(self) -> Batch | tuple[torch.Tensor, torch.Tensor]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def same_model(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two saved model configs (``meta.model``) describe the same model: compared with the
    defaults of fields added since filled in, so that a checkpoint written before a new
    :class:`ModelConfig` option existed still resumes."""
    if a is None or b is None:
        return a == b
    try:
        return to_dict(build(ModelConfig, a)) == to_dict(build(ModelConfig, b))
    except ConfigError:
        return a == b


class TrainingDiverged(RuntimeError):
    """The loss or gradient became NaN/inf; the newest checkpoint on disk is the last good one."""


def lr_at(step: int, progress: float, cfg: OptimConfig) -> float:
    """Learning rate of optimizer step ``step`` (0-based).

    Linear warmup over ``warmup_steps`` steps, then decay from ``lr`` to ``lr * min_lr_ratio``
    as ``progress`` (fraction of the budget after warmup, in [0, 1]) goes from 0 to 1.
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    p = min(max(progress, 0.0), 1.0)
    shape = {"cosine": 0.5 * (1.0 + math.cos(math.pi * p)), "linear": 1.0 - p, "constant": 1.0}[cfg.schedule]
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * shape


class Trainer:
    """Runs the optimizer loop on ``model`` with micro-batches from ``batches``.

    Args:
        model: the (unwrapped) model; its ``forward(inputs, labels, reduction="sum")`` gives the
            summed loss in nats over supervised tokens.
        batches: a :class:`BatchSource`.
        evaluate: ``evaluate(model) -> dict`` of validation metrics (e.g. val_loss, val_bpb),
            run in eval mode under no_grad every ``eval_every`` steps, at step 0 and at the end.
        out_dir: the stage directory (``metrics.jsonl``, ``tb/``, ``checkpoints/``).
        meta: JSON-able facts saved in every checkpoint's ``state.json`` (configs, stage name).
        tokenizer_dir: copied into each checkpoint so it is self-contained.
        world: this process's place (:func:`codechat.parallel.world.init_world`; default: a world of one).
            In a larger world ``train.parallel`` says how the model is spread, ``batches`` must give
            this rank's rows (:class:`codechat.parallel.world.RankSlice`), and only rank 0 logs and writes.
        budget_after_first_step: ``train.time_budget_s`` (and the LR schedule's progress through it)
            counts from the end of each :meth:`fit` call's first step, so that ``torch.compile``'s
            compile, which that step does, takes nothing from the training time: runs compared at
            equal training time then train equally long whatever their compile costs
            (``benchmarks/pretrain_ablation.py``). Off, the budget counts every step (a speedrun's
            compile is part of its clock).
        deadline: a ``time.monotonic()`` instant after which no step starts (None: none). Unlike the time
            budget it counts everything (evaluations, saves, a slow machine): a caller with a wall-clock
            grant (the speedrun's stages) sets it, the time budget and the learning-rate schedule staying
            the plan. It holds for this process only; a resumed run is given its own.
        lora: train LoRA adapters on the frozen ``model`` instead of every weight
            (:func:`codechat.peft.lora.attach_lora`, before any wrapper or compile): ``meta["init"]`` names
            the base, the blocks' frozen projections are stored in the compute dtype (bf16 on CUDA), the
            optimizer sees the adapters only, and checkpoints hold the adapters (and their optimizer state)
            with ``meta["peft"]`` naming the base.

    Raises:
        ConfigError: ``lora`` without ``meta["init"]``, or adapters that do not fit the model
            (:func:`codechat.peft.lora.apply_lora`).
    """

    def __init__(self, model: GPT, *, train: TrainConfig, optim: OptimConfig, run: RunConfig,
                 batches: BatchSource, out_dir: Path, evaluate: Callable[[GPT], dict[str, float]] | None = None,
                 meta: dict[str, Any] | None = None, tokenizer_dir: Path | None = None,
                 show_progress: bool = True, world: World | None = None, budget_after_first_step: bool = False,
                 deadline: float | None = None, lora: LoraConfig | None = None) -> None:
        self.model, self.tcfg, self.ocfg, self.rcfg = model, train, optim, run
        self.batches, self.evaluate, self.meta = batches, evaluate, dict(meta or {})
        self.out_dir, self.tokenizer_dir, self.show_progress = Path(out_dir), tokenizer_dir, show_progress
        self.device = next(model.parameters()).device
        self.world = world or World(device=self.device)
        self.lora = lora
        if lora is not None:  # the adapters first: a wrapper, compile and the optimizer see the adapted model
            if not self.meta.get("init"):
                raise ConfigError("--peft lora adapts a trained model: give --init CHECKPOINT")
            self.meta["peft"] = attach_lora(model, lora, self.meta["init"], seed=run.seed,
                                            base_dtype=compute_dtype(self.device, train.dtype))
            torch.manual_seed(run.seed + self.world.rank)  # the adapters' dropout: a run repeats, a resume restores it
        # before the optimizer: FSDP swaps parameters, a pipeline keeps this rank's stage
        if train.cpu_offload and optim.name == "muon":
            raise ConfigError("train.cpu_offload with optim.name muon: Muon's Newton-Schulz iterations would run on "
                              "the CPU over every matrix; use --optim.name adamw with offload")
        if train.fp8 != "none":  # the block linears in FP8, before any wrapper or compile (codechat.train.fp8)
            from codechat.train.fp8 import check_fp8, convert_to_fp8
            check_fp8(train.fp8, self.device)
            convert_to_fp8(model, train.fp8, head=train.fp8_head)
        self.par = Parallel(model, self.world, train.parallel, train.ac, train.pp_schedule, train.pipeline_microbatches,
                            param_dtype=compute_dtype(self.device, train.dtype), cpu_offload=train.cpu_offload,
                            bucket_cap_mb=train.ddp_bucket_cap_mb,
                            reshard_after_forward=train.fsdp_reshard_after_forward)
        self.optimizer = build_optimizer(self.par.model, optim, torch.device("cpu") if self.par.offloaded else self.device)
        # a pipeline's schedule calls its stage, so there the blocks are compiled on their own
        compile_whole = train.compile and train.compile_scope == "model" and self.par.pipeline is None
        self.forward = torch.compile(self.par.module) if compile_whole else self.par.module
        if train.compile and not compile_whole:  # regional compilation (config.COMPILE_SCOPES)
            layers = self.par.model.layers  # a pipeline stage keeps its blocks by their model index
            for block in (layers.values() if isinstance(layers, torch.nn.ModuleDict) else layers):
                block.compile()
            if self.par.pipeline is None:  # and the final norm, head and loss (GPT.head) on their own
                self.par.model.head = torch.compile(self.par.model.head)
        self.step, self.elapsed_s = 0, 0.0
        self.budget_after_first_step = budget_after_first_step
        self.deadline = deadline
        self._first_step = 0  # the step this process started from (after a resume, the checkpoint's)
        self.untimed_s = 0.0  # seconds of elapsed_s the time budget leaves out (budget_after_first_step)
        self.last: dict[str, Any] = {}
        self.peak = peak_flops(self.device)
        # (step, host copy of (loss, grad norm, not-finite flag), its CUDA event) of updates not yet checked
        self._unchecked: list[tuple[int, torch.Tensor, torch.cuda.Event | None]] = []

    # ------------------------------------------------------------------ budget
    def progress(self) -> float:
        """Fraction of the budget used after warmup (step budget, time budget, whichever is further).

        With ``max_steps``, step ``warmup_steps`` (0-based) is at 0 (the peak LR) and the last
        step, ``max_steps - 1``, at 1 (the floor).
        """
        t, w = self.tcfg, self.ocfg.warmup_steps
        p = 0.0
        if t.max_steps:
            p = max(p, (self.step - w) / max(1, t.max_steps - 1 - w))
        if t.time_budget_s:
            p = max(p, self.budget_s_used() / t.time_budget_s)
        return p

    def budget_s_used(self) -> float:
        """Seconds of training counted against ``train.time_budget_s``: ``elapsed_s`` less the first
        steps left out under ``budget_after_first_step``."""
        return self.elapsed_s - self.untimed_s

    def done(self) -> bool:
        """Whether the step budget, the time budget or the wall-clock ``deadline`` is spent (the deadline
        only once this process took a step: a stage whose loading ate its time still leaves a trained
        checkpoint)."""
        t = self.tcfg
        return bool((t.max_steps and self.step >= t.max_steps)
                    or (t.time_budget_s and self.budget_s_used() >= t.time_budget_s)
                    or (self.deadline is not None and self.step > self._first_step
                        and self.par.all_max(time.monotonic() - self.deadline) >= 0))

    def stop_if_due(self, loader_state: dict[str, Any], echo: Callable[[str], None]) -> None:
        """At a step boundary: when the invocation's stop watch is due on any rank (every rank then stops
        at the same step), save a checkpoint unless this step's is on disk, and raise
        :class:`~codechat.train.stop.RunStopped`.

        Raises:
            RunStopped: naming the reason and this stage's step.
        """
        reason = active().due()
        if self.par.all_max(1.0 if reason else 0.0) and not reason:
            reason = "a stop on another rank"
        if not reason:
            return
        where = f"{self.meta.get('stage', 'train')} step {self.step}"
        if not ckpt.step_dir(self.out_dir / "checkpoints", self.step).is_dir():
            self.check_finite()
            self.save(loader_state)
        echo(f"stopped by {reason} at {where}, its checkpoint saved (the next step's learning rate "
             f"{lr_at(self.step, self.progress(), self.ocfg):.6g}): resume with --resume")
        raise RunStopped(reason, where)

    # ------------------------------------------------------------------ state
    def resume(self) -> bool:
        """Load the newest checkpoint of ``out_dir`` if there is one; returns whether it did."""
        found = ckpt.list_checkpoints(self.out_dir / "checkpoints")
        if not found:
            return False
        c = ckpt.load(found[-1], map_location=self.device, with_optim=True)
        saved_model = c["state"].get("meta", {}).get("model")
        if saved_model is not None and not same_model(saved_model, self.meta.get("model")):
            raise ckpt.CheckpointError(f"{c['dir'] / 'state.json'}: the checkpoint's model config {saved_model} "
                                       f"does not match this run's {self.meta.get('model')}; resume with the same "
                                       "--preset/--config or start a new --out directory")
        saved_peft = c["state"].get("meta", {}).get("peft")
        if not same_peft(saved_peft, self.meta.get("peft")):
            raise ckpt.CheckpointError(f"{c['dir'] / 'state.json'}: the checkpoint's meta.peft {saved_peft} does not "
                                       f"match this run's {self.meta.get('peft')} (--peft, --lora.*, the --init base); "
                                       "resume with the same settings and base or start a new --out directory")
        if ckpt.is_sharded(c["dir"]):  # the optimizer read whole, into one built over a CPU copy of the model
            cpu = torch.device("cpu")
            copy = build_model(self.model.cfg, cpu)
            if self.lora is not None:
                apply_lora(copy, self.lora)
            t = whole_template(copy, build_optimizer(copy, self.ocfg, cpu))
            c["optim"] = {"state": ckpt.load_sharded(c["dir"], {"optim": t["optim"]})["optim"],
                          "param_groups": t["param_groups"]}
        whole = (self.model, lambda: build_optimizer(self.model, self.ocfg, torch.device("meta")))
        try:
            if self.lora is not None and set(c["model"]) != set(adapter_state_dict(self.model)):
                raise KeyError(f"the adapters of the checkpoint ({len(c['model'])} tensors) are not this model's")
            self.par.load_state_dicts(c["model"], c["optim"], self.optimizer, whole, strict=self.lora is None)
        except (RuntimeError, ValueError, KeyError) as e:
            raise ckpt.CheckpointError(f"{c['dir']}: does not match this model/optimizer ({e})") from None
        s = c["state"]
        self.step, self.elapsed_s, self.untimed_s = s["step"], s["elapsed_s"], s.get("untimed_s", 0.0)
        self._first_step = self.step
        self.batches.load_state_dict(s["loader"])
        if c["rng"] is not None:
            ckpt.set_rng_state(c["rng"])
        return True

    def save(self, loader_state: dict[str, Any]) -> Path:
        """Write checkpoint ``step``: in one process the consolidated files, under torchrun a sharded
        checkpoint every rank writes its part of (:func:`codechat.checkpoint.save_sharded`)."""
        state = {"step": self.step, "elapsed_s": self.elapsed_s, "untimed_s": self.untimed_s, "loader": loader_state,
                 "meta": self.meta, "metrics": self.last}
        if self.world.size > 1:  # every rank writes its part (DCP)
            shards = self.par.shards(self.optimizer)
            if self.lora is not None:  # the adapters only: the base is meta.peft's
                shards["model"] = {k: v for k, v in shards["model"].items() if is_adapter_key(k)}
            return ckpt.save_sharded(self.out_dir / "checkpoints", self.step, shards=shards,
                                     state=state, main=self.world.main, barrier=self.par.barrier,
                                     tokenizer_dir=self.tokenizer_dir, keep_last=self.tcfg.keep_last)
        weights = self.model.state_dict() if self.lora is None else adapter_state_dict(self.model)
        return ckpt.save(self.out_dir / "checkpoints", self.step, model=weights, state=state,
                         optim=self.optimizer.state_dict(), tokenizer_dir=self.tokenizer_dir,
                         keep_last=self.tcfg.keep_last)

    # ------------------------------------------------------------------ loop
    def backward(self, micro_batches: list[Batch], n_supervised: int) -> torch.Tensor:
        """Accumulate into ``.grad`` the gradient of (summed token loss) / ``n_supervised``.

        ``n_supervised`` is the count of labels != -100 over the whole optimizer step (every
        micro-batch, and every rank once data parallel), so each micro-batch contributes its
        SUM scaled by one common factor (times the world size, which DDP/FSDP's gradient
        average divides out). Gradients are synchronised on the last micro-batch only. Returns the
        summed loss in nats over all ranks (under ``--pp`` the last stages' sums), a 0-d tensor.
        """
        total = torch.zeros((), device=self.device)
        for i, b in enumerate(Batch(*b) for b in micro_batches):
            x, y = self._to_device(b.inputs), self._to_device(b.labels)
            doc_ids = None if b.doc_ids is None else self._to_device(b.doc_ids)
            with self.par.micro_step(last=i == len(micro_batches) - 1):
                if self.par.pipeline is not None:  # forward and backward through the stages
                    if doc_ids is not None:
                        raise ConfigError("packed rows are not supported with --pp yet: turn --packing off")
                    with autocast_for(self.device, self.tcfg.dtype):
                        loss_sum = self.par.pipeline.step(x, y, self.par.loss_scale / n_supervised)
                else:
                    with autocast_for(self.device, self.tcfg.dtype):
                        loss_sum = self.forward(x, y, reduction="sum", doc_ids=doc_ids)
                    (loss_sum * (self.par.loss_scale / n_supervised)).backward()
            total += loss_sum.detach()
        return self.par.all_sum(total)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the training device without waiting for the GPU: a CPU tensor bound for CUDA
        goes through pinned memory (a copy from pageable memory may first wait for the stream —
        CUDA Runtime API, "API synchronization behavior" — which empties the GPU's queue while
        the host then launches the next forward)."""
        if t.device.type == "cpu" and self.device.type == "cuda":
            t = t.contiguous().pin_memory()
        return t.to(self.device, non_blocking=True)

    def train_step(self, micro_batches: list[Batch | tuple[torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
        """One optimizer step over ``micro_batches``; returns ``loss`` (nats/token) and ``grad_norm``
        as 0-d float32 tensors on the device (``float()`` them when needed: that waits for the
        step), and ``lr``, ``tokens``, ``supervised``, ``skipped`` as numbers.

        No host sync in the step when the optimizer is fused AdamW (CUDA): the update is skipped on
        the device when the loss or the gradient norm is not finite, and that is checked
        (:meth:`check_finite`) after the next step's forward and backward have been queued, so the
        host stays a step ahead of the GPU. Other optimizers are checked before their update.

        Raises:
            TrainingDiverged: this step's or (deferred) the previous step's loss or gradient norm
                is not finite; no update is applied for either.
        """
        micro_batches = [Batch(*b) for b in micro_batches]
        n_sup = int(self.par.data_sum(sum(int((b.labels != IGNORE_INDEX).sum()) for b in micro_batches)))
        lr = lr_at(self.step, self.progress(), self.ocfg)
        set_lr(self.optimizer, lr)
        if n_sup == 0:  # nothing to learn from: never let a 0/0 loss reach backward
            self.check_finite()  # the previous step's: what is left unchecked is this step's own
            nan = torch.full((), float("nan"), device=self.device)
            return {"loss": nan, "grad_norm": torch.zeros((), device=self.device), "lr": lr, "tokens": 0,
                    "supervised": 0, "skipped": 1}
        loss = self.backward(micro_batches, n_sup) / n_sup
        self.check_finite()  # the previous step's, while this one runs
        grad_norm = self.apply_update(loss)
        tokens = int(self.par.data_sum(sum(b.real_tokens for b in micro_batches)))
        return {"loss": loss, "grad_norm": grad_norm, "lr": lr, "tokens": tokens, "supervised": n_sup, "skipped": 0}

    def apply_update(self, loss: torch.Tensor | float) -> torch.Tensor:
        """Clip the accumulated gradients, then step the optimizer; returns the gradient norm
        before clipping (0-d tensor).

        A non-finite ``loss`` or norm applies no update. Fused AdamW skips it on the device (its
        ``found_inf``, as under a gradient scaler) and :meth:`check_finite` raises later; any other
        optimizer is checked here, before its step.

        Raises:
            TrainingDiverged: (other optimizers) ``loss`` or the norm is not finite; the gradients
                are dropped.
        """
        clip = self.ocfg.grad_clip or float("inf")
        grad_norm = self.par.clip_grad_norm(clip)
        loss = torch.as_tensor(loss, dtype=torch.float32, device=grad_norm.device)
        bad = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        self._track(torch.stack([loss, grad_norm.float(), bad.float()]))
        opt = self.optimizer
        if isinstance(opt, torch.optim.Adam) and opt.defaults.get("fused"):
            opt.found_inf = bad.float()  # read by fused Adam(W)'s step: 1 skips params, moments and step count
            opt.step()
            del opt.found_inf
        else:
            self.check_finite()
            opt.step()
        opt.zero_grad(set_to_none=True)
        return grad_norm

    def _track(self, values: torch.Tensor) -> None:
        """Queue a copy of an update's (loss, grad norm, not-finite flag) to pinned host memory,
        with an event: reading it later waits for that update only, not for work queued after
        it (``.item()`` on the stream would wait for everything queued so far)."""
        if values.is_cuda:
            host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            host.copy_(values, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:
            host, event = values, None
        self._unchecked.append((self.step, host, event))

    def check_finite(self) -> tuple[float, float] | None:
        """Raise if an update not yet checked had a non-finite loss or gradient norm; returns the
        newest checked update's (loss, grad norm), None when there was none. Waits for those
        updates' values only (:meth:`_track`), not for the GPU work queued after them.

        Raises:
            TrainingDiverged: naming the step; its update (and any after it) was not applied.
        """
        pending, self._unchecked = self._unchecked, []
        last = None
        for step, host, event in pending:
            if event is not None:
                event.synchronize()
            loss, grad_norm, bad = host.tolist()
            last = (loss, grad_norm)
            if bad:
                self.optimizer.zero_grad(set_to_none=True)
                raise TrainingDiverged(f"step {step}: loss={loss} grad_norm={grad_norm}; stopped before "
                                       f"the update. The newest checkpoint in {self.out_dir / 'checkpoints'} is the "
                                       "last good one: lower --optim.lr or raise --optim.warmup_steps, then --resume")
        return last

    def run_eval(self) -> dict[str, float]:
        if self.evaluate is None:
            return {}
        model = self.par.eval_model  # the whole model (under --pp its forward through the stages)
        model.eval()
        with torch.no_grad(), autocast_for(self.device, self.tcfg.dtype):
            out = self.evaluate(model)
        model.train()
        return out

    def fit(self) -> dict[str, Any]:
        """Train until the budget is spent; returns the last logged metrics plus totals.

        ``first_step_s`` is the wall time of this call's first step (``torch.compile``'s compile
        and the first-use warm-up included; ``None`` if no step ran), so a caller can tell the
        compile cost from the steady step time.

        Raises:
            TrainingDiverged: see :meth:`train_step`.
            RunStopped: the stop watch was due at a step boundary (:meth:`stop_if_due`).
        """
        with active().polled():
            return self._fit()

    def _fit(self) -> dict[str, Any]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        resumed = self.rcfg.resume and self.resume()
        log = MetricsLog(self.out_dir, self.step if resumed else None) if self.world.main else None
        bar = tqdm(total=self.tcfg.max_steps or None, initial=self.step, desc=self.meta.get("stage", "train"),
                   disable=not (self.show_progress and self.world.main), dynamic_ncols=True, leave=False)
        echo = bar.write if self.show_progress else print
        window_tokens, window_t0 = 0, time.perf_counter()
        loader_state = self.batches.state_dict()
        first_step_s, elapsed_at_start = None, self.elapsed_s
        saved_at_s = self.elapsed_s
        try:
            if self.step == 0 and not resumed:  # (a run stopped at step 0 logged it already)
                self.record(log, echo, {"step": 0, **self.run_eval()})
            # ``last`` is decided once a step, so the step that ends the loop is the one saved (a wall-clock
            # deadline passing during a step's logging or evaluation must not end it unsaved)
            last = self.done()
            while not last:
                self.stop_if_due(loader_state, echo)
                t0 = time.perf_counter()
                loader_state = self.batches.state_dict()  # position before this step, for Ctrl-C saves
                micro = [self.batches.next_batch() for _ in range(self.tcfg.accum_steps(self.world.dp_size))]
                stats = self.train_step(micro)  # no host sync: the host runs a step ahead of the GPU
                self.step += 1
                self.elapsed_s += self.par.all_max(time.perf_counter() - t0)  # one clock: every rank stops together
                if first_step_s is None:
                    first_step_s = self.elapsed_s - elapsed_at_start
                    if self.budget_after_first_step:
                        self.untimed_s += first_step_s
                loader_state = self.batches.state_dict()
                window_tokens += stats["tokens"]
                bar.update(1)
                last = self.done()
                if self.step % self.tcfg.log_every == 0 or last or self.step % self.tcfg.eval_every == 0:
                    checked = self.check_finite()  # this step's values, without waiting for its optimizer step
                    loss, grad_norm = checked or (float(stats["loss"]), float(stats["grad_norm"]))
                    stats.update(loss=loss, grad_norm=grad_norm)
                    bar.set_postfix(loss=f"{stats['loss']:.3f}", lr=f"{stats['lr']:.2e}")
                    dt = time.perf_counter() - window_t0
                    tps = window_tokens / dt
                    fpt = self.model.flops_per_token(Batch(*micro[0]).inputs.size(1))
                    row = {"step": self.step, "loss": stats["loss"], "lr": stats["lr"],
                           "grad_norm": stats["grad_norm"], "tokens_per_s": tps,
                           "mfu": tps * fpt / (self.peak * self.world.size) if self.peak else None,
                           "elapsed_s": self.elapsed_s}
                    if self.step % self.tcfg.eval_every == 0 or last:
                        row.update(self.run_eval())
                    self.record(log, echo, row)
                    window_tokens, window_t0 = 0, time.perf_counter()
                if (self.step % self.tcfg.save_every == 0 or last
                        or (self.tcfg.save_every_s and self.elapsed_s - saved_at_s >= self.tcfg.save_every_s)):
                    self.check_finite()  # never save past an update that was skipped
                    self.save(loader_state)
                    saved_at_s = self.elapsed_s
        except KeyboardInterrupt:
            echo(f"interrupted at step {self.step}: saving a checkpoint, resume with --resume")
            self.check_finite()
            self.save(loader_state)
            raise
        finally:
            bar.close()
            if log is not None:
                log.close()
        return {"step": self.step, "elapsed_s": self.elapsed_s, "first_step_s": first_step_s, **self.last}

    def record(self, log: MetricsLog | None, echo: Callable[[str], None], row: dict[str, Any]) -> None:
        """Log ``row`` (its None values dropped; ``log`` is None on ranks > 0) and keep it as the
        latest metrics (saved in checkpoints)."""
        row = {k: v for k, v in row.items() if v is not None}
        self.last.update(row)
        if log is not None:
            log.write(row, echo)
