"""The speedrun's background work: what runs in other processes beside the stages.

On a GPU, from the corpus stage on: the compression baselines, the chat-SFT pairs mined from the
corpus and, with RL planned, the RL pool's doctest and input/output tasks, at the lowest CPU
priority (they take the cores the stages leave idle). From the start, on one GPU: the compile
warm-ups (:mod:`codechat.train.warmup`) of pretraining, which compiles the model into torch's
on-disk caches on random tokens while the tokenizer and the corpus are built, then of chat SFT,
while pretraining runs; so that each stage's first step loads its graphs instead of compiling
them. :class:`BackgroundJobs` is a part of :class:`codechat.speedrun.run.Speedrun`.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from codechat.config.stages import replace
from codechat.speedrun.baselines import validation_baselines
from codechat.speedrun.plan import SpeedrunPlan
from codechat.train import sft
from codechat.train.pretrain import warm_compile

#: The background jobs' ``os.nice`` increment (19: the lowest priority): they use cores the stages leave idle.
BACKGROUND_NICENESS = 19


class BackgroundJobs:
    """The background jobs of :class:`~codechat.speedrun.run.Speedrun`, which provides ``p`` (the plan),
    ``m`` (the metrics), ``run``, ``dev``, ``data_cfg``, ``doctest_file``, ``_mined_files()``,
    ``_compile_for()``, ``_pretrain_cfg()`` and ``_sft_warmup_cfg()``, and sets the attributes below to
    None and [] at first; the stages collect the jobs' futures."""

    p: SpeedrunPlan
    m: dict[str, Any]
    run: Path
    _baselines: Future | None  # the baselines being computed in another process
    _mining: Future | None  # the SFT pairs being mined in another process
    _doctests: Future | None  # the RL pool's doctest and input/output tasks being mined in another process
    _warmup: Future | None  # pretraining's compile warm-up in another process
    _sft_warmup: Future | None  # chat SFT's, in the same process after it
    _background_procs: list[mp.process.BaseProcess]  # the processes of the jobs but the warm-ups
    _warmup_procs: list[mp.process.BaseProcess]  # the warm-ups' process

    def _start_background(self) -> None:
        """Compute the baselines, mine the SFT pairs (into :meth:`_mined_files`) and, with RL planned, the RL
        pool's doctest and input/output tasks of every corpus source (into :attr:`doctest_file`) in spawned
        processes; the ``baseline``, ``sft`` and ``rl`` stages collect them."""
        from codechat.data.io_tasks import write_corpus_tasks
        from codechat.data.mining import write_mined
        p = self.p
        # at the lowest CPU priority (their sandboxes too): the pretraining beside them compiles its model
        # first (its first step took 46-50 s of a 179-238 s budget with them running: H100, 8a79860)
        pool = ProcessPoolExecutor(3 if p.rl else 2, mp_context=mp.get_context("spawn"), initializer=os.nice,
                                   initargs=(BACKGROUND_NICENESS,))
        self._baselines = pool.submit(validation_baselines, self.run)
        self._mining = pool.submit(write_mined, [src for src, _ in p.mine_parts], self._mined_files(),
                                   max_files=p.max_files, style=p.sft_mine_style,
                                   workers=p.background_mine_workers or max(1, (os.cpu_count() or 2) // 2))
        if p.rl:  # without RL its sandbox workers would only take cores from pretraining and SFT
            self._doctests = pool.submit(write_corpus_tasks, list(p.sources), self.doctest_file,
                                         max_files=p.max_files, mbpp_file=p.mbpp or None,
                                         workers=max(1, (os.cpu_count() or 2) // 4), io_max_tasks=p.rl_io_tasks)
        self._background_procs = _detach(pool)

    def _end_background(self) -> None:
        """Stop the background jobs now (a stopped or interrupted run): at exit Python would otherwise wait
        for them. Their outputs are written whole or not at all, and a resumed run redoes what is missing."""
        procs, self._background_procs = self._background_procs + self._warmup_procs, []
        self._warmup_procs = []
        self._baselines = self._mining = self._doctests = self._warmup = self._sft_warmup = None  # the stages
        # compute what they need
        _terminate(procs)

    def _start_warmup(self) -> None:
        """On one GPU, with pretraining still to run (the caller checks) and compiled: compile its graphs
        into torch's caches in a background process (:func:`~codechat.train.pretrain.warm_compile`) while
        the tokenizer and the corpus are built, then, with chat SFT planned compiled, SFT's
        (:func:`~codechat.train.sft.warm_compile`) while pretraining runs; so that each stage's first
        step loads them instead of compiling."""
        p = self.p
        train_s = p.pretrain_train_share * p.planned_s()["pretrain"]
        if self.dev.type != "cuda" or "WORLD_SIZE" in os.environ or not self._compile_for(train_s, p.compile_estimate_s):
            return
        cfg = self._pretrain_cfg(train_s, True, data=False)
        pool = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"))
        self._warmup = pool.submit(warm_compile, cfg, self.data_cfg.vocab_size)
        if (sft_cfg := self._sft_warmup_cfg(cfg)) is not None:  # the same process, once pretraining's is done
            self._sft_warmup = pool.submit(sft.warm_compile, sft_cfg,
                                           replace(cfg.model, vocab_size=self.data_cfg.vocab_size))
        self._warmup_procs = _detach(pool)

    def _wait_warmup(self, stage: str, at_most_s: float | None = None) -> dict[str, Any]:
        """Wait for ``stage``'s compile warm-up (``pretrain`` or ``sft``), at most ``at_most_s`` (default
        ``compile_estimate_s``; a warm-up still compiling then would only compete with the stage's own
        compile: it is stopped, and with it any warm-up after it); what it did, for the metrics."""
        if stage == "pretrain":
            job, self._warmup = self._warmup, None
        else:
            job, self._sft_warmup = self._sft_warmup, None
        t0 = time.monotonic()
        try:
            return {"done": True, "warmup_s": job.result(timeout=at_most_s or self.p.compile_estimate_s),
                    "waited_s": time.monotonic() - t0}
        except FutureTimeout:
            _terminate(self._warmup_procs)
            self._sft_warmup = None
            return {"done": False, "waited_s": time.monotonic() - t0}
        except Exception as e:  # the stage compiles as it would have
            print(f"{stage}: the compile warm-up failed ({type(e).__name__}: {e}); compiling in the stage")
            return {"done": False, "error": f"{type(e).__name__}: {e}", "waited_s": time.monotonic() - t0}


def _detach(pool: ProcessPoolExecutor) -> list[mp.process.BaseProcess]:
    """Shut ``pool`` down without waiting (its processes end after their jobs) and return its processes,
    started by the first submit (spawn): the executor forgets them at shutdown and has no public
    terminate before Python 3.14, so :func:`_terminate` needs them."""
    procs = list(pool._processes.values())
    pool.shutdown(wait=False)
    return procs


def _terminate(procs: list[mp.process.BaseProcess]) -> None:
    """Stop the processes of ``procs`` still running."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
