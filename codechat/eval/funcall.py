"""Function-calling evaluation: does the model call the right function with the right arguments,
and answer in text when no call is due?

``codechat eval run --suite funcall:PATH`` reads conversations with tool schemas (any chat
format :mod:`codechat.data.formats` reads: glaive raw or ShareGPT, OpenAI ``messages`` with
``tools``/``tool_calls``). Every assistant turn of every conversation is one case: the
conversation before it (system turn with the declared tools, earlier turns, function responses)
is the prompt; the model answers greedily through the engine. A turn that calls a function is
scored for

- ``parsed``: the reply holds a call that parses (:func:`codechat.chat.calls.parse_assistant`);
- ``schema_valid``: its arguments validate against the called tool's schema
  (:func:`codechat.tools.validate_arguments`, the schema loaded by
  :func:`codechat.tools.tool_from_schema`, which repairs sloppy schemas in the wild, counted);
- ``name_correct``: the right function;
- ``arguments_exact``: the right function with arguments equal after normalisation
  (:func:`normalize_value`: key order, surrounding whitespace, 2 vs 2.0, a number written as a
  string where the schema says number);

a turn that answers in text is scored for ``no_call``. Rates are over the turns of each kind.

Every reply also has an ``outcome`` (:data:`OUTCOMES`), so that a call that was never begun, one
cut short and one malformed are told apart: ``call`` (a call that parses), ``text`` (no call
begun), ``cut_by_length`` (a call begun and cut by ``max_new_tokens``), ``does_not_parse`` (a
call begun and ended, malformed), ``rejected`` (the grammar rejected a sampled token: an engine
bug). Over the call turns, :func:`summarise` counts ``no_call`` (answered in text),
``cut_by_length``, ``does_not_parse`` and ``rejected``, and gives ``finished_parse_rate`` and
``finished_schema_valid_rate``: over the call turns whose reply began a call and ended it (cut
ones aside), the share that parse and that validate — what a grammar promises (100% under
``strict``).

Splits: :func:`codechat.data.benchmarks.conversation_split`, a stated hash of each record (62 of
the glaive sample's 300 conversations are held out); ``all`` is both parts. SFT on
``--data FILE@train`` never sees a held-out conversation.

Strict calls (``strict``, ``--strict on|off|both``): with ``on`` every case's reply is generated under
:func:`codechat.chat.strict.tool_grammar` ``(tools, "auto", strict=True)`` of its conversation's tools
(as loaded, repaired schemas included): the model still chooses between text and a call, but a
call always parses, names a declared tool and validates; it is scored as above. A conversation
whose tools the grammar library cannot compile is generated free and counted (``grammar_errors``).
``both`` runs the free and the strict pass (batched together), ``off`` (default) the free one only;
the strict pass needs the grammar extra (:class:`codechat.engine.grammar.GrammarUnavailable`).

``OUT/samples.jsonl`` has one row per case and pass (``"strict": false|true``); ``OUT/results.json``
the rates, counts and settings (``settings.strict``: the mode). Its top-level rates are the free
pass's (absent with ``on``; the counts ``cases``, ``call_turns``, ``text_turns`` are always there, the
same for both passes); ``strict``, present with ``on`` and ``both``, holds the strict pass's counts
and rates (the keys of :func:`summarise`) and ``grammar_errors``.
``OUT/run.json`` keeps the settings that change a result (suite, split, ``max_new_tokens``,
``limit``, ``strict``, model, sampler version), checked as every suite checks its ``OUT``
(:func:`codechat.eval.suites.check_run_settings`): a rerun into an ``OUT`` holding results made
with other settings is refused before anything is generated; with the same settings every case
is generated again and the files are rewritten.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from codechat.config.atomic import write_text
from codechat.data.benchmarks import conversation_split

SPLITS = ("heldout", "train", "all")
#: How a reply ended (module docstring).
OUTCOMES = ("call", "text", "cut_by_length", "does_not_parse", "rejected")
#: ``strict`` modes: the free pass only, the strict pass only, both.
STRICT_MODES = ("off", "on", "both")


def load_cases(path: str | Path, split: str = "heldout", limit: int | None = None) -> list[dict[str, Any]]:
    """The cases of the conversations of ``path`` in ``split``: dicts with ``id`` (``line:turn``),
    ``conversation`` (the prompt, a :class:`~codechat.chat.conversation.Conversation`) and ``expected`` (the
    assistant :class:`~codechat.chat.conversation.Message`).

    Raises:
        ValueError: an unknown split, or no assistant turn in it.
        codechat.data.formats.FormatError: a record in no known format (file and line named).
    """
    from codechat.chat.conversation import Conversation
    from codechat.data.formats import records_from_rows
    from codechat.data.readers import read_rows
    if split not in SPLITS:
        raise ValueError(f"funcall split must be one of {', '.join(SPLITS)}, got {split!r}")
    # a row that is not a JSON object goes on to records_from_rows, which names its file and line
    rows = ((line, r) for line, r in read_rows(path)
            if split == "all" or not isinstance(r, dict) or conversation_split(r) == split)
    cases = []
    for rec in records_from_rows(rows, str(path)):
        conv = rec.conversation
        for i, m in enumerate(conv.messages):
            if m.role == "assistant" and i > 0:
                cases.append({"id": f"{rec.line}:{i}", "conversation": Conversation(conv.messages[:i], conv.tools),
                              "expected": m})
        if limit and len({c["id"].split(":")[0] for c in cases}) >= limit:
            break
    if not cases:
        raise ValueError(f"{path}: no assistant turn to evaluate in split {split!r}")
    return cases


def normalize_value(value: Any, schema: Mapping[str, Any] | None = None) -> Any:
    """A canonical form of an argument value for comparison: dicts by key, strings stripped, every
    number a float, and a string holding a number where ``schema`` says number/integer converted."""
    kind = (schema or {}).get("type")
    if isinstance(value, Mapping):
        props = (schema or {}).get("properties", {})
        return {k: normalize_value(v, props.get(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalize_value(v, (schema or {}).get("items")) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = " ".join(value.split())
        if kind in ("number", "integer"):
            try:
                number = float(text)
                return number if math.isfinite(number) else text
            except ValueError:
                return text
        return text
    return value


def score_case(expected: Any, content: str, call: dict | None, tried_call: bool,
               tools: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The scores of one reply (module docstring). ``tools``: name -> normalised parameters schema."""
    from codechat.tools import Tool, validate_arguments
    want = expected.function_call
    if want is None:
        return {"kind": "text", "no_call": call is None and not tried_call}
    row: dict[str, Any] = {"kind": "call", "parsed": call is not None, "schema_valid": False,
                           "name_correct": False, "arguments_exact": False, "invalid_reason": None}
    if call is None:
        return row
    params = tools.get(call["name"])
    if params is not None:
        reason = validate_arguments(Tool(call["name"], parameters=params), call["arguments"])
        row["schema_valid"], row["invalid_reason"] = reason is None, reason
    else:
        row["invalid_reason"] = f"undeclared function {call['name']!r}"
    row["name_correct"] = call["name"] == want["name"]
    row["arguments_exact"] = row["name_correct"] and (normalize_value(call["arguments"], params)
                                                      == normalize_value(want["arguments"], params))
    return row


