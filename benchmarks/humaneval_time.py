"""Wall time of a whole HumanEval evaluation: 164 problems x ``--n`` samples, judged.

Random weights of ``--preset`` (or a checkpoint with ``--model``) run through exactly what
``codechat eval run`` runs (:func:`codechat.eval.suites.run_suite`: the engine batching across
problems, the sandbox judging as samples finish). Random weights never emit a stop, so every
sample runs the full ``--max-new-tokens``: the slowest case.

Printed: wall seconds (generation and judging overlap), seconds generating, tokens generated
and tokens/s, samples judged, and the time to the engine's first token.

    python benchmarks/humaneval_time.py --preset d20 --tokenizer runs/x/tokenizer
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from codechat.config.stages import preset
from codechat.engine import Engine, EngineConfig
from codechat.eval.suites import format_summary, run_suite
from codechat.model import build_model
from codechat.tokenizer import Tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", help="tokenizer directory (with --preset)")
    ap.add_argument("--preset", default="d20")
    ap.add_argument("--model", help="a checkpoint or stage directory instead of random weights")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--limit", type=int, help="only the first N problems")
    ap.add_argument("--slots", type=int, default=0, help="engine KV-cache slots (0: the engine's default)")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--out", default="runs/humaneval-time")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    if args.model:
        from codechat.checkpoint import load_model
        model, tok, _ = load_model(args.model, dev)
    else:
        tok = Tokenizer.load(args.tokenizer)
        torch.manual_seed(0)
        model = build_model(preset(args.preset, vocab_size=tok.vocab_size), dev).eval()
    engine = Engine(model, EngineConfig(slots=args.slots))
    load_s = time.perf_counter() - t0
    t = time.perf_counter()
    res = run_suite(engine, tok, out_dir=args.out, suite="humaneval", stage="pretrain", n=args.n, ks=tuple(k for k in (1, 10) if k <= args.n),
                    max_new_tokens=args.max_new_tokens, limit=args.limit, workers=args.workers, progress=False)
    wall = time.perf_counter() - t
    tm = res["timing"]
    print(format_summary(res))
    print(f"HumanEval {res['problems']} x {args.n} samples x <= {args.max_new_tokens} new tokens on "
          f"{torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}: {wall:.1f} s wall "
          f"(model load {load_s:.1f} s before it), {tm['tokens_new']} tokens, "
          f"{tm['tokens_new'] / wall:,.0f} tokens/s over the wall time; slots {engine.slots}, "
          f"{args.workers} judging workers")
    with open(os.path.join(args.out, "time.json"), "w") as f:
        json.dump({"wall_s": wall, "load_s": load_s, "slots": engine.slots, "timing": tm,
                   "problems": res["problems"], "n": args.n}, f, indent=1)


if __name__ == "__main__":
    main()
