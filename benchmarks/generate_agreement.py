"""Does the fast generation path compute what the plain model computes?

Greedy continuations of the engine (bf16 inference weights, packed prefill, the slot KV cache,
CUDA graphs and ``torch.compile`` where enabled) against the plain eager path: the same
checkpoint cast to bf16 (fp32 on CPU) recomputing the whole sequence at every step, no cache.
bf16 rounding differs between the two, so a row may diverge where the model's two best tokens
are nearly tied; a divergence anywhere else is a bug.

Printed: rows whose ``--new`` tokens agree exactly (the acceptance asks >= 90%), and for every
row that diverges the position and the eager path's gap between its two best logits there (the
acceptance asks < 0.25 for every one).

``--kv-cache-dtype fp8`` compares the engine with an FP8 cache against the same engine with the bf16
cache instead (the reference), the gaps taken from the eager model's logits along the reference's
tokens (one forward pass over prompt and continuation): is the FP8 cache's rounding only felt where
the model's two best tokens are nearly tied? Against a floor, not an absolute: the bf16 cache
against itself, replayed as CUDA graphs against run op by op (``floor_rows_equal_rate``: the greedy
agreement that rounding-order differences alone allow). Then, with the two engines stepped in
lockstep and fed the same tokens (teacher forcing through the decode path, so every step reads the
cache): ``forced_top1_agreement`` (the two caches' best tokens agree) and ``forced_mean_kl`` (nats,
KL(bf16 || fp8) of the next-token distributions) along the bf16 reference's greedy tokens, and, with
``--model``, ``val_bits_per_byte`` with each cache over ``--val-windows`` windows of the corpus's val
split (each window's first ``--prompt-len`` tokens prefilled, the rest decoded teacher-forced).

    python benchmarks/generate_agreement.py --model runs/x/pretrain     # a trained checkpoint
    python benchmarks/generate_agreement.py --preset d20                # random weights
    python benchmarks/generate_agreement.py --model runs/x/pretrain --kv-cache-dtype fp8
"""
from __future__ import annotations

import argparse
import copy
import json
import math
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


@torch.no_grad()
def forced_gaps(model, prompts: list[list[int]], continuations: list[list[int]]) -> torch.Tensor:
    """(rows, new) top-1 minus top-2 logit gaps of ``model`` at each token of ``continuations``, given
    the prompt and the continuation's earlier tokens (teacher forcing: one pass)."""
    ids = torch.tensor([p + c for p, c in zip(prompts, continuations)], device=next(model.parameters()).device)
    n = len(prompts[0])
    top = model(ids[:, :-1])[:, n - 1:].float().topk(2, dim=-1).values
    return (top[..., 0] - top[..., 1]).cpu()


@torch.inference_mode()
def forced_lockstep(engines: list[Engine], prompts: list[list[int]], continuations: list[list[int]]) -> dict:
    """Feed every engine the same ``continuations`` after ``prompts`` (rows of equal lengths, one
    cache slot each) through its decode path, one token a step, and compare each step's next-token
    distributions with the first engine's: ``top1_agreement`` and ``mean_kl`` (nats) per other engine,
    and per engine ``nll`` (nats summed over the continuations' tokens after the first) and ``tokens``."""
    b, P, T = len(prompts), len(prompts[0]), len(continuations[0])
    cont = torch.tensor(continuations)
    for e in engines:
        e._free = []  # the slots are this function's: no request may take one
    logits = [e.model.logits(e._prefill_run(prompts, [[i] for i in range(b)])).float() for e in engines]
    agree, kl, nll = [0] * len(engines), [0.0] * len(engines), [0.0] * len(engines)
    for i in range(T):
        logp = [torch.log_softmax(x, dim=-1) for x in logits]
        ref = logp[0]
        for k, lp in enumerate(logp):
            agree[k] += int((lp.argmax(-1) == ref.argmax(-1)).sum())
            kl[k] += float((ref.exp() * (ref - lp)).sum(-1).sum())
            if i:  # the first token follows the prompt: scored from the second on, as val windows are
                nll[k] -= float(lp.gather(1, cont[:, i:i + 1].to(lp.device)).sum())
        if i + 1 == T:
            break
        for k, e in enumerate(engines):
            e.tokens[:b] = cont[:, i].to(e.device)
            e.lengths[:b] = P + i
            logits[k] = e._forward(b, None if e.cuda else P + i + 1).float()
    n = b * T
    return {"top1_agreement": [a / n for a in agree[1:]], "mean_kl": [x / n for x in kl[1:]],
            "nll": nll, "tokens": b * (T - 1)}


