"""Generation throughput of the engine against Hugging Face transformers: same weights, same device.

Builds a preset with random weights (seeded), copies the same weights into transformers'
``Qwen3ForCausalLM`` (``qk_norm``) or ``LlamaForCausalLM`` (our parameter names are theirs
without ``model.``), checks that both compute the same logits, then times greedy generation of
``--new-tokens`` tokens per row with :class:`codechat.engine.Engine` (bf16, CUDA graphs,
``torch.compile`` on CUDA) and with ``hf.generate`` (bf16, ``cache_implementation="static"``,
which transformers compiles on CUDA; ``--hf-dynamic`` adds the default dynamic cache).

    PYTHONPATH=. python benchmarks/generate_throughput.py --preset 1b [--out $OUT/generate.json]
    PYTHONPATH=. python benchmarks/generate_throughput.py --preset tiny --quick      # CPU smoke check

Every timed call follows one identical warm-up call (CUDA graph capture, compilation and static
cache allocation land there) and is wall time with ``torch.cuda.synchronize`` on both sides; a
figure is the median over ``--repeats`` timed calls. Both sides generate exactly ``new`` tokens a
row (no stop id, ``min_new_tokens``). ``--no-cuda-graphs`` / ``--no-compile`` turn the engine's
CUDA graphs / compilation off. The first line names the device, torch and transformers versions,
the preset and the engine settings; then the figures, one line each:

- ``check_fp32_max_abs_diff``: max |logit difference| of our GPT and the converted HF model, both
  fp32, on a random (2, 64) batch; must be < 1e-4 (else the script stops: the conversion is wrong).
- ``check_bf16_max_abs_diff`` / ``check_bf16_argmax_agree`` (CUDA): the same with our GPT under
  bf16 autocast and the HF model in bf16, and the share of positions whose argmax agrees.
- ``{ours,hf_static,hf_dynamic}_decode_b{B}_tok_s``: B prompts of ``--prompt-len`` random tokens,
  ``B * new / seconds``; the time is the whole generate call (prefill included).
- ``{...}_mixed_b{N}_tok_s``: N prompts with lengths uniform in ``--mixed-lens`` (seeded);
  HF gets them left-padded. ``N * new / seconds``.
- ``{...}_ttft_b1_ms``: time to first token at batch 1: a ``--prompt-len`` prompt, one new token.
- ``b1_bytes_per_step``: bytes one batch-1 decode step must read from HBM at least: the inference
  weights (``engine.model.nbytes()``: all but the embedding table) plus the KV cache at the mean
  context ``prompt_len + new / 2``; ``b1_bound_steps_s`` = ``--hbm-bytes-per-s`` / that;
  ``b1_measured_steps_s`` = ``new / seconds`` of the batch-1 run (prefill included, so slightly
  pessimistic); ``b1_bandwidth_share`` = measured / bound (only meaningful on the GPU named by
  ``--hbm-bytes-per-s``, default an H200's 4.8e12 B/s).
- ``greedy_agree_b{B}_first{K}``: share of the rows of the timed batch-8 run (the largest batch
  when 8 is not run) whose first K = min(32, new) tokens are the same in ours and HF's (static
  cache; dynamic when static was skipped), and the mean length of the common prefix. bf16
  rounding flips near-ties, which random weights have many of, and one flip changes the rest of
  a greedy row: a low share is expected and reported, not asserted.
- the final table: per row, ours, HF static (and dynamic) and ``speedup`` = how many times faster
  ours is (ours/theirs in tok/s; theirs/ours for the ms row). ``--out`` writes the table, every
  figure above and the settings as JSON.

On CPU (fp32, no graphs, no compilation) the figures only show that the script runs; a failing
HF static cache is skipped with a message and the dynamic cache timed instead.

``--constrained`` (issue 35) times grammar-constrained decoding instead: ``benchmarks/constrained_decode.py`` says what
and how (free rows against rows under one and under eight tool schemas, and an A/B of the free path).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import torch

from codechat.config.device import resolve_device
from codechat.config.stages import preset
from codechat.engine import Engine, EngineConfig, Request, SamplingConfig
from codechat.model import GPT, build_model
from constrained_decode import TOOLS, ab_worker, constrained_main  # benchmarks/, beside this script


def to_hf(model: GPT, dtype: torch.dtype) -> torch.nn.Module:
    """The same weights as a transformers model on ``model``'s device: Qwen3 with QK-norm, else Llama.

    Raises:
        RuntimeError: the state dicts do not match one to one (strict load).
    """
    import transformers
    c = model.cfg
    kw = dict(vocab_size=c.vocab_size, hidden_size=c.n_embd, intermediate_size=c.intermediate_size,
              num_hidden_layers=c.n_layer, num_attention_heads=c.n_head, num_key_value_heads=c.n_kv_head,
              head_dim=c.head_dim, max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps,
              rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta}, attention_bias=False,
              tie_word_embeddings=c.tie_embeddings, hidden_act="silu", pad_token_id=0, bos_token_id=None,
              eos_token_id=None)
    if c.qk_norm:
        config, cls = transformers.Qwen3Config(**kw), transformers.Qwen3ForCausalLM
    else:
        config, cls = transformers.LlamaConfig(mlp_bias=False, **kw), transformers.LlamaForCausalLM
    dev = model.embed_tokens.weight.device
    with torch.device(dev):
        hf = cls(config).to(dtype)
    sd = {(k if k == "lm_head.weight" else f"model.{k}"): v for k, v in model.state_dict().items()}
    hf.load_state_dict(sd, strict=True)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf.eval()


@torch.no_grad()
def check_logits(model: GPT, hf: torch.nn.Module, vocab: int, device: torch.device, bf16: bool) -> tuple[float, float]:
    """(max abs logit difference, argmax agreement) of ``model`` and ``hf`` on a random (2, 64) batch;
    with ``bf16`` our model runs under bf16 autocast (``hf`` must already be bf16)."""
    idx = torch.randint(0, vocab, (2, 64), device=device, generator=torch.Generator(device).manual_seed(1))
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        ours = model(idx).float()
    theirs = hf(input_ids=idx).logits.float()
    return (ours - theirs).abs().max().item(), (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()


def timed(fn: Callable[[], object], device: torch.device, repeats: int) -> tuple[float, object]:
    """(median seconds over ``repeats`` calls of ``fn`` after one warm-up call, the last result)."""
    fn()
    times, out = [], None
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def ours_fn(engine: Engine, prompts: list[list[int]], new: int) -> Callable[[], list[list[int]]]:
    """A call of ``engine.generate`` on greedy requests of ``new`` tokens; returns each row's tokens."""
    reqs = [Request(p, SamplingConfig(max_new_tokens=new, temperature=0.0)) for p in prompts]
    return lambda: [samples[0].token_ids for samples in engine.generate(reqs)]


