"""Does a model exported with ``codechat export --format hf`` generate in ``transformers`` what codechat's engine does?

Exports ``--model`` (or random weights of ``--preset``) with :func:`codechat.hf.export_hf`, loads it
with ``AutoModelForCausalLM.from_pretrained`` and runs ``generate`` greedily, one prompt at a time,
against :class:`codechat.engine.Engine` greedy (stop at ``<|end|>``), both in ``--dtype``. The
prompts are HumanEval's: half as code to continue (``<|end|>`` + the prompt, as in pretraining),
half as chat turns through the exported chat template (whose ids are checked against codechat's
``render_for_completion``). bf16 rounding differs between the two implementations, so a row may
diverge where the two best logits are nearly tied; transformers' top-2 gap at each divergence is
printed. Random weights have near-uniform logits (many near-ties): use a trained checkpoint for the
figure that matters.

    python benchmarks/hf_generate_match.py --device cpu --preset tiny --new 16        # quick check, CPU
    python benchmarks/hf_generate_match.py --preset d20                               # random d20, CUDA
    python benchmarks/hf_generate_match.py --model runs/x/sft                         # trained weights

Printed: one line per diverging row, then ``match: K/16 rows equal ...`` (the match rate).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from codechat import checkpoint as ckpt
from codechat.chat.conversation import Conversation, Message, render_for_completion
from codechat.config.stages import default_corpus_dirs, preset, to_dict
from codechat.data.sources import iter_split_texts
from codechat.engine import Engine, EngineConfig, Request, SamplingConfig
from codechat.eval.problems import load_humaneval
from codechat.hf import ExportConfig, export_hf
from codechat.model import build_model
from codechat.tokenizer import Tokenizer, train_tokenizer

RANDOM_TOKENIZER_VOCAB = 4096  # a tokenizer trained on the spot for random weights
RANDOM_TOKENIZER_FILES = 300


def random_checkpoint(name: str, tokenizer: str | None, root: Path, device: torch.device) -> Path:
    """A step-0 checkpoint of preset ``name`` with random weights (seed 0) and a tokenizer."""
    tok_dir = root / "tokenizer"
    if tokenizer:
        Tokenizer.load(tokenizer).save(tok_dir)
    else:
        texts = iter_split_texts(default_corpus_dirs(), "train", max_files=RANDOM_TOKENIZER_FILES)
        train_tokenizer(texts, RANDOM_TOKENIZER_VOCAB, show_progress=False).save(tok_dir)
    torch.manual_seed(0)
    model = build_model(preset(name, vocab_size=Tokenizer.load(tok_dir).vocab_size), device)
    return ckpt.save(root / "checkpoints", 0, model={k: v.cpu() for k, v in model.state_dict().items()},
                     state={"step": 0, "meta": {"stage": "pretrain", "model": to_dict(model.cfg)}}, tokenizer_dir=tok_dir)


def prompts(tok: Tokenizer, hf_tok, n: int) -> list[list[int]]:
    """``n`` prompts: HumanEval as code (first half) and as chat turns (second half, via the chat template)."""
    problems = load_humaneval()
    code = [[tok.end_id] + tok.encode(p.base_prompt) for p in problems[:n - n // 2]]
    chat = []
    for p in problems[n - n // 2:n]:
        question = f"Complete this function:\n{p.base_prompt}"
        ids = hf_tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=True)["input_ids"]
        if ids != render_for_completion(tok, Conversation((Message("user", question),))):
            raise SystemExit(f"{p.task_id}: the exported chat template's ids differ from codechat's render")
        chat.append(ids)
    return code + chat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="checkpoint or stage directory (default: random weights of --preset)")
    ap.add_argument("--preset", default="d20", help="preset for random weights (default d20)")
    ap.add_argument("--tokenizer", help="tokenizer for random weights (default: one trained on the stdlib now)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="both sides' dtype (default bf16)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new", type=int, default=64, help="tokens generated per prompt at most")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import transformers
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    with tempfile.TemporaryDirectory() as tmp:
        src = ckpt.resolve(args.model) if args.model else random_checkpoint(args.preset, args.tokenizer, Path(tmp), dev)
        out = export_hf(ckpt.load(src), Path(tmp) / "hf", ExportConfig(dtype=args.dtype))
        model, tok, _ = ckpt.load_model(src, dev)
        hf_tok = AutoTokenizer.from_pretrained(out)
        dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
        hf = AutoModelForCausalLM.from_pretrained(out, **{dtype_kw: dtype}).to(dev).eval()
    ids = prompts(tok, hf_tok, args.prompts)
    engine = Engine(model, EngineConfig(slots=len(ids), dtype=args.dtype))
    greedy = SamplingConfig(max_new_tokens=args.new, temperature=0.0, top_p=1.0)
    t = time.perf_counter()
    ours = [s[0].token_ids for s in engine.generate([Request(p, greedy, stop_ids=[tok.end_id]) for p in ids])]
    ours_s = time.perf_counter() - t
    theirs, gaps, t = [], [], time.perf_counter()
    with torch.no_grad():
        for p in ids:
            g = hf.generate(torch.tensor([p], device=dev), max_new_tokens=args.new, do_sample=False,
                            output_scores=True, return_dict_in_generate=True, eos_token_id=tok.end_id,
                            pad_token_id=tok.end_id)
            theirs.append(g.sequences[0, len(p):].tolist())
            top = torch.stack(g.scores).float()[:, 0].topk(2, dim=-1).values  # (steps, 2)
            gaps.append((top[:, 0] - top[:, 1]).tolist())
    theirs_s = time.perf_counter() - t
    rows = []
    for r, (a, b) in enumerate(zip(ours, theirs)):
        pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))
        if pos is not None:
            gap = gaps[r][pos] if pos < len(gaps[r]) else float("nan")
            rows.append({"row": r, "position": pos, "hf_top2_gap": round(gap, 4)})
            print(f"row {r:2d} ({'code' if r < len(ids) - len(ids) // 2 else 'chat'}) diverges at token {pos:3d}; "
                  f"transformers' top-2 gap there {gap:.4f}")
    same = len(ids) - len(rows)
    res = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "model": args.model or args.preset,
           "dtype": args.dtype, "transformers": transformers.__version__, "rows": len(ids), "new_tokens": args.new,
           "rows_equal": same, "match_rate": same / len(ids), "divergences": rows,
           "engine_s": round(ours_s, 2), "transformers_s": round(theirs_s, 2)}
    print(f"match: {same}/{len(ids)} rows equal ({same / len(ids):.1%}) over up to {args.new} greedy tokens, "
          f"{args.dtype}, {res['device']}; engine {ours_s:.1f} s, transformers generate {theirs_s:.1f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
