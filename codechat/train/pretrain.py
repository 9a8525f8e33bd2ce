"""Pretraining stage: token shards -> windows -> the shared trainer, with bits-per-byte validation."""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .. import checkpoint as ckpt
from codechat.config.stages import DataConfig, PretrainConfig, _check, check_init, replace, save_yaml, to_dict
from ..data.corpus import build_corpus, load_index, read_split
from ..data.sources import iter_split_texts
from ..data.windows import WindowLoader, eval_windows
from codechat.parallel.world import RankSlice, World, init_world, main_first
from ..model import GPT, build_model
from ..tokenizer import Tokenizer, train_tokenizer
from .plan_check import check_training_memory
from .init import resolve_init
from .trainer import Trainer
from .warmup import warm_compile_trainer


def bpb_evaluator(rows: torch.Tensor, token_bytes: torch.Tensor, batch_size: int) -> Callable[[GPT], dict[str, float]]:
    """Validation loss and bits per byte over fixed ``rows`` (N, T+1) int64 (:func:`bits_per_byte`)."""
    def evaluate(model: GPT) -> dict[str, float]:
        got = bits_per_byte(model, rows, token_bytes, batch_size)
        return {"val_loss": got["val_loss"], "val_bpb": got["val_bpb"]}
    return evaluate


def bits_per_byte(model: GPT, rows: torch.Tensor, token_bytes: torch.Tensor, batch_size: int,
                  deadline: float | None = None) -> dict[str, float]:
    """Validation loss and bits per byte of ``model`` over ``rows`` (N, T+1) int64, ``batch_size`` rows
    at a time, in order; with a ``deadline`` (``time.monotonic()``) no batch after the first starts
    once it has passed, so the figures cover a prefix of ``rows`` (order them with
    :func:`~codechat.data.windows.spread_order` to make any prefix an evenly spread sample).

    ``val_loss`` is the mean cross-entropy in nats over every target token. ``val_bpb`` is the
    summed loss over targets that are not special tokens, divided by ln 2 times the UTF-8 bytes
    those targets decode to (``token_bytes`` (V,) int64, 0 for special ids) — a measure that
    does not depend on the tokenizer. ``rows_scored`` and ``bytes_scored`` say what was covered.
    """
    device = next(model.parameters()).device
    nb_table = token_bytes.to(device)
    nats = torch.zeros((), dtype=torch.float64, device=device)
    nats_text = torch.zeros_like(nats)
    n_bytes = torch.zeros_like(nats)
    done = 0
    for i in range(0, len(rows), batch_size):
        if i and deadline is not None and time.monotonic() >= deadline:
            break
        r = rows[i:i + batch_size].to(device)
        x, y = r[:, :-1], r[:, 1:]
        loss = model(x, y, reduction="none").double()
        nb = nb_table[y]
        nats += loss.sum()
        nats_text += (loss * (nb > 0)).sum()
        n_bytes += nb.sum()
        done += len(r)
    return {"val_loss": float(nats) / (done * (rows.size(1) - 1)),
            "val_bpb": float(nats_text) / (math.log(2) * float(n_bytes)),
            "rows_scored": done, "bytes_scored": int(n_bytes)}


def prepare_data(data: DataConfig, out: Path, show_progress: bool = True) -> tuple[Path, Path]:
    """The tokenizer and token-shard directories of ``data``, building the defaults under ``out`` if unset."""
    tok_dir = Path(data.tokenizer_dir) if data.tokenizer_dir else out / "tokenizer"
    if not data.tokenizer_dir and not (tok_dir / "tokenizer.json").is_file():
        texts = iter_split_texts(data.sources, "train", extensions=data.extensions, val_fraction=data.val_fraction,
                                 max_files=data.max_files, max_bytes=data.tokenizer_max_bytes,
                                 text_fields=data.text_fields)
        train_tokenizer(texts, data.vocab_size, show_progress=show_progress).save(tok_dir)
    data_dir = Path(data.data_dir) if data.data_dir else out / "data"
    if not data.data_dir and not (data_dir / "index.json").is_file():
        build_corpus(data.sources, tok_dir, data_dir, extensions=data.extensions, val_fraction=data.val_fraction,
                     max_files=data.max_files, text_fields=data.text_fields, workers=data.workers,
                     show_progress=show_progress, quality=data.quality, quality_weights=data.quality_weights)
    return tok_dir, data_dir


