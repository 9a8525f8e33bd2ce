"""Does the fast generation path compute what the plain model computes?

Greedy continuations of the engine (bf16 inference weights, packed prefill, the slot KV cache,
CUDA graphs and ``torch.compile`` where enabled) against the plain eager path: the same
checkpoint cast to bf16 (fp32 on CPU) recomputing the whole sequence at every step, no cache.
bf16 rounding differs between the two, so a row may diverge where the model's two best tokens
are nearly tied; a divergence anywhere else is a bug.

Printed: rows whose ``--new`` tokens agree exactly (the acceptance asks >= 90%), and for every
row that diverges the position and the eager path's gap between its two best logits there (the
acceptance asks < 0.25 for every one).

    python benchmarks/generate_agreement.py --model runs/x/pretrain     # a trained checkpoint
    python benchmarks/generate_agreement.py --preset d20                # random weights
"""
from __future__ import annotations

import argparse
import copy
import json
import time

import torch

from codechat.config.stages import preset
from codechat.engine import Engine, EngineConfig, Request, SamplingConfig
from codechat.model import build_model


def prompts_from(args: argparse.Namespace, vocab: int, tok=None) -> list[list[int]]:
    """``--prompts`` prompts of exactly ``--prompt-len`` tokens: HumanEval prompts (with a
    tokenizer) or seeded random ids."""
    if tok is not None:
        from codechat.eval.problems import load_humaneval
        ids = [[tok.end_id] + tok.encode(p.base_prompt) for p in load_humaneval()]
        ids = [x[:args.prompt_len] for x in ids if len(x) >= args.prompt_len]
        return (ids * (args.prompts // len(ids) + 1))[:args.prompts]
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (args.prompts, args.prompt_len), generator=g).tolist()


@torch.no_grad()
def eager_greedy(model, prompts: list[list[int]], new: int) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy ids (rows, new) by full recomputation, and the top-1 minus top-2 logit gap at each step."""
    ids = torch.tensor(prompts, device=next(model.parameters()).device)
    gaps = []
    for _ in range(new):
        logits = model(ids)[:, -1].float()
        top = logits.topk(2, dim=-1).values
        gaps.append(top[:, 0] - top[:, 1])
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids[:, len(prompts[0]):].tolist(), torch.stack(gaps, dim=1).cpu()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="checkpoint or stage directory (default: random weights of --preset)")
    ap.add_argument("--preset", default="d20", help="model preset for random weights (default d20)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--no-graphs", action="store_true", help="engine without CUDA graphs")
    ap.add_argument("--no-compile", action="store_true", help="engine without torch.compile")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = None
    if args.model:
        from codechat.checkpoint import load_model
        model, tok, _ = load_model(args.model, dev)
    else:
        torch.manual_seed(0)
        model = build_model(preset(args.preset, vocab_size=32768), dev).eval()
    prompts = prompts_from(args, model.cfg.vocab_size, tok)
    engine = Engine(model, EngineConfig(slots=len(prompts), max_len=args.prompt_len + args.new + 1,
                                        cuda_graphs=not args.no_graphs, compile=not args.no_compile))
    greedy = SamplingConfig(max_new_tokens=args.new, temperature=0.0)
    t = time.perf_counter()
    fast = [s[0].token_ids for s in engine.generate([Request(p, greedy) for p in prompts])]
    fast_s = time.perf_counter() - t
    plain = copy.deepcopy(model).to(torch.bfloat16 if dev.type == "cuda" else torch.float32)
    ref, gaps = eager_greedy(plain, prompts, args.new)
    same, div = 0, []
    for r, (a, b) in enumerate(zip(fast, ref)):
        if a == b:
            same += 1
            continue
        pos = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        div.append({"row": r, "position": pos, "eager_top2_gap": round(float(gaps[r, pos]), 4)})
    res = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "model": args.model or args.preset,
           "rows": len(prompts), "new_tokens": args.new, "rows_equal": same, "rows_equal_rate": same / len(prompts),
           "divergences": div, "max_gap_at_divergence": max((d["eager_top2_gap"] for d in div), default=None),
           "fast_first_call_s": round(fast_s, 2)}
    for d in div:
        print(f"row {d['row']:3d} diverges at token {d['position']:3d}; eager top-2 gap there {d['eager_top2_gap']:.4f}")
    print(f"agreement: {same}/{len(prompts)} rows equal over {args.new} tokens ({same / len(prompts):.1%}); "
          f"largest gap at a divergence: {res['max_gap_at_divergence']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
