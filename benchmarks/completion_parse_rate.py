"""How often a base model's code completions parse, and its bits per byte on the whole val split.

Completes 25 prompts (the speedrun's five plus twenty more, each ending inside an indented block)
with greedy decoding (120 new tokens) and with nucleus sampling (``--temperature``, top-p 0.95,
``--max-new-tokens``, ``--seeds`` seeds), ends each completion with the function or class its
prompt ends in, and counts the ones that parse with ``ast.parse`` once the last, unfinished line is
dropped — the speedrun report's check; ``report_5`` counts the speedrun's five prompts alone. The
nucleus columns count the first sample of each prompt; ``best_of_N`` the best of ``--best-of``
samples, chosen as the speedrun report chooses. Used to choose the ``tiny`` recipe
(benchmarks/RESULTS.md).

    python benchmarks/completion_parse_rate.py runs/speedrun-tiny/pretrain --data runs/speedrun-tiny/data
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from codechat.checkpoint import load_model
from codechat.config.device import resolve_device
from codechat.data.corpus import read_split
from codechat.data.windows import eval_windows
from codechat.engine import SamplingConfig
from codechat.engine.completion import best_completion, sample_completions
from codechat.speedrun.plan import SpeedrunPlan
from codechat.speedrun.report import parses_after_dropping_last_line
from codechat.train.pretrain import bpb_evaluator

EXTRA_PROMPTS = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "def read_lines(path):\n    with open(path) as f:\n",
    "def main():\n    args = sys.argv[1:]\n",
    "class Point:\n    def __init__(self, x, y):\n",
    "def is_prime(n):\n    \"\"\"Return True if n is prime.\"\"\"\n",
    "def add(a, b):\n",
    "def parse_args(argv=None):\n    parser = argparse.ArgumentParser()\n",
    "class Config:\n    \"\"\"Settings for the application.\"\"\"\n\n    def __init__(self, path):\n",
    "def flatten(items):\n    result = []\n    for item in items:\n",
    "def load_json(path):\n    try:\n",
    "class Node:\n    def __init__(self, value, next=None):\n",
    "def format_size(n):\n    for unit in ['B', 'KB', 'MB', 'GB']:\n",
    "def get(self, key, default=None):\n",
    "import re\n\n\ndef tokenize(text):\n",
    "def write_file(path, data):\n    \"\"\"Write data to path.\"\"\"\n",
    "class Counter:\n    def __init__(self):\n        self.count = 0\n\n    def increment(self):\n",
    "def merge(a, b):\n    i = j = 0\n    out = []\n    while i < len(a) and j < len(b):\n",
    "def test_add(self):\n",
    "def __eq__(self, other):\n",
    "def copy_tree(src, dst):\n    os.makedirs(dst, exist_ok=True)\n    for name in os.listdir(src):\n",
)


def parses(model, tok, prompts: list[str], cfg: SamplingConfig, seeds: int, best_of: int = 1
           ) -> tuple[list[list[bool]], list[list[bool]]]:
    """Whether each completion parses, ``[seed][prompt]``: the first of ``best_of`` samples, and the
    best of them (``codechat.engine.completion.best_completion``, what the speedrun report shows)."""
    first, best = [], []
    for seed in range(seeds):
        row_first, row_best = [], []
        for i, prompt in enumerate(prompts):
            cands = sample_completions(model, tok, prompt, cfg, best_of, seed=seed * 1000 + i)
            row_first.append(parses_after_dropping_last_line(prompt + cands[0].text))
            row_best.append(parses_after_dropping_last_line(prompt + best_completion(cands).text))
        first.append(row_first)
        best.append(row_best)
    return first, best


def rate(rows: list[list[bool]], first: int | None = None) -> str:
    """"parsed/total" over every seed's first ``first`` prompts (all when None)."""
    cells = [ok for row in rows for ok in row[:first]]
    return f"{sum(cells)}/{len(cells)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a pretraining stage directory or checkpoint")
    ap.add_argument("--data", required=True, help="the corpus directory (its val split is scored)")
    ap.add_argument("--temperature", type=float, default=0.3)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--best-of", type=int, default=SpeedrunPlan.sample_best_of,
                    help="samples per prompt for the best-of columns (the speedrun report's setting)")
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    device = resolve_device(args.device)
    model, tok, state = load_model(Path(args.model), device)
    rows = eval_windows(read_split(Path(args.data), "val"), state["meta"]["config"]["data"]["seq_len"])
    with torch.no_grad():
        bpb = bpb_evaluator(rows, torch.tensor(tok.token_byte_lengths(), dtype=torch.long), 16)(model)["val_bpb"]
    prompts = list(SpeedrunPlan("tiny", 1, ()).sample_prompts) + list(EXTRA_PROMPTS)
    greedy, _ = parses(model, tok, prompts, SamplingConfig(max_new_tokens=120, temperature=0.0), 1)
    nucleus, best = parses(model, tok, prompts, SamplingConfig(max_new_tokens=args.max_new_tokens,
                                                               temperature=args.temperature, top_p=0.95),
                           args.seeds, args.best_of)
    name = f"t{args.temperature}_{args.max_new_tokens}"
    print(json.dumps({"model": args.model, "val_bpb": round(bpb, 4), "greedy_120": rate(greedy), name: rate(nucleus),
                      f"{name}_report_5": rate(nucleus, 5), f"{name}_best_of_{args.best_of}": rate(best),
                      f"{name}_best_of_{args.best_of}_report_5": rate(best, 5)}))


if __name__ == "__main__":
    main()
