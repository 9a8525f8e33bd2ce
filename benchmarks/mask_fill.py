"""How fast the host computes a batch of grammar masks (issue 45): one step's ``fill`` for ``--rows`` rows.

Every row walks the ``one_schema`` grammar of ``constrained_decode.py`` (its first tool, ``tool_choice``
required, the stdlib BPE as the tokenizer): at each step every unfinished row's mask is computed, then
the row consumes a token drawn uniformly from its allowed ones (seeded: each strategy sees the same
states), a finished row starting over, for ``--steps`` steps. Strategies, each timed over the same walk:

- ``serial``: one matcher after another on the calling thread (``GrammarMatcher.fill``);
- ``executor``: llguidance's ``LLExecutor`` (Rust threads, 80% of the CPUs up to 32), into a buffer
  of the tokenizer's width;
- ``threads-N``: ``N`` Python threads, each filling a contiguous share of the rows (the library
  drops the GIL while it computes);
- ``engine``: ``codechat.engine.grammar.fill_rows`` as the engine calls it, into a buffer of the
  model's width (``--model-vocab``).

Prints milliseconds a step (median and mean) per strategy, and the speed-up over ``serial``.

    PYTHONPATH=. python benchmarks/mask_fill.py --rows 64 --steps 200
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from constrained_decode import TOOLS, stdlib_tokenizer  # noqa: E402  (benchmarks/, beside this script)

from codechat.chat.strict import tool_grammar  # noqa: E402
from codechat.engine.grammar import GrammarCompiler, fill_rows, unpack, words  # noqa: E402


def walk(grammar: Any, vocab: int, rows: int, steps: int, seed: int,
         fill: Callable[[list[tuple[Any, int]], torch.Tensor], None], width: int) -> list[float]:
    """Seconds of ``fill(live rows, buffer)`` at each of ``steps`` steps of ``rows`` matchers' walk."""
    rng = random.Random(seed)
    ms = [grammar.matcher() for _ in range(rows)]
    buf = torch.zeros(rows, width, dtype=torch.int32)
    times = []
    for _ in range(steps):
        live = [(m, i) for i, m in enumerate(ms)]
        t0 = time.perf_counter()
        fill(live, buf)
        times.append(time.perf_counter() - t0)
        allowed = unpack(buf[:, :words(vocab)], vocab)
        for m, i in live:
            m.consume(rng.choice(allowed[i].nonzero().flatten().tolist()))
            if m.done:
                ms[i] = grammar.matcher()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", default="2,4,8", help="comma-separated N of the threads-N strategies")
    ap.add_argument("--model-vocab", type=int, default=32768, help="the model's logits (the engine's buffer width)")
    ap.add_argument("--tokenizer-bytes", type=int, default=3_000_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    tok = stdlib_tokenizer(args.model_vocab, args.tokenizer_bytes)
    gc = GrammarCompiler(tok, args.model_vocab)
    g = tool_grammar(gc, [TOOLS[0]], "required")
    V, w = gc.vocab_size, words(gc.vocab_size)
    import llguidance
    ex = llguidance.LLExecutor()

    def serial(live: list, buf: torch.Tensor) -> None:
        for m, i in live:
            m.fill(buf[i])

    def executor(live: list, buf: torch.Tensor) -> None:
        ex.unsafe_compute_mask_ptr([(m._m, i) for m, i in live], buf.data_ptr(), buf.size(1) * 4, buf.size(0))

    def threads(n: int) -> Callable[[list, torch.Tensor], None]:
        pool = ThreadPoolExecutor(n)

        def run(live: list, buf: torch.Tensor) -> None:
            share = -(-len(live) // n)
            list(pool.map(lambda part: serial(part, buf), [live[k:k + share] for k in range(0, len(live), share)]))
        return run

    strategies: list[tuple[str, Callable, int]] = [("serial", serial, w), ("executor", executor, w)]
    strategies += [(f"threads-{n}", threads(n), w) for n in map(int, args.threads.split(","))]
    strategies.append(("engine", fill_rows, words(args.model_vocab)))
    print(f"{args.rows} rows, {args.steps} steps, tokenizer {V} ids, model {args.model_vocab}, {os.cpu_count()} CPUs")
    base = None
    for name, fn, width in strategies:
        walk(g, V, args.rows, 5, args.seed + 1, fn, width)  # warm-up
        t = walk(g, V, args.rows, args.steps, args.seed, fn, width)
        med, mean = 1e3 * statistics.median(t), 1e3 * statistics.mean(t)
        base = base or mean
        print(f"{name:>12}: {med:7.3f} ms median, {mean:7.3f} ms mean a step ({base / mean:.2f}x serial)")


if __name__ == "__main__":
    main()
