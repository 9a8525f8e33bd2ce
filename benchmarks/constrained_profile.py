"""Where a grammar-constrained engine step's time goes (issue 45): host sections and the GPU's share.

The ``one_schema`` arm of ``constrained_decode.py`` (``--rows`` rows under one tool's grammar,
temperature 1, a finished row replaced at once by the next; random weights of ``--preset``, the
stdlib BPE as the grammar's tokenizer), run once untimed (compilation, graph capture), then for
``--steps`` engine steps with wall-clock timers around the engine's parts:

- ``fill``: computing the rows' token masks (``grammar.fill_rows``, llguidance, on the CPU), in
  decode launches and in prefills;
- ``consume``: advancing the rows' matchers by their sampled tokens (``GrammarMatcher.consume``);
- ``drain``: reading launches back (waiting for the GPU included), ``consume`` excluded;
- ``launch``: launching the masked decode step (the mask's copy and the graph replay), ``fill`` excluded;
- ``admit``: admitting replacement rows (the first token's masks, options and sampling), ``fill`` and
  ``prefill`` excluded;
- ``prefill``: the packed prefill's forward pass (``Engine._prefill_run``: a graph replay on CUDA);

each in milliseconds per step, with the whole step's. Then ``--profile-steps`` steps under the
torch profiler: the GPU's busy time per step (kernels, summed) against the step's wall time, and
the host operations with the most CPU time, and each section's CPU time under the profiler (its
``section.NAME`` range). ``--trace FILE`` writes that Chrome trace (gzipped when FILE ends in ``.gz``).

    PYTHONPATH=. python benchmarks/constrained_profile.py --preset d20 --rows 64
    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/constrained_profile.py --preset tiny --vocab-size 1024
        --device cpu --rows 4 --new-tokens 64 --prompt-len 8 --steps 20 --profile-steps 5   # (one line) CPU smoke
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from codechat.engine import Request, SamplingConfig
from codechat.engine import grammar as grammar_mod
from codechat.engine import scheduler as scheduler_mod
from codechat.tokenizer import Tokenizer

from constrained_decode import TOOLS, build, stdlib_tokenizer  # benchmarks/, beside this script

SECTIONS = ("fill", "consume", "drain", "launch", "admit", "prefill")


class Timers:
    """Nested wall-clock sections: a section's time excludes the sections opened inside it."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self._stack: list[list[Any]] = []  # [name, start, time of inner sections]

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        self._stack.append([name, time.perf_counter(), 0.0])
        try:
            with torch.profiler.record_function(f"section.{name}"):  # a range in the profile and trace
                yield
        finally:
            _, t0, inner = self._stack.pop()
            dt = time.perf_counter() - t0
            self.total[name] += dt - inner
            if self._stack:
                self._stack[-1][2] += dt


