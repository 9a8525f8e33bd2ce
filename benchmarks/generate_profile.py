"""Where a decode step's time goes: the kernels of one captured step, summed by name (CUDA).

Random weights of ``--preset``, ``--batch`` greedy rows of ``--prompt-len`` tokens; after one
warm-up generation (graph capture, compilation) it prints

- the replay time of the batch's decode graph alone (forward pass, sampling and the rows' state
  update; CUDA events over ``--replays`` replays),
- the whole engine step (graph + host bookkeeping + copies back) from a timed generation,
- a table of kernel time per replay, largest first (torch profiler over ``--replays`` replays):
  microseconds per step, calls per step, microseconds per call, kernel name;
- the timeline of a whole generation of ``--new`` tokens (torch profiler, CPU and CUDA): the
  prefill's wall time (first kernel to the first decode graph), each decode step's wall time and
  the share of it the GPU runs kernels (the rest is the GPU waiting on the host), and the host
  ops that take the most CPU time (self time per step). ``--trace FILE`` also writes the
  Chrome trace.

    python benchmarks/generate_profile.py --preset d20 --batch 64
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from codechat.config.stages import preset
from codechat.engine import Engine, EngineConfig, Request, SamplingConfig
from codechat.model import build_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="d20")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--attention", default="auto", choices=["auto", "triton", "flash", "sdpa"])
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--top", type=int, default=25, help="kernels listed")
    ap.add_argument("--trace", help="write the Chrome trace of the timed generation here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("generate_profile.py needs CUDA (it profiles CUDA graphs)")
    torch.manual_seed(0)
    model = build_model(preset(args.preset, vocab_size=32768), "cuda").eval()
    b = args.batch
    engine = Engine(model, EngineConfig(slots=b, max_len=args.prompt_len + args.new + 1, attention=args.attention,
                                        compile=not args.no_compile))
    reqs = [Request(torch.randint(0, 32768, (args.prompt_len,)).tolist(), SamplingConfig(args.new, temperature=0.0))
            for _ in range(b)]
    engine.generate(reqs)
    torch.cuda.synchronize()
    t = time.perf_counter()
    engine.generate(reqs)
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t) / args.new * 1e3
    graph, _ = next(v for key, v in engine.graphs.items() if key[0] == b and key[-1] == "free")
    engine.active.zero_()  # replays below recompute the last step without moving any row on
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    print(f"{args.preset} batch {b}, decode attention {engine.model.decode_backend}: graph replay "
          f"{start.elapsed_time(end) / args.replays:.3f} ms; whole engine step {step_ms:.3f} ms (prefill included)")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.replays):
            graph.replay()
        torch.cuda.synchronize()
    total: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            total[ev.name][0] += 1
            total[ev.name][1] += ev.device_time_total
    rows = sorted(total.items(), key=lambda kv: -kv[1][1])
    print(f"{'us/step':>9} {'calls':>6} {'us/call':>8}  kernel")
    for name, (n, us) in rows[:args.top]:
        print(f"{us / args.replays:9.1f} {n / args.replays:6.0f} {us / n:8.2f}  {name[:100]}")
    print(f"{sum(v[1] for v in total.values()) / args.replays:9.1f} us of kernels per step, "
          f"{sum(v[0] for v in total.values()) / args.replays:.0f} kernels")
    timeline(engine, reqs, args)


def timeline(engine: Engine, reqs: list[Request], args: argparse.Namespace) -> None:
    """Print where a whole generation's wall time goes (see the module docstring)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.generate(reqs)
        torch.cuda.synchronize()
    if args.trace:
        prof.export_chrome_trace(args.trace)
    kernels = sorted((ev.time_range.start, ev.time_range.end) for ev in prof.events()
                     if ev.device_type == torch.autograd.DeviceType.CUDA)
    launches = sorted(ev.time_range.start for ev in prof.events() if ev.name == "cudaGraphLaunch")
    if not kernels or len(launches) < 2:
        print("timeline: no decode graph launches seen")
        return
    first, last = kernels[0][0], kernels[-1][1]
    end, decode_busy = first, 0.0
    for a, b in kernels:  # the union of the decode steps' kernel intervals
        a = max(a, end, launches[0])
        if b > a:
            decode_busy += b - a
            end = b
    span = last - launches[0]
    steps = len(launches)
    print(f"timeline of one generation ({len(reqs)} rows x {args.new} new): prefill {(launches[0] - first) / 1e3:.2f} ms, "
          f"{steps} decode steps of {span / steps:.1f} us wall, GPU busy {decode_busy / span:.1%} of it "
          f"({decode_busy / steps:.1f} us a step)")
    cpu = defaultdict(float)
    for ev in prof.key_averages():
        if ev.device_type == torch.autograd.DeviceType.CPU:
            cpu[ev.key] += ev.self_cpu_time_total
    print(f"{'cpu us/step':>11}  host op (self time)")
    for name, us in sorted(cpu.items(), key=lambda kv: -kv[1])[:15]:
        print(f"{us / steps:11.1f}  {name[:90]}")


if __name__ == "__main__":
    main()
