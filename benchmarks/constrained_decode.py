"""Grammar-constrained decoding against free decoding (``generate_throughput.py --constrained``, issue 35).

No transformers needed. One process, one model (``--preset``, random weights, seeded), one engine
of ``--rows`` slots, three arms of ``--rows`` rows (default 64), temperature 1 (no top-k / top-p),
every row its own request with its own fixed seed, prompts of ``--prompt-len`` random ids:

- ``free``: unconstrained rows; each generates exactly ``--new-tokens`` tokens (no stop id);
- ``free_with_options``: the ``free`` arm with OpenAI's sampling options on every row (issue 47):
  ``presence_penalty`` 0.5, ``frequency_penalty`` 0.3 and a ``logit_bias`` of 50 ids;
  ``free_with_options_vs_free`` (target >= 0.9);
- ``one_schema``: every row under ``tool_grammar(gc, [get_weather], "required")`` (a glaive-style
  tool: a string with ``maxLength``, an enum, an integer with minimum / maximum);
- ``eight_schemas``: ``--schemas`` (8) different tools, one grammar each, ``rows / schemas`` rows each;
- ``free_like_one_schema``, ``free_like_eight_schemas``: free rows like the ``free`` arm's, but row
  ``i``'s ``max_new_tokens`` is drawn (seeded) from the lengths of the rows that the constrained arm
  of that name finished in its timed runs: the same work of prefills and short rows, without a
  grammar. ``{arm}_vs_like_free`` compares each constrained arm with it (like with like: target
  >= 0.7), ``{arm}_vs_free`` with the fixed-length ``free`` arm.

A constrained row ends when its JSON call is complete, at a random length under random weights.
The comparison keeps the batch full instead: each arm is a closed loop that starts ``--rows``
rows and, whenever one finishes, submits the next one at once (same schema, the next seed and
prompt), and stops the clock as soon as ``rows * new_tokens`` tokens came back (the free arm
reaches that exactly when its batch finishes, like one ``generate`` call); the rows still running
are then cancelled, untimed. ``{arm}_tok_s`` = tokens that came back / wall time (prefills of the
re-submitted rows included: a real tool-calling server pays them too; ``{arm}_rows_started`` and
``{arm}_mean_row_tokens`` say how many). Each arm runs once untimed (graph capture, compilation),
then ``--repeats`` times; the median is reported, with ``one_schema_vs_like_free`` and
``eight_schemas_vs_like_free`` (target >= 0.7) and the ratios against ``free``. Every finished constrained row of every run is decoded
and checked: ``<|function_call|>`` then JSON that parses and validates against the call schema
of its tools (jsonschema);
``parse_failures`` counts the rest (finish ``length`` and ``rejected`` included) and the first few
are printed: it must be 0, as must ``rejected_rows`` (rows of any arm whose grammar rejected a
token sampled under its own mask).

The grammar needs a tokenizer: ``--tokenizer DIR`` loads one, else a byte-level BPE is trained on
the standard library's ``.py`` files (``--tokenizer-bytes``, ~1-2 s) with the model's vocabulary
size (fewer ids when the text runs out of pairs: ids past the tokenizer are never allowed).

A/B of the free path (``--ab-commit``, default dc51aeb, the commit before constrained decoding):
``git archive COMMIT codechat`` is unpacked into a temporary directory, and two worker processes
(this script with ``--ab-worker``) build the same model and engine, one with ``PYTHONPATH`` at that
copy, one at this checkout (each followed by the caller's ``PYTHONPATH``); after their untimed warm-up the parent has them time the free arm in
turn, ``--ab-rounds`` rounds, alternating which goes first; ``ab_free_vs_base`` = median tok/s of
this checkout / median of the commit's (target: within 2%). Without git or without the commit in
the repository, the A/B is skipped with a message (``--ab-commit ''`` skips it). The JSON
(``--out``, default ``$OUT/generate_constrained.json`` when ``$OUT`` is set) holds every figure,
the settings and the parse failures.

    PYTHONPATH=. python benchmarks/generate_throughput.py --constrained --preset d20 --repeats 3
    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/generate_throughput.py --constrained --preset tiny
        --vocab-size 1024 --device cpu --rows 4 --schemas 4 --new-tokens 96 --prompt-len 8 --repeats 1
        --ab-commit ''      # (one line) CPU smoke check, ~8 s; with the A/B (no --ab-commit '') ~45 s

On a small CPU, torch's threads and llguidance's mask threads can oversubscribe the cores
(OMP_NUM_THREADS=1 there); CPU figures only show that the script runs.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import jsonschema
import torch

from codechat.chat.calls import FUNCTION_CALL_TOKEN
from codechat.config.device import resolve_device
from codechat.config.stages import preset
from codechat.engine import Engine, EngineConfig, Request, SamplingConfig
from codechat.model import build_model
from codechat.tokenizer import Tokenizer, train_tokenizer

# -- --constrained (issue 35): grammar-constrained decoding against free decoding ----------------------

#: Glaive-style tools with bounded arguments (strings with maxLength or an enum, integers with
#: minimum / maximum, a boolean): under random weights a call took <= 68 tokens on the tiny preset's
#: stdlib BPE (``--new-tokens`` must leave room: a row cut at the limit counts as a parse failure).
TOOLS: list[dict[str, Any]] = [
    {"name": "get_weather", "description": "Get the current weather in a city",
     "parameters": {"type": "object", "properties": {
         "location": {"type": "string", "maxLength": 32, "description": "The city and state, e.g. Paris, FR"},
         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
         "days": {"type": "integer", "minimum": 1, "maximum": 14}},
         "required": ["location", "unit", "days"], "additionalProperties": False}},
    {"name": "convert_currency", "description": "Convert an amount from one currency to another",
     "parameters": {"type": "object", "properties": {
         "amount": {"type": "integer", "minimum": 0, "maximum": 1000000},
         "from": {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY", "INR"]},
         "to": {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY", "INR"]}},
         "required": ["amount", "from", "to"], "additionalProperties": False}},
    {"name": "search_restaurants", "description": "Find restaurants near a place",
     "parameters": {"type": "object", "properties": {
         "location": {"type": "string", "maxLength": 24},
         "cuisine": {"type": "string", "enum": ["italian", "chinese", "mexican", "indian", "thai"]},
         "max_price": {"type": "integer", "minimum": 1, "maximum": 4}},
         "required": ["location", "cuisine"], "additionalProperties": False}},
    {"name": "calculate_bmi", "description": "Calculate the body mass index",
     "parameters": {"type": "object", "properties": {
         "weight_kg": {"type": "integer", "minimum": 20, "maximum": 300},
         "height_cm": {"type": "integer", "minimum": 100, "maximum": 250}},
         "required": ["weight_kg", "height_cm"], "additionalProperties": False}},
    {"name": "send_email", "description": "Send an email",
     "parameters": {"type": "object", "properties": {
         "to": {"type": "string", "maxLength": 24},
         "subject": {"type": "string", "maxLength": 24},
         "urgent": {"type": "boolean"}},
         "required": ["to", "subject", "urgent"], "additionalProperties": False}},
    {"name": "get_stock_price", "description": "Get the latest price of a stock",
     "parameters": {"type": "object", "properties": {
         "symbol": {"type": "string", "maxLength": 5},
         "exchange": {"type": "string", "enum": ["NASDAQ", "NYSE", "LSE"]}},
         "required": ["symbol", "exchange"], "additionalProperties": False}},
    {"name": "book_flight", "description": "Book a flight",
     "parameters": {"type": "object", "properties": {
         "origin": {"type": "string", "maxLength": 3},
         "destination": {"type": "string", "maxLength": 3},
         "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
         "cabin": {"type": "string", "enum": ["economy", "business", "first"]}},
         "required": ["origin", "destination", "passengers", "cabin"], "additionalProperties": False}},
    {"name": "translate_text", "description": "Translate text into another language",
     "parameters": {"type": "object", "properties": {
         "text": {"type": "string", "maxLength": 32},
         "target_language": {"type": "string", "enum": ["en", "fr", "de", "es", "zh"]}},
         "required": ["text", "target_language"], "additionalProperties": False}},
]
ARMS = ("free", "free_with_options", "one_schema", "eight_schemas")
#: The like-for-like free arms: free rows whose ``max_new_tokens`` are drawn from the finished rows'
#: lengths of the constrained arm they are named after (same prompts and seeds).
LIKE = {"free_like_one_schema": "one_schema", "free_like_eight_schemas": "eight_schemas"}


def stdlib_tokenizer(vocab_size: int, max_bytes: int) -> Any:
    """A byte-level BPE of (up to) ``vocab_size`` ids trained on the standard library's ``.py``
    files, ``max_bytes`` characters of them (sorted paths: the same tokenizer every time)."""
    texts, n = [], 0
    for p in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if n >= max_bytes:
            break
        try:
            texts.append(p.read_text(errors="replace"))
        except OSError:
            continue
        n += len(texts[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fewer ids than asked is fine here (module docstring)
        return train_tokenizer(texts, vocab_size, show_progress=False)


def check_call(tok: Any, ids: list[int], tools: list[dict[str, Any]]) -> str:
    """Why the constrained row ``ids`` is not ``<|function_call|>`` + a valid call to one of ``tools``
    ("" when it is; a trailing ``<|end|>`` is allowed)."""
    if not ids or ids[0] != tok.special_id(FUNCTION_CALL_TOKEN):
        return f"does not start with {FUNCTION_CALL_TOKEN}: {ids[:8]}"
    body = ids[1:-1] if ids[-1] == tok.end_id else ids[1:]
    if any(i in tok.special_ids or i >= tok.vocab_size for i in body):
        return f"a special or out-of-vocabulary id inside the call: {body}"
    text = tok.decode(body)
    try:
        call = json.loads(text)
    except ValueError as e:
        return f"not JSON ({e}): {text!r}"
    from codechat.chat.strict import call_schema  # not at the top: the A/B's base commit has no grammar modules
    err = next((e.message for e in jsonschema.Draft202012Validator(call_schema(tools)).iter_errors(call)), "")
    return f"{err}: {text!r}" if err else ""


def closed_loop(engine: Engine, make: Callable[[int], Request], rows: int, target: int,
                device: torch.device) -> dict[str, Any]:
    """Keep ``rows`` rows running (row ``i`` is ``make(i)``, one sample each; a finished row is
    replaced at once) until ``target`` tokens came back; then cancel the rest (untimed).

    Returns:
        ``seconds`` (wall time to the step that passed ``target``), ``tokens`` (returned by then),
        ``started`` (rows submitted), ``finished``: ``(i, Sample)`` of each row finished in time.
    """
    live: dict[int, int] = {}  # request id -> i
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for i in range(rows):
        live[engine.add(make(i))] = i
    started, tokens, done = rows, 0, []
    while tokens < target and engine.has_work():
        ended = []
        for ev in engine.step():
            tokens += 1
            if ev.finish is not None:
                ended.append(ev.request)
        for rid in ended:
            done.append((live.pop(rid), engine.pop(rid)[0]))
            if tokens < target:
                live[engine.add(make(started))] = started
                started += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    for rid in live:
        engine.cancel(rid)
    for _ in engine.run():
        pass
    for rid in live:
        engine.pop(rid)
    return {"seconds": seconds, "tokens": tokens, "started": started, "finished": done}


def free_request(prompts: list[list[int]], new: int, seed: int) -> Callable[[int], Request]:
    """Row ``i`` of the free arm: prompt ``i % len(prompts)``, seed ``seed + i``, temperature 1."""
    sc = SamplingConfig(max_new_tokens=new, temperature=1.0, top_k=0, top_p=1.0)
    return lambda i: Request(prompts[i % len(prompts)], sc, seed=seed + i)


def build(args: argparse.Namespace) -> tuple[Any, Engine, torch.device, list[list[int]]]:
    """(model, engine of ``args.rows`` slots, device, ``args.rows`` random prompts): the same for the
    same arguments in any process (seeded)."""
    torch.manual_seed(args.seed)
    device = resolve_device(args.device)
    cfg = preset(args.preset, vocab_size=args.vocab_size)
    model = build_model(cfg, device).eval()
    g = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(0, cfg.vocab_size, (args.prompt_len,), generator=g).tolist() for _ in range(args.rows)]
    engine = Engine(model, EngineConfig(slots=args.rows, max_len=args.prompt_len + args.new_tokens + 8,
                                        cuda_graphs=args.cuda_graphs, compile=args.compile,
                                        decode_steps=args.decode_steps))
    return model, engine, device, prompts


def ab_worker(args: argparse.Namespace) -> None:
    """``--ab-worker``: build the model and engine (with whichever ``codechat`` is on the path), run
    the free arm once untimed, print ``READY``; then time the free arm once per ``run`` line on
    stdin, printing ``RESULT {"tok_s": ...}``, until ``quit`` or end of input."""
    _, engine, device, prompts = build(args)
    make, target = free_request(prompts, args.new_tokens, args.seed), args.rows * args.new_tokens
    closed_loop(engine, make, args.rows, target, device)
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        r = closed_loop(engine, make, args.rows, target, device)
        print("RESULT " + json.dumps({"tok_s": r["tokens"] / r["seconds"], "tokens": r["tokens"],
                                      "seconds": r["seconds"]}), flush=True)


def _read(proc: subprocess.Popen, marker: str) -> str:
    """The rest of the first line of ``proc``'s stdout that starts with ``marker`` (other lines are echoed)."""
    for line in proc.stdout:
        if line.startswith(marker):
            return line[len(marker):].strip()
        print(f"  [worker] {line.rstrip()}")
    raise RuntimeError(f"an A/B worker exited (code {proc.wait()}) before printing {marker!r}; its stderr is above")


