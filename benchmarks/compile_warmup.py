"""What the speedrun's compile warm-ups save: each stage's warm-up run twice on a fresh cache.

    PYTHONPATH=. python benchmarks/compile_warmup.py [--preset d12] [--minutes 9] [--stages pretrain,sft]

For each stage, the speedrun's own config for it (:class:`codechat.speedrun.run.Speedrun` on this
device's plan, as ``_start_warmup`` builds them) goes to its warm-up
(:func:`codechat.train.pretrain.warm_compile`, :func:`codechat.train.sft.warm_compile`) in a spawned
process on an empty ``TORCHINDUCTOR_CACHE_DIR``: ``cold_s`` (the compile, as the stage's first step
pays it without a warm-up), then in a second process on the same cache: ``warm_s`` (what the first
step costs once the warm-up ran: the graphs loaded, not compiled). Each line also gives Inductor's FX
graph cache hits and misses and AOTAutograd's; a warm run with misses means a graph the cache cannot
hold (a stage that would compile anyway). On a CPU the speedrun starts no warm-up (it would compete
with the tokenizer and corpus), but the figures still show what caching gives.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from codechat.config.stages import replace
from codechat.speedrun.plan import plan
from codechat.speedrun.run import Speedrun

CHILD = """
import json, pickle, sys, time
from torch._dynamo.utils import counters
from codechat.train import pretrain, sft
stage, args = sys.argv[1], pickle.loads(bytes.fromhex(sys.argv[2]))
t0 = time.perf_counter()
(pretrain if stage == "pretrain" else sft).warm_compile(*args)
print(json.dumps({"s": time.perf_counter() - t0, "fxgraph_hit": counters["inductor"].get("fxgraph_cache_hit", 0),
                  "fxgraph_miss": counters["inductor"].get("fxgraph_cache_miss", 0),
                  "aot_hit": counters["aot_autograd"].get("autograd_cache_hit", 0),
                  "aot_miss": counters["aot_autograd"].get("autograd_cache_miss", 0)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="", help="model preset (default: the plan's for --minutes)")
    ap.add_argument("--minutes", type=float, default=9.0, help="the speedrun budget whose plan gives the configs")
    ap.add_argument("--stages", default="pretrain,sft", help="warm-ups to measure: pretrain, sft or both")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    p = replace(plan(dev, args.preset, args.minutes), compile=True)
    with tempfile.TemporaryDirectory(prefix="codechat-compile-warmup-") as tmp:
        s = Speedrun(p, Path(tmp) / "run", dev, dev.type, 0, resume=False)
        train_s = p.pretrain_train_share * p.planned_s()["pretrain"]
        pre = s._pretrain_cfg(train_s, True, data=False)
        vocab = s.data_cfg.vocab_size
        todo = {"pretrain": (pre, vocab), "sft": (s._sft_warmup_cfg(pre), replace(pre.model, vocab_size=vocab))}
        print(f"# {torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}; torch {torch.__version__}; "
              f"preset {p.preset}, vocab {vocab}, {args.minutes:g}-minute plan")
        for stage in args.stages.split(","):
            cfg = todo[stage]
            if cfg[0] is None:
                print(f"{stage}: the plan runs it eager, no warm-up")
                continue
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / f"cache-{stage}")}
            runs = {}
            for what in ("cold", "warm"):
                out = subprocess.run([sys.executable, "-c", CHILD, stage, pickle.dumps(cfg).hex()], env=env,
                                     capture_output=True, text=True, timeout=900)
                if out.returncode:
                    sys.exit(f"{stage} {what}: failed\n{out.stderr[-3000:]}")
                runs[what] = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"{stage}_{what}_s {runs[what]['s']:.2f}  (FX graphs: {runs[what]['fxgraph_hit']} hit, "
                      f"{runs[what]['fxgraph_miss']} missed; AOTAutograd: {runs[what]['aot_hit']} hit, "
                      f"{runs[what]['aot_miss']} missed)", flush=True)
            print(f"{stage}_saved_s {runs['cold']['s'] - runs['warm']['s']:.2f}")


if __name__ == "__main__":
    main()
