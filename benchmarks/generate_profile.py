"""Where a decode step's time goes: the kernels of one captured step, summed by name (CUDA).

Random weights of ``--preset``, ``--batch`` greedy rows of ``--prompt-len`` tokens; after one
warm-up generation (graph capture, compilation) it prints

- the replay time of the batch's decode graph alone (CUDA events over ``--replays`` replays),
- the whole engine step (graph + sampling + bookkeeping) from a timed generation,
- a table of kernel time per replay, largest first (torch profiler over ``--replays`` replays):
  microseconds per step, calls per step, microseconds per call, kernel name.

    python benchmarks/generate_profile.py --preset d20 --batch 64
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from codechat.config import preset
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
    graph, _ = engine.graphs[b]
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


if __name__ == "__main__":
    main()
