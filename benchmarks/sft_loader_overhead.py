"""What the SFT loader costs a training loop whose host thread is busy: the loop's time against the same loop fed
prebuilt micro-batches (the baseline, measured in the same run).

Each step stands for a training step on a GPU: ``--busy-ms`` of Python holding the GIL (kernel launches, the
optimizer's bookkeeping), then ``--wait-ms`` with the GIL released (waiting for the device), then ``next_batch``.
The loader builds its next chunk (render, encode, pack) in a thread meanwhile; whatever of that holds the GIL, and
each step's ``collate``, shows as time above the baseline. In the twenty-eighth session's 9-minute runs on an H100
chat SFT stood ~0.6 s at every chunk (~10 s of 54), which this reproduces on a CPU (``benchmarks/RESULTS.md``).

    python benchmarks/sft_loader_overhead.py --data "mined.jsonl#completion:1,code_alpaca_2k.json:1,mbpp.jsonl#mbpp:3" \
        --tokenizer runs/tiny/tokenizer --steps 200
"""
from __future__ import annotations

import argparse
import time

from codechat.config.sft import SFTConfig
from codechat.data.mixture import Mixture
from codechat.data.sft import SFTLoader
from codechat.tokenizer import Tokenizer


def step_loop(next_batch, steps: int, busy_s: float, wait_s: float) -> tuple[float, float]:
    """(seconds for ``steps`` steps, the longest step in seconds)."""
    longest = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        s = time.perf_counter()
        x = 0
        while time.perf_counter() - s < busy_s:  # Python work: the GIL is held
            for _ in range(200):
                x += 1
        time.sleep(wait_s)  # the device's turn: the GIL is free
        next_batch()
        longest = max(longest, time.perf_counter() - s)
    return time.perf_counter() - t0, longest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="an SFT data spec, as --sft.data")
    ap.add_argument("--tokenizer", required=True, help="a codechat tokenizer directory")
    ap.add_argument("--micro-batch-size", type=int, default=8, help="rows a micro-batch (the speedrun's: 8)")
    ap.add_argument("--max-length", type=int, default=1024, help="tokens a row")
    ap.add_argument("--busy-ms", type=float, default=20.0, help="Python a step, GIL held (ms)")
    ap.add_argument("--wait-ms", type=float, default=20.0, help="waiting for the device a step, GIL free (ms)")
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()

    tok = Tokenizer.load(args.tokenizer)
    cfg = SFTConfig(data=args.data, mix_mode="epoch", max_length=args.max_length,
                    max_prompt_length=args.max_length // 2, packing=True)
    loader = SFTLoader(Mixture.from_config(cfg), tok, cfg, args.micro_batch_size)
    first = loader.next_batch()  # the first chunk is built on the spot either way
    busy, wait = args.busy_ms / 1e3, args.wait_ms / 1e3
    base, base_longest = step_loop(lambda: first, args.steps, busy, wait)
    real, real_longest = step_loop(loader.next_batch, args.steps, busy, wait)
    print(f"{args.steps} steps of {args.busy_ms:.0f} ms busy + {args.wait_ms:.0f} ms waiting, "
          f"{args.micro_batch_size} rows of {args.max_length}; chunks built {loader.chunk + 1}")
    print(f"prebuilt batches (baseline): {base:.2f} s, longest step {base_longest * 1e3:.0f} ms")
    print(f"the loader: {real:.2f} s, longest step {real_longest * 1e3:.0f} ms")
    print(f"loader_overhead: {real / base - 1:+.1%}")


if __name__ == "__main__":
    main()