def val_windows(tok, count: int, length: int) -> list[list[int]]:
    """``count`` windows of ``length`` tokens of the corpus's val split (this Python's stdlib by default)."""
    from codechat.config.stages import default_corpus_dirs
    from codechat.data.sources import iter_split_texts
    ids: list[int] = []
    for text in iter_split_texts(default_corpus_dirs(), "val"):
        ids += [tok.end_id] + tok.encode(text)
        if len(ids) >= count * length:
            break
    return [ids[i * length:(i + 1) * length] for i in range(len(ids) // length)][:count]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="checkpoint or stage directory (default: random weights of --preset)")
    ap.add_argument("--preset", default="d20", help="model preset for random weights (default d20)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--no-graphs", action="store_true", help="engine without CUDA graphs")
    ap.add_argument("--no-compile", action="store_true", help="engine without torch.compile")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"],
                    help="fp8: the engine with an FP8 cache against the engine with the bf16 one (default auto: "
                         "the engine against the eager model)")
    ap.add_argument("--val-windows", type=int, default=64,
                    help="with --kv-cache-dtype fp8 and --model: val-split windows of --prompt-len + --new tokens "
                         "scored with each cache (default 64)")
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
    greedy = SamplingConfig(max_new_tokens=args.new, temperature=0.0)

    def engine_of(kv_cache_dtype: str, graphs: bool = not args.no_graphs, slots: int = len(prompts)) -> Engine:
        return Engine(model, EngineConfig(slots=slots, max_len=args.prompt_len + args.new + 1, cuda_graphs=graphs,
                                          compile=not args.no_compile and graphs, kv_cache_dtype=kv_cache_dtype))

    def engine_greedy(engine: Engine) -> tuple[list[list[int]], float]:
        t = time.perf_counter()
        out = [s[0].token_ids for s in engine.generate([Request(p, greedy) for p in prompts])]
        return out, time.perf_counter() - t

    def equal_rows(fast: list[list[int]], ref: list[list[int]], gaps: torch.Tensor) -> tuple[int, list[dict]]:
        same, div = 0, []
        for r, (a, b) in enumerate(zip(fast, ref)):
            if a == b:
                same += 1
                continue
            pos = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
            div.append({"row": r, "position": pos, "eager_top2_gap": round(float(gaps[r, pos]), 4)})
        return same, div
    fast, fast_s = engine_greedy(engine_of(args.kv_cache_dtype))
    plain = copy.deepcopy(model).to(torch.bfloat16 if dev.type == "cuda" else torch.float32)
    extra: dict = {}
    if args.kv_cache_dtype == "fp8":  # the reference: the same engine with the bf16 cache
        ref, _ = engine_greedy(engine_of("auto"))
        gaps = forced_gaps(plain, prompts, ref)
        eager, _ = engine_greedy(engine_of("auto", graphs=False))
        floor, _ = equal_rows(eager, ref, gaps)
        extra = {"floor": "engine, bf16 cache, op by op against graphs", "floor_rows_equal_rate": floor / len(prompts)}
        pair = [engine_of("auto"), engine_of("fp8")]
        lock = forced_lockstep(pair, prompts, ref)
        extra |= {"forced_top1_agreement": lock["top1_agreement"][0], "forced_mean_kl": lock["mean_kl"][0]}
        if tok is not None:
            windows = val_windows(tok, args.val_windows, args.prompt_len + args.new)
            pair = [engine_of(d, slots=len(windows)) for d in ("auto", "fp8")]
            val = forced_lockstep(pair, [w[:args.prompt_len] for w in windows], [w[args.prompt_len:] for w in windows])
            nbytes = sum(len(tok.decode(w[args.prompt_len + 1:]).encode()) for w in windows)
            bpb = [nll / math.log(2) / nbytes for nll in val["nll"]]
            extra |= {"val_windows": len(windows), "val_bits_per_byte": {"bf16": bpb[0], "fp8": bpb[1]},
                      "val_bits_per_byte_ratio": bpb[1] / bpb[0]}
    else:
        ref, gaps = eager_greedy(plain, prompts, args.new)
    same, div = equal_rows(fast, ref, gaps)
    res = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "model": args.model or args.preset,
           "kv_cache_dtype": args.kv_cache_dtype, "reference": "engine, bf16 cache" if args.kv_cache_dtype == "fp8"
           else "eager", "rows": len(prompts), "new_tokens": args.new, "rows_equal": same, "rows_equal_rate": same / len(prompts),
           "divergences": div, "max_gap_at_divergence": max((d["eager_top2_gap"] for d in div), default=None),
           "fast_first_call_s": round(fast_s, 2), **extra}
    for d in div:
        print(f"row {d['row']:3d} diverges at token {d['position']:3d}; eager top-2 gap there {d['eager_top2_gap']:.4f}")
    print(f"agreement: {same}/{len(prompts)} rows equal over {args.new} tokens ({same / len(prompts):.1%}); "
          f"largest gap at a divergence: {res['max_gap_at_divergence']}")
    for k, v in extra.items():
        print(f"{k}: {v}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