def hf_fn(hf: torch.nn.Module, prompts: list[list[int]], new: int, cache: str | None,
          device: torch.device) -> Callable[[], list[list[int]]]:
    """A call of ``hf.generate`` (greedy, exactly ``new`` tokens) on ``prompts`` left-padded with 0."""
    L = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (L - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts], device=device)
    extra = {"cache_implementation": cache} if cache else {}

    @torch.inference_mode()
    def call() -> list[list[int]]:
        out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                          do_sample=False, pad_token_id=0, **extra)
        return out[:, L:].tolist()
    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="1b", help="model shape (codechat.config.stages.PRESETS): d20, 1b, tiny, ...")
    ap.add_argument("--vocab-size", type=int, default=32768, help="the model's vocabulary (logits width)")
    ap.add_argument("--batches", default="1,8,64", help="comma-separated batch sizes of the fixed-length rows")
    ap.add_argument("--prompt-len", type=int, default=256, help="prompt tokens of the fixed-length rows and TTFT")
    ap.add_argument("--new-tokens", type=int, default=256, help="tokens generated per row")
    ap.add_argument("--mixed-batch", type=int, default=64, help="prompts of the mixed-length row (0: skip it)")
    ap.add_argument("--mixed-lens", default="32,1024", help="LO,HI: mixed prompt lengths, uniform in [LO, HI]")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per figure (the median is reported)")
    ap.add_argument("--hf-dynamic", action="store_true", help="also time HF with its default dynamic cache")
    ap.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                    help="EngineConfig.cuda_graphs (--no-cuda-graphs: decode eagerly)")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True, help="EngineConfig.compile")
    ap.add_argument("--hbm-bytes-per-s", type=float, default=4.8e12, help="memory bandwidth (H200: 4.8e12)")
    ap.add_argument("--decode-steps", type=int, default=0, help="EngineConfig.decode_steps (0: the engine's choice)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights, prompts and sampling")
    ap.add_argument("--device", default="auto", help="auto, cuda, cpu, ...")
    ap.add_argument("--out", default="", help="write the table as JSON here (e.g. $OUT/generate.json)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke check: batches 1,2, prompt 16, 8 new tokens, 4 mixed prompts of 4..32, 1 repeat")
    c = ap.add_argument_group("--constrained (issue 35: grammar-constrained decoding; see the description above)")
    c.add_argument("--constrained", action="store_true",
                   help="time free, one-schema and 8-schema rows (and the A/B) instead of the HF comparison; "
                        "--out defaults to $OUT/generate_constrained.json when $OUT is set")
    c.add_argument("--rows", type=int, default=64, help="rows kept running in each arm (and engine slots)")
    c.add_argument("--schemas", type=int, default=8, help=f"tools of the many-schemas arm (1..{len(TOOLS)}; divides --rows)")
    c.add_argument("--tokenizer", default="", help="tokenizer directory for the grammars (default: train a BPE on the "
                                                   "standard library with the model's vocabulary size)")
    c.add_argument("--tokenizer-bytes", type=int, default=8_000_000,
                   help="characters of standard-library source the default tokenizer trains on")
    c.add_argument("--ab-commit", default="dc51aeb",
                   help="the base of the free-path A/B (the commit before constrained decoding); '' skips the A/B")
    c.add_argument("--ab-rounds", type=int, default=4, help="A/B rounds (each times both sides once, alternating order)")
    c.add_argument("--ab-worker", action="store_true",
                   help="internal: run as one side of the A/B (stdin: run / quit; stdout: READY, RESULT {json})")
    args = ap.parse_args()
    if args.ab_worker:
        return ab_worker(args)
    if args.constrained:
        return constrained_main(args)
    if args.quick:
        args.batches, args.prompt_len, args.new_tokens, args.mixed_batch = "1,2", 16, 8, 4
        args.mixed_lens, args.repeats = "4,32", 1
    batches = [int(b) for b in args.batches.split(",")]
    lo, hi = (int(x) for x in args.mixed_lens.split(","))
    P, new = args.prompt_len, args.new_tokens

    import transformers
    torch.manual_seed(args.seed)
    device = resolve_device(args.device)
    cuda = device.type == "cuda"
    cfg = preset(args.preset, vocab_size=args.vocab_size)
    model = build_model(cfg, device).eval()
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"device: {name}; torch {torch.__version__}; transformers {transformers.__version__}; preset "
          f"{args.preset}: {model.num_params() / 1e6:.1f}M params; prompt {P}, {new} new tokens, greedy; engine "
          f"cuda_graphs={args.cuda_graphs and cuda} compile={args.compile and cuda}")

    figures: dict[str, float] = {}

    def say(key: str, value: float, text: str, note: str = "") -> float:
        """Print one figure (``text`` formats it) and keep it for ``--out``."""
        figures[key] = value
        print(f"{key}: {text.format(value)}{note}")
        return value

    hf = to_hf(model, torch.float32)
    diff = say("check_fp32_max_abs_diff", check_logits(model, hf, cfg.vocab_size, device, bf16=False)[0], "{:.2e}")
    if diff >= 1e-4:
        raise SystemExit(f"the HF model computes other logits than ours (fp32 max abs diff {diff:.2e} >= 1e-4): "
                         "the weight conversion is wrong")
    if cuda:
        hf = hf.to(torch.bfloat16)
        diff, agree = check_logits(model, hf, cfg.vocab_size, device, bf16=True)
        say("check_bf16_max_abs_diff", diff, "{:.2e}")
        say("check_bf16_argmax_agree", agree, "{:.1%}")

    g = torch.Generator().manual_seed(args.seed)
    rand = lambda n: torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()  # noqa: E731
    work: dict[str, tuple[list[list[int]], int]] = {f"decode_b{b}": ([rand(P) for _ in range(b)], new)
                                                    for b in batches}
    if args.mixed_batch:
        lens = torch.randint(lo, hi + 1, (args.mixed_batch,), generator=g).tolist()
        work[f"mixed_b{args.mixed_batch}"] = ([rand(n) for n in lens], new)
    work["ttft_b1"] = ([rand(P)], 1)
    slots = max(len(prompts) for prompts, _ in work.values())
    longest = max(len(p) for prompts, _ in work.values() for p in prompts)
    engine = Engine(model, EngineConfig(slots=slots, max_len=longest + new + 8, cuda_graphs=args.cuda_graphs,
                                        compile=args.compile, decode_steps=args.decode_steps))

    def report(side: str, row: str, seconds: float) -> float:
        prompts, n = work[row]
        if row == "ttft_b1":
            return say(f"{side}_{row}_ms", seconds * 1e3, "{:,.1f}")
        return say(f"{side}_{row}_tok_s", len(prompts) * n / seconds, "{:,.1f}")

    ours: dict[str, float] = {}
    secs: dict[str, float] = {}
    agree_row = "decode_b8" if 8 in batches else f"decode_b{max(batches)}"
    tokens: dict[str, list[list[int]]] = {}
    for row, (prompts, n) in work.items():
        secs[row], out = timed(ours_fn(engine, prompts, n), device, args.repeats)
        ours[row] = report("ours", row, secs[row])
        if row == agree_row:
            tokens["ours"] = out

    if 1 in batches:
        kv_bytes = 2 * cfg.n_layer * cfg.n_kv_head * cfg.head_dim * engine.cache.k[0].element_size() * (P + new / 2)
        step_bytes = engine.model.nbytes() + kv_bytes
        bound = args.hbm_bytes_per_s / step_bytes
        say("b1_bytes_per_step", step_bytes, "{:,.0f}",
            f" (weights {engine.model.nbytes() / 1e9:.3f} GB + KV {kv_bytes / 1e9:.3f} GB)")
        say("b1_bound_steps_s", bound, "{:,.0f}", f" (at {args.hbm_bytes_per_s:.2e} B/s)")
        measured = say("b1_measured_steps_s", new / secs["decode_b1"], "{:,.0f}")
        say("b1_bandwidth_share", measured / bound, "{:.1%}",
            "" if cuda else " (meaningless on CPU: the bound is for --hbm-bytes-per-s)")

    caches = ["static"] + (["dynamic"] if args.hf_dynamic else [])
    theirs: dict[str, dict[str, float | None]] = {}
    for cache in list(caches):
        theirs[cache] = {}
        for row, (prompts, n) in work.items():
            try:
                sec, out = timed(hf_fn(hf, prompts, n, cache if cache == "static" else None, device),
                                 device, args.repeats)
            except Exception as e:  # noqa: BLE001 - only on CPU, where the static cache is not the point
                if cuda or cache != "static":
                    raise
                print(f"hf_static: skipped on CPU ({type(e).__name__}: {str(e)[:200]}); timing the dynamic cache")
                theirs[cache] = dict.fromkeys(work)
                if "dynamic" not in caches:
                    caches.append("dynamic")
                break
            theirs[cache][row] = report(f"hf_{cache}", row, sec)
            if row == agree_row and (cache == "static" or "theirs" not in tokens):
                tokens["theirs"] = out

    if "theirs" in tokens:
        k = min(32, new)
        pairs = list(zip(tokens["ours"], tokens["theirs"]))
        common = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))) for a, b in pairs]
        say(f"greedy_agree_{agree_row.split('_')[1]}_first{k}", sum(c >= k for c in common) / len(pairs), "{:.1%}",
            f" of {len(pairs)} rows (mean common prefix {sum(common) / len(pairs):.1f} of {new} tokens)")

    table = []
    for row in work:
        rec: dict[str, object] = {"row": row, "unit": "ms" if row == "ttft_b1" else "tok/s", "ours": ours[row]}
        for cache in caches:
            t = theirs[cache].get(row)
            rec[f"hf_{cache}"] = t
            rec[f"speedup_vs_{cache}"] = None if not t else (t / ours[row] if row == "ttft_b1" else ours[row] / t)
        table.append(rec)
    cols = ["ours"] + [c for cache in caches for c in (f"hf_{cache}", f"speedup_vs_{cache}")]
    fmt = lambda v, c: "-" if v is None else (f"{v:.2f}x" if c.startswith("speedup") else f"{v:,.1f}")  # noqa: E731
    print(f"\n{'row':<14}{'unit':<7}" + "".join(f"{c:>20}" for c in cols))
    for rec in table:
        print(f"{rec['row']:<14}{rec['unit']:<7}" + "".join(f"{fmt(rec[c], c):>20}" for c in cols))
    if args.out:
        meta = {"device": name, "torch": torch.__version__, "transformers": transformers.__version__,
                "preset": args.preset, "params": model.num_params(), "prompt_len": P, "new_tokens": new,
                "repeats": args.repeats, "mixed_lens": [lo, hi], "cuda_graphs": args.cuda_graphs and cuda,
                "compile": args.compile and cuda}
        with open(args.out, "w") as f:
            json.dump({**meta, "figures": figures, "rows": table}, f, indent=2)
        print(f"wrote {args.out}")

if __name__ == "__main__":
    main()
