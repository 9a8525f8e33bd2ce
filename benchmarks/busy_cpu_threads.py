"""Training tokens/s on the CPU, idle and beside busy loops, with OpenMP's default spinning and with threads
that sleep at once (``GOMP_SPINCOUNT=0``, what ``codechat`` sets on a busy machine: codechat/config/threads.py).

Each configuration runs in a fresh process (OpenMP reads its settings once): the ``tiny`` preset's model,
forward + backward + AdamW on random tokens (its micro-batch x sequence length), 3 warm-up steps, then
``--steps`` timed. The busy loops are ``--busy`` processes spinning in pure Python. Prints tokens/s per
configuration (the median of ``--repeats``) and the ratios against the default in the same condition.

    python benchmarks/busy_cpu_threads.py --busy 2 --repeats 3
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time

STEP = """
import json, sys, time, torch
from dataclasses import replace
from codechat.config.stages import pretrain_recipe
from codechat.model import build_model
torch.set_num_threads(int(sys.argv[1]))
cfg = pretrain_recipe("tiny")
model = build_model(replace(cfg.model, vocab_size=4096), torch.device("cpu"))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
b, t = cfg.train.micro_batch_size, cfg.data.seq_len
x, y = torch.randint(0, 4096, (b, t)), torch.randint(0, 4096, (b, t))
def step():
    (model(x, y, reduction="sum") / y.numel()).backward()
    opt.step()
    opt.zero_grad()
for _ in range(3):
    step()
t0 = time.perf_counter()
for _ in range(int(sys.argv[2])):
    step()
print(json.dumps({"tokens_per_s": int(sys.argv[2]) * b * t / (time.perf_counter() - t0)}))
"""


def _spin() -> None:
    while True:
        pass


def measure(threads: int, spin: str | None, steps: int) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update({"GOMP_SPINCOUNT": spin} if spin is not None else {})
    out = subprocess.run([sys.executable, "-c", STEP, str(threads), str(steps)], capture_output=True, text=True,
                         env=env, check=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])["tokens_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy", type=int, default=2, help="busy loops beside the loaded runs (default 2)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run (default 10)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per configuration, median reported (default 3)")
    args = ap.parse_args()
    configs = (("2 threads, default spinning", 2, None), ("2 threads, GOMP_SPINCOUNT=0", 2, "0"),
               ("1 thread", 1, None))
    results = {}
    for condition in ("idle", f"beside {args.busy} busy loops"):
        loops = [mp.Process(target=_spin, daemon=True) for _ in range(args.busy if condition != "idle" else 0)]
        for p in loops:
            p.start()
        time.sleep(1 if loops else 0)
        try:
            for _ in range(args.repeats):  # interleaved, so a drift in the machine's speed hits every config
                for name, threads, spin in configs:
                    results.setdefault((condition, name), []).append(measure(threads, spin, args.steps))
        finally:
            for p in loops:
                p.terminate()
        base = statistics.median(results[(condition, configs[0][0])])
        print(f"{condition}:")
        for name, _, _ in configs:
            runs = results[(condition, name)]
            print(f"  {name:30s} {statistics.median(runs):8,.0f} tokens/s (runs {', '.join(f'{r:,.0f}' for r in runs)})"
                  f"  x{statistics.median(runs) / base:.2f} the default")


if __name__ == "__main__":
    main()