def instrument(engine: Any, timers: Timers) -> None:
    """Wrap the engine's parts (module docstring) in ``timers`` sections (this engine and the
    grammar module's functions; nothing else changes)."""
    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **k: Any) -> Any:
            with timers.section(name):
                return fn(*a, **k)
        return timed
    scheduler_mod.fill_rows = wrap("fill", grammar_mod.fill_rows)
    consume = grammar_mod.GrammarMatcher.consume
    grammar_mod.GrammarMatcher.consume = wrap("consume", consume)  # type: ignore[method-assign]
    engine._drain = wrap("drain", engine._drain)
    engine._launch_decode = wrap("launch", engine._launch_decode)
    engine._admit = wrap("admit", engine._admit)
    engine._prefill_run = wrap("prefill", engine._prefill_run)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="d20")
    ap.add_argument("--vocab-size", type=int, default=32768)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200, help="engine steps timed by the section timers")
    ap.add_argument("--profile-steps", type=int, default=30, help="engine steps under the torch profiler")
    ap.add_argument("--tokenizer", default="")
    ap.add_argument("--tokenizer-bytes", type=int, default=8_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--decode-steps", type=int, default=0)
    ap.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--trace", default="", help="write the profiled steps' Chrome trace here")
    ap.add_argument("--out", default="", help="write the figures as JSON here (default $OUT/constrained_profile.json)")
    args = ap.parse_args()
    from codechat.chat.strict import tool_grammar
    from codechat.engine.grammar import GrammarCompiler

    model, engine, device, prompts = build(args)
    cuda = device.type == "cuda"
    tok = Tokenizer.load(args.tokenizer) if args.tokenizer else stdlib_tokenizer(model.cfg.vocab_size, args.tokenizer_bytes)
    grammar = tool_grammar(GrammarCompiler(tok, model.cfg.vocab_size), [TOOLS[0]], "required")
    sc = SamplingConfig(max_new_tokens=args.new_tokens, temperature=1.0, top_k=0, top_p=1.0)
    started = 0

    def submit() -> None:
        nonlocal started
        engine.add(Request(prompts[started % args.rows], sc, seed=args.seed + started, grammar=grammar))
        started += 1

    def run(steps: int) -> tuple[float, int, int]:
        """``steps`` engine steps keeping ``--rows`` rows running: (seconds, tokens, rows finished)."""
        tokens = finished = 0
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            for ev in engine.step():
                tokens += 1
                if ev.finish is not None:
                    finished += 1
                    engine.pop(ev.request)
                    submit()
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0, tokens, finished

    for _ in range(args.rows):
        submit()
    run(max(args.steps // 2, 20))  # warm-up: compilation, every bucket's graph
    timers = Timers()
    instrument(engine, timers)
    seconds, tokens, finished = run(args.steps)
    per_step = {k: timers.total[k] / args.steps * 1e3 for k in SECTIONS}
    step_ms = seconds / args.steps * 1e3
    figures: dict[str, Any] = {"step_ms": step_ms, "tokens_per_step": tokens / args.steps,
                               "rows_finished_per_step": finished / args.steps, "tok_s": tokens / seconds,
                               **{f"{k}_ms": v for k, v in per_step.items()}}
    figures["other_ms"] = step_ms - sum(per_step.values())
    print(f"{args.steps} steps: {step_ms:.2f} ms a step, {tokens / args.steps:.1f} tokens a step "
          f"({tokens / seconds:,.0f} tok/s), {finished / args.steps:.2f} rows finished (and replaced) a step")
    for k in (*SECTIONS, "other"):
        print(f"  {k:8s} {figures[f'{k}_ms']:7.2f} ms a step")

    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        p_seconds, _, _ = run(args.profile_steps)
    events = prof.key_averages()
    # the sections' ranges also show on the GPU's timeline (as annotations spanning kernels): not kernels
    gpu_us = sum(e.self_device_time_total for e in events
                 if e.device_type == torch.autograd.DeviceType.CUDA and not e.key.startswith("section."))
    figures["profiled_step_ms"] = p_seconds / args.profile_steps * 1e3
    figures["gpu_busy_ms"] = gpu_us / 1e3 / args.profile_steps
    print(f"under the profiler: {figures['profiled_step_ms']:.2f} ms a step, the GPU busy "
          f"{figures['gpu_busy_ms']:.2f} ms of it (kernels summed)")
    print(events.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60))
    if cuda:
        print(events.table(sort_by="self_cuda_time_total", row_limit=15, max_name_column_width=60))
    ranges = {e.key: e.cpu_time_total / 1e3 / args.profile_steps for e in events if e.key.startswith("section.")}
    print("under the profiler, ms a step (CPU, inner sections included): "
          + ", ".join(f"{k.removeprefix('section.')} {v:.2f}" for k, v in sorted(ranges.items())))
    if args.trace:
        raw = args.trace.removesuffix(".gz")
        prof.export_chrome_trace(raw)
        if raw != args.trace:
            with open(raw, "rb") as f, gzip.open(args.trace, "wb") as g:
                g.write(f.read())
            os.remove(raw)
        print(f"wrote {args.trace}")
    out = args.out or (str(Path(os.environ["OUT"]) / "constrained_profile.json") if os.environ.get("OUT") else "")
    if out:
        Path(out).write_text(json.dumps({"settings": vars(args), "figures": figures}, indent=2))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
