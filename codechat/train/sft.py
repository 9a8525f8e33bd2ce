"""Chat SFT stage: a pretrained checkpoint + a data mixture -> the shared trainer, assistant-only loss.

Inputs that do not exist (``--init``, local ``--data`` sources) are reported first, all at once,
before the model is loaded. Budgets left unset follow the model (:meth:`SFTConfig.for_model`).

An ``eval_loss`` on the first ``sft.eval_examples`` kept examples is logged at step 0 and at
the end (and every ``train.eval_every`` steps). Before step 0 a preflight renders the first ``sft.preflight_examples`` records and prints how
many were kept, truncated and dropped and the share of supervised tokens; it refuses to start
when nothing would be supervised. ``DIR/data_report.json`` holds ``preflight`` (those counts),
``supervised_share``, ``examples_per_epoch``, ``max_steps``, ``max_length`` / ``max_prompt_length``
(the budgets used), ``decontamination`` (:meth:`Decontaminator.report
<codechat.data.decontam.Decontaminator.report>`: excluded per benchmark and per rule) and ``sources``
(per source: weight, target share, records, skipped, excluded). After training (also on Ctrl-C)
the realised proportions are logged and added to ``sources`` (``drawn``: records the loader drew,
a chunk at a time, the chunk it built ahead included; ``share``: of all draws), with
``realised_at_step``; before training there are none to report.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import torch

from .. import checkpoint as ckpt
from codechat.config.sft import SFTStageConfig
from codechat.config.stages import ConfigError, ModelConfig, replace, save_yaml, to_dict
from ..data.mixture import Mixture
from ..data.spec import missing_sources
from codechat.chat.budget import RenderedExample
from ..data.sft import SFTLoader, collate, preflight
from codechat.parallel.world import RankSlice, World, init_world
from ..data.batch import Batch
from ..model import GPT, IGNORE_INDEX, build_model
from codechat.config.atomic import write_text
from .plan_check import check_training_memory
from .init import resolve_init
from .trainer import Trainer
from .warmup import warm_compile_trainer


def fixed_examples_loss(examples: list[RenderedExample], pad_id: int, batch_size: int
                        ) -> Callable[[GPT], dict[str, float]]:
    """``eval_loss``: mean cross-entropy (nats) over the supervised tokens of a fixed set of examples.

    The examples are the first ones the preflight kept of ``sft.eval_data`` (held-out records: how
    the model generalises) or, without it, of the training data (whether the model fits what it is
    shown). Logged at step 0, every ``train.eval_every`` steps and at the end.
    """
    batches = [collate([[e] for e in examples[i:i + batch_size]], pad_id, 1, packed=False)
               for i in range(0, len(examples), batch_size)]

    def evaluate(model: GPT) -> dict[str, float]:
        device = next(model.parameters()).device
        total = sum(float(model(b.inputs.to(device), b.labels.to(device), reduction="sum")) for b in batches)
        return {"eval_loss": total / sum(int((b.labels != IGNORE_INDEX).sum()) for b in batches)}
    return evaluate


def run_sft(cfg: SFTStageConfig, *, show_progress: bool = True, deadline: float | None = None) -> dict[str, Any]:
    """Fine-tune ``cfg.init`` on ``cfg.sft.data``; returns the final metrics and the data report.
    ``deadline``: the trainer's wall-clock stop (:class:`~codechat.train.trainer.Trainer`), None for none.

    Raises:
        ConfigError: missing inputs (--init, --data sources, all named at once), max_length over the
            model's limit, or nothing supervised.
        CheckpointError: the init checkpoint cannot be read.
    """
    missing = missing_sources(cfg.sft.data) if cfg.sft.data else []
    missing += missing_sources(cfg.sft.eval_data, flag="--sft.eval_data") if cfg.sft.eval_data else []
    try:
        cfg.check_init()
    except ConfigError as e:
        missing.insert(0, str(e))
    if missing:
        raise ConfigError("; ".join(missing))
    out = Path(cfg.run.out)
    world = init_world(cfg.run.device, cfg.train.pp, cpu_collectives=cfg.train.cpu_offload)
    device = world.device
    show_progress = show_progress and world.main
    say = print if world.main else (lambda *a, **k: None)
    init_dir = resolve_init(cfg.init, out, world)
    model, tok, state = ckpt.load_model(init_dir, device)
    cfg = replace(cfg, sft=cfg.sft.for_model(model.cfg.max_seq_len, str(init_dir)))
    check_training_memory(model.cfg, cfg.train, cfg.optim, cfg.sft.max_length, device, echo=say, gpus=world.size,
                          gpus_per_node=world.local_size, parallel=cfg.train.parallel, ac=cfg.train.ac,
                          pp=cfg.train.pp, lora=cfg.lora if cfg.peft == "lora" else None)  # one line on CUDA only

    mixture = Mixture.from_config(cfg.sft, progress=say if show_progress else None)
    counts, examples = preflight(mixture, tok, cfg.sft, min(cfg.sft.preflight_examples, mixture.epoch_size))
    say(f"preflight on {counts.seen} records: kept {counts.kept} ({counts.prompt_truncated} prompt-truncated, "
          f"{counts.completion_truncated} completion-truncated), dropped {counts.n_dropped} {counts.dropped or ''}; "
          f"supervised tokens {counts.supervised_share:.1%} of {counts.tokens} (max_length {cfg.sft.max_length}, "
          f"max_prompt_length {cfg.sft.max_prompt_length})")
    if mixture.decontaminator:
        say(mixture.decontaminator.format_report())
    if counts.kept == 0 or counts.supervised_tokens == 0:
        prompts_only = "prompt-only records need a teacher's answers: give --teacher-completions " \
                       "DIR/completions.jsonl from `codechat distill`; " if "no_assistant_turn" in counts.dropped else ""
        raise ConfigError(f"nothing to train on: every one of {counts.seen} records was dropped ({counts.dropped}); "
                          f"{prompts_only}raise --sft.max_length / lower --sft.max_prompt_length or check the data "
                          "format with `codechat data inspect`")
    eval_set = examples[:cfg.sft.eval_examples]
    if cfg.sft.eval_data:
        held = Mixture.from_config(replace(cfg.sft, data=cfg.sft.eval_data))
        eval_counts, eval_set = preflight(held, tok, cfg.sft, min(cfg.sft.eval_examples, held.epoch_size))
        if not eval_set:
            raise ConfigError(f"--sft.eval_data {cfg.sft.eval_data}: none of its first {eval_counts.seen} records is "
                              f"kept ({eval_counts.dropped}); check it with `codechat data inspect`")
        say(f"eval_loss on {len(eval_set)} held-out examples of {cfg.sft.eval_data}")
    examples_per_epoch = mixture.epoch_size * counts.kept / counts.seen
    rows_per_example = (counts.tokens / counts.kept) / cfg.sft.max_length if cfg.sft.packing else 1.0
    rows_per_step = cfg.train.micro_batch_size * cfg.train.accum_steps(world.dp_size) * world.dp_size
    cfg = replace(cfg, train=cfg.train.with_epochs(examples_per_epoch * rows_per_example / rows_per_step))
    out.mkdir(parents=True, exist_ok=True)
    if world.main:
        save_yaml(cfg, out / "config.yaml")
    data_report = {"preflight": counts.as_dict(), "supervised_share": counts.supervised_share,
                   "examples_per_epoch": examples_per_epoch, "max_steps": cfg.train.max_steps,
                   "max_length": cfg.sft.max_length, "max_prompt_length": cfg.sft.max_prompt_length,
                   "sources": mixture.report(realised=False),
                   "decontamination": mixture.decontaminator.report() if mixture.decontaminator else None}
    if world.main:
        write_text(out / "data_report.json", json.dumps(data_report, indent=1, default=str))
    if show_progress:
        print(mixture.format_report(realised=False))

    # one global micro-batch (micro_batch_size rows per data-parallel rank), every rank taking its rows
    loader = SFTLoader(mixture, tok, cfg.sft, cfg.train.micro_batch_size * world.dp_size)
    trainer = Trainer(model.train(), train=cfg.train, optim=cfg.optim, run=cfg.run, batches=RankSlice(loader, world),
                      out_dir=out,
                      evaluate=fixed_examples_loss(eval_set, tok.end_id, cfg.train.micro_batch_size),
                      meta={"stage": "sft", "model": state["meta"]["model"], "config": to_dict(cfg),
                            "init": str(init_dir)},
                      tokenizer_dir=init_dir / "tokenizer", show_progress=show_progress, world=world,
                      deadline=deadline, lora=cfg.lora if cfg.peft == "lora" else None)
    try:
        result = trainer.fit()
    finally:  # the realised proportions exist only now (also after Ctrl-C)
        loader.settle()
        data_report.update(sources=mixture.report(), realised_at_step=trainer.step)
        if world.main:
            write_text(out / "data_report.json", json.dumps(data_report, indent=1, default=str))
        if show_progress:
            print(f"realised mixture after step {trainer.step}:\n{mixture.format_report()}")
    return {**result, "data": data_report, "rendered": loader.counts.as_dict(),
            "realised_sources": mixture.report(), "epochs": cfg.train.epochs or None,
            "steps_per_epoch": math.ceil(examples_per_epoch * rows_per_example / rows_per_step)}


def warm_compile(cfg: SFTStageConfig, model: ModelConfig) -> float:
    """Compile chat SFT's graphs for ``cfg`` (``train.compile`` on, ``sft.packing`` on) and a model of
    ``model``'s shape into torch's on-disk caches, on random weights and random packed rows
    (:func:`~codechat.train.warmup.warm_compile_trainer`): ``cfg``'s SFT from a checkpoint of that shape,
    run in another process, then loads the graphs it would compile. Packed rows are always
    ``max_length`` long (:class:`~codechat.data.sft.SFTLoader`), so one training step's shapes are
    every step's. ``cfg.init`` is not read. The speedrun calls it in a background process while it
    pretrains. Returns its wall time in seconds.

    Raises:
        ConfigError: ``cfg`` does not compile or does not pack, or runs under ``torchrun``.
    """
    if not cfg.sft.packing:
        raise ConfigError("sft warm_compile: --sft.packing is off, so every batch's length differs; "
                          "only packed rows have one shape to compile ahead")
    T, rows = cfg.sft.max_length or model.max_seq_len, cfg.train.micro_batch_size
    g = torch.Generator().manual_seed(0)

    def batch() -> Batch:
        """``rows`` packed rows of two documents each, the first half of each document a prompt."""
        inputs = torch.randint(0, model.vocab_size, (rows, T), generator=g)
        labels = torch.randint(0, model.vocab_size, (rows, T), generator=g)
        pos = torch.arange(T)
        doc_ids = (pos >= T // 2).long().expand(rows, T).contiguous()
        labels[:, (pos % (T // 2)) < T // 4] = IGNORE_INDEX
        return Batch(inputs, labels, doc_ids, rows * T)

    def build(world: World, tmp: Path) -> tuple[Trainer, list[Batch]]:
        trainer = Trainer(build_model(model, world.device).train(), train=cfg.train, optim=cfg.optim,
                          run=replace(cfg.run, out=str(tmp), resume=False), batches=None, out_dir=tmp,
                          meta={"stage": "sft"}, show_progress=False, world=world,
                          lora=cfg.lora if cfg.peft == "lora" else None)
        return trainer, [batch() for _ in range(cfg.train.accum_steps(world.dp_size))]
    return warm_compile_trainer(cfg.train, cfg.run.device, build)