def ab_free(args: argparse.Namespace) -> dict[str, Any]:
    """The A/B of the free arm against ``args.ab_commit`` (module docstring); ``{"skipped": why}`` when it cannot run."""
    root = Path(__file__).resolve().parent.parent
    if not args.ab_commit:
        return {"skipped": "--ab-commit ''"}
    if shutil.which("git") is None:
        return {"skipped": "no git on this machine: cannot check out the base commit"}
    res = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "--quiet", f"{args.ab_commit}^{{commit}}"],
                         capture_output=True, text=True)
    if res.returncode != 0:
        return {"skipped": f"commit {args.ab_commit!r} is not in {root}'s git repository (no .git, or a shallow copy)"}
    sha = res.stdout.strip()
    tmp = tempfile.mkdtemp(prefix="codechat_ab_")
    procs: dict[str, subprocess.Popen] = {}
    try:
        tar = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", sha, "codechat"],
                             capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(tar)) as t:
            t.extractall(tmp)
        flags = ["--ab-worker", "--preset", args.preset, "--vocab-size", str(args.vocab_size), "--rows", str(args.rows),
                 "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens), "--seed", str(args.seed),
                 "--device", args.device, "--decode-steps", str(args.decode_steps),
                 "--cuda-graphs" if args.cuda_graphs else "--no-cuda-graphs",
                 "--compile" if args.compile else "--no-compile"]
        for side, path in (("base", tmp), ("this", str(root))):
            # the side's checkout first, then the caller's path: packages a GPU machine gets through
            # PYTHONPATH (carried wheels) stay importable in the worker
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH")) if p)}
            script = Path(__file__).resolve().with_name("generate_throughput.py")  # its --ab-worker
            procs[side] = subprocess.Popen([sys.executable, str(script), *flags], env=env,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for side, p in procs.items():  # both compile and capture at once; timing starts after
            _read(p, "READY")
        runs: dict[str, list[float]] = {"base": [], "this": []}
        for r in range(args.ab_rounds):
            for side in (("base", "this") if r % 2 == 0 else ("this", "base")):
                procs[side].stdin.write("run\n")
                procs[side].stdin.flush()
                runs[side].append(json.loads(_read(procs[side], "RESULT "))["tok_s"])
                print(f"ab round {r}: {side} ({sha[:7] if side == 'base' else 'this checkout'}) "
                      f"{runs[side][-1]:,.1f} tok/s")
    finally:
        for p in procs.values():
            try:
                p.stdin.write("quit\n")
                p.stdin.close()
            except (BrokenPipeError, ValueError):
                pass
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    base, this = statistics.median(runs["base"]), statistics.median(runs["this"])
    return {"commit": sha, "rounds": args.ab_rounds, "base_tok_s": runs["base"], "this_tok_s": runs["this"],
            "base_median_tok_s": base, "this_median_tok_s": this, "free_vs_base": this / base}


def constrained_main(args: argparse.Namespace) -> None:
    """``--constrained``: the three arms, the parse check, the A/B, the JSON (module docstring)."""
    from codechat.chat.strict import tool_grammar  # (see check_call)
    from codechat.engine.grammar import GrammarCompiler

    if args.rows % args.schemas or not 1 <= args.schemas <= len(TOOLS):
        raise SystemExit(f"--schemas must be in 1..{len(TOOLS)} and divide --rows ({args.rows}), got {args.schemas}")
    model, engine, device, prompts = build(args)
    cuda, V, new = device.type == "cuda", model.cfg.vocab_size, args.new_tokens
    t0 = time.perf_counter()
    tok = Tokenizer.load(args.tokenizer) if args.tokenizer else stdlib_tokenizer(V, args.tokenizer_bytes)
    if tok.vocab_size > V:
        raise SystemExit(f"the tokenizer has {tok.vocab_size} ids, over the model's {V}: give --vocab-size >= that")
    gc = GrammarCompiler(tok, V)  # the model's logits width (positional: the keyword was renamed in 4a2f884)
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"device: {name}; torch {torch.__version__}; preset {args.preset}: {model.num_params() / 1e6:.1f}M params, "
          f"vocab {V}; tokenizer {args.tokenizer or 'stdlib BPE'} of {tok.vocab_size} ids "
          f"({time.perf_counter() - t0:.1f} s); {args.rows} rows, prompt {args.prompt_len}, up to {new} new tokens, "
          f"temperature 1; engine cuda_graphs={args.cuda_graphs and cuda} compile={args.compile and cuda} "
          f"decode_steps={engine.decode_steps}")

    per = args.rows // args.schemas
    one = tool_grammar(gc, [TOOLS[0]], "required")
    many = [tool_grammar(gc, [t], "required") for t in TOOLS[:args.schemas]]
    tools_of = {"one_schema": lambda i: [TOOLS[0]], "eight_schemas": lambda i: [TOOLS[(i % args.rows) // per]]}
    free = free_request(prompts, new, args.seed)
    sc = SamplingConfig(max_new_tokens=new, temperature=1.0, top_k=0, top_p=1.0)
    with_options = replace(sc, presence_penalty=0.5, frequency_penalty=0.3,
                      logit_bias=tuple((k * 97 % V, 2.0 if k % 2 else -2.0) for k in range(50)))
    makers: dict[str, Callable[[int], Request]] = {
        "free": free,
        "free_with_options": lambda i: Request(prompts[i % args.rows], with_options, seed=args.seed + i),
        "one_schema": lambda i: Request(prompts[i % args.rows], sc, seed=args.seed + i, grammar=one),
        # row i keeps the schema of its place in the batch: a finished row's replacement gets the same one
        "eight_schemas": lambda i: Request(prompts[i % args.rows], sc, seed=args.seed + i,
                                           grammar=many[(i % args.rows) // per]),
    }
    target = args.rows * new
    figures: dict[str, Any] = {}
    failures: list[dict[str, Any]] = []
    observed: dict[str, list[int]] = {}  # constrained arm -> lengths of its rows finished in timed runs
    checked = rejected = 0

    def like(arm: str) -> Callable[[int], Request]:
        lengths = observed[LIKE[arm]] or [new]
        g = torch.Generator().manual_seed(args.seed + 1)
        draws = [lengths[k] for k in torch.randint(0, len(lengths), (max(4 * target, 1),), generator=g).tolist()]
        return lambda i: Request(prompts[i % args.rows], SamplingConfig(max_new_tokens=draws[i % len(draws)],
                                                                        temperature=1.0, top_k=0, top_p=1.0),
                                 seed=args.seed + i)
    for arm in (*ARMS, *LIKE):
        if arm in LIKE:
            makers[arm] = like(arm)
        results = []
        for rep in range(args.repeats + 1):  # the first is the untimed warm-up
            r = closed_loop(engine, makers[arm], args.rows, target, device)
            rejected += sum(smp.finish == "rejected" for _, smp in r["finished"])
            if arm in LIKE.values():
                for i, s in r["finished"]:
                    checked += 1
                    why = check_call(tok, s.token_ids, tools_of[arm](i)) if s.finish == "stop" else \
                        f"finish {s.finish} after {len(s.token_ids)} tokens: {tok.decode(s.token_ids)!r}"
                    if why:
                        failures.append({"arm": arm, "row": i, "finish": s.finish, "why": why})
            if rep:
                results.append(r)
                if arm in LIKE.values():
                    observed.setdefault(arm, []).extend(len(smp.token_ids) for _, smp in r["finished"])
        tok_s = [r["tokens"] / r["seconds"] for r in results]
        med = results[tok_s.index(statistics.median_low(tok_s))]
        lens = [len(s.token_ids) for _, s in med["finished"]]
        figures[f"{arm}_tok_s"] = statistics.median(tok_s)
        figures[f"{arm}_tok_s_runs"] = tok_s
        figures[f"{arm}_tokens"] = med["tokens"]
        figures[f"{arm}_seconds"] = med["seconds"]
        figures[f"{arm}_rows_started"] = med["started"]
        figures[f"{arm}_mean_row_tokens"] = sum(lens) / len(lens) if lens else 0.0
        figures[f"{arm}_max_row_tokens"] = max(lens, default=0)
        print(f"{arm}_tok_s: {figures[f'{arm}_tok_s']:,.1f} ({med['tokens']} tokens in {med['seconds']:.3f} s; "
              f"{med['started']} rows started, finished rows {figures[f'{arm}_mean_row_tokens']:.1f} tokens on "
              f"average, {figures[f'{arm}_max_row_tokens']} at most)")
    figures["free_with_options_vs_free"] = figures["free_with_options_tok_s"] / figures["free_tok_s"]
    ok = "ok" if figures["free_with_options_vs_free"] >= 0.9 else "BELOW the 0.9x target"
    print(f"free_with_options_vs_free: {figures['free_with_options_vs_free']:.3f}x ({ok})")
    for like_arm, arm in LIKE.items():
        figures[f"{arm}_vs_free"] = figures[f"{arm}_tok_s"] / figures["free_tok_s"]
        figures[f"{arm}_vs_like_free"] = figures[f"{arm}_tok_s"] / figures[f"{like_arm}_tok_s"]
        ok = "ok" if figures[f"{arm}_vs_like_free"] >= 0.7 else "BELOW the 0.7x target"
        print(f"{arm}_vs_like_free: {figures[f'{arm}_vs_like_free']:.3f}x ({ok}); {arm}_vs_free "
              f"({new}-token rows): {figures[f'{arm}_vs_free']:.3f}x")
    figures["constrained_rows_checked"] = checked
    figures["parse_failures"] = len(failures)
    figures["rejected_rows"] = rejected
    print(f"parse_failures: {len(failures)} of {checked} finished constrained rows; rows ended by a rejected "
          f"token, every arm: {rejected}")
    for f in failures[:5]:
        print(f"  {f['arm']} row {f['row']} ({f['finish']}): {f['why'][:300]}")
    model_params, decode_steps = model.num_params(), engine.decode_steps
    del engine, model, makers, free
    if cuda:
        torch.cuda.empty_cache()
    ab = ab_free(args)
    if "skipped" in ab:
        print(f"ab: skipped ({ab['skipped']})")
    else:
        figures["ab_free_vs_base"] = ab["free_vs_base"]
        ok = "ok" if abs(ab["free_vs_base"] - 1) <= 0.02 else "OUTSIDE the 2% target"
        print(f"ab_free_vs_base: {ab['free_vs_base']:.3f}x (this checkout {ab['this_median_tok_s']:,.1f} tok/s, "
              f"{ab['commit'][:7]} {ab['base_median_tok_s']:,.1f} tok/s, median of {ab['rounds']} rounds; {ok})")
    out = args.out or (str(Path(os.environ["OUT"]) / "generate_constrained.json") if os.environ.get("OUT") else "")
    if out:
        meta = {"device": name, "torch": torch.__version__, "preset": args.preset, "params": model_params,
                "vocab_size": V, "tokenizer": args.tokenizer or "stdlib BPE", "tokenizer_ids": tok.vocab_size,
                "rows": args.rows, "schemas": args.schemas, "prompt_len": args.prompt_len, "new_tokens": new,
                "repeats": args.repeats, "temperature": 1.0, "cuda_graphs": args.cuda_graphs and cuda,
                "compile": args.compile and cuda, "decode_steps": decode_steps,
                "tools": [t["name"] for t in TOOLS[:args.schemas]]}
        with open(out, "w") as f:
            json.dump({**meta, "figures": figures, "ab": ab, "failures": failures}, f, indent=2)
        print(f"wrote {out}")
    if failures:
        raise SystemExit(f"{len(failures)} constrained rows did not parse as a valid call")




def main() -> None:
    """``python benchmarks/constrained_decode.py ARGS`` = ``generate_throughput.py --constrained ARGS``
    (the options are that script's)."""
    import generate_throughput
    sys.argv.insert(1, "--constrained")
    generate_throughput.main()


if __name__ == "__main__":
    main()