def run_pretrain(cfg: PretrainConfig, *, show_progress: bool = True, budget_after_first_step: bool = False,
                 deadline: float | None = None) -> dict[str, Any]:
    """Train ``cfg`` end to end; returns the trainer's final metrics plus sizes. ``deadline``: the
    trainer's wall-clock stop (:class:`~codechat.train.trainer.Trainer`), None for none.

    ``budget_after_first_step``: ``train.time_budget_s`` leaves out the first step, where
    ``torch.compile`` compiles (:class:`~codechat.train.trainer.Trainer`'s option of that name).

    Raises:
        ValueError: the tokenizer and the shards disagree, or the data is too small.
        TrainingDiverged: the loss became NaN/inf.
    """
    out = Path(cfg.run.out)
    out.mkdir(parents=True, exist_ok=True)
    world = init_world(cfg.run.device, cfg.train.pp, cpu_collectives=cfg.train.cpu_offload)
    show_progress = show_progress and world.main
    torch.manual_seed(cfg.run.seed)
    init_dir = None
    if cfg.init:  # continued pretraining: the corpus is tokenised with the init's tokenizer
        check_init(cfg.init, "the checkpoint to continue pretraining")
        init_dir = resolve_init(cfg.init, out, world)
        cfg = replace(cfg, data=replace(cfg.data, tokenizer_dir=cfg.data.tokenizer_dir or str(init_dir / "tokenizer")))
    with main_first(world):  # rank 0 builds the default tokenizer and corpus; the others then read them
        tok_dir, data_dir = prepare_data(cfg.data, out, show_progress)
    tok = Tokenizer.load(tok_dir)
    init_model = ckpt.load_model(init_dir, world.device)[0].train() if init_dir else None
    if init_model is not None:
        _check(init_model.cfg.vocab_size == tok.vocab_size,
               f"--init {cfg.init} has {init_model.cfg.vocab_size} ids but --tokenizer {tok_dir} has {tok.vocab_size}; "
               "leave --tokenizer unset to use the init's")
        cfg = replace(cfg, model=init_model.cfg)
    index = load_index(data_dir)
    if index["vocab_size"] != tok.vocab_size:
        raise ValueError(f"{data_dir}/index.json was tokenised with a vocabulary of {index['vocab_size']} but "
                         f"{tok_dir} has {tok.vocab_size}: rebuild the corpus with this tokenizer")
    cfg = replace(cfg, model=replace(cfg.model, vocab_size=tok.vocab_size),
                  data=replace(cfg.data, data_dir=str(data_dir), tokenizer_dir=str(tok_dir)))
    token_bytes = torch.tensor(tok.token_byte_lengths(), dtype=torch.long)
    cfg, trainer = _trainer(cfg, world, read_split(data_dir, "train"), read_split(data_dir, "val"), token_bytes, out,
                            init_model=init_model, meta={"init": str(init_dir)} if init_dir else {},
                            tokenizer_dir=tok_dir, show_progress=show_progress,
                            budget_after_first_step=budget_after_first_step, deadline=deadline)
    model = trainer.model
    result = trainer.fit()
    return {**result, "params": model.num_params(), "flops_per_token": model.flops_per_token(cfg.data.seq_len),
            "train_tokens": index["splits"]["train"]["tokens"], "device": str(world.device)}


def _trainer(cfg: PretrainConfig, world: World, train: Sequence[np.ndarray], val: Sequence[np.ndarray],
             token_bytes: torch.Tensor, out: Path, *, init_model: GPT | None = None, meta: dict[str, Any],
             echo: Callable[[str], None] = print, **kwargs: Any) -> tuple[PretrainConfig, Trainer]:
    """``cfg`` with its epochs set, and the :class:`Trainer` of ``cfg`` over token shards ``train`` and
    ``val``, scoring bits per byte with ``token_bytes`` (V,) int64; ``kwargs`` go to the trainer."""
    rows = cfg.train.micro_batch_size * world.dp_size  # one global micro-batch, every data-parallel rank taking its rows
    loader = WindowLoader(train, cfg.data.seq_len, rows, seed=cfg.run.seed)
    cfg = replace(cfg, train=cfg.train.with_epochs(loader.n_windows / (rows * cfg.train.accum_steps(world.dp_size))))
    if world.main:
        save_yaml(cfg, out / "config.yaml")
    check_training_memory(cfg.model, cfg.train, cfg.optim, cfg.data.seq_len, world.device,
                          echo=echo if world.main else (lambda _: None), gpus=world.size, gpus_per_node=world.local_size,
                          parallel=cfg.train.parallel, ac=cfg.train.ac, pp=cfg.train.pp,
                          lora=cfg.lora if cfg.peft == "lora" else None)  # one line on CUDA only
    model = init_model if init_model is not None else build_model(cfg.model, world.device)
    val_rows = eval_windows(val, cfg.data.seq_len, cfg.train.eval_tokens)
    return cfg, Trainer(model, train=cfg.train, optim=cfg.optim, run=cfg.run, batches=RankSlice(loader, world),
                        out_dir=out, evaluate=bpb_evaluator(val_rows, token_bytes, cfg.train.micro_batch_size),
                        meta={"stage": "pretrain", "model": to_dict(cfg.model), "config": to_dict(cfg), **meta},
                        world=world, lora=cfg.lora if cfg.peft == "lora" else None, **kwargs)


def warm_compile(cfg: PretrainConfig, vocab_size: int) -> float:
    """Compile pretraining's graphs for ``cfg`` (``train.compile`` on, a vocabulary of ``vocab_size``)
    into torch's on-disk caches on random tokens (:func:`~codechat.train.warmup.warm_compile_trainer`):
    the same config trained in another process then loads what it would compile. The speedrun calls
    it in a background process while it builds its tokenizer and corpus. Returns its wall time in seconds.

    Raises:
        ConfigError: ``cfg`` does not compile, or runs under ``torchrun``.
    """
    T, rows = cfg.data.seq_len, cfg.train.micro_batch_size
    rng = np.random.default_rng(0)
    windows = max(2 * rows, -(-cfg.train.eval_tokens // T)) + 1  # as many evaluation rows as a real split gives
    shard = lambda: rng.integers(0, vocab_size, size=windows * (T + 1), dtype=np.int64)  # noqa: E731

    def build(world: World, tmp: Path) -> tuple[Trainer, list]:
        run_cfg = replace(cfg, model=replace(cfg.model, vocab_size=vocab_size),
                          run=replace(cfg.run, out=str(tmp), resume=False))
        run_cfg, trainer = _trainer(run_cfg, world, [shard()], [shard()], torch.ones(vocab_size, dtype=torch.long),
                                    tmp, meta={}, echo=lambda _: None, show_progress=False)
        return trainer, [trainer.batches.next_batch() for _ in range(run_cfg.train.accum_steps(world.dp_size))]
    return warm_compile_trainer(cfg.train, cfg.run.device, build)