def outcome(reply: Any, finish: str | None) -> str:
    """The :data:`OUTCOMES` entry of a reply read by :func:`codechat.chat.calls.parse_reply_ids`
    whose row ended with engine finish ``finish``."""
    if finish == "rejected":
        return "rejected"
    if reply.call is not None:
        return "call"
    if reply.error is None:
        return "text"
    return "cut_by_length" if finish == "length" else "does_not_parse"


def summarise(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Rates over call turns (parse, schema-valid, name, argument exact match) and text turns (no
    call); the call turns' outcome counts and the rates over their finished calls (module docstring)."""
    calls = [r for r in rows if r["kind"] == "call"]
    texts = [r for r in rows if r["kind"] == "text"]
    finished = [r for r in calls if r.get("outcome") in ("call", "does_not_parse")]

    def rate(rs: Sequence[Mapping[str, Any]], key: str) -> float | None:
        return sum(bool(r[key]) for r in rs) / len(rs) if rs else None

    def count(what: str) -> int:
        return sum(r.get("outcome") == what for r in calls)
    return {"cases": len(rows), "call_turns": len(calls), "text_turns": len(texts),
            "parse_rate": rate(calls, "parsed"), "schema_valid_rate": rate(calls, "schema_valid"),
            "name_accuracy": rate(calls, "name_correct"), "arguments_exact_match": rate(calls, "arguments_exact"),
            "no_call_accuracy": rate(texts, "no_call"),
            "no_call": count("text"), "cut_by_length": count("cut_by_length"),
            "does_not_parse": count("does_not_parse"), "rejected": count("rejected"),
            "finished_parse_rate": rate(finished, "parsed"), "finished_schema_valid_rate": rate(finished, "schema_valid")}


def run_funcall_suite(engine: Any, tok: Any, *, path: str | Path, out_dir: str | Path, split: str = "heldout",
                      max_new_tokens: int = 256, limit: int | None = None, model_id: str | None = None,
                      strict: str = "off") -> dict[str, Any]:
    """Generate a reply for every case of ``path``'s ``split`` (greedy, batched through ``engine``),
    score it, write ``run.json``, ``samples.jsonl`` and ``results.json`` to ``out_dir``; returns the results.

    Args:
        max_new_tokens: tokens per reply at most (half the engine's context caps it).
        strict: ``off``, ``on`` or ``both``: which passes run (module docstring).

    Raises:
        ValueError: see :func:`load_cases`; an unknown ``strict``; or ``out_dir`` holds results made
            with other settings (checked before anything is generated).
        codechat.engine.grammar.GrammarUnavailable: a strict pass without the grammar library.
    """
    from codechat.chat.budget import render_for_completion_within
    from codechat.chat.calls import FUNCTION_CALL_TOKEN, parse_reply_ids
    from codechat.engine import Request, SamplingConfig
    from codechat.eval.suites import SAMPLER_VERSION, check_run_settings
    from codechat.tools import tool_from_schema
    if strict not in STRICT_MODES:
        raise ValueError(f"strict must be one of {', '.join(STRICT_MODES)}, got {strict!r}")
    t0 = time.perf_counter()
    cases = load_cases(path, split, limit)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = f"funcall:{path}"
    check_run_settings(out / "run.json", {"suite": spec, "split": split, "max_new_tokens": max_new_tokens,
                                          "limit": limit, "strict": strict, "model": model_id,
                                          "sampler": SAMPLER_VERSION},
                       any((out / name).is_file() for name in ("samples.jsonl", "results.json")))
    passes = {"off": (False,), "on": (True,), "both": (False, True)}[strict]
    grammar_of = _strict_grammars(engine, tok) if strict != "off" else None
    fc = tok.special_id(FUNCTION_CALL_TOKEN)
    stops = sorted(tok.special_ids - {fc})
    new = min(max_new_tokens, engine.max_len // 2)
    loaded: dict[str, list] = {}  # the turns of one conversation share its tools: load them once
    prompts, keys, truncated, normalised = [], [], 0, 0
    for c in cases:
        ids, counts = render_for_completion_within(tok, c["conversation"], engine.max_len - new)
        truncated += bool(counts.turns_dropped or counts.prompt_tokens_cut)
        key = json.dumps(c["conversation"].tools, sort_keys=True)
        if key not in loaded:
            loaded[key] = [tool_from_schema(t, f"{path}: case {c['id']}") for t in c["conversation"].tools or ()]
        normalised += sum(bool(t.changes) for t in loaded[key])
        prompts.append(ids)
        keys.append(key)
    # (case, prompt, tools key, strict?, (grammar, why none)) of each reply, the passes batched together
    jobs = [(c, ids, key, s, grammar_of(key, loaded[key]) if s else (None, None))
            for s in passes for c, ids, key in zip(cases, prompts, keys)]
    outputs = engine.generate([Request(ids, SamplingConfig(new, temperature=0.0), stop_ids=stops, grammar=g)
                               for _, ids, _, _, (g, _) in jobs])
    rows = []
    for (c, _, key, s, (_, grammar_error)), [sample] in zip(jobs, outputs):
        reply = parse_reply_ids(tok, sample.token_ids)
        content, call = reply.content, reply.call
        row = score_case(c["expected"], content, call, fc in sample.token_ids,
                         {t.name: t.parameters for t in loaded[key]})
        row["outcome"] = outcome(reply, sample.finish)
        exp = c["expected"]
        rows.append({"id": c["id"], "strict": s, **row, "expected_call": exp.function_call,
                     "expected_content": exp.content, "content": content, "call": call,
                     "n_tokens": len(sample.token_ids), "finish": sample.finish,
                     **({"grammar_error": grammar_error} if s else {})})
    write_text(out / "samples.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    free = [r for r in rows if not r["strict"]]
    strict_rows = [r for r in rows if r["strict"]]
    turns = {k: v for k, v in summarise(strict_rows).items() if k in ("cases", "call_turns", "text_turns")}
    results = {"suite": "funcall", "suite_spec": spec, "split": split, "model": model_id,
               **(summarise(free) if free else turns),
               **({"strict": {**summarise(strict_rows),
                              "grammar_errors": sum(r["grammar_error"] is not None for r in strict_rows)}}
                  if strict_rows else {}),
               "schemas_normalised": normalised, "prompts_truncated": truncated,
               "settings": {"max_new_tokens": new, "temperature": 0.0, "limit": limit, "strict": strict},
               "timing": {"wall_s": time.perf_counter() - t0}}
    write_text(out / "results.json", json.dumps(results, indent=1))
    return results


def _strict_grammars(engine: Any, tok: Any) -> Any:
    """``grammar_of(key, tools) -> (grammar or None, error or None)``: the strict ``auto`` grammar of a
    conversation's loaded tools (one compile per ``key``); a schema the library cannot compile gives
    ``(None, its message)``, the case then generated free.

    Raises:
        codechat.engine.grammar.GrammarUnavailable: llguidance is not installed.
    """
    from codechat.chat.strict import tool_grammar
    from codechat.engine.grammar import GrammarCompiler, GrammarError
    gc = GrammarCompiler(tok, engine.vocab_size)
    made: dict[str, tuple[Any, str | None]] = {}

    def grammar_of(key: str, tools: Sequence[Any]) -> tuple[Any, str | None]:
        if key not in made:
            try:
                made[key] = tool_grammar(gc, [t.schema() for t in tools], "auto", strict=True), None
            except GrammarError as e:
                made[key] = None, str(e)
        return made[key]
    return grammar_of


def format_summary(r: Mapping[str, Any]) -> str:
    """A few printable lines of :func:`run_funcall_suite`'s results: one per pass that ran (free, strict)."""
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    def rates(f: Mapping[str, Any]) -> str:
        return (f"parse {pct(f['parse_rate'])}, schema-valid {pct(f['schema_valid_rate'])}, right name "
                f"{pct(f['name_accuracy'])}, arguments exact {pct(f['arguments_exact_match'])}; no call where none "
                f"is due {pct(f['no_call_accuracy'])}\n          of the call turns: {f['no_call']} no call, "
                f"{f['cut_by_length']} cut by length, {f['does_not_parse']} do not parse, {f['rejected']} rejected; "
                f"finished calls parse {pct(f['finished_parse_rate'])}, schema-valid "
                f"{pct(f['finished_schema_valid_rate'])}")
    lines = [f"funcall ({r['split']}: {r['call_turns']} call turns, {r['text_turns']} text turns)"]
    if "parse_rate" in r:
        lines.append(f"  free:   {rates(r)}")
    if "strict" in r:
        lines.append(f"  strict: {rates(r['strict'])} (schemas the grammar could not compile, generated free: "
                     f"{r['strict']['grammar_errors']} cases)")
    lines.append(f"schemas normalised {r['schemas_normalised']}, prompts shortened to fit {r['prompts_truncated']}; "
                 f"{r['timing']['wall_s']:.1f} s")
    return "\n".join(lines)
