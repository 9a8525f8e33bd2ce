"""The engine alone on ``serve_load.py``'s work: the baselines a server round is measured against
(the same prompts as one batch, and as a closed loop of clients without HTTP), and the engine's step
timeline from two snapshots of its counters. ``serve_load.py``'s docstring says what each figure means."""
from __future__ import annotations

import argparse
import gzip
import os
import shutil
import time
from pathlib import Path
from typing import Callable

import torch

from codechat import checkpoint as ckpt
from codechat.chat.conversation import Conversation, Message, render_for_completion
from codechat.config.device import resolve_device
from codechat.engine import Engine, EngineConfig, Request, SamplingConfig


def timeline(before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, float]:
    """The engine's step timeline over ``wall`` seconds, from two snapshots of its
    :class:`~codechat.engine.rows.StepCounters` (module docstring: ``busy`` ... ``deliver_ms_step``)."""
    d = {k: after[k] - before[k] for k in after}
    steps, launches, prefills = max(d["steps"], 1), max(d["launches"], 1), max(d["prefills"], 1)
    out = {"busy": d["step_s"] / wall, "steps": d["steps"], "rows_per_launch": d["launch_rows"] / launches,
           "prefills": d["prefills"], "rows_per_prefill": d["prefill_rows"] / prefills,
           "step_ms": 1e3 * d["step_s"] / steps, "wait_ms_step": 1e3 * d["wait_s"] / steps,
           "admit_ms_step": 1e3 * d["admit_s"] / steps,
           "host_ms_step": 1e3 * (d["step_s"] - d["wait_s"] - d["admit_s"]) / steps}
    if "idle_s" in d:  # the server's engine thread
        out |= {"idle": d["idle_s"] / wall, "deliver_ms_step": 1e3 * d["deliver_s"] / steps}
    return out


def engine_baseline(model_dir: Path, messages: list[str], args: argparse.Namespace,
                    cores: list[int]) -> dict[int, dict[str, float]]:
    """Tokens/s (and the step timeline) of the engine alone: per concurrency C, C prompts in one generate
    call, --requests times;
    on the server's ``cores`` (with as many CPU threads) when it was pinned, so both use the same cores."""
    if cores:
        os.sched_setaffinity(0, cores)
        torch.set_num_threads(len(cores))
    model, tok, _ = ckpt.load_model(model_dir, resolve_device(args.device))
    engine = Engine(model, EngineConfig(slots=args.slots))
    ids = [render_for_completion(tok, Conversation((Message("user", m),))) for m in messages]
    cfg = SamplingConfig(args.new_tokens, 0.0, 0, 1.0)
    sync = torch.cuda.synchronize if engine.cuda else (lambda: None)
    engine.generate([Request(p, cfg, stop_ids=sorted(tok.special_ids)) for p in ids[:max(args.concurrency)]])

    def clients(c: int) -> list[list[Request]]:  # client k's requests, as the server's rounds send them
        return [[Request(ids[(k * args.requests + r) % len(ids)], cfg, stop_ids=sorted(tok.special_ids))
                 for r in range(args.requests)] for k in range(c)]

    out = {}
    for c in args.concurrency:
        sync()
        t0, done, before = time.perf_counter(), 0, engine.counters.as_dict()
        for r in range(args.requests):
            batch = [Request(ids[(k * args.requests + r) % len(ids)], cfg, stop_ids=sorted(tok.special_ids))
                     for k in range(c)]
            done += sum(len(s[0].token_ids) for s in engine.generate(batch))
        sync()
        wall = time.perf_counter() - t0
        out[c] = {"tokens_s": done / wall} | timeline(before, engine.counters.as_dict(), wall)
        sync()
        t0, before = time.perf_counter(), engine.counters.as_dict()
        done = closed_loop(engine, clients(c))
        sync()
        wall = time.perf_counter() - t0
        out[c] |= {f"loop_{k}": v for k, v in
                   ({"tokens_s": done / wall} | timeline(before, engine.counters.as_dict(), wall)).items()}
    if args.trace:
        c = max(args.concurrency)
        out[c]["loop_profiled_gpu_busy"] = profile_loop(engine, lambda: closed_loop(engine, clients(c)), args.trace)
    return out


def profile_loop(engine: Engine, loop: Callable[[], int], trace: str) -> float:
    """Run ``loop`` once under torch's profiler; print its top operations, write the Chrome trace to
    ``trace`` (gzipped when it ends in .gz) and return the device's busy share: its kernels' time,
    summed, over the loop's wall time (under the profiler; 0 off CUDA)."""
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if engine.cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        t0 = time.perf_counter()
        loop()
        if engine.cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    busy = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA) / 1e6
    print(f"# the closed loop under the profiler: {wall:.3f} s, the device busy {busy:.3f} s of it "
          f"({busy / wall:.1%}, kernels summed)")
    print(events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70))
    if engine.cuda:
        print(events.table(sort_by="self_cuda_time_total", row_limit=15, max_name_column_width=70))
    raw = trace.removesuffix(".gz")
    prof.export_chrome_trace(raw)
    if trace.endswith(".gz"):
        with open(raw, "rb") as f, gzip.open(trace, "wb") as g:
            shutil.copyfileobj(f, g)
        os.remove(raw)
    return busy / wall


def closed_loop(engine: Engine, clients: list[list[Request]]) -> int:
    """The server's arrival pattern without the server: each client's requests one after another, the
    next added to the engine in the step its last finished (no HTTP, no turnaround); returns the
    tokens generated. Against the one-batch baseline this prices the admissions of rows joining a
    running batch; against ``serve``, the HTTP front end and the clients' turnaround. (Requests of equal
    lengths stay in step here: on an H100 the loop made the one batch's tokens/s, twelfth session.)"""
    todo = [list(reversed(reqs)) for reqs in clients]
    owner = {engine.add(todo[k].pop()): k for k in range(len(todo)) if todo[k]}
    done = 0
    while engine.has_work():
        for t in engine.step():
            if t.finish is not None and engine.done(t.request):
                done += sum(len(s.token_ids) for s in engine.pop(t.request))
                k = owner.pop(t.request)
                if todo[k]:
                    owner[engine.add(todo[k].pop())] = k
    return done
